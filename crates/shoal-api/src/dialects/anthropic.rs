//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages).
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Event, FinishReason, SamplingParams, Usage};

use crate::body::{parse, Body};
use crate::dialects::registration::Registered;
use crate::error::{ApiError, DialectError, ErrorShape};
use crate::images::{user_text, Images};
use crate::params::{check_max_tokens, check_range};
use crate::run::{self, Generation};
use crate::state::{AppState, Served};
use crate::tools::{ToolChoice, ToolRequest};
use shoal_engine::tools::ToolDef;

// Anthropic Messages' words for the engine's records.

/// The dialect's stop_reason for a finish.
pub fn stop_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
        FinishReason::StopSequence(_) => "stop_sequence",
        FinishReason::Length => "max_tokens",
        // Anthropic's word for a reply that filled the context window.
        FinishReason::ContextWindow => "model_context_window_exceeded",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter => "refusal",
        FinishReason::Error(_) | FinishReason::Timeout { .. } => "error",
    }
}

/// Anthropic's `input_tokens`: the prompt less what was read from cache
/// and what was written at the request's cache breakpoints, so that the
/// three add up to the whole prompt as Anthropic's do.
pub fn uncached(u: &Usage) -> usize {
    u.prompt_tokens
        .saturating_sub(u.cached_tokens)
        .saturating_sub(u.cache_write_tokens)
}

/// The one usage builder: `input_tokens` + `cache_creation_input_tokens`
/// + `cache_read_input_tokens` = the prompt; the writes split by TTL.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": uncached(u),
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": u.cache_write_tokens - u.cache_write_1h_tokens.min(u.cache_write_tokens),
            "ephemeral_1h_input_tokens": u.cache_write_1h_tokens,
        },
        "output_tokens": u.completion_tokens,
    })
}

/// Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`,
/// and 529 for an overloaded server (Anthropic's documented status).
pub const ERRORS: ErrorShape = ErrorShape {
    name: "anthropic",
    object: error_object,
    overloaded: match axum::http::StatusCode::from_u16(529) {
        Ok(s) => s,
        Err(_) => axum::http::StatusCode::SERVICE_UNAVAILABLE,
    },
};

fn error_object(e: &ApiError) -> Value {
    use crate::error::ErrorKind;
    let kind = match e.kind {
        ErrorKind::InvalidRequest => "invalid_request_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::TooLarge => "request_too_large",
        ErrorKind::Overloaded => "overloaded_error",
        ErrorKind::RateLimited { .. } => "rate_limit_error",
        ErrorKind::Unauthorized => "authentication_error",
        ErrorKind::Forbidden => "permission_error",
        ErrorKind::Timeout => "timeout_error",
        ErrorKind::Unavailable | ErrorKind::Upstream | ErrorKind::Internal => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
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
    pub tools: Option<Vec<AnthropicTool>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
}

run::wire_request!(MessagesRequest);

/// A client tool: `{"name", "description", "input_schema"}`. Server tools
/// (web search, code execution …) carry a `type` and are refused.
#[derive(Debug, Deserialize)]
pub struct AnthropicTool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    pub cache_control: Option<CacheControl>,
}

/// `cache_control`: `{"type": "ephemeral", "ttl": "5m" | "1h"}` on a tool, a
/// system block or a message's content block: cache the prompt up to and
/// including it.
#[derive(Debug, Deserialize)]
pub struct CacheControl {
    #[serde(rename = "type")]
    pub kind: String,
    pub ttl: Option<String>,
}

impl CacheControl {
    /// Its TTL in seconds, or the error Anthropic gives for a bad one.
    fn ttl_secs(&self, at: &str) -> Result<u64, ApiError> {
        if self.kind != "ephemeral" {
            return Err(ApiError::invalid(format!(
                "{at}.cache_control.type: Input should be 'ephemeral'"
            )));
        }
        match self.ttl.as_deref() {
            None | Some("5m") => Ok(300),
            Some("1h") => Ok(3600),
            Some(other) => Err(ApiError::invalid(format!(
                "{at}.cache_control.ttl: Input should be '5m' or '1h', got '{other}'"
            ))),
        }
    }
}

/// Most cache breakpoints one request may set, as Anthropic allows.
const MAX_BREAKPOINTS: usize = 4;

/// A request's cache breakpoints, each with its TTL in seconds.
type Marks = Vec<(Mark, u64)>;

/// Where a cache breakpoint ends the prefix it marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// After the tools (a `cache_control` on a tool).
    Tools,
    /// After the rendered conversation's message at this index.
    Through(usize),
}

#[derive(Debug, Deserialize)]
pub struct CountRequest {
    pub model: String,
    pub messages: Vec<InMessage>,
    pub system: Option<TextOrBlocks>,
    pub tools: Option<Vec<AnthropicTool>>,
    pub tool_choice: Option<Value>,
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
    /// `tool_use`: the call's id, tool name and input.
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    /// `tool_result`: which call it answers, and the result.
    pub tool_use_id: Option<String>,
    pub content: Option<TextOrBlocks>,
    pub is_error: Option<bool>,
    pub cache_control: Option<CacheControl>,
    /// `image`: `{"type": "base64", "media_type", "data"}` or `{"type": "url", "url"}`.
    pub source: Option<Value>,
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

fn stop_sequence(f: &FinishReason) -> Value {
    match f {
        FinishReason::StopSequence(s) => Value::String(s.clone()),
        _ => Value::Null,
    }
}

/// The conversation as chat messages, and the cache breakpoints its blocks
/// set (each with its TTL in seconds).
fn to_messages(
    state: &Served,
    system: Option<&TextOrBlocks>,
    msgs: &[InMessage],
    images: &mut Images,
) -> Result<(Vec<ChatMessage>, Marks), ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            "messages: at least one message is required",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len() + 1);
    let mut marks = Vec::new();
    if let Some(s) = system {
        out.push(ChatMessage::new("system", s.text("system")?));
        if let TextOrBlocks::Blocks(blocks) = s {
            for (j, b) in blocks.iter().enumerate() {
                if let Some(cc) = &b.cache_control {
                    marks.push((Mark::Through(0), cc.ttl_secs(&format!("system.{j}"))?));
                }
            }
        }
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
        let at = format!("messages.{i}.content");
        let TextOrBlocks::Blocks(blocks) = &m.content else {
            out.push(ChatMessage::new(role, m.content.text(&at)?));
            continue;
        };
        let mut marked = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            if let Some(cc) = &b.cache_control {
                marked.push(cc.ttl_secs(&format!("{at}.{j}"))?);
            }
        }
        // Tool blocks become their own turns; text blocks stay together.
        let mut text = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let here = format!("{at}.{j}");
            match (b.kind.as_str(), role) {
                ("text", _) => match &b.text {
                    Some(t) => text.push_str(&user_text(t)),
                    None => return Err(ApiError::invalid(format!("{here}.text: Field required"))),
                },
                ("image", "user") => text.push_str(image_block(&here, b.source.as_ref(), images)?),
                // Earlier thinking is not replayed to the model.
                ("thinking" | "redacted_thinking", "assistant") => {}
                ("tool_use", "assistant") => {
                    let (Some(_), Some(name)) = (&b.id, &b.name) else {
                        return Err(ApiError::invalid(format!(
                            "{here}: a tool_use block needs 'id' and 'name'"
                        )));
                    };
                    calls.push((name.clone(), b.input.clone().unwrap_or_else(|| json!({}))));
                }
                ("tool_result", "user") => {
                    if b.tool_use_id.as_deref().is_none_or(str::is_empty) {
                        return Err(ApiError::invalid(format!(
                            "{here}.tool_use_id: Field required"
                        )));
                    }
                    let result = match &b.content {
                        Some(c) => c.text(&format!("{here}.content"))?,
                        None => String::new(),
                    };
                    let result = if b.is_error == Some(true) {
                        format!("Error: {result}")
                    } else {
                        result
                    };
                    out.push(state.tool_result(&result));
                }
                (kind, _) => {
                    return Err(ApiError::invalid(format!(
                        "{here}: content block type '{kind}' is not supported in a {role} message"
                    )))
                }
            }
        }
        if role == "assistant" {
            out.push(state.assistant_with_calls(&text, &calls));
        } else if !text.is_empty() || !blocks.iter().any(|b| b.kind == "tool_result") {
            out.push(ChatMessage::new(role, text));
        }
        // A breakpoint anywhere in a message ends after the whole message:
        // its blocks render as one turn.
        if let Some(last) = out.len().checked_sub(1) {
            marks.extend(marked.into_iter().map(|ttl| (Mark::Through(last), ttl)));
        }
    }
    Ok((out, marks))
}

/// An `image` block's source into `images`; returns its marker.
fn image_block(
    at: &str,
    source: Option<&Value>,
    images: &mut Images,
) -> Result<&'static str, ApiError> {
    let Some(src) = source else {
        return Err(ApiError::invalid(format!("{at}.source: Field required")));
    };
    match src.get("type").and_then(Value::as_str) {
        Some("base64") => match src.get("data").and_then(Value::as_str) {
            Some(data) => images.push_base64(at, data),
            None => Err(ApiError::invalid(format!(
                "{at}.source.data: Field required"
            ))),
        },
        Some("url") => match src.get("url").and_then(Value::as_str) {
            Some(url) => images.push_url(at, url),
            None => Err(ApiError::invalid(format!(
                "{at}.source.url: Field required"
            ))),
        },
        Some(other) => Err(ApiError::invalid(format!(
            "{at}.source.type: '{other}' is not supported; use 'base64' (or a data: 'url')"
        ))),
        None => Err(ApiError::invalid(format!(
            "{at}.source.type: Field required"
        ))),
    }
}

/// The breakpoints of a request on its rendered prompt `full` (with its
/// `images`, which the prefixes hold as the whole does): each mark's
/// prefix is the conversation rendered up to it, and it ends where that
/// rendering and `full` part. At most [`MAX_BREAKPOINTS`] marked blocks.
fn breakpoints(
    state: &Served,
    messages: &[ChatMessage],
    marks: &[(Mark, u64)],
    tool_marks: &[u64],
    want: Option<Option<usize>>,
    tools: Option<&ToolRequest>,
    (full, images): (
        &[u32],
        &[std::sync::Arc<shoal_engine::vision::PreparedImage>],
    ),
) -> Result<Vec<shoal_engine::CacheBreakpoint>, ApiError> {
    let n = marks.len() + tool_marks.len();
    if n > MAX_BREAKPOINTS {
        return Err(ApiError::invalid(format!(
            "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {n}."
        )));
    }
    let has_system = messages.first().is_some_and(|m| m.role == "system");
    let all = tool_marks
        .iter()
        .map(|&ttl| (Mark::Tools, ttl))
        .chain(marks.iter().copied());
    let mut out = Vec::with_capacity(n);
    for (mark, ttl) in all {
        let part = match mark {
            // The tools render into the system turn where there is one,
            // else they lead the prompt on their own.
            Mark::Tools if has_system => &messages[..1],
            Mark::Tools => &messages[..0],
            Mark::Through(k) => &messages[..=k.min(messages.len() - 1)],
        };
        // A template that cannot render the tools alone marks nothing.
        let turns = match state.turns_prompt(part, want, tools, images) {
            Ok(t) => t,
            Err(_) if part.is_empty() => Vec::new(),
            Err(e) => return Err(e),
        };
        let tokens = turns.iter().zip(full).take_while(|(a, b)| a == b).count();
        out.push(shoal_engine::CacheBreakpoint {
            tokens,
            ttl_secs: ttl,
        });
    }
    Ok(out)
}

/// The TTLs of the tools marked with `cache_control`.
fn tool_marks(tools: Option<&Vec<AnthropicTool>>) -> Result<Vec<u64>, ApiError> {
    tools
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, t)| {
            t.cache_control
                .as_ref()
                .map(|cc| cc.ttl_secs(&format!("tools.{i}")))
        })
        .collect()
}

/// `tools` and `tool_choice`: `{"type": "auto" | "any" | "tool" | "none", "name"}`.
pub(crate) fn tool_request(
    tools: Option<&Vec<AnthropicTool>>,
    choice: Option<&Value>,
) -> Result<Option<ToolRequest>, ApiError> {
    let defs: Vec<ToolDef> = tools
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| {
            if let Some(k) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::invalid(format!(
                    "tools.{i}: server tool type '{k}' is not available on this server"
                )));
            }
            let schema = t.input_schema.as_ref().ok_or_else(|| {
                ApiError::invalid(format!("tools.{i}.input_schema: Field required"))
            })?;
            Ok(ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: schema.clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    let choice = match choice {
        None if defs.is_empty() => return Ok(None),
        None => ToolChoice::Auto,
        Some(v) => match (
            v.get("type").and_then(Value::as_str),
            v.get("name").and_then(Value::as_str),
        ) {
            (Some("auto"), _) => ToolChoice::Auto,
            (Some("any"), _) => ToolChoice::Required,
            (Some("none"), _) => ToolChoice::None,
            (Some("tool"), Some(name)) => ToolChoice::Named(name.to_string()),
            (Some("tool"), None) => {
                return Err(ApiError::invalid("tool_choice.tool.name: Field required"))
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'",
                ))
            }
        },
    };
    ToolRequest::new(defs, choice, "tools")
        .map(Some)
        .map_err(|e| ApiError::invalid(e.message))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` (N below max_tokens),
/// `{"type": "adaptive"}` (no budget) or `{"type": "disabled"}`.
fn wanted_thinking(
    thinking: Option<&Value>,
    max_tokens: Option<usize>,
) -> Result<Option<Option<usize>>, ApiError> {
    let Some(t) = thinking else { return Ok(None) };
    match t.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok(None),
        Some("adaptive") => Ok(Some(None)),
        Some("enabled") => {
            let budget = t
                .get("budget_tokens")
                .and_then(Value::as_i64)
                .ok_or_else(|| {
                    ApiError::invalid("thinking.enabled.budget_tokens: Field required")
                })?;
            if budget < 1 {
                return Err(ApiError::invalid(
                    "thinking.budget_tokens: must be at least 1",
                ));
            }
            if max_tokens.is_some_and(|m| budget as usize >= m) {
                return Err(ApiError::invalid(
                    "max_tokens must be greater than thinking.budget_tokens",
                ));
            }
            Ok(Some(Some(budget as usize)))
        }
        _ => Err(ApiError::invalid(
            "thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'",
        )),
    }
}

fn prepare(state: &Served, req: &MessagesRequest) -> Result<Generation, ApiError> {
    let tools = tool_request(req.tools.as_ref(), req.tool_choice.as_ref())?;
    let max_tokens = match req.max_tokens {
        None => return Err(ApiError::invalid("max_tokens: Field required")),
        Some(v) => check_max_tokens("max_tokens", Some(v))?,
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
    // A model that cannot reason answers as if none was asked, so the
    // whole block is ignored there, Anthropic's budget rule included (Qwen
    // Code sends a 32000 budget with a max_tokens of 4000).
    let thinking = req
        .thinking
        .as_ref()
        .filter(|_| state.engine.model.vocab.capabilities().reasoning);
    let want = wanted_thinking(thinking, max_tokens)?;
    let mut images = Images::default();
    let (messages, marks) = to_messages(state, req.system.as_ref(), &req.messages, &mut images)?;
    let prepared = state.prepare_images(&images)?;
    let p = state.chat_prompt_prepared(&messages, want, tools.as_ref(), &prepared)?;
    let cache_breakpoints = breakpoints(
        state,
        &messages,
        &marks,
        &tool_marks(req.tools.as_ref())?,
        want,
        tools.as_ref(),
        (&p.tokens, &prepared),
    )?;
    Ok(Generation {
        cache_breakpoints,
        images: p.images,
        reasoning: p.reasoning,
        grammar: p.grammar,
        tools: p.tools,
        prompts: vec![p.tokens],
        max_tokens,
        sampling: {
            let d = state.engine.model.defaults.params();
            SamplingParams {
                temperature: req.temperature.unwrap_or(d.temperature),
                top_p: req.top_p.unwrap_or(d.top_p),
                top_k: req.top_k.map_or(d.top_k, |k| k as usize),
                ..d
            }
        },
        stop: stops,
        n: 1,
    })
}

/// Renders the event stream of one message. Pure: engine events in, SSE frames out.
pub struct MessagesRenderer {
    pub id: String,
    pub model: String,
    started: bool,
    pinged: bool,
    /// Index and kind ("thinking" / "text" / "tool_use") of the open content block.
    open: Option<(usize, &'static str)>,
    next_index: usize,
    /// Content-block index of each tool call so far.
    tool_blocks: Vec<usize>,
}

impl run::StreamRender for MessagesRenderer {
    fn frames(&mut self, _choice: usize, ev: &Event) -> run::Step {
        run::Step {
            frames: run::named(self.step(ev)),
            last: matches!(ev, Event::Done(_)),
        }
    }

    /// Anthropic's own keep-alive, `ping`, which may come anywhere in a
    /// stream (its SDKs skip it; other clients take it as such).
    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        run::named(vec![Self::ev("ping", json!({"type": "ping"}))])
    }
}

impl MessagesRenderer {
    pub fn new(id: String, model: String) -> Self {
        MessagesRenderer {
            id,
            model,
            started: false,
            pinged: false,
            open: None,
            next_index: 0,
            tool_blocks: Vec::new(),
        }
    }

    fn ev(name: &str, data: Value) -> (String, Value) {
        (name.to_string(), data)
    }

    fn start(&mut self, prompt: &Usage, out: &mut Vec<(String, Value)>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut usage = usage_json(prompt);
        usage["output_tokens"] = json!(0);
        out.push(Self::ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}}),
        ));
    }

    fn close_block(&mut self, out: &mut Vec<(String, Value)>) {
        if let Some((i, _)) = self.open.take() {
            out.push(Self::ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
    }

    /// Makes sure a block of `kind` is open and returns its index.
    fn block(&mut self, kind: &'static str, out: &mut Vec<(String, Value)>) -> usize {
        if let Some((i, k)) = self.open {
            if k == kind {
                return i;
            }
        }
        let block = match kind {
            "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.open_block(kind, block, out)
    }

    /// Closes the open block and starts a new one.
    fn open_block(
        &mut self,
        kind: &'static str,
        block: Value,
        out: &mut Vec<(String, Value)>,
    ) -> usize {
        self.close_block(out);
        let i = self.next_index;
        self.next_index += 1;
        out.push(Self::ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        ));
        if !self.pinged {
            self.pinged = true;
            out.push(Self::ev("ping", json!({"type": "ping"})));
        }
        self.open = Some((i, kind));
        i
    }

    /// Frames (event name, data) for one engine event.
    pub fn step(&mut self, ev: &Event) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        match ev {
            Event::Started {
                prompt_tokens,
                cached_tokens,
                cache_write_tokens,
                cache_write_1h_tokens,
            } => self.start(
                &Usage {
                    prompt_tokens: *prompt_tokens,
                    cached_tokens: *cached_tokens,
                    cache_write_tokens: *cache_write_tokens,
                    cache_write_1h_tokens: *cache_write_1h_tokens,
                    ..Usage::default()
                },
                &mut out,
            ),
            Event::Reasoning { text } => {
                let i = self.block("thinking", &mut out);
                out.push(Self::ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": text}}),
                ));
            }
            Event::Delta { text, .. } => {
                let i = self.block("text", &mut out);
                out.push(Self::ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": text}}),
                ));
            }
            Event::ToolCallStart { name, .. } => {
                let block = json!({"type": "tool_use", "id": run::new_id("toolu_"), "name": name, "input": {}});
                let i = self.open_block("tool_use", block, &mut out);
                self.tool_blocks.push(i);
            }
            Event::ToolCallArgs { index, delta } => {
                if let Some(&i) = self.tool_blocks.get(*index) {
                    out.push(Self::ev(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": delta}}),
                    ));
                }
            }
            Event::Done(c) => {
                if let Some(err) = crate::wire::failed(DIALECT, std::slice::from_ref(c), 1) {
                    let err = err.body(ERRORS);
                    out.push(Self::ev("error", err));
                    return out;
                }
                self.start(&c.usage, &mut out);
                if self.open.is_none() && self.next_index == 0 {
                    self.block("text", &mut out);
                }
                self.close_block(&mut out);
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

fn message_body(id: &str, model: &str, c: &run::Collected) -> Value {
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
    }
    if !c.text.is_empty() || c.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": c.text}));
    }
    for call in &c.tool_calls {
        // `input` is an object; arguments that do not parse (a call cut
        // short by max_tokens) are kept as text rather than dropped.
        let input = match serde_json::from_str::<Value>(&call.arguments) {
            Ok(v @ Value::Object(_)) => v,
            _ => json!({"_raw_arguments": call.arguments}),
        };
        content.push(json!({"type": "tool_use", "id": run::new_id("toolu_"), "name": call.name, "input": input}));
    }
    let c = c.completion();
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content,
        "stop_reason": stop_reason(&c.finish), "stop_sequence": stop_sequence(&c.finish),
        "usage": usage_json(&c.usage),
    })
}

/// Anthropic Messages as an [`run::Adapter`]: what rendering a request needs.
pub struct Messages {
    id: String,
    model: String,
}

impl run::Adapter for Messages {
    type Request = MessagesRequest;
    type Stream = MessagesRenderer;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, req: MessagesRequest, id: String) -> run::Prepared<Self> {
        let job = prepare(served, &req)?;
        Ok((
            job,
            Messages {
                id,
                model: req.model,
            },
        ))
    }

    fn respond(self, _: &Served, collected: Vec<run::Collected>) -> Result<Value, ApiError> {
        let c = collected
            .first()
            .ok_or_else(|| ApiError::internal("no output"))?;
        run::check_failed(DIALECT, std::slice::from_ref(c.completion()), 1)?;
        Ok(message_body(&self.id, &self.model, c))
    }

    fn stream(self, _: Served) -> MessagesRenderer {
        MessagesRenderer::new(self.id, self.model)
    }
}

pub async fn count_tokens(
    State(state): State<AppState>,
    body: Body,
) -> Result<Response, DialectError> {
    let count = async {
        let req: CountRequest = parse(&body)?;
        let state = state.serve(&req.model).await?;
        let tools = tool_request(req.tools.as_ref(), req.tool_choice.as_ref())?;
        let mut images = Images::default();
        let (messages, marks) =
            to_messages(&state, req.system.as_ref(), &req.messages, &mut images)?;
        let tool_marks = tool_marks(req.tools.as_ref())?;
        if marks.len() + tool_marks.len() > MAX_BREAKPOINTS {
            return Err(ApiError::invalid(format!(
                "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
                marks.len() + tool_marks.len()
            )));
        }
        // Tools take prompt space: they are counted as the request would render them.
        // Images too: each counts the positions it takes in this model.
        let prompt = state.chat_prompt(&messages, None, tools.as_ref(), &images)?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": prompt.tokens.len()})).into_response())
    };
    count.await.map_err(|e| e.in_dialect(ERRORS))
}

/// Anthropic Messages's words for the engine's records.
pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&crate::dialect::Described {
    ledger_name: "anthropic.messages",
    short_name: "messages",
    path_prefixes: &["/v1/messages"],
    generation_paths: &["/v1/messages"],
    model_paths: &["/v1/messages", "/v1/messages/count_tokens"],
    error_shape: ERRORS,
    id_prefix: "msg_",
    transport: crate::dialect::Transport {
        framing: crate::sse::Framing::Sse,
        stream_error_event: Some("error"),
        key_headers: &["x-api-key"],
        request_headers: &["x-api-key", "anthropic-version", "anthropic-beta"],
    },
    finish_words: |f| crate::dialect::FinishWords::one(stop_reason(f)),
    usage_json,
    provider_meta,
});

/// What a recorder stores under its reserved keys for a reply.
fn provider_meta(
    p: &mut shoal_client::ProviderMeta,
    finish: Option<&shoal_engine::FinishReason>,
    u: &shoal_engine::Usage,
) {
    // Anthropic reports no reasoning or image tokens, and its
    // `input_tokens` leave out cache reads.
    p.stop_reason = finish.map(|f| DIALECT.finish_words(f));
    p.token_usage_reasoning_tokens = None;
    p.token_usage_image_tokens = None;
    p.token_usage_input_tokens = Some(uncached(u) as u64);
    p.token_usage_cache_creation_tokens = Some(u.cache_write_tokens as u64);
}

/// The dialect as the server registers it: its words and its routes.
pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> axum::Router<crate::state::AppState> {
    use axum::routing::post;
    axum::Router::new()
        .route("/v1/messages", post(run::serve::<Messages>))
        .route("/v1/messages/count_tokens", post(count_tokens))
}
