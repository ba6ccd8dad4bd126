//! `C = A·Bᵀ` for a few rows of `A` — the shape of every decode step, where
//! `A` holds one hidden state per running sequence and `B` is a weight matrix
//! stored `[out, in]`.
//!
//! OpenBLAS's `sgemm` copies ("packs") the whole weight matrix before
//! multiplying, which for a handful of rows costs more than the arithmetic:
//! an 8-row product took about 3× a single-row `sgemv`. Here each weight row is
//! read from memory once and dotted with every row of `A` while it sits in L1,
//! so the cost of a step grows with the weights, not with the batch.
//!
//! Every output element is summed in the same order whatever the number of
//! rows, so a sequence's logits do not depend on what it is batched with.

use rayon::prelude::*;

/// Largest batch served here; bigger products (prefill) go to `sgemm`.
pub const MAX_ROWS: usize = 16;
/// Accumulator width per row: two AVX2 registers.
const LANES: usize = 16;
/// Weight rows per parallel task: enough work to amortise scheduling.
const ROWS_PER_TASK: usize = 32;
/// Below this many `B` elements a product (e.g. attention over a short
/// context) costs less than waking another thread.
pub const PARALLEL_MIN: usize = 1 << 16;

/// Raw matrix pointers shared across the worker threads.
#[derive(Clone, Copy)]
struct Shared {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
}
// SAFETY: tasks read `a` and `b` and write disjoint columns of `c`.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// `c[i][j] = alpha · Σₚ a[i][p]·b[j][p] + beta · c[i][j]` for `i < m`, `j < n`,
/// all row-major.
///
/// # Safety
/// `a` must hold `m` rows of `k` floats `lda` apart, `b` `n` rows of `k`
/// floats `ldb` apart and `c` `m` rows of `n` floats `ldc` apart; `c` must not
/// overlap `a` or `b`; `1 ≤ m ≤ MAX_ROWS`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_nt(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    debug_assert!((1..=MAX_ROWS).contains(&m));
    let p = Shared { a, b, c };
    let run = move |js: std::ops::Range<usize>| {
        let p = p;
        // SAFETY: forwarded from the caller; each thread gets its own `j` range.
        unsafe { columns(m, js, k, alpha, p.a, lda, p.b, ldb, beta, p.c, ldc) }
    };
    let tasks = n.div_ceil(ROWS_PER_TASK);
    if tasks <= 1 || n * k < PARALLEL_MIN {
        return run(0..n);
    }
    (0..tasks)
        .into_par_iter()
        .for_each(|t| run(t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(n)));
}

/// Computes output columns `js` with the widest vector unit the CPU has.
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    m: usize,
    js: std::ops::Range<usize>,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return columns_fma(m, js, k, alpha, a, lda, b, ldb, beta, c, ldc);
        }
    }
    columns_with::<Portable>(m, js, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn columns_fma(
    m: usize,
    js: std::ops::Range<usize>,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    columns_with::<Fma>(m, js, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// Dot products of up to four rows with one weight row.
trait Dots {
    /// `out[r] = rows[r] · w`, summed in an order that does not depend on `R`.
    ///
    /// # Safety
    /// Every row and `w` hold `k` floats; the CPU has the kernel's features.
    unsafe fn dots<const R: usize>(
        rows: &[*const f32; R],
        w: *const f32,
        k: usize,
        out: &mut [f32],
    );
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns_with<D: Dots>(
    m: usize,
    js: std::ops::Range<usize>,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    let row = |i: usize| a.add(i * lda);
    let mut out = [0f32; MAX_ROWS];
    for j in js {
        let w = b.add(j * ldb);
        let mut i = 0;
        while i < m {
            // Row groups of at most 4 keep the accumulators in registers.
            let g = (m - i).min(4);
            let o = &mut out[i..i + g];
            match g {
                4 => D::dots::<4>(&[row(i), row(i + 1), row(i + 2), row(i + 3)], w, k, o),
                3 => D::dots::<3>(&[row(i), row(i + 1), row(i + 2)], w, k, o),
                2 => D::dots::<2>(&[row(i), row(i + 1)], w, k, o),
                _ => D::dots::<1>(&[row(i)], w, k, o),
            }
            i += g;
        }
        for (i, &dot) in out.iter().enumerate().take(m) {
            let dst = c.add(i * ldc + j);
            *dst = if beta == 0.0 {
                alpha * dot
            } else {
                alpha * dot + beta * *dst
            };
        }
    }
}

/// Plain Rust, for CPUs without AVX2/FMA.
struct Portable;

impl Dots for Portable {
    #[inline(always)]
    unsafe fn dots<const R: usize>(
        rows: &[*const f32; R],
        w: *const f32,
        k: usize,
        out: &mut [f32],
    ) {
        let body = k - k % LANES;
        let mut acc = [[0f32; LANES]; R];
        let mut p = 0;
        while p < body {
            for (row, lanes) in rows.iter().zip(acc.iter_mut()) {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    *lane += *row.add(p + l) * *w.add(p + l);
                }
            }
            p += LANES;
        }
        for r in 0..R {
            let mut s = acc[r];
            let mut width = LANES / 2;
            while width > 0 {
                for l in 0..width {
                    s[l] += s[l + width];
                }
                width /= 2;
            }
            let mut total = s[0];
            for q in body..k {
                total += *rows[r].add(q) * *w.add(q);
            }
            out[r] = total;
        }
    }
}

/// AVX2 + FMA: two 8-lane accumulators per row, the weight chunk loaded once
/// for all rows.
#[cfg(target_arch = "x86_64")]
struct Fma;

#[cfg(target_arch = "x86_64")]
impl Dots for Fma {
    #[inline(always)]
    unsafe fn dots<const R: usize>(
        rows: &[*const f32; R],
        w: *const f32,
        k: usize,
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let body = k - k % LANES;
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        let mut p = 0;
        while p < body {
            let w0 = _mm256_loadu_ps(w.add(p));
            let w1 = _mm256_loadu_ps(w.add(p + 8));
            for r in 0..R {
                lo[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r].add(p)), w0, lo[r]);
                hi[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r].add(p + 8)), w1, hi[r]);
            }
            p += LANES;
        }
        for r in 0..R {
            let v = _mm256_add_ps(lo[r], hi[r]);
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            let v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
            let mut total = _mm_cvtss_f32(v);
            for q in body..k {
                total = (*rows[r].add(q)).mul_add(*w.add(q), total);
            }
            out[r] = total;
        }
    }
}

/// `c[i][j] = alpha · Σₚ a[i][p]·b[p][j] + beta · c[i][j]` on one thread, for
/// small products such as attention weights times values.
///
/// # Safety
/// `a` must hold `m` rows of `k` floats `lda` apart, `b` `k` rows of `n`
/// floats `ldb` apart and `c` `m` rows of `n` floats `ldc` apart; `c` must not
/// overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_nn_small(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return nn_fma(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        }
    }
    nn_portable(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

#[inline(always)]
unsafe fn store(c: *mut f32, alpha: f32, beta: f32, dot: f32) {
    *c = if beta == 0.0 {
        alpha * dot
    } else {
        alpha * dot + beta * *c
    };
}

#[allow(clippy::too_many_arguments)]
unsafe fn nn_portable(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let mut dot = 0f32;
            for p in 0..k {
                dot += *a.add(i * lda + p) * *b.add(p * ldb + j);
            }
            store(c.add(i * ldc + j), alpha, beta, dot);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn nn_fma(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    use std::arch::x86_64::*;
    let body = n - n % 8;
    for i in 0..m {
        let row = a.add(i * lda);
        let mut j = 0;
        while j < body {
            let mut acc = _mm256_setzero_ps();
            for p in 0..k {
                acc = _mm256_fmadd_ps(
                    _mm256_set1_ps(*row.add(p)),
                    _mm256_loadu_ps(b.add(p * ldb + j)),
                    acc,
                );
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            for (l, &dot) in lanes.iter().enumerate() {
                store(c.add(i * ldc + j + l), alpha, beta, dot);
            }
            j += 8;
        }
        for j in body..n {
            let mut dot = 0f32;
            for p in 0..k {
                dot = (*row.add(p)).mul_add(*b.add(p * ldb + j), dot);
            }
            store(c.add(i * ldc + j), alpha, beta, dot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| a[i * k + p] as f64 * b[j * k + p] as f64)
                    .sum::<f64>() as f32;
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2001) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_reference_for_odd_shapes() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (3, 70, 17),
            (5, 33, 64),
            (8, 130, 577),
            (16, 65, 31),
        ] {
            let (a, b) = (values(m * k, 1), values(n * k, 2));
            let mut c = vec![0.0; m * n];
            unsafe {
                gemm_nt(
                    m,
                    n,
                    k,
                    1.0,
                    a.as_ptr(),
                    k,
                    b.as_ptr(),
                    k,
                    0.0,
                    c.as_mut_ptr(),
                    n,
                )
            };
            for (got, want) in c.iter().zip(reference(m, n, k, &a, &b)) {
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{m}x{n}x{k}: {got} != {want}"
                );
            }
        }
    }

    #[test]
    fn alpha_beta_and_strides() {
        let (m, n, k) = (3, 40, 20);
        let (a, b) = (values(m * (k + 3), 3), values(n * (k + 5), 4));
        let ldc = n + 7;
        let mut c = vec![2.0; m * ldc];
        unsafe {
            gemm_nt(
                m,
                n,
                k,
                0.5,
                a.as_ptr(),
                k + 3,
                b.as_ptr(),
                k + 5,
                3.0,
                c.as_mut_ptr(),
                ldc,
            )
        };
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|p| a[i * (k + 3) + p] as f64 * b[j * (k + 5) + p] as f64)
                    .sum();
                let want = 0.5 * dot as f32 + 6.0;
                let got = c[i * ldc + j];
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "[{i},{j}] {got} != {want}"
                );
            }
            assert_eq!(c[i * ldc + n], 2.0, "padding past n untouched");
        }
    }

    #[test]
    fn small_plain_products_match_reference() {
        for &(m, n, k) in &[(1, 1, 1), (3, 70, 17), (4, 64, 150), (16, 9, 33)] {
            let (a, b) = (values(m * k, 7), values(k * n, 8));
            // b is [k, n]; the reference wants rows of length k.
            let bt: Vec<f32> = (0..n)
                .flat_map(|j| (0..k).map(move |p| (j, p)))
                .map(|(j, p)| b[p * n + j])
                .collect();
            let mut c = vec![1.0; m * n];
            unsafe {
                gemm_nn_small(
                    m,
                    n,
                    k,
                    2.0,
                    a.as_ptr(),
                    k,
                    b.as_ptr(),
                    n,
                    0.5,
                    c.as_mut_ptr(),
                    n,
                )
            };
            for (got, want) in c.iter().zip(reference(m, n, k, &a, &bt)) {
                let want = 2.0 * want + 0.5;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{m}x{n}x{k}: {got} != {want}"
                );
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_or_in_a_batch() {
        let (n, k) = (50, 300);
        let (a, b) = (values(8 * k, 5), values(n * k, 6));
        let mut batched = vec![0.0; 8 * n];
        unsafe {
            gemm_nt(
                8,
                n,
                k,
                1.0,
                a.as_ptr(),
                k,
                b.as_ptr(),
                k,
                0.0,
                batched.as_mut_ptr(),
                n,
            )
        };
        for i in 0..8 {
            let mut alone = vec![0.0; n];
            unsafe {
                gemm_nt(
                    1,
                    n,
                    k,
                    1.0,
                    a[i * k..].as_ptr(),
                    k,
                    b.as_ptr(),
                    k,
                    0.0,
                    alone.as_mut_ptr(),
                    n,
                )
            };
            assert_eq!(alone[..], batched[i * n..(i + 1) * n], "row {i}");
        }
    }
}
