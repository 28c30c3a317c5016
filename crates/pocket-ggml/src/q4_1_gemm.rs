//! A Q4_1 × Q8_1 matrix product over several activation rows whose every output element is
//! bitwise what ggml's one-row kernel (`ggml_vec_dot_q4_1_q8_1`, AVX2) computes.
//!
//! ggml has no multi-row kernel for Q4_1 on x86 (llamafile's tinyBLAS takes only the
//! symmetric formats), so a verification pass of n tokens costs n one-row dot products per
//! weight row: 4.1 plain steps for 8 tokens on this project's CPU. This kernel unpacks each
//! weight block once for all rows and converts the activation scales once per block, and
//! keeps the one-row kernel's arithmetic per element — the same f32 scale product, the same
//! exact integer lane sums, the same fused multiply-add over blocks in order, the same
//! horizontal sum — so a row of a verification pass stays what decoding that token alone
//! computes.
//!
//! Work in progress: the kernel and its bitwise check against ggml; not yet in the graph.
//! This version needs AVX-512 VNNI (`vpdpbusd`, one instruction for ggml's `maddubs` +
//! `madd`, with the same int32 lane sums) and must be dispatched at run time
//! (`is_x86_feature_detected!`) beside an AVX2 one before it goes in the graph.
//! Measured (`time_against_the_one_row_kernel`, 1536 × 576, this project's CPU, quiet runs):
//! ggml's one-row kernel about 31 µs per activation row; this one 20 µs per row at 4–16 rows
//! (1.55–1.8×), 50 µs at one (ggml's path stays for single-token passes). Tiles are 2 weight
//! rows × up to 4 activation rows.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// ggml's `block_q4_1`: 32 weights as 4-bit values `q` meaning `d·q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ4_1 {
    pub(crate) d: u16,
    pub(crate) m: u16,
    pub(crate) qs: [u8; 16],
}

/// ggml's `block_q8_1`: 32 activations as `d·q`, with `s = d·Σq`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ8_1 {
    pub(crate) d: u16,
    pub(crate) s: u16,
    pub(crate) qs: [i8; 32],
}

/// An f16 as f32 (exact, as ggml's `GGML_CPU_FP16_TO_FP32`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
fn f16(x: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(x))))
}

/// Activation rows handled together: one accumulator register each.
pub(crate) const COLS: usize = 8;

/// Activation rows per tile (a multiple of which fills [`COLS`] lanes).
const TILE_COLS: usize = 4;

/// `out[c * ld + r] = dot(w row r, y row c)` for `r` in `rows` and every activation row `c`
/// of `y` (`y.len() / nb` of them), where each weight row is `nb` blocks of `w`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `w` holds `rows.end * nb` blocks, `y` a multiple of
/// `nb`, and `out` room for every `(c, r)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    ld: usize,
) {
    let ncols = y.len() / nb;
    assert!(w.len() >= rows.end * nb && out.len() >= (ncols.max(1) - 1) * ld + rows.end);
    let mut c0 = 0;
    // The activation scales of a tile as f32, converted once (ggml converts them in every
    // dot product; the conversion is exact, so once is the same): per block, the tile's 8
    // `d` then its 8 `s` (unused lanes zero).
    let mut scales = vec![0f32; nb * 2 * COLS];
    while c0 < ncols {
        let nc = TILE_COLS.min(ncols - c0);
        scales.fill(0.0);
        for c in 0..nc {
            for ib in 0..nb {
                let b = &y[(c0 + c) * nb + ib];
                scales[ib * 2 * COLS + c] = f16(b.d);
                scales[ib * 2 * COLS + COLS + c] = f16(b.s);
            }
        }
        // SAFETY: bounds asserted above; the columns c0..c0 + nc exist.
        unsafe {
            match nc {
                8 => tile::<8>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                7 => tile::<7>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                6 => tile::<6>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                5 => tile::<5>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                4 => tile::<4>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                3 => tile::<3>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                2 => tile::<2>(w, y, &scales, nb, c0, rows.clone(), out, ld),
                _ => tile::<1>(w, y, &scales, nb, c0, rows.clone(), out, ld),
            }
        }
        c0 += nc;
    }
}

/// [`gemm`] for the `N` activation rows from `c0`, `RM` weight rows at a time: one
/// accumulator register per (weight row, activation row), each activation block loaded once
/// per tile; the tile's scales and `m·s` sums travel as 8-lane vectors (lane c for c0 + c).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    ld: usize,
) {
    let mut r = rows.start;
    while r + 2 <= rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<2, N>(w, y, scales, nb, c0, r, out, ld) };
        r += 2;
    }
    if r < rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<1, N>(w, y, scales, nb, c0, r, out, ld) };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn tile_rows<const RM: usize, const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    r0: usize,
    out: &mut [f32],
    ld: usize,
) {
    let low = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); N]; RM];
    let mut summs = [_mm256_setzero_ps(); RM];
    for ib in 0..nb {
        // SAFETY: the scales hold 2·COLS floats per block.
        let (yd, ys) = unsafe {
            let p = scales.as_ptr().add(ib * 2 * COLS);
            (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(COLS)))
        };
        let mut qx = [_mm256_setzero_si256(); RM];
        let mut d0d1 = [_mm256_setzero_ps(); RM];
        for rr in 0..RM {
            // SAFETY: the caller checked that w holds every row's blocks.
            let x = unsafe { w.get_unchecked((r0 + rr) * nb + ib) };
            // m·s of two f16 values is exact in f32, so this sum per lane is ggml's scalar
            // `summs` whether or not either side fuses the multiply-add.
            summs[rr] = _mm256_add_ps(summs[rr], _mm256_mul_ps(_mm256_set1_ps(f16(x.m)), ys));
            d0d1[rr] = _mm256_mul_ps(_mm256_set1_ps(f16(x.d)), yd);
            // SAFETY: 16 bytes of the block.
            let tmp = unsafe { _mm_loadu_si128(x.qs.as_ptr().cast()) };
            let bytes = _mm256_insertf128_si256::<1>(_mm256_castsi128_si256(tmp), _mm_srli_epi16::<4>(tmp));
            qx[rr] = _mm256_and_si256(low, bytes);
        }
        for c in 0..N {
            // SAFETY: 32 bytes of the block of column c0 + c (the caller's N columns).
            let qy = unsafe { _mm256_loadu_si256(y.get_unchecked((c0 + c) * nb + ib).qs.as_ptr().cast()) };
            let lane = _mm256_set1_epi32(c as i32);
            for rr in 0..RM {
                let xy = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), qx[rr], qy));
                let scale = _mm256_permutevar8x32_ps(d0d1[rr], lane);
                acc[rr][c] = _mm256_fmadd_ps(scale, xy, acc[rr][c]);
            }
        }
    }
    for rr in 0..RM {
        let mut sums = [0f32; COLS];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), summs[rr]) };
        for c in 0..N {
            let x = acc[rr][c];
            let mut res = _mm256_extractf128_ps::<1>(x);
            res = _mm_add_ps(res, _mm256_castps256_ps128(x));
            res = _mm_add_ps(res, _mm_movehl_ps(res, res));
            res = _mm_add_ss(res, _mm_movehdup_ps(res));
            // SAFETY: the caller checked out's size.
            unsafe { *out.get_unchecked_mut((c0 + c) * ld + r0 + rr) = _mm_cvtss_f32(res) + sums[c] };
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::time::Instant;

    use llama_cpp_sys_2 as sys;

    use super::*;

    /// Random Q4_1 weights (`rows × k`) and Q8_1 activations (`cols × k`), quantized by ggml.
    fn data(rows: usize, cols: usize, k: usize, seed: u64) -> (Vec<BlockQ4_1>, Vec<BlockQ8_1>) {
        let mut state = seed;
        let mut rand = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let wf: Vec<f32> = (0..rows * k).map(|_| rand()).collect();
        let yf: Vec<f32> = (0..cols * k).map(|_| rand() * 3.0).collect();
        let nb = k / 32;
        let mut w = vec![BlockQ4_1 { d: 0, m: 0, qs: [0; 16] }; rows * nb];
        let mut y = vec![BlockQ8_1 { d: 0, s: 0, qs: [0; 32] }; cols * nb];
        // SAFETY: buffers sized for the blocks; ggml's CPU quantizer for Q8_1 is what its
        // matrix product uses on activations.
        unsafe {
            sys::ggml_quantize_chunk(
                sys::GGML_TYPE_Q4_1,
                wf.as_ptr(),
                w.as_mut_ptr().cast(),
                0,
                rows as i64,
                k as i64,
                std::ptr::null(),
            );
            let from_float = (*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q8_1)).from_float.unwrap();
            for c in 0..cols {
                from_float(yf[c * k..].as_ptr(), y[c * nb..].as_mut_ptr().cast(), k as i64);
            }
        }
        (w, y)
    }

    fn vec_dot(w: &[BlockQ4_1], y: &[BlockQ8_1], nb: usize, r: usize, c: usize) -> f32 {
        let mut s = 0f32;
        // SAFETY: one row of each, nb blocks; ggml's own one-row kernel.
        unsafe {
            let dot = (*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q4_1)).vec_dot.unwrap();
            dot(
                (nb * 32) as i32,
                &mut s,
                0,
                w[r * nb..].as_ptr().cast(),
                0,
                y[c * nb..].as_ptr().cast(),
                0,
                1,
            );
        }
        s
    }

    #[test]
    fn every_element_is_what_the_one_row_kernel_computes() {
        crate::init();
        for (rows, cols, k) in [(64, 1, 576), (37, 9, 576), (16, 17, 1536), (5, 8, 32)] {
            let nb = k / 32;
            let (w, y) = data(rows, cols, k, rows as u64 * 31 + cols as u64);
            let mut out = vec![0f32; cols * rows];
            // SAFETY: the test machine has AVX2/FMA/F16C (the ggml build requires them);
            // sizes as documented.
            unsafe { gemm(&w, &y, nb, 0..rows, &mut out, rows) };
            for c in 0..cols {
                for r in 0..rows {
                    let want = vec_dot(&w, &y, nb, r, c);
                    let got = out[c * rows + r];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "row {r} col {c} of {rows}x{cols}x{k}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    #[ignore = "timing, run by hand: cargo test --release -p pocket-ggml q4_1_gemm -- --ignored --nocapture"]
    fn time_against_the_one_row_kernel() {
        crate::init();
        let (rows, k) = (1536, 576);
        let nb = k / 32;
        for cols in [1, 2, 4, 8, 9, 16] {
            let (w, y) = data(rows, cols, k, 7);
            let mut out = vec![0f32; cols * rows];
            let reps = 200;
            let t = Instant::now();
            for _ in 0..reps {
                for c in 0..cols {
                    for r in 0..rows {
                        out[c * rows + r] = vec_dot(&w, &y, nb, r, c);
                    }
                }
            }
            let one_row = t.elapsed().as_secs_f64() / reps as f64;
            let t = Instant::now();
            for _ in 0..reps {
                // SAFETY: as in the equality test.
                unsafe { gemm(&w, &y, nb, 0..rows, &mut out, rows) };
            }
            let tiled = t.elapsed().as_secs_f64() / reps as f64;
            eprintln!(
                "{cols:2} columns: one-row kernel {:.1} µs, this kernel {:.1} µs ({:.2}x)",
                one_row * 1e6,
                tiled * 1e6,
                one_row / tiled
            );
        }
    }
}
