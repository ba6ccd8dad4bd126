//! OpenAI legacy Completions (`/v1/completions`): the conversation's texts
//! joined into one prompt.
use serde_json::json;

use super::openai::OpenAi;
use crate::metadata::text;

pub(crate) const COMPLETIONS: OpenAi = OpenAi {
    input: |req, b| {
        let prompt: Vec<&str> = req.messages.iter().map(|m| m.content.as_str()).collect();
        b.insert("prompt".into(), json!(prompt.join("\n")));
    },
    text: |c| text(c.get("text")),
    delta: |c| c.get("text"),
};
