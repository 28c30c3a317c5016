//! Q4_K and Q6_K weights × Q8_K activations (ggml's `ggml_vec_dot_q4_K_q8_K` and
//! `ggml_vec_dot_q6_K_q8_K`, AVX2 branch, per element).
//!
//! Per super-block of 256 weights ggml forms exact int32 lane sums (`vpmaddubsw` of the
//! unsigned weights by the activations, `vpmaddwd` by the sub-block scales, integer adds),
//! converts them to f32 once and fuse-multiply-adds them by `d_y·d_x` into 8 lanes; Q4_K also
//! accumulates its mins term (`d_y·dmin_x` times the 4 lane sums of mins × activation sums)
//! in 4 more. These kernels unpack a weight super-block (values and scales) into registers
//! and L1 once, then run every activation row of the tile through it, with the same
//! integers, the same products and the same fused multiply-adds in the same order. ggml's
//! AVX2 branch is also what AVX-512 builds run for these formats, so one kernel serves all
//! x86 CPUs here.

use std::arch::x86_64::*;

use super::{f16, hsum};
use crate::gemm::blocks::{BlockQ4K, BlockQ6K, BlockQ8K, q4_k_scales_and_mins};
use crate::gemm::{Rows, Work, blocks};

/// Activation rows per tile: their accumulators stay in L1 across a weight row.
const TILE_COLS: usize = 16;

/// A weight super-block unpacked for [`dot_q4_k`].
struct Q4K {
    /// The 8 sub-blocks' 32 weights as bytes.
    q: [__m256i; 8],
    /// Each sub-block's scale in all 16 int16 lanes.
    scales: [__m256i; 8],
    /// The 8 mins as int16.
    mins: __m128i,
    d: f32,
    dmin: f32,
}

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`super::gemm`] for Q4_K.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm_q4_k(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller.
    unsafe { gemm_q4_k_avx2(rows, out, ld, work) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // c indexes y, sums and the accumulators
unsafe fn gemm_q4_k_avx2(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) =
        unsafe { (blocks::<BlockQ4K>(rows.w, rows.range.end * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb)) };
    // Per activation super-block, the sums of each 32 (ggml's `_mm_hadd_epi16` of bsums).
    let sums = &mut work.ints;
    sums.clear();
    sums.resize(y.len() * 4, 0);
    for (i, b) in y.iter().enumerate() {
        // SAFETY: this function has AVX2; 32 bytes are read and 16 written.
        unsafe {
            let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
            let q8s =
                _mm_hadd_epi16(_mm256_extracti128_si256::<0>(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            _mm_storeu_si128(sums.as_mut_ptr().add(i * 4).cast(), q8s);
        }
    }
    for r in rows.range.clone() {
        for c0 in (0..rows.n).step_by(TILE_COLS) {
            let nc = TILE_COLS.min(rows.n - c0);
            let mut acc = [_mm256_setzero_ps(); TILE_COLS];
            let mut acc_m = [_mm_setzero_ps(); TILE_COLS];
            for ib in 0..nb {
                // SAFETY: this function has AVX2 and F16C; the block exists.
                let x = unsafe { unpack_q4_k(w.get_unchecked(r * nb + ib)) };
                for c in 0..nc {
                    let at = (c0 + c) * nb + ib;
                    // SAFETY: as above; the activation block and its sums exist.
                    unsafe {
                        let q8s = _mm_loadu_si128(sums.as_ptr().add(at * 4).cast());
                        dot_q4_k(&x, y.get_unchecked(at), q8s, &mut acc[c], &mut acc_m[c]);
                    }
                }
            }
            for c in 0..nc {
                // SAFETY: this function has AVX2; out is writable at (c, r) by the caller.
                unsafe {
                    // ggml's order: the 4 mins lanes as (0 + 2) + (1 + 3), added after the
                    // 8-lane sum.
                    let mut m = acc_m[c];
                    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
                    m = _mm_add_ss(m, _mm_movehdup_ps(m));
                    *out.add((c0 + c) * ld + r) = hsum(acc[c]) + _mm_cvtss_f32(m);
                }
            }
        }
    }
}

/// ggml's scale and min unpacking of a Q4_K super-block, and its weights as bytes.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn unpack_q4_k(x: &BlockQ4K) -> Q4K {
    // Bytes 0..8 are the scales, 8..16 the mins.
    let bytes = q4_k_scales_and_mins(&x.scales);
    // SAFETY: by the caller; 128 bytes of the block are read.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let mut q = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = _mm256_loadu_si256(x.qs.as_ptr().add(32 * j).cast());
            q[2 * j] = _mm256_and_si256(bits, m4);
            q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
        }
        Q4K {
            q,
            scales: std::array::from_fn(|i| _mm256_set1_epi16(i16::from(bytes[i]))),
            mins: _mm256_extracti128_si256::<1>(_mm256_cvtepu8_epi16(_mm_loadu_si128(bytes.as_ptr().cast()))),
            d: f16(x.d),
            dmin: f16(x.dmin),
        }
    }
}

/// One super-block of ggml's Q4_K dot product for one activation row, into its
/// accumulators. `q8s` holds the activations' sums of each 32.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn dot_q4_k(x: &Q4K, y: &BlockQ8K, q8s: __m128i, acc: &mut __m256, acc_m: &mut __m128) {
    let d = y.d * x.d;
    let dmin = -y.d * x.dmin;
    // SAFETY: by the caller; 256 activation bytes are read.
    unsafe {
        let prod = _mm_madd_epi16(x.mins, q8s);
        *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
        let mut sumi = _mm256_setzero_si256();
        for i in 0..8 {
            let q8 = _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast());
            let p16 = _mm256_madd_epi16(x.scales[i], _mm256_maddubs_epi16(x.q[i], q8));
            sumi = _mm256_add_epi32(sumi, p16);
        }
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
    }
}

/// A weight super-block unpacked for [`dot_q6_k`].
struct Q6K {
    /// The 8 groups of 32 weights as unsigned 6-bit bytes.
    q: [__m256i; 8],
    /// Each group's two sub-block scales, in the low and high 8 int16 lanes.
    scales: [__m256i; 8],
    /// The 16 scales as int16, for the `−32` offset.
    scales_16: __m256i,
    d: f32,
}

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`super::gemm`] for Q6_K.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm_q6_k(rows: &Rows, out: *mut f32, ld: usize, _work: &mut Work) {
    // SAFETY: by the caller.
    unsafe { gemm_q6_k_avx2(rows, out, ld) }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // c indexes y and the accumulators
unsafe fn gemm_q6_k_avx2(rows: &Rows, out: *mut f32, ld: usize) {
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) =
        unsafe { (blocks::<BlockQ6K>(rows.w, rows.range.end * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb)) };
    for r in rows.range.clone() {
        for c0 in (0..rows.n).step_by(TILE_COLS) {
            let nc = TILE_COLS.min(rows.n - c0);
            let mut acc = [_mm256_setzero_ps(); TILE_COLS];
            for ib in 0..nb {
                // SAFETY: this function has AVX2 and F16C; the block exists.
                let x = unsafe { unpack_q6_k(w.get_unchecked(r * nb + ib)) };
                for c in 0..nc {
                    // SAFETY: as above; the activation block exists.
                    unsafe { dot_q6_k(&x, y.get_unchecked((c0 + c) * nb + ib), &mut acc[c]) };
                }
            }
            for c in 0..nc {
                // SAFETY: this function has AVX2; out is writable at (c, r) by the caller.
                unsafe { *out.add((c0 + c) * ld + r) = hsum(acc[c]) };
            }
        }
    }
}

/// A Q6_K super-block's weights as bytes and its scales, as ggml's AVX2 kernel forms them.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn unpack_q6_k(x: &BlockQ6K) -> Q6K {
    // SAFETY: by the caller; the block's bytes are read.
    unsafe {
        let m15 = _mm256_set1_epi8(15);
        let mut q = [_mm256_setzero_si256(); 8];
        for j in 0..2 {
            let bits1 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * j).cast());
            let bits2 = _mm256_loadu_si256(x.ql.as_ptr().add(64 * j + 32).cast());
            let high = _mm256_loadu_si256(x.qh.as_ptr().add(32 * j).cast());
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(high, _mm256_set1_epi8(3)));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(high, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(high, _mm256_set1_epi8(-64)));
            q[4 * j] = _mm256_or_si256(_mm256_and_si256(bits1, m15), h0);
            q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(bits2, m15), h1);
            q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15), h2);
            q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15), h3);
        }
        let s = |i: usize| i16::from(x.scales[i]);
        Q6K {
            q,
            scales: std::array::from_fn(|g| {
                let (lo, hi) = (s(2 * g), s(2 * g + 1));
                _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi)
            }),
            scales_16: _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast())),
            d: f16(x.d),
        }
    }
}

/// One super-block of ggml's Q6_K dot product for one activation row, into its accumulator.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline(always)]
unsafe fn dot_q6_k(x: &Q6K, y: &BlockQ8K, acc: &mut __m256) {
    let d = y.d * x.d;
    // SAFETY: by the caller; the activation block's bytes are read.
    unsafe {
        // The `− 32` of every weight, as ggml subtracts it: 32·Σ scale·bsum.
        let q8sums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, x.scales_16));
        let mut sumi = _mm256_setzero_si256();
        for i in 0..8 {
            let q8 = _mm256_loadu_si256(y.qs.as_ptr().add(32 * i).cast());
            let p16 = _mm256_madd_epi16(x.scales[i], _mm256_maddubs_epi16(x.q[i], q8));
            sumi = _mm256_add_epi32(sumi, p16);
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
    }
}
