//! Settings for `shoal serve` (and the model settings of `generate` and
//! `bench`), layered so that each source overrides the one before it:
//! built-in defaults, the TOML config file, environment variables,
//! command-line flags. `shoal config` prints the result with each value's source.
//!
//! Every setting is one row of the [`settings!`] table below: field, type,
//! default, environment variable, flag and help. The config structs, the
//! clap flags, the environment reading, the file's keys and the printout
//! all come from that table, so adding a setting touches one place.
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use shoal_api::access::Access;
use shoal_engine::content_filter::ContentPolicy;
use shoal_engine::EngineOptions;

/// Environment variable naming the config file (like `--config`).
pub const CONFIG_ENV: &str = "SHOAL_CONFIG";

/// How a value given as text (a flag or an environment variable) becomes a
/// TOML value; the typed field then checks it like a value from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    /// Text naming a file; relative paths in a config file are taken from
    /// the file's own directory, so a config travels with its model.
    Path,
    Integer,
    Bool,
    List,
    /// A TOML table of its own at the top of the file (`[prices.MODEL]`):
    /// set in the config file only.
    Table,
}

/// The [`Kind`] of each field type the table uses.
pub trait SettingType {
    const KIND: Kind;
}

macro_rules! kinds {
    ($kind:ident: $($t:ty),*) => { $(impl SettingType for $t { const KIND: Kind = Kind::$kind; })* };
}
kinds!(
    Text: String,
    IpAddr,
    shoal_engine::BackendChoice,
    crate::LogFormat,
    shoal_engine::KvType,
    shoal_engine::backends::llama::KvTokens,
    shoal_engine::draft::DraftKind,
    shoal_engine::disk_cache::DiskBudget,
    PortSetting
);
kinds!(Path: PathBuf);
kinds!(Integer: u16, u64, usize);
kinds!(Bool: bool);
kinds!(List: Vec<String>);

impl<V> SettingType for BTreeMap<String, V> {
    const KIND: Kind = Kind::Table;
}

impl<T: SettingType> SettingType for Option<T> {
    const KIND: Kind = T::KIND;
}

/// A port a setting opens, or `off`: a setting that can say no as well as
/// say nothing (`server.ollama_port` unset leaves the choice to the
/// Settings switch remembered in the store; `off` closes it whatever the
/// switch last said, as the switch's own off state does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSetting {
    Off,
    On(u16),
}

impl PortSetting {
    /// The port, or `None` when off.
    pub fn port(self) -> Option<u16> {
        match self {
            PortSetting::Off => None,
            PortSetting::On(p) => Some(p),
        }
    }
}

impl std::str::FromStr for PortSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "false" | "no" => Ok(PortSetting::Off),
            n => n
                .parse::<u16>()
                .map(PortSetting::On)
                .map_err(|_| format!("{s:?} is not a port number (1-65535) or off")),
        }
    }
}

impl std::fmt::Display for PortSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortSetting::Off => f.write_str("off"),
            PortSetting::On(p) => write!(f, "{p}"),
        }
    }
}

impl serde::Serialize for PortSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PortSetting::Off => s.serialize_str("off"),
            PortSetting::On(p) => s.serialize_u16(*p),
        }
    }
}

impl<'de> serde::Deserialize<'de> for PortSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u16),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(PortSetting::On(n)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The environment variable that overrides a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Env {
    None,
    Var(&'static str),
    /// A list, one item per line (phrases may contain commas).
    Lines(&'static str),
    /// A list separated by commas or newlines.
    Commas(&'static str),
}

impl Env {
    fn name(self) -> Option<&'static str> {
        match self {
            Env::None => None,
            Env::Var(n) | Env::Lines(n) | Env::Commas(n) => Some(n),
        }
    }
}

/// A setting's command-line form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// File (and environment) only.
    None,
    /// `--name VALUE`; repeatable for lists, and a flag list replaces the
    /// lower layers' list.
    Value(&'static str, &'static str),
    /// A switch that sets the value to true.
    On(&'static str),
    /// A switch that sets the value to false.
    Off(&'static str),
    /// A global flag read before the subcommand (`--log-format`).
    Global(&'static str),
}

impl Flag {
    fn long(self) -> Option<&'static str> {
        match self {
            Flag::None => None,
            Flag::Value(l, _) | Flag::On(l) | Flag::Off(l) | Flag::Global(l) => Some(l),
        }
    }
}

/// One row of the settings table.
#[derive(Debug)]
pub struct Setting {
    /// Empty for a table of its own at the top of the file.
    pub section: &'static str,
    pub key: &'static str,
    /// `section.key`: the name in messages, in the source map and the flag's id.
    pub id: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub env: Env,
    pub flag: Flag,
}

impl Setting {
    /// This setting's value in a config table.
    fn value_in<'t>(&self, table: &'t toml::Table) -> Option<&'t toml::Value> {
        if self.section.is_empty() {
            return table.get(self.key);
        }
        table.get(self.section)?.as_table()?.get(self.key)
    }
}

/// Declares the settings: each section becomes a config struct whose
/// `Default` is the rows' defaults, and each row a [`Setting`] in `SETTINGS`.
/// The rows under `tables` are tables of their own at the top of the file
/// (a map by name, such as `[prices.MODEL]`), set in the file only.
macro_rules! settings {
    ($(
        $(#[doc = $sdoc:literal])*
        [$section:ident] $Section:ident {
            $(
                $(#[doc = $doc:literal])*
                $key:ident: $ty:ty = $default:expr, env $env:expr, flag $flag:expr;
            )*
        }
    )*
    tables {
        $(
            $(#[doc = $tdoc:literal])*
            $tkey:ident: $tty:ty = $tdefault:expr, env $tenv:expr, flag $tflag:expr;
        )*
    }) => {
        /// Everything `shoal serve` can be told, as written in the config file.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Config {
            $( $(#[doc = $sdoc])* pub $section: $Section, )*
            $( $(#[doc = $tdoc])* pub $tkey: $tty, )*
        }
        impl Default for Config {
            fn default() -> Self {
                Config {
                    $( $section: $Section::default(), )*
                    $( $tkey: $tdefault, )*
                }
            }
        }
        $(
            $(#[doc = $sdoc])*
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            #[serde(deny_unknown_fields, default)]
            pub struct $Section {
                $(
                    $(#[doc = $doc])*
                    pub $key: $ty,
                )*
            }
            impl Default for $Section {
                fn default() -> Self {
                    $Section { $( $key: $default, )* }
                }
            }
        )*
        /// Every setting, in the order `shoal config` prints them.
        pub const SETTINGS: &[Setting] = &[$($(Setting {
            section: stringify!($section),
            key: stringify!($key),
            id: concat!(stringify!($section), ".", stringify!($key)),
            help: concat!($($doc),*),
            kind: <$ty as SettingType>::KIND,
            env: $env,
            flag: $flag,
        },)*)* $(Setting {
            section: "",
            key: stringify!($tkey),
            id: stringify!($tkey),
            help: concat!($($tdoc),*),
            kind: <$tty as SettingType>::KIND,
            env: $tenv,
            flag: $tflag,
        },)*];
    };
}

settings! {
    [server] Server {
        /// Address to listen on.
        host: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST),
            env Env::Var("SHOAL_HOST"), flag Flag::Value("host", "ADDR");
        /// Port to listen on; 0 picks a free one.
        port: u16 = 8421, env Env::Var("SHOAL_PORT"), flag Flag::Value("port", "PORT");
        /// Also serve on this port (Ollama's is 11434) for tools that look
        /// for Ollama there, or off; unset, the Settings switch's last
        /// choice holds (off at first). A taken port is reported in /health
        /// and the main port serves regardless.
        ollama_port: Option<PortSetting> = None,
            env Env::Var("SHOAL_OLLAMA_PORT"), flag Flag::Value("ollama-port", "PORT|off");
        /// Requests allowed to wait behind the running ones; more get 429/529.
        queue: usize = EngineOptions::default().queue_capacity,
            env Env::Var("SHOAL_QUEUE"), flag Flag::Value("queue", "N");
        /// Requests decoded together in one batched forward pass (continuous batching).
        max_batch: usize = EngineOptions::default().max_batch,
            env Env::Var("SHOAL_MAX_BATCH"), flag Flag::Value("max-batch", "N");
        /// Conversation store behind /v1/conversations, shared with `shoal chat`
        /// and `shoal history` (default: the platform data directory).
        db: Option<PathBuf> = None, env Env::Var("SHOAL_DB"), flag Flag::Value("db", "PATH");
        /// Log each request's prompt text (off: prompts stay out of the logs).
        log_prompts: bool = false, env Env::Var("SHOAL_LOG_PROMPTS"), flag Flag::On("log-prompts");
        /// Log lines as `text` (human-readable) or `json` (one object per line).
        log_format: crate::LogFormat = crate::LogFormat::Text,
            env Env::Var("SHOAL_LOG_FORMAT"), flag Flag::Global("log-format");
        /// A key clients must send as `Authorization: Bearer KEY` or `x-api-key`;
        /// any one is accepted. Needed to listen beyond loopback. `NAME=KEY`
        /// names it in the usage ledger; `;tokens_per_day=N` and
        /// `;requests_per_minute=N` after it limit it.
        api_keys: Vec<String> = Vec::new(),
            env Env::Commas("SHOAL_API_KEYS"), flag Flag::Value("api-key", "KEY");
        /// A browser origin allowed to call the API besides the server's own
        /// pages and the desktop app (`*` for any).
        cors_origins: Vec<String> = Vec::new(),
            env Env::Commas("SHOAL_CORS_ORIGINS"), flag Flag::Value("cors-origin", "ORIGIN");
        /// Most messages one request may carry.
        max_messages: usize = Access::default().max_messages,
            env Env::Var("SHOAL_MAX_MESSAGES"), flag Flag::Value("max-messages", "N");
        /// Most tools one request may offer.
        max_tools: usize = Access::default().max_tools,
            env Env::Var("SHOAL_MAX_TOOLS"), flag Flag::Value("max-tools", "N");
        /// Largest request body accepted, in MiB; a bigger one gets a 413.
        max_body_mb: usize = Access::default().max_body_bytes >> 20,
            env Env::Var("SHOAL_MAX_BODY_MB"), flag Flag::Value("max-body-mb", "MIB");
        /// Longest a request may run, in seconds (0 = no limit); then it ends
        /// with a timeout error that still reports its usage.
        request_timeout_secs: u64 = Access::default().request_timeout.map_or(0, |d| d.as_secs()),
            env Env::Var("SHOAL_REQUEST_TIMEOUT_SECS"), flag Flag::Value("request-timeout-secs", "SECS");
    }
    [model] Model {
        /// A .gguf file or a Hugging Face / MLX model directory.
        path: Option<PathBuf> = None, env Env::Var("SHOAL_MODEL"), flag Flag::Value("model", "PATH");
        /// The name clients use for the model (default: the file or directory name).
        id: Option<String> = None, env Env::Var("SHOAL_MODEL_ID"), flag Flag::Value("model-id", "ID");
        /// Another name that resolves to the model.
        aliases: Vec<String> = Vec::new(), env Env::None, flag Flag::Value("alias", "NAME");
        /// Which engine runs the model: auto (MLX for model directories,
        /// llama.cpp for GGUF files), mlx or llama.
        backend: shoal_engine::BackendChoice = shoal_engine::BackendChoice::Auto,
            env Env::Var("SHOAL_BACKEND"), flag Flag::Value("backend", "auto|mlx|llama");
        /// llama.cpp threads (0 = the physical cores).
        threads: usize = 0, env Env::Var("SHOAL_THREADS"), flag Flag::Value("threads", "N");
        /// KV positions llama.cpp reserves per model, shared by its requests:
        /// a number, or auto (the model's trained window, within a quarter of
        /// models.memory_budget_mb, never below 8192 or the trained window).
        kv_cache_tokens: shoal_engine::backends::llama::KvTokens = shoal_engine::backends::llama::KvTokens::Auto,
            env Env::Var("SHOAL_KV_CACHE_TOKENS"), flag Flag::Value("kv-cache-tokens", "auto|N");
        /// Split kv_cache_tokens evenly between the requests that can run at
        /// once (max_batch), as llama-server --parallel does: faster under
        /// concurrent load, but one request can then use only its share.
        split_kv_cache: bool = false,
            env Env::Var("SHOAL_SPLIT_KV_CACHE"), flag Flag::On("split-kv-cache");
        /// llama.cpp: keep every reply equal to the bit to its lone,
        /// undrafted run, whatever runs beside it (no weight repacking, a KV
        /// slice per request, no single-row steps, drafts checked one
        /// sequence at a time); prefill is slower.
        batch_invariant: bool = false,
            env Env::Var("SHOAL_BATCH_INVARIANT"), flag Flag::On("batch-invariant");
        /// llama.cpp's KV cache element type: f16, q8_0 or q4_0 (smaller,
        /// so more positions fit, at some cost in agreement with f16).
        kv_cache_type: shoal_engine::KvType = shoal_engine::KvType::F16,
            env Env::Var("SHOAL_KV_CACHE_TYPE"), flag Flag::Value("kv-cache-type", "f16|q8_0|q4_0");
        /// Speculative decoding on llama.cpp: prompt-lookup drafts tokens
        /// from the prompt and the reply so far (or draft_model does), or off. Each draft is
        /// checked by sampling its position as plain decoding would, so
        /// usage and finish stay exact (and with --batch-invariant the reply
        /// equals plain decoding's to the bit).
        draft: shoal_engine::draft::DraftKind = shoal_engine::draft::DraftKind::PromptLookup,
            env Env::Var("SHOAL_DRAFT"), flag Flag::Value("draft", "prompt-lookup|off");
        /// Most draft tokens the model checks in one step (at most 32).
        draft_tokens: usize = shoal_engine::draft::MAX_LENGTH,
            env Env::Var("SHOAL_DRAFT_TOKENS"), flag Flag::Value("draft-tokens", "N");
        /// A smaller .gguf of the same vocabulary that drafts for the model
        /// instead of prompt lookup (e.g. a 0.5B Qwen for a larger Qwen);
        /// loaded beside it and counted in its memory. Models of another
        /// vocabulary keep prompt lookup.
        draft_model: Option<PathBuf> = None,
            env Env::Var("SHOAL_DRAFT_MODEL"), flag Flag::Value("draft-model", "PATH");
    }
    /// An embedding model served beside the chat model (/v1/embeddings,
    /// /api/embed); it loads on first use like a pulled model.
    [embedding] Embedding {
        /// A .gguf embedding model (all-MiniLM, bge, nomic-embed-text, Qwen3-Embedding…).
        path: Option<PathBuf> = None,
            env Env::Var("SHOAL_EMBEDDING_MODEL"), flag Flag::Value("embedding-model", "PATH");
        /// The name clients use for it (default: the file name).
        id: Option<String> = None,
            env Env::Var("SHOAL_EMBEDDING_MODEL_ID"), flag Flag::Value("embedding-model-id", "ID");
    }
    [cache] Cache {
        /// Memory for reusing KV state of shared prompt prefixes across
        /// requests, in MiB (0 = off).
        prefix_cache_mb: usize = EngineOptions::default().prefix_cache_bytes >> 20,
            env Env::Var("SHOAL_PREFIX_CACHE_MB"), flag Flag::Value("prefix-cache-mb", "MIB");
        /// The prefix cache's disk tier, in MiB (or off): prefixes of 256
        /// tokens or more are kept in files too, so they outlive a restart,
        /// an unload or eviction from memory; least recently used out first.
        /// Off when prefix_cache_mb is 0.
        disk_mb: shoal_engine::disk_cache::DiskBudget = Default::default(),
            env Env::Var("SHOAL_CACHE_DISK_MB"), flag Flag::Value("cache-disk-mb", "MIB|off");
        /// The disk tier's folder (default: kv-cache beside the
        /// conversation store, in the data directory).
        disk_dir: Option<PathBuf> = None,
            env Env::Var("SHOAL_CACHE_DISK_DIR"), flag Flag::Value("cache-disk-dir", "DIR");
        /// With API keys configured, let a request reuse prefixes another
        /// key's requests cached (off: each key has its own, so one client
        /// cannot time another's prompts by its cache hits).
        share_across_keys: bool = false,
            env Env::Var("SHOAL_CACHE_SHARE_ACROSS_KEYS"), flag Flag::On("cache-share-across-keys");
    }
    /// Which models stay in memory.
    [models] Models {
        /// Memory all loaded models may take together, in MiB; a model that
        /// would not fit unloads idle ones first, else is refused (0 = three
        /// quarters of RAM).
        memory_budget_mb: u64 = 0,
            env Env::Var("SHOAL_MEMORY_BUDGET_MB"), flag Flag::Value("memory-budget-mb", "MIB");
        /// Unload a model nobody has used for this many seconds (0 = never).
        idle_unload_secs: u64 = 1800,
            env Env::Var("SHOAL_IDLE_UNLOAD_SECS"), flag Flag::Value("idle-unload-secs", "SECS");
    }
    /// How long the usage ledger keeps its records.
    [usage] UsageSettings {
        /// Days a request's record is kept (0 = no age limit).
        retention_days: u64 = 90,
            env Env::Var("SHOAL_USAGE_RETENTION_DAYS"), flag Flag::Value("usage-retention-days", "DAYS");
        /// Most records kept; past it the oldest go (0 = no cap).
        retention_rows: u64 = 0,
            env Env::Var("SHOAL_USAGE_RETENTION_ROWS"), flag Flag::Value("usage-retention-rows", "N");
    }
    /// Off unless phrases or patterns are given.
    [content_filter] ContentFilter {
        /// Replies containing this phrase are cut before it and end with finish
        /// reason content_filter / refusal.
        phrases: Vec<String> = Vec::new(), env Env::Lines("SHOAL_BLOCK"), flag Flag::Value("block", "PHRASE");
        /// A regular expression that ends a reply the same way.
        patterns: Vec<String> = Vec::new(),
            env Env::Lines("SHOAL_BLOCK_REGEX"), flag Flag::Value("block-regex", "RE");
    }
    /// Joining a cluster: off unless a secret is set.
    [cluster] ClusterSettings {
        /// The secret every node shares; it signs heartbeats and control
        /// requests. Empty: no cluster.
        secret: String = String::new(),
            env Env::Var("SHOAL_CLUSTER_SECRET"), flag Flag::Value("cluster-secret", "SECRET");
        /// Another node's API address, HOST:PORT, for networks without multicast.
        peers: Vec<String> = Vec::new(), env Env::Commas("SHOAL_PEERS"), flag Flag::Value("peer", "HOST:PORT");
        /// Announce and find nodes on the LAN with mDNS.
        mdns: bool = true, env Env::Var("SHOAL_MDNS"), flag Flag::Off("no-mdns");
        /// Seconds without a heartbeat before a node shows as unreachable.
        unreachable_after_secs: u64 = 3, env Env::None, flag Flag::None;
        /// Seconds without a heartbeat before a node is dropped.
        remove_after_secs: u64 = 20, env Env::None, flag Flag::None;
    }
    tables {
        /// Per-million-token prices by model, as the usage ledger names it
        /// (`[prices.MODEL]` with `input_per_mtok`, `cached_input_per_mtok`,
        /// `output_per_mtok`; the recorder's providers file's shape), so
        /// `/v1/usage`, `shoal usage` and the Usage view show what the same
        /// traffic would have cost there.
        prices: BTreeMap<String, shoal_client::metadata::Price> = BTreeMap::new(),
            env Env::None, flag Flag::None;
    }
}

fn find_setting(id: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.id == id)
}

/// The built-in defaults as TOML, for the flags' help and the lowest layer.
fn default_table() -> toml::Table {
    // The defaults are values of the table's own types, so they render.
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

/// Turns text from a flag or the environment into the TOML value of `kind`.
fn text_value(kind: Kind, mut items: Vec<String>) -> Result<toml::Value, String> {
    use toml::Value;
    if kind == Kind::List {
        return Ok(Value::Array(items.into_iter().map(Value::String).collect()));
    }
    let text = items.pop().unwrap_or_default();
    match kind {
        Kind::Integer => text
            .trim()
            .parse::<i64>()
            .map(Value::Integer)
            .map_err(|e| format!("{text:?} is not a whole number: {e}")),
        Kind::Bool => text
            .trim()
            .parse::<bool>()
            .map(Value::Boolean)
            .map_err(|_| format!("{text:?} is not true or false")),
        Kind::Text | Kind::Path | Kind::List => Ok(Value::String(text)),
        Kind::Table => Err("is set in the config file only".into()),
    }
}

/// Command-line values for the settings; absent ones leave the lower layers'
/// values in place. The flags themselves are built from the table.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// TOML config file (`--config`).
    pub config: Option<PathBuf>,
    /// Raw values by setting id, as given on the command line.
    given: BTreeMap<&'static str, Vec<String>>,
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

/// Resolves the settings from the real environment and default location.
pub fn resolve(flags: &Flags) -> Result<Resolved> {
    resolve_with(flags, &|name| std::env::var(name).ok(), default_path())
}

/// Resolves with the environment and the default file location passed in, so
/// the layering can be tested without touching the process environment.
fn resolve_with(
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
fn parse_file(text: &str, path: &Path) -> Result<Vec<(&'static Setting, toml::Value)>> {
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

impl Config {
    pub fn model_path(&self) -> PathBuf {
        self.model
            .path
            .clone()
            .unwrap_or_else(shoal_engine::loader::default_model_path)
    }

    /// `models.memory_budget_mb` in bytes, `None` when 0 (the pool's default).
    fn memory_budget_bytes(&self) -> Result<Option<u64>> {
        let budget = self.models.memory_budget_mb;
        (budget > 0)
            .then(|| budget.checked_mul(1 << 20))
            .map(|b| b.context("models.memory_budget_mb is too large"))
            .transpose()
    }

    /// The memory all loaded models may take together, in bytes.
    fn memory_budget(&self) -> Result<u64> {
        Ok(self
            .memory_budget_bytes()?
            .unwrap_or_else(shoal_api::pool::default_budget))
    }

    /// The engine options of a server: [`Config::engine_options`] with the
    /// prefix cache's disk tier (one-shot commands and benches keep to RAM).
    pub fn serve_engine_options(&self) -> Result<EngineOptions> {
        Ok(EngineOptions {
            disk_cache: self.open_disk_cache(),
            ..self.engine_options()?
        })
    }

    /// How the model pool loads, budgets and unloads models.
    pub fn pool_options(&self) -> Result<shoal_api::pool::PoolOptions> {
        Ok(shoal_api::pool::PoolOptions {
            engine: self.serve_engine_options()?,
            budget_bytes: self.memory_budget_bytes()?,
            idle_unload: (self.models.idle_unload_secs > 0)
                .then(|| std::time::Duration::from_secs(self.models.idle_unload_secs)),
            hub: shoal_models::HubOptions::from_env(),
        })
    }

    /// API keys, allowed origins and request limits for the server.
    pub fn access(&self) -> Result<shoal_api::access::Access> {
        let mut a = shoal_api::access::Access::default()
            .with_keys(&self.server.api_keys)
            .map_err(|e| anyhow!("server.api_keys: {e}"))?;
        a.origins.extend(self.server.cors_origins.iter().cloned());
        a.max_messages = self.server.max_messages.max(1);
        a.max_tools = self.server.max_tools;
        a.max_body_bytes = self.server.max_body_mb.max(1).saturating_mul(1 << 20);
        a.request_timeout = (self.server.request_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.server.request_timeout_secs));
        a.share_cache_across_keys = self.cache.share_across_keys;
        Ok(a)
    }

    /// How long the usage ledger keeps its records.
    pub fn retention(&self) -> shoal_api::ledger::Retention {
        shoal_api::ledger::Retention {
            days: self.usage.retention_days,
            rows: usize::try_from(self.usage.retention_rows).unwrap_or(usize::MAX),
        }
    }

    /// Refuses to listen beyond loopback without an API key: a LAN must not
    /// get an open model server by accident.
    pub fn check_exposure(&self) -> Result<()> {
        let keyed = self.server.api_keys.iter().any(|k| !k.is_empty());
        if !self.server.host.is_loopback() && !keyed {
            bail!(
                "listening on {} (beyond this machine) needs an API key: pass --api-key KEY, \
                 set SHOAL_API_KEYS, or add api_keys to [server] in the config file",
                self.server.host
            );
        }
        Ok(())
    }

    /// Cluster settings for the server, when a secret is set.
    pub fn cluster_options(&self) -> Option<shoal_cluster::ClusterOptions> {
        let c = &self.cluster;
        if c.secret.is_empty() {
            return None;
        }
        let mut o = shoal_cluster::ClusterOptions::new(&c.secret, c.peers.clone());
        o.mdns = c.mdns;
        o.unreachable_after = std::time::Duration::from_secs(c.unreachable_after_secs.max(1));
        o.remove_after =
            std::time::Duration::from_secs(c.remove_after_secs.max(c.unreachable_after_secs + 1));
        Some(o)
    }

    /// The disk tier's folder: the configured one, else `kv-cache` beside
    /// the conversation store.
    pub fn disk_cache_dir(&self) -> Result<PathBuf> {
        if let Some(d) = &self.cache.disk_dir {
            return Ok(d.clone());
        }
        let db = self.db_path()?;
        Ok(db
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            .join("kv-cache"))
    }

    /// The prefix cache's disk tier as configured, opened once per folder in
    /// a process (one writer thread, one view of its files); `None` when it
    /// is off. A folder that cannot be made is logged and the tier left off:
    /// the server serves either way.
    pub fn open_disk_cache(&self) -> Option<std::sync::Arc<shoal_engine::disk_cache::DiskCache>> {
        use shoal_engine::disk_cache::DiskCache;
        use std::sync::{Arc, Mutex, OnceLock};
        static OPEN: OnceLock<Mutex<BTreeMap<PathBuf, Arc<DiskCache>>>> = OnceLock::new();
        // The disk tier is behind the prefix cache: off with it.
        if self.cache.prefix_cache_mb == 0 {
            return None;
        }
        let budget = self.cache.disk_mb.bytes()?;
        let dir = match self.disk_cache_dir() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the prefix cache's disk tier is off");
                return None;
            }
        };
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = open.get(&dir) {
            return Some(c.clone());
        }
        match DiskCache::open(shoal_engine::disk_cache::DiskCacheOptions {
            dir: dir.clone(),
            budget_bytes: budget,
            min_tokens: shoal_engine::disk_cache::DEFAULT_MIN_TOKENS,
            save_after_prefill: shoal_engine::disk_cache::DEFAULT_SAVE_AFTER_PREFILL,
        }) {
            Ok(c) => {
                tracing::info!(dir = %dir.display(), budget_mb = budget >> 20, "prefix cache on disk");
                open.insert(dir, c.clone());
                Some(c)
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "the prefix cache's disk tier is off");
                None
            }
        }
    }

    /// The conversation store file: the configured one or the default.
    pub fn db_path(&self) -> Result<PathBuf> {
        match &self.server.db {
            Some(p) => Ok(p.clone()),
            None => crate::default_db_path(),
        }
    }

    pub fn model_id(&self) -> String {
        match &self.model.id {
            Some(id) => id.clone(),
            None => crate::id_from_path(&self.model_path()),
        }
    }

    /// Engine options from these settings. Empty phrases and patterns are
    /// dropped: an empty environment line must not block every reply.
    pub fn engine_options(&self) -> Result<EngineOptions> {
        let non_empty = |v: &[String]| v.iter().filter(|p| !p.is_empty()).cloned().collect();
        Ok(EngineOptions {
            queue_capacity: self.server.queue.max(1),
            max_batch: self.server.max_batch.max(1),
            prefix_cache_bytes: self
                .cache
                .prefix_cache_mb
                .checked_mul(1 << 20)
                .context("cache.prefix_cache_mb is too large")?,
            blocked_phrases: non_empty(&self.content_filter.phrases),
            blocked_patterns: non_empty(&self.content_filter.patterns),
            backend: self.model.backend,
            llama: self.llama_options()?,
            draft: shoal_engine::DraftOptions::new(self.model.draft, self.model.draft_tokens),
            draft_model: self.model.draft_model.clone(),
            ..EngineOptions::default()
        })
    }

    /// The llama.cpp backend's options from these settings (before an
    /// engine sizes them for its batch): what `shoal models` reads a
    /// model's window from without starting anything.
    pub fn llama_options(&self) -> Result<shoal_engine::LlamaOptions> {
        Ok(shoal_engine::LlamaOptions::new(
            self.model.threads,
            self.model.kv_cache_tokens.positions(),
        )
        // `auto` KV takes its share of the pool's budget.
        .memory_budget(Some(self.memory_budget()?))
        .split(self.model.split_kv_cache)
        .batch_invariant(self.model.batch_invariant)
        .kv_type(self.model.kv_cache_type))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fresh directory under the system temp dir for one test.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("shoal-config-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("config.toml");
        std::fs::write(&p, text).expect("write");
        p
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn flags_with(config: &Path) -> Flags {
        Flags {
            config: Some(config.to_owned()),
            ..Flags::default()
        }
    }

    #[test]
    fn every_setting_has_a_default_but_the_optional_ones() {
        let table = default_table();
        let optional = [
            "server.db",
            "server.ollama_port",
            "model.path",
            "model.id",
            "model.draft_model",
            "embedding.path",
            "embedding.id",
            "cache.disk_dir",
        ];
        for s in SETTINGS {
            let present = s.value_in(&table).is_some();
            assert_eq!(present, !optional.contains(&s.id), "{}", s.id);
        }
    }

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        flags: Flags,
    }

    #[derive(clap::Parser)]
    struct Generate {
        #[command(flatten)]
        flags: ModelFlags,
    }

    #[test]
    fn flags_come_from_the_table() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let f = Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
                .expect("flags parse")
                .flags;
            resolve_with(&f, &env_of(&[("SHOAL_PEERS", "a:1,b:2")]), None)
        };
        let r = parse(&[
            "--port",
            "9",
            "--no-mdns",
            "--log-prompts",
            "--peer",
            "c:3",
            "--peer",
            "d:4",
            "--backend",
            "llama",
        ])
        .expect("resolve");
        let c = &r.config;
        assert_eq!(c.server.port, 9);
        assert!(!c.cluster.mdns && c.server.log_prompts);
        assert_eq!(
            c.cluster.peers,
            ["c:3", "d:4"],
            "a flag list replaces the env's"
        );
        assert_eq!(c.model.backend, shoal_engine::BackendChoice::Llama);
        assert_eq!(r.source("cluster.mdns"), Source::Flag);
        // No switch given: the lower layers stand.
        let r = parse(&[]).expect("resolve");
        assert!(r.config.cluster.mdns);
        assert_eq!(r.config.cluster.peers, ["a:1", "b:2"]);
        assert_eq!(r.source("cluster.peers"), Source::Env);
        // A value the type refuses names the flag.
        let err = parse(&["--port", "70000"]).expect_err("port out of range");
        assert!(format!("{err:#}").contains("--port"), "{err:#}");
        let err = parse(&["--queue", "many"]).expect_err("not a number");
        assert!(format!("{err:#}").contains("--queue"), "{err:#}");
        // `generate` and `bench` offer the model rows only.
        let g = Generate::try_parse_from(["generate", "--threads", "3"]).expect("model flags");
        let r = resolve_with(&g.flags.0, &env_of(&[]), None).expect("resolve");
        assert_eq!(r.config.model.threads, 3);
        assert!(Generate::try_parse_from(["generate", "--port", "1"]).is_err());
        assert!(Generate::try_parse_from(["generate", "--alias", "x"]).is_err());
    }

    #[test]
    fn defaults_match_the_former_flag_defaults() {
        let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
        let c = &r.config;
        assert_eq!(c.server.host.to_string(), "127.0.0.1");
        assert_eq!(c.server.port, 8421);
        assert_eq!(c.server.queue, 64);
        assert_eq!(c.cache.prefix_cache_mb, 1024);
        assert!(c.content_filter.phrases.is_empty() && c.content_filter.patterns.is_empty());
        assert!(c.model.aliases.is_empty() && c.model.path.is_none());
        assert!(r.file.is_none());
        assert_eq!(r.source("server.port"), Source::Default);
        let o = c.engine_options().expect("options");
        assert_eq!(o.queue_capacity, 64);
        assert_eq!(o.prefix_cache_bytes, 1 << 30);
        assert!(o.blocked_phrases.is_empty() && o.blocked_patterns.is_empty());
    }

    #[test]
    fn kv_cache_tokens_is_auto_or_a_number_from_every_layer() {
        use shoal_engine::backends::llama::{KvTokens, AUTO_KV_TOKENS};
        let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
        assert_eq!(r.config.model.kv_cache_tokens, KvTokens::Auto);
        let o = r.config.llama_options().expect("options");
        assert_eq!(o.kv_tokens, AUTO_KV_TOKENS);
        // `auto` takes its share of the pool's budget, the same the pool uses.
        assert_eq!(o.memory_budget, Some(shoal_api::pool::default_budget()));
        let dir = temp_dir("kv-tokens");
        for (text, want) in [
            ("kv_cache_tokens = 32768", KvTokens::Fixed(32768)),
            ("kv_cache_tokens = 0", KvTokens::Auto),
            ("kv_cache_tokens = \"auto\"", KvTokens::Auto),
        ] {
            let path = write(
                &dir,
                &format!("[model]\n{text}\n[models]\nmemory_budget_mb = 4096\n"),
            );
            let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
            assert_eq!(r.config.model.kv_cache_tokens, want, "{text}");
            let o = r.config.llama_options().expect("options");
            assert_eq!(o.kv_tokens, want.positions(), "{text}");
            assert_eq!(o.memory_budget, Some(4096 << 20), "{text}");
        }
        for (value, want) in [("auto", KvTokens::Auto), ("16384", KvTokens::Fixed(16384))] {
            let env = env_of(&[("SHOAL_KV_CACHE_TOKENS", value)]);
            let r = resolve_with(&Flags::default(), &env, None).expect("resolve");
            assert_eq!(r.config.model.kv_cache_tokens, want, "{value}");
            let mut flags = Flags::default();
            flags.set("model.kv_cache_tokens", value).expect("flag");
            let r = resolve_with(&flags, &env_of(&[]), None).expect("resolve");
            assert_eq!(r.config.model.kv_cache_tokens, want, "{value}");
        }
        let err = resolve_with(
            &Flags::default(),
            &env_of(&[("SHOAL_KV_CACHE_TOKENS", "lots")]),
            None,
        )
        .expect_err("not a number");
        assert!(
            format!("{err:#}").contains("SHOAL_KV_CACHE_TOKENS"),
            "{err:#}"
        );
    }

    #[test]
    fn file_then_env_then_flags() {
        let dir = temp_dir("layers");
        let path = write(
            &dir,
            r#"
[server]
host = "0.0.0.0"
port = 9000
queue = 5

[cache]
prefix_cache_mb = 7

[content_filter]
phrases = ["Paris", "Rome"]
"#,
        );
        let env = env_of(&[("SHOAL_PORT", "9001"), ("SHOAL_QUEUE", "6")]);
        let mut flags = flags_with(&path);
        flags.set("server.queue", "8").expect("queue");
        flags
            .set("content_filter.phrases", "Berlin")
            .expect("phrases");
        let r = resolve_with(&flags, &env, None).expect("resolve");
        let c = &r.config;
        assert_eq!(c.server.host.to_string(), "0.0.0.0", "file over default");
        assert_eq!(c.server.port, 9001, "env over file");
        assert_eq!(c.server.queue, 8, "flag over env over file");
        assert_eq!(c.cache.prefix_cache_mb, 7);
        assert_eq!(c.content_filter.phrases, ["Berlin"], "a flag list replaces");
        assert_eq!(r.source("server.host"), Source::File);
        assert_eq!(r.source("server.port"), Source::Env);
        assert_eq!(r.source("server.queue"), Source::Flag);
        assert_eq!(r.source("content_filter.phrases"), Source::Flag);
        assert_eq!(r.source("content_filter.patterns"), Source::Default);
        let o = c.engine_options().expect("options");
        assert_eq!(o.queue_capacity, 8);
        assert_eq!(o.prefix_cache_bytes, 7 << 20);
        assert_eq!(o.blocked_phrases, ["Berlin"]);
    }

    #[test]
    fn config_file_location() {
        let dir = temp_dir("location");
        let by_flag = write(&dir, "[server]\nport = 1\n");
        let by_env = dir.join("env.toml");
        std::fs::write(&by_env, "[server]\nport = 2\n").expect("write");
        let default = dir.join("default.toml");
        std::fs::write(&default, "[server]\nport = 3\n").expect("write");
        let env = env_of(&[(CONFIG_ENV, by_env.to_str().expect("utf8"))]);

        let port = |flags: &Flags, env: &dyn Fn(&str) -> Option<String>, d: Option<PathBuf>| {
            resolve_with(flags, env, d)
                .expect("resolve")
                .config
                .server
                .port
        };
        assert_eq!(port(&flags_with(&by_flag), &env, Some(default.clone())), 1);
        assert_eq!(port(&Flags::default(), &env, Some(default.clone())), 2);
        assert_eq!(port(&Flags::default(), &env_of(&[]), Some(default)), 3);
        // A missing default file means defaults; a missing named one is an error.
        let missing = dir.join("missing.toml");
        assert_eq!(
            port(&Flags::default(), &env_of(&[]), Some(missing.clone())),
            8421
        );
        let err = resolve_with(&flags_with(&missing), &env_of(&[]), None)
            .expect_err("missing explicit file");
        assert!(format!("{err:#}").contains("missing.toml"), "{err:#}");
    }

    #[test]
    fn invalid_files_name_the_file_and_key() {
        let dir = temp_dir("invalid");
        let check = |text: &str, expected: &[&str]| {
            let path = write(&dir, text);
            let err =
                resolve_with(&flags_with(&path), &env_of(&[]), None).expect_err("invalid config");
            let msg = format!("{err:#}");
            assert!(msg.contains(path.to_str().expect("utf8")), "{msg}");
            for e in expected {
                assert!(msg.contains(e), "{e:?} not in {msg}");
            }
        };
        check(
            "[server]\ncolour = 1\n",
            &["server.colour", "unknown field `colour`"],
        );
        check("[serverz]\nport = 1\n", &["serverz", "unknown field"]);
        check("[server]\nport = \"x\"\n", &["server.port", "line 2"]);
        check("[server\n", &["line 1"]);
        check(
            "[content_filter]\npatterns = [\"ok\", \"(oops\"]\n",
            &["content_filter.patterns[1]", "(oops", "config file"],
        );
        check(
            &format!("[cache]\nprefix_cache_mb = {}\n", i64::MAX),
            &["cache.prefix_cache_mb", "too large"],
        );
    }

    #[test]
    fn bad_environment_values_name_the_variable() {
        let err = resolve_with(&Flags::default(), &env_of(&[("SHOAL_PORT", "http")]), None)
            .expect_err("bad port");
        assert!(format!("{err:#}").contains("SHOAL_PORT"), "{err:#}");
        let err = resolve_with(
            &Flags::default(),
            &env_of(&[("SHOAL_BLOCK_REGEX", "a\n[z")]),
            None,
        )
        .expect_err("bad regex");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("patterns[1]") && msg.contains("SHOAL_BLOCK_REGEX"),
            "{msg}"
        );
    }

    #[test]
    fn environment_lists_and_empty_values() {
        let env = env_of(&[("SHOAL_BLOCK", "a\nb\n"), ("SHOAL_HOST", "")]);
        let r = resolve_with(&Flags::default(), &env, None).expect("resolve");
        assert_eq!(r.config.content_filter.phrases, ["a", "b", ""]);
        assert_eq!(r.source("server.host"), Source::Default, "empty = unset");
        let o = r.config.engine_options().expect("options");
        assert_eq!(o.blocked_phrases, ["a", "b"]);
    }

    #[test]
    fn relative_model_path_is_taken_from_the_file_directory() {
        let dir = temp_dir("relative");
        let path = write(
            &dir,
            "[server]\ndb = \"h.sqlite\"\n[model]\npath = \"m.gguf\"\naliases = [\"x\"]\n",
        );
        let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
        assert_eq!(r.config.model_path(), dir.join("m.gguf"));
        assert_eq!(r.config.db_path().expect("db"), dir.join("h.sqlite"));
        let r = resolve_with(
            &flags_with(&path),
            &env_of(&[("SHOAL_DB", "/e.sqlite")]),
            None,
        )
        .expect("resolve");
        assert_eq!(r.config.db_path().expect("db"), PathBuf::from("/e.sqlite"));
        assert_eq!(r.source("server.db"), Source::Env);
        assert_eq!(r.config.model_id(), "m");
        assert_eq!(r.config.model.aliases, ["x"]);
    }

    #[test]
    fn prices_are_one_setting_of_tables_by_model_from_the_file() {
        let dir = temp_dir("prices");
        let path = write(
            &dir,
            "[server]\nport = 9000\n\n[prices.\"qwen2.5-coder\"]\ninput_per_mtok = 3\n\
             output_per_mtok = 15.0\ncached_input_per_mtok = 0.3\n\n[prices.smollm2]\n\
             input_per_mtok = 0.1\noutput_per_mtok = 0.2\n",
        );
        let r = resolve_with(&flags_with(&path), &env_of(&[]), None).expect("resolve");
        let p = &r.config.prices;
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(
            p["qwen2.5-coder"].input_per_mtok, 3.0,
            "an integer is a price too"
        );
        assert_eq!(p["qwen2.5-coder"].cached_input_per_mtok, Some(0.3));
        assert_eq!(p["smollm2"].cached_input_per_mtok, None);
        assert_eq!(r.source("prices"), Source::File);
        // `shoal config` prints them, and what it prints reads back.
        let text = r.to_annotated_toml().expect("toml");
        assert!(text.contains("[prices.\"qwen2.5-coder\"]"), "{text}");
        assert!(
            text.contains(&format!("# config file {}", path.display())),
            "{text}"
        );
        let back: Config = toml::from_str(&text).expect("output is a valid config");
        assert_eq!(&back.prices, p);
        assert_eq!(back.server.port, 9000);
        // None set: printed empty, still valid.
        let r = resolve_with(&Flags::default(), &env_of(&[]), None).expect("resolve");
        let text = r.to_annotated_toml().expect("toml");
        let back: Config = toml::from_str(&text).expect("valid");
        assert!(back.prices.is_empty() && text.contains("prices"), "{text}");
        // A misspelt part and a price below 0 name the key.
        let check = |text: &str, expected: &[&str]| {
            let path = write(&dir, text);
            let err = resolve_with(&flags_with(&path), &env_of(&[]), None).expect_err(text);
            let msg = format!("{err:#}");
            for e in expected {
                assert!(msg.contains(e), "{e:?} not in {msg}");
            }
        };
        check(
            "[prices.m]\ninput_per_mtok = 1.0\noutput_per_mtok = 1.0\ncached_input_per_mtk = 0.1\n",
            &["prices.m", "cached_input_per_mtk"],
        );
        check(
            "[prices.m]\ninput_per_mtok = -1.0\noutput_per_mtok = 1.0\n",
            &["prices.m.input_per_mtok", "at least 0"],
        );
        check("[prices.m]\ninput_per_mtok = 1.0\n", &["output_per_mtok"]);
    }

    #[test]
    fn annotated_output_round_trips_and_names_sources() {
        let dir = temp_dir("print");
        let path = write(
            &dir,
            "[server]\nport = 9000\n[content_filter]\nphrases = [\"two\\nlines\", \"x\"]\n",
        );
        let mut flags = flags_with(&path);
        flags.set("server.host", "0.0.0.0").expect("host");
        let r = resolve_with(&flags, &env_of(&[("SHOAL_QUEUE", "3")]), None).expect("resolve");
        let text = r.to_annotated_toml().expect("toml");
        assert!(text.contains("host = \"0.0.0.0\"  # --host"), "{text}");
        assert!(text.contains("queue = 3  # env SHOAL_QUEUE"), "{text}");
        assert!(
            text.contains(&format!("port = 9000  # config file {}", path.display())),
            "{text}"
        );
        let back: Config = toml::from_str(&text).expect("output is a valid config");
        let mut effective = r.config.server.clone();
        effective.db = r.config.db_path().ok();
        assert_eq!(back.server, effective, "the default store path is shown");
        assert_eq!(back.content_filter, r.config.content_filter);
        assert_eq!(back.model.id.as_deref(), Some(r.config.model_id().as_str()));
    }
}
