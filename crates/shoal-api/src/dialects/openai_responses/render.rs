//! The response object at every stage and the stream's events.
use serde_json::{json, Value};
use shoal_engine::{Completion, Event};

use super::request::Namespaced;
use super::words::{status, usage_json};
use crate::run;

/// A function call in the output.
#[derive(Clone, Debug)]
pub struct OutCall {
    /// The item id (`fc_…`) and the id a `function_call_output` answers (`call_…`).
    pub id: String,
    pub call_id: String,
    /// The function's name as the client knows it, and the `namespace` tool
    /// it came in, if any.
    pub name: String,
    pub namespace: Option<String>,
    /// The name the model called it by (what a later turn replays).
    pub offered: String,
    pub arguments: String,
}

impl OutCall {
    /// The call the model made to `offered` (a name `names` may map back
    /// to a namespaced function).
    pub(super) fn new(offered: &str, arguments: &str, names: &Namespaced) -> Self {
        let (namespace, name) = names.wire(offered);
        OutCall {
            id: run::new_id("fc_"),
            call_id: run::new_id("call_"),
            name: name.to_string(),
            namespace: namespace.map(str::to_string),
            offered: offered.to_string(),
            arguments: arguments.to_string(),
        }
    }
    fn item(&self, status: &str) -> Value {
        let mut item = json!({"type": "function_call", "id": self.id, "call_id": self.call_id,
                              "name": self.name, "arguments": self.arguments, "status": status});
        if let Some(ns) = &self.namespace {
            item["namespace"] = json!(ns);
        }
        item
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
    /// The functions offered from `namespace` tools, by offered name.
    pub names: Namespaced,
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

    /// A quiet stream's heartbeat: `response.created` and
    /// `response.in_progress` if they have not gone out, else
    /// `response.in_progress` again (the response as created: clients keep
    /// the output items they have, and take nothing from its empty list).
    pub fn heartbeat(&mut self) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        if self.created {
            let r = self.shape.response("", None);
            self.push(&mut out, "response.in_progress", json!({"response": r}));
        } else {
            self.create(&mut out);
        }
        out
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
                let call = OutCall::new(name, "", &self.shape.names);
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
