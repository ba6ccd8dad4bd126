//! `POST /api/chat`.
use std::time::Duration;

use axum::extract::State;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Event};

use super::shared::{
    can_think, format_grammar, model_id, now, take_images, wanted_thinking, KeepAlive, Options,
    Reply, DIALECT,
};
use crate::body::Body;
use crate::error::{ApiError, DialectError};
use crate::images::{user_text, Images};
use crate::run::{self, Collected, Step};
use crate::state::{AppState, Served};
use crate::tools::{self, ToolChoice, ToolRequest};

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    #[serde(default)]
    pub messages: Vec<InMessage>,
    pub stream: Option<bool>,
    pub format: Option<Value>,
    pub keep_alive: Option<Value>,
    pub tools: Option<Vec<Tool>>,
    pub options: Option<Options>,
    pub think: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
}

impl run::WireRequest for ChatRequest {
    fn model(&self) -> &str {
        model_id(&self.model)
    }
    /// Ollama streams unless told not to.
    fn stream(&self) -> bool {
        self.stream.unwrap_or(true)
    }
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    pub images: Option<Vec<Value>>,
    pub tool_calls: Option<Vec<InToolCall>>,
    /// An earlier turn's thinking: not replayed (templates drop it too).
    #[allow(dead_code)]
    pub thinking: Option<String>,
    #[allow(dead_code)]
    pub tool_name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct InToolCall {
    pub function: InFunction,
}

#[derive(Debug, Deserialize)]
pub struct InFunction {
    pub name: String,
    /// An object, as Ollama sends it (a JSON string is taken too).
    #[serde(default)]
    pub arguments: Value,
}

/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Debug, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default = "function")]
    pub kind: String,
    pub function: crate::dialects::common::FunctionDef,
}

fn function() -> String {
    "function".into()
}

/// `POST /api/chat`: a load (or, with `keep_alive: 0`, unload) request when
/// it has no messages; else a generation.
pub async fn handle(
    State(state): State<AppState>,
    tracked: Option<axum::Extension<crate::ledger::Tracked>>,
    body: Body,
) -> Result<Response, DialectError> {
    let req: ChatRequest = crate::body::parse(&body).map_err(|e| e.in_dialect(DIALECT))?;
    let keep = KeepAlive::parse(req.keep_alive.as_ref().unwrap_or(&Value::Null))
        .map_err(|e| e.in_dialect(DIALECT))?;
    let name = req.model.clone();
    if req.messages.is_empty() {
        return super::shared::load_request(&state, &name, keep, |reason| {
            json!({"model": name, "created_at": now(),
                   "message": {"role": "assistant", "content": ""},
                   "done_reason": reason, "done": true})
        })
        .await;
    }
    super::shared::generation::<OllamaChat>(&state, tracked, req, &name, keep).await
}

fn to_messages(
    served: &Served,
    msgs: &[InMessage],
    images: &mut Images,
) -> Result<Vec<ChatMessage>, ApiError> {
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}].images");
            if m.role != "user" && m.images.as_ref().is_some_and(|v| !v.is_empty()) {
                return Err(ApiError::param(
                    &at,
                    format!("{at}: images go in user messages"),
                ));
            }
            let text = user_text(m.content.as_deref().unwrap_or_default()).into_owned();
            match m.role.as_str() {
                "system" => Ok(ChatMessage::new("system", text)),
                "user" => {
                    let markers = take_images(m.images.as_ref(), &at, images)?;
                    Ok(ChatMessage::new("user", markers + &text))
                }
                "assistant" => {
                    let calls: Vec<(String, Value)> = m
                        .tool_calls
                        .iter()
                        .flatten()
                        .map(|c| {
                            let args = match &c.function.arguments {
                                Value::String(s) => tools::arguments_value(s),
                                Value::Null => json!({}),
                                v => v.clone(),
                            };
                            (c.function.name.clone(), args)
                        })
                        .collect();
                    Ok(served.assistant_with_calls(&text, &calls))
                }
                "tool" => Ok(served.tool_result(&text)),
                other => Err(ApiError::param(
                    "messages",
                    format!(
                        "messages[{i}].role '{other}' is not one of system, user, assistant, tool"
                    ),
                )),
            }
        })
        .collect()
}

fn tool_request(req: &ChatRequest) -> Result<Option<ToolRequest>, ApiError> {
    let Some(list) = req.tools.as_ref().filter(|l| !l.is_empty()) else {
        return Ok(None);
    };
    let defs = crate::dialects::common::function_tools(
        list.iter().map(|t| (t.kind.as_str(), &t.function)),
    )?;
    ToolRequest::new(defs, ToolChoice::Auto, "tools").map(Some)
}

/// `/api/chat` as an [`run::Adapter`].
pub struct OllamaChat(Reply);

impl run::Adapter for OllamaChat {
    type Request = ChatRequest;
    type Stream = ChatStream;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, mut req: ChatRequest, _id: String) -> run::Prepared<Self> {
        let options = req.options.take().unwrap_or_default();
        let tools = tool_request(&req)?;
        let format = format_grammar(req.format.as_ref())?;
        let want = wanted_thinking(req.think.as_ref(), can_think(served), &req.model)?;
        let mut images = Images::default();
        let messages = to_messages(served, &req.messages, &mut images)?;
        let p = served.chat_prompt(&messages, want, tools.as_ref(), &images)?;
        let mut job = super::shared::job(served, p, &options, format)?;
        job.sampling.top_logprobs = super::shared::wanted_logprobs(req.logprobs, req.top_logprobs)?;
        Ok((job, OllamaChat(Reply::new(served, req.model, req.logprobs))))
    }

    fn respond(self, _: &Served, collected: Vec<Collected>) -> Result<Value, ApiError> {
        let c = super::shared::only(&collected)?;
        let mut message = json!({"role": "assistant", "content": c.text});
        if !c.reasoning.is_empty() {
            message["thinking"] = json!(c.reasoning);
        }
        if !c.tool_calls.is_empty() {
            message["tool_calls"] = tool_calls(
                c.tool_calls
                    .iter()
                    .map(|t| (t.name.as_str(), t.arguments.as_str())),
            );
        }
        Ok(self.0.close(json!({"message": message}), c))
    }

    fn stream(self, _: Served) -> ChatStream {
        let Reply {
            model,
            ready_after,
            logprobs,
        } = self.0;
        ChatStream {
            model,
            ready_after,
            calls: Vec::new(),
            logprobs,
        }
    }
}

/// Calls in Ollama's shape: whole, arguments as an object.
fn tool_calls<'a>(calls: impl Iterator<Item = (&'a str, &'a str)>) -> Value {
    calls
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": run::new_id("call_"),
                   "function": {"index": i, "name": name, "arguments": tools::arguments_value(args)}})
        })
        .collect()
}

/// The live `/api/chat` stream: one object a line; tool calls go out whole
/// once the reply has ended, as Ollama sends them.
pub struct ChatStream {
    model: String,
    ready_after: Duration,
    calls: Vec<(String, String)>,
    logprobs: bool,
}

impl ChatStream {
    fn line(&self, message: Value) -> (Option<String>, String) {
        let v =
            json!({"model": self.model, "created_at": now(), "message": message, "done": false});
        (None, v.to_string())
    }
}

impl run::StreamRender for ChatStream {
    fn frames(&mut self, _: usize, ev: &Event) -> Step {
        let mut step = Step::default();
        match ev {
            Event::Started { .. } => {}
            Event::Delta { text, logprobs } => {
                let lps = self.logprobs && !logprobs.is_empty();
                if !text.is_empty() || lps {
                    let mut line = self.line(json!({"role": "assistant", "content": text}));
                    if lps {
                        line.1 = with_logprobs(&line.1, logprobs);
                    }
                    step.frames.push(line);
                }
            }
            Event::Reasoning { text } => step
                .frames
                .push(self.line(json!({"role": "assistant", "content": "", "thinking": text}))),
            Event::ToolCallStart { name, .. } => self.calls.push((name.clone(), String::new())),
            Event::ToolCallArgs { index, delta } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.1.push_str(delta);
                }
            }
            Event::Done(c) => {
                if !self.calls.is_empty() {
                    let calls =
                        tool_calls(self.calls.iter().map(|(n, a)| (n.as_str(), a.as_str())));
                    step.frames.push(
                        self.line(json!({"role": "assistant", "content": "", "tool_calls": calls})),
                    );
                }
                let head = json!({"model": self.model, "created_at": now(),
                    "message": {"role": "assistant", "content": ""}});
                let last = super::shared::closing(head, c, self.ready_after);
                step.frames.push((None, last.to_string()));
                step.last = true;
            }
        }
        step
    }

    /// A line with an empty message, as Ollama's own streams carry while a
    /// model thinks: clients append it as nothing.
    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        vec![self.line(json!({"role": "assistant", "content": ""}))]
    }
}

/// A stream line (JSON text) with the tokens' logprobs beside its message.
fn with_logprobs(line: &str, lps: &[shoal_engine::TokenLogprob]) -> String {
    let mut v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    v["logprobs"] = super::shared::logprobs_json(lps);
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use run::StreamRender;
    use shoal_engine::{Completion, FinishReason, Timings, Usage};

    fn done(finish: FinishReason) -> Event {
        Event::Done(Completion {
            finish,
            usage: Usage {
                prompt_tokens: 40,
                cached_tokens: 10,
                completion_tokens: 9,
                reasoning_tokens: 4,
                ..Usage::default()
            },
            timings: Timings {
                queue_ms: 1.0,
                ttft_ms: 11.0,
                prefill_tokens_per_s: 0.0,
                decode_tokens_per_s: 0.0,
                total_ms: 31.0,
                ..Timings::default()
            },
        })
    }

    fn lines(events: &[Event]) -> Vec<Value> {
        let mut s = ChatStream {
            model: "m:latest".into(),
            ready_after: Duration::from_millis(5),
            calls: Vec::new(),
            logprobs: false,
        };
        let mut out = Vec::new();
        for (i, ev) in events.iter().enumerate() {
            let step = s.frames(0, ev);
            assert_eq!(
                step.last,
                i + 1 == events.len(),
                "only the final event ends it"
            );
            out.extend(step.frames.iter().map(|(name, d)| {
                assert!(name.is_none(), "NDJSON has no event names");
                serde_json::from_str::<Value>(d).expect("one JSON object a line")
            }));
        }
        out
    }

    #[test]
    fn thinking_then_answer_then_exact_final_counts() {
        let out = lines(&[
            Event::Started {
                prompt_tokens: 40,
                cached_tokens: 10,
                cache_write_tokens: 0,
                cache_write_1h_tokens: 0,
            },
            Event::Reasoning { text: "Hmm".into() },
            Event::Delta {
                text: "Hi".into(),
                logprobs: vec![],
            },
            done(FinishReason::Stop),
        ]);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0]["message"]["thinking"], "Hmm");
        assert_eq!(out[0]["message"]["content"], "");
        assert_eq!(out[1]["message"]["content"], "Hi");
        let last = &out[2];
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "stop");
        assert_eq!(
            (
                &last["prompt_eval_count"],
                &last["prompt_eval_cached_count"],
                &last["eval_count"],
                &last["eval_thinking_count"]
            ),
            (&json!(40), &json!(10), &json!(9), &json!(4))
        );
        // Nanoseconds from the engine's timings plus the wait for the model.
        assert_eq!(last["load_duration"], 5_000_000);
        assert_eq!(last["prompt_eval_duration"], 10_000_000);
        assert_eq!(last["eval_duration"], 20_000_000);
        assert_eq!(last["total_duration"], 36_000_000);
    }

    #[test]
    fn tool_calls_arrive_whole_and_end_as_stop() {
        let out = lines(&[
            Event::ToolCallStart {
                index: 0,
                name: "get_weather".into(),
            },
            Event::ToolCallArgs {
                index: 0,
                delta: "{\"city\": ".into(),
            },
            Event::ToolCallArgs {
                index: 0,
                delta: "\"Paris\"}".into(),
            },
            done(FinishReason::ToolCalls),
        ]);
        assert_eq!(out.len(), 2);
        let f = &out[0]["message"]["tool_calls"][0]["function"];
        assert_eq!(f["name"], "get_weather");
        assert_eq!(f["arguments"], json!({"city": "Paris"}));
        assert_eq!(f["index"], 0);
        assert_eq!(out[1]["done_reason"], "stop");
    }

    #[test]
    fn a_failed_or_filtered_end_says_so() {
        let out = lines(&[done(FinishReason::Error("boom".into()))]);
        assert_eq!(out.len(), 1);
        assert!(out[0]["error"].as_str().is_some_and(|e| e.contains("boom")));
        assert_eq!(out[0]["usage"]["eval_count"], 9, "usage beside the error");
        let out = lines(&[done(FinishReason::Timeout { limit_secs: 3 })]);
        assert!(out[0]["error"].as_str().is_some_and(|e| e.contains("3 s")));
        let out = lines(&[done(FinishReason::ContentFilter)]);
        assert_eq!(out[0]["done_reason"], "content_filter");
        let out = lines(&[done(FinishReason::ContextWindow)]);
        assert_eq!(out[0]["done_reason"], "length");
    }
}
