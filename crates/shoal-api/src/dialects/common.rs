//! What several dialects' requests share: message content as text or typed
//! parts, OpenAI's stream options, function tools as OpenAI's and Ollama's
//! chat requests carry them, and the reasoning-effort budgets. Kept here so
//! that no dialect imports another.
use serde::Deserialize;
use serde_json::Value;
use shoal_engine::tools::ToolDef;

use crate::error::ApiError;

/// A function tool's definition, as OpenAI's and Ollama's chat requests
/// carry it (`{"type": "function", "function": {…}}`).
#[derive(Debug, Deserialize)]
// `strict` is accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// The tools of a request as the engine takes them, from each tool's `type`
/// and function; a type other than `function` is a 400 naming the tool.
pub fn function_tools<'a>(
    tools: impl IntoIterator<Item = (&'a str, &'a FunctionDef)>,
) -> Result<Vec<ToolDef>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, (kind, f))| {
            if kind != "function" {
                return Err(ApiError::param(
                    "tools",
                    format!("tools[{i}].type '{kind}' is not supported; use 'function'"),
                ));
            }
            Ok(ToolDef {
                name: f.name.clone(),
                description: f.description.clone(),
                parameters: crate::tools::parameters_or_empty(f.parameters.as_ref()),
            })
        })
        .collect()
}

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
