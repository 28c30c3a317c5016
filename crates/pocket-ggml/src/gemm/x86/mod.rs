//! The x86-64 kernels (AVX2, AVX-VNNI, AVX-512 VNNI), and what they share: ggml's f16
//! conversion and horizontal sum, and the integer dot products of 4 byte pairs per lane.

use std::arch::x86_64::*;

use super::blocks::{BlockQ4K, BlockQ6K};
use super::{Isa, Quant, Rows, Work};

mod k_quants;
mod q0;
mod q4_1;
pub(crate) mod q4_k_x8;

/// [`super::gemm`] on x86-64.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm(isa: Isa, quant: Quant, rows: Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller.
    unsafe {
        match quant {
            Quant::Q4_1 => q4_1::gemm(isa, &rows, out, ld, work),
            Quant::Q4_0 => q0::gemm::<q0::BlockQ4_0>(isa, &rows, out, ld, work),
            Quant::Q5_0 => q0::gemm::<q0::BlockQ5_0>(isa, &rows, out, ld, work),
            Quant::Q8_0 => q0::gemm::<q0::BlockQ8_0>(isa, &rows, out, ld, work),
            Quant::Q4K => k_quants::gemm::<BlockQ4K>(isa, &rows, out, ld, work),
            Quant::Q6K => k_quants::gemm::<BlockQ6K>(isa, &rows, out, ld, work),
        }
    }
}

/// The instructions this CPU has for the kernels, best first, or `None` without AVX2, FMA
/// and F16C.
pub(crate) fn detect() -> Option<Isa> {
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
    {
        Some(Isa::Avx512)
    } else if is_x86_feature_detected!("avxvnni") {
        Some(Isa::AvxVnni)
    } else {
        Some(Isa::Avx2)
    }
}

/// Exact int32 lane sums of 4 products of unsigned 8-bit `qx` and signed 8-bit `qy` bytes
/// (the pairs must not saturate 16 bits in [`Avx2`]: every caller's values are small enough
/// for their sums to be exact either way, so the choice changes speed, not bits).
pub(crate) trait Dot {
    /// Whether [`Dot::dot_acc`] adds 4 products of any unsigned and signed byte to a lane
    /// exactly (VNNI's `vpdpbusd` does, in 32 bits; AVX2's 16-bit pairs saturate).
    const EXACT: bool;

    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i;

    /// `acc` plus the lane sums of [`Dot::dot`], for any bytes where [`Dot::EXACT`].
    ///
    /// # Safety
    /// As for [`Dot::dot`].
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller.
        unsafe { _mm256_add_epi32(acc, Self::dot(qx, qy)) }
    }
}

/// AVX-512 VNNI on 256-bit registers (EVEX `vpdpbusd`, needs AVX-512 VL).
pub(crate) struct Avx512Vnni;

impl Dot for Avx512Vnni {
    const EXACT: bool = true;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-512 VNNI and VL).
        unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy) }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot_acc(acc: __m256i, qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-512 VNNI and VL).
        unsafe { _mm256_dpbusd_epi32(acc, qx, qy) }
    }
}

/// AVX-VNNI (VEX `vpdpbusd`).
pub(crate) struct AvxVnni;

impl Dot for AvxVnni {
    const EXACT: bool = true;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qx, qy) }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot_acc(acc: __m256i, qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(acc, qx, qy) }
    }
}

/// AVX2: `vpmaddubsw` then `vpmaddwd` by ones.
pub(crate) struct Avx2;

impl Dot for Avx2 {
    const EXACT: bool = false;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
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

/// Every f16 as f32, indexed by its bits: a kernel that reads a block's scale with one
/// broadcast load from here leaves the vector pipes to the products, where [`f16`] takes a
/// move and a conversion on them. The values are ggml's conversion's, so the same bits.
pub(crate) fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Box<[f32]>> = std::sync::OnceLock::new();
    // SAFETY: a pure function of 16 bits.
    TABLE.get_or_init(|| (0..=u16::MAX).map(|h| unsafe { llama_cpp_sys_2::ggml_fp16_to_fp32(h) }).collect())
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
