//! The aarch64 kernels (NEON, with or without the dot-product instructions), and what they
//! share: which lane sums ggml's build forms, and the instructions that form them here.
//!
//! ggml's ARM one-row kernels for Q4_0, Q4_1, Q5_0 and Q8_0 sum the products of a block in
//! 4 int32 lanes, convert the lanes to f32 and scale them, so the rounding depends on which
//! products share a lane. A ggml built with the dot-product extension (`armv8.2-a+dotprod`)
//! forms lane i from products 4i..4i+3 of each 16-byte half (`sdot`); the default build
//! (`armv8-a`) has no `sdot` and forms lane i from products 2i, 2i+1, 2i+8 and 2i+9
//! (`vmull_s8` + `vpaddlq_s16`, its `ggml_vdotq_s32`). So the build decides the lanes, and
//! the CPU the instructions: [`Isa::NeonDot`] for a dotprod ggml; for a plain one,
//! [`Isa::NeonPermuted`] where the CPU has `sdot` anyway (both operands' bytes permuted so that
//! `sdot` groups plain NEON's lanes: the weights as a block is unpacked, the activations once
//! per call), or [`Isa::Neon`] (widening multiplies, half of ggml's instructions).
//!
//! Q4_K and Q6_K reduce each sub-block to one exact integer before any float arithmetic, so
//! any instructions give their bits; they use `sdot` wherever the CPU has it.
//!
//! The float arithmetic around the lanes is GCC's translation of ggml's C: its `vmlaq_n_f32`
//! is a multiply then an add, not fused, while the scalar `sumf += a * b` of the odd last
//! block and of the K-quants is contracted to a fused multiply-add. A compiler that
//! translates them otherwise is caught at start by `super::agrees_with_ggml`, which then
//! leaves that format to ggml.

use std::arch::aarch64::*;
use std::arch::asm;

use llama_cpp_sys_2 as sys;

use super::{Isa, Quant, Rows, Work};

mod k_quants;
mod q0;

/// The kernels that sum as this build of ggml's one-row kernels do, on this CPU, or `None`.
pub(crate) fn detect() -> Option<Isa> {
    // SAFETY: queries of how ggml was compiled.
    let (neon, dotprod, sve) = unsafe {
        (sys::ggml_cpu_has_neon() != 0, sys::ggml_cpu_has_dotprod() != 0, sys::ggml_cpu_has_sve() != 0)
    };
    let cpu_dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
    match (neon, sve, dotprod) {
        // An SVE build takes other paths for Q4_0, Q8_0 and the K-quants.
        (false, _, _) | (_, true, _) => None,
        // ggml would not run on a CPU without it either.
        (true, false, true) => cpu_dotprod.then_some(Isa::NeonDot),
        (true, false, false) => Some(if cpu_dotprod { Isa::NeonPermuted } else { Isa::Neon }),
    }
}

/// [`super::gemm`] on aarch64.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm(isa: Isa, quant: Quant, rows: Rows, out: *mut f32, ld: usize, work: &mut Work) {
    use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0};
    // SAFETY: by the caller; `isa` was chosen by `detect` (or is plain NEON, which every
    // aarch64 CPU has), so the CPU has `sdot` where a kernel uses it.
    unsafe {
        match (quant, isa) {
            (Quant::Q4_0, _) => q0::gemm::<BlockQ4_0>(isa, &rows, out, ld, work),
            (Quant::Q4_1, _) => q0::gemm::<BlockQ4_1>(isa, &rows, out, ld, work),
            (Quant::Q5_0, _) => q0::gemm::<BlockQ5_0>(isa, &rows, out, ld, work),
            (Quant::Q8_0, _) => q0::gemm::<BlockQ8_0>(isa, &rows, out, ld, work),
            (Quant::Q4K, Isa::Neon) => k_quants::gemm_q4_k::<Pairs>(&rows, out, ld, work),
            (Quant::Q4K, _) => k_quants::gemm_q4_k_sdot(&rows, out, ld, work),
            (Quant::Q6K, Isa::Neon) => k_quants::gemm_q6_k::<Pairs>(&rows, out, ld),
            (Quant::Q6K, _) => k_quants::gemm_q6_k_sdot(&rows, out, ld),
        }
    }
}

/// Integer dot products of signed bytes in 4 int32 lanes, as some ggml build forms them.
pub(crate) trait Lanes {
    /// Whether both operands' bytes must be in [`PERMUTE`] order (and are).
    const PERMUTED: bool;

    /// The lanes of `a0·b0 + a1·b1` (two 16-byte halves of a block): exact sums of 8
    /// products each, grouped as this implementation's ggml build groups them. The sum of
    /// two products must fit 16 bits (every format's weights times activations in
    /// [-127, 127] does, −128 weights of Q8_0 included).
    ///
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot2(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t;

    /// `acc` plus the products of 16 bytes, summed in any lanes (for sums that are reduced
    /// to one integer: the K-quants).
    ///
    /// # Safety
    /// As for [`Lanes::dot2`].
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

/// `sdot` on bytes in their order (`PERMUTED` false: a dotprod ggml's lanes) or in
/// [`PERMUTE`] order (true: a plain NEON ggml's lanes).
pub(crate) struct SdotOn<const PERMUTED: bool>;

/// A dotprod ggml's lanes.
pub(crate) type Sdot = SdotOn<false>;

/// A plain NEON ggml's lanes, from `sdot`.
pub(crate) type SdotPermuted = SdotOn<true>;

/// Widening multiplies and pairwise adds: a plain NEON ggml's lanes, on any aarch64 CPU.
pub(crate) struct Pairs;

/// `acc + sdot(a, b)`.
///
/// # Safety
/// The CPU must have the dot-product instructions.
#[inline(always)]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: by the caller; a register-only instruction. (Rust's `vdotq_s32` is not stable.)
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

impl<const PERMUTED: bool> Lanes for SdotOn<PERMUTED> {
    const PERMUTED: bool = PERMUTED;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot2(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t {
        // SAFETY: by the caller.
        unsafe { sdot(sdot(vdupq_n_s32(0), a0, b0), a1, b1) }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: by the caller.
        unsafe { sdot(acc, a, b) }
    }
}

impl Lanes for Pairs {
    const PERMUTED: bool = false;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot2(a0: int8x16_t, b0: int8x16_t, a1: int8x16_t, b1: int8x16_t) -> int32x4_t {
        // Lane i of ggml's stand-in is products 2i, 2i+1, 2i+8, 2i+9 of each half. Each
        // int16 lane j here holds products j and j+8 of one half (two products fit), and
        // the pairwise adds to int32 join lanes 2i and 2i+1: the same integers.
        // SAFETY: NEON is part of aarch64.
        unsafe {
            let h0 = vmlal_high_s8(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)), a0, b0);
            let h1 = vmlal_high_s8(vmull_s8(vget_low_s8(a1), vget_low_s8(b1)), a1, b1);
            vpadalq_s16(vpaddlq_s16(h0), h1)
        }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: NEON is part of aarch64.
        unsafe { vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b)) }
    }
}

/// The byte order in which `sdot`'s lane i (bytes 4i..4i+3) holds plain NEON's lane i
/// (bytes 2i, 2i+1, 2i+8, 2i+9).
pub(crate) const PERMUTE: [u8; 16] = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15];

/// `v`'s bytes in [`PERMUTE`] order.
#[inline(always)]
pub(crate) fn permute(v: int8x16_t) -> int8x16_t {
    // SAFETY: NEON is part of aarch64; 16 bytes are read from a constant.
    unsafe { vqtbl1q_s8(v, vld1q_u8(PERMUTE.as_ptr())) }
}
