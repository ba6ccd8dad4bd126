//! Several sequences decoded together in shared key/value buffers.
use std::any::Any;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::ops::{self, concatenate};
use mlx_rs::Array;

use super::*;
use crate::backend::{downcast, DecodeBatch, KvCache};
use crate::error::{EngineError, Result};

/// Several sequences' key/value state in shared `[rows, kv heads, columns,
/// head dim]` buffers, right-aligned: every row's next token goes to the same
/// column `idx`, so one slice update per layer writes them all; row `r`'s
/// first `pads[r]` columns are padding, masked out of attention.
#[derive(Default)]
pub struct MlxBatch {
    pub(super) layers: Vec<(Array, Array)>,
    pub(super) pads: Vec<i32>,
    pub(super) idx: i32,
    pub(super) cap: i32,
}

impl MlxBatch {
    pub(super) fn eval(&self) -> Result<()> {
        mlx_rs::transforms::eval(self.layers.iter().flat_map(|(k, v)| [k, v]))?;
        Ok(())
    }

    /// Grows the buffers so column `idx` exists.
    pub(super) fn make_room(&mut self) -> Result<()> {
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
    pub(super) fn zeros_like_cols(like: &Array, rows: i32, cols: i32) -> Result<Array> {
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
        let c: &mut MlxCache = downcast(cache.as_any_mut(), "KV cache")?;
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
