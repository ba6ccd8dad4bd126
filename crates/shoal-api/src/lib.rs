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
mod state;
mod tools;
mod ui;
mod wire;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::error::{ApiError, DialectError, ErrorShape};
use crate::ledger::Ledger;
pub use crate::state::{AppState, Served};

/// Marks requests that came in on the Ollama port: there `/` is Ollama's.
#[derive(Clone, Copy, Debug)]
struct OllamaPort;

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
