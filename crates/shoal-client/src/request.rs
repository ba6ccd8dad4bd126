//! What a caller asks a target to send, in no dialect's words.
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::metadata::Metadata;

/// One conversation turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// What to send.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub messages: Vec<Message>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    /// Choices (the dialects that have them: Chat and Completions).
    pub n: Option<u32>,
    pub stop: Vec<String>,
    /// Caller metadata, merged into every response piece (reserved keys removed).
    pub metadata: Metadata,
    /// Extra body fields passed through as given.
    pub extra: Map<String, Value>,
}
