//! OpenAI Embeddings (`POST /v1/embeddings`): `input` as a string, strings,
//! token ids or token-id arrays; `encoding_format` float or base64;
//! `dimensions` only where the model can give that length; usage counts the
//! tokens embedded (`prompt_tokens` = `total_tokens`). The work is the
//! shared path in [`crate::embeddings`].
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::dialects::registration::Registered;
use crate::embeddings::{base64_vector, embed, EmbedRequest, Input};
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::state::AppState;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    /// Accepted as OpenAI does; recorded nowhere.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

async fn handle(
    State(state): State<AppState>,
    tracked: Option<axum::Extension<crate::ledger::Tracked>>,
    body: crate::body::Body,
) -> Result<Response, DialectError> {
    let answer = async {
        let req: Request = crate::body::parse(&body)?;
        let base64 = match req.encoding_format.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(ApiError::param(
                    "encoding_format",
                    format!("'encoding_format' must be float or base64, not '{other}'"),
                ))
            }
        };
        if req.dimensions == Some(0) {
            return Err(ApiError::param(
                "dimensions",
                "'dimensions' must be at least 1",
            ));
        }
        let parsed = EmbedRequest {
            inputs: Input::parse_openai(&req.input, "input")?,
            model: req.model,
            truncate: false,
            dimensions: req.dimensions,
            field: "input",
        };
        let a = embed(&state, tracked.map(|t| t.0), DIALECT, parsed).await?;
        let data: Vec<Value> = a
            .embedded
            .vectors
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 {
                    json!(base64_vector(v))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "model": a.model,
            "usage": usage_json(&a.usage()),
        }))
        .into_response())
    };
    answer.await.map_err(|e| e.in_dialect(DIALECT))
}

/// OpenAI's embedding usage: the tokens embedded, twice.
fn usage_json(u: &shoal_engine::Usage) -> Value {
    json!({"prompt_tokens": u.prompt_tokens, "total_tokens": u.total_tokens()})
}

pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&crate::dialect::Described {
    ledger_name: "openai.embeddings",
    short_name: "embeddings",
    path_prefixes: &["/v1/embeddings"],
    generation_paths: &["/v1/embeddings"],
    model_paths: &["/v1/embeddings"],
    error_shape: ErrorShape::OPENAI,
    id_prefix: "emb-",
    transport: crate::dialect::Transport::PLAIN,
    // An embedding request has no finish of its own; a served one is `stop`.
    finish_words: |f| {
        crate::dialect::FinishWords::one(crate::dialects::openai_words::finish_reason(f))
    },
    usage_json,
    // Its usage is all an embedding reply reports.
    provider_meta: |_, _, _| {},
});

/// The dialect as the server registers it: its words and its routes.
pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> axum::Router<AppState> {
    axum::Router::new().route("/v1/embeddings", axum::routing::post(handle))
}
