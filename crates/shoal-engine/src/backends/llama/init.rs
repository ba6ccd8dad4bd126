//! llama.cpp's process-wide start, below everything else of the backend
//! (the vocabulary reader and the model loader both need it).
use std::sync::OnceLock;

use llama_cpp_2::llama_backend::LlamaBackend;

use crate::error::{EngineError, Result};

/// llama.cpp's process-wide initialisation, done once.
pub fn runtime() -> Result<&'static LlamaBackend> {
    static BACKEND: OnceLock<std::result::Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            // llama.cpp narrates every load at length: heard only when debugging.
            llama_cpp_2::send_logs_to_tracing(
                llama_cpp_2::LogOptions::default()
                    .with_logs_enabled(tracing::enabled!(tracing::Level::DEBUG)),
            );
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Backend(format!("llama.cpp did not start: {e}")))
}
