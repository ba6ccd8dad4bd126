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

use super::workers::Group;

/// Largest batch served here; bigger products (prefill) go to `sgemm`.
pub const MAX_ROWS: usize = 16;
/// Accumulator width per row: two AVX2 registers.
const LANES: usize = 16;
/// Weight rows per parallel task: enough work to amortise scheduling.
const ROWS_PER_TASK: usize = 32;
/// Below this many `B` elements a product (e.g. attention over a short
/// context) costs less than waking another thread.
pub const PARALLEL_MIN: usize = 1 << 16;

/// One row-major product `C = alpha·A·op(B) + beta·C`, as BLAS describes it.
///
/// Raw pointers so it can cross into worker threads; see [`gemm_nt`] and
/// [`gemm_nn_small`] for what each must point to.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    pub alpha: f32,
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub beta: f32,
    pub c: *mut f32,
    pub ldc: usize,
}

// SAFETY: tasks read `a` and `b` and write disjoint columns of `c`; the
// caller of `gemm_nt` keeps them alive until every task is done.
unsafe impl Send for Product {}
unsafe impl Sync for Product {}

impl Product {
    /// `c[i][j] = alpha·dot + beta·c[i][j]`.
    #[inline(always)]
    unsafe fn store(&self, i: usize, j: usize, dot: f32) {
        let dst = self.c.add(i * self.ldc + j);
        *dst = if self.beta == 0.0 {
            self.alpha * dot
        } else {
            self.alpha * dot + self.beta * *dst
        };
    }
}

/// `c[i][j] = alpha · Σₚ a[i][p]·b[j][p] + beta · c[i][j]` for `i < m`, `j < n`.
///
/// # Safety
/// `a` must hold `m` rows of `k` floats `lda` apart, `b` `n` rows of `k`
/// floats `ldb` apart and `c` `m` rows of `n` floats `ldc` apart; `c` must not
/// overlap `a` or `b`; `1 ≤ m ≤ MAX_ROWS`.
pub unsafe fn gemm_nt(p: Product) {
    debug_assert!((1..=MAX_ROWS).contains(&p.m));
    let run = move |js: std::ops::Range<usize>| {
        // SAFETY: forwarded from the caller; each task gets its own `j` range.
        unsafe { columns(&p, js) }
    };
    let tasks = p.n.div_ceil(ROWS_PER_TASK);
    if tasks <= 1 || p.n * p.k < PARALLEL_MIN {
        return run(0..p.n);
    }
    let task = |t: usize| run(t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(p.n));
    if !Group::global().try_run(tasks, &task) {
        // Another thread's product holds the helpers: this one runs here.
        run(0..p.n);
    }
}

/// Computes output columns `js` with the widest vector unit the CPU has.
unsafe fn columns(p: &Product, js: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return columns_fma(p, js);
        }
    }
    columns_with::<Portable>(p, js)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns_fma(p: &Product, js: std::ops::Range<usize>) {
    columns_with::<Fma>(p, js)
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
unsafe fn columns_with<D: Dots>(p: &Product, js: std::ops::Range<usize>) {
    let row = |i: usize| p.a.add(i * p.lda);
    let mut out = [0f32; MAX_ROWS];
    for j in js {
        let w = p.b.add(j * p.ldb);
        let mut i = 0;
        while i < p.m {
            // Row groups of at most 4 keep the accumulators in registers.
            let g = (p.m - i).min(4);
            let o = &mut out[i..i + g];
            match g {
                4 => D::dots::<4>(&[row(i), row(i + 1), row(i + 2), row(i + 3)], w, p.k, o),
                3 => D::dots::<3>(&[row(i), row(i + 1), row(i + 2)], w, p.k, o),
                2 => D::dots::<2>(&[row(i), row(i + 1)], w, p.k, o),
                _ => D::dots::<1>(&[row(i)], w, p.k, o),
            }
            i += g;
        }
        for (i, &dot) in out.iter().enumerate().take(p.m) {
            p.store(i, j, dot);
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
pub unsafe fn gemm_nn_small(p: Product) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return nn_fma(&p);
        }
    }
    nn_portable(&p)
}

unsafe fn nn_portable(p: &Product) {
    for i in 0..p.m {
        for j in 0..p.n {
            let mut dot = 0f32;
            for q in 0..p.k {
                dot += *p.a.add(i * p.lda + q) * *p.b.add(q * p.ldb + j);
            }
            p.store(i, j, dot);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn nn_fma(p: &Product) {
    use std::arch::x86_64::*;
    let body = p.n - p.n % 8;
    for i in 0..p.m {
        let row = p.a.add(i * p.lda);
        let mut j = 0;
        while j < body {
            let mut acc = _mm256_setzero_ps();
            for q in 0..p.k {
                acc = _mm256_fmadd_ps(
                    _mm256_set1_ps(*row.add(q)),
                    _mm256_loadu_ps(p.b.add(q * p.ldb + j)),
                    acc,
                );
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            for (l, &dot) in lanes.iter().enumerate() {
                p.store(i, j + l, dot);
            }
            j += 8;
        }
        for j in body..p.n {
            let mut dot = 0f32;
            for q in 0..p.k {
                dot = (*row.add(q)).mul_add(*p.b.add(q * p.ldb + j), dot);
            }
            p.store(i, j, dot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row-major, unit alpha, zero beta, rows packed.
    fn plain(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        ldb: usize,
    ) -> Product {
        Product {
            m,
            n,
            k,
            alpha: 1.0,
            a: a.as_ptr(),
            lda: k,
            b: b.as_ptr(),
            ldb,
            beta: 0.0,
            c: c.as_mut_ptr(),
            ldc: n,
        }
    }

    /// `A·Bᵀ` in f64, `b` holding `n` rows of `k`.
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

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                "{what}: {g} != {w}"
            );
        }
    }

    /// Shapes on both sides of `PARALLEL_MIN` (8×300×577 runs on the pool).
    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (3, 70, 17),
        (5, 33, 64),
        (8, 130, 577),
        (8, 300, 577),
        (16, 65, 31),
    ];

    #[test]
    fn matches_reference_for_odd_shapes() {
        for &(m, n, k) in SHAPES {
            let (a, b) = (values(m * k, 1), values(n * k, 2));
            let mut c = vec![0.0; m * n];
            unsafe { gemm_nt(plain(m, n, k, &a, &b, &mut c, k)) };
            assert_close(&c, &reference(m, n, k, &a, &b), &format!("{m}x{n}x{k}"));
        }
    }

    #[test]
    fn the_portable_kernels_match_reference_too() {
        for &(m, n, k) in SHAPES {
            let (a, b) = (values(m * k, 9), values(n * k, 10));
            let mut c = vec![0.0; m * n];
            let p = plain(m, n, k, &a, &b, &mut c, k);
            unsafe { columns_with::<Portable>(&p, 0..n) };
            assert_close(&c, &reference(m, n, k, &a, &b), &format!("nt {m}x{n}x{k}"));
            // The same b read as [k, n] is the transpose of a [n, k] matrix.
            let bt: Vec<f32> = (0..n * k).map(|x| b[(x % n) * k + x / n]).collect();
            let mut c = vec![0.0; m * n];
            unsafe { nn_portable(&plain(m, n, k, &a, &bt, &mut c, n)) };
            assert_close(&c, &reference(m, n, k, &a, &b), &format!("nn {m}x{n}x{k}"));
        }
    }

    #[test]
    fn alpha_beta_and_strides() {
        let (m, n, k) = (3, 40, 20);
        let (a, b) = (values(m * (k + 3), 3), values(n * (k + 5), 4));
        let ldc = n + 7;
        let mut c = vec![2.0; m * ldc];
        let p = Product {
            alpha: 0.5,
            lda: k + 3,
            beta: 3.0,
            ldc,
            ..plain(m, n, k, &a, &b, &mut c, k + 5)
        };
        unsafe { gemm_nt(p) };
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
            let (a, b) = (values(m * k, 7), values(n * k, 8));
            let bt: Vec<f32> = (0..n * k).map(|x| b[(x % n) * k + x / n]).collect();
            let mut c = vec![1.0; m * n];
            let p = Product {
                alpha: 2.0,
                beta: 0.5,
                ..plain(m, n, k, &a, &bt, &mut c, n)
            };
            unsafe { gemm_nn_small(p) };
            let want: Vec<f32> = reference(m, n, k, &a, &b)
                .iter()
                .map(|w| 2.0 * w + 0.5)
                .collect();
            assert_close(&c, &want, &format!("{m}x{n}x{k}"));
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_alone_or_in_a_batch() {
        // Large enough to take the parallel path.
        let (n, k) = (300, 577);
        let (a, b) = (values(8 * k, 5), values(n * k, 6));
        let mut batched = vec![0.0; 8 * n];
        unsafe { gemm_nt(plain(8, n, k, &a, &b, &mut batched, k)) };
        for i in 0..8 {
            let mut alone = vec![0.0; n];
            unsafe { gemm_nt(plain(1, n, k, &a[i * k..], &b, &mut alone, k)) };
            assert_eq!(alone[..], batched[i * n..(i + 1) * n], "row {i}");
        }
    }
}
