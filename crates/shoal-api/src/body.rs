//! Request bodies: JSON parsed with errors that name the offending field.
use axum::body::Bytes;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Parses a request body, turning syntax and type errors into 400s that say
/// where the problem is, instead of axum's plain-text rejections.
pub fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
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
