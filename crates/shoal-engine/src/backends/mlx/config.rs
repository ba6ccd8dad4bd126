//! Hyperparameters and compute placement of an MLX model.

use mlx_rs::Dtype;

use crate::error::{EngineError, Result};

/// Hyperparameters of the supported architectures. The fields after
/// `format` say how an architecture departs from the llama shape; their
/// defaults are the llama shape.
#[derive(Clone, Debug, Default)]
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
    /// How the global layers scale their rope (periods, position scale,
    /// input factor); the default is none.
    pub rope_scaling: super::rope::Scaling,
    pub context_length: usize,
    pub tie_word_embeddings: bool,
    /// Quantization description for display (`Q4_1`, `4-bit g64`, …).
    pub quantization: Option<String>,
    pub format: String,
    /// Per layer: attend only to the last `w` positions (a sliding window),
    /// or to all of them. Empty: every layer attends to all.
    pub layer_windows: Vec<Option<usize>>,
    /// Rope base of the sliding layers when it differs from the global one
    /// (gemma3's local base); those layers then take no rope scaling.
    pub rope_local_theta: Option<f32>,
    /// Rotated dimensions per head (partial rotary); 0 means all.
    pub rope_dims: usize,
    /// Attention score scale; `None` is `1/sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
    /// Gemma's layer shape: norms scale by `1 + w`, attention and MLP
    /// outputs are normed before the residual add, embeddings are scaled.
    pub gemma: bool,
    /// Norm weights are stored as `w` and scale by `1 + w` (gemma's HF
    /// weights); llama.cpp's converter stores gemma's `1 + w` already.
    pub norms_plus_one: bool,
    pub activation: Activation,
    pub moe: Option<MoeConfig>,
    /// Per-layer quantization that differs from the default (MLX writes
    /// e.g. 8-bit expert routers): layer prefix → (group size, bits).
    pub quant_overrides: std::collections::HashMap<String, (i32, i32)>,
}

/// The gate's activation in the MLP (`act(gate) * up`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activation {
    #[default]
    Silu,
    /// The tanh approximation of GELU (gemma).
    GeluApprox,
    /// gpt-oss's clamped SwiGLU: `(clip(up) + 1) * g * sigmoid(1.702 g)`,
    /// with the gate clipped from above.
    SwigluOai,
}

/// A mixture-of-experts MLP.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    /// Qwen: softmax over all experts, then the top k (renormalised when
    /// `normalize`); gpt-oss: the top k logits, then a softmax over them.
    pub routing: Routing,
    pub normalize: bool,
    /// Per layer: experts (`true`) or a dense MLP.
    pub sparse_layers: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    SoftmaxThenTopK,
    TopKThenSoftmax,
}

/// Gemma's layout: every `pattern`-th layer attends globally, the others
/// slide over `window` positions.
pub fn every_nth_global(layers: usize, pattern: usize, window: usize) -> Vec<Option<usize>> {
    (0..layers)
        .map(|i| ((i + 1) % pattern.max(1) != 0).then_some(window))
        .collect()
}

impl ModelConfig {
    /// Layer `i`'s sliding window, if it has one.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.layer_windows.get(i).copied().flatten()
    }

    /// Whether layer `i`'s MLP is a mixture of experts.
    pub fn sparse(&self, i: usize) -> bool {
        self.moe
            .as_ref()
            .is_some_and(|m| m.sparse_layers.get(i).copied().unwrap_or(false))
    }
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
