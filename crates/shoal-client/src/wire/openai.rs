//! What OpenAI's Chat Completions and legacy Completions share: usage names,
//! `n` choices with their finish reasons, the stream's `[DONE]` close.
use serde_json::{json, Map, Value};

use super::{items, limits, Choice, StreamState, Wire};
use crate::metadata::{count, text, ProviderMeta};
use crate::request::Request;

/// Chat Completions or legacy Completions: what differs between the two is
/// data (how the conversation goes in, where a choice's text is).
pub(crate) struct OpenAi {
    /// The conversation into the body (`messages`, or one `prompt`).
    pub input: fn(&Request, &mut Map<String, Value>),
    /// A whole choice's text.
    pub text: fn(&Value) -> Option<String>,
    /// A streamed choice's new text.
    pub delta: fn(&Value) -> Option<&Value>,
}

impl Wire for OpenAi {
    fn has_choices(&self) -> bool {
        true
    }
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        (self.input)(req, b);
        common_body(req, stream, b);
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
        read_chat_usage(u, m);
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.finish_reason = Some("content_filter".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
        parse_choices(v, shared, self.text)
    }
    fn on_event(&self, _kind: &str, v: &Value, s: &mut StreamState) -> bool {
        on_chunk(v, s, self.delta)
    }
}

/// Usage fields at `paths` (prompt, completion, total, cached, reasoning).
pub(crate) fn read_usage(u: &Value, m: &mut ProviderMeta, paths: [&str; 5]) {
    let [prompt, completion, total, cached, reasoning] = paths.map(|p| count(u.pointer(p)));
    m.token_usage_prompt_tokens = prompt;
    m.token_usage_completion_tokens = completion;
    m.token_usage_total_tokens = total;
    m.token_usage_cached_tokens = cached;
    m.token_usage_reasoning_tokens = reasoning;
}

/// Chat's and Completions' usage names.
fn read_chat_usage(u: &Value, m: &mut ProviderMeta) {
    read_usage(
        u,
        m,
        [
            "/prompt_tokens",
            "/completion_tokens",
            "/total_tokens",
            "/prompt_tokens_details/cached_tokens",
            "/completion_tokens_details/reasoning_tokens",
        ],
    );
    m.token_usage_image_tokens = count(u.pointer("/prompt_tokens_details/image_tokens"));
}

/// The fields Chat and Completions share: limits, sampling, `n`, stops and
/// the stream's usage.
fn common_body(req: &Request, stream: bool, b: &mut Map<String, Value>) {
    limits(req, b, "max_tokens", "stop");
    if let Some(n) = req.n {
        b.insert("n".into(), json!(n));
    }
    if stream {
        b.insert("stream".into(), json!(true));
        b.insert("stream_options".into(), json!({"include_usage": true}));
    }
}

/// A whole response's `choices`, in index order; `content` reads a choice's text.
fn parse_choices(
    v: &Value,
    shared: ProviderMeta,
    content: fn(&Value) -> Option<String>,
) -> Vec<Choice> {
    let Some(list) = v.get("choices").and_then(Value::as_array) else {
        return vec![Choice {
            error: Some("response has no 'choices'".into()),
            ..Choice::default()
        }];
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
            ch.text = content(c).unwrap_or_default();
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

/// One stream chunk: usage, each choice's text (at `delta`), tool-call
/// deltas and finish. The stream ends with `[DONE]`, never here.
fn on_chunk(v: &Value, s: &mut StreamState, delta: fn(&Value) -> Option<&Value>) -> bool {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        read_chat_usage(u, &mut s.shared);
    }
    for c in items(v.get("choices")) {
        let index = count(c.get("index")).unwrap_or(0) as usize;
        if let Some(t) = delta(c).and_then(Value::as_str) {
            s.text(index, t);
        }
        let ch = s.choices.entry(index).or_default();
        for t in items(c.pointer("/delta/tool_calls")) {
            let ti = count(t.get("index")).unwrap_or(0) as usize;
            let e = ch.tool_calls.entry(ti).or_default();
            if let Some(id) = text(t.get("id")) {
                e.0 = id;
            }
            if let Some(n) = text(t.pointer("/function/name")) {
                e.1 = n;
            }
            if let Some(a) = t.pointer("/function/arguments").and_then(Value::as_str) {
                e.2.push_str(a);
            }
        }
        if let Some(f) = text(c.get("finish_reason")) {
            ch.meta.finish_reason = Some(f);
        }
    }
    false
}
