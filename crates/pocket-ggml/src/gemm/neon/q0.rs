//! Q4_0, Q5_0, Q8_0 × Q8_0 and Q4_1 × Q8_1 (ggml's `ggml_vec_dot_q{4,5,8}_0_q8_0` and
//! `ggml_vec_dot_q4_1_q8_1`, NEON branch, per element).
//!
//! ggml's one-row kernel takes the blocks two at a time: block 2j's lanes, converted to f32
//! and multiplied by `d_x·d_y`, are added to one accumulator, block 2j+1's to another; the
//! two are summed horizontally at the end (each as `(l0 + l1) + (l2 + l3)`), and an odd last
//! block is added in scalar code. Q4_1 also sums `m_x·s_y` of each pair in a scalar. These
//! kernels do the same for tiles of 1 weight row × up to 8 activation rows, unpacking each
//! weight block once per tile.

use std::arch::aarch64::*;

use super::{Lanes, Pairs, Sdot, SdotPermuted, permute};
use crate::gemm::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1, f16_to_f32};
use crate::gemm::{Isa, Rows, Work, balanced_tiles, blocks};

/// How ggml's scalar code adds an odd last block (GCC contracts each `+=` to a fused
/// multiply-add; the operand order is the C source's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// `sumf += sumi·d_x·d_y`: `fma(sumi·d_x, d_y, sumf)`.
    Q4_0,
    /// `sumf += (d_x·d_y)·sumi` (Q5_0) or `sumi·(d_x·d_y)` (Q8_0): `fma(d_x·d_y, sumi, sumf)`.
    Scaled,
    /// `sumf += (d_x·d_y)·sumi + m_x·s_y`: `sumf + fma(d_x·d_y, sumi, m_x·s_y)`.
    Q4_1,
}

/// An activation block: Q8_0, or Q8_1 (with `s = d·Σq`).
pub(crate) trait Act: Copy {
    fn d(&self) -> u16;
    fn s(&self) -> u16;
    fn qs(&self) -> &[i8; 32];
    fn qs_mut(&mut self) -> &mut [i8; 32];
}

impl Act for BlockQ8_0 {
    fn d(&self) -> u16 {
        self.d
    }
    fn s(&self) -> u16 {
        0
    }
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    fn qs_mut(&mut self) -> &mut [i8; 32] {
        &mut self.qs
    }
}

impl Act for BlockQ8_1 {
    fn d(&self) -> u16 {
        self.d
    }
    fn s(&self) -> u16 {
        self.s
    }
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    fn qs_mut(&mut self) -> &mut [i8; 32] {
        &mut self.qs
    }
}

/// A weight block of 32 with one f16 scale (and, for Q4_1, a min).
pub(crate) trait Block: Copy {
    /// The activation format ggml pairs it with.
    type Act: Act;
    const TAIL: Tail;

    fn d(&self) -> u16;

    /// The min (Q4_1), or 0.
    fn m(&self) -> u16 {
        0
    }

    /// The 32 weights as signed bytes (for Q4_1 the unsigned 4-bit values): weights 0–15,
    /// then 16–31.
    fn unpack(&self) -> [int8x16_t; 2];
}

impl Block for BlockQ4_0 {
    type Act = BlockQ8_0;
    const TAIL: Tail = Tail::Q4_0;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    fn unpack(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON is part of aarch64; 16 bytes of the block are read.
        unsafe {
            let v = vld1q_u8(self.qs.as_ptr());
            let eight = vdupq_n_s8(8);
            [
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xF))), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)), eight),
            ]
        }
    }
}

impl Block for BlockQ4_1 {
    type Act = BlockQ8_1;
    const TAIL: Tail = Tail::Q4_1;

    fn d(&self) -> u16 {
        self.d
    }

    fn m(&self) -> u16 {
        self.m
    }

    #[inline(always)]
    fn unpack(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON is part of aarch64; 16 bytes of the block are read.
        unsafe {
            let v = vld1q_u8(self.qs.as_ptr());
            [vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xF))), vreinterpretq_s8_u8(vshrq_n_u8::<4>(v))]
        }
    }
}

impl Block for BlockQ5_0 {
    type Act = BlockQ8_0;
    const TAIL: Tail = Tail::Scaled;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    fn unpack(&self) -> [int8x16_t; 2] {
        const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
        let qh = self.qh;
        // SAFETY: NEON is part of aarch64; the block's bytes and a constant are read.
        unsafe {
            let bits = vld1q_u8(BITS.as_ptr());
            // Bit i of qh is the fifth bit of weight i: 0x10 in byte i where it is set.
            let fifth = |lo: u8, hi: u8| {
                let set = vtstq_u8(vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi)), bits);
                vandq_u8(set, vdupq_n_u8(0x10))
            };
            let v = vld1q_u8(self.qs.as_ptr());
            let sixteen = vdupq_n_s8(16);
            let low = vorrq_u8(vandq_u8(v, vdupq_n_u8(0xF)), fifth(qh[0], qh[1]));
            let high = vorrq_u8(vshrq_n_u8::<4>(v), fifth(qh[2], qh[3]));
            [vsubq_s8(vreinterpretq_s8_u8(low), sixteen), vsubq_s8(vreinterpretq_s8_u8(high), sixteen)]
        }
    }
}

impl Block for BlockQ8_0 {
    type Act = BlockQ8_0;
    const TAIL: Tail = Tail::Scaled;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    fn unpack(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON is part of aarch64; 32 bytes of the block are read.
        unsafe { [vld1q_s8(self.qs.as_ptr()), vld1q_s8(self.qs.as_ptr().add(16))] }
    }
}

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`crate::gemm::gemm`] for a
/// format of 32-weight blocks.
///
/// # Safety
/// As for [`crate::gemm::gemm`].
pub(crate) unsafe fn gemm<B: Block>(isa: Isa, rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 32;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) = unsafe { (blocks::<B>(rows.w, rows.range.end * nb), blocks::<B::Act>(rows.y, rows.n * nb)) };
    let range = rows.range.clone();
    // SAFETY: by the caller, the CPU has `sdot` where `isa` says so.
    unsafe {
        match isa {
            Isa::NeonDot => gemm_sdot::<B>(w, y, nb, range, out, ld, work),
            Isa::NeonPermuted => {
                // The activations' bytes in `sdot`'s order for plain NEON's lanes: once per
                // call, where the weights are permuted once per tile.
                let mut copy = std::mem::take(&mut work.acts);
                let permuted = permuted_copy(y, &mut copy);
                gemm_sdot_permuted::<B>(w, permuted, nb, range, out, ld, work);
                work.acts = copy;
            }
            Isa::Neon => gemm_body::<B, Pairs>(w, y, nb, range, out, ld, work),
        }
    }
}

/// `y` with each block's bytes in [`super::PERMUTE`] order (per 16-byte half), in `buf`.
fn permuted_copy<'a, A: Act>(y: &[A], buf: &'a mut Vec<u64>) -> &'a [A] {
    let words = (size_of_val(y)).div_ceil(8);
    buf.clear();
    buf.resize(words, 0);
    // SAFETY: the buffer holds as many bytes as `y`, is aligned to 8 (more than any block
    // needs), and any bytes are valid blocks (plain integers).
    let copy = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<A>(), y.len()) };
    for (to, from) in copy.iter_mut().zip(y) {
        *to = *from;
        let qs = to.qs_mut();
        for half in qs.chunks_exact_mut(16) {
            // SAFETY: NEON is part of aarch64; 16 bytes are read and written.
            unsafe { vst1q_s8(half.as_mut_ptr(), permute(vld1q_s8(half.as_ptr()))) };
        }
    }
    copy
}

macro_rules! entry {
    ($name:ident, $lanes:ty) => {
        #[target_feature(enable = "dotprod")]
        /// # Safety
        /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
        /// what it writes through must have room for every weight row and activation row asked for.
        unsafe fn $name<B: Block>(
            w: &[B],
            y: &[B::Act],
            nb: usize,
            rows: std::ops::Range<usize>,
            out: *mut f32,
            ld: usize,
            work: &mut Work,
        ) {
            // SAFETY: by the caller; this function has the instructions the body uses.
            unsafe { gemm_body::<B, $lanes>(w, y, nb, rows, out, ld, work) }
        }
    };
}

entry!(gemm_sdot, Sdot);
entry!(gemm_sdot_permuted, SdotPermuted);

/// Activation rows per tile: two accumulator registers each.
const TILE_COLS: usize = 8;

#[inline(always)]
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_body<B: Block, L: Lanes>(
    w: &[B],
    y: &[B::Act],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    work: &mut Work,
) {
    let ncols = y.len() / nb;
    // Per activation block, d_y (and for Q8_1 s_y) as f32, converted once (exact).
    let scales = &mut work.floats;
    scales.clear();
    scales.extend(y.iter().map(|b| f16_to_f32(b.d())));
    scales.extend(y.iter().map(|b| f16_to_f32(b.s())));
    let (dy, sy) = scales.split_at(y.len());
    for r in rows {
        let row = &w[r * nb..(r + 1) * nb];
        for (c0, nc) in balanced_tiles(ncols, TILE_COLS) {
            let tile = Tile { row, y, dy, sy, nb, c0 };
            // SAFETY: by the caller; the columns c0..c0 + nc exist and out is writable there.
            unsafe {
                let at = out.add(c0 * ld + r);
                match nc {
                    8 => tile.run::<L, 8>(at, ld),
                    7 => tile.run::<L, 7>(at, ld),
                    6 => tile.run::<L, 6>(at, ld),
                    5 => tile.run::<L, 5>(at, ld),
                    4 => tile.run::<L, 4>(at, ld),
                    3 => tile.run::<L, 3>(at, ld),
                    2 => tile.run::<L, 2>(at, ld),
                    _ => tile.run::<L, 1>(at, ld),
                }
            }
        }
    }
}

/// One weight row and the activation rows from `c0`.
struct Tile<'a, B: Block> {
    row: &'a [B],
    y: &'a [B::Act],
    /// `d_y` and `s_y` of every activation block, as f32.
    dy: &'a [f32],
    sy: &'a [f32],
    nb: usize,
    c0: usize,
}

impl<B: Block> Tile<'_, B> {
    /// `out[c * ld] = dot(row, activation row c0 + c)` for `c` in `0..N`, in ggml's order.
    ///
    /// # Safety
    /// The CPU must have L's instructions; activation rows `c0..c0 + N` exist; `out` (the
    /// place of activation row c0) is writable at every `c * ld` for `c < N`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // c indexes the accumulators and the activations
    unsafe fn run<L: Lanes, const N: usize>(&self, out: *mut f32, ld: usize) {
        let (nb, c0) = (self.nb, self.c0);
        let unpack = |b: &B| {
            let x = b.unpack();
            if L::PERMUTED { [permute(x[0]), permute(x[1])] } else { x }
        };
        // SAFETY: by the caller: L's instructions; every index below is in range (the row
        // has nb blocks, the activations N rows of nb from c0).
        unsafe {
            let load = |at: usize| {
                let qs = self.y.get_unchecked(at).qs().as_ptr();
                [vld1q_s8(qs), vld1q_s8(qs.add(16))]
            };
            let mut acc0 = [vdupq_n_f32(0.0); N];
            let mut acc1 = [vdupq_n_f32(0.0); N];
            let mut summs = [0f32; N];
            let mut ib = 0;
            while ib + 1 < nb {
                let (b0, b1) = (self.row.get_unchecked(ib), self.row.get_unchecked(ib + 1));
                let (x0, x1) = (unpack(b0), unpack(b1));
                let (dx0, dx1) = (f16_to_f32(b0.d()), f16_to_f32(b1.d()));
                let (mx0, mx1) = (f16_to_f32(b0.m()), f16_to_f32(b1.m()));
                unroll_cols!(c, N, {
                    let at = (c0 + c) * nb + ib;
                    let (y0, y1) = (load(at), load(at + 1));
                    let p0 = vcvtq_f32_s32(L::dot2(x0[0], y0[0], x0[1], y0[1]));
                    let p1 = vcvtq_f32_s32(L::dot2(x1[0], y1[0], x1[1], y1[1]));
                    // ggml's `vmlaq_n_f32`: a product, then a sum (GCC does not fuse them).
                    acc0[c] = vaddq_f32(acc0[c], vmulq_n_f32(p0, dx0 * *self.dy.get_unchecked(at)));
                    acc1[c] = vaddq_f32(acc1[c], vmulq_n_f32(p1, dx1 * *self.dy.get_unchecked(at + 1)));
                    if B::TAIL == Tail::Q4_1 {
                        let s = self.sy.get_unchecked(at..at + 2);
                        summs[c] += mx0.mul_add(s[0], mx1 * s[1]);
                    }
                });
                ib += 2;
            }
            for c in 0..N {
                let mut sumf = vaddvq_f32(acc0[c]) + vaddvq_f32(acc1[c]);
                if B::TAIL == Tail::Q4_1 {
                    sumf += summs[c];
                }
                if ib < nb {
                    // The odd last block, as ggml's scalar loop: an exact integer sum.
                    let b = self.row.get_unchecked(ib);
                    let x = unpack(b);
                    let at = (c0 + c) * nb + ib;
                    let yq = load(at);
                    let sumi = vaddvq_s32(L::dot2(x[0], yq[0], x[1], yq[1])) as f32;
                    let (dx, dy) = (f16_to_f32(b.d()), *self.dy.get_unchecked(at));
                    sumf = match B::TAIL {
                        Tail::Q4_0 => (sumi * dx).mul_add(dy, sumf),
                        Tail::Scaled => (dx * dy).mul_add(sumi, sumf),
                        Tail::Q4_1 => {
                            sumf + (dx * dy).mul_add(sumi, f16_to_f32(b.m()) * self.sy.get_unchecked(at))
                        }
                    };
                }
                *out.add(c * ld) = sumf;
            }
        }
    }
}
