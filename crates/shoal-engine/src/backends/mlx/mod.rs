//! Decoder-only transformers on MLX: the llama shape and its relatives
//! (mistral, qwen2/3, gemma3, phi3) and mixtures of experts (qwen3_moe,
//! gpt_oss); `hf::ARCHITECTURES` lists them.
//!
//! Loaders (`gguf`, `hf`) normalise weights to Hugging Face tensor names and a
//! [`ModelConfig`]; [`Transformer`] runs them. On the CPU backend quantized
//! weights are dequantized at load time (MLX's CPU quantized matmul is far
//! slower than dense float32 here); on Metal they stay quantized.
pub mod batch;
pub mod cache;
pub mod config;
pub mod gguf;
pub mod gguf_subset;
pub mod hf;
mod layer;
mod linear;
pub mod pipeline;
pub mod rope;
pub mod stage;
pub mod transformer;
pub(crate) mod turns;
mod weights;

pub use batch::MlxBatch;
pub use cache::MlxCache;
use cache::CACHE_STEP;
pub use config::{DevicePolicy, ModelConfig};
use layer::*;
use linear::*;
pub use transformer::Transformer;
use weights::*;
