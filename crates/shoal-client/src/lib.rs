//! A client for the APIs Shoal serves — OpenAI Chat Completions, Completions,
//! Responses and Anthropic Messages — that works against any provider and
//! records, on every response piece, the provider's own stop reason and
//! usage under reserved metadata keys no caller can forge; plus the SQLite
//! conversation store the CLI and the desktop app share.
pub mod error;
pub mod metadata;
mod sse;
pub mod store;
pub mod target;

pub use error::ClientError;
pub use metadata::{is_reserved, Metadata, ProviderMeta, RESERVED_KEYS};
pub use store::Store;
pub use target::{Dialect, Message, Piece, PieceKind, Reply, Request, Target, TargetConfig};
