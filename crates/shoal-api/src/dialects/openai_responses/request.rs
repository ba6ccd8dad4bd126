//! The Responses request: its wire shape, the conversation it continues
//! (`previous_response_id`) and the engine job it becomes.
use serde::Deserialize;
use serde_json::Value;
use shoal_engine::tools::ToolDef;
use shoal_engine::{ChatMessage, Grammar, SamplingParams};

use crate::dialects::common::Content;
use crate::error::ApiError;
use crate::images::{user_text, Images};
use crate::params::{check_max_tokens, check_range};
use crate::run::{self, Generation};
use crate::state::Served;
use crate::tools::{self, ToolRequest};

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
    /// A `function_call` of a function offered in a `namespace` tool.
    pub namespace: Option<String>,
}

pub(super) fn conversation(
    state: &Served,
    req: &mut ResponsesRequest,
    names: &Namespaced,
) -> Result<super::store::Stored, ApiError> {
    let (mut msgs, sources) = match &req.previous_response_id {
        Some(prev) => super::store::of(state).conversation(prev).ok_or_else(|| {
            ApiError::param(
                "previous_response_id",
                format!("no stored response with id '{prev}'"),
            )
        })?,
        None => (Vec::new(), Vec::new()),
    };
    let mut images = Images { sources };
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
            content: user_text(&t).into_owned(),
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
                        let name = names.offered(it.namespace.as_deref(), name).to_string();
                        msgs.push(state.assistant_with_calls("", &[(name, args)]));
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
                let content = it.content.as_ref().ok_or_else(|| {
                    ApiError::param("input", format!("input[{i}].content is required"))
                })?;
                let at = format!("input[{i}].content");
                let content = if role == "user" {
                    content.text_and_images(&at, &mut images)?
                } else {
                    content.text(&at)?
                };
                msgs.push(ChatMessage {
                    role: role.into(),
                    content,
                });
            }
        }
    }
    Ok((msgs, images.sources))
}

/// A Responses request made ready: the engine job, the conversation to
/// store with its reply, and what rendering the reply needs to know of its
/// tools.
pub(super) struct Prepared {
    pub job: Generation,
    pub msgs: super::store::Stored,
    pub names: Namespaced,
    pub omitted: Vec<String>,
}

pub(super) fn prepare(state: &Served, req: &mut ResponsesRequest) -> Result<Prepared, ApiError> {
    let offer = tool_request(req)?;
    let tools = offer.request;
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
    let (msgs, sources) = conversation(state, req, &offer.names)?;
    let images = Images { sources };
    let p = state.chat_prompt(&msgs, want, tools.as_ref(), &images)?;
    Ok(Prepared {
        job: Generation {
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
            images: p.images,
            reasoning: p.reasoning,
            grammar: p.grammar.or(format),
            tools: p.tools,
        },
        msgs: (msgs, images.sources),
        names: offer.names,
        omitted: offer.omitted,
    })
}

/// Tool types of OpenAI's that its own servers run (search, files, code,
/// a computer, images, remote MCP servers, a shell it drives): a local
/// server cannot, so they are left out of the offer, logged and named in
/// the response's `x-shoal-omitted-tools` header, rather than failing the
/// request (Codex sends `web_search` beside its functions).
const NOT_OFFERED: &[&str] = &[
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
];

/// Names of the functions a request offers from `namespace` tools: the
/// name the model sees and calls (the function's own, or `namespace__name`
/// where two would clash), and the namespace and name the client knows.
#[derive(Clone, Debug, Default)]
pub struct Namespaced(Vec<NsName>);

#[derive(Clone, Debug)]
struct NsName {
    offered: String,
    namespace: String,
    name: String,
}

impl Namespaced {
    /// The namespace and own name of the function the model called
    /// `offered` (no namespace for a plain function).
    pub fn wire<'a>(&'a self, offered: &'a str) -> (Option<&'a str>, &'a str) {
        self.0
            .iter()
            .find(|n| n.offered == offered)
            .map_or((None, offered), |n| (Some(n.namespace.as_str()), &n.name))
    }

    /// The name the model was offered for `name` in `namespace` (a call the
    /// client sends back in `input`).
    pub fn offered<'a>(&'a self, namespace: Option<&str>, name: &'a str) -> &'a str {
        namespace
            .and_then(|ns| self.0.iter().find(|n| n.namespace == ns && n.name == name))
            .map_or(name, |n| n.offered.as_str())
    }
}

/// A Responses request's tools as offered to the model.
#[derive(Debug, Default)]
pub(crate) struct Offer {
    pub request: Option<ToolRequest>,
    pub names: Namespaced,
    /// Tool types left out (see [`NOT_OFFERED`]).
    pub omitted: Vec<String>,
}

/// A `function` tool's definition; `context` names it in errors and
/// `namespace` (name, description) is the group it came in.
fn function_def(
    t: &Value,
    context: &str,
    namespace: Option<(&str, &str)>,
) -> Result<ToolDef, ApiError> {
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::param("tools", format!("{context}.name is required")))?;
    let own = t.get("description").and_then(Value::as_str);
    let description = match (own, namespace) {
        (d, Some((ns, ns_desc))) if !ns_desc.is_empty() => Some(match d {
            Some(d) => format!("{d} (from {ns}: {ns_desc})"),
            None => format!("From {ns}: {ns_desc}"),
        }),
        (d, _) => d.map(str::to_string),
    };
    Ok(ToolDef {
        name: name.to_string(),
        description,
        parameters: tools::parameters_or_empty(t.get("parameters").filter(|p| !p.is_null())),
    })
}

/// Function tools (plain, or grouped in `namespace` tools) and
/// `tool_choice` of a Responses request; tools this server cannot run are
/// left out (see [`NOT_OFFERED`]).
pub(crate) fn tool_request(req: &ResponsesRequest) -> Result<Offer, ApiError> {
    let mut plain: Vec<ToolDef> = Vec::new();
    let mut grouped: Vec<(String, ToolDef)> = Vec::new();
    let mut omitted = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => plain.push(function_def(t, &format!("tools[{i}]"), None)?),
            Some("namespace") => {
                let ns = t
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        ApiError::param("tools", format!("tools[{i}].name is required"))
                    })?;
                let ns_desc = t.get("description").and_then(Value::as_str).unwrap_or("");
                let inner = t.get("tools").and_then(Value::as_array).ok_or_else(|| {
                    ApiError::param("tools", format!("tools[{i}].tools must be an array"))
                })?;
                for (j, f) in inner.iter().enumerate() {
                    let context = format!("tools[{i}].tools[{j}]");
                    match f.get("type").and_then(Value::as_str) {
                        Some("function") => grouped.push((
                            ns.to_string(),
                            function_def(f, &context, Some((ns, ns_desc)))?,
                        )),
                        other => return Err(unsupported_tool(&context, other)),
                    }
                }
            }
            Some(kind) if NOT_OFFERED.contains(&kind) => omitted.push(kind.to_string()),
            other => return Err(unsupported_tool(&format!("tools[{i}]"), other)),
        }
    }
    if !omitted.is_empty() {
        tracing::info!(tools = ?omitted, "tools this server cannot run were left out of the offer");
    }
    // A grouped function keeps its own name unless another tool has it.
    let count = |name: &str| {
        plain.iter().filter(|d| d.name == name).count()
            + grouped.iter().filter(|(_, d)| d.name == name).count()
    };
    let mut names = Vec::new();
    let mut defs = plain.clone();
    for (ns, mut def) in grouped.clone() {
        let offered = if count(&def.name) > 1 {
            format!("{ns}__{}", def.name)
        } else {
            def.name.clone()
        };
        names.push(NsName {
            offered: offered.clone(),
            namespace: ns,
            name: std::mem::replace(&mut def.name, offered),
        });
        defs.push(def);
    }
    let request = match tools::openai_tool_choice(
        req.tool_choice.as_ref(),
        !defs.is_empty(),
        "/name",
        r#"{"type": "function", "name": ...}"#,
    )? {
        None => None,
        Some(choice) => Some(ToolRequest::new(defs, choice, "tools")?),
    };
    Ok(Offer {
        request,
        names: Namespaced(names),
        omitted,
    })
}

/// The error for a tool of a type that is neither offered nor left out.
fn unsupported_tool(context: &str, kind: Option<&str>) -> ApiError {
    ApiError::param(
        "tools",
        match kind {
            Some(k) => format!(
                "{context}.type '{k}' is not supported; 'function' and 'namespace' tools are \
                 (and hosted tools such as web_search are left out)"
            ),
            None => format!("{context}.type is required"),
        },
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tools: Value, choice: Option<Value>) -> ResponsesRequest {
        serde_json::from_value(serde_json::json!({
            "model": "m", "input": "hi", "tools": tools, "tool_choice": choice,
        }))
        .expect("request")
    }

    fn function(name: &str) -> Value {
        serde_json::json!({"type": "function", "name": name, "description": format!("does {name}"),
                           "parameters": {"type": "object", "properties": {}}})
    }

    /// Codex's shape: functions, a namespace of functions, and a hosted tool.
    #[test]
    fn a_namespace_offers_its_functions_and_hosted_tools_are_left_out() {
        let tools = serde_json::json!([
            function("exec_command"),
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [function("close_agent"), function("exec_command")]},
            {"type": "web_search", "external_web_access": false},
        ]);
        let offer = tool_request(&request(tools, None)).expect("offer");
        assert_eq!(offer.omitted, ["web_search"]);
        let defs = &offer.request.expect("tools").defs;
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        // A clash with a plain function is told apart by the namespace.
        assert_eq!(
            names,
            [
                "exec_command",
                "close_agent",
                "multi_agent_v1__exec_command"
            ]
        );
        assert_eq!(
            defs[1].description.as_deref(),
            Some("does close_agent (from multi_agent_v1: Sub-agents.)")
        );
        let n = &offer.names;
        assert_eq!(
            n.wire("close_agent"),
            (Some("multi_agent_v1"), "close_agent")
        );
        assert_eq!(
            n.wire("multi_agent_v1__exec_command"),
            (Some("multi_agent_v1"), "exec_command")
        );
        assert_eq!(n.wire("exec_command"), (None, "exec_command"));
        assert_eq!(
            n.offered(Some("multi_agent_v1"), "exec_command"),
            "multi_agent_v1__exec_command"
        );
        assert_eq!(n.offered(None, "exec_command"), "exec_command");
        // A forced call may name a namespaced function.
        let forced = request(
            serde_json::json!([{"type": "namespace", "name": "ns", "description": "",
                                "tools": [function("close_agent")]}]),
            Some(serde_json::json!({"type": "function", "name": "close_agent"})),
        );
        assert!(tool_request(&forced).expect("offer").request.is_some());
    }

    #[test]
    fn a_tool_of_no_known_type_is_a_clear_400() {
        for (tools, says) in [
            (
                serde_json::json!([{"type": "custom", "name": "x"}]),
                "tools[0].type 'custom' is not supported",
            ),
            (
                serde_json::json!([{"name": "x"}]),
                "tools[0].type is required",
            ),
            (
                serde_json::json!([{"type": "namespace", "name": "ns", "tools": [{"type": "custom"}]}]),
                "tools[0].tools[0].type 'custom' is not supported",
            ),
            (
                serde_json::json!([{"type": "namespace", "tools": []}]),
                "tools[0].name is required",
            ),
        ] {
            let e = tool_request(&request(tools, None)).expect_err("refused");
            assert!(matches!(e.kind, crate::error::ErrorKind::InvalidRequest));
            assert!(e.message.contains(says), "{}", e.message);
            assert!(!e.message.contains("Some("), "{}", e.message);
        }
    }
}
