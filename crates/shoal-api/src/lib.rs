//! Shoal's HTTP API: OpenAI Chat Completions, Completions and Responses,
//! Anthropic Messages and Ollama's API (`dialects/`), all rendered from the engine's one event stream and
//! final `Completion` record.
pub mod access;
mod body;
pub mod cluster;
mod conversations;
pub mod dialects;
mod error;
#[cfg(test)]
mod fuzz_tests;
mod ids;
pub mod ledger;
mod metrics;
mod models;
mod params;
pub mod pool;
mod run;
#[cfg(test)]
mod script_tests;
mod usage;

mod sse;
mod tools;
mod ui;
mod wire;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use shoal_cluster::{LocalNode, NodeIdentity};
use shoal_engine::{ChatMessage, Engine};

use crate::error::{ApiError, DialectError, ErrorShape};
use crate::ledger::Ledger;

/// Shared server state.
#[derive(Clone)]
pub struct AppState {
    /// The models this server answers with, loaded on demand.
    pub pool: Arc<pool::ModelPool>,
    pub ledger: Arc<Ledger>,
    pub responses: Arc<dialects::openai_responses::ResponseStore>,
    /// This node's identity and live status.
    pub node: Arc<LocalNode>,
    /// Generations in progress (cancelled when the server shuts down).
    pub running: Arc<run::Running>,
    /// Log each request's prompt text (off by default: prompts are private).
    pub log_prompts: bool,
    /// Counters and histograms behind `/metrics`.
    pub metrics: Arc<metrics::Metrics>,
    /// Conversation history for `/v1/conversations`; `None` serves 503s.
    pub store: Option<conversations::SharedStore>,
    /// Join a cluster with these settings once listening (`None`: alone).
    pub cluster_options: Option<shoal_cluster::ClusterOptions>,
    /// The cluster, set when serving starts.
    pub cluster: Arc<std::sync::OnceLock<Arc<shoal_cluster::Cluster>>>,
    /// API keys, browser origins and request limits.
    pub access: Arc<access::Access>,
    /// The keys' recent requests, for their per-minute limits.
    pub limits: Arc<access::Limits>,
    /// This node's `shoal shard` processes, by instance.
    pub shards: cluster::shards::Shards,
    /// Models placed on nodes through `/v1/instances`.
    pub instances: Arc<std::sync::Mutex<std::collections::BTreeMap<String, cluster::Instance>>>,
    /// Per-million-token prices by model (`[prices.MODEL]`): `/v1/usage`
    /// shows what its traffic would have cost there. Empty: no costs.
    pub prices: Arc<ledger::Prices>,
    /// Also listen on this port (Ollama's 11434) on the same host, for
    /// tools that look for Ollama there; `None`: the main port only.
    pub ollama_port: Option<u16>,
    /// How listening on `ollama_port` went: the address, or why it failed
    /// (`/health` says so; the main port serves either way).
    pub ollama_listen: Arc<std::sync::OnceLock<Result<std::net::SocketAddr, String>>>,
}

/// Marks requests that came in on the Ollama port: there `/` is Ollama's.
#[derive(Clone, Copy, Debug)]
struct OllamaPort;

/// One request's view of the server: the shared state and the engine of
/// the model the request named.
#[derive(Clone)]
pub struct Served {
    pub state: AppState,
    pub engine: Engine,
    /// How long the request waited for its model to be in memory (a
    /// load, or another request's load); Ollama reports it.
    pub ready_after: std::time::Duration,
}

impl std::ops::Deref for Served {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.state
    }
}

impl AppState {
    /// A server on one already started engine (kept loaded).
    pub fn new(engine: Engine) -> Self {
        let pool = pool::ModelPool::new(pool::PoolOptions::default());
        pool.insert(engine, Vec::new());
        AppState::with_pool(pool)
    }

    /// A server on a pool of models.
    pub fn with_pool(pool: Arc<pool::ModelPool>) -> Self {
        let backend = if cfg!(target_os = "macos") {
            "metal"
        } else {
            "cpu"
        };
        AppState {
            node: LocalNode::start(NodeIdentity::for_this_machine(), backend),
            pool,
            ledger: Arc::new(Ledger::in_memory(10_000)),
            responses: Arc::new(dialects::openai_responses::ResponseStore::new(256)),
            running: Arc::new(run::Running::default()),
            store: None,
            cluster_options: None,
            cluster: Arc::default(),
            instances: Arc::default(),
            shards: Arc::default(),
            access: Arc::new(access::Access::default()),
            limits: Arc::default(),
            metrics: Arc::new(metrics::Metrics::new()),
            log_prompts: false,
            prices: Arc::default(),
            ollama_port: None,
            ollama_listen: Arc::default(),
        }
    }

    /// Opens (creating or migrating) the conversation store at `path`, and
    /// the usage ledger in the same file, kept for `retention`.
    pub fn with_store(
        mut self,
        path: &std::path::Path,
        retention: ledger::Retention,
    ) -> Result<Self, shoal_store::StoreError> {
        let store = shoal_store::Store::open(path)?;
        self.store = Some(Arc::new(std::sync::Mutex::new(store)));
        self.ledger = Arc::new(Ledger::open(path, retention)?);
        Ok(self)
    }

    /// The requested model's engine (loading it if needed); unknown names are a 404.
    pub async fn serve(&self, model: &str) -> Result<Served, ApiError> {
        let asked = std::time::Instant::now();
        let engine = self.pool.engine(model).await?;
        Ok(Served {
            state: self.clone(),
            engine,
            ready_after: asked.elapsed(),
        })
    }

    /// Requests running and queued over every loaded model.
    pub fn busy(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pool.loaded().iter().fold((0, 0), |(r, q), e| {
            (
                r + e.stats.running.load(Relaxed),
                q + e.stats.queued.load(Relaxed),
            )
        })
    }
}

impl Served {
    /// A chat request's prompt: the server's limits on messages and tools,
    /// then the engine's one prompt decision (`shoal_engine::prompt`).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&tools::ToolRequest>,
    ) -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
        let limits = &self.access;
        if messages.len() > limits.max_messages {
            return Err(ApiError::param(
                "messages",
                format!(
                    "{} messages is more than this server accepts ({}; server.max_messages)",
                    messages.len(),
                    limits.max_messages
                ),
            ));
        }
        if let Some(t) = tools.filter(|t| t.defs.len() > limits.max_tools) {
            return Err(ApiError::param(
                "tools",
                format!(
                    "{} tools is more than this server accepts ({}; server.max_tools)",
                    t.defs.len(),
                    limits.max_tools
                ),
            ));
        }
        let offer = tools.map(|t| shoal_engine::prompt::ToolOffer {
            defs: &t.defs,
            choice: &t.choice,
        });
        Ok(shoal_engine::prompt::chat_prompt(
            &self.engine.model.vocab,
            messages,
            want,
            offer,
        )?)
    }
}

/// Serves `router(state)` on `listener` until `shutdown` completes; then stops
/// accepting and lets open responses finish (streams end with their final
/// event). For embedding the server (the desktop app) as well as `shoal serve`.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        state.node.set_address(addr);
    }
    if let Some(opts) = state.cluster_options.clone() {
        let cluster = shoal_cluster::Cluster::start(state.node.clone(), opts);
        let _ = state.cluster.set(cluster);
    }
    pool::ModelPool::start_sweeper(&state.pool);
    Ledger::start_pruning(&state.ledger);
    let running = state.running.clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(port) = state.ollama_port {
        serve_ollama_port(&listener, port, state.clone(), stop_rx.clone()).await;
    }
    // Stop accepting, then cancel what is running so every open stream ends
    // with its final event promptly and the graceful wait is short.
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
        let n = running.cancel_all();
        tracing::info!(cancelled = n, "shutting down");
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Listens on Ollama's port too, on the main listener's host, until `stop`.
/// A port already taken (a running Ollama) is logged and shown in `/health`;
/// the main port serves regardless.
async fn serve_ollama_port(
    main: &tokio::net::TcpListener,
    port: u16,
    state: AppState,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let host = main
        .local_addr()
        .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip());
    let addr = std::net::SocketAddr::new(host, port);
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => {
            let bound = l.local_addr().unwrap_or(addr);
            let _ = state.ollama_listen.set(Ok(bound));
            tracing::info!(address = %bound, "serving Ollama's API on its own port too");
            let app = router(state).layer(axum::Extension(OllamaPort));
            tokio::spawn(async move {
                let done = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(l, app).with_graceful_shutdown(done).await {
                    tracing::warn!(error = %e, "the Ollama port stopped serving");
                }
            });
        }
        Err(e) => {
            let why = format!("could not listen on {addr} for Ollama's API: {e}");
            tracing::warn!("{why}; serving on the main port only");
            let _ = state.ollama_listen.set(Err(why));
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(root).head(root))
        .route("/health", get(health))
        .route("/v1/usage", get(usage::handle))
        .route("/v1/usage/keys", get(usage::keys))
        .route("/v1/usage/{id}", get(usage::entry))
        .route(cluster::PEER_USAGE_PATH, post(usage::peer_usage))
        .route("/metrics", get(metrics::handle))
        .route("/v1/dialects", get(dialects::list))
        .merge(dialects::routes())
        .merge(conversations::routes())
        .merge(models::routes())
        .merge(cluster::routes())
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            cluster::forward,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            access::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            usage::track,
        ))
        .layer(access::cors(&state.access))
        // Bodies are read up to the limit before the 413, so a client still
        // sending gets the answer rather than a broken pipe.
        .layer(DefaultBodyLimit::max(state.access.max_body_bytes))
        .with_state(state)
}

/// Liveness plus the engine's counters (batching, cache, outcomes).
async fn health(State(s): State<AppState>) -> impl IntoResponse {
    use std::sync::atomic::Ordering::Relaxed;
    let engines = s.pool.loaded();
    // Counters summed over the loaded models.
    let sum = |f: fn(&shoal_engine::EngineStats) -> &std::sync::atomic::AtomicU64| -> u64 {
        engines.iter().map(|e| f(&e.stats).load(Relaxed)).sum()
    };
    let peak = engines
        .iter()
        .map(|e| e.stats.peak_batch.load(Relaxed))
        .max()
        .unwrap_or(0);
    let ollama = s.ollama_port.map(|port| match s.ollama_listen.get() {
        Some(Ok(addr)) => json!({"port": port, "listening": true, "address": addr.to_string()}),
        Some(Err(why)) => json!({"port": port, "listening": false, "error": why}),
        None => json!({"port": port, "listening": false}),
    });
    Json(json!({
        "status": "ok",
        "ollama": ollama,
        "model": engines.first().map(|e| e.model.id.clone()),
        "loaded": engines.iter().map(|e| e.model.id.clone()).collect::<Vec<_>>(),
        "engine": {
            "queued": sum(|s| &s.queued),
            "running": sum(|s| &s.running),
            "completed": sum(|s| &s.completed),
            "cancelled": sum(|s| &s.cancelled),
            "errors": sum(|s| &s.errors),
            "prompt_tokens": sum(|s| &s.prompt_tokens),
            "cached_tokens": sum(|s| &s.cached_tokens),
            "completion_tokens": sum(|s| &s.completion_tokens),
            "prefix_cache_bytes": sum(|s| &s.prefix_cache_bytes),
            "kv_cache_bytes": engines.iter().map(|e| e.model.info.kv_capacity_bytes as u64).sum::<u64>(),
            "peak_batch": peak,
            "decode_passes": sum(|s| &s.decode_passes),
            "decode_steps": sum(|s| &s.decode_steps),
        },
    }))
}

/// `/`: the web UI for a browser on the main port; Ollama's liveness text
/// for anything else (its clients probe `/`) and on the Ollama port.
async fn root(
    ollama_port: Option<axum::Extension<OllamaPort>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let browser = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if browser && ollama_port.is_none() {
        return ui::serve("/");
    }
    dialects::ollama::ROOT_TEXT.into_response()
}

/// API paths that match no route get the dialect's 404; everything else is
/// the web UI.
async fn fallback(method: axum::http::Method, uri: axum::http::Uri) -> axum::response::Response {
    let path = uri.path();
    if path.starts_with("/v1/")
        || path == "/v1"
        || dialects::Dialect::for_path(path).is_some()
        || method != axum::http::Method::GET
    {
        return not_found(uri).await.into_response();
    }
    ui::serve(path)
}

async fn not_found(uri: axum::http::Uri) -> DialectError {
    ApiError::not_found(format!("no route for {}", uri.path()))
        .in_dialect(ErrorShape::for_path(uri.path()))
}
