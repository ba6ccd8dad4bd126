//! OpenAI Chat Completions (`/v1/chat/completions`).
use serde_json::{json, Map, Value};

use super::{messages, openai, Choice, StreamState, Wire};
use crate::metadata::{text, ProviderMeta};
use crate::request::Request;

pub(crate) struct Chat;

impl Wire for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }
    fn ledger_name(&self) -> &'static str {
        "openai.chat"
    }
    fn path(&self) -> &'static str {
        "/v1/chat/completions"
    }
    fn has_choices(&self) -> bool {
        true
    }
    fn body(&self, req: &Request, stream: bool, b: &mut Map<String, Value>) {
        b.insert("messages".into(), json!(messages(req, false)));
        openai::common_body(req, stream, b);
    }
    fn read_usage(&self, u: &Value, m: &mut ProviderMeta) {
        openai::read_chat_usage(u, m);
    }
    fn mark_filtered(&self, m: &mut ProviderMeta) {
        m.finish_reason = Some("content_filter".into());
    }
    fn parse_body(&self, v: &Value, shared: ProviderMeta) -> Vec<Choice> {
        openai::parse_choices(v, shared, |c| text(c.pointer("/message/content")))
    }
    fn on_event(
        &self,
        _kind: &str,
        v: &Value,
        s: &mut StreamState,
        on_text: &mut dyn FnMut(usize, &str),
    ) -> bool {
        openai::on_chunk(v, s, |c| c.pointer("/delta/content"), on_text)
    }
}
