//! `/v1/models` and its actions (`load`, `unload`, `pull`, delete): the HTTP
//! face of [`crate::pool::ModelPool`], which knows nothing of HTTP.
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use shoal_models::{ModelsError, PullEvent, PullSpec};

use crate::body::OpenAiJson;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::pool::held_bytes;
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list))
        .route("/v1/models/pull", post(pull))
        .route("/v1/hub/search", get(hub_search))
        .route("/v1/hub/files", get(hub_files))
        .route("/v1/models/{*id}", get(one).post(action).delete(remove))
}

type Reply = Result<Response, DialectError>;

#[derive(serde::Deserialize)]
struct SearchQuery {
    q: String,
    #[serde(default = "twenty")]
    limit: usize,
}

fn twenty() -> usize {
    20
}

/// `GET /v1/hub/search?q=NAME`: the hub's models whose names contain NAME,
/// most downloaded first, each marked when it ships GGUF files.
async fn hub_search(
    State(s): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<SearchQuery>,
) -> Reply {
    let text = q.q.trim();
    if text.is_empty() {
        return Err(openai(ApiError::param("q", "say what to search for")));
    }
    let found = shoal_models::find::search(s.pool.hub(), text, q.limit.clamp(1, 100))
        .await
        .map_err(|e| openai(e.into()))?;
    let data: Vec<Value> = found
        .iter()
        .map(|r| {
            json!({"id": r.id, "downloads": r.downloads, "likes": r.likes,
                   "gguf": r.tags.iter().any(|t| t == "gguf")})
        })
        .collect();
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}

#[derive(serde::Deserialize)]
struct FilesQuery {
    /// `org/name` or `org/name@revision`.
    repo: String,
}

/// `GET /v1/hub/files?repo=ORG/NAME`: the repository's models (each GGUF
/// file, and its safetensors directory) with their quantization and size,
/// and for a GGUF file the memory the pool would count it at once loaded and
/// whether that fits the budget, before anything is downloaded: the same
/// estimate as for the file on disk, from one GGUF's header read from its
/// first bytes (the quantizations of one model share their architecture,
/// so they reserve the same KV cells, logits rows and vocabulary tables, and
/// expand to the same parameters on MLX). A directory is estimated after
/// download. `unavailable` says why this server could not run a file.
async fn hub_files(
    State(s): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<FilesQuery>,
) -> Reply {
    let spec = PullSpec::parse(q.repo.trim(), None)
        .map_err(|e| openai(ApiError::param("repo", e.to_string())))?;
    let hub = s.pool.hub();
    let mut listed = shoal_models::find::files(hub, &spec)
        .await
        .map_err(|e| openai(e.into()))?;
    // Vision projectors ride along in GGUF repos; they are not models.
    listed
        .files
        .retain(|f| !f.name.to_ascii_lowercase().starts_with("mmproj"));
    let sample = listed
        .files
        .iter()
        .filter(|f| f.kind == shoal_models::find::FileKind::Gguf)
        .min_by_key(|f| f.size_bytes);
    let header = match sample {
        Some(f) => Some(
            shoal_models::find::gguf_header(hub, &spec, &f.name, f.size_bytes)
                .await
                .map_err(|e| openai(e.into()))?,
        ),
        None => None,
    };
    let budget = s.pool.budget();
    let files: Vec<Value> = listed
        .files
        .iter()
        .map(|f| {
            let gguf = f.kind == shoal_models::find::FileKind::Gguf;
            let estimate = header.as_ref().filter(|_| gguf).map(|h| {
                let mut h = h.clone();
                h.file_len = f.size_bytes;
                s.pool.estimate_header(h, std::path::Path::new(&f.name))
            });
            let (estimate, unavailable) = match estimate {
                Some(Ok(e)) => (Some(e), None),
                Some(Err(why)) => (None, Some(why)),
                None => (None, None),
            };
            json!({
                "name": f.name,
                "kind": f.kind,
                "size_bytes": f.size_bytes,
                "quantization": f.quantization,
                "estimated_memory_bytes": estimate,
                "fits": estimate.map(|e| e <= budget),
                "unavailable": unavailable,
                "pull": {"model": format!("{}@{}", listed.repo, listed.revision),
                         "file": gguf.then_some(&f.name)},
            })
        })
        .collect();
    Ok(Json(json!({
        "repo": listed.repo,
        "revision": listed.revision,
        "commit": listed.commit,
        "memory_budget_bytes": budget,
        "architecture": header.as_ref().and_then(|h| h.architecture()),
        "context_length": header.as_ref().and_then(|h| h.arch_uint("context_length")),
        "files": files,
    }))
    .into_response())
}

fn openai(e: ApiError) -> DialectError {
    e.in_dialect(ErrorShape::OPENAI)
}

async fn list(State(s): State<AppState>) -> Reply {
    let pool = s.pool.clone();
    let (data, budget) = tokio::task::spawn_blocking(move || (pool.entries(), pool.budget()))
        .await
        .map_err(|e| openai(ApiError::internal(e.to_string())))?;
    let loaded: u64 = s.pool.loaded().iter().map(held_bytes).sum();
    let disk: u64 = data
        .iter()
        .filter(|m| m["shoal"]["source"]["kind"] == "hub")
        .filter_map(|m| m["shoal"]["size_bytes"].as_u64())
        .sum();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "shoal": {
            "memory_budget_bytes": budget,
            "memory_loaded_bytes": loaded,
            "library_bytes": disk,
            "library_path": s.pool.library().hub_dir,
        }
    }))
    .into_response())
}

async fn one(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    let pool = s.pool.clone();
    let found = tokio::task::spawn_blocking(move || pool.entry_for(&id).ok_or(id))
        .await
        .map_err(|e| openai(ApiError::internal(e.to_string())))?;
    match found {
        Ok(v) => Ok(Json(v).into_response()),
        Err(id) => Err(openai(ApiError::model_not_found(&id))),
    }
}

/// `POST /v1/models/{id}/load` and `/unload`.
async fn action(State(s): State<AppState>, Path(path): Path<String>) -> Reply {
    if let Some(id) = path.strip_suffix("/load") {
        s.pool.engine(id).await.map_err(openai)?;
        return one(State(s), Path(id.to_string())).await;
    }
    if let Some(id) = path.strip_suffix("/unload") {
        let pool = s.pool.clone();
        let known = {
            let id = id.to_string();
            tokio::task::spawn_blocking(move || pool.entry_for(&id).is_some())
                .await
                .unwrap_or(false)
        };
        if !known {
            return Err(openai(ApiError::model_not_found(id)));
        }
        s.pool.unload(id);
        return one(State(s), Path(id.to_string())).await;
    }
    Err(openai(ApiError::not_found(format!(
        "no route for POST /v1/models/{path} (use /load or /unload)"
    ))))
}

/// Deletes a pulled model's files (unloading it first).
async fn remove(State(s): State<AppState>, Path(id): Path<String>) -> Reply {
    if s.pool.is_named(&id) {
        return Err(openai(ApiError::invalid(format!(
            "'{id}' is the configured model file, not a pulled one; remove it from the config instead"
        ))));
    }
    let pool = s.pool.clone();
    let target = id.clone();
    let result = tokio::task::spawn_blocking(move || {
        let model = pool
            .library()
            .find(&target)
            .ok_or_else(|| ModelsError::NotFound(target.clone()))?;
        pool.unload(&model.id);
        pool.library()
            .remove(&model.id)
            .map(|freed| (model.id, freed))
    })
    .await
    .map_err(|e| openai(ApiError::internal(e.to_string())))?;
    let (removed, freed) = result.map_err(|e| openai(e.into()))?;
    Ok(
        Json(json!({"id": removed, "object": "model", "deleted": true,
                   "shoal": {"freed_bytes": freed}}))
        .into_response(),
    )
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PullRequest {
    /// `org/name` or `org/name@revision`.
    model: String,
    /// The GGUF file to take from a repo with several.
    #[serde(default)]
    file: Option<String>,
    #[serde(default = "yes")]
    stream: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/models/pull`: downloads a model. Streams `plan`, `progress`,
/// `file_done` and `done` (or `error`) events; with `"stream": false`
/// answers once with the model. The download carries on if the client
/// leaves, so a closed tab does not waste what was fetched.
async fn pull(State(s): State<AppState>, OpenAiJson(req): OpenAiJson<PullRequest>) -> Reply {
    let spec = PullSpec::parse(&req.model, req.file.clone())
        .map_err(|e| openai(ApiError::param("model", e.to_string())))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PullEvent>();
    let hub = s.pool.hub().clone();
    let task = tokio::spawn(async move { shoal_models::pull(&spec, &hub, tx).await });
    if !req.stream {
        let result = task
            .await
            .map_err(|e| openai(ApiError::internal(e.to_string())))?;
        let model = result.map_err(|e| openai(e.into()))?;
        let pool = s.pool.clone();
        let entry = tokio::task::spawn_blocking(move || pool.entry_for(&model.id))
            .await
            .ok()
            .flatten();
        return Ok((StatusCode::OK, Json(entry.unwrap_or(Value::Null))).into_response());
    }
    let (frames, out) = tokio::sync::mpsc::unbounded_channel::<String>();
    let pool = s.pool.clone();
    tokio::spawn(async move {
        let mut client = true;
        while let Some(ev) = rx.recv().await {
            let kind = match &ev {
                PullEvent::Plan { .. } => "plan",
                PullEvent::Progress { .. } => "progress",
                PullEvent::FileDone { .. } => "file_done",
                // Sent below, in the same shape as /v1/models entries.
                PullEvent::Done { .. } => continue,
            };
            let data = serde_json::to_string(&ev).unwrap_or_default();
            client = client && frames.send(crate::sse::frame(Some(kind), &data)).is_ok();
        }
        let last = match task.await {
            Ok(Ok(model)) => {
                let entry = tokio::task::spawn_blocking(move || pool.entry_for(&model.id))
                    .await
                    .ok()
                    .flatten();
                crate::sse::frame(
                    Some("done"),
                    &json!({"type": "done", "model": entry}).to_string(),
                )
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pull failed");
                let err = ApiError::from(e);
                let mut body = err.body(ErrorShape::OPENAI);
                body["type"] = json!("error");
                crate::sse::frame(Some("error"), &body.to_string())
            }
            Err(e) => {
                let mut body = ApiError::internal(e.to_string()).body(ErrorShape::OPENAI);
                body["type"] = json!("error");
                crate::sse::frame(Some("error"), &body.to_string())
            }
        };
        if client {
            let _ = frames.send(last);
        }
    });
    Ok(crate::sse::response(out))
}
