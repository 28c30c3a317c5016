//! What every x86 kernel shares: ggml's f16 conversion and horizontal sum, and the integer
//! dot products of 4 byte pairs per lane.

use std::arch::x86_64::*;

/// Exact int32 lane sums of 4 products of unsigned 8-bit `qx` and signed 8-bit `qy` bytes
/// (the pairs must not saturate 16 bits in [`Avx2`]: every caller's values are small enough
/// for their sums to be exact either way, so the choice changes speed, not bits).
pub(crate) trait Dot {
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i;
}

/// AVX-512 VNNI on 256-bit registers (EVEX `vpdpbusd`, needs AVX-512 VL).
pub(crate) struct Avx512Vnni;

impl Dot for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-512 VNNI and VL).
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy) }
    }
}

/// AVX-VNNI (VEX `vpdpbusd`).
pub(crate) struct AvxVnni;

impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qx, qy) }
    }
}

/// AVX2: `vpmaddubsw` then `vpmaddwd` by ones.
pub(crate) struct Avx2;

impl Dot for Avx2 {
    #[inline(always)]
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX2).
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)) }
    }
}

/// An f16 as f32 (exact, as ggml's `GGML_CPU_FP16_TO_FP32`).
///
/// # Safety
/// The CPU must have F16C.
#[inline(always)]
pub(crate) unsafe fn f16(x: u16) -> f32 {
    // SAFETY: by the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(x)))) }
}

/// The sum of 8 lanes in ggml's order (`hsum_float_8`): halves, then pairs, then the last two.
///
/// # Safety
/// The CPU must have AVX.
#[inline(always)]
pub(crate) unsafe fn hsum(x: __m256) -> f32 {
    // SAFETY: by the caller.
    unsafe {
        let mut res = _mm256_extractf128_ps::<1>(x);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

/// The 32 4-bit values of 16 bytes as bytes, low nibbles first (ggml's
/// `bytes_from_nibbles_32`).
///
/// # Safety
/// The CPU must have AVX2; `qs` points at 16 readable bytes.
#[inline(always)]
pub(crate) unsafe fn nibbles(qs: *const u8) -> __m256i {
    // SAFETY: by the caller.
    unsafe {
        let tmp = _mm_loadu_si128(qs.cast());
        let bytes = _mm256_insertf128_si256::<1>(_mm256_castsi128_si256(tmp), _mm_srli_epi16::<4>(tmp));
        _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
    }
}

/// The activation scales of `n` rows for one block index, as 8 f32 lanes (lane c for row c,
/// unused lanes zero), so one register carries a tile's scales.
pub(crate) const LANES: usize = 8;

/// `$body` for each `$c` in `0..$n` (`$n` ≤ 8 and known at compile time), written out one
/// after another with `$c` a constant, so that arrays indexed by it stay in registers.
macro_rules! unroll_cols {
    ($c:ident, $n:expr, $body:block) => {
        unroll_cols!(@one $c, $n, 0, $body);
        unroll_cols!(@one $c, $n, 1, $body);
        unroll_cols!(@one $c, $n, 2, $body);
        unroll_cols!(@one $c, $n, 3, $body);
        unroll_cols!(@one $c, $n, 4, $body);
        unroll_cols!(@one $c, $n, 5, $body);
        unroll_cols!(@one $c, $n, 6, $body);
        unroll_cols!(@one $c, $n, 7, $body);
    };
    (@one $c:ident, $n:expr, $i:literal, $body:block) => {
        if $i < $n {
            let $c: usize = $i;
            $body
        }
    };
}
pub(crate) use unroll_cols;
