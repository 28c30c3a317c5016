//! Q4_K and Q6_K weights × Q8_K activations (ggml's `ggml_vec_dot_q4_K_q8_K` and
//! `ggml_vec_dot_q6_K_q8_K`, AVX2 branch, per element).
//!
//! Per super-block of 256 weights ggml forms exact int32 lane sums: lane `l` holds, for
//! every sub-block, its scale times the products of its bytes `4l..4l+3` (`vpmaddubsw` of
//! the unsigned weights by the activations, `vpmaddwd` by the scales, integer adds). It
//! converts them to f32 once and fuse-multiply-adds them by `d_y·d_x` into 8 lanes; Q4_K also
//! accumulates its mins term (`d_y·dmin_x` times the 4 lane sums of mins × activation sums)
//! in 4 more. These kernels form the same integers, and then the same fused multiply-adds in
//! the same order, for a tile of activation rows at once.
//!
//! On AVX2 the two multiplies per 32 weights and row bound the one-row kernel (this CPU
//! issues one a cycle). Here two sub-blocks go through one `vpmaddwd`: their bytes are
//! interleaved in 16-bit pairs (weights when a super-block is unpacked, activations once per
//! call), so that two `vpmaddubsw` and a 16-bit add leave sub-block `j`'s 4-byte lane sum in
//! the even 16-bit lane and `j+1`'s in the odd one, and `vpmaddwd` by their scales
//! (alternating) gives lane `l` both scaled sums: three multiplies per 64 weights instead of
//! four. The 16-bit sums are exact: four products of weights below 64 and activations of
//! magnitude at most 128 stay below 2^15. ggml's AVX2 branch is also what AVX-512 builds run
//! for these formats, so one kernel serves all x86 CPUs here.

use std::arch::x86_64::*;

use super::{f16, hsum};
use crate::gemm::blocks::{BlockQ4K, BlockQ6K, BlockQ8K, q4_k_scales_and_mins};
use crate::gemm::{Isa, Rows, Work, balanced_tiles, blocks};

/// Activation rows per tile: each has an int32 lane-sum register while a super-block is
/// multiplied (8 of them, a pair of sub-blocks, its scales and temporaries fill AVX2's 16
/// registers).
const TILE_COLS: usize = 8;

/// Weight rows that take a tile's activations in turn, super-block by super-block: each
/// activation super-block is read from L1 by all of them (a tile's activations outgrow L1 in
/// the wider matrices, and one weight row at a time streamed them from L2 again for every
/// row). Every tile of a pass goes through a group of rows before the next group, so a
/// prompt's pass reads the weights from memory once.
const ROWS: usize = 4;

/// Bytes of a tile's activation blocks that leave most of L1 to the weights.
const L1_ACTIVATIONS: usize = 16 * 1024;

/// Sub-blocks `j` and `j + 1` (32 bytes each) interleaved in 16-bit pairs: the first
/// register has, in 32-bit lane `l`, bytes `4l, 4l+1` of `j` then of `j + 1`; the second
/// bytes `4l+2, 4l+3` of each.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn interleave(j: __m256i, j1: __m256i) -> [__m256i; 2] {
    // SAFETY: by the caller.
    unsafe {
        [
            _mm256_blend_epi16::<0xAA>(j, _mm256_slli_epi32::<16>(j1)),
            _mm256_blend_epi16::<0xAA>(_mm256_srli_epi32::<16>(j), j1),
        ]
    }
}

/// The activations of `y` with each pair of sub-blocks [`interleave`]d, 256 bytes a block,
/// into `acts` (as 8-byte words, for alignment).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn interleave_activations(y: &[BlockQ8K], acts: &mut Vec<u64>) {
    acts.clear();
    acts.resize(y.len() * 256 / 8, 0);
    for (b, dst) in y.iter().zip(acts.chunks_exact_mut(256 / 8)) {
        for p in 0..4 {
            // SAFETY: by the caller; 64 bytes of the block are read and written.
            unsafe {
                let src = b.qs.as_ptr().add(64 * p);
                let pair = interleave(_mm256_loadu_si256(src.cast()), _mm256_loadu_si256(src.add(32).cast()));
                let dst = dst.as_mut_ptr().cast::<u8>().add(64 * p);
                _mm256_storeu_si256(dst.cast(), pair[0]);
                _mm256_storeu_si256(dst.add(32).cast(), pair[1]);
            }
        }
    }
}

/// The exact int32 lane sums of one interleaved pair of weight sub-blocks by the same pair of
/// activations (at `a`, 64 bytes), each sub-block scaled by its lanes of `scales`.
///
/// # Safety
/// The CPU must have AVX2; `a` points at 64 readable bytes.
#[inline(always)]
unsafe fn pair_sums(w: &[__m256i; 2], scales: __m256i, a: *const u8) -> __m256i {
    // SAFETY: by the caller.
    unsafe {
        let p0 = _mm256_maddubs_epi16(w[0], _mm256_loadu_si256(a.cast()));
        let p1 = _mm256_maddubs_epi16(w[1], _mm256_loadu_si256(a.add(32).cast()));
        _mm256_madd_epi16(_mm256_add_epi16(p0, p1), scales)
    }
}

/// The exact int32 lane sums of an unpacked weight super-block (its [`interleave`]d pairs of
/// sub-blocks and their scales) by super-block `ib` of each of the `N` activation rows of
/// `t` (rows of `nb` blocks). Pair by pair, the weights and scales stay in registers while
/// every row takes them in.
///
/// # Safety
/// The CPU must have AVX2; `t` holds `N` rows of `nb` blocks.
#[inline(always)]
unsafe fn lane_sums<const N: usize>(
    pairs: &[[__m256i; 2]; 4],
    scales: &[__m256i; 4],
    t: &Tile,
    nb: usize,
    ib: usize,
) -> [__m256i; N] {
    // SAFETY: by the caller.
    unsafe {
        let mut sumi = [_mm256_setzero_si256(); N];
        for p in 0..4 {
            unroll_cols!(c, N, {
                let a = t.acts.add((c * nb + ib) * 256 + 64 * p);
                sumi[c] = _mm256_add_epi32(sumi[c], pair_sums(&pairs[p], scales[p], a));
            });
        }
        sumi
    }
}

/// A Q4_K super-block unpacked for its tiles.
struct Q4K {
    /// The 4 pairs of sub-blocks as bytes, [`interleave`]d.
    pairs: [[__m256i; 2]; 4],
    /// Each pair's two scales, alternating in the 16 int16 lanes.
    scales: [__m256i; 4],
    /// The 8 mins as int16.
    mins: __m128i,
    d: f32,
    dmin: f32,
}

/// A super-block format with a kernel here.
pub(crate) trait SuperBlock: Sized {
    /// Whether the tile needs each activation super-block's sums of each 32.
    const SUMS: bool;

    /// Weight rows `w` (`nb` blocks each, at most [`ROWS`]) times the `N` activation rows of
    /// `t`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C; `t` holds `N` rows of `nb` blocks (and their
    /// sums where [`SuperBlock::SUMS`]), and `t.out` is writable at `c * t.ld + r` for every
    /// `c < N` and weight row `r`.
    unsafe fn tile<const N: usize>(w: &[Self], nb: usize, t: &Tile);
}

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`super::gemm`] for a K-quant.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm<B: SuperBlock>(isa: Isa, rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller, the CPU has isa's instructions.
    unsafe {
        match isa {
            Isa::Avx512 => gemm_avx512::<B>(rows, out, ld, work),
            Isa::AvxVnni | Isa::Avx2 => gemm_avx2::<B>(rows, out, ld, work),
        }
    }
}

/// AVX2's instructions with AVX-512's 32 registers (a tile's accumulators and a super-block's
/// weights then stay in registers).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_avx512<B: SuperBlock>(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller; this function has the instructions the body uses.
    unsafe { gemm_body::<B>(rows, out, ld, work) }
}

#[target_feature(enable = "avx2,fma,f16c")]
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_avx2<B: SuperBlock>(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller; this function has the instructions the body uses.
    unsafe { gemm_body::<B>(rows, out, ld, work) }
}

/// The kernel, for the instructions of the function it is inlined into.
///
/// # Safety
/// As for [`gemm`], with AVX2, FMA and F16C.
#[inline(always)]
unsafe fn gemm_body<B: SuperBlock>(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) =
        unsafe { (blocks::<B>(rows.w, rows.range.end * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb)) };
    // Per activation super-block, the sums of each 32 (ggml's `_mm_hadd_epi16` of bsums).
    let sums = &mut work.ints;
    sums.clear();
    if B::SUMS {
        sums.resize(y.len() * 4, 0);
        for (i, b) in y.iter().enumerate() {
            // SAFETY: this function has AVX2; 32 bytes are read and 16 written.
            unsafe {
                let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
                let q8s = _mm_hadd_epi16(
                    _mm256_extracti128_si256::<0>(q8sums),
                    _mm256_extracti128_si256::<1>(q8sums),
                );
                _mm_storeu_si128(sums.as_mut_ptr().add(i * 4).cast(), q8s);
            }
        }
    }
    // SAFETY: this function has AVX2.
    unsafe { interleave_activations(y, &mut work.acts) };
    let acts = work.acts.as_ptr().cast::<u8>();
    let tiles = &mut work.tiles;
    tiles.clear();
    tiles.extend(balanced_tiles(rows.n, TILE_COLS));
    // Where a tile's activations fit in L1 with room to spare, one weight row at a time: the
    // weights then stream in order, which the prefetchers follow (a matrix read from DRAM,
    // such as an LM head, came about half as fast in groups of rows).
    let group = if nb * size_of::<BlockQ8K>() * TILE_COLS <= L1_ACTIVATIONS { 1 } else { ROWS };
    for r in rows.range.clone().step_by(group) {
        let w = &w[r * nb..rows.range.end.min(r + group) * nb];
        for &(c0, nc) in tiles.iter() {
            // SAFETY: this function has AVX2, FMA and F16C; the columns c0..c0 + nc exist (in
            // y, sums and acts) and out is writable at (c, r..) by the caller.
            unsafe {
                let t = Tile {
                    y: &y[c0 * nb..],
                    acts: acts.add(c0 * nb * 256),
                    sums: sums.get(c0 * nb * 4..).unwrap_or_default(),
                    out: out.add(c0 * ld + r),
                    ld,
                };
                match nc {
                    8 => B::tile::<8>(w, nb, &t),
                    7 => B::tile::<7>(w, nb, &t),
                    6 => B::tile::<6>(w, nb, &t),
                    5 => B::tile::<5>(w, nb, &t),
                    4 => B::tile::<4>(w, nb, &t),
                    3 => B::tile::<3>(w, nb, &t),
                    2 => B::tile::<2>(w, nb, &t),
                    _ => B::tile::<1>(w, nb, &t),
                }
            }
        }
    }
}

/// Asks for the block `ROWS` weight rows after `b` (rows of `nb` blocks) to be brought
/// into the caches. A tile reads its weight rows a block of each in turn, and the CPU's
/// prefetchers do not follow that order: without this, weights streamed from DRAM came
/// several times slower than row by row.
///
/// # Safety
/// The CPU must have SSE (every x86-64 does).
#[inline(always)]
unsafe fn prefetch_next_rows<B>(b: &B, nb: usize) {
    let next = (b as *const B).cast::<u8>().wrapping_add(ROWS * nb * size_of::<B>());
    for line in (0..size_of::<B>()).step_by(64) {
        // SAFETY: by the caller; a prefetch never faults, wherever it points.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line).cast()) };
    }
}

/// A tile's activation rows (from the first): the blocks, the same blocks' bytes
/// [`interleave`]d, their sums of each 32 where the format takes them, and where row `c`'s
/// results go (`out + c * ld`).
pub(crate) struct Tile<'a> {
    y: &'a [BlockQ8K],
    acts: *const u8,
    sums: &'a [i32],
    out: *mut f32,
    ld: usize,
}

impl SuperBlock for BlockQ4K {
    const SUMS: bool = true;

    /// Per super-block, the [`lane_sums`] of every row; then per row the same float
    /// operations as ggml's (mins term, then `d·sumi`), in the same order.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // c indexes y, sums and the accumulators
    ///
    /// # Safety
    /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
    /// what it writes through must have room for every weight row and activation row asked for.
    unsafe fn tile<const N: usize>(w: &[Self], nb: usize, t: &Tile) {
        let nr = w.len() / nb;
        // SAFETY: by the caller (instructions, and every index in range).
        unsafe {
            let mut accs = [[_mm256_setzero_ps(); N]; ROWS];
            let mut accs_m = [[_mm_setzero_ps(); N]; ROWS];
            for (ib, r) in (0..nb).flat_map(|ib| (0..nr).map(move |r| (ib, r))) {
                let (acc, acc_m) = (&mut accs[r], &mut accs_m[r]);
                let b = w.get_unchecked(r * nb + ib);
                prefetch_next_rows(b, nb);
                let x = unpack_q4_k(b);
                let sumi = lane_sums::<N>(&x.pairs, &x.scales, t, nb, ib);
                unroll_cols!(c, N, {
                    let at = c * nb + ib;
                    let yd = t.y.get_unchecked(at).d;
                    let (d, dmin) = (yd * x.d, -yd * x.dmin);
                    let q8s = _mm_loadu_si128(t.sums.as_ptr().add(at * 4).cast());
                    let prod = _mm_madd_epi16(x.mins, q8s);
                    acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m[c]);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                });
            }
            for (r, c) in (0..nr).flat_map(|r| (0..N).map(move |c| (r, c))) {
                // ggml's order: the 4 mins lanes as (0 + 2) + (1 + 3), added after the 8-lane sum.
                let mut m = accs_m[r][c];
                m = _mm_add_ps(m, _mm_movehl_ps(m, m));
                m = _mm_add_ss(m, _mm_movehdup_ps(m));
                *t.out.add(c * t.ld + r) = hsum(accs[r][c]) + _mm_cvtss_f32(m);
            }
        }
    }
}

/// ggml's scale and min unpacking of a Q4_K super-block, and its weights as bytes, in
/// [`interleave`]d pairs of sub-blocks (the low and high nibbles of each 32 bytes).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn unpack_q4_k(x: &BlockQ4K) -> Q4K {
    // Bytes 0..8 are the scales, 8..16 the mins.
    let bytes = q4_k_scales_and_mins(&x.scales);
    let s = |j: usize| i32::from(bytes[j]);
    // SAFETY: by the caller; 128 bytes of the block are read.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let pairs = std::array::from_fn(|p| {
            let bits = _mm256_loadu_si256(x.qs.as_ptr().add(32 * p).cast());
            interleave(_mm256_and_si256(bits, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4))
        });
        Q4K {
            pairs,
            scales: std::array::from_fn(|p| _mm256_set1_epi32(s(2 * p) | s(2 * p + 1) << 16)),
            mins: _mm256_extracti128_si256::<1>(_mm256_cvtepu8_epi16(_mm_loadu_si128(bytes.as_ptr().cast()))),
            d: f16(x.d),
            dmin: f16(x.dmin),
        }
    }
}

/// A Q6_K super-block unpacked for its tiles.
struct Q6K {
    /// The 4 pairs of 32-weight groups as unsigned 6-bit bytes, [`interleave`]d.
    pairs: [[__m256i; 2]; 4],
    /// Each pair's scales (one per 16 weights) in its int16 lanes.
    scales: [__m256i; 4],
    /// The 16 scales as int16, for the `−32` offset.
    scales_16: __m256i,
    d: f32,
}

impl SuperBlock for BlockQ6K {
    const SUMS: bool = false;

    /// As for Q4_K; per super-block and row, ggml's `−32` term and `d·sumi`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // c indexes y and the accumulators
    ///
    /// # Safety
    /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
    /// what it writes through must have room for every weight row and activation row asked for.
    unsafe fn tile<const N: usize>(w: &[Self], nb: usize, t: &Tile) {
        let nr = w.len() / nb;
        // SAFETY: by the caller (instructions, and every index in range).
        unsafe {
            let mut accs = [[_mm256_setzero_ps(); N]; ROWS];
            for (ib, r) in (0..nb).flat_map(|ib| (0..nr).map(move |r| (ib, r))) {
                let acc = &mut accs[r];
                let b = w.get_unchecked(r * nb + ib);
                prefetch_next_rows(b, nb);
                let x = unpack_q6_k(b);
                let sumi = lane_sums::<N>(&x.pairs, &x.scales, t, nb, ib);
                unroll_cols!(c, N, {
                    let yb = t.y.get_unchecked(c * nb + ib);
                    let d = yb.d * x.d;
                    // The `− 32` of every weight, as ggml subtracts it: 32·Σ scale·bsum.
                    let q8sums = _mm256_loadu_si256(yb.bsums.as_ptr().cast());
                    let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, x.scales_16));
                    let s = _mm256_sub_epi32(sumi[c], q8sclsub);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[c]);
                });
            }
            for (r, c) in (0..nr).flat_map(|r| (0..N).map(move |c| (r, c))) {
                *t.out.add(c * t.ld + r) = hsum(accs[r][c]);
            }
        }
    }
}

/// A Q6_K super-block's weights as bytes, as ggml's AVX2 kernel forms them (groups `q4_0` to
/// `q4_3` of each 128), in [`interleave`]d pairs, and its scales.
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
        // Group g's bytes 0..16 have scale 2g, bytes 16..32 scale 2g + 1; lanes 0..4 of a
        // pair's sums hold the first 16 bytes of each group: pair p's int16 lanes alternate
        // scales 4p and 4p + 2 in its first 8, 4p + 1 and 4p + 3 in its last 8.
        let scales = _mm_loadu_si128(x.scales.as_ptr().cast());
        let spread = |p: i8| {
            let (a, b, c, d) = (4 * p, 4 * p + 2, 4 * p + 1, 4 * p + 3);
            _mm_setr_epi8(a, b, a, b, a, b, a, b, c, d, c, d, c, d, c, d)
        };
        Q6K {
            pairs: std::array::from_fn(|p| interleave(q[2 * p], q[2 * p + 1])),
            scales: [0, 1, 2, 3].map(|p| _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, spread(p)))),
            scales_16: _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast())),
            d: f16(x.d),
        }
    }
}
