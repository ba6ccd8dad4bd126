//! What a caller asks a target to send, in no dialect's words.
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::metadata::Metadata;

/// One conversation turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// Images sent with a user turn, after its text; each dialect writes
    /// them its own way (legacy Completions cannot carry them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<Image>,
}

/// An image as sent: its media type and its bytes in base64.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub media_type: String,
    pub data: String,
}

impl Image {
    /// As a `data:` URL (OpenAI's form).
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.media_type, self.data)
    }
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
