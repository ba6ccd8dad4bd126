//! OpenAI Chat Completions (`/v1/chat/completions`).
use serde_json::json;

use super::openai::OpenAi;
use super::{messages, Names};
use crate::metadata::text;

pub(crate) const CHAT: OpenAi = OpenAi {
    names: Names {
        name: "chat",
        ledger_name: "openai.chat",
        path: "/v1/chat/completions",
    },
    input: |req, b| {
        b.insert("messages".into(), json!(messages(req, false)));
    },
    text: |c| text(c.pointer("/message/content")),
    delta: |c| c.pointer("/delta/content"),
};
