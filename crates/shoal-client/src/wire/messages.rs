//! Anthropic Messages (`/v1/messages`): the key in `x-api-key`, the system
//! prompt apart, usage whose `input_tokens` leave out cache reads and writes.
use serde_json::{json, Map, Value};

use super::{items, messages, Choice, StreamState, Wire};
use crate::metadata::{count, text, ProviderMeta};
use crate::request::Request;

pub(crate) struct Messages;

impl Wire for Messages {
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        let system: Vec<&str> = req
            .messages
            .iter()
            .filter(|m| m.role == "system")
            .map(|m| m.content.as_str())
            .collect();
        if !system.is_empty() {
            b.insert("system".into(), json!(system.join("\n")));
        }
        b.insert(
            "messages".into(),
            json!(messages(req, true, super::ImageForm::AnthropicBlocks)),
        );
        b.insert("max_tokens".into(), json!(req.max_tokens.unwrap_or(1024)));
        if let Some(t) = req.temperature {
            b.insert("temperature".into(), json!(t));
        }
        if !req.stop.is_empty() {
            b.insert("stop_sequences".into(), json!(req.stop));
        }
        if stream {
            b.insert("stream".into(), json!(true));
        }
    }
    fn auth(&self, rb: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
        rb.header("x-api-key", key)
    }
    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
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
            m.token_usage_total_tokens = m.token_usage_completion_tokens.map(|o| prompt + o);
        }
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.stop_reason = Some("refusal".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
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
    fn on_event(&self, kind: &str, v: &Value, s: &mut StreamState) -> bool {
        match kind {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.read_usage(u, &mut s.shared);
                }
            }
            "content_block_start" => {
                let i = count(v.get("index")).unwrap_or(0) as usize;
                if v.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use") {
                    s.first().tool_calls.insert(
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
                        s.text(0, t);
                    }
                    Some("input_json_delta") => {
                        if let Some(t) = s.first().tool_calls.get_mut(&i) {
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
                let ch = s.first();
                ch.meta.stop_reason = text(v.pointer("/delta/stop_reason"));
                ch.meta.stop_sequence = text(v.pointer("/delta/stop_sequence"));
                if let Some(u) = v.get("usage") {
                    // Later counts replace earlier ones; absent ones keep them.
                    self.read_usage(u, &mut s.shared);
                }
            }
            "message_stop" => return true,
            _ => {}
        }
        false
    }
}
