//! The parts of the `shoal` command that other front ends share: the server
//! settings (`config`) and the default model id.
pub mod config;

use std::path::Path;

/// The model id clients see by default: the file or directory name without extension.
pub fn id_from_path(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// Logs to stderr, filtered by `SHOAL_LOG` (default `info`); shared by the
/// CLI and the desktop app so both log alike.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}
