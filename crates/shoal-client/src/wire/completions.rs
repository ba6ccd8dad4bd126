//! OpenAI legacy Completions (`/v1/completions`): the conversation's texts
//! joined into one prompt.
use serde_json::{json, Map, Value};

use super::{openai, Choice, StreamState, Wire};
use crate::metadata::{text, ProviderMeta};
use crate::request::Request;

pub(crate) struct Completions;

impl Wire for Completions {
    fn name(&self) -> &'static str {
        "completions"
    }
    fn ledger_name(&self) -> &'static str {
        "openai.completions"
    }
    fn path(&self) -> &'static str {
        "/v1/completions"
    }
    fn has_choices(&self) -> bool {
        true
    }
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        let prompt: Vec<&str> = req.messages.iter().map(|m| m.content.as_str()).collect();
        b.insert("prompt".into(), json!(prompt.join("\n")));
        openai::common_body(req, stream, b);
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
        openai::read_chat_usage(u, m);
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.finish_reason = Some("content_filter".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
        openai::parse_choices(v, shared, |c| text(c.get("text")))
    }
    fn on_event(
        &self,
        _kind: &str,
        v: &Value,
        s: &mut StreamState,
        on_text: &mut dyn FnMut(usize, &str),
    ) -> bool {
        openai::on_chunk(v, s, |c| c.get("text"), on_text)
    }
}
