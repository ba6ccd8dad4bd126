//! A target: one provider in one dialect. Sends a request (streaming or
//! not) and turns the provider's answer into response pieces whose metadata
//! holds the provider's stop reason and usage; what differs by dialect is
//! its module in `wire/`. Every path — success, content filter, HTTP error,
//! transport error, stream cut short — goes through [`metadata::merge`], so
//! caller-supplied reserved keys never survive.
use futures::StreamExt;
use serde_json::{json, Map, Value};

pub use crate::dialect::Dialect;
use crate::error::{ClientError, Result};
use crate::metadata::{self, text, Price, ProviderMeta};
pub use crate::request::{Message, Request};
use crate::sse;
use crate::wire::{Choice, StreamState, Wire};
pub use shoal_store::{Piece, PieceKind};

/// Where and how to send.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    pub dialect: Dialect,
    /// Server root (`http://127.0.0.1:8421`); a trailing `/v1` is accepted.
    pub base_url: String,
    pub model: String,
    /// Sent as its dialect's SDKs send it (`Authorization: Bearer`, Anthropic's
    /// `x-api-key`); never logged.
    pub api_key: Option<String>,
    pub headers: Vec<(String, String)>,
    pub stream: bool,
    /// Prices for `response_cost_usd`.
    pub price: Option<Price>,
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
        format!("{base}{}", self.cfg.dialect.path())
    }

    fn wire(&self) -> &'static dyn Wire {
        self.cfg.dialect.wire()
    }

    /// The request body in this target's dialect.
    pub fn body(&self, req: &Request) -> Value {
        let mut b = Map::new();
        b.insert("model".into(), json!(self.cfg.model));
        self.wire().body(req, self.cfg.stream, &mut b);
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
        if self.cfg.dialect == Dialect::Completions
            && req.messages.iter().any(|m| !m.images.is_empty())
        {
            let msg = "legacy Completions cannot carry images; send them through Chat, Responses, Messages or Ollama's chat".to_string();
            return self.finish(req, vec![error_choice(msg)], 0);
        }
        let mut rb = self.http.post(&url).json(&self.body(req));
        if let Some(key) = &self.cfg.api_key {
            rb = self.wire().auth(rb, key);
        }
        for (k, v) in self.wire().headers() {
            rb = rb.header(*k, *v);
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
                    ..Piece::default()
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
        // `{"error": {"message": …}}`, or Ollama's `{"error": "…"}`.
        let message = text(err.get("message"))
            .or_else(|| text(Some(err)))
            .unwrap_or_else(|| {
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
            self.wire().mark_filtered(&mut c.meta);
        }
        if let Some(u) = self.wire().usage_in(&v) {
            self.wire().read_usage(u, &mut c.meta);
        }
        c
    }

    /// A non-streamed response body.
    fn parse_body(&self, v: &Value) -> Vec<Choice> {
        let mut shared = ProviderMeta::default();
        if let Some(u) = self.wire().usage_in(v) {
            self.wire().read_usage(u, &mut shared);
        }
        self.wire().parse_body(v, shared)
    }

    /// A streamed response. Whatever arrived is kept if the stream is cut
    /// short; then no finish reason is recorded (it was never reported).
    async fn read_stream(
        &self,
        resp: reqwest::Response,
        on_text: &mut dyn FnMut(usize, &str),
    ) -> Vec<Choice> {
        let wire = self.wire();
        let mut events = Box::pin(sse::events(resp.bytes_stream(), wire.framing()));
        let mut s = StreamState::new(on_text);
        let mut failure: Option<String> = None;
        while let Some(ev) = events.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    failure = Some(format!("stream cut short: {e}"));
                    break;
                }
            };
            if ev.data == "[DONE]" {
                break;
            }
            let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                continue;
            };
            if let Some(e) = v.get("error").filter(|e| {
                !e.is_null() && v.get("type").and_then(Value::as_str) != Some("response.failed")
            }) {
                failure = Some(
                    text(e.get("message"))
                        .or_else(|| text(Some(e)))
                        .unwrap_or_else(|| e.to_string()),
                );
                // A generation that failed (a timeout) still says what it spent.
                if let Some(u) = wire.usage_in(&v) {
                    wire.read_usage(u, &mut s.shared);
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
            if wire.on_event(&kind, &v, &mut s) {
                break;
            }
        }
        let (mut choices, shared, final_response) = s.into_parts();
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
