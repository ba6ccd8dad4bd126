//! A client for the APIs Shoal serves — OpenAI Chat Completions, Completions,
//! Responses, Anthropic Messages and Ollama's chat — that works against any provider and
//! records, on every response piece, the provider's own stop reason and
//! usage under reserved metadata keys no caller can forge. Replies are kept
//! in `shoal-store`'s SQLite conversation store.
pub mod dialect;
pub mod error;
pub mod metadata;
mod request;
mod sse;
pub mod target;
mod wire;

pub use error::ClientError;
pub use metadata::{is_reserved, Metadata, ProviderMeta, RESERVED_KEYS};
pub use request::Image;
pub use target::{Dialect, Message, Piece, PieceKind, Reply, Request, Target, TargetConfig};
