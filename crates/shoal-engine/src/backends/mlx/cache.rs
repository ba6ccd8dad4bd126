//! One sequence's key/value state.
use std::any::Any;
use std::io::Write;
use std::path::Path;

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::ops::{self};
use mlx_rs::{Array, Dtype};

use crate::backend::KvCache;
use crate::disk_cache::layout::{Layout, Piece, Reader};
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

    /// A cache of `len` positions from the bytes of a file [`KvCache::save`] wrote,
    /// for a model of `(layers, kv_heads, head_dim)` computing in `dtype`.
    /// Values are stored as f32, which every compute dtype round-trips
    /// through exactly.
    pub(super) fn restore(
        bytes: &[u8],
        len: usize,
        (layers, nkv, hd): (usize, usize, usize),
        dtype: Dtype,
    ) -> Result<MlxCache> {
        let bad = |why: &str| EngineError::Backend(format!("stored MLX cache: {why}"));
        let head: [u32; 4] = [layers as u32, len as u32, nkv as u32, hd as u32];
        let mut want = MLX_MAGIC.to_vec();
        for h in head {
            want.extend_from_slice(&h.to_le_bytes());
        }
        if !bytes.starts_with(&want) {
            return Err(bad("made for another model or length"));
        }
        let per = nkv * len * hd;
        let body = &bytes[want.len()..];
        if body.len() != layers * 2 * per * 4 {
            return Err(bad("wrong size"));
        }
        let cap = len.div_ceil(CACHE_STEP) * CACHE_STEP;
        let full = [1, nkv as i32, cap as i32, hd as i32];
        let part = [1, nkv as i32, len as i32, hd as i32];
        let mut out = Vec::with_capacity(layers);
        for chunk in body.chunks_exact(2 * per * 4) {
            let mut pair = Vec::with_capacity(2);
            for half in chunk.chunks_exact(per * 4) {
                let values: Vec<f32> = half
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let stored = Array::from_slice(&values, &part).as_dtype(dtype)?;
                let mut a = ops::zeros_dtype(&full, dtype)?;
                a.try_index_mut((.., .., 0..len as i32, ..), &stored)?;
                pair.push(a);
            }
            let v = pair.pop().ok_or_else(|| bad("no values"))?;
            let k = pair.pop().ok_or_else(|| bad("no keys"))?;
            out.push((k, v));
        }
        let arrays: Vec<&Array> = out.iter().flat_map(|(k, v)| [k, v]).collect();
        mlx_rs::transforms::eval(arrays)?;
        Ok(MlxCache {
            layers: out,
            offset: len,
            capacity: cap,
        })
    }
}

/// The first bytes of a stored MLX cache, before its shape.
const MLX_MAGIC: &[u8; 8] = b"SHOALMLX";

/// The layout of a payload [`KvCache::save`] wrote: the magic and layer
/// count, the length, the head count and size, then for each layer's keys
/// and values one run per head of a row (`head_dim` f32) per position.
pub(super) fn payload_layout(bytes: &[u8]) -> Option<Layout> {
    let mut r = Reader::new(bytes);
    if r.take(8).ok()? != MLX_MAGIC {
        return None;
    }
    let layers = r.u32().ok()? as usize;
    let head = Piece::Fixed(r.since(0).to_vec());
    let len = r.u32().ok()? as usize;
    let at = r.at;
    let (nkv, hd) = (r.u32().ok()? as usize, r.u32().ok()? as usize);
    if hd == 0 || layers.checked_mul(2 * nkv)? > 1 << 20 {
        return None;
    }
    let mut pieces = vec![head, Piece::Count, Piece::Fixed(r.since(at).to_vec())];
    pieces.extend((0..layers * 2 * nkv).map(|_| Piece::Rows {
        width: hd * 4,
        cells: false,
    }));
    Some(Layout {
        pieces,
        rows: len,
        order: None,
    })
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
    fn save(&mut self, path: &Path, tokens: &[u32]) -> Result<()> {
        let len = self.offset;
        if tokens.len() != len || len == 0 {
            return Err(EngineError::Backend(format!(
                "{} tokens for a cache of {len} positions",
                tokens.len()
            )));
        }
        let (nkv, hd) = match self.layers.first() {
            Some((k, _)) => (k.shape()[1], k.shape()[3]),
            None => return Err(EngineError::Backend("an empty cache".into())),
        };
        let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        w.write_all(MLX_MAGIC)?;
        for h in [self.layers.len() as u32, len as u32, nkv as u32, hd as u32] {
            w.write_all(&h.to_le_bytes())?;
        }
        for (k, v) in &self.layers {
            for a in [k, v] {
                let part = a
                    .index((.., .., 0..len as i32, ..))
                    .as_dtype(Dtype::Float32)?
                    .contiguous()?;
                let values = part
                    .try_as_slice::<f32>()
                    .map_err(|e| EngineError::Backend(e.to_string()))?;
                let mut buf = Vec::with_capacity(values.len() * 4);
                for x in values {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
                w.write_all(&buf)?;
            }
        }
        w.flush()?;
        Ok(())
    }
}
