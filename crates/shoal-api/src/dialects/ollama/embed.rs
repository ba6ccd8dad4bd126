//! Ollama's embedding routes: `POST /api/embed` (`input`, `truncate`,
//! `dimensions`, `keep_alive`; `embeddings` with `prompt_eval_count` and the
//! durations) and the older `POST /api/embeddings` (`prompt` → `embedding`).
//! As Ollama does, `truncate` defaults to true, and a body with no input at
//! all only loads the model (or, with `keep_alive: 0`, unloads it). Vectors
//! come from the shared path ([`crate::embeddings`]) and are unit length on
//! both routes.
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::shared::{apply_keep_alive, load_request, model_id, ollama_error, KeepAlive, DIALECT};
use crate::embeddings::{embed, EmbedRequest, Input};
use crate::error::{ApiError, DialectError};
use crate::state::AppState;

#[derive(Deserialize)]
struct EmbedBody {
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    keep_alive: Option<Value>,
    /// Model options: none changes an embedding, so they are accepted and unused.
    #[serde(default)]
    #[allow(dead_code)]
    options: Option<Value>,
}

#[derive(Deserialize)]
struct LegacyBody {
    model: String,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    #[allow(dead_code)]
    options: Option<Value>,
}

type Tracked = Option<axum::Extension<crate::ledger::Tracked>>;

fn nanos(ms: f64) -> u64 {
    (ms * 1e6).max(0.0) as u64
}

/// `POST /api/embed`.
pub async fn embed_route(
    State(state): State<AppState>,
    tracked: Tracked,
    body: crate::body::Body,
) -> Result<Response, DialectError> {
    let req: EmbedBody = crate::body::parse(&body).map_err(|e| e.in_dialect(DIALECT))?;
    let keep = KeepAlive::parse(req.keep_alive.as_ref().unwrap_or(&Value::Null))
        .map_err(|e| e.in_dialect(DIALECT))?;
    let name = req.model.clone();
    let Some(input) = req.input else {
        return load_request(
            &state,
            &name,
            keep,
            |_| json!({"model": name, "embeddings": []}),
        )
        .await;
    };
    let inputs = match &input {
        Value::String(s) => vec![Input::Text(s.clone())],
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|s| Input::Text(s.as_str().unwrap_or_default().to_string()))
            .collect(),
        _ => {
            return Err(
                ApiError::param("input", "'input' must be a string or an array of strings")
                    .in_dialect(DIALECT),
            )
        }
    };
    let parsed = EmbedRequest {
        model: model_id(&name).to_string(),
        inputs,
        truncate: req.truncate.unwrap_or(true),
        dimensions: req.dimensions,
        field: "input",
    };
    let a = run(&state, tracked, parsed, &name, keep).await?;
    Ok(axum::Json(json!({
        "model": name,
        "embeddings": a.embedded.vectors,
        "total_duration": nanos(a.total_ms),
        "load_duration": nanos(a.load_ms),
        "prompt_eval_count": a.usage().prompt_tokens,
    }))
    .into_response())
}

/// `POST /api/embeddings`, the older route: one `prompt`, one `embedding`.
pub async fn legacy_route(
    State(state): State<AppState>,
    tracked: Tracked,
    body: crate::body::Body,
) -> Result<Response, DialectError> {
    let req: LegacyBody = crate::body::parse(&body).map_err(|e| e.in_dialect(DIALECT))?;
    let keep = KeepAlive::parse(req.keep_alive.as_ref().unwrap_or(&Value::Null))
        .map_err(|e| e.in_dialect(DIALECT))?;
    let name = req.model.clone();
    let prompt = match req.prompt {
        Some(p) if !p.is_empty() => p,
        _ => {
            return load_request(&state, &name, keep, |_| json!({"embedding": []})).await;
        }
    };
    let parsed = EmbedRequest {
        model: model_id(&name).to_string(),
        inputs: vec![Input::Text(prompt)],
        truncate: true,
        dimensions: None,
        field: "prompt",
    };
    let a = run(&state, tracked, parsed, &name, keep).await?;
    let vector = a.embedded.vectors.into_iter().next().unwrap_or_default();
    Ok(axum::Json(json!({ "embedding": vector })).into_response())
}

async fn run(
    state: &AppState,
    tracked: Tracked,
    req: EmbedRequest,
    name: &str,
    keep: Option<KeepAlive>,
) -> Result<crate::embeddings::Answer, DialectError> {
    let id = req.model.clone();
    let a = embed(state, tracked.map(|t| t.0), DIALECT, req)
        .await
        .map_err(|e| ollama_error(e, name).in_dialect(DIALECT))?;
    apply_keep_alive(state, &id, keep);
    Ok(a)
}
