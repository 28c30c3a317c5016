//! ggml's element types: sizes, and conversion of rows between them (dequantize to f32,
//! quantize from f32), as safe functions that check the lengths they are given.

use llama_cpp_sys_2 as sys;
use pocket_core::KvElement;

/// ggml's element type for a KV element type.
pub(crate) fn ggml_type(t: KvElement) -> sys::ggml_type {
    match t {
        KvElement::F32 => sys::GGML_TYPE_F32,
        KvElement::F16 => sys::GGML_TYPE_F16,
        KvElement::Q8_0 => sys::GGML_TYPE_Q8_0,
        KvElement::Q4_0 => sys::GGML_TYPE_Q4_0,
    }
}

/// What ggml's type table says of a type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TypeInfo {
    /// Bytes of one block.
    pub type_size: usize,
    /// Values per block (1 for the float types).
    pub block: usize,
    pub is_quantized: bool,
    /// Whether ggml can dequantize it to f32.
    pub has_to_float: bool,
}

/// ggml's table entry for `ty`.
pub(crate) fn info(ty: sys::ggml_type) -> TypeInfo {
    // SAFETY: ggml's static per-type table; every type id of the enum has an entry.
    let t = unsafe { &*sys::ggml_get_type_traits(ty) };
    TypeInfo {
        type_size: t.type_size,
        block: t.blck_size.max(1) as usize,
        is_quantized: t.is_quantized,
        has_to_float: t.to_float.is_some(),
    }
}

/// Bytes of `n` values of `ty` (in whole blocks, rounding up).
pub(crate) fn bytes_of(ty: sys::ggml_type, n: usize) -> usize {
    let t = info(ty);
    n.div_ceil(t.block) * t.type_size
}

/// Dequantize `src` (whole blocks of `ty`) into `out`, which receives one f32 per value.
///
/// Panics if `ty` has no dequantizer or the lengths disagree.
pub(crate) fn to_float(ty: sys::ggml_type, src: &[u8], out: &mut [f32]) {
    let t = info(ty);
    assert_eq!(src.len() * t.block, out.len() * t.type_size, "{} values from {} bytes", out.len(), src.len());
    assert!(out.len().is_multiple_of(t.block), "whole blocks");
    // SAFETY: as above, the table entry of a valid type.
    let f = unsafe { (*sys::ggml_get_type_traits(ty)).to_float }.expect("a type with a dequantizer");
    // SAFETY: `src` holds exactly the blocks of out.len() values, `out` room for all of them.
    unsafe { f(src.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
}

/// Quantize `rows` rows of `n_per_row` values from `src` into `out` as `ty` (no importance
/// matrix), returning the bytes written.
///
/// Panics if the lengths disagree or a row is not whole blocks of `ty`.
pub(crate) fn quantize(
    ty: sys::ggml_type,
    src: &[f32],
    rows: usize,
    n_per_row: usize,
    out: &mut [u8],
) -> usize {
    let t = info(ty);
    assert!(n_per_row.is_multiple_of(t.block), "rows of whole blocks");
    assert_eq!(src.len(), rows * n_per_row, "values for {rows} rows");
    assert!(out.len() >= rows * bytes_of(ty, n_per_row), "room for {rows} rows");
    // SAFETY: `src` holds rows × n_per_row values and `out` room for as many rows of `ty`.
    unsafe {
        sys::ggml_quantize_chunk(
            ty,
            src.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    }
}
