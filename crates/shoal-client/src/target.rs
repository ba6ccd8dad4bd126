//! One target per API dialect: builds the request, sends it (streaming or
//! not), and turns the provider's answer into response pieces whose
//! metadata holds the provider's stop reason and usage. Every path — success,
//! content filter, HTTP error, transport error, stream cut short — goes
//! through [`metadata::merge`], so caller-supplied reserved keys never survive.
use std::collections::BTreeMap;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{ClientError, Result};
use crate::metadata::{self, count, text, Metadata, Price, ProviderMeta};
use crate::sse;
pub use shoal_store::{Piece, PieceKind};

/// The API a target speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI (legacy) Completions.
    Completions,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 4] = [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Responses,
        Dialect::Messages,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "chat" => Some(Dialect::Chat),
            "completions" => Some(Dialect::Completions),
            "responses" => Some(Dialect::Responses),
            "messages" => Some(Dialect::Messages),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Chat => "chat",
            Dialect::Completions => "completions",
            Dialect::Responses => "responses",
            Dialect::Messages => "messages",
        }
    }

    /// The name a server's usage ledger, metrics and logs give the dialect.
    pub fn ledger_name(self) -> &'static str {
        match self {
            Dialect::Chat => "openai.chat",
            Dialect::Completions => "openai.completions",
            Dialect::Responses => "openai.responses",
            Dialect::Messages => "anthropic.messages",
        }
    }

    /// The dialect a request path belongs to (`/v1/messages/count_tokens`
    /// is Anthropic's too); `None` for paths of no dialect.
    pub fn for_path(path: &str) -> Option<Self> {
        let rest = path.strip_prefix("/v1/")?;
        let head = |p: &str| rest == p || rest.starts_with(&format!("{p}/"));
        Dialect::ALL.into_iter().find(|d| head(d.path()))
    }

    /// Whether errors in this dialect take Anthropic's shape.
    pub fn is_anthropic(self) -> bool {
        self == Dialect::Messages
    }
    /// Reads a usage object in this dialect's field names onto the typed
    /// capture; fields not reported stay `None`.
    pub fn read_usage(self, u: &Value, m: &mut ProviderMeta) {
        match self {
            // The two OpenAI shapes differ only in names:
            // [prompt, completion, total, cached, reasoning].
            Dialect::Chat | Dialect::Completions => read_openai_usage(
                u,
                m,
                [
                    "/prompt_tokens",
                    "/completion_tokens",
                    "/total_tokens",
                    "/prompt_tokens_details/cached_tokens",
                    "/completion_tokens_details/reasoning_tokens",
                ],
            ),
            Dialect::Responses => read_openai_usage(
                u,
                m,
                [
                    "/input_tokens",
                    "/output_tokens",
                    "/total_tokens",
                    "/input_tokens_details/cached_tokens",
                    "/output_tokens_details/reasoning_tokens",
                ],
            ),
            Dialect::Messages => {
                // `input_tokens` excludes cache reads and writes; the prompt is all three.
                let input = count(u.get("input_tokens"));
                let read = count(u.get("cache_read_input_tokens"));
                let created = count(u.get("cache_creation_input_tokens"));
                let output = count(u.get("output_tokens"));
                if input.is_some() {
                    m.token_usage_input_tokens = input;
                }
                if read.is_some() {
                    m.token_usage_cached_tokens = read;
                }
                if created.is_some() {
                    m.token_usage_cache_creation_tokens = created;
                }
                if output.is_some() {
                    m.token_usage_completion_tokens = output;
                }
                if let Some(i) = m.token_usage_input_tokens {
                    let prompt = i
                        + m.token_usage_cached_tokens.unwrap_or(0)
                        + m.token_usage_cache_creation_tokens.unwrap_or(0);
                    m.token_usage_prompt_tokens = Some(prompt);
                    m.token_usage_total_tokens =
                        m.token_usage_completion_tokens.map(|o| prompt + o);
                }
            }
        }
    }

    fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "chat/completions",
            Dialect::Completions => "completions",
            Dialect::Responses => "responses",
            Dialect::Messages => "messages",
        }
    }
}

/// Usage fields at `paths` (prompt, completion, total, cached, reasoning).
fn read_openai_usage(u: &Value, m: &mut ProviderMeta, paths: [&str; 5]) {
    let [prompt, completion, total, cached, reasoning] = paths.map(|p| count(u.pointer(p)));
    m.token_usage_prompt_tokens = prompt;
    m.token_usage_completion_tokens = completion;
    m.token_usage_total_tokens = total;
    m.token_usage_cached_tokens = cached;
    m.token_usage_reasoning_tokens = reasoning;
}

/// Where and how to send.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    pub dialect: Dialect,
    /// Server root (`http://127.0.0.1:8421`); a trailing `/v1` is accepted.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer` (OpenAI) or `x-api-key` (Anthropic); never logged.
    pub api_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub stream: bool,
    /// Prices for `response_cost_usd`.
    pub price: Option<Price>,
}

/// One conversation turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// What to send.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub messages: Vec<Message>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    /// Choices (Chat and Completions only).
    pub n: Option<u32>,
    pub stop: Vec<String>,
    /// Caller metadata, merged into every response piece (reserved keys removed).
    pub metadata: Metadata,
    /// Extra body fields passed through as given.
    pub extra: Map<String, Value>,
}

/// The pieces of one response, and the HTTP status (0 if none arrived).
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub pieces: Vec<Piece>,
    pub http_status: u16,
}

/// A configured target.
pub struct Target {
    cfg: TargetConfig,
    http: reqwest::Client,
}

/// What a parse found before metadata is merged, per choice.
#[derive(Default, Debug)]
struct Choice {
    text: String,
    tool_calls: BTreeMap<usize, (String, String, String)>,
    meta: ProviderMeta,
    error: Option<String>,
}

impl Target {
    pub fn new(cfg: TargetConfig) -> Result<Self> {
        if !(cfg.base_url.starts_with("http://") || cfg.base_url.starts_with("https://")) {
            return Err(ClientError::Config(format!(
                "base URL must start with http:// or https://, got '{}'",
                cfg.base_url
            )));
        }
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        Ok(Target { cfg, http })
    }

    /// The full endpoint URL.
    pub fn url(&self) -> String {
        let base = self.cfg.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/{}", self.cfg.dialect.path())
    }

    /// The request body in this target's dialect.
    pub fn body(&self, req: &Request) -> Value {
        let mut b = Map::new();
        b.insert("model".into(), json!(self.cfg.model));
        let msgs = |skip_system: bool| -> Vec<Value> {
            req.messages
                .iter()
                .filter(|m| !(skip_system && m.role == "system"))
                .map(|m| json!({"role": m.role, "content": m.content}))
                .collect()
        };
        match self.cfg.dialect {
            Dialect::Chat => {
                b.insert("messages".into(), json!(msgs(false)));
                if let Some(n) = req.max_tokens {
                    b.insert("max_tokens".into(), json!(n));
                }
            }
            Dialect::Completions => {
                let prompt: Vec<&str> = req.messages.iter().map(|m| m.content.as_str()).collect();
                b.insert("prompt".into(), json!(prompt.join("\n")));
                if let Some(n) = req.max_tokens {
                    b.insert("max_tokens".into(), json!(n));
                }
            }
            Dialect::Responses => {
                b.insert("input".into(), json!(msgs(false)));
                if let Some(n) = req.max_tokens {
                    b.insert("max_output_tokens".into(), json!(n));
                }
            }
            Dialect::Messages => {
                let system: Vec<&str> = req
                    .messages
                    .iter()
                    .filter(|m| m.role == "system")
                    .map(|m| m.content.as_str())
                    .collect();
                if !system.is_empty() {
                    b.insert("system".into(), json!(system.join("\n")));
                }
                b.insert("messages".into(), json!(msgs(true)));
                b.insert("max_tokens".into(), json!(req.max_tokens.unwrap_or(1024)));
            }
        }
        if let Some(t) = req.temperature {
            b.insert("temperature".into(), json!(t));
        }
        if let Some(n) = req
            .n
            .filter(|_| matches!(self.cfg.dialect, Dialect::Chat | Dialect::Completions))
        {
            b.insert("n".into(), json!(n));
        }
        if !req.stop.is_empty() {
            let key = if self.cfg.dialect == Dialect::Messages {
                "stop_sequences"
            } else {
                "stop"
            };
            b.insert(key.into(), json!(req.stop));
        }
        if self.cfg.stream {
            b.insert("stream".into(), json!(true));
            if matches!(self.cfg.dialect, Dialect::Chat | Dialect::Completions) {
                b.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
        for (k, v) in &req.extra {
            b.insert(k.clone(), v.clone());
        }
        Value::Object(b)
    }

    /// Sends `req`. Failures of the call itself come back as an error piece
    /// (with the caller's metadata, reserved keys cleared) so they can be stored.
    pub async fn send(&self, req: &Request) -> Reply {
        self.send_streaming(req, &mut |_, _| {}).await
    }

    /// Like [`send`](Self::send), calling `on_text(choice, text)` as reply
    /// text arrives (streaming targets), e.g. to print it live.
    pub async fn send_streaming(
        &self,
        req: &Request,
        on_text: &mut dyn FnMut(usize, &str),
    ) -> Reply {
        let url = self.url();
        let mut rb = self.http.post(&url).json(&self.body(req));
        if let Some(key) = &self.cfg.api_key {
            rb = match self.cfg.dialect {
                Dialect::Messages => rb.header("x-api-key", key),
                _ => rb.bearer_auth(key),
            };
        }
        if self.cfg.dialect == Dialect::Messages {
            rb = rb.header("anthropic-version", "2023-06-01");
        }
        for (k, v) in &self.cfg.headers {
            rb = rb.header(k, v);
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => {
                let msg = format!("request to {url} failed: {e}");
                return self.finish(req, vec![error_choice(msg)], 0);
            }
        };
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            let body = resp.text().await.unwrap_or_default();
            return self.finish(req, vec![self.http_error(status, &body)], status);
        }
        let choices = if self.cfg.stream {
            self.read_stream(resp, on_text).await
        } else {
            match resp.json::<Value>().await {
                Ok(v) => self.parse_body(&v),
                Err(e) => vec![error_choice(format!("unreadable response body: {e}"))],
            }
        };
        self.finish(req, choices, status)
    }

    /// Merges metadata into pieces and prices them.
    fn finish(&self, req: &Request, choices: Vec<Choice>, status: u16) -> Reply {
        let pieces = choices
            .into_iter()
            .map(|mut c| {
                if let Some(p) = &self.cfg.price {
                    c.meta.price(p);
                }
                let mut metadata = metadata::merge(&req.metadata, &c.meta);
                if status != 0 {
                    metadata.insert("http_status".into(), json!(status));
                }
                let kind = if c.error.is_some() {
                    PieceKind::Error
                } else {
                    PieceKind::Text
                };
                if let Some(e) = &c.error {
                    metadata.insert("error".into(), json!(e));
                }
                Piece {
                    kind,
                    text: c.text,
                    tool_calls: c
                        .tool_calls
                        .into_values()
                        .map(|(id, name, args)| json!({"id": id, "name": name, "arguments": args}))
                        .collect(),
                    metadata,
                }
            })
            .collect();
        Reply {
            pieces,
            http_status: status,
        }
    }

    /// An HTTP error. A content-filter refusal still says so; any usage the
    /// body reports beside the error (a refusal's, or a generation that
    /// timed out or failed) is kept.
    fn http_error(&self, status: u16, body: &str) -> Choice {
        let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let err = v.get("error").unwrap_or(&Value::Null);
        let message = text(err.get("message")).unwrap_or_else(|| {
            format!(
                "HTTP {status}: {}",
                body.chars().take(300).collect::<String>()
            )
        });
        let mut c = error_choice(message);
        let filtered = |e: &Value| {
            text(e.get("code")).as_deref() == Some("content_filter")
                || text(e.pointer("/innererror/code")).as_deref()
                    == Some("ResponsibleAIPolicyViolation")
                || text(e.get("type")).as_deref() == Some("content_filter")
        };
        if status == 400 && filtered(err) {
            match self.cfg.dialect {
                Dialect::Chat | Dialect::Completions => {
                    c.meta.finish_reason = Some("content_filter".into())
                }
                Dialect::Responses => c.meta.incomplete_reason = Some("content_filter".into()),
                Dialect::Messages => c.meta.stop_reason = Some("refusal".into()),
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage(u, &mut c.meta);
        }
        c
    }

    /// Usage in this dialect's field names, onto the typed capture.
    fn usage(&self, u: &Value, m: &mut ProviderMeta) {
        self.cfg.dialect.read_usage(u, m);
    }

    /// A non-streamed response body.
    fn parse_body(&self, v: &Value) -> Vec<Choice> {
        let mut shared = ProviderMeta::default();
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage(u, &mut shared);
        }
        match self.cfg.dialect {
            Dialect::Chat | Dialect::Completions => {
                let Some(list) = v.get("choices").and_then(Value::as_array) else {
                    return vec![error_choice("response has no 'choices'".into())];
                };
                let mut out: Vec<(usize, Choice)> = list
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let index = count(c.get("index")).map_or(i, |x| x as usize);
                        let mut ch = Choice {
                            meta: shared.clone(),
                            ..Choice::default()
                        };
                        ch.meta.finish_reason = text(c.get("finish_reason"));
                        ch.text = match self.cfg.dialect {
                            Dialect::Chat => {
                                text(c.pointer("/message/content")).unwrap_or_default()
                            }
                            _ => text(c.get("text")).unwrap_or_default(),
                        };
                        for (j, t) in items(c.pointer("/message/tool_calls")).enumerate() {
                            ch.tool_calls.insert(
                                j,
                                (
                                    text(t.get("id")).unwrap_or_default(),
                                    text(t.pointer("/function/name")).unwrap_or_default(),
                                    text(t.pointer("/function/arguments")).unwrap_or_default(),
                                ),
                            );
                        }
                        (index, ch)
                    })
                    .collect();
                out.sort_by_key(|(i, _)| *i);
                out.into_iter().map(|(_, c)| c).collect()
            }
            Dialect::Responses => vec![self.parse_response_object(v, shared)],
            Dialect::Messages => {
                let mut ch = Choice {
                    meta: shared,
                    ..Choice::default()
                };
                ch.meta.stop_reason = text(v.get("stop_reason"));
                ch.meta.stop_sequence = text(v.get("stop_sequence"));
                for (j, b) in items(v.get("content")).enumerate() {
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => ch
                            .text
                            .push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                        Some("tool_use") => {
                            ch.tool_calls.insert(
                                j,
                                (
                                    text(b.get("id")).unwrap_or_default(),
                                    text(b.get("name")).unwrap_or_default(),
                                    b.get("input").map(Value::to_string).unwrap_or_default(),
                                ),
                            );
                        }
                        _ => {}
                    }
                }
                vec![ch]
            }
        }
    }

    /// A Responses `response` object (non-streamed, or the final stream event).
    fn parse_response_object(&self, v: &Value, mut meta: ProviderMeta) -> Choice {
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage(u, &mut meta);
        }
        meta.status = text(v.get("status"));
        meta.incomplete_reason = text(v.pointer("/incomplete_details/reason"));
        let mut ch = Choice {
            meta,
            ..Choice::default()
        };
        for (j, item) in items(v.get("output")).enumerate() {
            match item.get("type").and_then(Value::as_str) {
                Some("message") => {
                    for part in items(item.get("content")) {
                        if part.get("type").and_then(Value::as_str) == Some("output_text") {
                            ch.text
                                .push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                        }
                    }
                }
                Some("function_call") => {
                    ch.tool_calls.insert(
                        j,
                        (
                            text(item.get("call_id")).unwrap_or_default(),
                            text(item.get("name")).unwrap_or_default(),
                            text(item.get("arguments")).unwrap_or_default(),
                        ),
                    );
                }
                _ => {}
            }
        }
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            ch.error = Some(text(e.get("message")).unwrap_or_else(|| e.to_string()));
        }
        ch
    }

    /// A streamed response. Whatever arrived is kept if the stream is cut
    /// short; then no finish reason is recorded (it was never reported).
    async fn read_stream(
        &self,
        resp: reqwest::Response,
        on_text: &mut dyn FnMut(usize, &str),
    ) -> Vec<Choice> {
        let mut events = Box::pin(sse::events(resp.bytes_stream()));
        let mut choices: BTreeMap<usize, Choice> = BTreeMap::new();
        let mut shared = ProviderMeta::default();
        let mut final_response: Option<Choice> = None;
        let mut failure: Option<String> = None;
        let mut finished = false;
        while let Some(ev) = events.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    failure = Some(format!("stream cut short: {e}"));
                    break;
                }
            };
            if ev.data == "[DONE]" {
                finished = true;
                break;
            }
            let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                continue;
            };
            if let Some(e) = v.get("error").filter(|e| {
                !e.is_null() && v.get("type").and_then(Value::as_str) != Some("response.failed")
            }) {
                failure = Some(text(e.get("message")).unwrap_or_else(|| e.to_string()));
                // A generation that failed (a timeout) still says what it spent.
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage(u, &mut shared);
                }
                break;
            }
            // The event's name: the SSE `event:` line, else the JSON `type`
            // (Responses and Messages streams name every event).
            let kind = ev
                .event
                .clone()
                .or_else(|| text(v.get("type")))
                .unwrap_or_default();
            match self.cfg.dialect {
                Dialect::Chat | Dialect::Completions => {
                    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                        self.usage(u, &mut shared);
                    }
                    for c in items(v.get("choices")) {
                        let index = count(c.get("index")).unwrap_or(0) as usize;
                        let ch = choices.entry(index).or_default();
                        let piece = match self.cfg.dialect {
                            Dialect::Chat => c.pointer("/delta/content"),
                            _ => c.get("text"),
                        };
                        if let Some(t) = piece.and_then(Value::as_str) {
                            ch.text.push_str(t);
                            on_text(index, t);
                        }
                        for t in items(c.pointer("/delta/tool_calls")) {
                            let ti = count(t.get("index")).unwrap_or(0) as usize;
                            let e = ch.tool_calls.entry(ti).or_default();
                            if let Some(id) = text(t.get("id")) {
                                e.0 = id;
                            }
                            if let Some(n) = text(t.pointer("/function/name")) {
                                e.1 = n;
                            }
                            if let Some(a) =
                                t.pointer("/function/arguments").and_then(Value::as_str)
                            {
                                e.2.push_str(a);
                            }
                        }
                        if let Some(f) = text(c.get("finish_reason")) {
                            ch.meta.finish_reason = Some(f);
                        }
                    }
                }
                Dialect::Responses => match kind.as_str() {
                    "response.output_text.delta" => {
                        let ch = choices.entry(0).or_default();
                        let t = v.get("delta").and_then(Value::as_str).unwrap_or("");
                        ch.text.push_str(t);
                        on_text(0, t);
                    }
                    "response.completed" | "response.incomplete" | "response.failed" => {
                        if let Some(r) = v.get("response") {
                            final_response =
                                Some(self.parse_response_object(r, ProviderMeta::default()));
                        }
                        finished = true;
                    }
                    _ => {}
                },
                Dialect::Messages => {
                    let ch = choices.entry(0).or_default();
                    match kind.as_str() {
                        "message_start" => {
                            if let Some(u) = v.pointer("/message/usage") {
                                self.usage(u, &mut shared);
                            }
                        }
                        "content_block_start" => {
                            let i = count(v.get("index")).unwrap_or(0) as usize;
                            if v.pointer("/content_block/type").and_then(Value::as_str)
                                == Some("tool_use")
                            {
                                ch.tool_calls.insert(
                                    i,
                                    (
                                        text(v.pointer("/content_block/id")).unwrap_or_default(),
                                        text(v.pointer("/content_block/name")).unwrap_or_default(),
                                        String::new(),
                                    ),
                                );
                            }
                        }
                        "content_block_delta" => {
                            let i = count(v.get("index")).unwrap_or(0) as usize;
                            match v.pointer("/delta/type").and_then(Value::as_str) {
                                Some("text_delta") => {
                                    let t = v
                                        .pointer("/delta/text")
                                        .and_then(Value::as_str)
                                        .unwrap_or("");
                                    ch.text.push_str(t);
                                    on_text(0, t);
                                }
                                Some("input_json_delta") => {
                                    if let Some(t) = ch.tool_calls.get_mut(&i) {
                                        t.2.push_str(
                                            v.pointer("/delta/partial_json")
                                                .and_then(Value::as_str)
                                                .unwrap_or(""),
                                        );
                                    }
                                }
                                _ => {}
                            }
                        }
                        "message_delta" => {
                            ch.meta.stop_reason = text(v.pointer("/delta/stop_reason"));
                            ch.meta.stop_sequence = text(v.pointer("/delta/stop_sequence"));
                            if let Some(u) = v.get("usage") {
                                // Later counts replace earlier ones; absent ones keep them.
                                self.usage(u, &mut shared);
                            }
                        }
                        "message_stop" => finished = true,
                        _ => {}
                    }
                }
            }
            if finished
                && self.cfg.dialect != Dialect::Chat
                && self.cfg.dialect != Dialect::Completions
            {
                break;
            }
        }
        let _ = finished;
        if let Some(mut r) = final_response {
            // Text from the final object is authoritative; deltas are a fallback.
            if r.text.is_empty() {
                if let Some(c) = choices.get(&0) {
                    r.text = c.text.clone();
                }
            }
            r.error = r.error.or(failure);
            return vec![r];
        }
        if choices.is_empty() {
            choices.insert(0, Choice::default());
        }
        choices
            .into_values()
            .map(|mut c| {
                let finish = std::mem::take(&mut c.meta);
                c.meta = merge_meta(&shared, finish);
                if let Some(f) = &failure {
                    c.error = Some(f.clone());
                }
                c
            })
            .collect()
    }
}

/// The first model a server lists at `GET /v1/models` (for a local server
/// used without naming a model).
pub async fn first_model(base_url: &str, api_key: Option<&str>) -> Result<String> {
    let base = base_url.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    let url = format!("{base}/v1/models");
    let mut rb = reqwest::Client::new().get(&url);
    if let Some(k) = api_key {
        rb = rb.bearer_auth(k);
    }
    let transport = |e: reqwest::Error| ClientError::Transport {
        url: url.clone(),
        message: e.to_string(),
    };
    let v: Value = rb
        .send()
        .await
        .map_err(transport)?
        .json()
        .await
        .map_err(transport)?;
    text(v.pointer("/data/0/id"))
        .ok_or_else(|| ClientError::Protocol(format!("{url} lists no models")))
}

/// Usage (shared by all choices) plus a choice's own stop fields.
/// The elements of an array field; none where it is missing or not an array.
fn items(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}

fn merge_meta(shared: &ProviderMeta, own: ProviderMeta) -> ProviderMeta {
    let mut m = shared.clone();
    m.finish_reason = own.finish_reason.or(m.finish_reason);
    m.stop_reason = own.stop_reason.or(m.stop_reason);
    m.stop_sequence = own.stop_sequence.or(m.stop_sequence);
    m
}

fn error_choice(message: String) -> Choice {
    Choice {
        error: Some(message),
        ..Choice::default()
    }
}

#[cfg(test)]
mod tests {
    use super::Dialect;

    #[test]
    fn a_request_path_names_its_dialect() {
        let cases = [
            ("/v1/chat/completions", Some(Dialect::Chat)),
            ("/v1/completions", Some(Dialect::Completions)),
            ("/v1/responses", Some(Dialect::Responses)),
            ("/v1/responses/resp_1", Some(Dialect::Responses)),
            ("/v1/messages", Some(Dialect::Messages)),
            ("/v1/messages/count_tokens", Some(Dialect::Messages)),
            ("/v1/messagesx", None),
            ("/v1/models", None),
            ("/health", None),
        ];
        for (path, want) in cases {
            assert_eq!(Dialect::for_path(path), want, "{path}");
        }
        assert_eq!(Dialect::Messages.ledger_name(), "anthropic.messages");
        assert!(Dialect::Messages.is_anthropic() && !Dialect::Chat.is_anthropic());
    }
}
