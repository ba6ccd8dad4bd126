//! Fast float32 BLAS for MLX's CPU backend on Linux.
//!
//! MLX's CPU backend calls `cblas_sgemm` for every float32 matmul. The wheel
//! bundles reference BLAS, so we serve that symbol from the executable (which
//! comes first in dynamic lookup) and route it to OpenBLAS, loaded at run time:
//! - so that `OPENBLAS_CORETYPE` can be set before OpenBLAS initialises — the
//!   Debian 12 build does not recognise recent Xeons and falls back to SSE3
//!   kernels, 5–10x slower than its AVX2/AVX-512 ones on the same CPU;
//! - and so that decode-time products go where they are fastest: one row to
//!   `sgemv`, which streams the weights once where OpenBLAS 0.3.21's `sgemm`
//!   packs them first; a batch of up to 16 rows, and small products such as
//!   attention over a short context, to [`skinny`].
//!
//! Without OpenBLAS the call goes on to the next `cblas_sgemm` in lookup order
//! (the wheel's), so results never depend on which one is found.
#![allow(clippy::too_many_arguments)]

use std::os::raw::{c_char, c_float, c_int};
use std::sync::OnceLock;

use tracing::{info, warn};

pub mod attention;
mod skinny;
mod workers;

const ROW_MAJOR: c_int = 101;
const NO_TRANS: c_int = 111;
const TRANS: c_int = 112;

// Short names keep the CBLAS signatures on one line each, in the order the
// standard gives their parameters; Fortran's takes every argument by pointer.
type I = c_int;
type F = c_float;
type Sgemv = unsafe extern "C" fn(I, I, I, I, F, *const F, I, *const F, I, F, *mut F, I);
type FortranSgemm = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const I,
    *const I,
    *const I,
    *const F,
    *const F,
    *const I,
    *const F,
    *const I,
    *const F,
    *mut F,
    *const I,
);
type CblasSgemm = unsafe extern "C" fn(I, I, I, I, I, I, F, *const F, I, *const F, I, F, *mut F, I);

enum Blas {
    OpenBlas {
        sgemv: Sgemv,
        sgemm: FortranSgemm,
        set_threads: Option<unsafe extern "C" fn(libc::c_int)>,
        /// Keeps the library mapped for the life of the process.
        _lib: libloading::Library,
    },
    Next(CblasSgemm),
}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

/// The OpenBLAS kernel family for this CPU, unless the environment chose one.
fn coretype() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") {
            return Some("SkylakeX");
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some("Haswell");
        }
    }
    None
}

fn load() -> Option<Blas> {
    if std::env::var_os("OPENBLAS_CORETYPE").is_none() {
        if let Some(core) = coretype() {
            // Read once by OpenBLAS's constructor when the library is loaded below.
            std::env::set_var("OPENBLAS_CORETYPE", core);
        }
    }
    let opened = ["libopenblas.so.0", "libopenblas.so"]
        .iter()
        .find_map(|name| unsafe { libloading::Library::new(name) }.ok());
    if let Some(lib) = opened {
        let syms = unsafe {
            (
                lib.get::<Sgemv>(b"cblas_sgemv\0").map(|s| *s),
                lib.get::<FortranSgemm>(b"sgemm_\0").map(|s| *s),
            )
        };
        if let (Ok(sgemv), Ok(sgemm)) = syms {
            info!(coretype = ?std::env::var("OPENBLAS_CORETYPE").ok(), "using OpenBLAS for float32 matmul");
            let set_threads = unsafe {
                lib.get::<unsafe extern "C" fn(libc::c_int)>(b"openblas_set_num_threads\0")
                    .map(|s| *s)
                    .ok()
            };
            return Some(Blas::OpenBlas {
                sgemv,
                sgemm,
                set_threads,
                _lib: lib,
            });
        }
    }
    warn!("OpenBLAS not found (install libopenblas0-pthread); float32 matmul uses the slow reference BLAS");
    // SAFETY: RTLD_NEXT looks past this executable for the library definition.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"cblas_sgemm".as_ptr()) };
    if next.is_null() {
        None
    } else {
        Some(Blas::Next(unsafe {
            std::mem::transmute::<*mut libc::c_void, CblasSgemm>(next)
        }))
    }
}

/// Which BLAS serves float32 matmuls, e.g. `openblas:SkylakeX` (for reports).
pub fn describe() -> String {
    match BLAS.get_or_init(load) {
        Some(Blas::OpenBlas { .. }) => format!(
            "openblas:{}",
            std::env::var("OPENBLAS_CORETYPE").unwrap_or_else(|_| "auto".into())
        ),
        Some(Blas::Next(_)) => "bundled".into(),
        None => "none".into(),
    }
}

/// Caps OpenBLAS's threads and the batched kernel's helpers. Processes
/// sharing a machine (pipeline stages on one host) must not each spin a
/// thread per core: idle threads busy-wait and starve the stage that works.
pub fn set_threads(n: usize) {
    if let Some(Blas::OpenBlas {
        set_threads: Some(f),
        ..
    }) = BLAS.get_or_init(load)
    {
        // SAFETY: OpenBLAS's own setter, called with a positive count.
        unsafe { f(n.max(1) as libc::c_int) };
    }
    workers::set_limit(n.max(1) - 1);
}

/// Loads OpenBLAS now rather than at the first matmul; also keeps this
/// module's `cblas_sgemm` linked into every binary that uses the engine.
pub fn init() {
    let f: CblasSgemm = cblas_sgemm;
    std::hint::black_box(f);
    BLAS.get_or_init(load);
}

/// CBLAS `sgemm`, served to libmlx.so.
///
/// # Safety
/// Same contract as CBLAS `cblas_sgemm`: the pointers must describe matrices
/// of the given shapes and leading dimensions.
#[no_mangle]
pub unsafe extern "C" fn cblas_sgemm(
    order: c_int,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: c_float,
    a: *const c_float,
    lda: c_int,
    b: *const c_float,
    ldb: c_int,
    beta: c_float,
    c: *mut c_float,
    ldc: c_int,
) {
    let ta = transa == TRANS;
    let tb = transb == TRANS;
    let (mu, nu, ku) = (m as usize, n as usize, k as usize);
    if order == ROW_MAJOR && !ta && m > 0 && n > 0 && k > 0 && mu <= skinny::MAX_ROWS {
        // Small products (attention over a short context) stay on this thread:
        // waking OpenBLAS's threads would cost more than the arithmetic.
        let small = nu * ku < skinny::PARALLEL_MIN;
        let product = skinny::Product {
            m: mu,
            n: nu,
            k: ku,
            alpha,
            a,
            lda: lda as usize,
            b,
            ldb: ldb as usize,
            beta,
            c,
            ldc: ldc as usize,
        };
        if tb && (mu > 1 || small) {
            skinny::gemm_nt(product);
            return;
        }
        if !tb && small {
            skinny::gemm_nn_small(product);
            return;
        }
    }
    let (sgemv, sgemm) = match BLAS.get_or_init(load) {
        Some(Blas::OpenBlas { sgemv, sgemm, .. }) => (*sgemv, *sgemm),
        Some(Blas::Next(next)) => {
            next(
                order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
            );
            return;
        }
        None => return,
    };
    if order == ROW_MAJOR && m == 1 && k > 0 {
        // c[1 x n] = a[1 x k] · op(b)[k x n]  ⇔  c = op(b)ᵀ · aᵀ
        let incx = if ta { lda } else { 1 };
        let (rows, cols, t) = if tb { (n, k, NO_TRANS) } else { (k, n, TRANS) };
        sgemv(ROW_MAJOR, t, rows, cols, alpha, b, ldb, a, incx, beta, c, 1);
        return;
    }
    if order == ROW_MAJOR && n == 1 && k > 0 {
        // c[m x 1] = op(a)[m x k] · b[k x 1]
        let incx = if tb { 1 } else { ldb };
        let (rows, cols, t) = if ta { (k, m, TRANS) } else { (m, k, NO_TRANS) };
        sgemv(
            ROW_MAJOR, t, rows, cols, alpha, a, lda, b, incx, beta, c, ldc,
        );
        return;
    }
    // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
    let (fa, fb) = if order == ROW_MAJOR {
        (transb, transa)
    } else {
        (transa, transb)
    };
    let (mm, nn) = if order == ROW_MAJOR { (n, m) } else { (m, n) };
    let (pa, la, pb, lb) = if order == ROW_MAJOR {
        (b, ldb, a, lda)
    } else {
        (a, lda, b, ldb)
    };
    let flag = |t: c_int| {
        if t == TRANS {
            b'T' as c_char
        } else {
            b'N' as c_char
        }
    };
    let (ca, cb) = (flag(fa), flag(fb));
    sgemm(
        &ca, &cb, &mm, &nn, &k, &alpha, pa, &la, pb, &lb, &beta, c, &ldc,
    );
}

#[cfg(test)]
mod tests {
    use mlx_rs::{random, Array};

    /// Compares MLX matmuls (which now pass through the shim) with a plain loop.
    fn check(a: &Array, b: &Array) {
        let c = a.matmul(b).unwrap();
        c.eval().unwrap();
        let (m, k) = (a.shape()[0] as usize, a.shape()[1] as usize);
        let n = b.shape()[1] as usize;
        let ac = a.contiguous().unwrap();
        let bc = b.contiguous().unwrap();
        mlx_rs::transforms::eval([&ac, &bc]).unwrap();
        let (av, bv, cv) = (
            ac.as_slice::<f32>(),
            bc.as_slice::<f32>(),
            c.as_slice::<f32>(),
        );
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
                let got = cv[i * n + j];
                assert!(
                    (want - got).abs() <= 1e-3 * (1.0 + want.abs()),
                    "[{i},{j}] {got} != {want}"
                );
            }
        }
    }

    #[test]
    fn openblas_is_used() {
        super::init();
        assert!(
            matches!(super::BLAS.get(), Some(Some(super::Blas::OpenBlas { .. }))),
            "OpenBLAS was not loaded (Debian package libopenblas0-pthread)"
        );
    }

    #[test]
    fn vector_and_general_shapes_match_reference() {
        super::init();
        let r = |s: &[i32]| random::normal::<f32>(s, None, None, None).unwrap();
        check(&r(&[1, 37]), &r(&[37, 53])); // row vector, B plain
        check(&r(&[1, 37]), &r(&[53, 37]).t()); // row vector, B transposed
        check(&r(&[37, 1]).t(), &r(&[37, 53])); // A transposed
        check(&r(&[41, 37]), &r(&[37, 1])); // column result
        check(&r(&[41, 37]), &r(&[1, 37]).t()); // column result, B transposed
        check(&r(&[37, 41]).t(), &r(&[37, 1])); // column result, A transposed
        check(&r(&[9, 37]), &r(&[37, 11])); // general
        check(&r(&[9, 37]), &r(&[11, 37]).t()); // general, B transposed
        check(&r(&[37, 9]).t(), &r(&[11, 37]).t()); // general, both transposed
    }
}
