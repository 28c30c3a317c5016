//! Q4_K weights in ggml's repacked layout for AVX2 (`block_q4_Kx8`: the super-blocks of 8
//! weight rows interleaved 8 bytes at a time) × Q8_K activations, each element bitwise what
//! ggml's one-token kernel for that layout (`ggml_gemv_q4_K_8x8_q8_K`, AVX2 branch) computes.
//!
//! That kernel's lane is a weight row, not a position. Per super-block and row it forms two
//! exact integers, `isum = Σ_j scale_j·Σ q4·q8` over the 8 sub-blocks and `imin = Σ_j
//! min_j·Σ q8`, and then two fused multiply-adds, `acc = float(isum)·(d·d_y) + acc` and
//! `accm = float(imin)·(dmin·d_y) + accm`; the result is `acc − accm`. Integers come out
//! the same in any order, so this kernel is free in how it forms them, and it forms them on
//! the layout as it lies: a register of 32 weight bytes holds 8 bytes of each of 4 rows, so
//! one 8-byte broadcast of the activations serves both halves of the group, and the weights
//! are nibbles masked and shifted as a tile reads them (the gemv also shuffles 8-byte halves
//! into 4-byte lanes, for every token). Each row's two half-sums meet in one horizontal add per
//! super-block, which leaves the rows in [`ORDER`]; `d` is loaded in that order and the
//! results go back to row order at the end. The float chain per (row, token) is the gemv's,
//! operation for operation.
//!
//! The integer work per row, super-block and token is 8 `vpmaddubsw` and 2 `vpmaddwd` on
//! AVX2, or 8 `vpdpbusd` and 2 `vpmaddwd` with VNNI ([`Sums`]); AVX-512's 32 registers let a
//! tile hold more tokens.

use std::arch::x86_64::*;

use crate::gemm::blocks::{BlockQ4Kx8, BlockQ8K, q4_k_scales_and_mins};
use crate::gemm::{Isa, Rows, Work, balanced_tiles, blocks};

/// The rows in the lanes of the integer sums and the float accumulators: a horizontal add of
/// rows 0–3's and rows 4–7's half-sums leaves them so.
const ORDER: [i32; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// How a kernel forms the integer sums of a sub-block: the products of 4-bit weights and
/// activations summed in lanes (one lane per row and 4-byte half of an 8-byte column), then
/// multiplied by the rows' scales with `vpmaddwd`.
trait Sums {
    /// Tokens whose sums are formed together: each weight register is loaded once for all of
    /// them (per token, lane sums and int32 sums for both halves of the group, besides two
    /// weight registers and a broadcast, fill the registers).
    const TILE: usize;

    /// `acc` plus the products of unsigned weight bytes `w` by signed activation bytes `a`,
    /// summed in lanes.
    ///
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn mul_add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;

    /// The `vpmaddwd` operand that multiplies the lane sums of 4 rows (rows 0–3 in `h` = 0, 4–7
    /// in 1) by their scales, from the 8 rows' scales as bytes.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn scales(bytes: __m128i, h: usize) -> __m256i;
}

/// AVX2: `vpmaddubsw` into 16-bit lanes (two per lane of 4 bytes), then `vpmaddwd` by the
/// scale in both. Each 16-bit lane sums 4 pairs of products of a weight below 16 by an
/// activation of magnitude at most 128 per sub-block: below 2^15, exact.
struct Avx2;

impl Sums for Avx2 {
    const TILE: usize = 3;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn mul_add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX2).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, a)) }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn scales(bytes: __m128i, h: usize) -> __m256i {
        let o = 4 * h as i8;
        // SAFETY: by the caller (AVX2).
        unsafe {
            let spread = _mm_setr_epi8(
                o,
                o,
                o,
                o,
                o + 1,
                o + 1,
                o + 1,
                o + 1,
                o + 2,
                o + 2,
                o + 2,
                o + 2,
                o + 3,
                o + 3,
                o + 3,
                o + 3,
            );
            _mm256_cvtepu8_epi16(_mm_shuffle_epi8(bytes, spread))
        }
    }
}

/// VNNI (`vpdpbusd`) into 32-bit lanes. A sub-block's lane sums 16 products below 2^15 in
/// magnitude, so its upper 16 bits are its sign, and `vpmaddwd` by the scale in the lower
/// 16 bits and 0 in the upper gives the scaled sum.
trait Vnni {
    /// As [`Sums::TILE`].
    const TILE: usize;

    /// `vpdpbusd`.
    ///
    /// # Safety
    /// The CPU must have the instruction's extension.
    unsafe fn dpbusd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
}

impl<V: Vnni> Sums for V {
    const TILE: usize = V::TILE;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn mul_add(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: by the caller.
        unsafe { V::dpbusd(acc, w, a) }
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn scales(bytes: __m128i, h: usize) -> __m256i {
        let o = 4 * h as i8;
        // SAFETY: by the caller (AVX2).
        unsafe {
            let spread =
                _mm_setr_epi8(o, o, o + 1, o + 1, o + 2, o + 2, o + 3, o + 3, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm256_cvtepu8_epi32(_mm_shuffle_epi8(bytes, spread))
        }
    }
}

/// AVX-512 VNNI on 256-bit registers: 32 of them.
struct Avx512;

impl Vnni for Avx512 {
    const TILE: usize = 6;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dpbusd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-512 VNNI and VL).
        unsafe { _mm256_dpbusd_epi32(acc, w, a) }
    }
}

/// AVX-VNNI: 16 registers.
struct AvxVnni;

impl Vnni for AvxVnni {
    const TILE: usize = 3;

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn dpbusd(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }
}

/// Tokens that go through a group's weights together. A block of them keeps its activations
/// in L2 (64 tokens × 35 super-blocks × 292 bytes for the widest matrices of a 1.5B model)
/// while every row group of this thread takes them in; a prompt's pass reads the weights
/// once per block.
const TOKENS: usize = 64;

/// A group's super-block unpacked for its tiles.
struct Unpacked {
    /// The block's nibbles as ggml lays them: sub-blocks `2p` and `2p + 1` (low and high
    /// nibbles) in bytes `256p..256p + 256`, 8-byte column `q` of rows 0–3 at `64q`, of rows
    /// 4–7 32 bytes later.
    qs: *const u8,
    /// Per sub-block, for rows 0–3 and for rows 4–7: the rows' scales as [`Sums::scales`]
    /// lays them out.
    scales: [[__m256i; 2]; 8],
    /// Per pair of sub-blocks `2p, 2p + 1`: each row's two mins in its lane (rows in order).
    mins: [__m256i; 4],
    /// The rows' `d`, in [`ORDER`], as f32.
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
pub(crate) unsafe fn gemm(isa: Isa, rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    // SAFETY: by the caller, the CPU has isa's instructions.
    unsafe {
        match isa {
            Isa::Avx512 => gemm_avx512(rows, out, ld, work),
            Isa::AvxVnni => gemm_avx_vnni(rows, out, ld, work),
            Isa::Avx2 => gemm_avx2(rows, out, ld, work),
        }
    }
}

macro_rules! entry {
    ($name:ident, $features:literal, $sums:ty) => {
        #[target_feature(enable = $features)]
        /// # Safety
        /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
        /// what it writes through must have room for every weight row and activation row asked for.
        unsafe fn $name(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
            // SAFETY: by the caller; this function has the instructions the body uses.
            unsafe { gemm_body::<$sums>(rows, out, ld, work) }
        }
    };
}

entry!(gemm_avx512, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", Avx512);
entry!(gemm_avx_vnni, "avx2,fma,f16c,avxvnni", AvxVnni);
entry!(gemm_avx2, "avx2,fma,f16c", Avx2);

/// The kernel, with `K`'s sums.
///
/// # Safety
/// As for [`gemm`], with the instructions `K` uses.
#[inline(always)]
unsafe fn gemm_body<K: Sums>(rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
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
        work.tiles.extend(balanced_tiles(nt, K::TILE).map(|(c0, nc)| (t0 + c0, nc)));
        for g in rows.range.start / 8..rows.range.end / 8 {
            accs.clear();
            accs.resize(nt * 16, 0.0);
            for ib in 0..nb {
                // SAFETY: this function has AVX2 and F16C; block (g, ib) exists.
                let u = unsafe { unpack::<K>(w.get_unchecked(g * nb + ib)) };
                for &(c0, nc) in &work.tiles {
                    let t = Tokens { y, sums, nb, ib, c0 };
                    let accs = &mut accs[(c0 - t0) * 16..];
                    // SAFETY: this function has AVX2 and FMA; tokens c0..c0 + nc exist (in y
                    // and sums, and from the block's first in accs).
                    unsafe {
                        match nc {
                            8 => tile::<K, 8>(&u, &t, accs),
                            7 => tile::<K, 7>(&u, &t, accs),
                            6 => tile::<K, 6>(&u, &t, accs),
                            5 => tile::<K, 5>(&u, &t, accs),
                            4 => tile::<K, 4>(&u, &t, accs),
                            3 => tile::<K, 3>(&u, &t, accs),
                            2 => tile::<K, 2>(&u, &t, accs),
                            _ => tile::<K, 1>(&u, &t, accs),
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
                    // ORDER is its own inverse.
                    let back = _mm256_loadu_si256(ORDER.as_ptr().cast());
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
/// from token `t.c0`'s; `acc` in [`ORDER`], `accm` in row order).
///
/// # Safety
/// The CPU must have AVX2 and FMA; tokens `t.c0..t.c0 + N` exist in `t.y` and `t.sums`, and
/// `accs` holds `16 * N` floats; the CPU has the instructions `K` uses.
#[inline(always)]
unsafe fn tile<K: Sums, const N: usize>(u: &Unpacked, t: &Tokens, accs: &mut [f32]) {
    // SAFETY: by the caller (instructions, and every index in range).
    unsafe {
        let blocks: [&BlockQ8K; N] = std::array::from_fn(|c| t.y.get_unchecked((t.c0 + c) * t.nb + t.ib));
        // Per half of the group (rows 0–3, rows 4–7) and token: lane (row, byte half) sums.
        let mut halves = [[_mm256_setzero_si256(); N]; 2];
        for j in 0..8 {
            let mut lanes = [[_mm256_setzero_si256(); N]; 2];
            for q in 0..4 {
                let m4 = _mm256_set1_epi8(0xF);
                let raw0 = _mm256_loadu_si256(u.qs.add(256 * (j / 2) + 64 * q).cast());
                let raw1 = _mm256_loadu_si256(u.qs.add(256 * (j / 2) + 64 * q + 32).cast());
                let (w0, w1) = if j % 2 == 0 {
                    (_mm256_and_si256(raw0, m4), _mm256_and_si256(raw1, m4))
                } else {
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw0), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(raw1), m4),
                    )
                };
                unroll_cols!(c, N, {
                    let a = blocks[c].qs.as_ptr().add(32 * j + 8 * q).cast::<i64>().read_unaligned();
                    let a = _mm256_set1_epi64x(a);
                    lanes[0][c] = K::mul_add(lanes[0][c], w0, a);
                    lanes[1][c] = K::mul_add(lanes[1][c], w1, a);
                });
            }
            unroll_cols!(c, N, {
                halves[0][c] = _mm256_add_epi32(halves[0][c], _mm256_madd_epi16(lanes[0][c], u.scales[j][0]));
                halves[1][c] = _mm256_add_epi32(halves[1][c], _mm256_madd_epi16(lanes[1][c], u.scales[j][1]));
            });
        }
        unroll_cols!(c, N, {
            // Lanes (row, byte half) of rows 0–3 and of rows 4–7 added pairwise: rows in ORDER.
            let isum = _mm256_hadd_epi32(halves[0][c], halves[1][c]);
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
            let sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(u.d, dy), _mm256_loadu_ps(acc));
            let min =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(u.dmin, dy), _mm256_loadu_ps(accm));
            _mm256_storeu_ps(acc, sum);
            _mm256_storeu_ps(accm, min);
        });
    }
}

/// A `block_q4_Kx8` unpacked: its scales and mins widened, its `d` and `dmin` as f32 (its
/// nibbles are read where they lie).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[inline(always)]
unsafe fn unpack<K: Sums>(x: &BlockQ4Kx8) -> Unpacked {
    // SAFETY: by the caller; the block's bytes are read.
    unsafe {
        // Per sub-block, the 8 rows' scales then their 8 mins, as bytes (the 12 bytes of group j,
        // packed as a Q4_K super-block's own).
        let bytes: [__m128i; 8] = std::array::from_fn(|j| {
            let unpacked = q4_k_scales_and_mins(x.scales[12 * j..12 * j + 12].try_into().expect("12 bytes"));
            _mm_loadu_si128(unpacked.as_ptr().cast())
        });
        let scales = std::array::from_fn(|j| [K::scales(bytes[j], 0), K::scales(bytes[j], 1)]);
        // Row r's mins of sub-blocks 2p and 2p + 1 in 16-bit lanes 2r and 2r + 1.
        let mins = std::array::from_fn(|p| {
            let (lo, hi) =
                (_mm_shuffle_epi32::<0x4E>(bytes[2 * p]), _mm_shuffle_epi32::<0x4E>(bytes[2 * p + 1]));
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi))
        });
        let d = _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast()));
        Unpacked {
            qs: x.qs.as_ptr(),
            scales,
            mins,
            d: _mm256_permutevar8x32_ps(d, _mm256_loadu_si256(ORDER.as_ptr().cast())),
            dmin: _mm256_cvtph_ps(_mm_loadu_si128(x.dmin.as_ptr().cast())),
        }
    }
}
