//! Q4_1 × Q8_1 (ggml's `ggml_vec_dot_q4_1_q8_1`, AVX2, per element).
//!
//! Three kernels, chosen at run time from the CPU's features:
//! - `Avx512`: two activation rows per 512-bit register (the weight block broadcast to both
//!   halves), tiles of 2 weight rows × up to 8 activation rows, `vpdpbusd`.
//! - `AvxVnni` and `Avx2`: 256-bit registers, tiles of 2 weight rows × up to 4 activation
//!   rows, with `vpdpbusd` (VEX) or `vpmaddubsw` + `vpmaddwd`.
//!
//! All give the same exact int32 lane sums (4-bit × 8-bit pairs cannot saturate 16 bits),
//! so the choice changes speed, not bits.

use std::arch::x86_64::*;

use super::{Avx2, AvxVnni, Dot, f16, f16_table, hsum};
use crate::gemm::blocks::{BlockQ4_1, BlockQ8_1};
use crate::gemm::{Isa, Rows, Work, balanced_tiles, blocks};

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`super::gemm`] for Q4_1.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm(isa: Isa, rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 32;
    // SAFETY: by the caller, the operands hold these blocks.
    unsafe {
        let w = blocks::<BlockQ4_1>(rows.w, rows.range.end * nb);
        let y = blocks::<BlockQ8_1>(rows.y, rows.n * nb);
        gemm_blocks(isa, w, y, nb, rows.range.clone(), out, ld, &mut work.floats);
    }
}

/// `out[c * ld + r] = dot(w row r, y row c)` for `r` in `rows` and every activation row `c`
/// of `y` (`y.len() / nb` of them), where each weight row is `nb` blocks of `w`. `scratch`
/// is working memory.
///
/// # Safety
/// The CPU must have the kernel's instructions ([`super::isa`] chose it); `w` holds
/// `rows.end * nb` blocks, `y` a multiple of `nb`, and `out` is valid for writes at every
/// `(c, r)` and not read or written by anyone else there meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_blocks(
    kernel: Isa,
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scratch: &mut Vec<f32>,
) {
    assert!(w.len() >= rows.end * nb && y.len().is_multiple_of(nb) && rows.end <= ld);
    // SAFETY: by the caller.
    unsafe {
        match kernel {
            Isa::Avx512 => gemm_avx512(w, y, nb, rows, out, ld, scratch),
            Isa::AvxVnni => gemm_avx_vnni(w, y, nb, rows, out, ld, scratch),
            Isa::Avx2 => gemm_avx2(w, y, nb, rows, out, ld, scratch),
        }
    }
}

/// A `#[target_feature]` entry point running [`gemm_body`] with one [`Dot`].
macro_rules! entry {
    ($name:ident, $features:literal, $dot:ty) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        /// # Safety
        /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
        /// what it writes through must have room for every weight row and activation row asked for.
        unsafe fn $name(
            w: &[BlockQ4_1],
            y: &[BlockQ8_1],
            nb: usize,
            rows: std::ops::Range<usize>,
            out: *mut f32,
            ld: usize,
            scratch: &mut Vec<f32>,
        ) {
            // SAFETY: by the caller; this function has the instructions the body uses.
            unsafe { gemm_body::<$dot>(w, y, nb, rows, out, ld, scratch) }
        }
    };
}

entry!(gemm_avx_vnni, "avx2,fma,f16c,avxvnni", AvxVnni);
entry!(gemm_avx2, "avx2,fma,f16c", Avx2);

/// The 32 4-bit weights of a block as bytes, low nibbles first (ggml's `bytes_from_nibbles_32`).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn unpack_q4(x: &BlockQ4_1) -> __m256i {
    // SAFETY: by the caller; 16 bytes of the block are read.
    unsafe {
        // The 16 bytes in both halves (one broadcast load), the upper half shifted down by a
        // nibble: the same bytes as ggml's shift and insert, one instruction fewer.
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(x.qs.as_ptr().cast()));
        let bytes = _mm256_srlv_epi32(both, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
        _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
    }
}

/// Lanes of the per-tile scale vectors: one per activation row of a tile, padded to a
/// 256-bit register.
const COLS: usize = 8;

/// Activation rows per tile: one accumulator register per (weight row, activation row).
const TILE_COLS: usize = 4;

#[inline(always)]
#[allow(clippy::too_many_arguments)]
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_body<D: Dot>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scales: &mut Vec<f32>,
) {
    let ncols = y.len() / nb;
    // The activation scales of a tile as f32, converted once (ggml converts them in every
    // dot product; the conversion is exact, so once is the same): per block, the tile's
    // `d` then its `s`, COLS lanes each (unused lanes zero).
    scales.clear();
    scales.resize(nb * 2 * COLS, 0.0);
    for (c0, nc) in balanced_tiles(ncols, TILE_COLS) {
        scales.fill(0.0);
        for c in 0..nc {
            for ib in 0..nb {
                let b = &y[(c0 + c) * nb + ib];
                // SAFETY: the caller's CPU has F16C.
                unsafe {
                    scales[ib * 2 * COLS + c] = f16(b.d);
                    scales[ib * 2 * COLS + COLS + c] = f16(b.s);
                }
            }
        }
        let f16s = f16_table();
        // SAFETY: by the caller; the columns c0..c0 + nc exist.
        unsafe {
            match nc {
                4 => tile::<D, 4>(w, y, scales, f16s, nb, c0, rows.clone(), out, ld),
                3 => tile::<D, 3>(w, y, scales, f16s, nb, c0, rows.clone(), out, ld),
                2 => tile::<D, 2>(w, y, scales, f16s, nb, c0, rows.clone(), out, ld),
                _ => tile::<D, 1>(w, y, scales, f16s, nb, c0, rows.clone(), out, ld),
            }
        }
    }
}

/// [`gemm_body`] for the `N` activation rows from `c0`, 2 weight rows at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn tile<D: Dot, const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    f16s: &[f32],
    nb: usize,
    c0: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let mut r = rows.start;
    while r + 2 <= rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<D, 2, N>(w, y, scales, f16s, nb, c0, r, out, ld) };
        r += 2;
    }
    if r < rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<D, 1, N>(w, y, scales, f16s, nb, c0, r, out, ld) };
    }
}

/// `RM` weight rows from `r0` times `N` activation rows from `c0`: one accumulator register
/// per pair, each activation block loaded once per tile; the tile's scales and `m·s` sums
/// travel as 8-lane vectors (lane c for c0 + c).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // c indexes y, lanes and acc
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn tile_rows<D: Dot, const RM: usize, const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    f16s: &[f32],
    nb: usize,
    c0: usize,
    r0: usize,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: the caller's CPU has the instructions used (AVX2, FMA, F16C and D's); every
    // index is in range by the caller's checks (w holds r0 + RM rows of nb blocks, y the
    // tile's columns, scales 2·COLS floats per block, f16s all 65536 f16 values, out every
    // (c, r) written).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); N]; RM];
        let mut summs = [_mm256_setzero_ps(); RM];
        for ib in 0..nb {
            let p = scales.as_ptr().add(ib * 2 * COLS);
            let (yd, ys) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(COLS)));
            let mut qx = [_mm256_setzero_si256(); RM];
            let mut d0d1 = [_mm256_setzero_ps(); RM];
            for rr in 0..RM {
                let x = w.get_unchecked((r0 + rr) * nb + ib);
                let m = _mm256_broadcast_ss(f16s.get_unchecked(usize::from(x.m)));
                let d = _mm256_broadcast_ss(f16s.get_unchecked(usize::from(x.d)));
                // m·s of two f16 values is exact in f32, so this sum per lane is ggml's
                // scalar `summs` whether or not either side fuses the multiply-add.
                summs[rr] = _mm256_fmadd_ps(m, ys, summs[rr]);
                d0d1[rr] = _mm256_mul_ps(d, yd);
                qx[rr] = unpack_q4(x);
            }
            for c in 0..N {
                let qy = _mm256_loadu_si256(y.get_unchecked((c0 + c) * nb + ib).qs.as_ptr().cast());
                let lane = _mm256_set1_epi32(c as i32);
                for rr in 0..RM {
                    let xy = _mm256_cvtepi32_ps(D::dot(qx[rr], qy));
                    let scale = _mm256_permutevar8x32_ps(d0d1[rr], lane);
                    acc[rr][c] = _mm256_fmadd_ps(scale, xy, acc[rr][c]);
                }
            }
        }
        for rr in 0..RM {
            let mut sums = [0f32; COLS];
            _mm256_storeu_ps(sums.as_mut_ptr(), summs[rr]);
            for (c, &x) in acc[rr].iter().enumerate() {
                *out.add((c0 + c) * ld + r0 + rr) = hsum(x) + sums[c];
            }
        }
    }
}

/// Activation rows per tile of the 512-bit kernel: two per register.
const TILE_COLS_512: usize = 8;

/// Floats of scales per block in the 512-bit kernel: per pair of activation rows, 8 copies
/// of each row's `d`; then the tile's `s` in 16 lanes.
const STRIDE_512: usize = TILE_COLS_512 * 8 + 16;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_avx512(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scales: &mut Vec<f32>,
) {
    let ncols = y.len() / nb;
    scales.clear();
    scales.resize(nb * STRIDE_512, 0.0);
    for (c0, nc) in balanced_tiles(ncols, TILE_COLS_512) {
        scales.fill(0.0);
        for c in 0..nc {
            for ib in 0..nb {
                let b = &y[(c0 + c) * nb + ib];
                let at = ib * STRIDE_512;
                // SAFETY: this function has F16C.
                let (d, s) = unsafe { (f16(b.d), f16(b.s)) };
                scales[at + c * 8..at + c * 8 + 8].fill(d);
                scales[at + TILE_COLS_512 * 8 + c] = s;
            }
        }
        // SAFETY: by the caller; the columns c0..c0 + nc exist.
        unsafe {
            match nc.div_ceil(2) {
                4 => tile_512::<4>(w, y, scales, nb, c0, nc, rows.clone(), out, ld),
                3 => tile_512::<3>(w, y, scales, nb, c0, nc, rows.clone(), out, ld),
                2 => tile_512::<2>(w, y, scales, nb, c0, nc, rows.clone(), out, ld),
                _ => tile_512::<1>(w, y, scales, nb, c0, nc, rows.clone(), out, ld),
            }
        }
    }
}

/// [`gemm_avx512`] for the `nc` (≤ 2·`NP`) activation rows from `c0`, 2 weight rows at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn tile_512<const NP: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    nc: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let mut r = rows.start;
    while r + 2 <= rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows_512::<2, NP>(w, y, scales, nb, c0, nc, r, out, ld) };
        r += 2;
    }
    if r < rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows_512::<1, NP>(w, y, scales, nb, c0, nc, r, out, ld) };
    }
}

/// `RM` weight rows from `r0` times the `nc` activation rows from `c0`, two per 512-bit
/// register (`NP` registers; an odd last row is paired with a copy of itself, not stored).
/// Each half of a register does what [`tile_rows`] does for one activation row: the weight
/// block is broadcast to both halves, and the scale `d_x·d_y` is the same f32 product.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn tile_rows_512<const RM: usize, const NP: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    nc: usize,
    r0: usize,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: the caller's CPU has AVX-512 F, VL and VNNI, AVX2, FMA and F16C; every index
    // is in range by the caller's checks (w holds r0 + RM rows of nb blocks, y the columns
    // c0..c0 + nc, scales STRIDE_512 floats per block, out every (c, r) written).
    unsafe {
        let col = |c: usize| c0 + c.min(nc - 1);
        let mut acc = [[_mm512_setzero_ps(); NP]; RM];
        let mut summs = [_mm512_setzero_ps(); RM];
        for ib in 0..nb {
            let p = scales.as_ptr().add(ib * STRIDE_512);
            let ys = _mm512_loadu_ps(p.add(TILE_COLS_512 * 8));
            let mut qy = [_mm512_setzero_si512(); NP];
            for (q, qy) in qy.iter_mut().enumerate() {
                let a = _mm256_loadu_si256(y.get_unchecked(col(2 * q) * nb + ib).qs.as_ptr().cast());
                let b = _mm256_loadu_si256(y.get_unchecked(col(2 * q + 1) * nb + ib).qs.as_ptr().cast());
                *qy = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
            }
            for rr in 0..RM {
                let x = w.get_unchecked((r0 + rr) * nb + ib);
                // As in `tile_rows`: m·s is exact, so this is ggml's scalar `summs`.
                summs[rr] = _mm512_add_ps(summs[rr], _mm512_mul_ps(_mm512_set1_ps(f16(x.m)), ys));
                let dx = _mm512_set1_ps(f16(x.d));
                let qx = _mm512_broadcast_i64x4(unpack_q4(x));
                for q in 0..NP {
                    let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx, qy[q]));
                    let scale = _mm512_mul_ps(dx, _mm512_loadu_ps(p.add(q * 16)));
                    acc[rr][q] = _mm512_fmadd_ps(scale, xy, acc[rr][q]);
                }
            }
        }
        for rr in 0..RM {
            let mut sums = [0f32; 16];
            _mm512_storeu_ps(sums.as_mut_ptr(), summs[rr]);
            for (q, &pair) in acc[rr].iter().enumerate() {
                let halves = [
                    _mm512_castps512_ps256(pair),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(pair))),
                ];
                for (h, x) in halves.into_iter().enumerate() {
                    let c = 2 * q + h;
                    if c >= nc {
                        break;
                    }
                    *out.add((c0 + c) * ld + r0 + rr) = hsum(x) + sums[c];
                }
            }
        }
    }
}
