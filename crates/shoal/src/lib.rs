//! The parts of the `shoal` command that other front ends share: the server
//! settings (`config`) and the default model id.
pub mod config;
pub mod shard;

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The conversation store `shoal chat`, `shoal history` and the server's
/// `/v1/conversations` share unless told otherwise.
pub fn default_db_path() -> anyhow::Result<PathBuf> {
    let dirs = directories::ProjectDirs::from("", "", "shoal")
        .context("no home directory for the conversation store; pass --db")?;
    Ok(dirs.data_dir().join("conversations.sqlite"))
}

/// Attaches the configured conversation store to the server state. A store
/// that cannot be opened is logged and left out: the API then serves without
/// history (503 on /v1/conversations) rather than not at all.
pub fn open_store(state: shoal_api::AppState, cfg: &config::Config) -> shoal_api::AppState {
    let db = match cfg.db_path() {
        Ok(db) => db,
        Err(e) => {
            tracing::warn!(error = %e, "conversation store unavailable");
            return state;
        }
    };
    match state.clone().with_store(&db, cfg.retention()) {
        Ok(with) => {
            tracing::info!(db = %db.display(), "conversation store");
            with
        }
        Err(e) => {
            tracing::warn!(db = %db.display(), error = %e, "conversation store unavailable");
            state
        }
    }
}

/// Loads the configured model: it loads at start, so a broken one fails at
/// once; other models load on first use.
pub fn load_engine(cfg: &config::Config) -> anyhow::Result<shoal_engine::Engine> {
    let path = cfg.model_path();
    // The draft model was named for this model: another vocabulary is a
    // mistake to report, not to ignore.
    let opts = shoal_engine::EngineOptions {
        draft_model_required: true,
        ..cfg.serve_engine_options()?
    };
    shoal_engine::Engine::start(&path, &cfg.model_id(), opts)
        .with_context(|| format!("loading {}", path.display()))
}

/// An engine a one-shot command owns: when it goes out of scope, on any
/// path, the engine thread finishes and frees the model before the process
/// exits, so MLX's and the BLAS library's static teardown never runs under a
/// thread still using them (that corrupted the heap at exit on a busy host).
pub struct OwnedEngine(Option<shoal_engine::Engine>);

impl OwnedEngine {
    /// How long exit waits for the engine thread.
    const STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

    pub fn new(engine: shoal_engine::Engine) -> Self {
        OwnedEngine(Some(engine))
    }
}

impl std::ops::Deref for OwnedEngine {
    type Target = shoal_engine::Engine;
    fn deref(&self) -> &shoal_engine::Engine {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for OwnedEngine {
    fn drop(&mut self) {
        if let Some(e) = self.0.take() {
            if !e.stop_and_wait(Self::STOP_LIMIT) {
                tracing::warn!("the engine did not stop in time");
            }
        }
    }
}

/// The API server's state for `engine` under `cfg`: model pool, conversation
/// store, prompt logging, cluster and access settings, prices. `shoal serve` and the
/// desktop app both serve exactly this.
pub fn app_state(
    cfg: &config::Config,
    engine: shoal_engine::Engine,
) -> anyhow::Result<shoal_api::AppState> {
    let pool = shoal_api::pool::ModelPool::new(cfg.pool_options()?);
    pool.insert(engine, cfg.model.aliases.clone());
    if let Some(path) = &cfg.embedding.path {
        let id = cfg
            .embedding
            .id
            .clone()
            .unwrap_or_else(|| id_from_path(path));
        pool.add_named(&id, path.clone(), Vec::new());
    }
    let mut state = open_store(shoal_api::AppState::with_pool(pool), cfg);
    state.log_prompts = cfg.server.log_prompts;
    state.cluster_options = cfg.cluster_options();
    state.access = std::sync::Arc::new(cfg.access()?);
    state.prices = std::sync::Arc::new(cfg.prices.clone());
    // The config decides; where it says nothing, the settings switch's last
    // choice (remembered in the store) does.
    let remembered = state.store.as_ref().and_then(|s| {
        shoal_api::dialects::ollama::port::remembered(&s.lock().unwrap_or_else(|p| p.into_inner()))
    });
    let port = match cfg.server.ollama_port {
        Some(setting) => setting.port(),
        None => remembered.flatten(),
    };
    state.ollama = std::sync::Arc::new(shoal_api::dialects::ollama::port::OllamaPort::new(port));
    state.mcp = std::sync::Arc::new(cfg.mcp_hub(config::default_mcp_path()));
    Ok(state)
}

/// The model id clients see by default: the file or directory name without extension.
pub fn id_from_path(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// How log lines are written.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the enclosing spans' fields (a request's
    /// id, dialect, model, finish reason and usage).
    Json,
}

/// Logs to stderr, filtered by `SHOAL_LOG` (default `info`); shared by the
/// CLI and the desktop app so both log alike.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}
