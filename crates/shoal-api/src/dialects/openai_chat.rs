//! `POST /v1/chat/completions`.
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_engine::{ChatMessage, Completion, Event, FinishReason, TokenLogprob, Usage};

use super::common::{effort_budget, function_tools, Content, FunctionDef, StreamOptions};
use crate::body::OneOrMany;
use crate::dialects::openai_words::{finish_reason, usage_json};
use crate::dialects::registration::Registered;
use crate::error::{ApiError, ErrorShape};
use crate::images::Images;
use crate::params::{check_max_tokens, check_range, check_stop, OpenAiSampling};
use crate::run::{self, Generation};
use crate::state::Served;
use crate::tools::{self, ToolRequest};
use shoal_engine::Grammar;

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<InMessage>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[serde(flatten)]
    pub sampling: OpenAiSampling,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<OneOrMany<String>>,
    pub user: Option<String>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    pub response_format: Option<ResponseFormat>,
    pub tools: Option<Vec<ChatTool>>,
    pub tool_choice: Option<Value>,
    /// Accepted for compatibility; the model makes at most what it writes.
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's effort levels, mapped to reasoning-token budgets.
    pub reasoning_effort: Option<String>,
    /// Finer control: `{"effort": ..}` or an explicit `{"max_tokens": N}` budget.
    pub reasoning: Option<ReasoningOptions>,
}

run::wire_request!(ChatRequest);

#[derive(Debug, Deserialize)]
pub struct ReasoningOptions {
    pub effort: Option<String>,
    pub max_tokens: Option<i64>,
    pub enabled: Option<bool>,
}

/// Whether (and with what budget) a chat request asked for reasoning.
pub(crate) fn wanted_reasoning(req: &ChatRequest) -> Result<Option<Option<usize>>, ApiError> {
    if let Some(r) = &req.reasoning {
        if r.enabled == Some(false) {
            return Ok(None);
        }
        if let Some(n) = r.max_tokens {
            if n < 1 {
                return Err(ApiError::param(
                    "reasoning",
                    "'reasoning.max_tokens' must be at least 1",
                ));
            }
            return Ok(Some(Some(n as usize)));
        }
        if let Some(e) = &r.effort {
            return effort_budget("reasoning.effort", e);
        }
        return Ok(Some(None));
    }
    match &req.reasoning_effort {
        Some(e) => effort_budget("reasoning_effort", e),
        None => Ok(None),
    }
}

#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub schema: Option<Value>,
    pub description: Option<String>,
    pub strict: Option<bool>,
}

/// `{"type": "function", "function": {...}}`.
#[derive(Debug, Deserialize)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Deserialize)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An earlier assistant turn's calls.
    pub tool_calls: Option<Vec<InToolCall>>,
    /// A tool message answers this call.
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
// Some fields are accepted (and type-checked) for SDK compatibility without
// changing anything here.
#[allow(dead_code)]
pub struct InToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: InFunctionCall,
}

#[derive(Debug, Deserialize)]
pub struct InFunctionCall {
    pub name: String,
    /// JSON text, as the API returned it.
    pub arguments: String,
}

fn logprob_entry(l: &TokenLogprob) -> Value {
    json!({
        "token": l.text, "logprob": l.logprob, "bytes": l.bytes,
        "top_logprobs": l.top.iter().map(|(_, t, lp)| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })
}

/// Renders chunks for one streamed request. Pure: events in, JSON out.
pub struct ChunkRenderer {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub logprobs: bool,
}

impl ChunkRenderer {
    fn chunk(&self, choices: Value) -> Value {
        let mut c = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": choices,
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    pub fn role(&self, index: usize) -> Value {
        self.chunk(json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]))
    }

    pub fn delta(&self, index: usize, text: &str, logprobs: &[TokenLogprob]) -> Value {
        let lp = if self.logprobs {
            json!({"content": logprobs.iter().map(logprob_entry).collect::<Vec<_>>()})
        } else {
            Value::Null
        };
        self.chunk(json!([{"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": null}]))
    }

    pub fn finish(&self, index: usize, f: &FinishReason) -> Value {
        self.chunk(json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": finish_reason(f)}]))
    }

    /// A quiet stream's heartbeat: the first choice still running gets its
    /// opening role chunk if it has not had it (what OpenAI sends first),
    /// else a chunk whose delta is empty, which clients merge as nothing.
    pub fn heartbeat(&self, st: &mut run::ChoiceProgress) -> Option<Value> {
        let i = st.running()?;
        Some(if st.begin(i) {
            self.role(i)
        } else {
            self.chunk(json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": null}]))
        })
    }

    /// The extra usage chunk (only when asked for), after every choice finished.
    pub fn usage(&self, u: &Usage) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": null, "choices": [], "usage": usage_json(u),
        })
    }

    /// The `data:` payloads for a whole scripted stream, `[DONE]` included
    /// (tests over scripted events; the live stream goes step by step).
    #[cfg(test)]
    pub fn render_all(&self, n: usize, events: &[(usize, Event)]) -> Vec<String> {
        let mut st = run::ChoiceProgress::new(n, n);
        let mut out = Vec::new();
        for (i, ev) in events {
            out.extend(self.step(&mut st, *i, ev));
        }
        out
    }

    /// Renders one event; emits the usage chunk and `[DONE]` after the last choice ends.
    pub fn step(&self, st: &mut run::ChoiceProgress, i: usize, ev: &Event) -> Vec<String> {
        let mut out = Vec::new();
        if st.begin(i) {
            out.push(self.role(i).to_string());
        }
        match ev {
            Event::Started { .. } => {}
            Event::Delta { text, logprobs } => out.push(self.delta(i, text, logprobs).to_string()),
            Event::Reasoning { text } => out.push(
                self.chunk(json!([{"index": i, "delta": {"reasoning_content": text}, "logprobs": null, "finish_reason": null}]))
                    .to_string(),
            ),
            Event::ToolCallStart { index, name } => out.push(
                self.chunk(json!([{"index": i, "delta": {"tool_calls": [{
                    "index": index, "id": run::new_id("call_"), "type": "function",
                    "function": {"name": name, "arguments": ""}}]}, "logprobs": null, "finish_reason": null}]))
                    .to_string(),
            ),
            Event::ToolCallArgs { index, delta } => out.push(
                self.chunk(json!([{"index": i, "delta": {"tool_calls": [{
                    "index": index, "function": {"arguments": delta}}]}, "logprobs": null, "finish_reason": null}]))
                    .to_string(),
            ),
            Event::Done(c) => {
                // A failed choice's error waits for the last choice, so it
                // can carry the whole request's usage.
                if !c.finish.is_failure() {
                    out.push(self.finish(i, &c.finish).to_string());
                }
                let usage = self.include_usage.then_some(|u: &Usage| self.usage(u));
                out.extend(st.end(i, c, DIALECT, usage));
            }
        }
        out
    }
}

/// The live chat stream: the renderer and its progress across choices.
pub struct ChatStream {
    pub renderer: ChunkRenderer,
    pub state: run::ChoiceProgress,
}

impl run::StreamRender for ChatStream {
    fn frames(&mut self, choice: usize, ev: &Event) -> run::Step {
        let frames = self.renderer.step(&mut self.state, choice, ev);
        run::Step {
            frames: frames.into_iter().map(|d| (None, d)).collect(),
            last: self.state.all_ended(),
        }
    }

    fn heartbeat(&mut self) -> Vec<(Option<String>, String)> {
        let chunk = self.renderer.heartbeat(&mut self.state);
        chunk.map(|c| (None, c.to_string())).into_iter().collect()
    }
}

fn to_messages(
    state: &Served,
    msgs: &[InMessage],
    images: &mut Images,
) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::param(
            "messages",
            "'messages' must contain at least one message",
        ));
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}].content");
            let text = |required: bool| -> Result<String, ApiError> {
                match &m.content {
                    Some(c) => c.text(&at),
                    None if !required => Ok(String::new()),
                    None => Err(ApiError::param("messages", format!("messages[{i}] has no content"))),
                }
            };
            match m.role.as_str() {
                "developer" => Ok(ChatMessage::new("system", text(true)?)),
                "system" => Ok(ChatMessage::new("system", text(true)?)),
                "user" => match &m.content {
                    Some(c) => Ok(ChatMessage::new("user", c.text_and_images(&at, images)?)),
                    None => Err(ApiError::param("messages", format!("messages[{i}] has no content"))),
                },
                "assistant" => {
                    let calls: Vec<(String, Value)> = m
                        .tool_calls
                        .iter()
                        .flatten()
                        .map(|c| (c.function.name.clone(), tools::arguments_value(&c.function.arguments)))
                        .collect();
                    Ok(state.assistant_with_calls(&text(false)?, &calls))
                }
                "tool" => {
                    if m.tool_call_id.as_deref().is_none_or(str::is_empty) {
                        return Err(ApiError::param(
                            "messages",
                            format!("messages[{i}]: a tool message needs 'tool_call_id'"),
                        ));
                    }
                    Ok(state.tool_result(&text(true)?))
                }
                other => Err(ApiError::param(
                    "messages",
                    format!("messages[{i}].role '{other}' is not one of system, developer, user, assistant, tool"),
                )),
            }
        })
        .collect()
}

/// `tools` and `tool_choice` of a Chat request.
pub(crate) fn tool_request(req: &ChatRequest) -> Result<Option<ToolRequest>, ApiError> {
    let defs = match &req.tools {
        None => Vec::new(),
        Some(list) => function_tools(list.iter().map(|t| (t.kind.as_str(), &t.function)))?,
    };
    let Some(choice) = tools::openai_tool_choice(
        req.tool_choice.as_ref(),
        !defs.is_empty(),
        "/function/name",
        r#"{"type": "function", "function": {"name": ...}}"#,
    )?
    else {
        return Ok(None);
    };
    ToolRequest::new(defs, choice, "tools").map(Some)
}

/// The grammar a `response_format` asks for.
pub(crate) fn format_grammar(f: Option<&ResponseFormat>) -> Result<Option<Grammar>, ApiError> {
    let Some(f) = f else { return Ok(None) };
    match f.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Grammar::JsonObject)),
        "json_schema" => {
            let Some(js) = &f.json_schema else {
                return Err(ApiError::param(
                    "response_format",
                    "response_format 'json_schema' needs a 'json_schema' object",
                ));
            };
            if js.name.is_empty() {
                return Err(ApiError::param(
                    "response_format.json_schema.name",
                    "'response_format.json_schema.name' must not be empty",
                ));
            }
            match &js.schema {
                Some(s @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema(s.clone()))),
                Some(_) => Err(ApiError::param(
                    "response_format.json_schema.schema",
                    "'response_format.json_schema.schema' must be a JSON Schema object",
                )),
                None => Ok(Some(Grammar::JsonObject)),
            }
        }
        other => Err(ApiError::param(
            "response_format",
            format!("unknown response_format type '{other}'"),
        )),
    }
}

/// Validates a request and turns it into an engine job.
fn prepare(state: &Served, req: &mut ChatRequest) -> Result<Generation, ApiError> {
    let tools = tool_request(req)?;
    let format = format_grammar(req.response_format.as_ref())?;
    let max_tokens = match (req.max_completion_tokens, req.max_tokens) {
        (Some(v), _) => check_max_tokens("max_completion_tokens", Some(v))?,
        (None, v) => check_max_tokens("max_tokens", v)?,
    };
    let sampling = req.sampling.params(
        &state.engine.model.defaults.params(),
        req.logprobs.then(|| req.top_logprobs.unwrap_or(0) as usize),
    )?;
    check_range("top_logprobs", req.top_logprobs, 0, 20)?;
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(ApiError::param(
            "top_logprobs",
            "'top_logprobs' requires 'logprobs': true",
        ));
    }
    let mut images = Images::default();
    let messages = to_messages(state, &req.messages, &mut images)?;
    let p = state.chat_prompt(&messages, wanted_reasoning(req)?, tools.as_ref(), &images)?;
    Ok(Generation {
        prompts: vec![p.tokens],
        max_tokens,
        sampling,
        stop: check_stop(req.stop.take())?,
        n: req.sampling.n(),
        cache_breakpoints: Vec::new(),
        images: p.images,
        reasoning: p.reasoning,
        // A required call outranks the reply format.
        grammar: p.grammar.or(format),
        tools: p.tools,
    })
}

/// Chat Completions as an [`run::Adapter`]: what rendering a request needs.
pub struct Chat {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    include_usage: bool,
    n: usize,
}

impl run::Adapter for Chat {
    type Request = ChatRequest;
    type Stream = ChatStream;
    const DIALECT: crate::dialect::Dialect = DIALECT;

    fn prepare(served: &Served, mut req: ChatRequest, id: String) -> run::Prepared<Self> {
        let job = prepare(served, &mut req)?;
        let chat = Chat {
            id,
            created: run::now_secs(),
            model: req.model,
            logprobs: req.logprobs,
            include_usage: req.stream_options.is_some_and(|o| o.include_usage),
            n: job.n,
        };
        Ok((job, chat))
    }

    fn respond(self, _: &Served, collected: Vec<run::Collected>) -> Result<Value, ApiError> {
        let completions: Vec<Completion> =
            collected.iter().map(|c| c.completion().clone()).collect();
        run::check_failed(DIALECT, &completions, self.n)?;
        let out: Vec<Value> = collected
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut message = json!({"role": "assistant", "content": c.text, "refusal": null});
                if !c.reasoning.is_empty() {
                    message["reasoning_content"] = json!(c.reasoning);
                }
                if !c.tool_calls.is_empty() {
                    if c.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = c
                        .tool_calls
                        .iter()
                        .map(|t| json!({"id": run::new_id("call_"), "type": "function",
                                        "function": {"name": t.name, "arguments": t.arguments}}))
                        .collect();
                }
                json!({
                    "index": i,
                    "message": message,
                    "logprobs": if self.logprobs { json!({"content": c.logprobs.iter().map(logprob_entry).collect::<Vec<_>>()}) } else { Value::Null },
                    "finish_reason": finish_reason(&c.completion().finish),
                })
            })
            .collect();
        Ok(json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "system_fingerprint": null, "choices": out,
            "usage": usage_json(&crate::wire::combined_usage(&completions, self.n)),
        }))
    }

    fn stream(self, _: Served) -> ChatStream {
        ChatStream {
            renderer: ChunkRenderer {
                id: self.id,
                created: self.created,
                model: self.model,
                include_usage: self.include_usage,
                logprobs: self.logprobs,
            },
            state: run::ChoiceProgress::new(self.n, self.n),
        }
    }
}

/// OpenAI Chat Completions's words for the engine's records.
pub const DIALECT: crate::dialect::Dialect = crate::dialect::Dialect(&crate::dialect::Described {
    ledger_name: "openai.chat",
    short_name: "chat",
    path_prefixes: &["/v1/chat/completions"],
    generation_paths: &["/v1/chat/completions"],
    model_paths: &["/v1/chat/completions"],
    error_shape: ErrorShape::OPENAI,
    id_prefix: "chatcmpl-",
    transport: crate::dialect::Transport::PLAIN,
    finish_words: |f| {
        crate::dialect::FinishWords::one(crate::dialects::openai_words::finish_reason(f))
    },
    usage_json: crate::dialects::openai_words::usage_json,
    provider_meta: |p, f, _| p.finish_reason = f.map(|f| DIALECT.finish_words(f)),
});

/// The dialect as the server registers it: its words and its routes.
pub const REGISTERED: Registered = Registered::new(DIALECT, routes);

fn routes() -> axum::Router<crate::state::AppState> {
    use axum::routing::post;
    axum::Router::new().route("/v1/chat/completions", post(run::serve::<Chat>))
}
