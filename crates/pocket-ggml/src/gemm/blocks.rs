//! ggml's block layouts for the formats with kernels, as the bytes lie in a GGUF file and in
//! ggml's buffers (`block_q4_0` and the rest in `ggml-common.h`). Every architecture's kernels
//! read these; `tests::block_layouts_are_ggml_s` checks their sizes against ggml's.

/// `block_q4_0`: 32 weights as 4-bit `u` (low nibbles are weights 0–15, high nibbles
/// 16–31), meaning `d·(u − 8)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ4_0 {
    pub(crate) d: u16,
    pub(crate) qs: [u8; 16],
}

/// `block_q5_0`: 32 weights as 5-bit `u` (low nibbles in `qs` as in Q4_0, fifth bits in
/// `qh`, bit i for weight i), meaning `d·(u − 16)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ5_0 {
    pub(crate) d: u16,
    pub(crate) qh: [u8; 4],
    pub(crate) qs: [u8; 16],
}

/// `block_q8_0`: 32 weights (or activations) as `d·q`, `q` a signed byte.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ8_0 {
    pub(crate) d: u16,
    pub(crate) qs: [i8; 32],
}

/// `block_q4_1`: 32 weights as 4-bit values `q` meaning `d·q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockQ4_1 {
    pub(crate) d: u16,
    pub(crate) m: u16,
    pub(crate) qs: [u8; 16],
}

/// `block_q8_1`: 32 activations as `d·q`, with `s = d·Σq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockQ8_1 {
    pub(crate) d: u16,
    pub(crate) s: u16,
    pub(crate) qs: [i8; 32],
}

/// `block_q8_K`: 256 activations as `d·q`, with the sums of each 16.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ8K {
    pub(crate) d: f32,
    pub(crate) qs: [i8; 256],
    pub(crate) bsums: [i16; 16],
}

/// `block_q4_K`: 8 sub-blocks of 32 4-bit weights, each with a 6-bit scale and min.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ4K {
    pub(crate) d: u16,
    pub(crate) dmin: u16,
    pub(crate) scales: [u8; 12],
    pub(crate) qs: [u8; 128],
}

/// `block_q4_Kx8`: the super-blocks of 8 Q4_K rows as ggml's CPU repacking for AVX2 lays
/// them out (`make_block_q4_Kx8` in `ggml-cpu/repack.cpp`): the 8 `d`, the 8 `dmin`, per
/// sub-block `j` the 8 rows' scales and mins packed as one Q4_K super-block's (12 bytes),
/// and the rows' `qs` interleaved 8 bytes at a time (row 0's bytes 0–7, row 1's, …, row 7's,
/// then row 0's bytes 8–15, …).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ4Kx8 {
    pub(crate) d: [u16; 8],
    pub(crate) dmin: [u16; 8],
    pub(crate) scales: [u8; 96],
    pub(crate) qs: [u8; 1024],
}

/// `block_q6_K`: 16 sub-blocks of 16 6-bit weights (`q − 32`), each with an 8-bit scale.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ6K {
    pub(crate) ql: [u8; 128],
    pub(crate) qh: [u8; 64],
    pub(crate) scales: [i8; 16],
    pub(crate) d: u16,
}

/// A Q4_K super-block's 8 scales and 8 mins (6 bits each, packed into 12 bytes), unpacked
/// as ggml's kernels unpack them (`utmp` and its masks): bytes 0–7 the scales, 8–15 the
/// mins.
#[inline(always)]
pub(crate) fn q4_k_scales_and_mins(scales: &[u8; 12]) -> [u8; 16] {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    let word = |i: usize| {
        u32::from_le_bytes([scales[4 * i], scales[4 * i + 1], scales[4 * i + 2], scales[4 * i + 3]])
    };
    let mut utmp = [word(0), word(1), word(2), 0];
    utmp[3] = ((utmp[2] >> 4) & KMASK2) | (((utmp[1] >> 6) & KMASK3) << 4);
    let uaux = utmp[1] & KMASK1;
    utmp[1] = (utmp[2] & KMASK2) | (((utmp[0] >> 6) & KMASK3) << 4);
    utmp[2] = uaux;
    utmp[0] &= KMASK1;
    std::array::from_fn(|i| utmp[i / 4].to_le_bytes()[i % 4])
}

/// An f16 (as its bits) as f32: exact, as ggml's `GGML_CPU_FP16_TO_FP32` on every CPU.
/// Used where no conversion instruction is at hand.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match exp {
        0 if man == 0 => sign,
        // Subnormal: man · 2^-24, exact in f32.
        0 => {
            let magnitude = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -magnitude } else { magnitude };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}
