//! The settings as clap flags, built from the table.
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::defs::*;
use anyhow::{anyhow, Result};

/// Command-line values for the settings; absent ones leave the lower layers'
/// values in place. The flags themselves are built from the table.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// TOML config file (`--config`).
    pub config: Option<PathBuf>,
    /// Raw values by setting id, as given on the command line.
    pub(super) given: BTreeMap<&'static str, Vec<String>>,
}

impl Flags {
    /// Sets a value as if its flag was given (`section.key`, the flag's text;
    /// a list takes one item per call).
    pub fn set(&mut self, id: &str, value: &str) -> Result<()> {
        let s = find_setting(id).ok_or_else(|| anyhow!("no setting {id}"))?;
        let items = self.given.entry(s.id).or_default();
        if s.kind != Kind::List {
            items.clear();
        }
        items.push(value.to_owned());
        Ok(())
    }

    fn augment(cmd: clap::Command, offered: fn(&Setting) -> bool) -> clap::Command {
        use clap::{Arg, ArgAction};
        let defaults = default_table();
        let mut cmd = cmd.arg(
            Arg::new("config")
                .long("config")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help(format!(
                    "TOML config file [env: {CONFIG_ENV}] (default: shoal/config.toml in the \
                     platform config directory, used when it exists)"
                )),
        );
        for s in SETTINGS.iter().filter(|s| offered(s)) {
            let mut help = s.help.trim().to_owned();
            let default = s
                .value_in(&defaults)
                .filter(|v| !matches!(v, toml::Value::Array(a) if a.is_empty()));
            let arg = Arg::new(s.id);
            let arg = match s.flag {
                Flag::Value(long, value_name) => {
                    if let Some(d) = default.filter(|_| s.kind != Kind::List) {
                        let d = d.as_str().map_or_else(|| d.to_string(), str::to_owned);
                        help.push_str(&format!(" [default: {d}]"));
                    }
                    let action = if s.kind == Kind::List {
                        help.push_str(" [repeatable; replaces the config file's list]");
                        ArgAction::Append
                    } else {
                        ArgAction::Set
                    };
                    arg.long(long)
                        .value_name(value_name)
                        .action(action)
                        .value_parser(clap::value_parser!(String))
                }
                Flag::On(long) | Flag::Off(long) => arg.long(long).action(ArgAction::SetTrue),
                Flag::None | Flag::Global(_) => continue,
            };
            if let Some(env) = s.env.name() {
                let how = match s.env {
                    Env::Lines(_) => ", one per line",
                    Env::Commas(_) => ", comma-separated",
                    _ => "",
                };
                help.push_str(&format!(" [env: {env}{how}]"));
            }
            cmd = cmd.arg(arg.help(help));
        }
        cmd
    }

    fn from_matches(m: &clap::ArgMatches) -> Self {
        let mut flags = Flags {
            config: m.get_one::<PathBuf>("config").cloned(),
            given: BTreeMap::new(),
        };
        for s in SETTINGS {
            let items: Vec<String> = match s.flag {
                Flag::Value(..) => match m.try_get_many::<String>(s.id) {
                    Ok(Some(v)) => v.cloned().collect(),
                    _ => continue,
                },
                Flag::On(_) | Flag::Off(_) => match m.try_get_one::<bool>(s.id) {
                    Ok(Some(true)) => vec![matches!(s.flag, Flag::On(_)).to_string()],
                    _ => continue,
                },
                Flag::None | Flag::Global(_) => continue,
            };
            flags.given.insert(s.id, items);
        }
        flags
    }
}

impl clap::FromArgMatches for Flags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Flags::from_matches(m))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Flags::from_matches(m);
        Ok(())
    }
}

impl clap::Args for Flags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Flags::augment(cmd, |_| true)
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The `[model]` flags alone, for the commands that run a model without
/// serving it (`generate`, `bench`); they resolve like `serve`'s.
#[derive(Debug, Clone, Default)]
pub struct ModelFlags(pub Flags);

impl clap::FromArgMatches for ModelFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(ModelFlags(Flags::from_matches(m)))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0 = Flags::from_matches(m);
        Ok(())
    }
}

impl clap::Args for ModelFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        Flags::augment(cmd, |s| s.section == "model" && s.key != "aliases")
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}
