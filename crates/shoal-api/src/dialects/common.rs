//! What several dialects' requests share: message content as text or typed
//! parts, OpenAI's stream options, function tools as OpenAI's and Ollama's
//! chat requests carry them, and the reasoning-effort budgets. Kept here so
//! that no dialect imports another.
use serde::Deserialize;
use serde_json::Value;
use shoal_engine::tools::ToolDef;

use crate::error::ApiError;
use crate::images::{user_text, Images};

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
    /// An image: Chat's `{"url": …, "detail": …}`, or Responses'
    /// `input_image` URL as a string.
    pub image_url: Option<Value>,
    /// Responses' `input_image` by uploaded file (not kept here).
    pub file_id: Option<String>,
}

impl Part {
    /// The URL of an image part (`image_url` or `input_image`).
    fn image_url(&self, at: &str) -> Result<&str, ApiError> {
        match &self.image_url {
            Some(Value::String(u)) => Ok(u),
            Some(Value::Object(o)) => o.get("url").and_then(Value::as_str).ok_or_else(|| {
                ApiError::param(at, format!("{at}.image_url needs a 'url' string"))
            }),
            _ if self.file_id.is_some() => Err(ApiError::param(
                at,
                format!("{at}: images by 'file_id' are not supported here; send 'image_url' as a data: URL"),
            )),
            _ => Err(ApiError::param(at, format!("{at} has no 'image_url'"))),
        }
    }
}

impl Content {
    /// Joins text parts; other part types are refused rather than dropped.
    pub fn text(&self, at: &str) -> Result<String, ApiError> {
        self.gather(at, None)
    }

    /// Joins text parts, with an image part's marker where it sits and the
    /// image added to `images`.
    pub fn text_and_images(&self, at: &str, images: &mut Images) -> Result<String, ApiError> {
        self.gather(at, Some(images))
    }

    fn gather(&self, at: &str, mut images: Option<&mut Images>) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(user_text(s).into_owned()),
            Content::Parts(parts) => {
                let mut out = String::new();
                for (i, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text" | "input_text" | "output_text", Some(t)) => {
                            out.push_str(&user_text(t))
                        }
                        ("image_url" | "input_image", _) if images.is_some() => {
                            let here = format!("{at}[{i}]");
                            let url = p.image_url(&here)?;
                            if let Some(images) = images.as_deref_mut() {
                                out.push_str(images.push_url(&here, url)?);
                            }
                        }
                        ("text" | "input_text" | "output_text", None) => {
                            return Err(ApiError::param(at, format!("{at}[{i}] has no 'text'")))
                        }
                        (other @ ("image_url" | "input_image"), _) => {
                            return Err(ApiError::param(
                                at,
                                format!("{at}[{i}]: content type '{other}' is not allowed in this message; images go in user messages"),
                            ))
                        }
                        (other, _) => {
                            return Err(ApiError::param(
                                at,
                                format!("{at}[{i}]: content type '{other}' is not supported"),
                            ))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}
