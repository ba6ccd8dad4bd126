//! Tools from MCP servers for Shoal's chat and API: the servers a user
//! names in `mcp.json` ([`config`]), started or reached on first use, their
//! tools listed, and calls to them bounded by a timeout and a result size
//! ([`hub`]). Deciding whether a call may run (asking the user, trusting a
//! read-only hint) is the caller's, never this crate's.
pub mod config;
pub mod hub;
mod spawn;

pub use config::{ConfigError, McpFile, ServerSpec, Transport};
pub use hub::{CallOutcome, Limits, McpError, McpHub, ServerStatus, Summary, ToolInfo};
