//! One decoder layer's weights and the parts of its step around attention:
//! the projections, the norms, and a dense or mixture-of-experts MLP.

use mlx_rs::fast::{self};
use mlx_rs::ops::{self, argpartition_axis, indexing::take_along_axis};
use mlx_rs::{Array, Dtype};

use super::config::{Activation, Routing};
use super::rope::Rope;
use super::*;
use crate::error::{EngineError, Result};

pub(super) struct Layer {
    pub(super) attn_norm: Array,
    pub(super) qkv: Projections,
    pub(super) q_norm: Option<Array>,
    pub(super) k_norm: Option<Array>,
    pub(super) o_proj: Linear,
    /// Gemma: the attention output is normed before the residual add.
    pub(super) post_attn_norm: Option<Array>,
    pub(super) ffn_norm: Array,
    pub(super) mlp: Mlp,
    /// Gemma: the MLP output is normed before the residual add.
    pub(super) post_ffn_norm: Option<Array>,
    pub(super) rope: Rope,
    /// Attend only to the last `w` positions.
    pub(super) window: Option<i32>,
    /// gpt-oss: a learned per-head logit that joins every softmax.
    pub(super) sinks: Option<Array>,
}

/// The feed-forward half of a layer.
pub(super) enum Mlp {
    /// `down(act(gate) * up)`, gate and up fused when possible.
    Dense {
        gate_up: Projections,
        down: Linear,
    },
    Experts(Experts),
}

/// Knobs every layer of a model shares.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub(super) eps: f32,
    pub(super) act: Activation,
    /// Float16 residual adds are clipped to its range (gemma, as mlx-lm).
    pub(super) clip_f16: bool,
}

impl Layer {
    /// Query, key and value projections of the normed input (flat heads).
    pub(super) fn qkv(&self, h: &Array, eps: f32) -> Result<[Array; 3]> {
        let x = fast::rms_norm(h, Some(&self.attn_norm), eps)?;
        <[Array; 3]>::try_from(self.qkv.apply(&x)?)
            .map_err(|_| EngineError::Backend("qkv split".into()))
    }

    /// The rest of the layer after attention: output projection and the
    /// MLP, each added to the residual stream.
    pub(super) fn finish(&self, h: Array, attn: &Array, s: Shape) -> Result<Array> {
        let mut r = self.o_proj.apply(attn)?;
        if let Some(w) = &self.post_attn_norm {
            r = fast::rms_norm(&r, Some(w), s.eps)?;
        }
        let h = residual(&h, &r, s.clip_f16)?;
        let x = fast::rms_norm(&h, Some(&self.ffn_norm), s.eps)?;
        let mut r = match &self.mlp {
            Mlp::Dense { gate_up, down } => {
                let [g, u] = <[Array; 2]>::try_from(gate_up.apply(&x)?)
                    .map_err(|_| EngineError::Backend("gate/up split".into()))?;
                down.apply(&activate(s.act, &g, &u)?)?
            }
            Mlp::Experts(e) => e.apply(&x, s.act)?,
        };
        if let Some(w) = &self.post_ffn_norm {
            r = fast::rms_norm(&r, Some(w), s.eps)?;
        }
        residual(&h, &r, s.clip_f16)
    }

    pub(super) fn arrays(&self) -> Vec<&Array> {
        let mut out = vec![&self.attn_norm, &self.ffn_norm];
        out.extend(self.q_norm.iter().chain(&self.k_norm));
        out.extend(self.post_attn_norm.iter().chain(&self.post_ffn_norm));
        out.extend(self.sinks.iter());
        self.qkv.push_arrays(&mut out);
        push_linear(&mut out, &self.o_proj);
        match &self.mlp {
            Mlp::Dense { gate_up, down } => {
                gate_up.push_arrays(&mut out);
                push_linear(&mut out, down);
            }
            Mlp::Experts(e) => {
                push_linear(&mut out, &e.router);
                for s in [&e.gate, &e.up, &e.down] {
                    push_linear(&mut out, s);
                }
            }
        }
        out
    }
}

/// `x + y`; in float16, summed in float32 and clipped to float16's range.
fn residual(x: &Array, y: &Array, clip_f16: bool) -> Result<Array> {
    if !clip_f16 || x.dtype() != Dtype::Float16 {
        return Ok(x.add(y)?);
    }
    let sum = x
        .as_dtype(Dtype::Float32)?
        .add(y.as_dtype(Dtype::Float32)?)?;
    Ok(ops::clip(&sum, (-65504.0f32, 65504.0f32))?.as_dtype(Dtype::Float16)?)
}

/// A scalar in `like`'s dtype, so arithmetic does not promote.
fn scalar(v: f32, like: &Array) -> Result<Array> {
    Ok(Array::from_f32(v).as_dtype(like.dtype())?)
}

/// `act(gate) * up`.
pub(super) fn activate(act: Activation, g: &Array, u: &Array) -> Result<Array> {
    Ok(match act {
        Activation::Silu => mlx_rs::nn::silu(g)?.multiply(u)?,
        Activation::GeluApprox => mlx_rs::nn::gelu_approximate(g)?.multiply(u)?,
        Activation::SwigluOai => {
            let limit = scalar(7.0, g)?;
            let g = ops::minimum(g, &limit)?;
            let u = ops::clip(u, (&limit.negative()?, &limit))?;
            let glu = g.multiply(mlx_rs::ops::sigmoid(g.multiply(scalar(1.702, &g)?)?)?)?;
            u.add(scalar(1.0, &u)?)?.multiply(glu)?
        }
    })
}

/// A mixture-of-experts MLP: a router picks `top_k` experts per token and
/// their outputs are summed by the routing weights. Expert weights are
/// stacked `[experts, out, in]`.
pub(super) struct Experts {
    pub(super) router: Linear,
    pub(super) gate: Linear,
    pub(super) up: Linear,
    pub(super) down: Linear,
    pub(super) top_k: i32,
    pub(super) routing: Routing,
    pub(super) normalize: bool,
}

impl Experts {
    /// `x` `[.., tokens, hidden]` → the same shape.
    pub(super) fn apply(&self, x: &Array, act: Activation) -> Result<Array> {
        let logits = self.router.apply(x)?;
        let experts = logits.shape().last().copied().unwrap_or(0);
        let k = self.top_k;
        if k <= 0 || k > experts {
            return Err(EngineError::InvalidModel(format!(
                "{k} experts per token out of {experts}"
            )));
        }
        let last_k = Array::from_iter(experts - k..experts, &[k]);
        let top = |a: &Array| -> Result<Array> {
            Ok(argpartition_axis(a, experts - k, -1)?.take_axis(&last_k, -1)?)
        };
        let (inds, scores) = match self.routing {
            Routing::SoftmaxThenTopK => {
                let p = ops::softmax_axis(&logits, -1, true)?;
                let inds = top(&p)?;
                let mut s = take_along_axis(&p, &inds, -1)?;
                if self.normalize {
                    s = s.divide(s.sum_axis(-1, true)?)?;
                }
                (inds, s)
            }
            Routing::TopKThenSoftmax => {
                let inds = top(&logits)?;
                let v = take_along_axis(&logits, &inds, -1)?;
                (inds, ops::softmax_axis(&v, -1, true)?)
            }
        };
        // [.., tokens, 1, 1, hidden]: each token a one-row matrix, gathered
        // against its experts' weights.
        let xe = x.expand_dims_axes(&[-2, -3])?;
        let up = self.up.apply_experts(&xe, &inds)?;
        let gate = self.gate.apply_experts(&xe, &inds)?;
        let y = self
            .down
            .apply_experts(&activate(act, &gate, &up)?, &inds)?;
        let y = y.squeeze_axes(&[-2])?;
        Ok(y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, false)?)
    }
}
