//! Tensors by Hugging Face name, placed as the device policy says.
use std::collections::HashMap;

use mlx_rs::Array;

use super::*;
use crate::error::{EngineError, Result};

/// Pulls tensors out of the loader's map by Hugging Face name.
pub(super) struct Weights {
    pub(super) map: HashMap<String, Array>,
    pub(super) policy: DevicePolicy,
    /// Default group size for quantized tensors (bits are inferred from shapes).
    pub(super) group: i32,
    /// Layers quantized otherwise: prefix → (group size, bits).
    pub(super) overrides: std::collections::HashMap<String, (i32, i32)>,
}

impl Weights {
    pub(super) fn take(&mut self, name: &str) -> Result<Array> {
        self.map
            .remove(name)
            .ok_or_else(|| EngineError::MissingModelPart {
                what: "tensor".into(),
                detail: name.into(),
            })
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// An RMS norm's scale; gemma's norms scale by `1 + w`.
    pub(super) fn norm(&mut self, name: &str, plus_one: bool) -> Result<Array> {
        let w = self.dense(name)?;
        if plus_one {
            let one = Array::from_f32(1.0).as_dtype(w.dtype())?;
            Ok(w.add(one)?)
        } else {
            Ok(w)
        }
    }

    pub(super) fn dense(&mut self, name: &str) -> Result<Array> {
        let dtype = self.policy.dtype();
        let t = self.take(name)?;
        Ok(t.as_dtype(dtype)?)
    }

    /// Loads `prefix.weight` (+ `.scales`/`.biases` when quantized, + `.bias`).
    pub(super) fn linear(&mut self, prefix: &str) -> Result<Linear> {
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
    pub(super) fn embedding(&mut self, prefix: &str) -> Result<Array> {
        let dtype = self.policy.dtype();
        self.linear(prefix)?.into_dense(dtype)
    }

    pub(super) fn group_bits(&self, prefix: &str, w: &Array, scales: &Array) -> Result<(i32, i32)> {
        if let Some(&gb) = self.overrides.get(prefix) {
            return Ok(gb);
        }
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
