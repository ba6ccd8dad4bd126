//! Projections: dense or MLX-affine-quantized weights, fused when possible.

use mlx_rs::ops::{self, concatenate};
use mlx_rs::{Array, Dtype};

use crate::error::{EngineError, Result};

/// A projection `y = x Wᵀ (+ b)`, dense or MLX-affine-quantized.
pub(super) enum Linear {
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
    pub(super) fn apply(&self, x: &Array) -> Result<Array> {
        self.project(x, None)
    }

    /// Stacked expert weights `[experts, out, in]`: each row of `x`
    /// `[.., 1, in]` through the experts `inds` `[.., k]` names, giving
    /// `[.., k, 1, out]`.
    pub(super) fn apply_experts(&self, x: &Array, inds: &Array) -> Result<Array> {
        self.project(x, Some(inds))
    }

    fn project(&self, x: &Array, inds: Option<&Array>) -> Result<Array> {
        let (y, b) = match self {
            Linear::Dense { w, b } => (
                match inds {
                    None => x.matmul(w.t())?,
                    Some(i) => ops::gather_mm(x, w.swap_axes(-1, -2)?, None, i, false)?,
                },
                b,
            ),
            Linear::Quantized {
                w,
                scales,
                biases,
                group,
                bits,
                b,
            } => (
                match inds {
                    None => ops::quantized_matmul(x, w, scales, biases, true, *group, *bits)?,
                    Some(i) => {
                        ops::gather_qmm(x, w, scales, biases, None, i, true, *group, *bits, false)?
                    }
                },
                b,
            ),
        };
        Ok(match (b, inds) {
            (None, _) => y,
            (Some(b), None) => y.add(b)?,
            (Some(b), Some(i)) => y.add(b.take_axis(i, 0)?.expand_dims(-2)?)?,
        })
    }

    /// The weights as one dense matrix (quantized ones expanded).
    pub(super) fn into_dense(self, dtype: Dtype) -> Result<Array> {
        match self {
            Linear::Dense { w, .. } => Ok(w),
            Linear::Quantized {
                w,
                scales,
                biases,
                group,
                bits,
                ..
            } => Ok(dequantize_f32(&w, &scales, &biases, group, bits)?.as_dtype(dtype)?),
        }
    }

    pub(super) fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { w, .. } | Linear::Quantized { w, .. } => w.shape()[0],
        }
    }

    pub(super) fn nbytes(&self) -> usize {
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

    /// Stacks per-expert projections into one `[experts, out, in]` tensor
    /// (files that store each expert apart).
    pub(super) fn stack(parts: Vec<Linear>) -> Result<Linear> {
        let mut ws = Vec::new();
        let mut bs = Vec::new();
        let mut qs: [Vec<Array>; 2] = [Vec::new(), Vec::new()];
        let mut quant = None;
        for p in parts {
            match p {
                Linear::Dense { w, b } => {
                    ws.push(w);
                    bs.extend(b);
                }
                Linear::Quantized {
                    w,
                    scales,
                    biases,
                    group,
                    bits,
                    b,
                } => {
                    ws.push(w);
                    qs[0].push(scales);
                    qs[1].push(biases);
                    bs.extend(b);
                    quant = Some((group, bits));
                }
            }
        }
        let n = ws.len();
        if n == 0 || (!bs.is_empty() && bs.len() != n) || (quant.is_some() && qs[0].len() != n) {
            return Err(EngineError::InvalidModel(
                "experts differ in shape or quantization".into(),
            ));
        }
        let b = if bs.is_empty() {
            None
        } else {
            Some(ops::stack(&bs, 0)?)
        };
        let w = ops::stack(&ws, 0)?;
        Ok(match quant {
            None => Linear::Dense { w, b },
            Some((group, bits)) => Linear::Quantized {
                w,
                scales: ops::stack(&qs[0], 0)?,
                biases: ops::stack(&qs[1], 0)?,
                group,
                bits,
                b,
            },
        })
    }

    /// Stacks dense projections that read the same input into one matmul
    /// (q/k/v, gate/up): fewer, larger ops are what decode speed depends on.
    pub(super) fn fuse(parts: Vec<Linear>) -> Result<(Linear, Vec<i32>)> {
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
pub(super) enum Projections {
    Fused(Linear, Vec<i32>),
    Separate(Vec<Linear>),
}

impl Projections {
    pub(super) fn new(parts: Vec<Linear>) -> Result<Self> {
        if parts.iter().all(|p| matches!(p, Linear::Dense { .. })) {
            let (l, s) = Linear::fuse(parts)?;
            Ok(Projections::Fused(l, s))
        } else {
            Ok(Projections::Separate(parts))
        }
    }
    pub(super) fn apply(&self, x: &Array) -> Result<Vec<Array>> {
        match self {
            Projections::Fused(l, splits) => Ok(ops::split_at_indices(l.apply(x)?, splits, -1)?),
            Projections::Separate(ls) => ls.iter().map(|l| l.apply(x)).collect(),
        }
    }
    pub(super) fn push_arrays<'a>(&'a self, out: &mut Vec<&'a Array>) {
        match self {
            Projections::Fused(l, _) => push_linear(out, l),
            Projections::Separate(ls) => ls.iter().for_each(|l| push_linear(out, l)),
        }
    }
}

/// Dequantizes with float32 scales: they are float16 on disk, and letting MLX
/// compute in their dtype would round every weight to half precision.
pub(super) fn dequantize_f32(
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

pub(super) fn push_linear<'a>(out: &mut Vec<&'a Array>, l: &'a Linear) {
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
