//! Hyperparameters and compute placement of an MLX model.

use mlx_rs::Dtype;

use crate::error::{EngineError, Result};

/// Hyperparameters shared by the supported architectures.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// `true` when q/k rows are laid out for interleaved (GPT-J style) rotary
    /// pairs, as llama.cpp stores llama weights; `false` for the HF layout.
    pub rope_traditional: bool,
    /// Per-dimension rotary periods when the model scales its rope (Llama 3.1+).
    pub rope_freqs: Option<Vec<f32>>,
    pub context_length: usize,
    pub tie_word_embeddings: bool,
    /// Quantization description for display (`Q4_1`, `4-bit g64`, …).
    pub quantization: Option<String>,
    pub format: String,
}

impl ModelConfig {
    pub(super) fn check(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidModel(m));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.head_dim == 0 {
            return bad("attention head counts must be positive".into());
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.num_layers == 0 || self.vocab_size == 0 || self.hidden_size == 0 {
            return bad("layer count, vocabulary and hidden size must be positive".into());
        }
        Ok(())
    }
}

/// Compute placement chosen once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePolicy {
    /// CPU backend: dense float32 weights.
    Cpu,
    /// GPU (Metal): quantized weights stay quantized, activations float16.
    Gpu,
}

impl DevicePolicy {
    pub fn detect() -> Self {
        if cfg!(target_os = "macos") {
            DevicePolicy::Gpu
        } else {
            DevicePolicy::Cpu
        }
    }
    pub(super) fn dtype(self) -> Dtype {
        match self {
            DevicePolicy::Cpu => Dtype::Float32,
            DevicePolicy::Gpu => Dtype::Float16,
        }
    }
}
