//! Q4_K and Q6_K × Q8_K (ggml's `ggml_vec_dot_q4_K_q8_K` and `ggml_vec_dot_q6_K_q8_K`, NEON
//! branch, per element).
//!
//! Per super-block of 256 weights ggml reduces everything to exact integers (each
//! sub-block's dot product times its scale, the mins or the `−32` offset times the
//! activations' sums) and only then touches floats, with two (Q4_K) or one (Q6_K) fused
//! multiply-adds into a scalar. So any instructions that form the same integers give its
//! bits, and these use `sdot` wherever the CPU has it, whatever ggml was built for. Each
//! weight super-block is unpacked once per tile of activation rows.

use std::arch::aarch64::*;

use super::{Lanes, Sdot};
use crate::gemm::blocks::{BlockQ4K, BlockQ6K, BlockQ8K, f16_to_f32, q4_k_scales_and_mins};
use crate::gemm::{Rows, Work, blocks};

/// Activation rows per tile: their accumulators are scalars.
const TILE_COLS: usize = 16;

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`crate::gemm::gemm`] for Q4_K,
/// with `sdot`.
///
/// # Safety
/// As for [`crate::gemm::gemm`]; the CPU must have the dot-product instructions.
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn gemm_q4_k_sdot(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller.
    unsafe { gemm_q4_k::<Sdot>(rows, out, ld, work) }
}

/// [`crate::gemm::gemm`] for Q4_K, with L's instructions ([`super::Pairs`] runs everywhere).
///
/// # Safety
/// As for [`crate::gemm::gemm`]; the CPU must have L's instructions.
#[inline(always)]
pub(crate) unsafe fn gemm_q4_k<L: Lanes>(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) =
        unsafe { (blocks::<BlockQ4K>(rows.w, rows.range.end * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb)) };
    // Per activation super-block, the sums of each 32 (ggml's `vpaddq_s16` of bsums).
    let sums = &mut work.ints;
    sums.clear();
    sums.extend(
        y.iter().flat_map(|b| (0..8).map(|j| i32::from(b.bsums[2 * j]) + i32::from(b.bsums[2 * j + 1]))),
    );
    // SAFETY: NEON is part of aarch64.
    let mut q = [unsafe { vdupq_n_s8(0) }; 16];
    for r in rows.range.clone() {
        for c0 in (0..rows.n).step_by(TILE_COLS) {
            let nc = TILE_COLS.min(rows.n - c0);
            let mut acc = [0f32; TILE_COLS];
            for ib in 0..nb {
                // SAFETY: the block exists (by the caller).
                let x = unsafe { w.get_unchecked(r * nb + ib) };
                let scales = q4_k_scales_and_mins(&x.scales);
                // Sub-block 2j is the low nibbles of bytes 32j..32j+32, 2j+1 their high ones.
                for j in 0..4 {
                    // SAFETY: NEON is part of aarch64; 32 bytes of the block are read.
                    unsafe {
                        let b0 = vld1q_u8(x.qs.as_ptr().add(32 * j));
                        let b1 = vld1q_u8(x.qs.as_ptr().add(32 * j + 16));
                        let m4 = vdupq_n_u8(0xF);
                        q[4 * j] = vreinterpretq_s8_u8(vandq_u8(b0, m4));
                        q[4 * j + 1] = vreinterpretq_s8_u8(vandq_u8(b1, m4));
                        q[4 * j + 2] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(b0));
                        q[4 * j + 3] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(b1));
                    }
                }
                let (dx, dminx) = (f16_to_f32(x.d), f16_to_f32(x.dmin));
                for (c, acc) in acc.iter_mut().enumerate().take(nc) {
                    let at = (c0 + c) * nb + ib;
                    // SAFETY: the activation block and its sums exist (by the caller).
                    let (yb, sums) = unsafe { (y.get_unchecked(at), sums.get_unchecked(at * 8..at * 8 + 8)) };
                    let mins: i32 = (0..8).map(|j| sums[j] * i32::from(scales[8 + j])).sum();
                    // SAFETY: the caller's CPU has L's instructions; 256 bytes are read.
                    let sumi = unsafe {
                        let mut lanes = vdupq_n_s32(0);
                        for s in 0..8 {
                            let yq = yb.qs.as_ptr().add(32 * s);
                            let t = L::dot(
                                L::dot(vdupq_n_s32(0), q[2 * s], vld1q_s8(yq)),
                                q[2 * s + 1],
                                vld1q_s8(yq.add(16)),
                            );
                            lanes = vmlaq_n_s32(lanes, t, i32::from(scales[s]));
                        }
                        vaddvq_s32(lanes)
                    };
                    // ggml: `sumf -= dmin * isum_mins` then `sumf += d * isum`, each one
                    // fused multiply-add; d and dmin are `d_y · d_x`.
                    *acc = (-(yb.d * dminx)).mul_add(mins as f32, *acc);
                    *acc = (yb.d * dx).mul_add(sumi as f32, *acc);
                }
            }
            for (c, acc) in acc.iter().enumerate().take(nc) {
                // SAFETY: out is writable at (c, r) by the caller.
                unsafe { *out.add((c0 + c) * ld + r) = *acc };
            }
        }
    }
}

/// [`crate::gemm::gemm`] for Q6_K, with `sdot`.
///
/// # Safety
/// As for [`crate::gemm::gemm`]; the CPU must have the dot-product instructions.
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn gemm_q6_k_sdot(rows: &Rows, out: *mut f32, ld: usize) {
    // SAFETY: by the caller.
    unsafe { gemm_q6_k::<Sdot>(rows, out, ld) }
}

/// [`crate::gemm::gemm`] for Q6_K, with L's instructions ([`super::Pairs`] runs everywhere).
///
/// # Safety
/// As for [`crate::gemm::gemm`]; the CPU must have L's instructions.
#[inline(always)]
pub(crate) unsafe fn gemm_q6_k<L: Lanes>(rows: &Rows, out: *mut f32, ld: usize) {
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) =
        unsafe { (blocks::<BlockQ6K>(rows.w, rows.range.end * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb)) };
    // SAFETY: NEON is part of aarch64.
    let mut q = [unsafe { vdupq_n_s8(0) }; 16];
    for r in rows.range.clone() {
        for c0 in (0..rows.n).step_by(TILE_COLS) {
            let nc = TILE_COLS.min(rows.n - c0);
            let mut acc = [0f32; TILE_COLS];
            for ib in 0..nb {
                // SAFETY: the block exists (by the caller).
                let x = unsafe { w.get_unchecked(r * nb + ib) };
                // SAFETY: NEON is part of aarch64; the block's bytes are read.
                unsafe { unpack_q6_k(x, &mut q) };
                let d = f16_to_f32(x.d);
                for (c, acc) in acc.iter_mut().enumerate().take(nc) {
                    // SAFETY: the activation block exists (by the caller).
                    let yb = unsafe { y.get_unchecked((c0 + c) * nb + ib) };
                    let mins: i32 = (0..16).map(|j| i32::from(yb.bsums[j]) * i32::from(x.scales[j])).sum();
                    // SAFETY: the caller's CPU has L's instructions; 256 bytes are read.
                    let sumi = unsafe {
                        let mut lanes = vdupq_n_s32(0);
                        for (s, (q, &scale)) in q.iter().zip(&x.scales).enumerate() {
                            let t = L::dot(vdupq_n_s32(0), *q, vld1q_s8(yb.qs.as_ptr().add(16 * s)));
                            lanes = vmlaq_n_s32(lanes, t, i32::from(scale));
                        }
                        vaddvq_s32(lanes)
                    };
                    // ggml: `sum += d_all * y.d * (isum - 32 * isum_mins)`, fused.
                    *acc = (d * yb.d).mul_add((sumi - 32 * mins) as f32, *acc);
                }
            }
            for (c, acc) in acc.iter().enumerate().take(nc) {
                // SAFETY: out is writable at (c, r) by the caller.
                unsafe { *out.add((c0 + c) * ld + r) = *acc };
            }
        }
    }
}

/// A Q6_K super-block's weights as unsigned 6-bit bytes, in 16 registers: register s holds
/// weights 16s..16s+16 (ggml's `q6bytes`, in the order its loop visits them), which multiply
/// activations 16s..16s+16 and take scale s.
///
/// # Safety
/// NEON (part of aarch64).
#[inline(always)]
unsafe fn unpack_q6_k(x: &BlockQ6K, q: &mut [int8x16_t; 16]) {
    // SAFETY: by the caller; the block's 192 bytes of weights are read.
    unsafe {
        let (m4, m3) = (vdupq_n_u8(0xF), vdupq_n_u8(3));
        let high = |bits: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(bits, m3));
        for j in 0..2 {
            let qh = [vld1q_u8(x.qh.as_ptr().add(32 * j)), vld1q_u8(x.qh.as_ptr().add(32 * j + 16))];
            let ql: [uint8x16_t; 4] = std::array::from_fn(|k| vld1q_u8(x.ql.as_ptr().add(64 * j + 16 * k)));
            let base = 8 * j;
            // Weights 128j..128j+64: low nibbles, fifth and sixth bits from qh bits 0–1
            // (registers 0 and 1 of qh) and 2–3.
            q[base] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql[0], m4), high(qh[0])));
            q[base + 1] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql[1], m4), high(qh[1])));
            q[base + 2] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql[2], m4), high(vshrq_n_u8::<2>(qh[0]))));
            q[base + 3] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(ql[3], m4), high(vshrq_n_u8::<2>(qh[1]))));
            // Weights 128j+64..128j+128: high nibbles, qh bits 4–5 and 6–7.
            q[base + 4] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(ql[0]), high(vshrq_n_u8::<4>(qh[0]))));
            q[base + 5] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(ql[1]), high(vshrq_n_u8::<4>(qh[1]))));
            q[base + 6] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(ql[2]), high(vshrq_n_u8::<6>(qh[0]))));
            q[base + 7] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(ql[3]), high(vshrq_n_u8::<6>(qh[1]))));
        }
    }
}
