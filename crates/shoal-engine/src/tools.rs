//! Tool calls: how a model writes them, parsing them out of the reply as it
//! streams (name first, then argument deltas), and the grammar that forces
//! one when the caller requires it.
use regex::Regex;
use serde_json::{json, Value};

use crate::constraint::{json_layout, Grammar};

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

pub use crate::template::ToolSyntax;

impl ToolSyntax {
    fn args_key(&self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "arguments",
            ToolSyntax::Llama3Json => "parameters",
        }
    }

    /// A call written out, for replaying an earlier assistant turn.
    pub fn render_call(&self, name: &str, arguments: &Value) -> String {
        let obj = json!({"name": name, self.args_key(): arguments});
        match self {
            ToolSyntax::Hermes => format!("<tool_call>\n{obj}\n</tool_call>"),
            ToolSyntax::Llama3Json => obj.to_string(),
        }
    }

    /// The grammar of exactly one call to one of `tools`.
    pub fn forced_call(&self, tools: &[ToolDef]) -> Grammar {
        let key = self.args_key();
        let options: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": t.name},
                        key: t.parameters,
                    },
                    "required": ["name", key],
                    "additionalProperties": false
                })
            })
            .collect();
        let schema = if options.len() == 1 {
            options.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": options })
        };
        let schema = json_layout(schema);
        match self {
            ToolSyntax::Hermes => Grammar::Lark(format!(
                "start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
            )),
            ToolSyntax::Llama3Json => Grammar::JsonSchema(schema),
        }
    }
}

/// System-prompt text that teaches a model without native tool support the
/// Hermes syntax.
pub fn tool_instructions(tools: &[ToolDef]) -> String {
    let mut out = String::from(
        "You can call functions. Their signatures are listed inside <tools></tools>:\n<tools>\n",
    );
    for t in tools {
        let sig = json!({
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters}
        });
        out.push_str(&sig.to_string());
        out.push('\n');
    }
    out.push_str(
        "</tools>\nTo call a function, reply with a JSON object holding its name and arguments \
inside <tool_call></tool_call> tags, like this:\n<tool_call>\n{\"name\": \"function_name\", \
\"arguments\": {\"arg\": \"value\"}}\n</tool_call>",
    );
    out
}

/// What the parser found in a piece of reply text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolOut {
    Text(String),
    Start { index: usize, name: String },
    Args { index: usize, delta: String },
}

enum State {
    /// Ordinary text; `held` may be the start of an opening marker.
    Text,
    /// Inside a call, name not yet known.
    Head,
    /// Name sent; streaming the arguments.
    Args { sent: usize },
}

/// Splits streamed reply text into plain text and tool calls.
pub struct ToolParser {
    syntax: ToolSyntax,
    state: State,
    buf: String,
    calls: usize,
    /// Whether any non-whitespace text has been seen (a bare Llama 3 call
    /// must open the reply).
    seen_text: bool,
    /// Whitespace after a call, held until text follows it (then it is
    /// part of the text) or another call or the end comes (then it was
    /// layout), so the outcome does not depend on how the text was cut.
    held_ws: String,
    /// No text other than whitespace since the last call.
    after_call: bool,
    /// The call in progress is a bare JSON object that opened the reply,
    /// without the Hermes markers (as small Qwen models write it): it ends
    /// with the reply.
    bare: bool,
    /// The bare call opened inside a Markdown code fence (```` ```json ````,
    /// as Qwen models often write it): the fence's opening as written, kept
    /// to give back if the object turns out not to be a call.
    fence: Option<String>,
    /// A fenced call just ended: its closing fence is layout, not text.
    closing_fence: bool,
    head: Regex,
}

/// What the start of a reply says about a code fence around a call.
enum Fence {
    /// Too little text yet to tell.
    Wait,
    /// A `json` (or unnamed) fence whose content opens an object: consumed.
    Call,
    /// Anything else: ordinary text.
    NotCall,
}

const FENCE: &str = "```";

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolParser {
    pub fn new(syntax: ToolSyntax) -> Self {
        let head = Regex::new(&format!(
            r#"^\s*\{{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"{}"\s*:\s*"#,
            syntax.args_key()
        ))
        .unwrap_or_else(|_| unreachable!("static pattern"));
        ToolParser {
            syntax,
            state: State::Text,
            buf: String::new(),
            calls: 0,
            seen_text: false,
            held_ws: String::new(),
            after_call: false,
            bare: false,
            fence: None,
            closing_fence: false,
            head,
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolOut> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.state {
                State::Text => self.text_state(&mut out),
                State::Head => self.head_state(&mut out),
                State::Args { sent } => self.args_state(sent, &mut out, false),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// End of the reply: completes a call in progress, releases held text.
    pub fn finish(&mut self) -> Vec<ToolOut> {
        let mut out = Vec::new();
        match self.state {
            State::Args { sent } => {
                self.args_state(sent, &mut out, true);
            }
            State::Head => {
                let raw = std::mem::take(&mut self.buf);
                match self.syntax {
                    // A bare call may put its arguments first: parse it whole.
                    ToolSyntax::Llama3Json => self.bare_call_at_end(&raw, &mut out),
                    ToolSyntax::Hermes if self.bare => self.bare_call_at_end(&raw, &mut out),
                    // Never became a call: give the text back.
                    ToolSyntax::Hermes => out.push(ToolOut::Text(format!("{OPEN}{raw}"))),
                }
            }
            State::Text => {
                let rest = std::mem::take(&mut self.buf);
                if !(self.closing_fence && FENCE.starts_with(rest.trim())) {
                    self.emit_text(rest, &mut out);
                }
            }
        }
        self.state = State::Text;
        self.held_ws.clear();
        self.bare = false;
        self.fence = None;
        self.closing_fence = false;
        out
    }

    /// The reply ended inside a bare call whose name did not come first:
    /// parse what there is whole, without its closing fence if it had one.
    fn bare_call_at_end(&mut self, raw: &str, out: &mut Vec<ToolOut>) {
        let mut body = raw.trim();
        if self.fence.is_some() {
            body = body.strip_suffix(FENCE).map_or(body, str::trim_end);
        }
        if !self.whole_call(body, out) {
            // Give it back as written, bar the layout around it.
            out.push(ToolOut::Text(match self.fence.take() {
                Some(opening) => format!("{opening}{}", raw.trim_end()),
                None => raw.trim().to_string(),
            }));
        }
    }

    /// At the start of a reply, looks for a code fence whose content is a
    /// JSON object, and consumes the fence's opening if so.
    fn fence_open(&mut self) -> Fence {
        let t = self.buf.trim_start();
        if !t.starts_with(FENCE) {
            return if FENCE.starts_with(t) {
                Fence::Wait
            } else {
                Fence::NotCall
            };
        }
        let Some(nl) = t.find('\n') else {
            // An info string is a word or two; a longer line is no fence.
            return if t.len() < 16 {
                Fence::Wait
            } else {
                Fence::NotCall
            };
        };
        let lang = t[FENCE.len()..nl].trim();
        if !(lang.is_empty() || lang.eq_ignore_ascii_case("json")) {
            return Fence::NotCall;
        }
        let rest = t[nl + 1..].trim_start();
        if rest.is_empty() {
            return Fence::Wait;
        }
        if !rest.starts_with('{') {
            return Fence::NotCall;
        }
        let opening = self.buf.len() - rest.len();
        self.fence = Some(self.buf.drain(..opening).collect());
        Fence::Call
    }

    /// After a fenced call: drops its closing fence. Returns whether to go
    /// on (false: wait for more text).
    fn fence_close(&mut self) -> bool {
        let t = self.buf.trim_start();
        if t.starts_with(FENCE) {
            let end = self.buf.len() - t.len() + FENCE.len();
            self.buf.drain(..end);
        } else if FENCE.starts_with(t) {
            return false;
        }
        self.closing_fence = false;
        true
    }

    /// A reply may open with a bare call, in a code fence or not.
    /// `Some(progressed)` when that decided this step, `None` to go on as text.
    fn bare_open(&mut self) -> Option<bool> {
        let t = self.buf.trim_start();
        if t.is_empty() {
            return Some(false);
        }
        let call = t.starts_with('{')
            || match self.fence_open() {
                Fence::Wait => return Some(false),
                // A fenced call ends where its object closes, in any syntax.
                Fence::Call => {
                    self.bare = true;
                    true
                }
                Fence::NotCall => false,
            };
        call.then(|| {
            self.state = State::Head;
            true
        })
    }

    fn text_state(&mut self, out: &mut Vec<ToolOut>) -> bool {
        if self.closing_fence && !self.fence_close() {
            return false;
        }
        match self.syntax {
            ToolSyntax::Hermes => {
                // A reply that opens with a JSON object may be a bare call.
                if self.calls == 0 && !self.seen_text {
                    if let Some(progressed) = self.bare_open() {
                        self.bare |= matches!(self.state, State::Head);
                        return progressed;
                    }
                }
                if let Some(at) = self.buf.find(OPEN) {
                    let before: String = self.buf[..at].to_string();
                    self.emit_text(before, out);
                    self.held_ws.clear();
                    self.buf.drain(..at + OPEN.len());
                    self.state = State::Head;
                    return true;
                }
                // Hold back what could be the start of the marker.
                let keep = partial_suffix(&self.buf, OPEN);
                let cut = self.buf.len() - keep;
                let before: String = self.buf.drain(..cut).collect();
                self.emit_text(before, out);
                false
            }
            ToolSyntax::Llama3Json => {
                if self.seen_text || self.calls > 0 {
                    let all = std::mem::take(&mut self.buf);
                    self.emit_text(all, out);
                    return false;
                }
                let trimmed = self.buf.trim_start();
                if trimmed.is_empty() {
                    return false;
                }
                if let Some(rest) = trimmed.strip_prefix("<|python_tag|>") {
                    self.buf = rest.to_string();
                    return true;
                }
                if let Some(progressed) = self.bare_open() {
                    return progressed;
                }
                self.seen_text = true;
                true
            }
        }
    }

    fn emit_text(&mut self, text: String, out: &mut Vec<ToolOut>) {
        if text.is_empty() {
            return;
        }
        // Whitespace between or after calls is layout, not content.
        if self.after_call && text.trim().is_empty() {
            self.held_ws.push_str(&text);
            return;
        }
        self.after_call = false;
        let text = if self.held_ws.is_empty() {
            text
        } else {
            std::mem::take(&mut self.held_ws) + &text
        };
        self.seen_text |= !text.trim().is_empty();
        out.push(ToolOut::Text(text));
    }

    fn head_state(&mut self, out: &mut Vec<ToolOut>) -> bool {
        let Some(m) = self.head.captures(&self.buf) else {
            // Not name-first: wait for the whole call, then parse it.
            if self.bare {
                return self.bare_whole(out);
            }
            if self.syntax == ToolSyntax::Hermes {
                if let Some(at) = self.buf.find(CLOSE) {
                    let body: String = self.buf[..at].to_string();
                    self.buf.drain(..at + CLOSE.len());
                    if !self.whole_call(&body, out) {
                        out.push(ToolOut::Text(format!("{OPEN}{body}{CLOSE}")));
                    }
                    self.state = State::Text;
                    return true;
                }
            }
            return false;
        };
        let (Some(all), Some(name)) = (m.get(0), m.get(1)) else {
            return false;
        };
        let name: String = serde_json::from_str(&format!("\"{}\"", name.as_str()))
            .unwrap_or_else(|_| name.as_str().to_string());
        let end = all.end();
        self.buf.drain(..end);
        out.push(ToolOut::Start {
            index: self.calls,
            name,
        });
        self.calls += 1;
        self.after_call = true;
        self.state = State::Args { sent: 0 };
        true
    }

    /// A bare call that is not name-first, once its object has closed:
    /// parsed whole; what follows is text. If the object is no call, it is
    /// given back as written (with its fence) and the reply goes on as text.
    fn bare_whole(&mut self, out: &mut Vec<ToolOut>) -> bool {
        let lead = self.buf.len() - self.buf.trim_start().len();
        let Some(end) = self.buf[lead..]
            .strip_prefix('{')
            .and_then(object_end)
            .map(|e| lead + 1 + e)
        else {
            return false;
        };
        let body: String = self.buf.drain(..=end).collect();
        self.bare = false;
        self.state = State::Text;
        if self.whole_call(body.trim(), out) {
            self.closing_fence = self.fence.take().is_some();
        } else {
            let opening = self.fence.take().unwrap_or_default();
            self.emit_text(format!("{opening}{body}"), out);
        }
        true
    }

    /// Streams argument text, holding back what may be the wrapper's closing
    /// brace and the closing marker.
    fn args_state(&mut self, sent: usize, out: &mut Vec<ToolOut>, at_end: bool) -> bool {
        let index = self.calls - 1;
        if sent == 0 {
            // Whitespace before the arguments is layout.
            let lead = self.buf.len() - self.buf.trim_start().len();
            self.buf.drain(..lead);
        }
        if self.bare && !at_end {
            // A bare call ends where its object closes; what follows is text.
            if let Some(end) = object_end(&self.buf) {
                let limit = self.buf[..end].trim_end().len();
                if limit > sent {
                    out.push(ToolOut::Args {
                        index,
                        delta: self.buf[sent..limit].to_string(),
                    });
                }
                self.buf.drain(..end + 1);
                self.bare = false;
                self.closing_fence = self.fence.take().is_some();
                self.state = State::Text;
                return true;
            }
            let limit = self.buf.trim_end().len();
            if limit > sent {
                out.push(ToolOut::Args {
                    index,
                    delta: self.buf[sent..limit].to_string(),
                });
            }
            self.state = State::Args {
                sent: sent.max(limit),
            };
            return false;
        }
        let close = match self.syntax {
            ToolSyntax::Hermes if !self.bare => self.buf.find(CLOSE),
            _ => None,
        };
        let done = close.is_some() || at_end;
        let body_end = close.unwrap_or(self.buf.len());
        let body = &self.buf[..body_end];
        let limit = if done {
            // The arguments end before the wrapper's last brace.
            let t = body.trim_end();
            t.strip_suffix('}').map_or(t.len(), |s| s.trim_end().len())
        } else {
            let mut t = &body[..body.len() - partial_suffix(body, CLOSE)];
            t = t.trim_end();
            t = t.strip_suffix('}').unwrap_or(t);
            t.trim_end().len()
        };
        if limit > sent {
            out.push(ToolOut::Args {
                index,
                delta: self.buf[sent..limit].to_string(),
            });
        }
        let sent = sent.max(limit);
        if done {
            let drop_to = close.map_or(self.buf.len(), |c| c + CLOSE.len());
            self.buf.drain(..drop_to);
            self.state = State::Text;
            return close.is_some();
        }
        self.state = State::Args { sent };
        false
    }

    /// A call whose name did not come first: parse it whole. False when it
    /// is no call (the caller gives the text back as written).
    fn whole_call(&mut self, body: &str, out: &mut Vec<ToolOut>) -> bool {
        let parsed: Option<(String, Value)> =
            serde_json::from_str::<Value>(body).ok().and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = v
                    .get(self.syntax.args_key())
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                Some((name, args))
            });
        match parsed {
            Some((name, args)) => {
                let index = self.calls;
                self.calls += 1;
                self.after_call = true;
                out.push(ToolOut::Start { index, name });
                out.push(ToolOut::Args {
                    index,
                    delta: args.to_string(),
                });
                true
            }
            None => false,
        }
    }
}

/// Where the object whose opening brace came before `s` closes: the byte
/// index of its `}`, skipping nested objects, arrays and strings.
fn object_end(s: &str) -> Option<usize> {
    let (mut depth, mut in_str, mut escaped) = (1usize, false, false);
    for (i, c) in s.char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| {
            s.len() >= n && s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(syntax: ToolSyntax, pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let mut p = ToolParser::new(syntax);
        let mut outs = Vec::new();
        for piece in pieces {
            outs.extend(p.push(piece));
        }
        outs.extend(p.finish());
        let mut text = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for o in outs {
            match o {
                ToolOut::Text(t) => text.push_str(&t),
                ToolOut::Start { index, name } => {
                    assert_eq!(index, calls.len());
                    calls.push((name, String::new()));
                }
                ToolOut::Args { index, delta } => calls[index].1.push_str(&delta),
            }
        }
        (text, calls)
    }

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
    }

    #[test]
    fn hermes_call_streamed_one_character_at_a_time() {
        let reply = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": {\"n\": 2}}}\n</tool_call>";
        let pieces = chars(reply);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (text, calls) = run(ToolSyntax::Hermes, &refs);
        assert_eq!(text, "Let me check.\n");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].0, "get_weather");
        assert_eq!(calls[0].1, r#"{"city": "Paris", "days": {"n": 2}}"#);
    }

    #[test]
    fn two_calls_and_arguments_first_order() {
        let reply = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"b\"}</tool_call>";
        let (text, calls) = run(ToolSyntax::Hermes, &[reply]);
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![("a".into(), "{}".into()), ("b".into(), r#"{"x":1}"#.into())]
        );
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_kept() {
        let (text, calls) = run(ToolSyntax::Hermes, &["a <tool", "_ca", "t> b <"]);
        assert_eq!(text, "a <tool_cat> b <");
        assert!(calls.is_empty());
        let (text, calls) = run(ToolSyntax::Hermes, &["x <tool_call>not json"]);
        assert_eq!(text, "x <tool_call>not json");
        assert!(calls.is_empty());
    }

    #[test]
    fn llama3_bare_json_call() {
        let reply = "{\"name\": \"lookup\", \"parameters\": {\"q\": \"rust\"}}";
        let pieces = chars(reply);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (text, calls) = run(ToolSyntax::Llama3Json, &refs);
        assert_eq!(text, "");
        assert_eq!(calls, vec![("lookup".into(), r#"{"q": "rust"}"#.into())]);
        let (text, calls) = run(ToolSyntax::Llama3Json, &["Hello {\"name\": 1}"]);
        assert_eq!(text, "Hello {\"name\": 1}");
        assert!(calls.is_empty());
    }

    #[test]
    fn hermes_bare_json_call_opening_the_reply() {
        let reply = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
        let pieces = chars(reply);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (text, calls) = run(ToolSyntax::Hermes, &refs);
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![("get_weather".into(), r#"{"city": "Paris"}"#.into())]
        );
        // Arguments first: parsed whole at the end.
        let (text, calls) = run(ToolSyntax::Hermes, &[r#"{"arguments": {}, "name": "f"}"#]);
        assert_eq!(
            (text.as_str(), calls),
            ("", vec![("f".into(), "{}".into())])
        );
        // The call ends with its object; what follows is text.
        let reply = "{\"name\": \"f\", \"arguments\": {\"s\": \"}\"}}\nDone {x}";
        let pieces = chars(reply);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (text, calls) = run(ToolSyntax::Hermes, &refs);
        assert_eq!(calls, vec![("f".into(), r#"{"s": "}"}"#.into())]);
        assert_eq!(text, "\nDone {x}");
        // JSON that is no call, or a call after text, stays text as written.
        let (text, calls) = run(ToolSyntax::Hermes, &["{\"a\": ", "1}"]);
        assert_eq!((text.as_str(), calls.len()), ("{\"a\": 1}", 0));
        let (text, calls) = run(
            ToolSyntax::Hermes,
            &["Sure: {\"name\": \"f\", \"arguments\": {}}"],
        );
        assert_eq!(text, "Sure: {\"name\": \"f\", \"arguments\": {}}");
        assert!(calls.is_empty());
    }

    #[test]
    fn a_call_in_a_json_code_fence_is_a_call() {
        for syntax in [ToolSyntax::Hermes, ToolSyntax::Llama3Json] {
            let reply = format!(
                "```json\n{{\"name\": \"get_weather\", \"{}\": {{\"city\": \"Paris\"}}}}\n```",
                syntax.args_key()
            );
            for pieces in [chars(&reply), vec![reply.clone()]] {
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                let (text, calls) = run(syntax, &refs);
                assert_eq!(text, "", "{syntax:?}");
                assert_eq!(
                    calls,
                    vec![("get_weather".into(), r#"{"city": "Paris"}"#.into())],
                    "{syntax:?}"
                );
            }
        }
        // An unnamed fence, arguments first, and text after the fence.
        let reply = "\n```\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n```\nDone.";
        let pieces = chars(reply);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (text, calls) = run(ToolSyntax::Hermes, &refs);
        assert_eq!(calls, vec![("f".into(), r#"{"a":1}"#.into())]);
        assert_eq!(text, "\nDone.");
        // The reply ends inside the fence, arguments first: parsed whole.
        let (text, calls) = run(
            ToolSyntax::Hermes,
            &["```json\n{\"arguments\": {}, \"name\": \"f\"", "}\n``"],
        );
        assert_eq!(
            (text.as_str(), calls),
            ("", vec![("f".into(), "{}".into())])
        );
    }

    #[test]
    fn a_code_fence_that_holds_no_call_stays_text() {
        for reply in [
            "```python\nprint({1: 2})\n```",
            "```json\n[1, 2]\n```",
            "``not a fence``",
        ] {
            let pieces = chars(reply);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (text, calls) = run(ToolSyntax::Hermes, &refs);
            assert_eq!((text.as_str(), calls.len()), (reply, 0));
        }
        // A JSON object that is no call is given back with its fence.
        let reply = "```json\n{\"answer\": 42}\n```";
        let (text, calls) = run(ToolSyntax::Hermes, &[reply]);
        assert_eq!((text.as_str(), calls.len()), (reply, 0));
    }

    #[test]
    fn template_decides_the_syntax() {
        assert_eq!(
            ToolSyntax::for_template("{{ '<tool_call>' }}"),
            ToolSyntax::Hermes
        );
        assert_eq!(
            ToolSyntax::for_template("<|python_tag|>"),
            ToolSyntax::Llama3Json
        );
        assert_eq!(ToolSyntax::for_template("<|im_start|>"), ToolSyntax::Hermes);
    }
}

/// Found by fuzzing: whitespace in the text after a call was dropped when
/// it arrived in a piece of its own.
#[cfg(test)]
mod cut_regressions {
    use super::*;

    fn text_of(pieces: &[&str]) -> String {
        let mut p = ToolParser::new(ToolSyntax::Hermes);
        let mut outs = Vec::new();
        for piece in pieces {
            outs.extend(p.push(piece));
        }
        outs.extend(p.finish());
        outs.into_iter()
            .filter_map(|o| match o {
                ToolOut::Text(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn text_after_a_call_keeps_its_whitespace_however_it_is_cut() {
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let whole = format!("hi{call}aa\naa\n");
        assert_eq!(text_of(&[&whole]), "hiaa\naa\n");
        assert_eq!(text_of(&["hi", call, "aa", "\n", "aa", "\n"]), "hiaa\naa\n");
        // Whitespace right after a call, with nothing after it, is layout.
        assert_eq!(text_of(&["hi", call, "\n", " "]), "hi");
        assert_eq!(text_of(&["hi", call, "\n", call, "\n"]), "hi");
    }
}
