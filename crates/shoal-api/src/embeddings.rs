//! The one serving path for embeddings, shared by the dialects that offer
//! them (OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and
//! `/api/embeddings`): input checks, the model lookup, tokenization with the
//! model's own tokenizer, the engine call (which batches across requests),
//! the ledger row and the metrics. A dialect parses its body into an
//! [`EmbedRequest`] and renders the [`Answer`].
use shoal_engine::{Completion, Embedded, EngineError, FinishReason, Timings, Usage};

use crate::dialect::Dialect;
use crate::error::ApiError;
use crate::ledger::{LedgerEntry, Tracked};
use crate::run::{new_id, now_secs};
use crate::AppState;

/// Most inputs one request may carry (OpenAI's own limit); more get a 400.
pub const MAX_INPUTS: usize = 2048;

/// One input as the client sent it.
#[derive(Clone, Debug)]
pub enum Input {
    Text(String),
    /// Token ids of the model's vocabulary, embedded as given.
    Tokens(Vec<u32>),
}

/// An embedding request after a dialect has parsed it.
#[derive(Clone, Debug)]
pub struct EmbedRequest {
    pub model: String,
    pub inputs: Vec<Input>,
    /// Cut inputs longer than the model's window instead of refusing them.
    pub truncate: bool,
    /// The vector length asked for.
    pub dimensions: Option<usize>,
    /// The field the dialect names its inputs by (`input`, `prompt`).
    pub field: &'static str,
}

impl Input {
    /// `input` as OpenAI accepts it: a string, an array of strings, an array
    /// of token ids, or an array of token-id arrays.
    pub fn parse_openai(v: &serde_json::Value, field: &str) -> Result<Vec<Input>, ApiError> {
        use serde_json::Value;
        let wrong = || {
            ApiError::param(
                field,
                format!(
                    "'{field}' must be a string, an array of strings, an array of token ids \
                     or an array of token-id arrays"
                ),
            )
        };
        let ids = |items: &[Value], at: &str| -> Result<Vec<u32>, ApiError> {
            items
                .iter()
                .map(|t| {
                    t.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            ApiError::param(
                                field,
                                format!("{at} holds {t}, which is not a token id"),
                            )
                        })
                })
                .collect()
        };
        match v {
            Value::String(s) => Ok(vec![Input::Text(s.clone())]),
            Value::Array(items) if items.iter().all(Value::is_string) => Ok(items
                .iter()
                .map(|s| Input::Text(s.as_str().unwrap_or_default().to_string()))
                .collect()),
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
                Ok(vec![Input::Tokens(ids(items, &format!("'{field}'"))?)])
            }
            Value::Array(items) if items.iter().all(Value::is_array) => items
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    let a = a.as_array().map(Vec::as_slice).unwrap_or_default();
                    Ok(Input::Tokens(ids(a, &format!("'{field}[{i}]'"))?))
                })
                .collect(),
            _ => Err(wrong()),
        }
    }
}

/// What the dialect renders: the vectors, their cost and the names to use.
pub struct Answer {
    pub id: String,
    /// The model as the client named it.
    pub model: String,
    pub embedded: Embedded,
    /// How long the request waited for its model to be in memory.
    pub load_ms: f64,
    /// From receipt to the vectors.
    pub total_ms: f64,
}

impl Answer {
    /// The request's usage: every token embedded, nothing generated.
    pub fn usage(&self) -> Usage {
        usage_of(&self.embedded)
    }
}

fn usage_of(e: &Embedded) -> Usage {
    Usage {
        prompt_tokens: e.prompt_tokens(),
        ..Usage::default()
    }
}

/// Checks, tokenizes and embeds `req`, and records it in the ledger.
pub async fn embed(
    state: &AppState,
    tracked: Option<Tracked>,
    dialect: Dialect,
    req: EmbedRequest,
) -> Result<Answer, ApiError> {
    let received = std::time::Instant::now();
    let field = req.field;
    if req.inputs.is_empty() {
        return Err(ApiError::param(field, format!("'{field}' is empty")));
    }
    if req.inputs.len() > MAX_INPUTS {
        return Err(ApiError::param(
            field,
            format!(
                "'{field}' has {} inputs; at most {MAX_INPUTS} are accepted in one request",
                req.inputs.len()
            ),
        ));
    }
    if let Some(i) = req.inputs.iter().position(|x| match x {
        Input::Text(s) => s.is_empty(),
        Input::Tokens(t) => t.is_empty(),
    }) {
        return Err(ApiError::param(
            field,
            format!("input {i} is empty; every input needs at least one character or token"),
        ));
    }
    let served = state.serve(&req.model).await?;
    let model = &served.engine.model;
    let Some(info) = model.embedding().cloned() else {
        return Err(ApiError::param(
            "model",
            format!(
                "model '{}' generates text; it is not an embedding model. Ask an embedding \
                 model (GET /v1/models lists each model's kind)",
                req.model
            ),
        )
        .with_code("model_not_supported"));
    };
    if let Some(d) = req.dimensions.filter(|&d| d != info.dimensions) {
        return Err(ApiError::param(
            "dimensions",
            format!(
                "model '{}' gives vectors of {} dimensions and does not support shortening \
                 them to {d}",
                req.model, info.dimensions
            ),
        ));
    }
    let window = info.max_input_tokens;
    let mut tokens = Vec::with_capacity(req.inputs.len());
    for (i, input) in req.inputs.iter().enumerate() {
        let mut t = match input {
            Input::Text(s) => model
                .embedding_tokens(s, req.truncate)
                .map_err(ApiError::from)?,
            Input::Tokens(t) => t.clone(),
        };
        if t.len() > window {
            if !req.truncate {
                return Err(ApiError::param(
                    field,
                    format!(
                        "input {i} has {} tokens but the model's window is {window} tokens",
                        t.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            t.truncate(window);
        }
        tokens.push(t);
    }
    let id = new_id("emb-");
    if let Some(t) = &tracked {
        let _ = t.recorded.set(id.clone());
    }
    let pending = state.ledger.expect(&id);
    let embedded = served.engine.embed(tokens).await.map_err(|e| match e {
        EngineError::InvalidRequest(_) => ApiError::param(field, e.to_string()),
        other => ApiError::from(other),
    })?;
    let usage = usage_of(&embedded);
    let total_ms = received.elapsed().as_secs_f64() * 1000.0;
    let entry = LedgerEntry {
        id: id.clone(),
        dialect,
        model: req.model.clone(),
        created: now_secs(),
        stream: false,
        per_prompt: 1,
        completions: vec![Completion {
            finish: FinishReason::Stop,
            usage,
            timings: Timings {
                queue_ms: embedded.queue_ms,
                ttft_ms: embedded.queue_ms + embedded.compute_ms,
                prefill_tokens_per_s: if embedded.compute_ms > 0.0 {
                    usage.prompt_tokens as f64 / (embedded.compute_ms / 1000.0)
                } else {
                    0.0
                },
                decode_tokens_per_s: 0.0,
                total_ms,
                ..Timings::default()
            },
        }],
        facts: tracked.as_ref().map(Tracked::facts).unwrap_or_default(),
        backend: model.info.backend.to_string(),
        status: 200,
        error: None,
    };
    state.metrics.observe(&entry);
    state
        .metrics
        .observe_embedded(dialect.ledger_name(), embedded.vectors.len());
    state.ledger.record(&entry);
    drop(pending);
    tracing::info!(id = %id, model = %req.model, inputs = embedded.vectors.len(),
                   prompt_tokens = usage.prompt_tokens, "embeddings served");
    Ok(Answer {
        id,
        model: req.model,
        load_ms: served.ready_after.as_secs_f64() * 1000.0,
        total_ms,
        embedded,
    })
}

/// A vector as OpenAI's `encoding_format: "base64"` sends it: the
/// little-endian float32 bytes, base64-encoded.
pub fn base64_vector(v: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(v: serde_json::Value) -> Result<Vec<String>, String> {
        Input::parse_openai(&v, "input")
            .map(|xs| {
                xs.into_iter()
                    .map(|x| match x {
                        Input::Text(s) => format!("text:{s}"),
                        Input::Tokens(t) => format!("tokens:{t:?}"),
                    })
                    .collect()
            })
            .map_err(|e| e.message)
    }

    #[test]
    fn openai_input_shapes() {
        assert_eq!(kinds(json!("a")).unwrap(), ["text:a"]);
        assert_eq!(kinds(json!(["a", "b"])).unwrap(), ["text:a", "text:b"]);
        assert_eq!(kinds(json!([1, 2])).unwrap(), ["tokens:[1, 2]"]);
        assert_eq!(
            kinds(json!([[1], [2, 3]])).unwrap(),
            ["tokens:[1]", "tokens:[2, 3]"]
        );
        assert!(kinds(json!([])).unwrap().is_empty());
        assert!(kinds(json!(5)).unwrap_err().contains("must be a string"));
        assert!(kinds(json!(["a", 1])).is_err());
        assert!(kinds(json!([[1, -2]]))
            .unwrap_err()
            .contains("not a token id"));
        assert!(kinds(json!([1.5])).unwrap_err().contains("not a token id"));
    }

    #[test]
    fn base64_is_little_endian_float32() {
        assert_eq!(base64_vector(&[1.0]), "AACAPw==");
    }
}
