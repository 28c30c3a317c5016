//! Q4_0, Q5_0 and Q8_0 weights × Q8_0 activations (ggml's `ggml_vec_dot_q{4,5,8}_0_q8_0`,
//! AVX2 branch, per element).
//!
//! ggml's one-row kernels compute, per block of 32, the int32 sums of 4 byte products per
//! lane, convert them to f32, and fuse-multiply-add them by `d_x·d_y` (a product of two f16
//! values, exact in f32) into 8 lanes, summed horizontally at the end. So do these, for tiles
//! of 1 weight row × up to 8 activation rows, unpacking each weight block once per tile.
//!
//! The lane sums are exact integers however they are formed. ggml forms them from signed
//! weights with `vpsignb`; for Q4_0 and Q5_0 these take the unsigned nibbles `u = value +
//! offset` straight into `vpmaddubsw` (or `vpdpbusd`) and subtract `offset·Σy` per lane,
//! computed once per activation block: one instruction less per block and activation row,
//! the same integers (activations lie in [-127, 127], so ggml's sign trick is exact too).
//!
//! With VNNI, whose `vpdpbusd` adds into a 32-bit lane without saturating, the roles turn
//! round and the correction moves out of the row loop: activations offset to unsigned
//! (`y + 128`, once per activation block), weights as their signed values, and each lane's
//! sum started from `-128·Σv` (once per weight block), so that `vpdpbusd` alone leaves
//! `Σ v·y` — the same integers again, with no subtraction (or, for Q8_0, `vpsignb`) for each
//! activation row.

use std::arch::x86_64::*;

use super::{Avx2, Avx512Vnni, AvxVnni, Dot, LANES, f16, f16_table, hsum, nibbles};
pub(crate) use crate::gemm::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};
use crate::gemm::{Isa, Rows, Work, balanced_tiles, blocks};

/// A block format of 32 weights with one f16 scale.
pub(crate) trait Block: Copy {
    /// What each unsigned weight byte is offset by, or 0 where the bytes are the signed
    /// values themselves (Q8_0).
    const OFFSET: i32;

    fn d(&self) -> u16;

    /// The weights as two registers: for an offset format the unsigned bytes and nothing;
    /// for signed bytes their magnitudes and the bytes (ggml's `vpsignb` pair).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn unpack(&self) -> [__m256i; 2];
}

impl Block for BlockQ4_0 {
    const OFFSET: i32 = 8;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn unpack(&self) -> [__m256i; 2] {
        // SAFETY: by the caller; 16 bytes of the block are read.
        unsafe { [nibbles(self.qs.as_ptr()), _mm256_setzero_si256()] }
    }
}

impl Block for BlockQ5_0 {
    const OFFSET: i32 = 16;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn unpack(&self) -> [__m256i; 2] {
        // SAFETY: by the caller; the block's bytes are read.
        unsafe {
            // Bit i of qh to byte i (ggml's `bytes_from_bits_32`), as 0x10 where set.
            let bits = _mm256_set1_epi32(i32::from_le_bytes(self.qh));
            let spread = _mm256_shuffle_epi8(
                bits,
                _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                _mm256_set1_epi64x(-1),
            );
            let high = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
            [_mm256_or_si256(nibbles(self.qs.as_ptr()), high), _mm256_setzero_si256()]
        }
    }
}

impl Block for BlockQ8_0 {
    const OFFSET: i32 = 0;

    fn d(&self) -> u16 {
        self.d
    }

    #[inline(always)]
    /// # Safety
    /// The CPU must have the instructions it uses (its callers are compiled for them).
    unsafe fn unpack(&self) -> [__m256i; 2] {
        // SAFETY: by the caller; 32 bytes of the block are read.
        unsafe {
            let x = _mm256_loadu_si256(self.qs.as_ptr().cast());
            [_mm256_sign_epi8(x, x), x]
        }
    }
}

/// A weight block as [`tile`] keeps it where `D` is [`Dot::EXACT`]: its values as signed
/// bytes, and each lane's `-128·Σv`, where the sums of activations offset by 128 start.
///
/// # Safety
/// The CPU must have AVX2 and D's instructions.
#[inline(always)]
unsafe fn signed<B: Block, D: Dot>(b: &B) -> [__m256i; 2] {
    // SAFETY: by the caller.
    unsafe {
        let x = b.unpack();
        let v = if B::OFFSET == 0 { x[1] } else { _mm256_sub_epi8(x[0], _mm256_set1_epi8(B::OFFSET as i8)) };
        let sum = D::dot(_mm256_set1_epi8(0x80u8 as i8), v);
        [v, _mm256_sub_epi32(_mm256_setzero_si256(), sum)]
    }
}

/// The exact int32 lane sums of a weight block (as [`Block::unpack`] gives it) times
/// activations `qy`, where `ysum` is `OFFSET·Σqy` per lane.
///
/// # Safety
/// The CPU must have AVX2 and D's instructions.
#[inline(always)]
unsafe fn lanes<B: Block, D: Dot>(x: [__m256i; 2], qy: __m256i, ysum: __m256i) -> __m256i {
    // SAFETY: by the caller.
    unsafe {
        if B::OFFSET == 0 {
            D::dot(x[0], _mm256_sign_epi8(qy, x[1]))
        } else {
            _mm256_sub_epi32(D::dot(x[0], qy), ysum)
        }
    }
}

/// `out[c * ld + r] = dot(weight row r, activation row c)`: [`super::gemm`] for a Q*_0 format.
///
/// # Safety
/// As for [`super::gemm`].
pub(crate) unsafe fn gemm<B: Block>(isa: Isa, rows: &Rows, out: *mut f32, ld: usize, work: &mut Work) {
    let nb = rows.k / 32;
    // SAFETY: by the caller, the operands hold these blocks, and the CPU has isa's
    // instructions.
    unsafe {
        let w = blocks::<B>(rows.w, rows.range.end * nb);
        let y = blocks::<BlockQ8_0>(rows.y, rows.n * nb);
        let range = rows.range.clone();
        match isa {
            Isa::Avx512 => gemm_avx512::<B>(w, y, nb, range, out, ld, work),
            Isa::AvxVnni => gemm_avx_vnni::<B>(w, y, nb, range, out, ld, work),
            Isa::Avx2 => gemm_avx2::<B>(w, y, nb, range, out, ld, work),
        }
    }
}

macro_rules! entry {
    ($name:ident, $features:literal, $dot:ty) => {
        #[target_feature(enable = $features)]
        /// # Safety
        /// The CPU must have the instructions this code is compiled for (`isa()` found them), and
        /// what it writes through must have room for every weight row and activation row asked for.
        unsafe fn $name<B: Block>(
            w: &[B],
            y: &[BlockQ8_0],
            nb: usize,
            rows: std::ops::Range<usize>,
            out: *mut f32,
            ld: usize,
            work: &mut Work,
        ) {
            // SAFETY: by the caller; this function has the instructions the body uses.
            unsafe { gemm_body::<B, $dot>(w, y, nb, rows, out, ld, work) }
        }
    };
}

entry!(gemm_avx512, "avx2,fma,f16c,avx512f,avx512vl,avx512vnni", Avx512Vnni);
entry!(gemm_avx_vnni, "avx2,fma,f16c,avxvnni", AvxVnni);
entry!(gemm_avx2, "avx2,fma,f16c", Avx2);

/// Blocks whose scales `d_x·d_y` a tile forms at once.
const CHUNK: usize = 32;

/// Activation rows per tile: one accumulator register each, and the weight block unpacked
/// once for all of them.
const TILE_COLS: usize = LANES;

#[inline(always)]
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn gemm_body<B: Block, D: Dot>(
    w: &[B],
    y: &[BlockQ8_0],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    work: &mut Work,
) {
    let ncols = y.len() / nb;
    // Reused across calls: this runs on every thread for every product of a pass.
    let tiles = &mut work.tiles;
    tiles.clear();
    tiles.extend(balanced_tiles(ncols, TILE_COLS));
    let ntiles = tiles.len();
    // Per tile and block, the tile's activation scales as f32 (lane c for row c0 + c),
    // converted once (ggml converts them in every dot product; the conversion is exact).
    let scales = &mut work.floats;
    scales.clear();
    scales.resize(ntiles * nb * LANES, 0.0);
    for (t, &(c0, nc)) in tiles.iter().enumerate() {
        for c in 0..nc {
            for ib in 0..nb {
                // SAFETY: the caller's CPU has F16C.
                scales[(t * nb + ib) * LANES + c] = unsafe { f16(y[(c0 + c) * nb + ib].d) };
            }
        }
    }
    // Per activation block, its bytes offset to unsigned (where D is exact), or OFFSET·Σqy in
    // each lane's 4 bytes.
    let sums = &mut work.ints;
    sums.clear();
    if D::EXACT {
        sums.resize(ncols * nb * LANES, 0);
        for (i, b) in y.iter().enumerate() {
            // SAFETY: the caller's CPU has AVX2; 32 bytes are read and 32 written.
            unsafe {
                let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
                let unsigned = _mm256_xor_si256(qy, _mm256_set1_epi8(0x80u8 as i8));
                _mm256_storeu_si256(sums.as_mut_ptr().add(i * LANES).cast(), unsigned);
            }
        }
    } else if B::OFFSET != 0 {
        sums.resize(ncols * nb * LANES, 0);
        for (i, b) in y.iter().enumerate() {
            // SAFETY: the caller's CPU has AVX2; 32 bytes are read and 8 ints written.
            unsafe {
                let qy = _mm256_loadu_si256(b.qs.as_ptr().cast());
                let sum = Avx2::dot(_mm256_set1_epi8(1), qy);
                let sum = _mm256_mullo_epi32(sum, _mm256_set1_epi32(B::OFFSET));
                _mm256_storeu_si256(sums.as_mut_ptr().add(i * LANES).cast(), sum);
            }
        }
    }
    let mut dxdy = [0f32; CHUNK * LANES];
    // SAFETY: the caller's CPU has AVX2.
    let mut unpacked = [[unsafe { _mm256_setzero_si256() }; 2]; CHUNK];
    for r in rows {
        for (t, &(c0, nc)) in tiles.iter().enumerate() {
            let scales = &scales[t * nb * LANES..(t + 1) * nb * LANES];
            // SAFETY: by the caller; the columns c0..c0 + nc exist.
            unsafe {
                match nc {
                    8 => tile::<B, D, 8>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    7 => tile::<B, D, 7>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    6 => tile::<B, D, 6>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    5 => tile::<B, D, 5>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    4 => tile::<B, D, 4>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    3 => tile::<B, D, 3>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    2 => tile::<B, D, 2>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                    _ => tile::<B, D, 1>(w, y, scales, sums, &mut dxdy, &mut unpacked, nb, c0, r, out, ld),
                }
            }
        }
    }
}

/// Weight row `r` times `N` activation rows from `c0`: one accumulator register per
/// activation row, each weight block unpacked once; the scales `d_x·d_y` are formed for the
/// tile in one product and broadcast from L1 (a load, not a shuffle).
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // c indexes y, lanes and acc
///
/// # Safety
/// The CPU must have the instructions this code is compiled for (`isa()` found them), and
/// what it writes through must have room for every weight row and activation row asked for.
unsafe fn tile<B: Block, D: Dot, const N: usize>(
    w: &[B],
    y: &[BlockQ8_0],
    scales: &[f32],
    sums: &[i32],
    dxdy: &mut [f32; CHUNK * LANES],
    unpacked: &mut [[__m256i; 2]; CHUNK],
    nb: usize,
    c0: usize,
    r: usize,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: the caller's CPU has the instructions used (AVX2, FMA, F16C and D's); every
    // index is in range by the caller's checks (w holds row r of nb blocks, y and sums the
    // tile's columns, scales LANES floats per block, out every (c, r) written).
    unsafe {
        let row = w.get_unchecked(r * nb..(r + 1) * nb);
        let f16s = f16_table();
        let mut acc = [_mm256_setzero_ps(); N];
        for (chunk, blocks) in row.chunks(CHUNK).enumerate() {
            // A chunk of blocks unpacked, and their scales d_x·d_y formed, before the loop
            // that uses them: that loop then only loads, whatever the tile's width (unpacking
            // inside it, LLVM scheduled some widths far worse than others), and reads the
            // scales long after they were written (a load right after a wider store to the
            // same place stalls on some CPUs). Products of two f16 values: exact in f32, as
            // ggml's.
            for (i, b) in blocks.iter().enumerate() {
                let yd = _mm256_loadu_ps(scales.as_ptr().add((chunk * CHUNK + i) * LANES));
                _mm256_storeu_ps(
                    dxdy.as_mut_ptr().add(i * LANES),
                    _mm256_mul_ps(_mm256_broadcast_ss(f16s.get_unchecked(usize::from(b.d()))), yd),
                );
                *unpacked.get_unchecked_mut(i) = if D::EXACT { signed::<B, D>(b) } else { b.unpack() };
            }
            for i in 0..blocks.len() {
                let ib = chunk * CHUNK + i;
                let x = *unpacked.get_unchecked(i);
                // Written out per width: LLVM kept `acc` in registers only where it unrolled this
                // loop, and left widths 2 to 7 as loops over an array in memory, whose store-to-load
                // latency then chained every block's multiply-add.
                unroll_cols!(c, N, {
                    let at = (c0 + c) * nb + ib;
                    let lanes = if D::EXACT {
                        let unsigned = _mm256_loadu_si256(sums.as_ptr().add(at * LANES).cast());
                        D::dot_acc(x[1], unsigned, x[0])
                    } else {
                        let qy = _mm256_loadu_si256(y.get_unchecked(at).qs.as_ptr().cast());
                        let ysum = if B::OFFSET == 0 {
                            _mm256_setzero_si256()
                        } else {
                            _mm256_loadu_si256(sums.as_ptr().add(at * LANES).cast())
                        };
                        lanes::<B, D>(x, qy, ysum)
                    };
                    let xy = _mm256_cvtepi32_ps(lanes);
                    acc[c] =
                        _mm256_fmadd_ps(_mm256_broadcast_ss(dxdy.get_unchecked(i * LANES + c)), xy, acc[c]);
                });
            }
        }
        for c in 0..N {
            *out.add((c0 + c) * ld + r) = hsum(acc[c]);
        }
    }
}
