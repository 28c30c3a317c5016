//! Converting quantized weights to another format while they are loaded.
//!
//! The format a file ships in decides how steep the CPU's cost curve is: ggml multiplies
//! Q8_0 matrices by several rows at once with llamafile's tiled kernels, whose
//! arithmetic per output element does not depend on the number of rows, while Q4_1 and the
//! K-quants go through the one-row dot product for every row. Verifying 8 draft tokens costs
//! about 2.7 decode steps in Q8_0 and 4.8 in Q4_1 on this project's 2-core CPU
//! (docs/benchmarks.md), so speculation pays far more often on the converted weights.
//! Widening 4- to 6-bit blocks to Q8_0 changes each weight by little more than half a Q8_0
//! step (the step is 1/127 of its block's largest magnitude); the bench reports how often
//! that changes a greedy output (`vanilla@q8_0` against `vanilla`).

use std::fmt;
use std::str::FromStr;

use llama_cpp_sys_2 as sys;

use crate::ffi::types;

/// The format weight matrices are held in after loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// As the file stores them.
    #[default]
    AsStored,
    /// Quantized matrices of at most 8 bits per weight widened to Q8_0 (blocks of 32 int8
    /// weights with one f16 scale). Matrices already in Q8_0, f16 or f32 stay as they are.
    Q8_0,
}

impl WeightFormat {
    /// Every format, by name.
    pub const NAMES: [&'static str; 2] = ["stored", "q8_0"];

    /// The name used on command lines and in results.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::AsStored => "stored",
            WeightFormat::Q8_0 => "q8_0",
        }
    }

    /// The type a matrix of type `ty` with rows of `ne0` weights is held in.
    pub(crate) fn target(self, ty: sys::ggml_type, ne0: i64) -> sys::ggml_type {
        match self {
            WeightFormat::AsStored => ty,
            WeightFormat::Q8_0 => {
                let t = types::info(ty);
                let bits = t.type_size as f64 * 8.0 / t.block as f64;
                let widens = t.is_quantized && ty != sys::GGML_TYPE_Q8_0 && bits <= 8.5;
                if widens && t.has_to_float && ne0 % 32 == 0 { sys::GGML_TYPE_Q8_0 } else { ty }
            }
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for WeightFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "stored" | "as-stored" => Ok(WeightFormat::AsStored),
            "q8_0" | "q8" => Ok(WeightFormat::Q8_0),
            _ => Err(format!("unknown weight format {s:?}; known: {}", WeightFormat::NAMES.join(", "))),
        }
    }
}

/// Rows converted per chunk: bounds the f32 scratch to `CHUNK_ROWS × ne0` floats (a few
/// hundred KiB for these models) however large the matrix.
const CHUNK_ROWS: usize = 64;

/// Convert the matrix `src` (`ne1` rows of `ne0` weights of type `from`) to `to`, handing each
/// converted chunk to `sink(byte_offset, bytes)` in order.
///
/// `to` must be a type [`WeightFormat::target`] returned for `from`, so `from` has a
/// dequantizer and `ne0` is a whole number of `to`'s blocks.
pub(crate) fn convert_matrix(
    from: sys::ggml_type,
    to: sys::ggml_type,
    src: &[u8],
    ne0: usize,
    ne1: usize,
    sink: &mut dyn FnMut(usize, &[u8]),
) {
    let (src_row, dst_row) = (types::bytes_of(from, ne0), types::bytes_of(to, ne0));
    assert_eq!(src.len(), src_row * ne1, "matrix bytes do not match its shape");
    let mut floats = vec![0f32; CHUNK_ROWS * ne0];
    let mut out = vec![0u8; CHUNK_ROWS * dst_row];
    let mut row = 0;
    while row < ne1 {
        let rows = CHUNK_ROWS.min(ne1 - row);
        let chunk = &src[row * src_row..(row + rows) * src_row];
        types::to_float(from, chunk, &mut floats[..rows * ne0]);
        // Q8_0 needs no importance matrix.
        let written = types::quantize(to, &floats[..rows * ne0], rows, ne0, &mut out);
        debug_assert_eq!(written, rows * dst_row);
        sink(row * dst_row, &out[..rows * dst_row]);
        row += rows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in WeightFormat::NAMES {
            let f: WeightFormat = name.parse().unwrap();
            assert_eq!(f.name(), name);
        }
        assert!("q3".parse::<WeightFormat>().unwrap_err().contains("stored, q8_0"));
    }

    #[test]
    fn only_narrow_quantized_types_widen() {
        let q8 = WeightFormat::Q8_0;
        assert_eq!(q8.target(sys::GGML_TYPE_Q4_1, 576), sys::GGML_TYPE_Q8_0);
        assert_eq!(q8.target(sys::GGML_TYPE_Q4_K, 896), sys::GGML_TYPE_Q8_0);
        assert_eq!(q8.target(sys::GGML_TYPE_Q6_K, 896), sys::GGML_TYPE_Q8_0);
        assert_eq!(q8.target(sys::GGML_TYPE_Q8_0, 576), sys::GGML_TYPE_Q8_0);
        assert_eq!(q8.target(sys::GGML_TYPE_F16, 576), sys::GGML_TYPE_F16);
        assert_eq!(q8.target(sys::GGML_TYPE_F32, 576), sys::GGML_TYPE_F32);
        assert_eq!(WeightFormat::AsStored.target(sys::GGML_TYPE_Q4_1, 576), sys::GGML_TYPE_Q4_1);
    }

    #[test]
    fn q4_1_widens_within_half_a_q8_step() {
        crate::ffi::init();
        let (ne0, ne1) = (64usize, 130usize);
        let original: Vec<f32> = (0..ne0 * ne1).map(|i| ((i * 7919) % 251) as f32 / 50.0 - 2.5).collect();
        let q4_row = types::bytes_of(sys::GGML_TYPE_Q4_1, ne0);
        let mut q4 = vec![0u8; q4_row * ne1];
        types::quantize(sys::GGML_TYPE_Q4_1, &original, ne1, ne0, &mut q4);
        let dequant = |ty: sys::ggml_type, bytes: &[u8]| {
            let mut out = vec![0f32; ne0 * ne1];
            types::to_float(ty, bytes, &mut out);
            out
        };
        let mut q8 = Vec::new();
        convert_matrix(sys::GGML_TYPE_Q4_1, sys::GGML_TYPE_Q8_0, &q4, ne0, ne1, &mut |off, b| {
            assert_eq!(off, q8.len(), "chunks arrive in order");
            q8.extend_from_slice(b);
        });
        let a = dequant(sys::GGML_TYPE_Q4_1, &q4);
        let b = dequant(sys::GGML_TYPE_Q8_0, &q8);
        for (block_a, block_b) in a.chunks(32).zip(b.chunks(32)) {
            let amax = block_a.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in block_a.iter().zip(block_b) {
                // Half a step d = amax/127, plus the f16 rounding of d (2^-11 relative) over
                // up to 127 steps: at most 0.57 d.
                assert!((x - y).abs() <= amax / 127.0 * 0.57 + 1e-6, "{x} widened to {y}");
            }
        }
    }
}
