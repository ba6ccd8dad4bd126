//! The one serving path for embeddings, shared by the dialects that offer
//! them (OpenAI's `/v1/embeddings`, Ollama's `/api/embed` and
//! `/api/embeddings`): input checks, the model lookup, tokenization with the
//! model's own tokenizer, the engine call (which batches across requests),
//! the ledger row and the metrics. A dialect parses its body into an
//! [`EmbedRequest`] and renders the [`Answer`].
use shoal_engine::{
    Completion, EmbedTicket, Embedded, EmbeddingInfo, EngineError, FinishReason, Timings, Usage,
};

use crate::dialect::Dialect;
use crate::error::ApiError;
use crate::ledger::{LedgerEntry, Tracked};
use crate::run::now_secs;
use crate::state::AppState;
use crate::state::Served;

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
    check_inputs(&req)?;
    let served = state.serve(&req.model).await?;
    let window = embedding_info(&served, &req)?.max_input_tokens;
    let tokens = tokenize(&served, &req, window)?;
    let field = req.field;
    let ticket = served
        .engine
        .submit_embedding(tokens)
        .map_err(|e| engine_error(field, e))?;
    let row = Row {
        id: dialect.new_id(),
        dialect,
        model: req.model.clone(),
        backend: served.engine.model.info.backend.to_string(),
        tracked,
        received,
        state: state.clone(),
    };
    let id = row.id.clone();
    // The rest runs apart from this handler, so a client that leaves still
    // gets its ledger row, with what its request cost.
    let (answer, delivered) = tokio::sync::oneshot::channel();
    tokio::spawn(settle(row, ticket, answer));
    let (embedded, total_ms) = delivered
        .await
        .map_err(|_| ApiError::from(EngineError::Unavailable("engine has stopped".into())))?
        .map_err(|e| engine_error(field, e))?;
    tracing::info!(id = %id, model = %req.model, inputs = embedded.vectors.len(),
                   prompt_tokens = embedded.prompt_tokens(), "embeddings served");
    Ok(Answer {
        id,
        model: req.model,
        load_ms: served.ready_after.as_secs_f64() * 1000.0,
        total_ms,
        embedded,
    })
}

/// The inputs' own checks, before any model is loaded.
fn check_inputs(req: &EmbedRequest) -> Result<(), ApiError> {
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
    Ok(())
}

/// The served model's embedding facts; a 400 if it generates text, or if
/// the request asks for another vector length.
fn embedding_info(served: &Served, req: &EmbedRequest) -> Result<EmbeddingInfo, ApiError> {
    let Some(info) = served.engine.model.embedding().cloned() else {
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
    Ok(info)
}

/// Every input as token ids of the model, within its window (cut to it
/// when the request allows, a 400 otherwise).
fn tokenize(served: &Served, req: &EmbedRequest, window: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    let field = req.field;
    let model = &served.engine.model;
    req.inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
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
            Ok(t)
        })
        .collect()
}

fn engine_error(field: &str, e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidRequest(_) => ApiError::param(field, e.to_string()),
        other => ApiError::from(other),
    }
}

/// What a request's ledger row needs besides its outcome.
struct Row {
    id: String,
    dialect: Dialect,
    model: String,
    backend: String,
    tracked: Option<Tracked>,
    received: std::time::Instant,
    state: AppState,
}

/// Waits for the vectors, records the request and hands the vectors to the
/// handler. If the handler is gone (its client left), a request no round
/// has taken is withdrawn and recorded as cancelled with nothing spent; one
/// already being computed is recorded as cancelled with the tokens it cost.
/// An engine failure writes no row here: the error response does.
async fn settle(
    row: Row,
    mut ticket: EmbedTicket,
    mut answer: tokio::sync::oneshot::Sender<Result<(Embedded, f64), EngineError>>,
) {
    let pending = row.state.ledger.expect(&row.id);
    let (result, finish) = tokio::select! {
        r = ticket.result() => (r, FinishReason::Stop),
        () = answer.closed() => {
            let nothing = Embedded {
                vectors: Vec::new(),
                tokens: Vec::new(),
                queue_ms: 0.0,
                compute_ms: 0.0,
            };
            if ticket.withdraw() {
                (Ok(nothing), FinishReason::Cancelled)
            } else {
                (ticket.result().await, FinishReason::Cancelled)
            }
        }
    };
    let result = result.map(|embedded| {
        let total_ms = row.received.elapsed().as_secs_f64() * 1000.0;
        row.record(&embedded, finish, total_ms);
        (embedded, total_ms)
    });
    drop(pending);
    let _ = answer.send(result);
}

impl Row {
    fn record(&self, embedded: &Embedded, finish: FinishReason, total_ms: f64) {
        let usage = usage_of(embedded);
        let cancelled = finish == FinishReason::Cancelled;
        if let Some(t) = &self.tracked {
            let _ = t.recorded.set(self.id.clone());
        }
        let entry = LedgerEntry {
            id: self.id.clone(),
            dialect: self.dialect,
            model: self.model.clone(),
            created: now_secs(),
            stream: false,
            per_prompt: 1,
            completions: vec![Completion {
                finish,
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
            facts: self
                .tracked
                .as_ref()
                .map(Tracked::facts)
                .unwrap_or_default(),
            backend: self.backend.clone(),
            status: 200,
            error: None,
        };
        let metrics = &self.state.metrics;
        metrics.observe(&entry);
        metrics.observe_embedded(self.dialect.ledger_name(), embedded.vectors.len());
        self.state.ledger.record(&entry);
        if cancelled {
            tracing::info!(id = %self.id, model = %self.model,
                           prompt_tokens = usage.prompt_tokens,
                           "embedding request cancelled: its client left");
        }
    }
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
