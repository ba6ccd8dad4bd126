//! The Responses request: its wire shape, the conversation it continues
//! (`previous_response_id`) and the engine job it becomes.
use serde::Deserialize;
use serde_json::Value;
use shoal_engine::tools::ToolDef;
use shoal_engine::{ChatMessage, Grammar, SamplingParams};

use crate::dialects::common::Content;
use crate::error::ApiError;
use crate::params::{check_max_tokens, check_range};
use crate::run::{self, Generation};
use crate::tools::{self, ToolRequest};
use crate::Served;

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct ResponsesRequest {
    pub model: String,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
    pub text: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
    pub reasoning: Option<Value>,
    pub truncation: Option<String>,
    pub parallel_tool_calls: Option<bool>,
}

run::wire_request!(ResponsesRequest);

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

#[derive(Debug, Deserialize)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub role: Option<String>,
    pub content: Option<Content>,
    /// `function_call` / `function_call_output` items.
    pub call_id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
    pub output: Option<Value>,
}

pub(super) fn conversation(
    state: &Served,
    req: &mut ResponsesRequest,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut msgs = match &req.previous_response_id {
        Some(prev) => state.responses.conversation(prev).ok_or_else(|| {
            ApiError::param(
                "previous_response_id",
                format!("no stored response with id '{prev}'"),
            )
        })?,
        None => Vec::new(),
    };
    // Instructions apply to this turn only, not to the stored history.
    msgs.retain(|m| m.role != "system");
    if let Some(i) = &req.instructions {
        msgs.insert(
            0,
            ChatMessage {
                role: "system".into(),
                content: i.clone(),
            },
        );
    }
    match req.input.take() {
        None => return Err(ApiError::param("input", "'input' is required")),
        Some(Input::Text(t)) => msgs.push(ChatMessage {
            role: "user".into(),
            content: t,
        }),
        Some(Input::Items(items)) => {
            if items.is_empty() {
                return Err(ApiError::param(
                    "input",
                    "'input' must contain at least one item",
                ));
            }
            for (i, it) in items.iter().enumerate() {
                match it.kind.as_deref() {
                    None | Some("message") => {}
                    Some("function_call") => {
                        let (Some(_), Some(name)) = (&it.call_id, &it.name) else {
                            return Err(ApiError::param(
                                "input",
                                format!(
                                    "input[{i}]: a function_call item needs 'call_id' and 'name'"
                                ),
                            ));
                        };
                        let args = tools::arguments_value(it.arguments.as_deref().unwrap_or("{}"));
                        msgs.push(state.assistant_with_calls("", &[(name.clone(), args)]));
                        continue;
                    }
                    Some("function_call_output") => {
                        if it.call_id.as_deref().is_none_or(str::is_empty) {
                            return Err(ApiError::param(
                                "input",
                                format!("input[{i}]: a function_call_output item needs 'call_id'"),
                            ));
                        }
                        let output = match &it.output {
                            Some(Value::String(s)) => s.clone(),
                            Some(other) => other.to_string(),
                            None => String::new(),
                        };
                        msgs.push(state.tool_result(&output));
                        continue;
                    }
                    // Earlier reasoning is not replayed to the model.
                    Some("reasoning") => continue,
                    Some(other) => {
                        return Err(ApiError::param(
                            "input",
                            format!("input[{i}]: item type '{other}' is not supported"),
                        ))
                    }
                }
                let role = match it.role.as_deref() {
                    Some("developer") | Some("system") => "system",
                    Some(r @ ("user" | "assistant")) => r,
                    Some(other) => {
                        return Err(ApiError::param(
                            "input",
                            format!("input[{i}].role '{other}' is not valid"),
                        ))
                    }
                    None => {
                        return Err(ApiError::param(
                            "input",
                            format!("input[{i}].role is required"),
                        ))
                    }
                };
                let content = it
                    .content
                    .as_ref()
                    .ok_or_else(|| {
                        ApiError::param("input", format!("input[{i}].content is required"))
                    })?
                    .text(&format!("input[{i}].content"))?;
                msgs.push(ChatMessage {
                    role: role.into(),
                    content,
                });
            }
        }
    }
    Ok(msgs)
}

pub(super) fn prepare(
    state: &Served,
    req: &mut ResponsesRequest,
) -> Result<(Generation, Vec<ChatMessage>), ApiError> {
    let tools = tool_request(req)?;
    let format = text_format(req.text.as_ref())?;
    let max_tokens = check_max_tokens("max_output_tokens", req.max_output_tokens)?;
    check_range("temperature", req.temperature, 0.0, 2.0)?;
    check_range("top_p", req.top_p, 0.0, 1.0)?;
    let want = match req.reasoning.as_ref().and_then(|r| r.get("effort")) {
        Some(Value::String(e)) => crate::dialects::common::effort_budget("reasoning.effort", e)?,
        Some(Value::Null) | None => None,
        Some(_) => {
            return Err(ApiError::param(
                "reasoning",
                "'reasoning.effort' must be a string",
            ))
        }
    };
    let msgs = conversation(state, req)?;
    let p = state.chat_prompt(&msgs, want, tools.as_ref())?;
    Ok((
        Generation {
            prompts: vec![p.tokens],
            max_tokens,
            sampling: {
                let d = state.engine.model.defaults.params();
                SamplingParams {
                    temperature: req.temperature.unwrap_or(d.temperature),
                    top_p: req.top_p.unwrap_or(d.top_p),
                    ..d
                }
            },
            stop: Vec::new(),
            n: 1,
            cache_breakpoints: Vec::new(),
            reasoning: p.reasoning,
            grammar: p.grammar.or(format),
            tools: p.tools,
        },
        msgs,
    ))
}

/// Function tools and `tool_choice` of a Responses request.
pub(crate) fn tool_request(req: &ResponsesRequest) -> Result<Option<ToolRequest>, ApiError> {
    let defs: Vec<ToolDef> =
        req.tools
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| {
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    other => {
                        return Err(ApiError::param(
                            "tools",
                            format!(
                            "tools[{i}].type {other:?} is not supported; only 'function' tools are"
                        ),
                        ))
                    }
                }
                let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::param("tools", format!("tools[{i}].name is required"))
                })?;
                Ok(ToolDef {
                    name: name.to_string(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    parameters: tools::parameters_or_empty(
                        t.get("parameters").filter(|p| !p.is_null()),
                    ),
                })
            })
            .collect::<Result<_, _>>()?;
    let Some(choice) = tools::openai_tool_choice(
        req.tool_choice.as_ref(),
        !defs.is_empty(),
        "/name",
        r#"{"type": "function", "name": ...}"#,
    )?
    else {
        return Ok(None);
    };
    ToolRequest::new(defs, choice, "tools").map(Some)
}

/// `text.format`: `text`, `json_object` or `{"type": "json_schema", "name", "schema"}`.
pub(crate) fn text_format(text: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let Some(fmt) = text.and_then(|t| t.get("format")) else {
        return Ok(None);
    };
    match fmt.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            if fmt
                .get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(ApiError::param(
                    "text.format.name",
                    "'text.format.name' is required for json_schema",
                ));
            }
            match fmt.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema(s.clone()))),
                _ => Err(ApiError::param(
                    "text.format.schema",
                    "'text.format.schema' must be a JSON Schema object",
                )),
            }
        }
        Some(other) => Err(ApiError::param(
            "text.format",
            format!("text.format type '{other}' is not one of text, json_object, json_schema"),
        )),
    }
}
