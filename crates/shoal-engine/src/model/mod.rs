//! Decoder-only transformers (llama, qwen2, qwen3) on MLX.
//!
//! Loaders (`gguf`, `hf`) normalise weights to Hugging Face tensor names and a
//! [`ModelConfig`]; [`Transformer`] runs them. On the CPU backend quantized
//! weights are dequantized at load time (MLX's CPU quantized matmul is far
//! slower than dense float32 here); on Metal they stay quantized.
pub mod gguf;
pub mod gguf_subset;
pub mod hf;
pub mod stage;

use std::any::Any;
use std::collections::HashMap;

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{self, concatenate};
use mlx_rs::{Array, Dtype};

use crate::backend::{DecodeBatch, KvCache, LanguageModel, ModelInfo};
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
    fn check(&self) -> Result<()> {
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
    fn dtype(self) -> Dtype {
        match self {
            DevicePolicy::Cpu => Dtype::Float32,
            DevicePolicy::Gpu => Dtype::Float16,
        }
    }
}

/// A projection `y = x Wᵀ (+ b)`, dense or MLX-affine-quantized.
enum Linear {
    Dense {
        w: Array,
        b: Option<Array>,
    },
    Quantized {
        w: Array,
        scales: Array,
        biases: Array,
        group: i32,
        bits: i32,
        b: Option<Array>,
    },
}

impl Linear {
    fn apply(&self, x: &Array) -> Result<Array> {
        let (y, b) = match self {
            Linear::Dense { w, b } => (x.matmul(w.t())?, b),
            Linear::Quantized {
                w,
                scales,
                biases,
                group,
                bits,
                b,
            } => (
                ops::quantized_matmul(x, w, scales, biases, true, *group, *bits)?,
                b,
            ),
        };
        Ok(match b {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { w, .. } | Linear::Quantized { w, .. } => w.shape()[0],
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            Linear::Dense { w, b } => w.nbytes() + b.as_ref().map_or(0, Array::nbytes),
            Linear::Quantized {
                w,
                scales,
                biases,
                b,
                ..
            } => {
                w.nbytes() + scales.nbytes() + biases.nbytes() + b.as_ref().map_or(0, Array::nbytes)
            }
        }
    }

    /// Stacks dense projections that read the same input into one matmul
    /// (q/k/v, gate/up): fewer, larger ops are what decode speed depends on.
    fn fuse(parts: Vec<Linear>) -> Result<(Linear, Vec<i32>)> {
        let mut splits = Vec::new();
        let mut acc = 0;
        for p in &parts[..parts.len().saturating_sub(1)] {
            acc += p.out_features();
            splits.push(acc);
        }
        let all_dense = parts.iter().all(|p| matches!(p, Linear::Dense { .. }));
        if !all_dense {
            return Err(EngineError::Backend(
                "only dense projections are fused".into(),
            ));
        }
        let mut ws = Vec::new();
        let mut bs = Vec::new();
        let mut any_bias = false;
        for p in &parts {
            if let Linear::Dense { w, b } = p {
                ws.push(w.clone());
                any_bias |= b.is_some();
                bs.push(match b {
                    Some(b) => b.clone(),
                    None => ops::zeros_dtype(&[w.shape()[0]], w.dtype())?,
                });
            }
        }
        let w = concatenate(&ws, 0)?;
        let b = if any_bias {
            Some(concatenate(&bs, 0)?)
        } else {
            None
        };
        Ok((Linear::Dense { w, b }, splits))
    }
}

/// A group of projections of one input, fused when possible.
enum Projections {
    Fused(Linear, Vec<i32>),
    Separate(Vec<Linear>),
}

impl Projections {
    fn new(parts: Vec<Linear>) -> Result<Self> {
        if parts.iter().all(|p| matches!(p, Linear::Dense { .. })) {
            let (l, s) = Linear::fuse(parts)?;
            Ok(Projections::Fused(l, s))
        } else {
            Ok(Projections::Separate(parts))
        }
    }
    fn apply(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Projections::Fused(l, splits) => Ok(ops::split_at_indices(l.apply(x)?, splits, -1)?),
            Projections::Separate(ls) => ls.iter().map(|l| l.apply(x)).collect(),
        }
    }
    fn nbytes(&self) -> usize {
        match self {
            Projections::Fused(l, _) => l.nbytes(),
            Projections::Separate(ls) => ls.iter().map(Linear::nbytes).sum(),
        }
    }
}

struct Layer {
    attn_norm: Array,
    qkv: Projections,
    q_norm: Option<Array>,
    k_norm: Option<Array>,
    o_proj: Linear,
    ffn_norm: Array,
    gate_up: Projections,
    down: Linear,
}

impl Layer {
    /// Query, key and value projections of the normed input (flat heads).
    fn qkv(&self, h: &Array, eps: f32) -> Result<[Array; 3]> {
        let x = fast::rms_norm(h, Some(&self.attn_norm), eps)?;
        <[Array; 3]>::try_from(self.qkv.apply(&x)?)
            .map_err(|_| EngineError::Backend("qkv split".into()))
    }

    /// The rest of the layer after attention: output projection and the
    /// gated MLP, each added to the residual stream.
    fn finish(&self, h: Array, attn: &Array, eps: f32) -> Result<Array> {
        let h = h.add(self.o_proj.apply(attn)?)?;
        let x = fast::rms_norm(&h, Some(&self.ffn_norm), eps)?;
        let [g, u] = <[Array; 2]>::try_from(self.gate_up.apply(&x)?)
            .map_err(|_| EngineError::Backend("gate/up split".into()))?;
        let act = mlx_rs::nn::silu(&g)?.multiply(&u)?;
        Ok(h.add(self.down.apply(&act)?)?)
    }
}

/// A loaded decoder-only transformer.
pub struct Transformer {
    cfg: ModelConfig,
    info: ModelInfo,
    /// Only on the first stage (every whole model is one).
    embed: Option<Array>,
    layers: Vec<Layer>,
    /// Final norm and output projection: only on the last stage.
    head: Option<Head>,
    rope_freqs: Option<Array>,
    dtype: Dtype,
}

/// What turns the last hidden state into logits.
struct Head {
    norm: Array,
    lm_head: Linear,
}

/// Dequantizes with float32 scales: they are float16 on disk, and letting MLX
/// compute in their dtype would round every weight to half precision.
fn dequantize_f32(
    w: &Array,
    scales: &Array,
    biases: &Array,
    group: i32,
    bits: i32,
) -> Result<Array> {
    let s = scales.as_dtype(Dtype::Float32)?;
    let b = biases.as_dtype(Dtype::Float32)?;
    Ok(ops::dequantize(w, &s, &b, group, bits)?)
}

/// Pulls tensors out of the loader's map by Hugging Face name.
struct Weights {
    map: HashMap<String, Array>,
    policy: DevicePolicy,
    /// Default group size for quantized tensors (bits are inferred from shapes).
    group: i32,
}

impl Weights {
    fn take(&mut self, name: &str) -> Result<Array> {
        self.map
            .remove(name)
            .ok_or_else(|| EngineError::MissingModelPart {
                what: "tensor".into(),
                detail: name.into(),
            })
    }

    fn dense(&mut self, name: &str) -> Result<Array> {
        let dtype = self.policy.dtype();
        let t = self.take(name)?;
        Ok(t.as_dtype(dtype)?)
    }

    /// Loads `prefix.weight` (+ `.scales`/`.biases` when quantized, + `.bias`).
    fn linear(&mut self, prefix: &str) -> Result<Linear> {
        let dtype = self.policy.dtype();
        let w = self.take(&format!("{prefix}.weight"))?;
        let b = match self.map.remove(&format!("{prefix}.bias")) {
            Some(b) => Some(b.as_dtype(dtype)?),
            None => None,
        };
        let scales = self.map.remove(&format!("{prefix}.scales"));
        let Some(scales) = scales else {
            return Ok(Linear::Dense {
                w: w.as_dtype(dtype)?,
                b,
            });
        };
        let biases = self.take(&format!("{prefix}.biases"))?;
        let (group, bits) = self.group_bits(prefix, &w, &scales)?;
        match self.policy {
            DevicePolicy::Cpu => {
                let dense = dequantize_f32(&w, &scales, &biases, group, bits)?.as_dtype(dtype)?;
                Ok(Linear::Dense { w: dense, b })
            }
            DevicePolicy::Gpu => Ok(Linear::Quantized {
                w,
                scales,
                biases,
                group,
                bits,
                b,
            }),
        }
    }

    /// Quantized embedding tables are dequantized: lookups need rows, not matmuls.
    fn embedding(&mut self, prefix: &str) -> Result<Array> {
        match self.linear(prefix)? {
            Linear::Dense { w, .. } => Ok(w),
            Linear::Quantized {
                w,
                scales,
                biases,
                group,
                bits,
                ..
            } => {
                Ok(dequantize_f32(&w, &scales, &biases, group, bits)?
                    .as_dtype(self.policy.dtype())?)
            }
        }
    }

    fn group_bits(&self, prefix: &str, w: &Array, scales: &Array) -> Result<(i32, i32)> {
        let (wc, sc) = match (w.shape().last(), scales.shape().last()) {
            (Some(&wc), Some(&sc)) if sc > 0 => (wc, sc),
            _ => {
                return Err(EngineError::InvalidModel(format!(
                    "{prefix}: malformed quantized tensor shapes"
                )))
            }
        };
        // in_features = sc * group = wc * 32 / bits
        let bits = wc * 32 / (sc * self.group);
        if ![2, 3, 4, 5, 6, 8].contains(&bits) || wc * 32 != bits * sc * self.group {
            return Err(EngineError::InvalidModel(format!(
                "{prefix}: cannot infer quantization bits from shapes {:?} / {:?} with group size {}",
                w.shape(),
                scales.shape(),
                self.group
            )));
        }
        Ok((self.group, bits))
    }
}

impl Transformer {
    /// Builds the model from Hugging Face-named tensors.
    pub fn new(
        cfg: ModelConfig,
        map: HashMap<String, Array>,
        group_size: i32,
        policy: DevicePolicy,
    ) -> Result<Self> {
        Self::new_stage(cfg, map, group_size, policy, None)
    }

    /// Builds only `layers` (all when `None`): a pipeline stage. The other
    /// layers' tensors are dropped before anything is dequantized, so a
    /// stage holds just its share of the model.
    pub fn new_stage(
        cfg: ModelConfig,
        mut map: HashMap<String, Array>,
        group_size: i32,
        policy: DevicePolicy,
        layers: Option<std::ops::Range<usize>>,
    ) -> Result<Self> {
        cfg.check()?;
        let range = layers.unwrap_or(0..cfg.num_layers);
        if range.start >= range.end || range.end > cfg.num_layers {
            return Err(EngineError::InvalidModel(format!(
                "layer range {range:?} is not within the model's {} layers",
                cfg.num_layers
            )));
        }
        let span = stage::Span {
            layers: range.clone(),
            num_layers: cfg.num_layers,
            tied_output: cfg.tie_word_embeddings,
        };
        map.retain(|name, _| span.keeps(stage::hf_part(name)));
        #[cfg(target_os = "linux")]
        crate::cpu_blas::init();
        let mut w = Weights {
            map,
            policy,
            group: group_size,
        };
        let embed = if span.needs_embedding() {
            let e = w.embedding("model.embed_tokens")?;
            if e.shape() != [cfg.vocab_size as i32, cfg.hidden_size as i32] {
                return Err(EngineError::InvalidModel(format!(
                    "embedding shape {:?} does not match vocab {} x hidden {}",
                    e.shape(),
                    cfg.vocab_size,
                    cfg.hidden_size
                )));
            }
            Some(e)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(range.len());
        for i in range {
            let p = format!("model.layers.{i}");
            let q = w.linear(&format!("{p}.self_attn.q_proj"))?;
            let k = w.linear(&format!("{p}.self_attn.k_proj"))?;
            let v = w.linear(&format!("{p}.self_attn.v_proj"))?;
            let gate = w.linear(&format!("{p}.mlp.gate_proj"))?;
            let up = w.linear(&format!("{p}.mlp.up_proj"))?;
            let q_norm = w.map.remove(&format!("{p}.self_attn.q_norm.weight"));
            let k_norm = w.map.remove(&format!("{p}.self_attn.k_norm.weight"));
            let dt = policy.dtype();
            layers.push(Layer {
                attn_norm: w.dense(&format!("{p}.input_layernorm.weight"))?,
                qkv: Projections::new(vec![q, k, v])?,
                q_norm: q_norm.map(|a| a.as_dtype(dt)).transpose()?,
                k_norm: k_norm.map(|a| a.as_dtype(dt)).transpose()?,
                o_proj: w.linear(&format!("{p}.self_attn.o_proj"))?,
                ffn_norm: w.dense(&format!("{p}.post_attention_layernorm.weight"))?,
                gate_up: Projections::new(vec![gate, up])?,
                down: w.linear(&format!("{p}.mlp.down_proj"))?,
            });
        }
        if cfg.architecture == "qwen3" && layers.iter().any(|l| l.q_norm.is_none()) {
            return Err(EngineError::MissingModelPart {
                what: "tensor".into(),
                detail: "qwen3 q_norm/k_norm weights".into(),
            });
        }
        let head = if span.last() {
            let norm = w.dense("model.norm.weight")?;
            let lm_head = if w.map.contains_key("lm_head.weight") && !cfg.tie_word_embeddings {
                w.linear("lm_head")?
            } else {
                w.map.remove("lm_head.weight");
                let table = embed.clone().ok_or_else(|| {
                    EngineError::InvalidModel("tied output without an embedding table".into())
                })?;
                Linear::Dense { w: table, b: None }
            };
            Some(Head { norm, lm_head })
        } else {
            None
        };
        // A last stage that is not also the first keeps the table only as
        // its output projection.
        let embed = if span.first() { embed } else { None };
        let rope_freqs = cfg
            .rope_freqs
            .as_ref()
            .map(|f| Array::from_slice(f, &[f.len() as i32]));

        let mut all: Vec<&Array> = embed.iter().collect();
        all.extend(head.as_ref().map(|h| &h.norm));
        for l in &layers {
            all.push(&l.attn_norm);
            all.push(&l.ffn_norm);
        }
        mlx_rs::transforms::eval(all)?;
        let mut model = Transformer {
            info: ModelInfo {
                architecture: cfg.architecture.clone(),
                vocab_size: cfg.vocab_size,
                context_length: cfg.context_length,
                num_layers: cfg.num_layers,
                hidden_size: cfg.hidden_size,
                format: cfg.format.clone(),
                quantization: cfg.quantization.clone(),
                dtype: format!("{:?}", policy.dtype()).to_lowercase(),
                device: match policy {
                    DevicePolicy::Cpu => "cpu".into(),
                    DevicePolicy::Gpu => "gpu".into(),
                },
                weight_bytes: 0,
                backend: crate::backend::BackendKind::Mlx,
                kv_capacity_bytes: 0,
            },
            cfg,
            embed,
            layers,
            head,
            rope_freqs,
            dtype: policy.dtype(),
        };
        model.materialize()?;
        Ok(model)
    }

    /// Forces every weight to be computed now (dequantization, fusion), so the
    /// first request does not pay for it and memory use is known up front.
    fn materialize(&mut self) -> Result<()> {
        let mut bytes = self.embed.as_ref().map_or(0, Array::nbytes)
            + self.head.as_ref().map_or(0, |h| h.norm.nbytes());
        for l in &self.layers {
            let mut arrays: Vec<&Array> = Vec::new();
            for p in [&l.qkv, &l.gate_up] {
                match p {
                    Projections::Fused(lin, _) => push_linear(&mut arrays, lin),
                    Projections::Separate(ls) => {
                        ls.iter().for_each(|x| push_linear(&mut arrays, x))
                    }
                }
            }
            push_linear(&mut arrays, &l.o_proj);
            push_linear(&mut arrays, &l.down);
            mlx_rs::transforms::eval(arrays)?;
            bytes += l.qkv.nbytes()
                + l.gate_up.nbytes()
                + l.o_proj.nbytes()
                + l.down.nbytes()
                + l.attn_norm.nbytes()
                + l.ffn_norm.nbytes();
        }
        if let Some(h) = &self.head {
            let mut arrays: Vec<&Array> = Vec::new();
            push_linear(&mut arrays, &h.lm_head);
            mlx_rs::transforms::eval(arrays)?;
            // A tied head shares the embedding table, counted above, unless
            // this stage keeps the table only as its head.
            if !self.cfg.tie_word_embeddings || self.embed.is_none() {
                bytes += h.lm_head.nbytes();
            }
        }
        self.info.weight_bytes = bytes;
        Ok(())
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn rope(&self, x: &Array, offset: i32) -> Result<Array> {
        let d = self.cfg.head_dim as i32;
        Ok(match &self.rope_freqs {
            Some(f) => fast::rope(x, d, self.cfg.rope_traditional, None, 1.0, offset, f)?,
            None => fast::rope(
                x,
                d,
                self.cfg.rope_traditional,
                self.cfg.rope_theta,
                1.0,
                offset,
                None,
            )?,
        })
    }

    fn forward_hidden(&self, tokens: &[u32], cache: &mut MlxCache) -> Result<Array> {
        let h = self.embed_tokens(tokens)?;
        self.run_layers(h, cache)
    }

    /// Token embeddings, `[1, n, hidden]`.
    pub fn embed_tokens(&self, tokens: &[u32]) -> Result<Array> {
        let n = tokens.len() as i32;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[n]);
        Ok(self.embedding()?.take_axis(&ids, 0)?.reshape(&[1, n, -1])?)
    }

    /// Runs this model's layers over hidden states `[1, n, hidden]` after
    /// what `cache` holds.
    pub fn run_layers(&self, mut h: Array, cache: &mut MlxCache) -> Result<Array> {
        let n = h.shape()[1];
        let (nh, nkv, hd) = (
            self.cfg.num_heads as i32,
            self.cfg.num_kv_heads as i32,
            self.cfg.head_dim as i32,
        );
        let offset = cache.offset as i32;
        cache.reserve(
            offset as usize + n as usize,
            nkv,
            hd,
            self.dtype,
            self.layers.len(),
        )?;
        let scale = 1.0 / (hd as f32).sqrt();
        let eps = self.cfg.rms_norm_eps;
        for (i, l) in self.layers.iter().enumerate() {
            let [q, k, v] = l.qkv(&h, eps)?;
            let mut q = q.reshape(&[1, n, nh, hd])?;
            let mut k = k.reshape(&[1, n, nkv, hd])?;
            let v = v.reshape(&[1, n, nkv, hd])?.transpose_axes(&[0, 2, 1, 3])?;
            if let Some(w) = &l.q_norm {
                q = fast::rms_norm(&q, Some(w), eps)?;
            }
            if let Some(w) = &l.k_norm {
                k = fast::rms_norm(&k, Some(w), eps)?;
            }
            let q = self.rope(&q.transpose_axes(&[0, 2, 1, 3])?, offset)?;
            let k = self.rope(&k.transpose_axes(&[0, 2, 1, 3])?, offset)?;
            let (keys, values) = cache.update(i, offset, &k, &v)?;
            let mask = if n > 1 {
                Some(ScaledDotProductAttentionMask::Causal)
            } else {
                None
            };
            let o = fast::scaled_dot_product_attention(&q, &keys, &values, scale, mask, None)?;
            let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, n, nh * hd])?;
            h = l.finish(h, &o, eps)?;
        }
        cache.offset += n as usize;
        Ok(h)
    }
}

impl Transformer {
    /// One decode step for every row of `batch`: the projections run as one
    /// `[B, hidden]` matmul each (weights read once), attention runs over the
    /// shared right-aligned buffers with each row's padding masked out and
    /// each row's own rotary position.
    fn forward_batch_hidden(&self, tokens: &[u32], batch: &mut MlxBatch) -> Result<Array> {
        let b = tokens.len() as i32;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[b]);
        // Rows of one matrix, not a batch of 1-row matrices: the projections
        // then run as one [B, hidden] matmul instead of B matrix-vector products.
        let mut h = self.embedding()?.take_axis(&ids, 0)?.reshape(&[1, b, -1])?;
        let (nh, nkv, hd) = (
            self.cfg.num_heads as i32,
            self.cfg.num_kv_heads as i32,
            self.cfg.head_dim as i32,
        );
        batch.make_room()?;
        let col = batch.idx;
        let t = col + 1;
        let positions: Vec<i32> = batch.pads.iter().map(|&p| col - p).collect();
        let positions = Array::from_slice(&positions, &[b]);
        let mut mask = Vec::with_capacity((b * t) as usize);
        for &p in &batch.pads {
            mask.extend((0..t).map(|c| c >= p));
        }
        let mask = Array::from_slice(&mask, &[b, 1, 1, t]);
        let scale = 1.0 / (hd as f32).sqrt();
        let eps = self.cfg.rms_norm_eps;
        for (li, l) in self.layers.iter().enumerate() {
            let [q, k, v] = l.qkv(&h, eps)?;
            // One position per row: [B, 1, heads, dim] and [B, heads, 1, dim]
            // share a memory layout, so a reshape replaces the transpose.
            let mut q = q.reshape(&[b, nh, 1, hd])?;
            let mut k = k.reshape(&[b, nkv, 1, hd])?;
            let v = v.reshape(&[b, nkv, 1, hd])?;
            if let Some(w) = &l.q_norm {
                q = fast::rms_norm(&q, Some(w), eps)?;
            }
            if let Some(w) = &l.k_norm {
                k = fast::rms_norm(&k, Some(w), eps)?;
            }
            let q = self.rope_at(&q, &positions)?;
            let k = self.rope_at(&k, &positions)?;
            let (kb, vb) = batch
                .layers
                .get_mut(li)
                .ok_or_else(|| EngineError::Backend(format!("batch has no layer {li}")))?;
            kb.try_index_mut((.., .., col..t, ..), &k)?;
            vb.try_index_mut((.., .., col..t, ..), &v)?;
            let keys = kb.index((.., .., 0..t, ..));
            let values = vb.index((.., .., 0..t, ..));
            let o = fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                scale,
                ScaledDotProductAttentionMask::Array(&mask),
                None,
            )?;
            let o = o.reshape(&[1, b, nh * hd])?;
            h = l.finish(h, &o, eps)?;
        }
        batch.idx += 1;
        Ok(h)
    }

    /// Rotary embedding with a position per batch row.
    fn rope_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        let d = self.cfg.head_dim as i32;
        let trad = self.cfg.rope_traditional;
        Ok(match &self.rope_freqs {
            Some(f) => fast::rope_dynamic(x, d, trad, None, 1.0, positions, f)?,
            None => fast::rope_dynamic(x, d, trad, self.cfg.rope_theta, 1.0, positions, None)?,
        })
    }
}

fn push_linear<'a>(out: &mut Vec<&'a Array>, l: &'a Linear) {
    match l {
        Linear::Dense { w, b } => {
            out.push(w);
            out.extend(b.iter());
        }
        Linear::Quantized {
            w,
            scales,
            biases,
            b,
            ..
        } => {
            out.extend([w, scales, biases]);
            out.extend(b.iter());
        }
    }
}

impl Transformer {
    /// Next-token logits (float32) for the last position of `h`.
    pub fn logits_last(&self, h: &Array) -> Result<Array> {
        let last = h.index((.., -1, ..));
        self.logits(&last)
    }

    /// Logits (float32) of hidden states `[rows, hidden]`.
    fn logits(&self, h: &Array) -> Result<Array> {
        let head = self.head.as_ref().ok_or_else(|| {
            EngineError::Backend("this pipeline stage has no output head (not the last)".into())
        })?;
        let x = fast::rms_norm(h, Some(&head.norm), self.cfg.rms_norm_eps)?;
        Ok(head.lm_head.apply(&x)?.as_dtype(Dtype::Float32)?)
    }

    fn embedding(&self) -> Result<&Array> {
        self.embed.as_ref().ok_or_else(|| {
            EngineError::Backend(
                "this pipeline stage has no embedding table (not the first)".into(),
            )
        })
    }

    /// The compute dtype (hidden states travel between stages in it).
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
}

impl LanguageModel for Transformer {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self) -> Result<Box<dyn KvCache>> {
        Ok(Box::new(MlxCache::default()))
    }

    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidRequest("no tokens to run".into()));
        }
        let cache = cache
            .as_any_mut()
            .downcast_mut::<MlxCache>()
            .ok_or_else(|| EngineError::Backend("KV cache from another backend".into()))?;
        if cache.offset + tokens.len() > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                prompt_tokens: cache.offset + tokens.len(),
                context: self.cfg.context_length,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let h = self.forward_hidden(tokens, cache)?;
        let logits = self.logits_last(&h)?;
        let mut outs: Vec<&Array> = vec![&logits];
        outs.extend(cache.arrays());
        mlx_rs::transforms::eval(outs)?;
        Ok(logits.as_slice::<f32>().to_vec())
    }

    fn new_batch(&self) -> Result<Box<dyn DecodeBatch>> {
        Ok(Box::new(MlxBatch::default()))
    }

    fn forward_batch(&self, tokens: &[u32], batch: &mut dyn DecodeBatch) -> Result<Vec<Vec<f32>>> {
        let batch = batch
            .as_any_mut()
            .downcast_mut::<MlxBatch>()
            .ok_or_else(|| EngineError::Backend("batch from another backend".into()))?;
        if tokens.len() != batch.pads.len() || tokens.is_empty() {
            return Err(EngineError::Backend(format!(
                "{} tokens for a batch of {}",
                tokens.len(),
                batch.pads.len()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        if let Some(longest) = batch.pads.iter().map(|&p| batch.idx - p).max() {
            if longest as usize + 1 > self.cfg.context_length {
                return Err(EngineError::ContextOverflow {
                    prompt_tokens: longest as usize + 1,
                    context: self.cfg.context_length,
                });
            }
        }
        let h = self.forward_batch_hidden(tokens, batch)?;
        let last = h.reshape(&[tokens.len() as i32, -1])?;
        let logits = self.logits(&last)?;
        let mut outs: Vec<&Array> = vec![&logits];
        outs.extend(batch.layers.iter().flat_map(|(k, v)| [k, v]));
        mlx_rs::transforms::eval(outs)?;
        let v = self.cfg.vocab_size;
        let flat = logits.as_slice::<f32>();
        Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
    }
}

/// Several sequences' key/value state in shared `[rows, kv heads, columns,
/// head dim]` buffers, right-aligned: every row's next token goes to the same
/// column `idx`, so one slice update per layer writes them all; row `r`'s
/// first `pads[r]` columns are padding, masked out of attention.
#[derive(Default)]
pub struct MlxBatch {
    layers: Vec<(Array, Array)>,
    pads: Vec<i32>,
    idx: i32,
    cap: i32,
}

impl MlxBatch {
    fn eval(&self) -> Result<()> {
        mlx_rs::transforms::eval(self.layers.iter().flat_map(|(k, v)| [k, v]))?;
        Ok(())
    }

    /// Grows the buffers so column `idx` exists.
    fn make_room(&mut self) -> Result<()> {
        if self.idx < self.cap {
            return Ok(());
        }
        let extra = CACHE_STEP as i32;
        for (k, v) in &mut self.layers {
            for a in [k, v] {
                let mut shape = a.shape().to_vec();
                shape[2] = extra;
                let z = ops::zeros_dtype(&shape, a.dtype())?;
                *a = concatenate(&[a.clone(), z], 2)?;
            }
        }
        self.cap += extra;
        self.eval()
    }

    /// `cols` zero columns shaped like `like`, with `rows` rows.
    fn zeros_like_cols(like: &Array, rows: i32, cols: i32) -> Result<Array> {
        let mut shape = like.shape().to_vec();
        shape[0] = rows;
        shape[2] = cols;
        Ok(ops::zeros_dtype(&shape, like.dtype())?)
    }
}

impl DecodeBatch for MlxBatch {
    fn rows(&self) -> usize {
        self.pads.len()
    }

    fn join(&mut self, mut cache: Box<dyn KvCache>) -> Result<()> {
        let c = cache
            .as_any_mut()
            .downcast_mut::<MlxCache>()
            .ok_or_else(|| EngineError::Backend("KV cache from another backend".into()))?;
        let len = c.offset as i32;
        if len == 0 || c.layers.is_empty() {
            return Err(EngineError::Backend(
                "an empty sequence cannot join a batch".into(),
            ));
        }
        if self.pads.is_empty() {
            self.layers.clear();
            self.idx = 0;
            self.cap = 0;
        } else if c.layers.len() != self.layers.len() {
            return Err(EngineError::Backend("cache layer count differs".into()));
        }
        // A longer newcomer shifts everyone right so all stay right-aligned.
        if len > self.idx && !self.pads.is_empty() {
            let shift = len - self.idx;
            for (k, v) in &mut self.layers {
                for a in [k, v] {
                    let z = Self::zeros_like_cols(a, a.shape()[0], shift)?;
                    *a = concatenate(&[z, a.clone()], 2)?;
                }
            }
            self.pads.iter_mut().for_each(|p| *p += shift);
            self.idx += shift;
            self.cap += shift;
        }
        if self.pads.is_empty() {
            self.idx = len;
            self.cap = len;
        }
        let pad = self.idx - len;
        let mut layers = Vec::with_capacity(c.layers.len());
        for (i, (ck, cv)) in c.layers.iter().enumerate() {
            let mut pair = [ck, cv].into_iter().map(|a| -> Result<Array> {
                let own = a.index((.., .., 0..len, ..));
                let mut parts = Vec::new();
                if pad > 0 {
                    parts.push(Self::zeros_like_cols(a, 1, pad)?);
                }
                parts.push(own);
                if self.cap > self.idx {
                    parts.push(Self::zeros_like_cols(a, 1, self.cap - self.idx)?);
                }
                Ok(concatenate(&parts, 2)?)
            });
            let (Some(k), Some(v)) = (pair.next(), pair.next()) else {
                return Err(EngineError::Backend("cache layer".into()));
            };
            let (k, v) = (k?, v?);
            match self.layers.get(i) {
                Some((bk, bv)) if !self.pads.is_empty() => layers.push((
                    concatenate(&[bk.clone(), k], 0)?,
                    concatenate(&[bv.clone(), v], 0)?,
                )),
                _ => layers.push((k, v)),
            }
        }
        self.layers = layers;
        self.pads.push(pad);
        self.eval()
    }

    fn leave(&mut self, row: usize) -> Result<Box<dyn KvCache>> {
        let rows = self.pads.len();
        if row >= rows {
            return Err(EngineError::Backend(format!("no batch row {row}")));
        }
        let (r, pad) = (row as i32, self.pads[row]);
        let len = self.idx - pad;
        let mut own = Vec::with_capacity(self.layers.len());
        let mut rest = Vec::with_capacity(self.layers.len());
        for (k, v) in &self.layers {
            // Copies, so the prefix cache does not pin the whole batch buffer.
            own.push((
                k.index((r..r + 1, .., pad..self.idx, ..)).contiguous()?,
                v.index((r..r + 1, .., pad..self.idx, ..)).contiguous()?,
            ));
            let keep = |a: &Array| -> Result<Array> {
                let mut parts = Vec::new();
                if r > 0 {
                    parts.push(a.index(0..r));
                }
                if r + 1 < rows as i32 {
                    parts.push(a.index(r + 1..));
                }
                Ok(concatenate(&parts, 0)?)
            };
            if rows > 1 {
                rest.push((keep(k)?, keep(v)?));
            }
        }
        let cache = MlxCache {
            layers: own,
            offset: len as usize,
            capacity: len as usize,
        };
        mlx_rs::transforms::eval(cache.arrays())?;
        self.pads.remove(row);
        self.layers = rest;
        // Drop columns that are padding in every remaining row.
        if let Some(&trim) = self.pads.iter().min() {
            if trim > 0 {
                for (k, v) in &mut self.layers {
                    *k = k.index((.., .., trim.., ..));
                    *v = v.index((.., .., trim.., ..));
                }
                self.pads.iter_mut().for_each(|p| *p -= trim);
                self.idx -= trim;
                self.cap -= trim;
            }
        } else {
            self.idx = 0;
            self.cap = 0;
        }
        self.eval()?;
        Ok(Box::new(cache))
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Preallocated per-layer key/value buffers, grown in steps so decode does not
/// copy the whole history every token.
#[derive(Default, Clone)]
pub struct MlxCache {
    layers: Vec<(Array, Array)>,
    offset: usize,
    capacity: usize,
}

const CACHE_STEP: usize = 256;

impl MlxCache {
    fn reserve(
        &mut self,
        needed: usize,
        nkv: i32,
        hd: i32,
        dtype: Dtype,
        n_layers: usize,
    ) -> Result<()> {
        if needed <= self.capacity && self.layers.len() == n_layers {
            return Ok(());
        }
        let cap = needed.div_ceil(CACHE_STEP) * CACHE_STEP;
        let shape = [1, nkv, cap as i32, hd];
        let mut layers = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let mut k = ops::zeros_dtype(&shape, dtype)?;
            let mut v = ops::zeros_dtype(&shape, dtype)?;
            if let Some((ok, ov)) = self.layers.get(i) {
                if self.offset > 0 {
                    let keep = self.offset as i32;
                    k.try_index_mut((.., .., 0..keep, ..), ok.index((.., .., 0..keep, ..)))?;
                    v.try_index_mut((.., .., 0..keep, ..), ov.index((.., .., 0..keep, ..)))?;
                }
            }
            layers.push((k, v));
        }
        let arrays: Vec<&Array> = layers.iter().flat_map(|(k, v)| [k, v]).collect();
        mlx_rs::transforms::eval(arrays)?;
        self.layers = layers;
        self.capacity = cap;
        Ok(())
    }

    fn update(
        &mut self,
        layer: usize,
        offset: i32,
        k: &Array,
        v: &Array,
    ) -> Result<(Array, Array)> {
        let n = k.shape()[2];
        let (kb, vb) = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| EngineError::Backend(format!("cache has no layer {layer}")))?;
        kb.try_index_mut((.., .., offset..offset + n, ..), k)?;
        vb.try_index_mut((.., .., offset..offset + n, ..), v)?;
        let end = offset + n;
        Ok((
            kb.index((.., .., 0..end, ..)),
            vb.index((.., .., 0..end, ..)),
        ))
    }

    fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.layers.iter().flat_map(|(k, v)| [k, v])
    }
}

impl KvCache for MlxCache {
    fn len(&self) -> usize {
        self.offset
    }
    fn truncate(&mut self, len: usize) {
        self.offset = self.offset.min(len);
    }
    fn nbytes(&self) -> usize {
        self.arrays().map(Array::nbytes).sum()
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn clone_box(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }
}
