//! One sequence's key/value state.
use std::any::Any;

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{self};
use mlx_rs::{Array, Dtype};

use crate::backend::KvCache;
use crate::error::{EngineError, Result};

/// Preallocated per-layer key/value buffers, grown in steps so decode does not
/// copy the whole history every token.
#[derive(Default, Clone)]
pub struct MlxCache {
    pub(super) layers: Vec<(Array, Array)>,
    pub(super) offset: usize,
    pub(super) capacity: usize,
}

pub(super) const CACHE_STEP: usize = 256;

impl MlxCache {
    pub(super) fn reserve(
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

    pub(super) fn update(
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

    pub(super) fn arrays(&self) -> impl Iterator<Item = &Array> {
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
