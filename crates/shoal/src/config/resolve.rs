//! Layering: defaults, the config file, the environment and the flags,
//! merged into a [`Config`] with each value's source.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::cli::*;
use super::defs::*;
use anyhow::{anyhow, bail, Context, Result};
use shoal_engine::content_filter::ContentPolicy;

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    File,
    Env,
    Flag,
}

/// The merged settings, the file they were read from, and each value's source.
#[derive(Debug)]
pub struct Resolved {
    pub config: Config,
    pub file: Option<PathBuf>,
    sources: BTreeMap<String, Source>,
}

/// The platform's default config file (`~/.config/shoal/config.toml` on Linux,
/// `~/Library/Application Support/shoal/config.toml` on macOS).
pub fn default_path() -> Option<PathBuf> {
    directories::BaseDirs::new().map(|d| d.config_dir().join("shoal").join("config.toml"))
}

/// The default `mcp.json`: beside the default config file.
pub fn default_mcp_path() -> Option<PathBuf> {
    default_path().and_then(|p| p.parent().map(|d| d.join("mcp.json")))
}

/// Resolves the settings from the real environment and default location.
pub fn resolve(flags: &Flags) -> Result<Resolved> {
    resolve_with(flags, &|name| std::env::var(name).ok(), default_path())
}

/// Resolves with the environment and the default file location passed in, so
/// the layering can be tested without touching the process environment.
pub(super) fn resolve_with(
    flags: &Flags,
    env: &dyn Fn(&str) -> Option<String>,
    default_file: Option<PathBuf>,
) -> Result<Resolved> {
    let explicit = flags
        .config
        .clone()
        .or_else(|| env(CONFIG_ENV).filter(|v| !v.is_empty()).map(PathBuf::from));
    let (text, file) = match explicit {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            (Some(text), Some(path))
        }
        None => match default_file {
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(text) => (Some(text), Some(path)),
                // No file at the default location just means defaults.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("reading config file {}", path.display()))
                }
            },
            None => (None, None),
        },
    };
    let mut resolved = Resolved {
        config: Config::default(),
        file: None,
        sources: BTreeMap::new(),
    };
    let mut table = default_table();
    if let (Some(text), Some(path)) = (text, file) {
        for (s, value) in parse_file(&text, &path)? {
            resolved.set(&mut table, s, value, Source::File);
        }
        resolved.file = Some(path);
    }
    // Empty variables count as unset.
    for s in SETTINGS {
        let Some(name) = s.env.name() else { continue };
        let Some(text) = env(name).filter(|v| !v.is_empty()) else {
            continue;
        };
        let items = match s.env {
            Env::Lines(_) => text.split('\n').map(str::to_owned).collect(),
            Env::Commas(_) => text
                .split([',', '\n'])
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
            _ => vec![text.clone()],
        };
        let value = text_value(s.kind, items)
            .map_err(|e| anyhow!("environment variable {name}={text:?}: {e}"))?;
        resolved.set(&mut table, s, value, Source::Env);
    }
    for (id, items) in &flags.given {
        let Some(s) = find_setting(id) else { continue };
        let flag = s.flag.long().unwrap_or(s.id);
        let value = text_value(s.kind, items.clone()).map_err(|e| anyhow!("--{flag}: {e}"))?;
        resolved.set(&mut table, s, value, Source::Flag);
    }
    resolved.config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let at = e.path().to_string();
        anyhow!("{at} (from {}): {}", resolved.describe(&at), e.into_inner())
    })?;
    resolved.validate()?;
    Ok(resolved)
}

/// Checks a config file (unknown keys and wrong types, with the line) and
/// returns the values it sets, relative paths taken from its directory.
pub(super) fn parse_file(text: &str, path: &Path) -> Result<Vec<(&'static Setting, toml::Value)>> {
    let invalid = || format!("invalid config file {}", path.display());
    let de = toml::Deserializer::parse(text).with_context(invalid)?;
    let _: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        anyhow!("{}, key `{at}`:\n{}", invalid(), e.into_inner())
    })?;
    // The text parsed above, so this only lists which keys were present.
    let table: toml::Table = text.parse().with_context(invalid)?;
    let mut values = Vec::new();
    for (section, keys) in table {
        // A table of its own is one setting.
        if let Some(s) = find_setting(&section).filter(|s| s.section.is_empty()) {
            values.push((s, keys));
            continue;
        }
        let toml::Value::Table(keys) = keys else {
            continue;
        };
        for (key, mut value) in keys {
            let Some(s) = find_setting(&format!("{section}.{key}")) else {
                continue;
            };
            if let (Kind::Path, toml::Value::String(p), Some(dir)) =
                (s.kind, &mut value, path.parent())
            {
                if Path::new(p.as_str()).is_relative() {
                    *p = dir.join(&*p).to_string_lossy().into_owned();
                }
            }
            values.push((s, value));
        }
    }
    Ok(values)
}

impl Resolved {
    /// Sets one value in the layered table and records its source.
    fn set(&mut self, table: &mut toml::Table, s: &Setting, value: toml::Value, source: Source) {
        if s.section.is_empty() {
            table.insert(s.key.to_owned(), value);
        } else if let Some(toml::Value::Table(section)) = table.get_mut(s.section) {
            section.insert(s.key.to_owned(), value);
        } else {
            let mut section = toml::Table::new();
            section.insert(s.key.to_owned(), value);
            table.insert(s.section.to_owned(), toml::Value::Table(section));
        }
        self.sources.insert(s.id.to_owned(), source);
    }

    /// The global `--log-format` flag, which is parsed before the settings.
    pub fn set_log_format_flag(&mut self, format: crate::LogFormat) {
        self.config.server.log_format = format;
        self.sources
            .insert("server.log_format".into(), Source::Flag);
    }

    /// Where `key` (`section.key`) got its value.
    pub fn source(&self, key: &str) -> Source {
        self.sources.get(key).copied().unwrap_or(Source::Default)
    }

    /// Names the source of `key` for messages: the file's path, the variable or the flag.
    fn describe(&self, key: &str) -> String {
        match (self.source(key), find_setting(key)) {
            (Source::File, _) => match &self.file {
                Some(p) => format!("config file {}", p.display()),
                None => "config file".into(),
            },
            (Source::Env, Some(s)) => format!("env {}", s.env.name().unwrap_or("?")),
            (Source::Flag, Some(s)) => format!("--{}", s.flag.long().unwrap_or(s.id)),
            (Source::Env, None) => "env".into(),
            (Source::Flag, None) => "command line".into(),
            (Source::Default, _) => "default".into(),
        }
    }

    /// Catches what the file format cannot: bad regular expressions, key
    /// specs and sizes that overflow. Each message names the key and where
    /// its value came from.
    fn validate(&self) -> Result<()> {
        if let Err(e) = self.config.access() {
            bail!("{e:#} (from {})", self.describe("server.api_keys"));
        }
        let key = "content_filter.patterns";
        for (i, p) in self.config.content_filter.patterns.iter().enumerate() {
            if p.is_empty() {
                continue;
            }
            if let Err(e) = ContentPolicy::new(Vec::new(), std::slice::from_ref(p)) {
                bail!("{key}[{i}] (from {}): {e}", self.describe(key));
            }
        }
        for (model, p) in &self.config.prices {
            let parts = [
                ("input_per_mtok", Some(p.input_per_mtok)),
                ("cached_input_per_mtok", p.cached_input_per_mtok),
                ("output_per_mtok", Some(p.output_per_mtok)),
            ];
            for (part, v) in parts {
                if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
                    bail!(
                        "prices.{model}.{part} = {v} (from {}): a price is a number of at least 0",
                        self.describe("prices")
                    );
                }
            }
        }
        let key = "cache.prefix_cache_mb";
        if self
            .config
            .cache
            .prefix_cache_mb
            .checked_mul(1 << 20)
            .is_none()
        {
            bail!(
                "{key} = {} (from {}) is too large",
                self.config.cache.prefix_cache_mb,
                self.describe(key)
            );
        }
        Ok(())
    }

    /// The effective settings as TOML, each value commented with its source;
    /// the output is itself a valid config file.
    pub fn to_annotated_toml(&self) -> Result<String> {
        let mut shown = self.config.clone();
        shown.model.path = Some(self.config.model_path());
        shown.model.id = Some(self.config.model_id());
        shown.server.db = self.config.db_path().ok();
        shown.cache.disk_dir = self.config.disk_cache_dir().ok();
        // Keys and secrets are shown as set, never printed.
        for k in shown.server.api_keys.iter_mut() {
            *k = shoal_api::access::Key::redacted(k);
        }
        if !shown.cluster.secret.is_empty() {
            // Shown as set, never printed.
            shown.cluster.secret = "(set)".into();
        }
        let table = toml::Table::try_from(&shown).context("rendering the config as TOML")?;
        let mut out = String::from("# Effective settings for `shoal serve`");
        match &self.file {
            Some(p) => out.push_str(&format!(" (config file {}).\n", p.display())),
            None => out.push_str(" (no config file).\n"),
        }
        let mut section = "";
        for s in SETTINGS {
            let Some(value) = s.value_in(&table) else {
                continue;
            };
            if s.section.is_empty() {
                // A table of its own: it brings its own headers.
                out.push('\n');
            } else if s.section != section {
                out.push_str(&format!("\n[{}]\n", s.section));
            }
            section = s.section;
            let key = s.id;
            let mut from = self.describe(key);
            if self.source(key) == Source::Default && s.key == "id" {
                from = "default: the model's file name".into();
            }
            let mut one = toml::Table::new();
            one.insert(s.key.to_owned(), value.clone());
            let line = toml::to_string(&one).context("rendering the config as TOML")?;
            let line = line.trim_end();
            if line.contains('\n') {
                out.push_str(&format!("# {from}\n{line}\n"));
            } else {
                out.push_str(&format!("{line}  # {from}\n"));
            }
        }
        Ok(out)
    }
}
