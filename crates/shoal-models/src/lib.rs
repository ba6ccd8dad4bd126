//! Local models: finding them on a Hugging Face hub (`find`), pulling them
//! with progress and checksums (`hub`), listing and removing them (`library`), and reading what
//! each one is without loading it (`card`). No MLX here: the server and the
//! CLI decide what to load.
pub mod card;
pub mod error;
pub mod find;
pub mod hub;
pub mod library;

pub use card::ModelCard;
pub use error::{ModelsError, Result};
pub use hub::{pull, HubOptions, PlannedFile, PullEvent, PullSpec};
pub use library::{Library, LocalModel, Source};
