//! The decoder-only transformer: built from named tensors, run one
//! sequence or a batch at a time, behind the backend seam.
use std::collections::HashMap;

use mlx_rs::fast::{self, ScaledDotProductAttentionMask};
use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{Array, Dtype};

use super::*;
use crate::backend::{DecodeBatch, KvCache, LanguageModel, ModelInfo};
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
    pub(super) rope_freqs: Option<Array>,
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
    pub(super) fn materialize(&mut self) -> Result<()> {
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

    pub(super) fn rope(&self, x: &Array, offset: i32) -> Result<Array> {
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

    pub(super) fn forward_hidden(&self, tokens: &[u32], cache: &mut MlxCache) -> Result<Array> {
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
    pub(super) fn forward_batch_hidden(
        &self,
        tokens: &[u32],
        batch: &mut MlxBatch,
    ) -> Result<Array> {
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
    pub(super) fn rope_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        let d = self.cfg.head_dim as i32;
        let trad = self.cfg.rope_traditional;
        Ok(match &self.rope_freqs {
            Some(f) => fast::rope_dynamic(x, d, trad, None, 1.0, positions, f)?,
            None => fast::rope_dynamic(x, d, trad, self.cfg.rope_theta, 1.0, positions, None)?,
        })
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
