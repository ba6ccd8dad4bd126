//! Stream frames as the providers send them: server-sent events (`event:`
//! and `data:` fields, events separated by a blank line, `:` comment lines
//! ignored), or NDJSON (one JSON object a line, Ollama's), read as events
//! with no name.
use futures::{Stream, StreamExt};

/// How a dialect's stream is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events.
    Sse,
    /// One JSON object per line.
    Ndjson,
}

/// One event: its name (if any) and its data lines joined by `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Incremental parser over arbitrary byte chunks.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            self.line(&line, &mut out);
        }
        out
    }

    /// The stream ended: an event without its closing blank line still counts.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.buf.is_empty() {
            let rest = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            self.line(rest.trim_end_matches('\r'), &mut out);
        }
        self.line("", &mut out);
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if !self.data.is_empty() || self.event.is_some() {
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data).join("\n"),
                });
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => self.data.push(value.to_string()),
            _ => {}
        }
    }
}

/// Splits NDJSON into one event a non-empty line.
#[derive(Default)]
pub struct NdjsonParser {
    buf: Vec<u8>,
}

impl NdjsonParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            Self::line(&line, &mut out);
        }
        out
    }

    /// The stream ended: a last line without its newline still counts.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        Self::line(&std::mem::take(&mut self.buf), &mut out);
        out
    }

    fn line(line: &[u8], out: &mut Vec<SseEvent>) {
        let line = String::from_utf8_lossy(line);
        let line = line.trim();
        if !line.is_empty() {
            out.push(SseEvent {
                event: None,
                data: line.to_string(),
            });
        }
    }
}

/// Either parser, as the dialect frames its stream.
enum Parser {
    Sse(SseParser),
    Ndjson(NdjsonParser),
}

impl Parser {
    fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        match self {
            Parser::Sse(p) => p.push(bytes),
            Parser::Ndjson(p) => p.push(bytes),
        }
    }
    fn finish(&mut self) -> Vec<SseEvent> {
        match self {
            Parser::Sse(p) => p.finish(),
            Parser::Ndjson(p) => p.finish(),
        }
    }
}

/// Events from a response body framed as `framing`. A transport error ends
/// the stream with `Err`.
pub fn events(
    body: impl Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    framing: Framing,
) -> impl Stream<Item = Result<SseEvent, String>> {
    let parser = match framing {
        Framing::Sse => Parser::Sse(SseParser::default()),
        Framing::Ndjson => Parser::Ndjson(NdjsonParser::default()),
    };
    futures::stream::unfold(
        (body, parser, std::collections::VecDeque::new(), false),
        |(mut body, mut parser, mut queue, mut ended)| async move {
            loop {
                if let Some(ev) = queue.pop_front() {
                    return Some((Ok(ev), (body, parser, queue, ended)));
                }
                if ended {
                    return None;
                }
                match body.next().await {
                    Some(Ok(chunk)) => queue.extend(parser.push(&chunk)),
                    Some(Err(e)) => {
                        ended = true;
                        return Some((Err(e.to_string()), (body, parser, queue, ended)));
                    }
                    None => {
                        ended = true;
                        queue.extend(parser.finish());
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_lines_split_across_chunks() {
        let mut p = NdjsonParser::default();
        let mut all = p.push(b"{\"a\":1}\n{\"b\"");
        all.extend(p.push(b":2}\r\n\n"));
        all.extend(p.push(b"{\"done\":true}"));
        all.extend(p.finish());
        let data: Vec<&str> = all.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["{\"a\":1}", "{\"b\":2}", "{\"done\":true}"]);
        assert!(all.iter().all(|e| e.event.is_none()));
    }

    #[test]
    fn events_split_across_chunks_with_comments_and_crlf() {
        let mut p = SseParser::default();
        let mut all = p.push(b": keep-alive\n\nevent: message_start\r\ndata: {\"a\"");
        all.extend(p.push(b":1}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]"));
        all.extend(p.finish());
        assert_eq!(
            all,
            vec![
                SseEvent {
                    event: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: None,
                    data: "x\ny".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                },
            ]
        );
    }
}
