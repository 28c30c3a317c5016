//! Q4_K weights in ggml's repacked layout for AVX2 (`block_q4_Kx8`: the super-blocks of 8
//! weight rows interleaved 8 bytes at a time) × Q8_K activations, each element bitwise what
//! ggml's one-token kernel for that layout (`ggml_gemv_q4_K_8x8_q8_K`, AVX2 branch) computes.
//!
//! That kernel's lane is a weight row, not a position. Per super-block and row it forms two
//! exact integers, `isum = Σ_j scale_j·Σ q4·q8` over the 8 sub-blocks and `imin = Σ_j
//! min_j·Σ q8`, and then two fused multiply-adds, `acc = float(isum)·(d·d_y) + acc` and
//! `accm = float(imin)·(dmin·d_y) + accm`; the result is `acc − accm`. Integers come out
//! the same in any order, so this kernel is free in how it forms them: it unpacks a group's
//! super-block once (nibbles to bytes, arranged as the gemv arranges them) and runs every
//! token of the pass through it, a tile of tokens at a time sharing each weight register.
//! The float chain per (row, token) is the gemv's, operation for operation.
//!
//! The integer work is 8 `vpmaddubsw` per row, super-block and token, and 1.5 `vpmaddwd`:
//! fewer multiplies than the one-row kernel's layout allows (`k_quants`), and no horizontal
//! sums.

use std::arch::x86_64::*;

use crate::gemm::blocks::{BlockQ4Kx8, BlockQ8K, q4_k_scales_and_mins};
use crate::gemm::{Rows, Work, balanced_tiles, blocks};

/// The gemv's lane order: lane `l` of its integer sums holds row `PERMUTED[l]`.
const PERMUTED: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Tokens whose int sums are formed together: each weight register is loaded once for all
/// of them (two int16 and one int32 accumulator each, with the weights, a broadcast and a
/// scale, fill AVX2's 16 registers at 4).
const TILE: usize = 4;

/// Tokens that go through a group's weights together. A block of them keeps its activations
/// in L2 (64 tokens × 35 super-blocks × 292 bytes for the widest matrices of a 1.5B model)
/// while every row group of this thread takes them in; a prompt's pass reads the weights
/// once per block.
const TOKENS: usize = 64;

/// A group's super-block unpacked for its tokens.
struct Unpacked {
    /// Per sub-block `j` and 4-byte column `o`: the 8 rows' bytes `4o..4o+4` of sub-block
    /// `j`, one row per 32-bit lane in [`PERMUTED`] order.
    w: [[__m256i; 8]; 8],
    /// Per sub-block: each row's scale in both int16 halves of its lane ([`PERMUTED`]).
    scales: [__m256i; 8],
    /// Per pair of sub-blocks `2p, 2p + 1`: each row's two mins in its lane (rows in order).
    mins: [__m256i; 4],
    /// The rows' `d`, in [`PERMUTED`] order, as f32.
    d: __m256,
    /// The rows' `dmin`, in order, as f32.
    dmin: __m256,
}

/// `out[c * ld + r] = dot(weight row r, activation row c)` for the rows of `rows.range` (a
/// range of whole groups of 8) of a repacked Q4_K matrix.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `rows.w` holds `rows.range.end / 8` groups of
/// `rows.k / 256` `block_q4_Kx8`, `rows.y` `rows.n` rows of as many `block_q8_K`; `out` is
/// writable at every `(c, r)` and `rows.range.end <= ld`.
pub(crate) unsafe fn gemm(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller.
    unsafe { gemm_avx2(rows, out, ld, work) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm_avx2(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    assert!(rows.range.start.is_multiple_of(8) && rows.range.end.is_multiple_of(8));
    let nb = rows.k / 256;
    // SAFETY: by the caller, the operands hold these blocks.
    let (w, y) = unsafe {
        (blocks::<BlockQ4Kx8>(rows.w, rows.range.end / 8 * nb), blocks::<BlockQ8K>(rows.y, rows.n * nb))
    };
    // Per activation super-block, the sums of each 32 as 8 int16 (the gemv's `hadd` of bsums).
    let sums = &mut work.ints;
    sums.clear();
    sums.resize(y.len() * 4, 0);
    for (i, b) in y.iter().enumerate() {
        // SAFETY: this function has AVX2; 32 bytes are read and 16 written.
        unsafe {
            let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256::<1>(q8sums));
            _mm_storeu_si128(sums.as_mut_ptr().add(i * 4).cast(), q8s);
        }
    }
    // Per token of a block: `acc`, then `accm`, 8 lanes each.
    let accs = &mut work.floats;
    for t0 in (0..rows.n).step_by(TOKENS) {
        let nt = TOKENS.min(rows.n - t0);
        work.tiles.clear();
        work.tiles.extend(balanced_tiles(nt, TILE).map(|(c0, nc)| (t0 + c0, nc)));
        for g in rows.range.start / 8..rows.range.end / 8 {
            accs.clear();
            accs.resize(nt * 16, 0.0);
            for ib in 0..nb {
                // SAFETY: this function has AVX2 and F16C; block (g, ib) exists.
                let u = unsafe { unpack(w.get_unchecked(g * nb + ib)) };
                for &(c0, nc) in &work.tiles {
                    let t = Tokens { y, sums, nb, ib, c0 };
                    let accs = &mut accs[(c0 - t0) * 16..];
                    // SAFETY: this function has AVX2 and FMA; tokens c0..c0 + nc exist (in y
                    // and sums, and from the block's first in accs).
                    unsafe {
                        match nc {
                            4 => tile::<4>(&u, &t, accs),
                            3 => tile::<3>(&u, &t, accs),
                            2 => tile::<2>(&u, &t, accs),
                            _ => tile::<1>(&u, &t, accs),
                        }
                    }
                }
            }
            // The gemv's end: its lanes back in row order, minus the mins term.
            for c in t0..t0 + nt {
                // SAFETY: this function has AVX2; token c's 16 floats exist; out is writable
                // at (c, 8g..8g + 8) by the caller.
                unsafe {
                    let acc = _mm256_loadu_ps(accs.as_ptr().add((c - t0) * 16));
                    let accm = _mm256_loadu_ps(accs.as_ptr().add((c - t0) * 16 + 8));
                    let back = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
                    let acc = _mm256_permutevar8x32_ps(acc, back);
                    _mm256_storeu_ps(out.add(c * ld + 8 * g), _mm256_sub_ps(acc, accm));
                }
            }
        }
    }
}

/// The activations a tile reads: super-block `ib` of tokens `c0..`, rows of `nb` blocks.
struct Tokens<'a> {
    y: &'a [BlockQ8K],
    sums: &'a [i32],
    nb: usize,
    ib: usize,
    c0: usize,
}

/// Super-block `t.ib` of `N` tokens from `t.c0` through an unpacked super-block: the gemv's
/// integer sums, then its two fused multiply-adds per token into `accs` (16 floats a token,
/// from token `t.c0`'s).
///
/// # Safety
/// The CPU must have AVX2 and FMA; tokens `t.c0..t.c0 + N` exist in `t.y` and `t.sums`, and
/// `accs` holds `16 * N` floats.
#[inline(always)]
unsafe fn tile<const N: usize>(u: &Unpacked, t: &Tokens, accs: &mut [f32]) {
    // SAFETY: by the caller (instructions, and every index in range).
    unsafe {
        let blocks: [&BlockQ8K; N] = std::array::from_fn(|c| t.y.get_unchecked((t.c0 + c) * t.nb + t.ib));
        let mut isum = [_mm256_setzero_si256(); N];
        for j in 0..8 {
            // Each int16 lane sums 8 pairs of products of a weight below 16 by an activation of
            // magnitude at most 128: below 2^15, exact, as in the gemv.
            let mut sum16 = [_mm256_setzero_si256(); N];
            for o in 0..8 {
                let w = u.w[j][o];
                unroll_cols!(c, N, {
                    let a = blocks[c].qs.as_ptr().add(32 * j + 4 * o).cast::<i32>().read_unaligned();
                    sum16[c] = _mm256_add_epi16(sum16[c], _mm256_maddubs_epi16(w, _mm256_set1_epi32(a)));
                });
            }
            unroll_cols!(c, N, {
                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(sum16[c], u.scales[j]));
            });
        }
        unroll_cols!(c, N, {
            let at = (t.c0 + c) * t.nb + t.ib;
            let q8s = t.sums.as_ptr().add(at * 4);
            let mut imin = _mm256_setzero_si256();
            for p in 0..4 {
                let pair = _mm256_set1_epi32(q8s.add(p).read_unaligned());
                imin = _mm256_add_epi32(imin, _mm256_madd_epi16(pair, u.mins[p]));
            }
            let dy = _mm256_set1_ps(blocks[c].d);
            let acc = accs.as_mut_ptr().add(c * 16);
            let accm = acc.add(8);
            let sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(u.d, dy), _mm256_loadu_ps(acc));
            let min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(u.dmin, dy), _mm256_loadu_ps(accm));
            _mm256_storeu_ps(acc, sum);
            _mm256_storeu_ps(accm, min);
        });
    }
}

/// A `block_q4_Kx8` unpacked: its nibbles as bytes in the gemv's operand order, its scales
/// and mins widened, its `d` and `dmin` as f32.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn unpack(x: &BlockQ4Kx8) -> Unpacked {
    // Sub-block j's scales and mins, 8 rows each (the 12 bytes of group j, packed as a Q4_K
    // super-block's own).
    let unpacked: [[u8; 16]; 8] =
        std::array::from_fn(|j| q4_k_scales_and_mins(x.scales[12 * j..12 * j + 12].try_into().expect("12 bytes")));
    // SAFETY: by the caller; the block's bytes are read.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let mut w = [[_mm256_setzero_si256(); 8]; 8];
        for p in 0..4 {
            // Rows 0–3 then 4–7, 8 bytes each, for bytes 32p + 8q.. of every row, q = 0..4.
            let raw: [__m256i; 8] =
                std::array::from_fn(|i| _mm256_loadu_si256(x.qs.as_ptr().add(256 * p + 32 * i).cast()));
            for half in 0..2 {
                let v: [__m256i; 8] = std::array::from_fn(|i| {
                    if half == 0 {
                        _mm256_and_si256(raw[i], m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw[i]), m4)
                    }
                });
                let j = 2 * p + half;
                for q in 0..4 {
                    let (lo, hi) = (v[2 * q], v[2 * q + 1]);
                    w[j][2 * q] = _mm256_blend_epi32::<0xAA>(lo, _mm256_shuffle_epi32::<0xB1>(hi));
                    w[j][2 * q + 1] = _mm256_blend_epi32::<0xAA>(_mm256_shuffle_epi32::<0xB1>(lo), hi);
                }
            }
        }
        let scales = std::array::from_fn(|j| {
            let s: [i16; 16] = std::array::from_fn(|l| i16::from(unpacked[j][PERMUTED[l / 2]]));
            _mm256_loadu_si256(s.as_ptr().cast())
        });
        let mins = std::array::from_fn(|p| {
            let m: [i16; 16] = std::array::from_fn(|l| i16::from(unpacked[2 * p + l % 2][8 + l / 2]));
            _mm256_loadu_si256(m.as_ptr().cast())
        });
        let d = _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast()));
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        Unpacked {
            w,
            scales,
            mins,
            d: _mm256_permutevar8x32_ps(d, perm),
            dmin: _mm256_cvtph_ps(_mm_loadu_si128(x.dmin.as_ptr().cast())),
        }
    }
}
