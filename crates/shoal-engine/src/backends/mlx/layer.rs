//! One decoder layer's weights and the parts of its step around attention.

use mlx_rs::fast::{self};
use mlx_rs::Array;

use super::*;
use crate::error::{EngineError, Result};

pub(super) struct Layer {
    pub(super) attn_norm: Array,
    pub(super) qkv: Projections,
    pub(super) q_norm: Option<Array>,
    pub(super) k_norm: Option<Array>,
    pub(super) o_proj: Linear,
    pub(super) ffn_norm: Array,
    pub(super) gate_up: Projections,
    pub(super) down: Linear,
}

impl Layer {
    /// Query, key and value projections of the normed input (flat heads).
    pub(super) fn qkv(&self, h: &Array, eps: f32) -> Result<[Array; 3]> {
        let x = fast::rms_norm(h, Some(&self.attn_norm), eps)?;
        <[Array; 3]>::try_from(self.qkv.apply(&x)?)
            .map_err(|_| EngineError::Backend("qkv split".into()))
    }

    /// The rest of the layer after attention: output projection and the
    /// gated MLP, each added to the residual stream.
    pub(super) fn finish(&self, h: Array, attn: &Array, eps: f32) -> Result<Array> {
        let h = h.add(self.o_proj.apply(attn)?)?;
        let x = fast::rms_norm(&h, Some(&self.ffn_norm), eps)?;
        let [g, u] = <[Array; 2]>::try_from(self.gate_up.apply(&x)?)
            .map_err(|_| EngineError::Backend("gate/up split".into()))?;
        let act = mlx_rs::nn::silu(&g)?.multiply(&u)?;
        Ok(h.add(self.down.apply(&act)?)?)
    }
}
