//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages).
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Completion, Event, FinishReason, SamplingParams, Usage};
use tokio::sync::mpsc;

use crate::body::{parse, Body};
use crate::error::{ApiError, Dialect, DialectError};
use crate::openai_chat::{check_max_tokens, check_range};
use crate::run::{self, Job, LedgerFormat};
use crate::{sse, AppState};

#[derive(Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<InMessage>,
    pub max_tokens: Option<i64>,
    pub system: Option<TextOrBlocks>,
    pub stop_sequences: Option<Vec<String>>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub metadata: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct CountRequest {
    pub model: String,
    pub messages: Vec<InMessage>,
    pub system: Option<TextOrBlocks>,
    pub tools: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: TextOrBlocks,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TextOrBlocks {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl TextOrBlocks {
    fn text(&self, at: &str) -> Result<String, ApiError> {
        match self {
            TextOrBlocks::Text(s) => Ok(s.clone()),
            TextOrBlocks::Blocks(blocks) => {
                let mut out = String::new();
                for (i, b) in blocks.iter().enumerate() {
                    match (b.kind.as_str(), &b.text) {
                        ("text", Some(t)) => out.push_str(t),
                        ("text", None) => return Err(ApiError::invalid(format!("{at}.{i}.text: Field required"))),
                        (other, _) => {
                            return Err(ApiError::invalid(format!(
                                "{at}.{i}: content block type '{other}' is not supported by this model (text only)"
                            )))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

/// The dialect's stop_reason for a finish.
pub fn stop_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::StopSequence(_) => "stop_sequence",
        FinishReason::Length | FinishReason::ContextWindow => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
        FinishReason::Error(_) => "error",
    }
}

fn stop_sequence(f: &FinishReason) -> Value {
    match f {
        FinishReason::StopSequence(s) => Value::String(s.clone()),
        _ => Value::Null,
    }
}

/// The one usage builder: `input_tokens` excludes what was read from cache.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

fn to_messages(
    system: Option<&TextOrBlocks>,
    msgs: &[InMessage],
) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if let Some(s) = system {
        out.push(ChatMessage {
            role: "system".into(),
            content: s.text("system")?,
        });
    }
    for (i, m) in msgs.iter().enumerate() {
        let role = match m.role.as_str() {
            r @ ("user" | "assistant") => r,
            // Newer agents put system prompts inside `messages`.
            "system" => "system",
            other => {
                return Err(ApiError::invalid(format!(
                    "messages.{i}.role: Input should be 'user' or 'assistant', got '{other}'"
                )))
            }
        };
        out.push(ChatMessage {
            role: role.into(),
            content: m.content.text(&format!("messages.{i}.content"))?,
        });
    }
    Ok(out)
}

fn refuse_tools(tools: &Option<Vec<Value>>) -> Result<(), ApiError> {
    if tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid("tools: tool use is not supported yet"));
    }
    Ok(())
}

fn prepare(state: &AppState, req: &MessagesRequest) -> Result<Job, ApiError> {
    state.check_model(&req.model)?;
    refuse_tools(&req.tools)?;
    let ctx = state.engine.model.info.context_length;
    let max_tokens = match req.max_tokens {
        None => return Err(ApiError::invalid("max_tokens: Field required")),
        Some(v) => check_max_tokens("max_tokens", Some(v), ctx)?,
    };
    check_range("temperature", req.temperature, 0.0, 1.0)?;
    check_range("top_p", req.top_p, 0.0, 1.0)?;
    if let Some(k) = req.top_k {
        if k < 0 {
            return Err(ApiError::invalid(format!(
                "top_k: must be non-negative, got {k}"
            )));
        }
    }
    let stops: Vec<String> = req.stop_sequences.clone().unwrap_or_default();
    if stops.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid(
            "stop_sequences: each stop sequence must be non-empty",
        ));
    }
    let messages = to_messages(req.system.as_ref(), &req.messages)?;
    let prompt = state.chat_prompt(&messages)?;
    Ok(Job {
        prompts: vec![prompt],
        max_tokens,
        sampling: SamplingParams {
            temperature: req.temperature.unwrap_or(1.0),
            top_p: req.top_p.unwrap_or(1.0),
            top_k: req.top_k.unwrap_or(0) as usize,
            ..SamplingParams::default()
        },
        stop: stops,
        n: 1,
    })
}

/// Renders the event stream of one message. Pure: engine events in, SSE frames out.
pub struct StreamRenderer {
    pub id: String,
    pub model: String,
    started: bool,
    block_open: bool,
}

impl StreamRenderer {
    pub fn new(id: String, model: String) -> Self {
        StreamRenderer {
            id,
            model,
            started: false,
            block_open: false,
        }
    }

    fn ev(name: &str, data: Value) -> (String, Value) {
        (name.to_string(), data)
    }

    fn start(&mut self, prompt: usize, cached: usize, out: &mut Vec<(String, Value)>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut usage = usage_json(&Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
            ..Usage::default()
        });
        usage["output_tokens"] = json!(0);
        out.push(Self::ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}}),
        ));
        out.push(Self::ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ));
        out.push(Self::ev("ping", json!({"type": "ping"})));
        self.block_open = true;
    }

    /// Frames (event name, data) for one engine event.
    pub fn step(&mut self, ev: &Event) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        match ev {
            Event::Started {
                prompt_tokens,
                cached_tokens,
            } => self.start(*prompt_tokens, *cached_tokens, &mut out),
            Event::Delta { text, .. } => {
                out.push(Self::ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                ));
            }
            Event::Done(c) => {
                if let FinishReason::Error(msg) = &c.finish {
                    let err = ApiError::internal(format!("generation failed: {msg}"))
                        .body(Dialect::Anthropic);
                    out.push(Self::ev("error", err));
                    return out;
                }
                self.start(c.usage.prompt_tokens, c.usage.cached_tokens, &mut out);
                if self.block_open {
                    out.push(Self::ev(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    ));
                    self.block_open = false;
                }
                out.push(Self::ev(
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason(&c.finish), "stop_sequence": stop_sequence(&c.finish)},
                           "usage": usage_json(&c.usage)}),
                ));
                out.push(Self::ev("message_stop", json!({"type": "message_stop"})));
            }
        }
        out
    }
}

fn message_body(id: &str, model: &str, text: &str, c: &Completion) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason(&c.finish), "stop_sequence": stop_sequence(&c.finish),
        "usage": usage_json(&c.usage),
    })
}

pub async fn handle(State(state): State<AppState>, body: Body) -> Result<Response, DialectError> {
    let d = Dialect::Anthropic;
    let req: MessagesRequest = parse(&body).map_err(|e| e.in_dialect(d))?;
    let job = prepare(&state, &req).map_err(|e| e.in_dialect(d))?;
    let id = run::new_id("msg_");
    let fmt = LedgerFormat {
        id: id.clone(),
        dialect: "anthropic.messages",
        model: req.model.clone(),
        stream: req.stream,
        finish: |f| stop_reason(f).to_string(),
        usage: |c, per| usage_json(&run::combined_usage(c, per)),
    };
    let mut choices = run::start(&state, job, fmt).map_err(|e| e.in_dialect(d))?;
    if !req.stream {
        let collected = choices.collect().await.map_err(|e| e.in_dialect(d))?;
        let c = collected
            .first()
            .ok_or_else(|| ApiError::internal("no output").in_dialect(d))?;
        if let FinishReason::Error(msg) = &c.completion().finish {
            return Err(ApiError::internal(format!("generation failed: {msg}")).in_dialect(d));
        }
        return Ok(Json(message_body(&id, &req.model, &c.text, c.completion())).into_response());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut renderer = StreamRenderer::new(id, req.model.clone());
    tokio::spawn(async move {
        while let Some((_, ev)) = choices.next_streamed(&tx).await {
            let last = matches!(ev, Event::Done(_));
            for (name, data) in renderer.step(&ev) {
                if tx.send(sse::frame(Some(&name), &data.to_string())).is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    Ok(sse::response(rx))
}

pub async fn count_tokens(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, DialectError> {
    let d = Dialect::Anthropic;
    let req: CountRequest = parse(&body).map_err(|e| e.in_dialect(d))?;
    state.check_model(&req.model).map_err(|e| e.in_dialect(d))?;
    refuse_tools(&req.tools).map_err(|e| e.in_dialect(d))?;
    let messages = to_messages(req.system.as_ref(), &req.messages).map_err(|e| e.in_dialect(d))?;
    let prompt = state.chat_prompt(&messages).map_err(|e| e.in_dialect(d))?;
    Ok(Json(json!({"input_tokens": prompt.len()})).into_response())
}
