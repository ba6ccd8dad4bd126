//! OpenAI Chat Completions (`/v1/chat/completions`).
use serde_json::json;

use super::messages;
use super::openai::OpenAi;
use crate::metadata::text;

pub(crate) const CHAT: OpenAi = OpenAi {
    input: |req, b| {
        b.insert("messages".into(), json!(messages(req, false)));
    },
    text: |c| text(c.pointer("/message/content")),
    delta: |c| c.pointer("/delta/content"),
};
