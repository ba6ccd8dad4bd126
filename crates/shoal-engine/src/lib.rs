//! Shoal's inference engine: loads a model, runs it on MLX or llama.cpp, and reports every
//! generation as a stream of [`completion::Event`]s ending in one
//! [`completion::Completion`] record — the single source of usage and finish
//! reasons for every API adapter.
pub mod backend;
pub mod backends;
pub mod completion;
pub mod constraint;
pub mod content_filter;
#[cfg(target_os = "linux")]
pub mod cpu_blas;
pub mod defaults;
pub mod detok;
pub mod disk_cache;
pub mod draft;
pub mod draft_model;
pub mod embedding;
pub mod engine;
pub mod error;
#[cfg(test)]
mod fuzz_tests;
pub mod harmony;
pub mod loader;
pub mod prefix_cache;
pub mod process;
pub mod prompt;
pub mod reasoning;
mod request;
pub mod sampler;
pub mod section;
mod sequence;
pub mod stop;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod vision;

pub use backend::{BackendKind, EmbeddingInfo, Pooling};
pub use backends::llama::{KvType, LlamaOptions};
pub use backends::BackendChoice;
pub use completion::{Completion, Event, FinishReason, Timings, TokenLogprob, Usage};
pub use constraint::Grammar;
pub use defaults::SamplingDefaults;
pub use draft::DraftOptions;
pub use embedding::{EmbedTicket, Embedded};
pub use engine::{
    collect_blocking, CacheBreakpoint, CancelFlag, Engine, EngineOptions, EngineStats, EventStream,
    GenerateRequest, ModelHandle,
};
pub use error::{EngineError, Result};
pub use loader::LoadOptions;
pub use sampler::SamplingParams;
pub use template::{Capabilities, ChatMessage};

#[cfg(target_os = "linux")]
mod linux_shim {
    /// mlx-rs seeds its random state from the macOS-only `mach_approximate_time`.
    #[no_mangle]
    pub extern "C" fn mach_approximate_time() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}
