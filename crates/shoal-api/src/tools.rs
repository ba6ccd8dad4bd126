//! Tool calling shared by the dialects: what a request offers and demands,
//! how tools and earlier calls reach the prompt, and what the engine is told.
use serde_json::{json, Value};
use shoal_engine::tools::{ToolDef, ToolSyntax};
use shoal_engine::ChatMessage;

use crate::error::ApiError;
use crate::state::Served;

pub use shoal_engine::prompt::ToolChoice;

/// Tools offered by a request, already validated.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    pub defs: Vec<ToolDef>,
    pub choice: ToolChoice,
}

impl ToolRequest {
    /// Checks names (OpenAI's and Anthropic's rule: `^[a-zA-Z0-9_-]{1,64}$`),
    /// duplicates, parameter schemas and that a named choice exists.
    /// `param` is where the tools were in the request, for error messages.
    pub fn new(defs: Vec<ToolDef>, choice: ToolChoice, param: &str) -> Result<Self, ApiError> {
        for (i, d) in defs.iter().enumerate() {
            let ok = !d.name.is_empty()
                && d.name.len() <= 64
                && d.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(ApiError::param(
                    param,
                    format!(
                        "{param}[{i}]: tool name '{}' must be 1-64 letters, digits, '_' or '-'",
                        d.name
                    ),
                ));
            }
            if defs[..i].iter().any(|o| o.name == d.name) {
                return Err(ApiError::param(
                    param,
                    format!("{param}[{i}]: tool name '{}' is used twice", d.name),
                ));
            }
            if !d.parameters.is_object() {
                return Err(ApiError::param(
                    param,
                    format!(
                        "{param}[{i}]: the parameters of '{}' must be a JSON Schema object",
                        d.name
                    ),
                ));
            }
        }
        match &choice {
            ToolChoice::Named(n) if !defs.iter().any(|d| &d.name == n) => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("tool_choice names '{n}', which is not among the tools"),
                ))
            }
            ToolChoice::Required | ToolChoice::Named(_) if defs.is_empty() => {
                return Err(ApiError::param(
                    "tool_choice",
                    "tool_choice requires a tool call but no tools were given",
                ))
            }
            _ => {}
        }
        Ok(ToolRequest { defs, choice })
    }
}

/// OpenAI's `tool_choice`: `"none" | "auto" | "required"` or an object
/// naming a function — Chat nests the name (`{"type": "function",
/// "function": {"name"}}`), Responses does not (`{"type": "function", "name"}`);
/// `name_at` is where the name sits and `shape` how the error describes it.
pub fn openai_tool_choice(
    v: Option<&Value>,
    have_tools: bool,
    name_at: &str,
    shape: &str,
) -> Result<Option<ToolChoice>, ApiError> {
    Ok(Some(match v {
        None if !have_tools => return Ok(None),
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("tool_choice '{other}' is not one of none, auto, required"),
                ))
            }
        },
        Some(v) => match v.pointer(name_at).and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Named(name.to_string())
            }
            _ => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("tool_choice must be 'none', 'auto', 'required' or {shape}"),
                ))
            }
        },
    }))
}

/// A parameters schema as given, or an empty object schema when omitted.
pub fn parameters_or_empty(p: Option<&Value>) -> Value {
    p.cloned()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

impl Served {
    /// How the loaded model writes tool calls.
    pub fn tool_syntax(&self) -> ToolSyntax {
        self.engine.model.vocab.capabilities().tool_syntax
    }

    /// An earlier assistant turn's text with its tool calls written out the
    /// way the model writes them.
    pub fn assistant_with_calls(&self, text: &str, calls: &[(String, Value)]) -> ChatMessage {
        let syntax = self.tool_syntax();
        let mut content = text.to_string();
        for (name, args) in calls {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&syntax.render_call(name, args));
        }
        ChatMessage::new("assistant", content)
    }

    /// A tool's result as the next turn. Templates without tool support get
    /// it wrapped the way the injected instructions describe.
    pub fn tool_result(&self, content: &str) -> ChatMessage {
        if self.engine.model.vocab.capabilities().tools {
            ChatMessage::new("tool", content)
        } else {
            ChatMessage::new(
                "tool",
                format!("<tool_response>\n{content}\n</tool_response>"),
            )
        }
    }
}

/// Arguments text as a JSON value for replaying a call (kept as a string if
/// it does not parse, so nothing the client sent is lost).
pub fn arguments_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// A request's prompt with its tools: the server's limits, then the engine's
/// one prompt decision.
impl Served {
    /// A chat request's prompt: the server's limits on messages and tools,
    /// then the engine's one prompt decision (`shoal_engine::prompt`).
    pub fn chat_prompt(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&ToolRequest>,
        images: &crate::images::Images,
    ) -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
        self.check_counts(messages, tools)?;
        let images = self.prepare_images(images)?;
        self.chat_prompt_prepared(messages, want, tools, &images)
    }

    /// [`Served::chat_prompt`] with its images already made ready.
    pub fn chat_prompt_prepared(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&ToolRequest>,
        images: &[std::sync::Arc<shoal_engine::vision::PreparedImage>],
    ) -> Result<shoal_engine::prompt::ChatPrompt, ApiError> {
        self.check_counts(messages, tools)?;
        Ok(shoal_engine::prompt::chat_prompt_with_images(
            &self.engine.model.vocab,
            messages,
            want,
            offer(tools),
            images,
        )?)
    }

    /// The server's limits on a request's messages and tools.
    fn check_counts(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolRequest>,
    ) -> Result<(), ApiError> {
        let limits = &self.access;
        if messages.len() > limits.max_messages {
            return Err(ApiError::param(
                "messages",
                format!(
                    "{} messages is more than this server accepts ({}; server.max_messages)",
                    messages.len(),
                    limits.max_messages
                ),
            ));
        }
        if let Some(t) = tools.filter(|t| t.defs.len() > limits.max_tools) {
            return Err(ApiError::param(
                "tools",
                format!(
                    "{} tools is more than this server accepts ({}; server.max_tools)",
                    t.defs.len(),
                    limits.max_tools
                ),
            ));
        }
        Ok(())
    }

    /// The tokens of `messages` as whole turns, without the generation
    /// prompt (see [`shoal_engine::prompt::turns_prompt`]).
    pub fn turns_prompt(
        &self,
        messages: &[ChatMessage],
        want: Option<Option<usize>>,
        tools: Option<&ToolRequest>,
        images: &[std::sync::Arc<shoal_engine::vision::PreparedImage>],
    ) -> Result<Vec<u32>, ApiError> {
        Ok(shoal_engine::prompt::turns_prompt_with_images(
            &self.engine.model.vocab,
            messages,
            want.is_some(),
            offer(tools),
            images,
        )?)
    }
}

/// The tools a request offers, as the engine's prompt builder takes them.
fn offer(tools: Option<&ToolRequest>) -> Option<shoal_engine::prompt::ToolOffer<'_>> {
    tools.map(|t| shoal_engine::prompt::ToolOffer {
        defs: &t.defs,
        choice: &t.choice,
    })
}
