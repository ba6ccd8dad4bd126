//! `POST /v1/responses` and `GET /v1/responses/{id}` (OpenAI Responses).
use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Completion, Event, SamplingParams};

use super::common::Content;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::params::{check_max_tokens, check_range};
use crate::run::{self, Generation};
use crate::tools::{self, ToolRequest};
use crate::wire::responses::{status, usage_json};
use crate::{AppState, Served};
use shoal_engine::tools::ToolDef;
use shoal_engine::Grammar;

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

/// A function call in the output.
#[derive(Clone, Debug)]
pub struct OutCall {
    /// The item id (`fc_…`) and the id a `function_call_output` answers (`call_…`).
    pub id: String,
    pub call_id: String,
    pub name: String,
    pub arguments: String,
}

impl OutCall {
    fn new(name: &str, arguments: &str) -> Self {
        OutCall {
            id: run::new_id("fc_"),
            call_id: run::new_id("call_"),
            name: name.to_string(),
            arguments: arguments.to_string(),
        }
    }
    fn item(&self, status: &str) -> Value {
        json!({"type": "function_call", "id": self.id, "call_id": self.call_id, "name": self.name,
               "arguments": self.arguments, "status": status})
    }
}

/// Conversations of earlier responses, for `previous_response_id`; bounded.
pub struct ResponseStore {
    cap: usize,
    items: Mutex<VecDeque<(String, Vec<ChatMessage>, Value)>>,
}

impl ResponseStore {
    pub fn new(cap: usize) -> Self {
        ResponseStore {
            cap: cap.max(1),
            items: Mutex::new(VecDeque::new()),
        }
    }
    fn put(&self, id: String, conversation: Vec<ChatMessage>, response: Value) {
        let mut q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back((id, conversation, response));
    }
    fn conversation(&self, id: &str) -> Option<Vec<ChatMessage>> {
        let q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, c, _)| c.clone())
    }
    fn response(&self, id: &str) -> Option<Value> {
        let q = self.items.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, _, r)| r.clone())
    }
}

/// Everything needed to render the response object at any stage.
#[derive(Clone)]
pub struct Shape {
    pub id: String,
    pub msg_id: String,
    pub reasoning_id: String,
    pub created: u64,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub previous_response_id: Option<String>,
    pub temperature: f32,
    pub top_p: f32,
    pub store: bool,
    pub metadata: Value,
    /// Echoed request settings.
    pub tools: Value,
    pub tool_choice: Value,
    pub text_format: Value,
}

impl Shape {
    fn reasoning_item(&self, text: &str) -> Value {
        json!({"type": "reasoning", "id": self.reasoning_id, "summary": [],
               "content": [{"type": "reasoning_text", "text": text}]})
    }

    fn message(&self, text: &str, item_status: &str) -> Value {
        json!({"type": "message", "id": self.msg_id, "status": item_status, "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    }

    /// The response object; `done` is `None` while in progress.
    pub fn response(&self, text: &str, done: Option<&Completion>) -> Value {
        self.response_with(None, text, done)
    }

    /// The response object with a reasoning item before the message.
    pub fn response_with(
        &self,
        reasoning: Option<&str>,
        text: &str,
        done: Option<&Completion>,
    ) -> Value {
        self.response_full(reasoning, text, &[], done)
    }

    /// The response object: reasoning item, message (unless the reply was
    /// only tool calls) and function calls.
    pub fn response_full(
        &self,
        reasoning: Option<&str>,
        text: &str,
        calls: &[OutCall],
        done: Option<&Completion>,
    ) -> Value {
        let (st, incomplete, error, output, usage) = match done {
            None => (
                "in_progress",
                Value::Null,
                Value::Null,
                json!([]),
                Value::Null,
            ),
            Some(c) => {
                let (st, inc, err) = status(&c.finish);
                let item_status = if st == "completed" {
                    "completed"
                } else {
                    "incomplete"
                };
                let mut items = Vec::new();
                if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                    items.push(self.reasoning_item(r));
                }
                if st != "failed" {
                    if !text.is_empty() || calls.is_empty() {
                        items.push(self.message(text, item_status));
                    }
                    items.extend(calls.iter().map(|c| c.item("completed")));
                }
                let output = Value::Array(items);
                (st, inc, err, output, usage_json(&c.usage))
            }
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": st,
            "error": error, "incomplete_details": incomplete, "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens, "model": self.model, "output": output,
            "parallel_tool_calls": true, "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": null, "summary": null}, "store": self.store,
            "temperature": self.temperature, "text": {"format": self.text_format},
            "tool_choice": self.tool_choice, "tools": self.tools, "top_p": self.top_p, "truncation": "disabled",
            "usage": usage, "user": null, "metadata": self.metadata,
        })
    }
}

/// Renders the streamed events. Pure: engine events in, (name, data) out.
pub struct ResponsesRenderer {
    shape: Shape,
    seq: u64,
    text: String,
    reasoning: String,
    created: bool,
    /// Output index of the open reasoning item / message item.
    reasoning_open: Option<u64>,
    message_open: Option<u64>,
    /// Whether a message item was ever opened (and so must be closed).
    message_used: bool,
    /// Function calls so far, with their output indexes; the last may be open.
    calls: Vec<(u64, OutCall)>,
    call_open: bool,
    next_index: u64,
}

impl ResponsesRenderer {
    pub fn new(shape: Shape) -> Self {
        ResponsesRenderer {
            shape,
            seq: 0,
            text: String::new(),
            reasoning: String::new(),
            created: false,
            reasoning_open: None,
            message_open: None,
            message_used: false,
            calls: Vec::new(),
            call_open: false,
            next_index: 0,
        }
    }

    /// The calls made so far.
    pub fn calls(&self) -> Vec<OutCall> {
        self.calls.iter().map(|(_, c)| c.clone()).collect()
    }

    fn close_call(&mut self, out: &mut Vec<(String, Value)>) {
        if !self.call_open {
            return;
        }
        self.call_open = false;
        if let Some((i, c)) = self.calls.last().cloned() {
            self.push(
                out,
                "response.function_call_arguments.done",
                json!({"item_id": c.id, "output_index": i, "name": c.name, "arguments": c.arguments}),
            );
            self.push(
                out,
                "response.output_item.done",
                json!({"output_index": i, "item": c.item("completed")}),
            );
        }
    }

    /// Ends the message item (text done, part done, item done).
    fn close_message(&mut self, out: &mut Vec<(String, Value)>, item_status: &str) {
        let Some(i) = self.message_open.take() else {
            return;
        };
        let id = self.shape.msg_id.clone();
        let text = self.text.clone();
        self.push(out, "response.output_text.done",
                  json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}));
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        self.push(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
        );
        let item = self.shape.message(&text, item_status);
        self.push(
            out,
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }

    fn push(&mut self, out: &mut Vec<(String, Value)>, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push((kind.to_string(), data));
    }

    fn create(&mut self, out: &mut Vec<(String, Value)>) {
        if self.created {
            return;
        }
        self.created = true;
        let r = self.shape.response("", None);
        self.push(out, "response.created", json!({"response": r.clone()}));
        self.push(out, "response.in_progress", json!({"response": r}));
    }

    fn open_reasoning(&mut self, out: &mut Vec<(String, Value)>) -> u64 {
        if let Some(i) = self.reasoning_open {
            return i;
        }
        let i = self.next_index;
        self.next_index += 1;
        let item = json!({"type": "reasoning", "id": self.shape.reasoning_id, "summary": [], "content": []});
        self.push(
            out,
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        self.reasoning_open = Some(i);
        i
    }

    fn close_reasoning(&mut self, out: &mut Vec<(String, Value)>) {
        if let Some(i) = self.reasoning_open.take() {
            let id = self.shape.reasoning_id.clone();
            let text = self.reasoning.clone();
            self.push(
                out,
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
            );
            let item = self.shape.reasoning_item(&text);
            self.push(
                out,
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            );
        }
    }

    fn open_message(&mut self, out: &mut Vec<(String, Value)>) -> u64 {
        if let Some(i) = self.message_open {
            return i;
        }
        self.close_reasoning(out);
        self.close_call(out);
        self.message_used = true;
        let i = self.next_index;
        self.next_index += 1;
        let item = json!({"type": "message", "id": self.shape.msg_id, "status": "in_progress", "role": "assistant", "content": []});
        self.push(
            out,
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        let id = self.shape.msg_id.clone();
        self.push(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
        );
        self.message_open = Some(i);
        i
    }

    pub fn step(&mut self, ev: &Event) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        self.create(&mut out);
        match ev {
            Event::Started { .. } => {}
            Event::Reasoning { text } => {
                let i = self.open_reasoning(&mut out);
                self.reasoning.push_str(text);
                let id = self.shape.reasoning_id.clone();
                self.push(
                    &mut out,
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "delta": text}),
                );
            }
            Event::Delta { text, .. } => {
                let i = self.open_message(&mut out);
                self.text.push_str(text);
                let id = self.shape.msg_id.clone();
                self.push(&mut out, "response.output_text.delta",
                          json!({"item_id": id, "output_index": i, "content_index": 0, "delta": text, "logprobs": []}));
            }
            Event::ToolCallStart { name, .. } => {
                self.close_reasoning(&mut out);
                self.close_message(&mut out, "completed");
                self.close_call(&mut out);
                let i = self.next_index;
                self.next_index += 1;
                let call = OutCall::new(name, "");
                self.push(
                    &mut out,
                    "response.output_item.added",
                    json!({"output_index": i, "item": call.item("in_progress")}),
                );
                self.calls.push((i, call));
                self.call_open = true;
            }
            Event::ToolCallArgs { delta, .. } => {
                if let Some((i, c)) = self.calls.last_mut().filter(|_| self.call_open) {
                    c.arguments.push_str(delta);
                    let (i, id) = (*i, c.id.clone());
                    self.push(
                        &mut out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": i, "delta": delta}),
                    );
                }
            }
            Event::Done(c) => {
                let (st, _, _) = status(&c.finish);
                let item_status = if st == "completed" {
                    "completed"
                } else {
                    "incomplete"
                };
                if st == "failed" {
                    self.close_reasoning(&mut out);
                } else {
                    if !self.message_used && self.calls.is_empty() {
                        self.open_message(&mut out);
                    }
                    self.close_reasoning(&mut out);
                    self.close_message(&mut out, item_status);
                    self.close_call(&mut out);
                }
                let reasoning = self.reasoning.clone();
                let text = self.text.clone();
                let calls = self.calls();
                let r = self
                    .shape
                    .response_full(Some(&reasoning), &text, &calls, Some(c));
                let kind = match st {
                    "completed" => "response.completed",
                    "failed" => "response.failed",
                    _ => "response.incomplete",
                };
                self.push(&mut out, kind, json!({"response": r}));
            }
        }
        out
    }
}

fn conversation(state: &Served, req: &mut ResponsesRequest) -> Result<Vec<ChatMessage>, ApiError> {
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

fn prepare(
    state: &Served,
    req: &mut ResponsesRequest,
) -> Result<(Generation, Vec<ChatMessage>), ApiError> {
    let tools = tool_request(req)?;
    let format = text_format(req.text.as_ref())?;
    let ctx = state.engine.model.info.context_length;
    let max_tokens = check_max_tokens("max_output_tokens", req.max_output_tokens, ctx)?;
    check_range("temperature", req.temperature, 0.0, 2.0)?;
    check_range("top_p", req.top_p, 0.0, 1.0)?;
    let want = match req.reasoning.as_ref().and_then(|r| r.get("effort")) {
        Some(Value::String(e)) => super::common::effort_budget("reasoning.effort", e)?,
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

/// Responses as an [`run::Adapter`]: the response's shape, and the
/// conversation to store with it.
pub struct Responses {
    shape: Shape,
    msgs: Vec<ChatMessage>,
}

impl run::Adapter for Responses {
    type Request = ResponsesRequest;
    type Stream = ResponsesStream;
    const DIALECT: super::Dialect = DIALECT;
    const ID_PREFIX: &'static str = "resp_";

    fn prepare(
        served: &Served,
        mut req: ResponsesRequest,
        id: String,
    ) -> Result<(Generation, Self), ApiError> {
        let (job, msgs) = prepare(served, &mut req)?;
        let shape = Shape {
            id,
            msg_id: run::new_id("msg_"),
            reasoning_id: run::new_id("rs_"),
            created: run::now_secs(),
            model: req.model.clone(),
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            previous_response_id: req.previous_response_id.clone(),
            temperature: job.sampling.temperature,
            top_p: job.sampling.top_p,
            store: req.store.unwrap_or(true),
            metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
            tools: json!(req.tools.clone().unwrap_or_default()),
            tool_choice: req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            text_format: req
                .text
                .as_ref()
                .and_then(|t| t.get("format"))
                .cloned()
                .unwrap_or_else(|| json!({"type": "text"})),
        };
        Ok((job, Responses { shape, msgs }))
    }

    fn respond(self, served: &Served, collected: Vec<run::Collected>) -> Result<Value, ApiError> {
        let c = collected
            .first()
            .ok_or_else(|| ApiError::internal("no output"))?;
        let calls: Vec<OutCall> = c
            .tool_calls
            .iter()
            .map(|t| OutCall::new(&t.name, &t.arguments))
            .collect();
        let body =
            self.shape
                .response_full(Some(&c.reasoning), &c.text, &calls, Some(c.completion()));
        if self.shape.store {
            remember(served, &self.shape, self.msgs, &c.text, &calls, &body);
        }
        Ok(body)
    }

    fn stream(self, served: Served) -> ResponsesStream {
        let keep = self
            .shape
            .store
            .then(|| (served, self.shape.clone(), self.msgs));
        ResponsesStream {
            renderer: ResponsesRenderer::new(self.shape),
            text: String::new(),
            reasoning: String::new(),
            done: None,
            keep,
        }
    }
}

/// The live Responses stream: the renderer, and what storing the finished
/// response (`store: true`) needs.
pub struct ResponsesStream {
    renderer: ResponsesRenderer,
    text: String,
    reasoning: String,
    done: Option<Completion>,
    keep: Option<(Served, Shape, Vec<ChatMessage>)>,
}

impl run::StreamRender for ResponsesStream {
    fn frames(&mut self, _choice: usize, ev: &Event) -> run::Step {
        match ev {
            Event::Delta { text, .. } => self.text.push_str(text),
            Event::Reasoning { text } => self.reasoning.push_str(text),
            Event::Done(c) => self.done = Some(c.clone()),
            _ => {}
        }
        run::Step {
            frames: run::named(self.renderer.step(ev)),
            last: matches!(ev, Event::Done(_)),
        }
    }

    fn finished(&mut self) {
        if let (Some((state, shape, msgs)), Some(c)) = (self.keep.take(), &self.done) {
            let calls = self.renderer.calls();
            let body = shape.response_full(Some(&self.reasoning), &self.text, &calls, Some(c));
            remember(&state, &shape, msgs, &self.text, &calls, &body);
        }
    }
}

fn remember(
    state: &Served,
    shape: &Shape,
    mut msgs: Vec<ChatMessage>,
    text: &str,
    calls: &[OutCall],
    body: &Value,
) {
    let calls: Vec<(String, Value)> = calls
        .iter()
        .map(|c| (c.name.clone(), tools::arguments_value(&c.arguments)))
        .collect();
    msgs.push(state.assistant_with_calls(text, &calls));
    state.responses.put(shape.id.clone(), msgs, body.clone());
}

pub async fn get_response(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, DialectError> {
    state
        .responses
        .response(&id)
        .map(|r| Json(r).into_response())
        .ok_or_else(|| {
            ApiError::not_found(format!("no stored response with id '{id}'"))
                .in_dialect(ErrorShape::OpenAi)
        })
}

/// OpenAI Responses's words for the engine's records, and its routes.
pub struct Words;

impl super::Words for Words {
    fn ledger_name(&self) -> &'static str {
        "openai.responses"
    }
    fn short_name(&self) -> &'static str {
        "responses"
    }
    fn path_prefixes(&self) -> &'static [&'static str] {
        &["/v1/responses"]
    }
    fn generation_paths(&self) -> &'static [&'static str] {
        &["/v1/responses"]
    }
    fn error_shape(&self) -> ErrorShape {
        ErrorShape::OpenAi
    }
    fn finish_words(&self, f: &shoal_engine::FinishReason) -> String {
        // A finish is its `status`, or `status:reason` when incomplete.
        match crate::wire::responses::outcome(f) {
            (status, Some(reason)) => format!("{status}:{reason}"),
            (status, None) => status.to_string(),
        }
    }
    fn usage_json(&self, u: &shoal_engine::Usage) -> Value {
        crate::wire::responses::usage_json(u)
    }
    fn provider_meta(
        &self,
        finish: Option<&shoal_engine::FinishReason>,
        u: &shoal_engine::Usage,
    ) -> shoal_client::ProviderMeta {
        let mut p = crate::wire::base_meta(finish, u);
        match finish {
            Some(shoal_engine::FinishReason::Cancelled) => p.status = Some(super::CANCELLED.into()),
            Some(f) => {
                let (status, reason) = crate::wire::responses::outcome(f);
                p.status = Some(status.into());
                p.incomplete_reason = reason.map(str::to_string);
            }
            None => {}
        }
        p
    }
}

/// OpenAI Responses as the server registers it.
pub const DIALECT: super::Dialect = super::Dialect(&Words);
pub const REGISTERED: super::Registered = super::Registered {
    dialect: DIALECT,
    routes,
};

fn routes() -> axum::Router<crate::AppState> {
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/v1/responses", post(run::serve::<Responses>))
        .route("/v1/responses/{id}", get(get_response))
}
