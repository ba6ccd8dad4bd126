//! Settings for `shoal serve`, layered so that each source overrides the one
//! before it: built-in defaults, the TOML config file, environment variables,
//! command-line flags. `shoal config` prints the result with each value's source.
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use shoal_engine::content_filter::ContentPolicy;
use shoal_engine::EngineOptions;

/// Environment variable naming the config file (like `--config`).
pub const CONFIG_ENV: &str = "SHOAL_CONFIG";

/// Everything `shoal serve` can be told, as written in the config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: Server,
    pub model: Model,
    pub cache: Cache,
    pub models: Models,
    pub content_filter: ContentFilter,
    pub cluster: ClusterSettings,
}

/// Joining a cluster: off unless a secret is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// Shared by every node; signs all control messages. Empty: no cluster.
    pub secret: String,
    /// Other nodes' API addresses (`host:port`) for networks without multicast.
    pub peers: Vec<String>,
    /// Announce and find nodes on the LAN with mDNS.
    pub mdns: bool,
    /// Seconds without a heartbeat before a node shows as unreachable.
    pub unreachable_after_secs: u64,
    /// Seconds without a heartbeat before a node is dropped.
    pub remove_after_secs: u64,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            secret: String::new(),
            peers: Vec::new(),
            mdns: true,
            unreachable_after_secs: 3,
            remove_after_secs: 20,
        }
    }
}

/// Which models stay in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Models {
    /// Memory all loaded models may take together (0 = three quarters of RAM).
    /// A model that would not fit unloads idle ones first, else is refused.
    pub memory_budget_mb: u64,
    /// Unload a model nobody has used for this many seconds (0 = never).
    pub idle_unload_secs: u64,
}

impl Default for Models {
    fn default() -> Self {
        Models {
            memory_budget_mb: 0,
            idle_unload_secs: 1800,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    pub host: IpAddr,
    pub port: u16,
    /// Requests allowed to wait behind the running ones; more get 429/529.
    pub queue: usize,
    /// Requests decoded together in one batched forward pass.
    pub max_batch: usize,
    /// Conversation store behind /v1/conversations (the one `shoal chat` and
    /// `shoal history` use); the platform data directory when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub db: Option<PathBuf>,
    /// Log each request's prompt text (off: prompts stay out of the logs).
    pub log_prompts: bool,
    /// `text` (human-readable) or `json` (one object per line).
    pub log_format: crate::LogFormat,
    /// Keys clients must send (`Authorization: Bearer` or `x-api-key`); any
    /// one is accepted. Required to listen beyond loopback.
    pub api_keys: Vec<String>,
    /// Browser origins allowed besides the server's own pages and the desktop
    /// app (`*` for any).
    pub cors_origins: Vec<String>,
    /// Most messages one request may carry.
    pub max_messages: usize,
    /// Most tools one request may offer.
    pub max_tools: usize,
    /// Largest request body accepted, in MiB; a bigger one gets a 413.
    pub max_body_mb: usize,
    /// Longest a request may run, in seconds (0 = no limit); then it ends
    /// with a timeout error that still reports its usage.
    pub request_timeout_secs: u64,
}

impl Default for Server {
    fn default() -> Self {
        Server {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8421,
            queue: 64,
            max_batch: 16,
            db: None,
            log_prompts: false,
            log_format: crate::LogFormat::Text,
            api_keys: Vec::new(),
            cors_origins: Vec::new(),
            max_messages: 2048,
            max_tools: 256,
            max_body_mb: 8,
            request_timeout_secs: 600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Model {
    /// A .gguf file or a model directory; relative paths in the file are
    /// taken from the file's own directory, so a config travels with its model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The name clients use; the file or directory name when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Other names that resolve to the model.
    pub aliases: Vec<String>,
    /// `auto` (MLX for model directories, llama.cpp for GGUF), `mlx` or `llama`.
    pub backend: shoal_engine::BackendChoice,
    /// llama.cpp threads (0 = the physical cores).
    pub threads: usize,
    /// KV positions llama.cpp reserves per model, shared by its requests.
    pub kv_cache_tokens: usize,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            path: None,
            id: None,
            aliases: Vec::new(),
            backend: shoal_engine::BackendChoice::Auto,
            threads: 0,
            kv_cache_tokens: shoal_engine::backends::llama::DEFAULT_KV_TOKENS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    /// Memory for reusing KV state of shared prompt prefixes (0 = off).
    pub prefix_cache_mb: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache {
            prefix_cache_mb: 1024,
        }
    }
}

/// Off unless phrases or patterns are given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContentFilter {
    /// Replies containing one of these are cut before it and end with
    /// finish reason content_filter / refusal.
    pub phrases: Vec<String>,
    /// Regular expressions that end a reply the same way.
    pub patterns: Vec<String>,
}

/// One setting: its key in the file, and the environment variable and flag that override it.
struct Setting {
    section: &'static str,
    key: &'static str,
    env: Option<&'static str>,
    flag: &'static str,
}

const fn setting(
    section: &'static str,
    key: &'static str,
    env: Option<&'static str>,
    flag: &'static str,
) -> Setting {
    Setting {
        section,
        key,
        env,
        flag,
    }
}

/// Every setting, in the order `shoal config` prints them.
const SETTINGS: &[Setting] = &[
    setting("server", "host", Some("SHOAL_HOST"), "--host"),
    setting("server", "port", Some("SHOAL_PORT"), "--port"),
    setting("server", "queue", Some("SHOAL_QUEUE"), "--queue"),
    setting(
        "server",
        "max_batch",
        Some("SHOAL_MAX_BATCH"),
        "--max-batch",
    ),
    setting("server", "db", Some("SHOAL_DB"), "--db"),
    setting(
        "server",
        "log_prompts",
        Some("SHOAL_LOG_PROMPTS"),
        "--log-prompts",
    ),
    setting(
        "server",
        "log_format",
        Some("SHOAL_LOG_FORMAT"),
        "--log-format",
    ),
    setting("server", "api_keys", Some("SHOAL_API_KEYS"), "--api-key"),
    setting(
        "server",
        "cors_origins",
        Some("SHOAL_CORS_ORIGINS"),
        "--cors-origin",
    ),
    setting(
        "server",
        "max_messages",
        Some("SHOAL_MAX_MESSAGES"),
        "--max-messages",
    ),
    setting(
        "server",
        "max_tools",
        Some("SHOAL_MAX_TOOLS"),
        "--max-tools",
    ),
    setting(
        "server",
        "max_body_mb",
        Some("SHOAL_MAX_BODY_MB"),
        "--max-body-mb",
    ),
    setting(
        "server",
        "request_timeout_secs",
        Some("SHOAL_REQUEST_TIMEOUT_SECS"),
        "--request-timeout-secs",
    ),
    setting("model", "path", Some("SHOAL_MODEL"), "--model"),
    setting("model", "id", Some("SHOAL_MODEL_ID"), "--model-id"),
    setting("model", "aliases", None, "--alias"),
    setting("model", "backend", Some("SHOAL_BACKEND"), "--backend"),
    setting("model", "threads", Some("SHOAL_THREADS"), "--threads"),
    setting(
        "model",
        "kv_cache_tokens",
        Some("SHOAL_KV_CACHE_TOKENS"),
        "--kv-cache-tokens",
    ),
    setting(
        "cache",
        "prefix_cache_mb",
        Some("SHOAL_PREFIX_CACHE_MB"),
        "--prefix-cache-mb",
    ),
    setting(
        "models",
        "memory_budget_mb",
        Some("SHOAL_MEMORY_BUDGET_MB"),
        "--memory-budget-mb",
    ),
    setting(
        "models",
        "idle_unload_secs",
        Some("SHOAL_IDLE_UNLOAD_SECS"),
        "--idle-unload-secs",
    ),
    setting("content_filter", "phrases", Some("SHOAL_BLOCK"), "--block"),
    setting(
        "content_filter",
        "patterns",
        Some("SHOAL_BLOCK_REGEX"),
        "--block-regex",
    ),
    setting(
        "cluster",
        "secret",
        Some("SHOAL_CLUSTER_SECRET"),
        "--cluster-secret",
    ),
    setting("cluster", "peers", Some("SHOAL_PEERS"), "--peer"),
    setting("cluster", "mdns", Some("SHOAL_MDNS"), "--no-mdns"),
    setting("cluster", "unreachable_after_secs", None, "(file only)"),
    setting("cluster", "remove_after_secs", None, "(file only)"),
];

fn find_setting(section: &str, key: &str) -> Option<&'static Setting> {
    SETTINGS
        .iter()
        .find(|s| s.section == section && s.key == key)
}

/// The `section.key` name used in messages and in the source map.
fn dotted(s: &Setting) -> String {
    format!("{}.{}", s.section, s.key)
}

/// Flags shared by `shoal serve` and `shoal config`; absent ones leave the
/// lower layers' values in place.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Flags {
    /// TOML config file [env: SHOAL_CONFIG] (default: shoal/config.toml in the
    /// platform config directory, used when it exists).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// A .gguf file or a Hugging Face / MLX model directory [env: SHOAL_MODEL].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The name clients use for the model (default: the file or directory name)
    /// [env: SHOAL_MODEL_ID].
    #[arg(long)]
    pub model_id: Option<String>,
    /// Which engine runs the model: auto (MLX for model directories, llama.cpp
    /// for GGUF files), mlx or llama [env: SHOAL_BACKEND].
    #[arg(long)]
    pub backend: Option<shoal_engine::BackendChoice>,
    /// llama.cpp threads (0 = the physical cores, the default) [env: SHOAL_THREADS].
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV positions llama.cpp reserves per model, shared by all its requests
    /// (default 8192) [env: SHOAL_KV_CACHE_TOKENS].
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Address to listen on (default 127.0.0.1) [env: SHOAL_HOST].
    #[arg(long)]
    pub host: Option<IpAddr>,
    /// Port to listen on; 0 picks a free one (default 8421) [env: SHOAL_PORT].
    #[arg(long)]
    pub port: Option<u16>,
    /// Requests allowed to wait behind the running ones; more get 429/529
    /// (default 64) [env: SHOAL_QUEUE].
    #[arg(long)]
    pub queue: Option<usize>,
    /// Requests decoded together in one batched forward pass (continuous
    /// batching; default 16) [env: SHOAL_MAX_BATCH].
    #[arg(long)]
    pub max_batch: Option<usize>,
    /// Conversation store for the web UI's history, shared with `shoal chat`
    /// (default: the platform data directory) [env: SHOAL_DB].
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Log each request's prompt text; off by default so prompts stay out of
    /// the logs [env: SHOAL_LOG_PROMPTS=true].
    #[arg(long)]
    pub log_prompts: bool,
    /// Memory for reusing KV state of shared prompt prefixes across requests,
    /// 0 = off (default 1024) [env: SHOAL_PREFIX_CACHE_MB].
    #[arg(long)]
    pub prefix_cache_mb: Option<usize>,
    /// Content filter: replies containing this phrase are cut before it and end
    /// with finish reason content_filter / refusal (repeatable; replaces the
    /// config file's phrases) [env: SHOAL_BLOCK, one per line].
    #[arg(long = "block", value_name = "PHRASE")]
    pub blocked: Vec<String>,
    /// Content filter: a regular expression that ends a reply the same way
    /// (repeatable; replaces the config file's patterns) [env: SHOAL_BLOCK_REGEX,
    /// one per line].
    #[arg(long = "block-regex", value_name = "RE")]
    pub blocked_regex: Vec<String>,
    /// Another name that resolves to the model (repeatable; replaces the config
    /// file's aliases).
    #[arg(long = "alias", value_name = "NAME")]
    pub aliases: Vec<String>,
    /// Memory all loaded models may take together; a model that would not fit
    /// unloads idle ones first, else is refused (0 = three quarters of RAM,
    /// the default) [env: SHOAL_MEMORY_BUDGET_MB].
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Unload a model nobody has used for this many seconds (0 = never;
    /// default 1800) [env: SHOAL_IDLE_UNLOAD_SECS].
    #[arg(long)]
    pub idle_unload_secs: Option<u64>,
    /// Join a cluster: the secret every node shares (signs heartbeats and
    /// control requests) [env: SHOAL_CLUSTER_SECRET].
    #[arg(long, value_name = "SECRET")]
    pub cluster_secret: Option<String>,
    /// Another node's API address, HOST:PORT (repeatable; for networks without
    /// multicast) [env: SHOAL_PEERS, comma-separated].
    #[arg(long = "peer", value_name = "HOST:PORT")]
    pub peers: Vec<String>,
    /// Do not announce or look for nodes with mDNS [env: SHOAL_MDNS=false].
    #[arg(long)]
    pub no_mdns: bool,
    /// A key clients must send as `Authorization: Bearer KEY` or `x-api-key`
    /// (repeatable; needed to listen beyond loopback) [env: SHOAL_API_KEYS,
    /// comma-separated].
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// A browser origin allowed to call the API besides the server's own pages
    /// and the desktop app (repeatable; `*` for any) [env: SHOAL_CORS_ORIGINS].
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Most messages one request may carry (default 2048) [env: SHOAL_MAX_MESSAGES].
    #[arg(long)]
    pub max_messages: Option<usize>,
    /// Most tools one request may offer (default 256) [env: SHOAL_MAX_TOOLS].
    #[arg(long)]
    pub max_tools: Option<usize>,
    /// Largest request body accepted, in MiB (default 8) [env: SHOAL_MAX_BODY_MB].
    #[arg(long)]
    pub max_body_mb: Option<usize>,
    /// Longest a request may run, in seconds; then it ends with a timeout
    /// error that still reports its usage (0 = no limit; default 600)
    /// [env: SHOAL_REQUEST_TIMEOUT_SECS].
    #[arg(long)]
    pub request_timeout_secs: Option<u64>,
}

/// Values one layer (environment or flags) sets; `None` leaves the value below.
#[derive(Debug, Default)]
struct Overrides {
    host: Option<IpAddr>,
    port: Option<u16>,
    queue: Option<usize>,
    max_batch: Option<usize>,
    db: Option<PathBuf>,
    log_prompts: Option<bool>,
    model_path: Option<PathBuf>,
    model_id: Option<String>,
    aliases: Option<Vec<String>>,
    backend: Option<shoal_engine::BackendChoice>,
    threads: Option<usize>,
    kv_cache_tokens: Option<usize>,
    prefix_cache_mb: Option<usize>,
    phrases: Option<Vec<String>>,
    patterns: Option<Vec<String>>,
    memory_budget_mb: Option<u64>,
    idle_unload_secs: Option<u64>,
    log_format: Option<crate::LogFormat>,
    cluster_secret: Option<String>,
    peers: Option<Vec<String>>,
    mdns: Option<bool>,
    api_keys: Option<Vec<String>>,
    cors_origins: Option<Vec<String>>,
    max_messages: Option<usize>,
    max_tools: Option<usize>,
    max_body_mb: Option<usize>,
    request_timeout_secs: Option<u64>,
}

impl Overrides {
    /// Reads the environment through `get`, which treats empty values as unset
    /// (as clap did for these variables).
    fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        fn parsed<T: std::str::FromStr>(name: &str, value: Option<String>) -> Result<Option<T>>
        where
            T::Err: fmt::Display,
        {
            value
                .map(|v| {
                    v.parse::<T>()
                        .map_err(|e| anyhow!("environment variable {name}={v:?}: {e}"))
                })
                .transpose()
        }
        let lines = |v: String| v.split('\n').map(str::to_owned).collect::<Vec<_>>();
        let commas = |v: String| -> Vec<String> {
            v.split([',', '\n'])
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect()
        };
        Ok(Overrides {
            host: parsed("SHOAL_HOST", var("SHOAL_HOST"))?,
            port: parsed("SHOAL_PORT", var("SHOAL_PORT"))?,
            queue: parsed("SHOAL_QUEUE", var("SHOAL_QUEUE"))?,
            max_batch: parsed("SHOAL_MAX_BATCH", var("SHOAL_MAX_BATCH"))?,
            db: var("SHOAL_DB").map(PathBuf::from),
            log_prompts: parsed("SHOAL_LOG_PROMPTS", var("SHOAL_LOG_PROMPTS"))?,
            model_path: var("SHOAL_MODEL").map(PathBuf::from),
            model_id: var("SHOAL_MODEL_ID"),
            aliases: None,
            backend: parsed("SHOAL_BACKEND", var("SHOAL_BACKEND"))?,
            threads: parsed("SHOAL_THREADS", var("SHOAL_THREADS"))?,
            kv_cache_tokens: parsed("SHOAL_KV_CACHE_TOKENS", var("SHOAL_KV_CACHE_TOKENS"))?,
            prefix_cache_mb: parsed("SHOAL_PREFIX_CACHE_MB", var("SHOAL_PREFIX_CACHE_MB"))?,
            phrases: var("SHOAL_BLOCK").map(lines),
            patterns: var("SHOAL_BLOCK_REGEX").map(lines),
            memory_budget_mb: parsed("SHOAL_MEMORY_BUDGET_MB", var("SHOAL_MEMORY_BUDGET_MB"))?,
            idle_unload_secs: parsed("SHOAL_IDLE_UNLOAD_SECS", var("SHOAL_IDLE_UNLOAD_SECS"))?,
            log_format: var("SHOAL_LOG_FORMAT")
                .map(|v| {
                    <crate::LogFormat as clap::ValueEnum>::from_str(&v, true)
                        .map_err(|e| anyhow!("environment variable SHOAL_LOG_FORMAT={v:?}: {e}"))
                })
                .transpose()?,
            cluster_secret: var("SHOAL_CLUSTER_SECRET"),
            peers: var("SHOAL_PEERS").map(commas),
            mdns: parsed("SHOAL_MDNS", var("SHOAL_MDNS"))?,
            api_keys: var("SHOAL_API_KEYS").map(commas),
            cors_origins: var("SHOAL_CORS_ORIGINS").map(commas),
            max_messages: parsed("SHOAL_MAX_MESSAGES", var("SHOAL_MAX_MESSAGES"))?,
            max_tools: parsed("SHOAL_MAX_TOOLS", var("SHOAL_MAX_TOOLS"))?,
            max_body_mb: parsed("SHOAL_MAX_BODY_MB", var("SHOAL_MAX_BODY_MB"))?,
            request_timeout_secs: parsed(
                "SHOAL_REQUEST_TIMEOUT_SECS",
                var("SHOAL_REQUEST_TIMEOUT_SECS"),
            )?,
        })
    }

    fn from_flags(f: &Flags) -> Self {
        let list = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        Overrides {
            host: f.host,
            port: f.port,
            queue: f.queue,
            max_batch: f.max_batch,
            db: f.db.clone(),
            log_prompts: f.log_prompts.then_some(true),
            model_path: f.model.clone(),
            model_id: f.model_id.clone(),
            aliases: list(&f.aliases),
            backend: f.backend,
            threads: f.threads,
            kv_cache_tokens: f.kv_cache_tokens,
            prefix_cache_mb: f.prefix_cache_mb,
            phrases: list(&f.blocked),
            patterns: list(&f.blocked_regex),
            memory_budget_mb: f.memory_budget_mb,
            idle_unload_secs: f.idle_unload_secs,
            log_format: None,
            cluster_secret: f.cluster_secret.clone(),
            peers: list(&f.peers),
            mdns: f.no_mdns.then_some(false),
            api_keys: list(&f.api_keys),
            cors_origins: list(&f.cors_origins),
            max_messages: f.max_messages,
            max_tools: f.max_tools,
            max_body_mb: f.max_body_mb,
            request_timeout_secs: f.request_timeout_secs,
        }
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
    if let (Some(text), Some(path)) = (text, file) {
        let (config, keys) = parse_file(&text, &path)?;
        resolved.config = config;
        for key in keys {
            resolved.sources.insert(key, Source::File);
        }
        resolved.file = Some(path);
    }
    resolved.apply(Overrides::from_env(env)?, Source::Env);
    resolved.apply(Overrides::from_flags(flags), Source::Flag);
    resolved.validate()?;
    Ok(resolved)
}

/// Parses a config file's text; returns the config and the keys the file set.
fn parse_file(text: &str, path: &Path) -> Result<(Config, Vec<String>)> {
    let invalid = || format!("invalid config file {}", path.display());
    let de = toml::Deserializer::parse(text).with_context(invalid)?;
    let mut config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        anyhow!("{}, key `{at}`:\n{}", invalid(), e.into_inner())
    })?;
    // The text parsed above, so this only lists which keys were present.
    let table: toml::Table = text.parse().with_context(invalid)?;
    let mut keys = Vec::new();
    for (section, values) in &table {
        if let toml::Value::Table(values) = values {
            for key in values.keys() {
                if let Some(s) = find_setting(section, key) {
                    keys.push(dotted(s));
                }
            }
        }
    }
    if let Some(dir) = path.parent() {
        for p in [config.model.path.as_mut(), config.server.db.as_mut()]
            .into_iter()
            .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }
    Ok((config, keys))
}

impl Resolved {
    fn apply(&mut self, o: Overrides, source: Source) {
        let mut set = |key: &str| {
            self.sources.insert(key.to_owned(), source);
        };
        let c = &mut self.config;
        if let Some(v) = o.host {
            c.server.host = v;
            set("server.host");
        }
        if let Some(v) = o.port {
            c.server.port = v;
            set("server.port");
        }
        if let Some(v) = o.queue {
            c.server.queue = v;
            set("server.queue");
        }
        if let Some(v) = o.max_batch {
            c.server.max_batch = v;
            set("server.max_batch");
        }
        if let Some(v) = o.db {
            c.server.db = Some(v);
            set("server.db");
        }
        if let Some(v) = o.log_prompts {
            c.server.log_prompts = v;
            set("server.log_prompts");
        }
        if let Some(v) = o.model_path {
            c.model.path = Some(v);
            set("model.path");
        }
        if let Some(v) = o.model_id {
            c.model.id = Some(v);
            set("model.id");
        }
        if let Some(v) = o.aliases {
            c.model.aliases = v;
            set("model.aliases");
        }
        if let Some(v) = o.backend {
            c.model.backend = v;
            set("model.backend");
        }
        if let Some(v) = o.threads {
            c.model.threads = v;
            set("model.threads");
        }
        if let Some(v) = o.kv_cache_tokens {
            c.model.kv_cache_tokens = v;
            set("model.kv_cache_tokens");
        }
        if let Some(v) = o.prefix_cache_mb {
            c.cache.prefix_cache_mb = v;
            set("cache.prefix_cache_mb");
        }
        if let Some(v) = o.phrases {
            c.content_filter.phrases = v;
            set("content_filter.phrases");
        }
        if let Some(v) = o.patterns {
            c.content_filter.patterns = v;
            set("content_filter.patterns");
        }
        if let Some(v) = o.memory_budget_mb {
            c.models.memory_budget_mb = v;
            set("models.memory_budget_mb");
        }
        if let Some(v) = o.idle_unload_secs {
            c.models.idle_unload_secs = v;
            set("models.idle_unload_secs");
        }
        if let Some(v) = o.log_format {
            c.server.log_format = v;
            set("server.log_format");
        }
        if let Some(v) = o.cluster_secret {
            c.cluster.secret = v;
            set("cluster.secret");
        }
        if let Some(v) = o.peers {
            c.cluster.peers = v;
            set("cluster.peers");
        }
        if let Some(v) = o.mdns {
            c.cluster.mdns = v;
            set("cluster.mdns");
        }
        if let Some(v) = o.api_keys {
            c.server.api_keys = v;
            set("server.api_keys");
        }
        if let Some(v) = o.cors_origins {
            c.server.cors_origins = v;
            set("server.cors_origins");
        }
        if let Some(v) = o.max_messages {
            c.server.max_messages = v;
            set("server.max_messages");
        }
        if let Some(v) = o.max_tools {
            c.server.max_tools = v;
            set("server.max_tools");
        }
        if let Some(v) = o.max_body_mb {
            c.server.max_body_mb = v;
            set("server.max_body_mb");
        }
        if let Some(v) = o.request_timeout_secs {
            c.server.request_timeout_secs = v;
            set("server.request_timeout_secs");
        }
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
        let setting = key
            .split_once('.')
            .and_then(|(section, k)| find_setting(section, k));
        match (self.source(key), setting) {
            (Source::File, _) => match &self.file {
                Some(p) => format!("config file {}", p.display()),
                None => "config file".into(),
            },
            (Source::Env, Some(s)) => format!("env {}", s.env.unwrap_or("?")),
            (Source::Flag, Some(s)) => s.flag.to_owned(),
            (Source::Env, None) => "env".into(),
            (Source::Flag, None) => "command line".into(),
            (Source::Default, _) => "default".into(),
        }
    }

    /// Catches what the file format cannot: bad regular expressions and sizes
    /// that overflow. Each message names the key and where its value came from.
    fn validate(&self) -> Result<()> {
        let key = "content_filter.patterns";
        for (i, p) in self.config.content_filter.patterns.iter().enumerate() {
            if p.is_empty() {
                continue;
            }
            if let Err(e) = ContentPolicy::new(Vec::new(), std::slice::from_ref(p)) {
                bail!("{key}[{i}] (from {}): {e}", self.describe(key));
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
        // Keys and secrets are shown as set, never printed.
        for k in shown.server.api_keys.iter_mut() {
            *k = "(set)".into();
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
            let Some(value) = table
                .get(s.section)
                .and_then(|t| t.as_table())
                .and_then(|t| t.get(s.key))
            else {
                continue;
            };
            if s.section != section {
                out.push_str(&format!("\n[{}]\n", s.section));
                section = s.section;
            }
            let key = dotted(s);
            let mut from = self.describe(&key);
            if self.source(&key) == Source::Default && s.key == "id" {
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

    /// How the model pool loads, budgets and unloads models.
    pub fn pool_options(&self) -> Result<shoal_api::pool::PoolOptions> {
        let budget = self.models.memory_budget_mb;
        Ok(shoal_api::pool::PoolOptions {
            engine: self.engine_options()?,
            budget_bytes: (budget > 0)
                .then(|| budget.checked_mul(1 << 20))
                .map(|b| b.context("models.memory_budget_mb is too large"))
                .transpose()?,
            idle_unload: (self.models.idle_unload_secs > 0)
                .then(|| std::time::Duration::from_secs(self.models.idle_unload_secs)),
            hub: shoal_models::HubOptions::from_env(),
        })
    }

    /// API keys, allowed origins and request limits for the server.
    pub fn access(&self) -> shoal_api::access::Access {
        let mut a = shoal_api::access::Access::default().with_keys(&self.server.api_keys);
        a.origins.extend(self.server.cors_origins.iter().cloned());
        a.max_messages = self.server.max_messages.max(1);
        a.max_tools = self.server.max_tools;
        a.max_body_bytes = self.server.max_body_mb.max(1).saturating_mul(1 << 20);
        a.request_timeout = (self.server.request_timeout_secs > 0)
            .then(|| std::time::Duration::from_secs(self.server.request_timeout_secs));
        a
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
            llama: shoal_engine::LlamaOptions::new(self.model.threads, self.model.kv_cache_tokens),
            ..EngineOptions::default()
        })
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
        flags.queue = Some(8);
        flags.blocked = vec!["Berlin".into()];
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
    fn annotated_output_round_trips_and_names_sources() {
        let dir = temp_dir("print");
        let path = write(
            &dir,
            "[server]\nport = 9000\n[content_filter]\nphrases = [\"two\\nlines\", \"x\"]\n",
        );
        let mut flags = flags_with(&path);
        flags.host = Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
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
