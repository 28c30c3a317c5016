//! f32 matrix products for the encoder ([`crate::encoder`]), on the `gemm` crate's packed
//! kernels (AVX-512 where the CPU has it, AVX2/FMA or NEON otherwise, chosen at run time).
//!
//! Why not ggml's: for f32 matrices ggml's CPU backend uses llamafile's tinyBLAS, which on the
//! 2-core x86 machines here ran at about 60% of the cores' peak for the shapes of a sentence
//! encoder (a dozen to hundreds of rows, 384–1536 columns). `gemm` reached the peak on them —
//! with the weights stored input-major (`k × n`, each input's weights for every output
//! contiguous). As GGUF stores them (`n × k`) it packs them on every call, which on one short
//! text made a product 2× slower and, for the feed-forward's down-projection, 8×: the encoder
//! transposes its matrices once, at load.

use gemm::Parallelism;
use rayon::prelude::*;

/// `y = base + x · w`, where `x` is `rows × k`, `w` is `k × n` and `y` is `rows × n` (all
/// row-major; `w` is GGUF's matrix transposed); `base` is what `y` holds before (`accumulate`:
/// the residual and the bias, set by the caller) or nothing. With `threads` > 1 the columns are
/// split between that many tasks of the rayon pool this runs in (`gemm`'s own rayon split ran
/// one short text's products at 1.5× one thread on two; a split by columns needs no reduction).
///
/// Panics if the lengths disagree with `rows`, `k` and `n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    threads: usize,
) {
    assert_eq!(x.len(), rows * k, "x is rows × k");
    assert_eq!(w.len(), k * n, "w is k × n");
    assert_eq!(y.len(), rows * n, "y is rows × n");
    if rows == 0 || n == 0 {
        return;
    }
    let block = n.div_ceil(threads.max(1)).next_multiple_of(16).min(n);
    let out = OutPtr(y.as_mut_ptr());
    let columns = |c0: usize| {
        let nb = block.min(n - c0);
        // SAFETY: every pointer is into a slice whose length was checked above against the
        // strides given: y[r, c] at r·n + c (r < rows, c0 ≤ c < c0 + nb ≤ n), x[r, j] at r·k + j,
        // w[j, c] at j·n + c (j < k). `y` is borrowed mutably for the whole call, so it overlaps
        // neither operand, and each task writes only its own columns c0..c0 + nb of it.
        unsafe {
            gemm::gemm(
                rows,
                nb,
                k,
                out.at(c0),
                1,
                n as isize,
                accumulate,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr().add(c0),
                1,
                n as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                Parallelism::None,
            )
        }
    };
    if block >= n {
        columns(0);
    } else {
        (0..n).step_by(block).collect::<Vec<_>>().into_par_iter().for_each(columns);
    }
}

/// `y`'s pointer, shared by the tasks that write disjoint columns of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: the tasks of one `matmul` write disjoint elements through it, and the call returns
// only when all of them have finished, while it still borrows `y` mutably.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer `c` elements on.
    ///
    /// # Safety
    /// `c` is within the slice the pointer came from.
    unsafe fn at(self, c: usize) -> *mut f32 {
        // SAFETY: as the caller promises.
        unsafe { self.0.add(c) }
    }
}

/// The instructions `gemm` runs here, for the kernels' name.
pub(crate) fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            "avx512"
        } else if std::arch::is_x86_feature_detected!("fma") {
            "avx2"
        } else {
            "sse"
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        "neon"
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the product written out, in both modes, over shapes that are not multiples of
    /// any kernel's tile.
    #[test]
    fn matmul_is_the_product() {
        for &(rows, k, n) in &[(1, 3, 2), (7, 33, 65), (3, 40, 7), (45, 384, 129)] {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 13) as f32 * 0.125 - 0.75).collect();
            let base: Vec<f32> = (0..rows * n).map(|i| (i % 3) as f32).collect();
            for threads in [1, 2, 3] {
                for accumulate in [false, true] {
                    let mut y = base.clone();
                    matmul(&mut y, &x, &w, rows, k, n, accumulate, threads);
                    for r in 0..rows {
                        for c in 0..n {
                            let dot: f64 = (0..k).map(|j| x[r * k + j] as f64 * w[j * n + c] as f64).sum();
                            let want = dot + if accumulate { base[r * n + c] as f64 } else { 0.0 };
                            let got = y[r * n + c] as f64;
                            assert!(
                                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                                "[{r},{c}] {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
