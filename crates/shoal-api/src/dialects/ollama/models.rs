//! Ollama's model routes over the pool and the library: `/api/version`,
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/pull` and `/api/delete`.
use std::path::Path;
use std::time::{Instant, SystemTime};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use shoal_models::{LocalModel, ModelCard, PullEvent, PullSpec};

use super::shared::{
    model_id, not_found, ollama_error, tag_name, timestamp, DIALECT, OLLAMA_VERSION,
};
use crate::body::Body;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

type Reply = Result<Response, DialectError>;

fn err(e: ApiError) -> DialectError {
    e.in_dialect(DIALECT)
}

/// Runs blocking file reads off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DialectError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| err(ApiError::internal(e.to_string())))
}

/// A request that names a model: `model`, or the older `name`.
#[derive(Debug, Deserialize)]
pub struct Named {
    pub model: Option<String>,
    pub name: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Accepted for compatibility: a hub is always reached over TLS.
    #[allow(dead_code)]
    pub insecure: Option<bool>,
    /// `/api/show`'s tokenizer arrays (not kept: headers are read without them).
    #[allow(dead_code)]
    pub verbose: Option<bool>,
}

impl Named {
    fn name(&self) -> Result<&str, ApiError> {
        self.model
            .as_deref()
            .or(self.name.as_deref())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::param("model", "'model' is required"))
    }
}

fn parse_named(body: &Body) -> Result<Named, DialectError> {
    crate::body::parse(body).map_err(err)
}

/// `GET /api/version`.
pub async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

/// When a model's files last changed.
fn modified(path: &Path) -> chrono::DateTime<chrono::Utc> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
        .into()
}

/// A digest naming a model's files as they are now: its id, size and
/// modification time (not its bytes, which would mean reading gigabytes
/// for a listing).
fn digest(m: &LocalModel) -> String {
    let mut h = Sha256::new();
    h.update(m.id.as_bytes());
    h.update(m.card.size_bytes.to_le_bytes());
    h.update(
        modified(&m.path)
            .timestamp_nanos_opt()
            .unwrap_or(0)
            .to_le_bytes(),
    );
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A parameter count as Ollama writes it (`134.52M`, `8.0B`).
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.2}K", n / 1e3)
    } else {
        format!("{n}")
    }
}

fn details(card: &ModelCard) -> Value {
    let family = card.architecture.clone().unwrap_or_default();
    json!({
        "parent_model": "",
        "format": card.format,
        "family": family,
        "families": if family.is_empty() { Value::Null } else { json!([family]) },
        "parameter_size": parameter_size(card.parameters),
        "quantization_level": card.quantization.clone().unwrap_or_default(),
    })
}

/// `GET /api/tags`: every local model, named `id:latest`.
pub async fn tags(State(s): State<AppState>) -> Reply {
    let pool = s.pool.clone();
    let models = blocking(move || {
        pool.local_models()
            .into_iter()
            .map(|(m, _)| {
                let name = tag_name(&m.id);
                json!({
                    "name": name, "model": name,
                    "modified_at": timestamp(modified(&m.path)),
                    "size": m.card.size_bytes,
                    "digest": digest(&m),
                    "details": details(&m.card),
                })
            })
            .collect::<Vec<_>>()
    })
    .await?;
    Ok(Json(json!({ "models": models })).into_response())
}

/// The local model a name stands for (its id, `id:latest`, or an alias).
fn find(pool: &crate::pool::ModelPool, name: &str) -> Result<LocalModel, ApiError> {
    let (id, _) = pool
        .path_of(model_id(name))
        .map_err(|e| ollama_error(e, name))?;
    pool.local_models()
        .into_iter()
        .map(|(m, _)| m)
        .find(|m| m.id == id)
        .ok_or_else(|| not_found(name))
}

/// `model_info`: a GGUF header's metadata (arrays left out, as Ollama
/// leaves them out unless verbose), or a model directory's `config.json`
/// under the GGUF key names. Its `{arch}.context_length` is the `window`
/// served when that is smaller than the trained one, which
/// `shoal.trained_context_length` keeps: clients size prompts by it.
fn model_info(path: &Path, card: &ModelCard, window: Option<u64>) -> Map<String, Value> {
    let mut out = Map::new();
    if path.is_dir() {
        let cfg: Value = std::fs::read_to_string(path.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        let arch = cfg["model_type"].as_str().unwrap_or("unknown").to_string();
        out.insert("general.architecture".into(), json!(arch));
        for (key, field) in [
            ("context_length", "max_position_embeddings"),
            ("embedding_length", "hidden_size"),
            ("block_count", "num_hidden_layers"),
            ("feed_forward_length", "intermediate_size"),
            ("attention.head_count", "num_attention_heads"),
            ("attention.head_count_kv", "num_key_value_heads"),
            ("rope.freq_base", "rope_theta"),
            ("vocab_size", "vocab_size"),
        ] {
            if let Some(v) = cfg.get(field).filter(|v| v.is_number()) {
                out.insert(format!("{arch}.{key}"), v.clone());
            }
        }
    } else if let Ok(h) = shoal_gguf::Header::read(path) {
        for (k, v) in &h.metadata {
            let v = match v {
                shoal_gguf::Value::Uint(n) => json!(n),
                shoal_gguf::Value::Int(n) => json!(n),
                shoal_gguf::Value::Float(f) => json!(f),
                shoal_gguf::Value::Bool(b) => json!(b),
                shoal_gguf::Value::Str(_) if k == "tokenizer.chat_template" => continue,
                shoal_gguf::Value::Str(s) => json!(s),
                shoal_gguf::Value::Array { .. } | shoal_gguf::Value::Ints(_) => Value::Null,
            };
            out.insert(k.clone(), v);
        }
    }
    out.entry("general.parameter_count")
        .or_insert(json!(card.parameters));
    if let (Some(window), Some(arch)) = (
        window,
        out.get("general.architecture")
            .and_then(Value::as_str)
            .map(str::to_string),
    ) {
        let key = format!("{arch}.context_length");
        let trained = out.get(&key).and_then(Value::as_u64);
        if let Some(t) = trained {
            out.insert("shoal.trained_context_length".into(), json!(t));
        }
        if trained.is_none_or(|t| window < t) {
            out.insert(key, json!(window));
        }
    }
    out
}

/// Whether a model has fill-in-the-middle tokens (Ollama's `insert`),
/// from the loaded vocabulary or, before a load, the files.
fn can_insert(path: &Path, loaded: Option<&shoal_engine::loader::Vocabulary>) -> bool {
    if let Some(v) = loaded {
        return super::generate::fim_markers(v).is_some();
    }
    if path.is_dir() {
        return std::fs::read_to_string(path.join("tokenizer.json"))
            .is_ok_and(|t| t.contains("<|fim_prefix|>") || t.contains("<fim_prefix>"));
    }
    shoal_gguf::Header::read(path)
        .is_ok_and(|h| h.metadata.contains_key("tokenizer.ggml.fim_pre_token_id"))
}

/// `POST /api/show`: details, `model_info`, capabilities, template and the
/// sampling defaults as Ollama's `parameters` lines.
pub async fn show(State(s): State<AppState>, body: Body) -> Reply {
    let req = parse_named(&body)?;
    let name = req.name().map_err(err)?.to_string();
    let pool = s.pool.clone();
    blocking(move || {
        let m = find(&pool, &name)?;
        let engine = pool.loaded_engine(&m.id);
        let vocab = engine.as_ref().map(|e| &*e.model.vocab);
        let template = match vocab {
            Some(v) => v.template.as_ref().map(|t| t.source().to_string()),
            None => shoal_engine::loader::template_source(&m.path),
        };
        let caps = match vocab {
            Some(v) => v.capabilities(),
            None => pool.capabilities_at(&m.path),
        };
        // Every model answers completions; tools work on every chat model
        // (templates without them are taught the call syntax).
        let mut capabilities = vec!["completion", "tools"];
        if m.card.embedding_pooling.is_some() {
            // An embedding model answers /api/embed and nothing else.
            capabilities = vec!["embedding"];
        } else if caps.reasoning {
            capabilities.push("thinking");
        }
        if caps.vision {
            capabilities.push("vision");
        }
        if can_insert(&m.path, vocab) {
            capabilities.push("insert");
        }
        let d = shoal_engine::SamplingDefaults::read(&m.path);
        // The window served (as loaded, or as it would load): `num_ctx`, as
        // Ollama shows the window a model runs with.
        let window = pool.window_of(&m);
        let mut parameters = format!(
            "temperature {}\ntop_p {}\ntop_k {}\nmin_p {}\nrepeat_penalty {}",
            d.temperature.value,
            d.top_p.value,
            d.top_k.value,
            d.min_p.value,
            d.repetition_penalty.value
        );
        if let Some(w) = window {
            parameters.push_str(&format!("\nnum_ctx {w}"));
        }
        let template = template.unwrap_or_default();
        let modelfile = format!(
            "# Modelfile of {} as Shoal serves it\nFROM {}\nTEMPLATE \"\"\"{template}\"\"\"\n{}\n",
            tag_name(&m.id),
            m.path.display(),
            parameters
                .lines()
                .map(|l| format!("PARAMETER {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        Ok::<_, ApiError>(json!({
            "modelfile": modelfile,
            "parameters": parameters,
            "template": template,
            "details": details(&m.card),
            "model_info": model_info(&m.path, &m.card, window),
            "capabilities": capabilities,
            "context_length": window,
            "trained_context_length": m.card.context_length,
            "modified_at": timestamp(modified(&m.path)),
        }))
    })
    .await?
    .map(|v| Json(v).into_response())
    .map_err(err)
}

/// `GET /api/ps`: loaded models with their memory and when each unloads
/// if it stays idle.
pub async fn ps(State(s): State<AppState>) -> Reply {
    let pool = s.pool.clone();
    let models = blocking(move || {
        let now = Instant::now();
        let wall = chrono::Utc::now();
        pool.expiries()
            .into_iter()
            .map(|(e, at)| {
                let info = &e.model.info;
                let card = ModelCard::read(&e.model.path).unwrap_or_default();
                let m = LocalModel {
                    id: e.model.id.clone(),
                    path: e.model.path.clone(),
                    source: shoal_models::Source::Path,
                    card,
                };
                let expires = match at {
                    Some(at) => {
                        wall + chrono::Duration::from_std(at.saturating_duration_since(now))
                            .unwrap_or_default()
                    }
                    // Kept until unloaded: as Ollama shows it, centuries away.
                    None => wall + chrono::Duration::nanoseconds(i64::MAX),
                };
                let size = e.model.resident_bytes() as u64;
                let name = tag_name(&m.id);
                json!({
                    "name": name, "model": name,
                    "size": size,
                    "digest": digest(&m),
                    "details": details(&m.card),
                    "expires_at": timestamp(expires),
                    // Unified memory on a Mac is the GPU's; a CPU holds none.
                    "size_vram": if info.device.contains("gpu") || info.device.contains("metal") { size } else { 0 },
                    // The window served; the one trained on beside it.
                    "context_length": info.context_length,
                    "trained_context_length": m.card.context_length,
                })
            })
            .collect::<Vec<_>>()
    })
    .await?;
    Ok(Json(json!({ "models": models })).into_response())
}

/// An Ollama name of a hub model as Shoal's pull spec: `ORG/NAME`,
/// `hf.co/ORG/NAME:QUANT` (the GGUF of that quantization), `:latest` for
/// the repo's default choice.
fn pull_spec(name: &str) -> Result<PullSpec, ApiError> {
    let bare = ["hf.co/", "huggingface.co/"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    let (repo, tag) = match bare.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, Some(t)),
        _ => (bare, None),
    };
    let mut spec =
        PullSpec::parse(repo, None).map_err(|e| ApiError::param("model", e.to_string()))?;
    spec.quant = tag.filter(|t| *t != "latest").map(str::to_string);
    Ok(spec)
}

/// A file's layer digest in the progress lines: names the file (the hub's
/// own hash is checked after the download).
fn file_digest(repo: &str, file: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("{repo}/{file}").as_bytes());
    format!("sha256:{}", hex(&h.finalize()))
}

/// `POST /api/pull`: Shoal's hub pull, its progress as Ollama's NDJSON
/// status lines (`pulling manifest`, `pulling <digest>` with `total` and
/// `completed`, `verifying sha256 digest`, `success`); an error ends the
/// stream as `{"error"}`. The download carries on if the client leaves.
pub async fn pull(State(s): State<AppState>, body: Body) -> Reply {
    let req = parse_named(&body)?;
    let name = req.name().map_err(err)?.to_string();
    // A model this server already has is there: success at once, with no
    // hub involved (Codex's `--oss` pulls its model before each session).
    if s.pool.path_of(&name).is_ok() {
        let done = json!({"status": "success"});
        if req.stream == Some(false) {
            return Ok(Json(done).into_response());
        }
        let (lines, out) = tokio::sync::mpsc::unbounded_channel::<String>();
        for v in [json!({"status": "pulling manifest"}), done] {
            let _ = lines.send(format!("{v}\n"));
        }
        return Ok(crate::sse::framed_response(
            out,
            crate::sse::Framing::Ndjson,
        ));
    }
    let spec = pull_spec(&name).map_err(err)?;
    let repo = spec.repo.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PullEvent>();
    let hub = s.pool.hub().clone();
    let task = tokio::spawn(async move { shoal_models::pull(&spec, &hub, tx).await });
    if req.stream == Some(false) {
        let result = task
            .await
            .map_err(|e| err(ApiError::internal(e.to_string())))?;
        result.map_err(|e| err(e.into()))?;
        return Ok(Json(json!({"status": "success"})).into_response());
    }
    let (lines, out) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let line = |v: Value| format!("{v}\n");
        let mut client = lines
            .send(line(json!({"status": "pulling manifest"})))
            .is_ok();
        while let Some(ev) = rx.recv().await {
            let v = match &ev {
                PullEvent::Plan { .. } | PullEvent::Done { .. } => continue,
                PullEvent::Progress {
                    file,
                    file_bytes,
                    file_total,
                    ..
                } => {
                    let digest = file_digest(&repo, file);
                    json!({"status": format!("pulling {}", &digest[7..19]), "digest": digest,
                           "total": file_total, "completed": file_bytes})
                }
                PullEvent::FileDone { verified: true, .. } => {
                    json!({"status": "verifying sha256 digest"})
                }
                PullEvent::FileDone { .. } => continue,
            };
            client = client && lines.send(line(v)).is_ok();
        }
        let last = match task.await {
            Ok(Ok(_)) => json!({"status": "success"}),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pull failed");
                ApiError::from(e).body(ErrorShape::PLAIN)
            }
            Err(e) => ApiError::internal(e.to_string()).body(ErrorShape::PLAIN),
        };
        if client {
            let _ = lines.send(line(last));
        }
    });
    Ok(crate::sse::framed_response(
        out,
        crate::sse::Framing::Ndjson,
    ))
}

/// `DELETE /api/delete`: removes a pulled model's files (unloading it first).
pub async fn remove(State(s): State<AppState>, body: Body) -> Reply {
    let req = parse_named(&body)?;
    let name = req.name().map_err(err)?.to_string();
    let id = model_id(&name).to_string();
    if s.pool.is_named(&id) {
        return Err(err(ApiError::invalid(format!(
            "\"{name}\" is the configured model file, not a pulled one; remove it from the config instead"
        ))));
    }
    let pool = s.pool.clone();
    blocking(move || {
        let model = pool
            .library()
            .find(&id)
            .ok_or_else(|| ApiError::not_found(format!("model \"{name}\" not found")))?;
        pool.unload(&model.id);
        pool.library().remove(&model.id).map_err(ApiError::from)
    })
    .await?
    .map_err(err)?;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// `POST /api/embed` and `/api/embeddings`: no embedding model runs here yet.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_become_pull_specs() {
        let s = pull_spec("hf.co/bartowski/SmolLM2-360M-Instruct-GGUF:Q4_0").expect("spec");
        assert_eq!(s.repo, "bartowski/SmolLM2-360M-Instruct-GGUF");
        assert_eq!(s.quant.as_deref(), Some("Q4_0"));
        let s = pull_spec("org/name:latest").expect("spec");
        assert_eq!((s.repo.as_str(), s.quant), ("org/name", None));
        assert!(pull_spec("llama3").is_err());
    }

    #[test]
    fn parameter_counts_read_as_ollama_writes_them() {
        assert_eq!(parameter_size(134_515_008), "134.52M");
        assert_eq!(parameter_size(8_030_261_248), "8.0B");
        assert_eq!(parameter_size(512), "512");
    }
}
