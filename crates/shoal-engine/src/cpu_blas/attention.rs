//! Prefill attention on the CPU: `softmax(scale·Q·Kᵀ + mask)·V` for a run
//! of query positions, without MLX's fallback.
//!
//! MLX's CPU build computes the scores for every query against every key,
//! masks half of them away and then runs a scalar `exp` (one libm `fmaf`
//! call per polynomial term) over all of them: for a 1000-token prompt that
//! softmax was a third of prefill. Here queries go in blocks, each scored
//! only against the keys it may see (its causal prefix, or its sliding
//! window), the products go to `sgemm`, and the exponentials are a
//! polynomial the compiler vectorises.

use std::os::raw::c_int;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

/// Query rows per block: small enough that the masked corner of each block
/// is little work, large enough for `sgemm` to run at speed.
const BLOCK: usize = 64;

/// One sequence's attention inputs, all float32 and row-major.
pub struct Attention<'a> {
    /// `[heads, n, dim]`: queries at positions `offset..offset + n`.
    pub q: &'a [f32],
    /// Keys and values `[kv_heads, cap, dim]`; positions `0..offset + n` are
    /// filled.
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub cap: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub dim: usize,
    pub n: usize,
    pub offset: usize,
    pub scale: f32,
    /// Attend only to the last `w` positions.
    pub window: Option<usize>,
    /// Per-head sink logits that join each softmax's denominator.
    pub sinks: Option<&'a [f32]>,
}

impl Attention<'_> {
    /// Writes the output `[n, heads, dim]` (the layout the output projection
    /// reads) into `out`; refuses slices shorter than the shapes say.
    pub fn run(&self, out: &mut [f32]) -> Result<(), String> {
        let (h, d, n) = (self.heads, self.dim, self.n);
        let fits = self.q.len() >= h * n * d
            && out.len() >= n * h * d
            && self.k.len() >= self.kv_heads * self.cap * d
            && self.v.len() == self.k.len()
            && self.offset + n <= self.cap
            && self.kv_heads > 0
            && h % self.kv_heads == 0
            && self.sinks.is_none_or(|s| s.len() >= h);
        if !fits {
            return Err(format!(
                "attention inputs do not match {h} heads ({} key/value heads) of {d} over {n} \
                 positions after {} in a cache of {}",
                self.kv_heads, self.offset, self.cap
            ));
        }
        let group = h / self.kv_heads;
        let mut scores = vec![0f32; BLOCK * (self.offset + n)];
        for head in 0..h {
            let kv = head / group;
            let k = &self.k[kv * self.cap * d..];
            let v = &self.v[kv * self.cap * d..];
            let sink = self.sinks.and_then(|s| s.get(head).copied());
            for i0 in (0..n).step_by(BLOCK) {
                let rows = BLOCK.min(n - i0);
                // Keys the block may see: up to its last query's position,
                // from its first query's window start.
                let hi = self.offset + i0 + rows;
                let lo = self
                    .window
                    .map_or(0, |w| (self.offset + i0 + 1).saturating_sub(w));
                let cols = hi - lo;
                let q = &self.q[(head * n + i0) * d..];
                // S = scale · Q_blk · K[lo..hi]ᵀ
                // SAFETY: the shapes were checked above; `scores` holds
                // `rows × cols` floats.
                unsafe {
                    super::cblas_sgemm(
                        ROW_MAJOR,
                        NO_TRANS,
                        TRANS,
                        rows as c_int,
                        cols as c_int,
                        d as c_int,
                        self.scale,
                        q.as_ptr(),
                        d as c_int,
                        k[lo * d..].as_ptr(),
                        d as c_int,
                        0.0,
                        scores.as_mut_ptr(),
                        cols as c_int,
                    );
                }
                for r in 0..rows {
                    let pos = self.offset + i0 + r;
                    let first = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let row = &mut scores[r * cols..(r + 1) * cols];
                    let (seen_from, seen_to) = (first - lo, pos + 1 - lo);
                    row[..seen_from].fill(0.0);
                    row[seen_to..].fill(0.0);
                    softmax(&mut row[seen_from..seen_to], sink);
                }
                // O_blk = P · V[lo..hi], written as rows of [n, heads, dim].
                // SAFETY: as above; each output row is `d` floats at stride
                // `heads · d`.
                unsafe {
                    super::cblas_sgemm(
                        ROW_MAJOR,
                        NO_TRANS,
                        NO_TRANS,
                        rows as c_int,
                        d as c_int,
                        cols as c_int,
                        1.0,
                        scores.as_ptr(),
                        cols as c_int,
                        v[lo * d..].as_ptr(),
                        d as c_int,
                        0.0,
                        out[(i0 * h + head) * d..].as_mut_ptr(),
                        (h * d) as c_int,
                    );
                }
            }
        }
        Ok(())
    }
}

/// In place: `x ← exp(x − max) / (Σ exp(x − max) + exp(sink − max))`.
fn softmax(x: &mut [f32], sink: Option<f32>) {
    let mut max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = exp_shifted(x, max);
    if let Some(s) = sink {
        sum += exp_one(s - max);
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `x ← exp(x − max)`, returning the sum, with the widest vectors the CPU has.
fn exp_shifted(x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the features were just detected.
            return unsafe { exp_shifted_fma(x, max) };
        }
    }
    exp_shifted_portable(x, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_fma(x: &mut [f32], max: f32) -> f32 {
    exp_shifted_portable(x, max)
}

#[inline(always)]
fn exp_shifted_portable(x: &mut [f32], max: f32) -> f32 {
    // Eight partial sums so the loop vectorises (float addition does not
    // reorder on its own).
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (v, a) in c.iter_mut().zip(acc.iter_mut()) {
            *v = exp_one(*v - max);
            *a += *v;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_one(*v - max);
        sum += *v;
    }
    sum
}

/// `exp(x)` for `x ≤ 0`, to float32 rounding: `2ⁿ · exp(r)` with
/// `|r| ≤ ln2/2` and exp's Taylor series to degree 7 (the next term is below
/// 1e-8), branch-free so it vectorises.
#[inline(always)]
fn exp_one(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n·LN2_HI is exact for the n that occur here.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 0.0);
    let n = (x * LOG2E).round();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_library_to_float_rounding() {
        for i in 0..=8700 {
            let x = -(i as f32) * 0.01;
            let (a, b) = (exp_one(x), x.exp());
            assert!(
                (a - b).abs() <= 2e-7 * b.max(f32::MIN_POSITIVE),
                "{x}: {a} vs {b}"
            );
        }
    }

    /// The blocked kernel against a plain triple loop, with a cache offset,
    /// grouped heads, a window, sinks and a block that ends mid-way.
    #[test]
    fn blocks_compute_plain_attention() {
        let (heads, kv_heads, dim, n, offset, cap) = (4, 2, 8, 150, 7, 160);
        let val = |i: usize| ((i * 7919 % 1000) as f32 / 500.0) - 1.0;
        let q: Vec<f32> = (0..heads * n * dim).map(val).collect();
        let k: Vec<f32> = (0..kv_heads * cap * dim).map(|i| val(i + 13)).collect();
        let v: Vec<f32> = (0..kv_heads * cap * dim).map(|i| val(i + 29)).collect();
        let sinks = [0.5f32, -1.0, 2.0, 0.0];
        for (window, sinks) in [(None, None), (Some(20), Some(&sinks[..]))] {
            let a = Attention {
                q: &q,
                k: &k,
                v: &v,
                cap,
                heads,
                kv_heads,
                dim,
                n,
                offset,
                scale: 0.3,
                window,
                sinks,
            };
            let mut out = vec![0f32; n * heads * dim];
            a.run(&mut out).expect("shapes fit");
            let mut short = vec![0f32; n];
            assert!(a.run(&mut short).is_err(), "a short output is refused");
            for h in 0..heads {
                let kv = h / (heads / kv_heads);
                for i in 0..n {
                    let pos = offset + i;
                    let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                    let s: Vec<f32> = (first..=pos)
                        .map(|j| {
                            (0..dim)
                                .map(|t| q[(h * n + i) * dim + t] * k[(kv * cap + j) * dim + t])
                                .sum::<f32>()
                                * 0.3
                        })
                        .collect();
                    let sink = sinks.map(|s| s[h]);
                    let max = s.iter().copied().chain(sink).fold(f32::MIN, f32::max);
                    let z: f32 = s.iter().map(|x| (x - max).exp()).sum::<f32>()
                        + sink.map_or(0.0, |x| (x - max).exp());
                    for t in 0..dim {
                        let want: f32 = s
                            .iter()
                            .zip(first..=pos)
                            .map(|(x, j)| (x - max).exp() / z * v[(kv * cap + j) * dim + t])
                            .sum();
                        let got = out[(i * heads + h) * dim + t];
                        assert!((got - want).abs() < 1e-5, "h{h} i{i} t{t}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
