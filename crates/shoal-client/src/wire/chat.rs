//! OpenAI Chat Completions (`/v1/chat/completions`).
use serde_json::json;

use super::openai::OpenAi;
use super::{messages, ImageForm};
use crate::metadata::text;

pub(crate) const CHAT: OpenAi = OpenAi {
    input: |req, b| {
        b.insert(
            "messages".into(),
            json!(messages(req, false, ImageForm::ChatParts)),
        );
    },
    text: |c| text(c.pointer("/message/content")),
    delta: |c| c.pointer("/delta/content"),
};
