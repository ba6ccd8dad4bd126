//! Streams exactly as the official SDKs parse them: server-sent events,
//! and NDJSON for Ollama's clients.
use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// One SSE frame: optional `event:` name and a `data:` payload.
pub fn frame(event: Option<&str>, data: &str) -> String {
    let mut s = String::with_capacity(data.len() + 32);
    if let Some(e) = event {
        s.push_str("event: ");
        s.push_str(e);
        s.push('\n');
    }
    for line in data.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    s
}

/// How a dialect's stream goes on the wire: server-sent events (OpenAI,
/// Anthropic) or one JSON object a line (Ollama).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    Sse,
    Ndjson,
}

impl Framing {
    /// One frame: an SSE event, or the data as one line (NDJSON has no names).
    pub fn frame(self, event: Option<&str>, data: &str) -> String {
        match self {
            Framing::Sse => frame(event, data),
            Framing::Ndjson => format!("{data}\n"),
        }
    }

    /// What an idle stream writes to notice a client that left; NDJSON
    /// clients parse every line as JSON, so it has none.
    pub fn keepalive(self) -> Option<&'static str> {
        match self {
            Framing::Sse => Some(": keep-alive\n\n"),
            Framing::Ndjson => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Framing::Sse => "text/event-stream",
            Framing::Ndjson => "application/x-ndjson",
        }
    }

    /// The framing of a response by its content type; `None`: not a stream.
    pub fn of_content_type(ct: &str) -> Option<Framing> {
        [Framing::Sse, Framing::Ndjson]
            .into_iter()
            .find(|f| ct.starts_with(f.content_type()))
    }
}

/// A streaming response fed by a channel of ready-made SSE frames.
pub fn response(rx: mpsc::UnboundedReceiver<String>) -> Response {
    framed_response(rx, Framing::Sse)
}

/// A streaming response fed by a channel of ready-made frames.
pub fn framed_response(rx: mpsc::UnboundedReceiver<String>, framing: Framing) -> Response {
    let stream = UnboundedReceiverStream::new(rx);
    body_response(
        futures::StreamExt::map(stream, Ok::<_, Infallible>),
        framing,
    )
}

fn body_response<S>(stream: S, framing: Framing) -> Response
where
    S: Stream<Item = Result<String, Infallible>> + Send + 'static,
{
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(framing.content_type()),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
