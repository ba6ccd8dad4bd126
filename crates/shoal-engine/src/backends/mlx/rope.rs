//! Rotary position embeddings: the scaling variants a config can ask for,
//! reduced to what MLX's fast rope takes (a base or per-pair periods, a
//! position scale) plus a factor on the rotated part of the input.
use mlx_rs::fast;
use mlx_rs::ops::{self, indexing::IndexOp};
use mlx_rs::Array;
use serde_json::Value;

use crate::error::{EngineError, Result};

/// How a config scales its rope, resolved to numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scaling {
    /// Per-pair rotary periods, replacing `base^(2i/d)`.
    pub freqs: Option<Vec<f32>>,
    /// Linear scaling: positions are multiplied by this.
    pub scale: Option<f32>,
    /// Factor on the rotated part of queries and keys.
    pub input_scale: Option<f32>,
}

/// The context lengths LongRoPE's attention factor depends on: the config's
/// `max_position_embeddings` and, when `rope_scaling` does not say it, the
/// top-level `original_max_position_embeddings` (phi3 puts it there).
#[derive(Clone, Copy, Debug, Default)]
pub struct Context {
    pub max_positions: f64,
    pub original: Option<f64>,
}

/// Reads `rope_scaling` for a rope over `dims` dimensions with `base`.
pub fn scaling(s: Option<&Value>, base: f32, dims: usize, ctx: Context) -> Result<Scaling> {
    let Some(s) = s.filter(|s| s.is_object()) else {
        return Ok(Scaling::default());
    };
    let kind = s
        .get("type")
        .or_else(|| s.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let g = |k: &str| s.get(k).and_then(Value::as_f64);
    let periods = || -> Vec<f64> {
        (0..dims / 2)
            .map(|i| (base as f64).powf(2.0 * i as f64 / dims as f64))
            .collect()
    };
    let need = |k: &str| {
        g(k).ok_or_else(|| EngineError::InvalidModel(format!("rope_scaling {kind} needs '{k}'")))
    };
    Ok(match kind {
        "default" => Scaling::default(),
        "linear" => Scaling {
            scale: Some((1.0 / need("factor")?) as f32),
            ..Scaling::default()
        },
        "llama3" => {
            let factor = g("factor").unwrap_or(8.0);
            let low = g("low_freq_factor").unwrap_or(1.0);
            let high = g("high_freq_factor").unwrap_or(4.0);
            let orig = g("original_max_position_embeddings").unwrap_or(8192.0);
            let (low_wavelen, high_wavelen) = (orig / low, orig / high);
            let freqs = periods()
                .into_iter()
                .map(|period| {
                    let wavelen = 2.0 * std::f64::consts::PI * period;
                    let p = if wavelen < high_wavelen {
                        period
                    } else if wavelen > low_wavelen {
                        period * factor
                    } else {
                        let smooth = (orig / wavelen - low) / (high - low);
                        period / ((1.0 - smooth) / factor + smooth)
                    };
                    p as f32
                })
                .collect();
            Scaling {
                freqs: Some(freqs),
                ..Scaling::default()
            }
        }
        "yarn" => {
            let factor = need("factor")?;
            let orig = g("original_max_position_embeddings").unwrap_or(4096.0);
            let (fast_b, slow_b) = (
                g("beta_fast").unwrap_or(32.0),
                g("beta_slow").unwrap_or(1.0),
            );
            let (m, m_all) = (
                g("mscale").unwrap_or(1.0),
                g("mscale_all_dim").unwrap_or(0.0),
            );
            let d = dims as f64;
            let correction = |rotations: f64| {
                d * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * (base as f64).ln())
            };
            let low = correction(fast_b).floor().max(0.0);
            let high = correction(slow_b).ceil().min(d - 1.0);
            let high = if low == high { high + 0.001 } else { high };
            let get_mscale = |mscale: f64| {
                if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * factor.ln() + 1.0
                }
            };
            let input = get_mscale(m) / get_mscale(m_all);
            let freqs = periods()
                .into_iter()
                .enumerate()
                .map(|(i, extra)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let mask = 1.0 - ramp;
                    let inter = factor * extra;
                    ((inter * extra) / (inter * mask + extra * (1.0 - mask))) as f32
                })
                .collect();
            Scaling {
                freqs: Some(freqs),
                scale: None,
                input_scale: (input != 1.0).then_some(input as f32),
            }
        }
        // LongRoPE: the long factors, always (as mlx-lm does), with the
        // attention factor from the context extension.
        "longrope" | "su" => {
            let long = factors(s.get("long_factor"), dims / 2)?;
            let orig = g("original_max_position_embeddings")
                .or(ctx.original)
                .unwrap_or(4096.0);
            let factor = ctx.max_positions / orig;
            let input = g("long_mscale").unwrap_or(longrope_attention(factor, orig));
            let freqs = periods()
                .into_iter()
                .zip(long)
                .map(|(p, f)| (p * f) as f32)
                .collect();
            Scaling {
                freqs: Some(freqs),
                scale: None,
                input_scale: Some(input as f32),
            }
        }
        other => {
            return Err(EngineError::Unsupported(format!(
                "rope_scaling type '{other}'"
            )))
        }
    })
}

/// LongRoPE's factor on the rotated part of q and k for a context `factor`
/// times the original one of `orig` positions.
pub fn longrope_attention(factor: f64, orig: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / orig.ln()).sqrt()
    }
}

/// Rotary periods `base^(2i/d)` over `d = 2 * factors.len()` dimensions,
/// each multiplied by its factor (Llama 3.1's `rope_freqs`, LongRoPE's).
pub fn scaled_periods(base: f32, factors: &[f32]) -> Vec<f32> {
    let dims = (factors.len() * 2) as f32;
    factors
        .iter()
        .enumerate()
        .map(|(i, f)| base.powf(2.0 * i as f32 / dims) * f)
        .collect()
}

/// A list of `n` factors, or one number for all.
fn factors(v: Option<&Value>, n: usize) -> Result<Vec<f64>> {
    match v {
        Some(Value::Number(x)) => Ok(vec![x.as_f64().unwrap_or(1.0); n]),
        Some(Value::Array(a)) if a.len() == n => {
            Ok(a.iter().map(|x| x.as_f64().unwrap_or(1.0)).collect())
        }
        _ => Err(EngineError::InvalidModel(format!(
            "rope_scaling long_factor must be a number or a list of {n}"
        ))),
    }
}

/// One layer's rope, ready to apply.
#[derive(Clone)]
pub(super) struct Rope {
    pub(super) dims: i32,
    pub(super) traditional: bool,
    pub(super) base: f32,
    pub(super) freqs: Option<Array>,
    pub(super) scale: f32,
    pub(super) input_scale: Option<f32>,
}

impl Rope {
    pub(super) fn new(dims: usize, traditional: bool, base: f32, s: &Scaling) -> Self {
        Rope {
            dims: dims as i32,
            traditional,
            base,
            freqs: s
                .freqs
                .as_ref()
                .map(|f| Array::from_slice(f, &[f.len() as i32])),
            scale: s.scale.unwrap_or(1.0),
            input_scale: s.input_scale,
        }
    }

    /// Scales the rotated part of `x` (the first `dims` of the last axis).
    fn scaled_input(&self, x: &Array) -> Result<Array> {
        let Some(s) = self.input_scale else {
            return Ok(x.clone());
        };
        let last = x.shape().last().copied().unwrap_or(0);
        if last == self.dims {
            return Ok(x.multiply(Array::from_f32(s).as_dtype(x.dtype())?)?);
        }
        let rot = x.index((.., .., .., ..self.dims));
        let rest = x.index((.., .., .., self.dims..));
        let rot = rot.multiply(Array::from_f32(s).as_dtype(x.dtype())?)?;
        Ok(ops::concatenate(&[rot, rest], -1)?)
    }

    /// `x` `[.., heads, positions, dim]` rotated from position `offset`.
    pub(super) fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        let x = self.scaled_input(x)?;
        let base = self.freqs.is_none().then_some(self.base);
        Ok(fast::rope(
            &x,
            self.dims,
            self.traditional,
            base,
            self.scale,
            offset,
            self.freqs.as_ref(),
        )?)
    }

    /// `x` `[rows, heads, 1, dim]` with a position per row.
    pub(super) fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        let x = self.scaled_input(x)?;
        let base = self.freqs.is_none().then_some(self.base);
        Ok(fast::rope_dynamic(
            &x,
            self.dims,
            self.traditional,
            base,
            self.scale,
            positions,
            self.freqs.as_ref(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn linear_scaling_is_a_position_scale() {
        let s = scaling(
            Some(&json!({"type": "linear", "factor": 8.0})),
            1e6,
            64,
            Context::default(),
        )
        .unwrap();
        assert_eq!(s.scale, Some(0.125));
        assert!(s.freqs.is_none());
    }

    #[test]
    fn yarn_keeps_fast_dims_and_stretches_slow_ones() {
        let s = scaling(
            Some(
                &json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096}),
            ),
            150000.0,
            64,
            Context::default(),
        )
        .unwrap();
        let f = s.freqs.unwrap();
        assert_eq!(f.len(), 32);
        // The first pair rotates fastest: unscaled period 1.
        assert!((f[0] - 1.0).abs() < 1e-6, "{}", f[0]);
        let last = 150000f64.powf(62.0 / 64.0) * 32.0;
        assert!(
            ((f[31] as f64) / last - 1.0).abs() < 1e-5,
            "{} vs {last}",
            f[31]
        );
        let m = s.input_scale.unwrap();
        assert!((m as f64 - (0.1 * 32f64.ln() + 1.0)).abs() < 1e-6);
    }

    #[test]
    fn longrope_takes_the_original_context_from_the_top_level() {
        let cfg =
            json!({"type": "longrope", "long_factor": [2.0, 2.0], "short_factor": [1.0, 1.0]});
        let ctx = Context {
            max_positions: 4096.0,
            original: Some(256.0),
        };
        let s = scaling(Some(&cfg), 10000.0, 4, ctx).unwrap();
        let want = (1.0 + 16f64.ln() / 256f64.ln()).sqrt();
        assert!((s.input_scale.unwrap() as f64 - want).abs() < 1e-6);
        assert_eq!(s.freqs.unwrap(), vec![2.0, 200.0]);
    }

    #[test]
    fn an_unknown_scaling_is_refused_by_name() {
        let e = scaling(Some(&json!({"type": "mrope"})), 1e4, 64, Context::default()).unwrap_err();
        assert!(e.to_string().contains("mrope"), "{e}");
    }
}
