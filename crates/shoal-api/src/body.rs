//! Request bodies: JSON parsed with errors that name the offending field.
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::FromRequest;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, DialectError, ErrorKind, ErrorShape};

/// A request body as handlers receive it: reading can fail (too large, cut off).
pub type Body = Result<Bytes, BytesRejection>;

/// The error for a body over the size limit (`limit` bytes, where known).
pub fn too_large(limit: Option<usize>) -> ApiError {
    let limit = limit.map_or_else(
        || "the server's limit".to_string(),
        |n| format!("{n} bytes"),
    );
    ApiError::new(
        ErrorKind::TooLarge,
        format!("request body exceeds {limit} (set by --max-body-mb)"),
    )
    .with_code("request_too_large")
}

/// Parses a request body, turning read, syntax and type errors into 4xx
/// errors that say where the problem is, instead of axum's plain-text rejections.
pub fn parse<T: DeserializeOwned>(body: &Body) -> Result<T, ApiError> {
    let body = match body {
        Ok(b) => b,
        Err(r) if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(too_large(None))
        }
        Err(r) => {
            return Err(ApiError::invalid(format!(
                "could not read request body: {}",
                r.body_text()
            )))
        }
    };
    if body.is_empty() {
        return Err(ApiError::invalid(
            "request body is empty; expected a JSON object",
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid JSON in request body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            ApiError::invalid(inner)
        } else {
            let top = path.split(['.', '[']).next().unwrap_or(&path).to_string();
            ApiError::param(&top, format!("invalid value for '{path}': {inner}"))
        }
    })
}

/// A JSON body of a management route (models, cluster placement), parsed as
/// [`parse`] does, its errors in OpenAI's shape as those routes answer.
pub struct OpenAiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OpenAiJson<T> {
    type Rejection = DialectError;

    async fn from_request(req: axum::extract::Request, s: &S) -> Result<Self, DialectError> {
        let body: Body = Bytes::from_request(req, s).await;
        parse(&body)
            .map(OpenAiJson)
            .map_err(|e| e.in_dialect(ErrorShape::OPENAI))
    }
}

/// A string or a list of strings (OpenAI `stop`, prompts).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(x) => vec![x],
            OneOrMany::Many(v) => v,
        }
    }
}
