//! Shoal's HTTP API: OpenAI Chat Completions, Completions and Responses,
//! Anthropic Messages and Ollama's API (`dialects/`), all rendered from the engine's one event stream and
//! final `Completion` record.
pub mod access;
mod body;
mod cache;
pub mod cluster;
mod conversations;
pub mod dialect;
pub mod dialects;
pub mod embeddings;
mod error;
#[cfg(test)]
mod fuzz_tests;
mod ids;
mod images;
pub mod ledger;
mod mcp;
mod metrics;
mod models;
mod params;
pub mod pool;
mod run;
#[cfg(test)]
mod script_tests;
mod usage;

mod server;
mod sse;
mod state;
mod tools;
mod ui;
mod wire;

pub use crate::server::{router, serve_until};
pub use crate::state::{AppState, Served};
