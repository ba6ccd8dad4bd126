//! The decoder-only transformer: built from named tensors, run one
//! sequence or a batch at a time, behind the backend seam.
use std::collections::HashMap;

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{Array, Dtype};

use super::rope::{Rope, Scaling};
use super::*;
use crate::backend::{downcast, DecodeBatch, KvCache, LanguageModel, ModelInfo};
use crate::error::{EngineError, Result};

/// A loaded decoder-only transformer.
pub struct Transformer {
    pub(super) cfg: ModelConfig,
    pub(super) info: ModelInfo,
    /// Only on the first stage (every whole model is one).
    pub(super) embed: Option<Array>,
    pub(super) layers: Vec<Layer>,
    /// Final norm and output projection: only on the last stage.
    pub(super) head: Option<Head>,
    /// Gemma scales token embeddings by sqrt(hidden).
    pub(super) embed_scale: Option<Array>,
    pub(super) dtype: Dtype,
}

/// What turns the last hidden state into logits.
pub(super) struct Head {
    pub(super) norm: Array,
    pub(super) lm_head: Linear,
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
            overrides: cfg.quant_overrides.clone(),
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
            layers.push(load_layer(&mut w, &cfg, i)?);
        }
        if cfg.architecture.starts_with("qwen3") && layers.iter().any(|l| l.q_norm.is_none()) {
            return Err(EngineError::MissingModelPart {
                what: "tensor".into(),
                detail: "qwen3 q_norm/k_norm weights".into(),
            });
        }
        let head = if span.last() {
            let norm = w.norm("model.norm.weight", cfg.norms_plus_one)?;
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
        let embed_scale = match (&embed, cfg.gemma) {
            // sqrt(hidden) rounded to bfloat16, as gemma was trained.
            (Some(_), true) => Some(
                Array::from_f32((cfg.hidden_size as f32).sqrt())
                    .as_dtype(Dtype::Bfloat16)?
                    .as_dtype(policy.dtype())?,
            ),
            _ => None,
        };
        let mut model = Transformer {
            info: ModelInfo {
                architecture: cfg.architecture.clone(),
                vocab_size: cfg.vocab_size,
                context_length: cfg.context_length,
                max_cells: cfg.context_length,
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
                buffer_bytes: 0,
            },
            cfg,
            embed,
            layers,
            head,
            embed_scale,
            dtype: policy.dtype(),
        };
        model.materialize()?;
        Ok(model)
    }

    /// Forces every weight to be computed now (dequantization, fusion), so the
    /// first request does not pay for it and memory use is known up front.
    pub(super) fn materialize(&mut self) -> Result<()> {
        let mut bytes = self.embed.as_ref().map_or(0, Array::nbytes)
            + self.head.as_ref().map_or(0, |h| h.norm.nbytes());
        if let Some(h) = &self.head {
            mlx_rs::transforms::eval([&h.norm])?;
        }
        if let Some(e) = &self.embed {
            mlx_rs::transforms::eval([e])?;
        }
        for l in &self.layers {
            let arrays = l.arrays();
            mlx_rs::transforms::eval(arrays.iter().copied())?;
            bytes += arrays.iter().map(|a| a.nbytes()).sum::<usize>();
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

    pub(super) fn forward_hidden(&self, tokens: &[u32], cache: &mut MlxCache) -> Result<Array> {
        let h = self.embed_tokens(tokens)?;
        self.run_layers(h, cache)
    }

    /// Token embeddings, `[1, n, hidden]` (scaled where the architecture
    /// scales them).
    pub fn embed_tokens(&self, tokens: &[u32]) -> Result<Array> {
        let n = tokens.len() as i32;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let ids = Array::from_slice(&ids, &[n]);
        let h = self.embedding()?.take_axis(&ids, 0)?.reshape(&[1, n, -1])?;
        Ok(match &self.embed_scale {
            Some(s) => h.multiply(s)?,
            None => h,
        })
    }

    fn shape(&self) -> Shape {
        Shape {
            eps: self.cfg.rms_norm_eps,
            act: self.cfg.activation,
            clip_f16: self.cfg.gemma,
        }
    }

    fn attn_scale(&self) -> f32 {
        self.cfg
            .attn_scale
            .unwrap_or(1.0 / (self.cfg.head_dim as f32).sqrt())
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
        let scale = self.attn_scale();
        let shape = self.shape();
        let eps = shape.eps;
        let end = offset + n;
        // Sliding-window masks, one per window size, made on first use.
        let mut windowed: Vec<(i32, Array)> = Vec::new();
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
            let q = l.rope.apply(&q.transpose_axes(&[0, 2, 1, 3])?, offset)?;
            let k = l.rope.apply(&k.transpose_axes(&[0, 2, 1, 3])?, offset)?;
            let (mut keys, mut values) = cache.update(i, offset, &k, &v)?;
            #[cfg(target_os = "linux")]
            if self.dtype == Dtype::Float32 && n >= CPU_ATTENTION_MIN {
                let o = self.cpu_attention(&q, cache, i, offset, n, l)?;
                h = l.finish(h, &o, shape)?;
                continue;
            }
            let mut window_at = None;
            match l.window {
                // One query: its window is the last `w` keys.
                Some(w) if end > w && n == 1 => {
                    keys = keys.index((.., .., end - w..end, ..));
                    values = values.index((.., .., end - w..end, ..));
                }
                Some(w) if end > w => {
                    if !windowed.iter().any(|(x, _)| *x == w) {
                        windowed.push((w, window_mask(offset, n, w)));
                    }
                    window_at = windowed.iter().position(|(x, _)| *x == w);
                }
                _ => {}
            }
            let mask = match (window_at.and_then(|p| windowed.get(p)), n > 1) {
                (Some((_, m)), _) => Some(ScaledDotProductAttentionMask::Array(m)),
                (None, true) => Some(ScaledDotProductAttentionMask::Causal),
                (None, false) => None,
            };
            let o = fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                scale,
                mask,
                l.sinks.as_ref(),
            )?;
            let o = o.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, n, nh * hd])?;
            h = l.finish(h, &o, shape)?;
        }
        cache.offset += n as usize;
        Ok(h)
    }
}

/// Prompt runs at least this long take the CPU attention kernel
/// (`cpu_blas::attention`); shorter ones stay in MLX's graph.
#[cfg(target_os = "linux")]
const CPU_ATTENTION_MIN: i32 = 16;

impl Transformer {
    /// Attention of `n` queries `[1, heads, n, dim]` over layer `layer`'s
    /// cache, on the CPU kernel: `[1, n, heads · dim]`.
    #[cfg(target_os = "linux")]
    fn cpu_attention(
        &self,
        q: &Array,
        cache: &MlxCache,
        layer: usize,
        offset: i32,
        n: i32,
        l: &Layer,
    ) -> Result<Array> {
        let (kb, vb) = cache
            .layers
            .get(layer)
            .ok_or_else(|| EngineError::Backend(format!("cache has no layer {layer}")))?;
        let q = q.contiguous()?;
        let mut inputs = vec![&q, kb, vb];
        inputs.extend(l.sinks.as_ref());
        mlx_rs::transforms::eval(inputs)?;
        let (heads, dim) = (self.cfg.num_heads, self.cfg.head_dim);
        let mut out = vec![0f32; n as usize * heads * dim];
        crate::cpu_blas::attention::Attention {
            q: q.as_slice::<f32>(),
            k: kb.as_slice::<f32>(),
            v: vb.as_slice::<f32>(),
            cap: cache.capacity,
            heads,
            kv_heads: self.cfg.num_kv_heads,
            dim,
            n: n as usize,
            offset: offset as usize,
            scale: self.attn_scale(),
            window: l.window.map(|w| w as usize),
            sinks: l.sinks.as_ref().map(|s| s.as_slice::<f32>()),
        }
        .run(&mut out)
        .map_err(EngineError::Backend)?;
        Ok(Array::from_slice(&out, &[1, n, (heads * dim) as i32]))
    }
}

/// Queries at positions `offset..offset + n` may see keys `j` with
/// `q - w < j <= q`: `[n, offset + n]`.
fn window_mask(offset: i32, n: i32, w: i32) -> Array {
    let end = offset + n;
    let mut m = Vec::with_capacity((n * end) as usize);
    for q in offset..end {
        m.extend((0..end).map(|j| j <= q && j > q - w));
    }
    Array::from_slice(&m, &[n, end])
}

/// Loads layer `i`: the projections by whichever names the architecture
/// uses, fused where the file has them fused.
fn load_layer(w: &mut Weights, cfg: &ModelConfig, i: usize) -> Result<Layer> {
    let p = format!("model.layers.{i}");
    let a = format!("{p}.self_attn");
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let qkv = if w.has(&format!("{a}.qkv_proj.weight")) {
        let (q, kv) = ((nh * hd) as i32, (nkv * hd) as i32);
        Projections::Fused(w.linear(&format!("{a}.qkv_proj"))?, vec![q, q + kv])
    } else {
        Projections::new(vec![
            w.linear(&format!("{a}.q_proj"))?,
            w.linear(&format!("{a}.k_proj"))?,
            w.linear(&format!("{a}.v_proj"))?,
        ])?
    };
    let g = cfg.gemma;
    let one = cfg.norms_plus_one;
    let optional_norm = |w: &mut Weights, name: &str| -> Result<Option<Array>> {
        if w.has(name) {
            Ok(Some(w.norm(name, one)?))
        } else {
            Ok(None)
        }
    };
    let q_norm = optional_norm(w, &format!("{a}.q_norm.weight"))?;
    let k_norm = optional_norm(w, &format!("{a}.k_norm.weight"))?;
    // Gemma's post_attention_layernorm norms the attention output; the
    // llama shape's is the norm before the MLP.
    let (post_attn_norm, ffn_norm, post_ffn_norm) = if g {
        (
            Some(w.norm(&format!("{p}.post_attention_layernorm.weight"), one)?),
            w.norm(&format!("{p}.pre_feedforward_layernorm.weight"), one)?,
            Some(w.norm(&format!("{p}.post_feedforward_layernorm.weight"), one)?),
        )
    } else {
        (
            None,
            w.norm(&format!("{p}.post_attention_layernorm.weight"), one)?,
            None,
        )
    };
    let m = format!("{p}.mlp");
    let mlp = match &cfg.moe {
        Some(moe) if cfg.sparse(i) => {
            let router = if w.has(&format!("{m}.router.weight")) {
                w.linear(&format!("{m}.router"))?
            } else {
                w.linear(&format!("{m}.gate"))?
            };
            let mut expert = |name: &str| -> Result<Linear> {
                for stacked in [
                    format!("{m}.switch_mlp.{name}"),
                    format!("{m}.experts.{name}"),
                ] {
                    if w.has(&format!("{stacked}.weight")) {
                        return w.linear(&stacked);
                    }
                }
                let parts = (0..moe.num_experts)
                    .map(|e| w.linear(&format!("{m}.experts.{e}.{name}")))
                    .collect::<Result<Vec<_>>>()?;
                Linear::stack(parts)
            };
            Mlp::Experts(Experts {
                gate: expert("gate_proj")?,
                up: expert("up_proj")?,
                down: expert("down_proj")?,
                router,
                top_k: moe.top_k as i32,
                routing: moe.routing,
                normalize: moe.normalize,
            })
        }
        _ => {
            let gate_up = if w.has(&format!("{m}.gate_up_proj.weight")) {
                let l = w.linear(&format!("{m}.gate_up_proj"))?;
                let half = l.out_features() / 2;
                Projections::Fused(l, vec![half])
            } else {
                Projections::new(vec![
                    w.linear(&format!("{m}.gate_proj"))?,
                    w.linear(&format!("{m}.up_proj"))?,
                ])?
            };
            Mlp::Dense {
                gate_up,
                down: w.linear(&format!("{m}.down_proj"))?,
            }
        }
    };
    let dims = if cfg.rope_dims == 0 {
        hd
    } else {
        cfg.rope_dims
    };
    let window = cfg.window(i);
    let rope = match (window, cfg.rope_local_theta) {
        (Some(_), Some(local)) => Rope::new(dims, cfg.rope_traditional, local, &Scaling::default()),
        _ => Rope::new(
            dims,
            cfg.rope_traditional,
            cfg.rope_theta,
            &cfg.rope_scaling,
        ),
    };
    let sinks = if w.has(&format!("{a}.sinks")) {
        Some(w.dense(&format!("{a}.sinks"))?)
    } else {
        None
    };
    Ok(Layer {
        attn_norm: w.norm(&format!("{p}.input_layernorm.weight"), one)?,
        qkv,
        q_norm,
        k_norm,
        o_proj: w.linear(&format!("{a}.o_proj"))?,
        post_attn_norm,
        ffn_norm,
        mlp,
        post_ffn_norm,
        rope,
        window: window.map(|x| x as i32),
        sinks,
    })
}

impl Transformer {
    /// One decode step for every row of `batch`: the projections run as one
    /// `[B, hidden]` matmul each (weights read once), attention runs over the
    /// shared right-aligned buffers with each row's padding masked out and
    /// each row's own rotary position.
    pub(super) fn forward_batch_hidden(
        &self,
        tokens: &[u32],
        batch: &mut MlxBatch,
    ) -> Result<Array> {
        let b = tokens.len() as i32;
        // Rows of one matrix, not a batch of 1-row matrices: the projections
        // then run as one [B, hidden] matmul instead of B matrix-vector products.
        let mut h = self.embed_tokens(tokens)?;
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
        // Row r sees columns from its first real one, and a sliding layer
        // only the last `w` of those.
        let mask_from = |w: Option<i32>| {
            let mut m = Vec::with_capacity((b * t) as usize);
            for &p in &batch.pads {
                let first = w.map_or(p, |w| p.max(col - w + 1));
                m.extend((0..t).map(|c| c >= first));
            }
            Array::from_slice(&m, &[b, 1, 1, t])
        };
        let mut masks: Vec<(Option<i32>, Array)> = Vec::new();
        for l in &self.layers {
            if !masks.iter().any(|(w, _)| *w == l.window) {
                masks.push((l.window, mask_from(l.window)));
            }
        }
        let scale = self.attn_scale();
        let shape = self.shape();
        let eps = shape.eps;
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
            let q = l.rope.apply_at(&q, &positions)?;
            let k = l.rope.apply_at(&k, &positions)?;
            let (kb, vb) = batch
                .layers
                .get_mut(li)
                .ok_or_else(|| EngineError::Backend(format!("batch has no layer {li}")))?;
            kb.try_index_mut((.., .., col..t, ..), &k)?;
            vb.try_index_mut((.., .., col..t, ..), &v)?;
            let keys = kb.index((.., .., 0..t, ..));
            let values = vb.index((.., .., 0..t, ..));
            let mask = masks
                .iter()
                .find(|(w, _)| *w == l.window)
                .map(|(_, m)| m)
                .ok_or_else(|| EngineError::Backend("attention mask".into()))?;
            let o = fast::scaled_dot_product_attention(
                &q,
                &keys,
                &values,
                scale,
                ScaledDotProductAttentionMask::Array(mask),
                l.sinks.as_ref(),
            )?;
            let o = o.reshape(&[1, b, nh * hd])?;
            h = l.finish(h, &o, shape)?;
        }
        batch.idx += 1;
        Ok(h)
    }
}

impl Transformer {
    /// Next-token logits (float32) for the last position of `h`.
    pub fn logits_last(&self, h: &Array) -> Result<Array> {
        let last = h.index((.., -1, ..));
        self.logits(&last)
    }

    /// Logits (float32) of hidden states `[rows, hidden]`.
    pub(super) fn logits(&self, h: &Array) -> Result<Array> {
        let head = self.head.as_ref().ok_or_else(|| {
            EngineError::Backend("this pipeline stage has no output head (not the last)".into())
        })?;
        let x = fast::rms_norm(h, Some(&head.norm), self.cfg.rms_norm_eps)?;
        Ok(head.lm_head.apply(&x)?.as_dtype(Dtype::Float32)?)
    }

    pub(super) fn embedding(&self) -> Result<&Array> {
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

    fn turn(&self) -> crate::backend::Turn {
        Some(super::turns::mlx_turn())
    }

    fn persists_cache(&self) -> bool {
        true
    }

    fn payload_layout(&self) -> Option<crate::disk_cache::layout::LayoutFn> {
        Some(super::cache::payload_layout)
    }

    fn restore_cache(&self, payload: &[u8], tokens: &[u32]) -> Result<Box<dyn KvCache>> {
        let shape = (self.layers.len(), self.cfg.num_kv_heads, self.cfg.head_dim);
        Ok(Box::new(MlxCache::restore(
            payload,
            tokens.len(),
            shape,
            self.dtype,
        )?))
    }

    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidRequest("no tokens to run".into()));
        }
        let cache: &mut MlxCache = downcast(cache.as_any_mut(), "KV cache")?;
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
        let batch: &mut MlxBatch = downcast(batch.as_any_mut(), "decode batch")?;
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
