//! The settings table (one row per setting: field, type, default,
//! environment variable, flag and help) and the types its rows use.
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use shoal_api::access::Access;
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
    pub(super) fn name(self) -> Option<&'static str> {
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
    pub(super) fn long(self) -> Option<&'static str> {
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
    pub(super) fn value_in<'t>(&self, table: &'t toml::Table) -> Option<&'t toml::Value> {
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
        /// Largest image a request may send to a vision model, in MiB (as
        /// decoded from its base64); a bigger one gets a 400.
        max_image_mb: usize = Access::default().images.max_bytes >> 20,
            env Env::Var("SHOAL_MAX_IMAGE_MB"), flag Flag::Value("max-image-mb", "MIB");
        /// Most images one request may send.
        max_images: usize = Access::default().images.max_images,
            env Env::Var("SHOAL_MAX_IMAGES"), flag Flag::Value("max-images", "N");
        /// Most pixels (width × height) of one image.
        max_image_pixels: u64 = Access::default().images.max_pixels,
            env Env::Var("SHOAL_MAX_IMAGE_PIXELS"), flag Flag::Value("max-image-pixels", "N");
        /// Fetch an image a request names by http(s) address (off: such a
        /// request gets a 400 asking for the image's bytes; a server that
        /// fetches for clients can be made to reach what they cannot).
        fetch_image_urls: bool = false,
            env Env::Var("SHOAL_FETCH_IMAGE_URLS"), flag Flag::On("fetch-image-urls");
        /// Images one stored chat may keep, in MiB (as decoded); a message
        /// that would pass it is not stored (413).
        max_chat_images_mb: usize = Access::default().max_chat_image_bytes >> 20,
            env Env::Var("SHOAL_MAX_CHAT_IMAGES_MB"), flag Flag::Value("max-chat-images-mb", "MIB");
        /// Longest a request may run, in seconds (0 = no limit); then it ends
        /// with a timeout error that still reports its usage.
        request_timeout_secs: u64 = Access::default().request_timeout.map_or(0, |d| d.as_secs()),
            env Env::Var("SHOAL_REQUEST_TIMEOUT_SECS"), flag Flag::Value("request-timeout-secs", "SECS");
        /// Seconds a stream may go without data while its request waits or
        /// reads its prompt before it sends its dialect's heartbeat (0 = never):
        /// a data event the client's SDK passes on (Anthropic's ping, an empty
        /// chunk, Responses' in_progress), so agents' stream-idle guards do not
        /// drop a long prefill.
        stream_heartbeat_secs: u64 = Access::default().stream_heartbeat.map_or(0, |d| d.as_secs()),
            env Env::Var("SHOAL_STREAM_HEARTBEAT_SECS"), flag Flag::Value("stream-heartbeat-secs", "SECS");
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
        /// The vision projector (an mmproj .gguf) of the model, or off for
        /// none; unset, a GGUF uses an mmproj*.gguf beside it if there is one.
        mmproj: Option<String> = None,
            env Env::Var("SHOAL_MMPROJ"), flag Flag::Value("mmproj", "PATH|off");
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
        /// Vision projectors named per model, each MODEL=PATH: MODEL is the
        /// model's id as `shoal models` lists it, its path or its file name;
        /// PATH is its mmproj .gguf, or off for none (a model not named uses
        /// an mmproj*.gguf beside it).
        projectors: Vec<String> = Vec::new(),
            env Env::Lines("SHOAL_PROJECTORS"), flag Flag::Value("projector", "MODEL=PATH|off");
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
    /// Tools from MCP servers for the chat and `/v1/mcp`.
    [mcp] McpSettings {
        /// The MCP servers, in the mcp.json layout Cursor and Claude Desktop
        /// use (default: mcp.json in the platform's shoal config folder,
        /// beside the default config.toml).
        file: Option<PathBuf> = None, env Env::Var("SHOAL_MCP_FILE"), flag Flag::Value("mcp-file", "PATH");
        /// Seconds an MCP tool call may take; past it the server is stopped
        /// (it starts again on next use) and the call is an error.
        timeout_secs: u64 = 60, env Env::Var("SHOAL_MCP_TIMEOUT_SECS"), flag Flag::Value("mcp-timeout-secs", "SECS");
        /// Seconds an MCP server may take to start and list its tools (npx
        /// may fetch its package first).
        start_timeout_secs: u64 = 120,
            env Env::Var("SHOAL_MCP_START_TIMEOUT_SECS"), flag Flag::Value("mcp-start-timeout-secs", "SECS");
        /// Characters of a tool's result the model reads; the rest is cut
        /// and the cut said.
        max_result_chars: usize = 16000,
            env Env::Var("SHOAL_MCP_MAX_RESULT_CHARS"), flag Flag::Value("mcp-max-result-chars", "N");
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

pub(super) fn find_setting(id: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.id == id)
}

/// The built-in defaults as TOML, for the flags' help and the lowest layer.
pub(super) fn default_table() -> toml::Table {
    // The defaults are values of the table's own types, so they render.
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

/// Turns text from a flag or the environment into the TOML value of `kind`.
pub(super) fn text_value(kind: Kind, mut items: Vec<String>) -> Result<toml::Value, String> {
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
