//! The top of the server: the router with its layers, the routes that belong
//! to no dialect (`/`, `/health`, `/metrics`, the fallback), and serving until
//! shutdown. Everything else sits below it: the dialects, the state they share
//! and the engine.
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::error::ApiError;
use crate::ledger::Ledger;
use crate::state::{AppState, Running};
use crate::{access, cache, cluster, conversations, dialect, dialects, models, pool, ui, usage};
use shoal_cluster::{LocalNode, NodeIdentity};
use std::sync::Arc;

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
    // Ollama's port, when switched on, listens before the main port accepts.
    let host = listener
        .local_addr()
        .map_or(std::net::Ipv4Addr::LOCALHOST.into(), |a| a.ip());
    state.ollama.open(router(state.clone()), host).await;
    let ollama = state.ollama.clone();
    // Stop accepting, then cancel what is running so every open stream ends
    // with its final event promptly and the graceful wait is short.
    let shutdown = async move {
        shutdown.await;
        let closing = ollama.begin_close();
        let n = running.cancel_all();
        tracing::info!(cancelled = n, "shutting down");
        dialects::ollama::port::OllamaPort::closed(closing).await;
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(root).head(root))
        .route("/health", get(health))
        .route("/v1/cache", get(cache::list).delete(cache::clear))
        .route("/v1/usage", get(usage::handle))
        .route("/v1/usage/keys", get(usage::keys))
        .route("/v1/usage/{id}", get(usage::entry))
        .route(cluster::PEER_USAGE_PATH, post(usage::peer_usage))
        .route("/metrics", get(metrics))
        .route("/v1/dialects", get(dialects::list))
        .merge(dialects::routes())
        .merge(conversations::routes())
        .merge(crate::mcp::routes())
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
        // Outside every layer that asks which dialect a request speaks.
        .layer(axum::middleware::from_fn(attach_dialect))
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
    let ollama = s.ollama.status();
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
            "kv_cache_bytes": engines.iter().map(|e| (e.model.info.kv_capacity_bytes
                + e.model.draft.as_ref().map_or(0, |d| d.info.kv_capacity_bytes)) as u64).sum::<u64>(),
            "peak_batch": peak,
            "decode_passes": sum(|s| &s.decode_passes),
            "decode_steps": sum(|s| &s.decode_steps),
            "draft_tokens": sum(|s| &s.draft_tokens),
            "draft_accepted": sum(|s| &s.draft_accepted),
        },
        "prefix_cache": cache::summary(&s),
    }))
}

/// `/`: the web UI for a browser on the main port; Ollama's liveness text
/// for anything else (its clients probe `/`) and on the Ollama port.
async fn root(
    ollama_port: Option<axum::Extension<dialects::ollama::port::OnOllamaPort>>,
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

/// Works out a request's dialect once, from its path, for every layer and
/// handler after it ([`dialect::Routed`], a request extension).
async fn attach_dialect(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let routed = dialects::registry().route(req.uri().path());
    req.extensions_mut().insert(routed);
    next.run(req).await
}

/// API paths that match no route get the dialect's 404; everything else is
/// the web UI.
async fn fallback(
    method: axum::http::Method,
    uri: axum::http::Uri,
    routed: Option<axum::Extension<dialect::Routed>>,
) -> axum::response::Response {
    let routed = routed.map(|r| r.0).unwrap_or_default();
    let path = uri.path();
    if path.starts_with("/v1/")
        || path == "/v1"
        || routed.dialect.is_some()
        || method != axum::http::Method::GET
    {
        return ApiError::not_found(format!("no route for {path}"))
            .in_dialect(routed.error_shape())
            .into_response();
    }
    ui::serve(path)
}

/// `/metrics`: the counters and the gauges of the loaded models, as OpenMetrics text.
async fn metrics(State(s): State<AppState>) -> axum::response::Response {
    match s.metrics.render(&s.pool) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("metrics: {e}"))
            .in_dialect(crate::error::ErrorShape::OPENAI)
            .into_response(),
    }
}

/// Building a server's state: here at the top, because it gathers what every
/// dialect keeps and the words the ledger reads from the dialects' registry.
impl AppState {
    /// A server on one already started engine (kept loaded).
    pub fn new(engine: shoal_engine::Engine) -> Self {
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
            ledger: Arc::new(Ledger::in_memory(10_000, crate::dialects::registry())),
            dialects: Arc::new(dialects::kept_state()),
            running: Arc::new(Running::default()),
            store: None,
            cluster_options: None,
            cluster: Arc::default(),
            instances: Arc::default(),
            shards: Arc::default(),
            access: Arc::new(access::Access::default()),
            limits: Arc::default(),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            log_prompts: false,
            prices: Arc::default(),
            ollama: Arc::default(),
            mcp: Arc::new(shoal_mcp::McpHub::empty()),
        }
    }

    /// Opens (creating or migrating) the conversation store at `path`, and
    /// the usage ledger in the same file, kept for `retention`.
    pub fn with_store(
        mut self,
        path: &std::path::Path,
        retention: crate::ledger::Retention,
    ) -> Result<Self, shoal_store::StoreError> {
        let store = shoal_store::Store::open(path)?;
        self.store = Some(Arc::new(std::sync::Mutex::new(store)));
        self.ledger = Arc::new(Ledger::open(path, retention, crate::dialects::registry())?);
        Ok(self)
    }
}
