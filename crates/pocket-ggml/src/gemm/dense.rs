//! f32 matrix products for the encoder ([`crate::encoder`]), on the `gemm` crate's packed
//! kernels (AVX-512 where the CPU has it, AVX2/FMA or NEON otherwise, chosen at run time).
//!
//! Why not ggml's: for f32 matrices ggml's CPU backend uses llamafile's tinyBLAS, which on the
//! 2-core x86 machines here ran at about 60% of the cores' peak for the shapes of a sentence
//! encoder (hundreds of rows, 384–1536 columns); `gemm` packs both operands into cache-sized
//! panels as BLAS libraries do.

pub(crate) use gemm::Parallelism;
use rayon::prelude::*;

/// Up to this many rows a product skips the packed kernels. `gemm` packs the weights into
/// panels on every call, which costs about one more read and write of the matrix: nothing
/// beside hundreds of rows, but for one short text (a dozen rows) it made a pass 4× slower
/// than reading each weight row once and taking its dot products with every row of `x`.
const FEW_ROWS: usize = 32;

/// `y = base + x · wᵀ`, where `x` is `rows × k` and `w` is `n × k` (both row-major: the
/// weights of one output contiguous, as GGUF stores a matrix), and `y` is `rows × n`; `base`
/// is what `y` holds before (`accumulate`: the residual and the bias, set by the caller) or
/// nothing.
///
/// Panics if the lengths disagree with `rows`, `k` and `n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_t(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    parallelism: Parallelism,
) {
    assert_eq!(x.len(), rows * k, "x is rows × k");
    assert_eq!(w.len(), n * k, "w is n × k");
    assert_eq!(y.len(), rows * n, "y is rows × n");
    if rows == 0 || n == 0 {
        return;
    }
    if rows <= FEW_ROWS {
        let threads = match parallelism {
            Parallelism::None => 1,
            Parallelism::Rayon(n) => n.max(1),
        };
        return few_rows(y, x, w, rows, k, n, accumulate, threads);
    }
    let (k_, n_) = (k as isize, n as isize);
    // SAFETY: every pointer is into a slice whose length was checked above against the strides
    // given: y[r, c] at r·n + c (r < rows, c < n), x[r, j] at r·k + j, wᵀ[j, c] = w[c·k + j]
    // (j < k); `y` is borrowed mutably, so it overlaps neither operand.
    unsafe {
        gemm::gemm(
            rows,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n_,
            accumulate,
            x.as_ptr(),
            1,
            k_,
            w.as_ptr(),
            k_,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// [`matmul_t`] for a few rows: each weight row read once, its dot products with every row of
/// `x` (which stays in cache) taken four weight rows and two rows of `x` at a time (eight sums
/// in registers); the weight rows split between `threads` threads of the rayon pool this runs
/// in.
#[allow(clippy::too_many_arguments)]
fn few_rows(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    rows: usize,
    k: usize,
    n: usize,
    accumulate: bool,
    threads: usize,
) {
    // Computed transposed (a weight row's outputs contiguous), so threads write apart.
    let mut yt = vec![0f32; n * rows];
    let per_task = n.div_ceil(threads).next_multiple_of(4);
    let task = |(t, out): (usize, &mut [f32])| {
        let c0 = t * per_task;
        for (i, out4) in out.chunks_mut(4 * rows).enumerate() {
            let c = c0 + 4 * i;
            let m = out4.len() / rows;
            // Past the last weight row, the last one again (its sums are not stored).
            let wr: [&[f32]; 4] = std::array::from_fn(|j| &w[(c + j.min(m - 1)) * k..][..k]);
            for r in (0..rows).step_by(2) {
                let r1 = (r + 1).min(rows - 1);
                let d = dot_4x2([&x[r * k..][..k], &x[r1 * k..][..k]], wr);
                for j in 0..m {
                    out4[j * rows + r] = d[0][j];
                    out4[j * rows + r1] = d[1][j];
                }
            }
        }
    };
    if threads > 1 {
        yt.par_chunks_mut(per_task * rows).enumerate().for_each(task);
    } else {
        yt.chunks_mut(per_task * rows).enumerate().for_each(task);
    }
    for (r, yr) in y.chunks_exact_mut(n).enumerate() {
        for (c, v) in yr.iter_mut().enumerate() {
            let p = yt[c * rows + r];
            *v = if accumulate { *v + p } else { p };
        }
    }
}

/// `a·b + c`, fused where the build's CPU has FMA (elsewhere `mul_add` would be a libm call).
#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(any(target_feature = "fma", target_arch = "aarch64"))]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(any(target_feature = "fma", target_arch = "aarch64")))]
    {
        a * b + c
    }
}

/// The dot products of each of `x` with each of `w`, in 16 partial sums each: fixed-size
/// chunks and one accumulator array per product, which the compiler keeps in vector registers.
fn dot_4x2(x: [&[f32]; 2], w: [&[f32]; 4]) -> [[f32; 4]; 2] {
    const L: usize = 16;
    let xc = x.map(|x| x.as_chunks::<L>().0);
    let wc = w.map(|w| w.as_chunks::<L>().0);
    // Eight named accumulators: an array of them is kept in memory, not registers.
    let z = [0f32; L];
    let (mut a00, mut a01, mut a02, mut a03, mut a10, mut a11, mut a12, mut a13) = (z, z, z, z, z, z, z, z);
    for i in 0..xc[0].len() {
        let (x0, x1) = (&xc[0][i], &xc[1][i]);
        let (w0, w1, w2, w3) = (&wc[0][i], &wc[1][i], &wc[2][i], &wc[3][i]);
        for l in 0..L {
            a00[l] = fma(x0[l], w0[l], a00[l]);
            a01[l] = fma(x0[l], w1[l], a01[l]);
            a02[l] = fma(x0[l], w2[l], a02[l]);
            a03[l] = fma(x0[l], w3[l], a03[l]);
            a10[l] = fma(x1[l], w0[l], a10[l]);
            a11[l] = fma(x1[l], w1[l], a11[l]);
            a12[l] = fma(x1[l], w2[l], a12[l]);
            a13[l] = fma(x1[l], w3[l], a13[l]);
        }
    }
    let acc = [[a00, a01, a02, a03], [a10, a11, a12, a13]];
    let whole = xc[0].len() * L;
    std::array::from_fn(|r| {
        std::array::from_fn(|j| {
            let tail: f32 = x[r][whole..].iter().zip(&w[j][whole..]).map(|(a, b)| a * b).sum();
            acc[r][j].iter().sum::<f32>() + tail
        })
    })
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
    fn matmul_t_is_the_product_with_the_transposed_weights() {
        for &(rows, k, n) in &[(1, 3, 2), (7, 33, 65), (3, 40, 7), (45, 384, 129)] {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 11) as f32 * 0.25 - 1.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 13) as f32 * 0.125 - 0.75).collect();
            let base: Vec<f32> = (0..rows * n).map(|i| (i % 3) as f32).collect();
            for par in [Parallelism::None, Parallelism::Rayon(2)] {
                for accumulate in [false, true] {
                    let mut y = base.clone();
                    matmul_t(&mut y, &x, &w, rows, k, n, accumulate, par);
                    for r in 0..rows {
                        for c in 0..n {
                            let dot: f64 = (0..k).map(|j| x[r * k + j] as f64 * w[c * k + j] as f64).sum();
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
