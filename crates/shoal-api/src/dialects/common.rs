//! What several dialects' requests share: message content as text or typed
//! parts, OpenAI's stream options, and the reasoning-effort budgets. Kept
//! here so that no dialect imports another.
use serde::Deserialize;

use crate::error::ApiError;

/// Budgets behind the effort levels (reasoning tokens).
pub fn effort_budget(param: &str, effort: &str) -> Result<Option<Option<usize>>, ApiError> {
    Ok(match effort {
        "none" => None,
        "minimal" => Some(Some(256)),
        "low" => Some(Some(1024)),
        "medium" => Some(Some(4096)),
        "high" => Some(Some(16384)),
        other => {
            return Err(ApiError::param(
                param,
                format!("'{param}' must be one of none, minimal, low, medium, high; got '{other}'"),
            ))
        }
    })
}

/// OpenAI's `stream_options`.
#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Message content: a string or a list of typed parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl Content {
    /// Joins text parts; other part types are refused rather than dropped.
    pub fn text(&self, at: &str) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s.clone()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for (i, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text" | "input_text" | "output_text", Some(t)) => out.push_str(t),
                        ("text" | "input_text" | "output_text", None) => {
                            return Err(ApiError::param(at, format!("{at}[{i}] has no 'text'")))
                        }
                        (other, _) => {
                            return Err(ApiError::param(
                                at,
                                format!("{at}[{i}]: content type '{other}' is not supported by this model (text only)"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}
