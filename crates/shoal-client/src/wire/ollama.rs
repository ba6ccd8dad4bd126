//! Ollama's `/api/chat`: sampling under `options`, a stream of NDJSON lines
//! whose last (`done: true`) carries the finish (`done_reason`) and the
//! counts (`prompt_eval_count`, `eval_count`, and the two Shoal adds that
//! Ollama's own clients ignore: `prompt_eval_cached_count`,
//! `eval_thinking_count`, `prompt_eval_image_count`).
use serde_json::{json, Map, Value};

use super::{items, limits, messages, Choice, Framing, StreamState, Wire};
use crate::metadata::{count, text, ProviderMeta};
use crate::request::Request;

pub(crate) struct Ollama;

impl Wire for Ollama {
    fn framing(&self) -> Framing {
        Framing::Ndjson
    }
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        b.insert(
            "messages".into(),
            json!(messages(req, false, super::ImageForm::OllamaList)),
        );
        // Ollama streams unless told not to.
        b.insert("stream".into(), json!(stream));
        let mut options = Map::new();
        limits(req, &mut options, "num_predict", "stop");
        if !options.is_empty() {
            b.insert("options".into(), Value::Object(options));
        }
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
        let prompt = count(u.get("prompt_eval_count"));
        let completion = count(u.get("eval_count"));
        m.token_usage_prompt_tokens = prompt;
        m.token_usage_completion_tokens = completion;
        m.token_usage_total_tokens = prompt.zip(completion).map(|(p, c)| p + c);
        m.token_usage_cached_tokens = count(u.get("prompt_eval_cached_count"));
        m.token_usage_reasoning_tokens = count(u.get("eval_thinking_count"));
        m.token_usage_image_tokens = count(u.get("prompt_eval_image_count"));
    }
    /// The counts sit at the top of the closing object; beside an error
    /// (a generation over the time limit), Shoal puts them under `usage`.
    fn usage_in<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        match v.get("prompt_eval_count") {
            Some(_) => Some(v),
            None => v.get("usage").filter(|u| u.is_object()),
        }
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.finish_reason = Some("content_filter".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
        let mut ch = Choice {
            meta: shared,
            ..Choice::default()
        };
        ch.text = text(v.pointer("/message/content")).unwrap_or_default();
        read_calls(v, &mut ch);
        ch.meta.finish_reason = text(v.get("done_reason"));
        vec![ch]
    }
    fn on_event(&self, _kind: &str, v: &Value, s: &mut StreamState) -> bool {
        if let Some(t) = v.pointer("/message/content").and_then(Value::as_str) {
            s.text(0, t);
        }
        read_calls(v, s.first());
        if v.get("done").and_then(Value::as_bool) != Some(true) {
            return false;
        }
        self.read_usage(v, &mut s.shared);
        s.first().meta.finish_reason = text(v.get("done_reason"));
        true
    }
}

/// The tool calls of a message (whole, never split across lines), after any
/// the choice has.
fn read_calls(v: &Value, ch: &mut Choice) {
    for t in items(v.pointer("/message/tool_calls")) {
        let next = ch.tool_calls.len();
        ch.tool_calls.insert(
            next,
            (
                text(t.get("id")).unwrap_or_default(),
                text(t.pointer("/function/name")).unwrap_or_default(),
                t.pointer("/function/arguments")
                    .map(Value::to_string)
                    .unwrap_or_default(),
            ),
        );
    }
}
