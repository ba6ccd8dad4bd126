//! OpenAI Responses (`/v1/responses`): one output per response, whose final
//! stream event carries the whole response object.
use serde_json::{json, Map, Value};

use super::{items, limits, messages, openai, Choice, StreamState, Wire};
use crate::metadata::{count, text, ProviderMeta};
use crate::request::Request;

pub(crate) struct Responses;

impl Wire for Responses {
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        b.insert(
            "input".into(),
            json!(messages(req, false, super::ImageForm::ResponsesParts)),
        );
        limits(req, b, "max_output_tokens", "stop");
        if stream {
            b.insert("stream".into(), json!(true));
        }
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
        openai::read_usage(
            u,
            m,
            [
                "/input_tokens",
                "/output_tokens",
                "/total_tokens",
                "/input_tokens_details/cached_tokens",
                "/output_tokens_details/reasoning_tokens",
            ],
        );
        m.token_usage_image_tokens = count(u.pointer("/input_tokens_details/image_tokens"));
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.incomplete_reason = Some("content_filter".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
        vec![self.response_object(v, shared)]
    }
    fn on_event(&self, kind: &str, v: &Value, s: &mut StreamState) -> bool {
        match kind {
            "response.output_text.delta" => {
                let t = v.get("delta").and_then(Value::as_str).unwrap_or("");
                s.text(0, t);
                false
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(r) = v.get("response") {
                    s.final_response = Some(self.response_object(r, ProviderMeta::default()));
                }
                true
            }
            _ => false,
        }
    }
}

impl Responses {
    /// A `response` object (non-streamed, or the final stream event).
    fn response_object(&self, v: &Value, mut meta: ProviderMeta) -> Choice {
        if let Some(u) = self.usage_in(v) {
            self.read_usage(u, &mut meta);
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
}
