//! Shoal's HTTP API: OpenAI Chat Completions, Completions and Responses, and
//! Anthropic Messages, all rendered from the engine's one event stream and
//! final `Completion` record.
pub mod anthropic;
pub mod body;
pub mod conversations;
pub mod error;
pub mod ledger;
pub mod metrics;
pub mod openai_chat;
pub mod openai_completions;
pub mod openai_responses;
pub mod run;
#[cfg(test)]
mod script_tests;
pub mod sse;
pub mod tools;
pub mod ui;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Query, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use shoal_cluster::{LocalNode, ModelLoad, NodeIdentity, Requests};
use shoal_engine::reasoning::ReasoningSpec;
use shoal_engine::{ChatMessage, Engine};

use crate::error::{ApiError, Dialect, DialectError};
use crate::ledger::Ledger;

/// Shared server state.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub ledger: Arc<Ledger>,
    pub responses: Arc<openai_responses::ResponseStore>,
    /// Extra names that resolve to the loaded model.
    pub aliases: Arc<Vec<String>>,
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
}

impl AppState {
    pub fn new(engine: Engine) -> Self {
        let backend = if engine.model.info.device == "gpu" {
            "metal"
        } else {
            "cpu"
        };
        AppState {
            node: LocalNode::start(NodeIdentity::for_this_machine(), backend),
            engine,
            ledger: Arc::new(Ledger::new(1000)),
            responses: Arc::new(openai_responses::ResponseStore::new(256)),
            aliases: Arc::new(Vec::new()),
            running: Arc::new(run::Running::default()),
            store: None,
            metrics: Arc::new(metrics::Metrics::new()),
            log_prompts: false,
        }
    }

    /// Opens (creating or migrating) the conversation store at `path`.
    pub fn with_store(mut self, path: &std::path::Path) -> Result<Self, shoal_client::ClientError> {
        let store = shoal_client::Store::open(path)?;
        self.store = Some(Arc::new(std::sync::Mutex::new(store)));
        Ok(self)
    }

    /// Checks the requested model name; unknown names are a 404.
    pub fn check_model(&self, requested: &str) -> Result<(), ApiError> {
        if requested == self.engine.model.id || self.aliases.iter().any(|a| a == requested) {
            Ok(())
        } else {
            Err(ApiError::model_not_found(requested))
        }
    }

    /// Renders a conversation with the model's template and tokenizes it.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, ApiError> {
        Ok(self.chat_prompt_reasoning(messages, None)?.0)
    }

    /// Like `chat_prompt`, also deciding how the reply reasons. `want` is
    /// `None` when the request did not ask for reasoning, else its token
    /// budget (`None` inside = unlimited). Templates with a thinking switch get
    /// `enable_thinking`; for others the server opens the section itself after
    /// the generation prompt, so any model can be asked to think.
    pub fn chat_prompt_reasoning(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
    ) -> Result<(Vec<u32>, Option<ReasoningSpec>), ApiError> {
        let p = self.chat_prompt_full(messages, want, None)?;
        Ok((p.tokens, p.reasoning))
    }

    /// The whole prompt decision: template, reasoning and offered tools.
    pub fn chat_prompt_full(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&tools::ToolRequest>,
    ) -> Result<Prompt, ApiError> {
        let vocab = &self.engine.model.vocab;
        let mut messages = messages.to_vec();
        let native = vocab
            .template
            .as_ref()
            .is_some_and(|t| t.source().contains("<think>"));
        let mut extra = serde_json::Map::new();
        if native {
            extra.insert("enable_thinking".into(), json!(want.is_some()));
        }
        let (tool_syntax, grammar) = self.offer_tools(&mut messages, &mut extra, tools);
        let mut text = vocab.render_chat(&messages, true, &extra)?;
        let spec = match (want, native) {
            (Some(budget), true) => Some(ReasoningSpec::think(false, budget)),
            (Some(budget), false) => {
                text.push_str("<think>\n");
                Some(ReasoningSpec::think(true, budget))
            }
            // A thinking model may still open the section on its own.
            (None, true) => Some(ReasoningSpec::think(false, None)),
            (None, false) => None,
        };
        Ok(Prompt {
            tokens: vocab.encode(&text)?,
            reasoning: spec,
            tools: tool_syntax,
            grammar,
        })
    }
}

/// A rendered chat prompt and what the engine must know about its reply.
pub struct Prompt {
    pub tokens: Vec<u32>,
    pub reasoning: Option<ReasoningSpec>,
    /// Parse tool calls in this syntax.
    pub tools: Option<shoal_engine::tools::ToolSyntax>,
    /// A tool call is required: the grammar that forces it.
    pub grammar: Option<shoal_engine::Grammar>,
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
    let running = state.running.clone();
    // Stop accepting, then cancel what is running so every open stream ends
    // with its final event promptly and the graceful wait is short.
    let shutdown = async move {
        shutdown.await;
        let n = running.cancel_all();
        tracing::info!(cancelled = n, "shutting down");
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 8 << 20;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/usage", get(usage))
        .route("/metrics", get(metrics::handle))
        .route("/v1/chat/completions", post(openai_chat::handle))
        .route("/v1/completions", post(openai_completions::handle))
        .route("/v1/responses", post(openai_responses::handle))
        .route("/v1/responses/{id}", get(openai_responses::get_response))
        .route("/v1/messages", post(anthropic::handle))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/cluster/nodes", get(cluster_nodes))
        .merge(conversations::routes())
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Liveness plus the engine's counters (batching, cache, outcomes).
async fn health(State(s): State<AppState>) -> impl IntoResponse {
    use std::sync::atomic::Ordering::Relaxed;
    let st = &s.engine.stats;
    Json(json!({
        "status": "ok",
        "model": s.engine.model.id,
        "engine": {
            "completed": st.completed.load(Relaxed),
            "cancelled": st.cancelled.load(Relaxed),
            "errors": st.errors.load(Relaxed),
            "prompt_tokens": st.prompt_tokens.load(Relaxed),
            "cached_tokens": st.cached_tokens.load(Relaxed),
            "completion_tokens": st.completion_tokens.load(Relaxed),
            "prefix_cache_bytes": st.prefix_cache_bytes.load(Relaxed),
            "peak_batch": st.peak_batch.load(Relaxed),
            "decode_passes": st.decode_passes.load(Relaxed),
            "decode_steps": st.decode_steps.load(Relaxed),
        },
    }))
}

async fn model(
    State(s): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<serde_json::Value>, DialectError> {
    s.check_model(&id)
        .map_err(|e| e.in_dialect(Dialect::OpenAi))?;
    let list = model_list(&s);
    let found = list.into_iter().find(|m| m["id"] == id.as_str());
    found
        .map(Json)
        .ok_or_else(|| ApiError::model_not_found(&id).in_dialect(Dialect::OpenAi))
}

async fn models(State(s): State<AppState>) -> impl IntoResponse {
    Json(json!({"object": "list", "data": model_list(&s)}))
}

fn model_list(s: &AppState) -> Vec<serde_json::Value> {
    let m = &s.engine.model;
    let created = std::fs::metadata(&m.path)
        .and_then(|md| md.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let mut data = vec![json!({
        "id": m.id, "object": "model", "created": created, "owned_by": "shoal",
        "shoal": {
            "architecture": m.info.architecture, "context_length": m.info.context_length,
            "format": m.info.format, "quantization": m.info.quantization, "dtype": m.info.dtype,
            "device": m.info.device, "weight_bytes": m.info.weight_bytes,
        }
    })];
    for a in s.aliases.iter() {
        data.push(json!({"id": a, "object": "model", "created": created, "owned_by": "shoal"}));
    }
    data
}

#[derive(serde::Deserialize)]
struct UsageQuery {
    limit: Option<usize>,
}

async fn usage(State(s): State<AppState>, Query(q): Query<UsageQuery>) -> impl IntoResponse {
    let entries = s.ledger.recent(q.limit.unwrap_or(100));
    Json(json!({"object": "list", "data": entries}))
}

/// Every node of the cluster (for now: this one) with live figures.
async fn cluster_nodes(State(s): State<AppState>) -> impl IntoResponse {
    use std::sync::atomic::Ordering::Relaxed;
    let st = &s.engine.stats;
    let m = &s.engine.model;
    let status = s.node.status(
        vec![ModelLoad {
            id: m.id.clone(),
            memory_bytes: m.info.weight_bytes as u64,
        }],
        Requests {
            in_flight: st.running.load(Relaxed),
            queued: st.queued.load(Relaxed),
        },
    );
    Json(json!({"nodes": [status]}))
}

/// API paths that match no route get the dialect's 404; everything else is
/// the web UI.
async fn fallback(method: axum::http::Method, uri: axum::http::Uri) -> axum::response::Response {
    let path = uri.path();
    if path.starts_with("/v1/") || path == "/v1" || method != axum::http::Method::GET {
        return not_found(uri).await.into_response();
    }
    ui::serve(path)
}

async fn not_found(uri: axum::http::Uri) -> DialectError {
    let dialect = if uri.path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    ApiError::not_found(format!("no route for {}", uri.path())).in_dialect(dialect)
}
