//! A Q4_1 × Q8_1 matrix product over several activation rows whose every output element is
//! bitwise what ggml's one-row kernel (`ggml_vec_dot_q4_1_q8_1`, AVX2) computes, and the
//! ggml custom op that puts it in the graph for passes of two or more tokens.
//!
//! ggml has no multi-row kernel for Q4_1 on x86 (llamafile's tinyBLAS takes only the
//! symmetric formats, and the repacked layouts break batch invariance), so a verification
//! pass of n tokens costs n one-row dot products per weight row: 4.1 plain steps for 8
//! tokens on this project's CPU. These kernels unpack each weight block once for several
//! activation rows and convert the activation scales once per block, and keep the one-row
//! kernel's arithmetic per element — the same f32 scale product, the same exact integer lane
//! sums, the same fused multiply-add over blocks in order, the same horizontal sum — so a row
//! of a verification pass stays what decoding that token alone computes. Single-token passes
//! keep ggml's kernel, which is as fast for one row.
//!
//! Three kernels, chosen at run time from the CPU's features:
//! - `Avx512`: two activation rows per 512-bit register (the weight block broadcast to both
//!   halves), tiles of 2 weight rows × up to 8 activation rows, `vpdpbusd`.
//! - `AvxVnni` and `Avx2`: 256-bit registers, tiles of 2 weight rows × up to 4 activation
//!   rows, with `vpdpbusd` (VEX) or `vpmaddubsw` + `vpmaddwd`.
//!
//! All give the same exact int32 lane sums (4-bit × 8-bit pairs cannot saturate 16 bits),
//! so the choice changes speed, not bits. On other architectures, or when ggml itself was
//! built without AVX2 (its one-row kernel is then the scalar one, which sums in another
//! order), the graph uses ggml's `mul_mat` as before. Setting `POCKET_GGML_MUL_MAT=1` does
//! the same, for measuring one against the other.
//!
//! Measured (`time_against_the_one_row_kernel`, 1536 × 576, this project's CPU, whose
//! timings drift by tens of percent): ggml's one-row kernel takes about 33 µs per activation
//! row. Against it, at 8 rows `Avx512` is 2.5× faster, `AvxVnni` 1.6×, `Avx2` 1.15×; at 2
//! rows 1.2–1.3×; at one row 0.9–1×.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use llama_cpp_sys_2 as sys;

use crate::ffi::graph::{Ctx, Tensor};

/// ggml's `block_q4_1`: 32 weights as 4-bit values `q` meaning `d·q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockQ4_1 {
    pub(crate) d: u16,
    pub(crate) m: u16,
    pub(crate) qs: [u8; 16],
}

/// ggml's `block_q8_1`: 32 activations as `d·q`, with `s = d·Σq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BlockQ8_1 {
    pub(crate) d: u16,
    pub(crate) s: u16,
    pub(crate) qs: [i8; 32],
}

/// The integer dot-product instructions a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Only x86-64 has these kernels; elsewhere `kernel()` is always `None`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kernel {
    /// AVX-512 with VNNI on 512-bit registers: two activation rows per register, each half
    /// doing what the 256-bit kernels do for one.
    Avx512,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded, on 256-bit registers: Intel's client CPUs
    /// without AVX-512).
    AvxVnni,
    /// AVX2 (`vpmaddubsw` then `vpmaddwd`).
    Avx2,
}

impl Kernel {
    /// A short name, as `GgmlModel::kernels` reports it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "q4_1-avx512",
            Kernel::AvxVnni => "q4_1-avxvnni",
            Kernel::Avx2 => "q4_1-avx2",
        }
    }
}

/// The kernel this process uses, or `None` where the graph keeps ggml's `mul_mat`.
pub(crate) fn kernel() -> Option<Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if std::env::var_os("POCKET_GGML_MUL_MAT").is_some_and(|v| v == "1") {
            return None;
        }
        crate::ffi::init();
        // SAFETY: a query of how ggml was compiled.
        let ggml_avx2 = unsafe { sys::ggml_cpu_has_avx2() != 0 && sys::ggml_cpu_has_fma() != 0 };
        if ggml_avx2 { detect() } else { None }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<Kernel> {
    if !(is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c"))
    {
        return None;
    }
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
    {
        Some(Kernel::Avx512)
    } else if is_x86_feature_detected!("avxvnni") {
        Some(Kernel::AvxVnni)
    } else {
        Some(Kernel::Avx2)
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Option<Kernel> {
    None
}

/// Whether [`mul_mat`] computes `w · x`: Q4_1 weights in plain host memory (not repacked)
/// times several f32 rows, on a CPU with one of our kernels.
pub(crate) fn applies(w: Tensor, x: Tensor) -> bool {
    if kernel().is_none() {
        return false;
    }
    let (wn, xn, wb, xb) = (w.ne(), x.ne(), w.nb(), x.nb());
    let k = wn[0];
    // SAFETY: live tensors (graph handles); reading where a weight's data lies.
    let plain_host = unsafe {
        let raw = &*w.ptr();
        raw.extra.is_null() && !raw.buffer.is_null() && sys::ggml_backend_buffer_is_host(raw.buffer)
    };
    w.ty() == sys::GGML_TYPE_Q4_1
        && x.ty() == sys::GGML_TYPE_F32
        && k % 32 == 0
        && xn[0] == k
        && xn[1] >= 2
        && wn[2] == 1
        && wn[3] == 1
        && xn[2] == 1
        && xn[3] == 1
        && wb[1] == (k as usize / 32) * size_of::<BlockQ4_1>()
        && xb[0] == size_of::<f32>()
        && plain_host
}

/// `w · x` as a ggml custom op: `[w.ne1, x.ne1]` f32, each row what `ggml_mul_mat` gives.
/// Call only where [`applies`] holds.
pub(crate) fn mul_mat(ctx: &Ctx, w: Tensor, x: Tensor) -> Tensor {
    // SAFETY: `compute` reads a Q4_1 matrix and f32 rows of the shapes `applies` checked, and
    // each thread writes its own rows of the destination.
    unsafe {
        ctx.custom(
            sys::GGML_TYPE_F32,
            [w.ne()[1], x.ne()[1], 1, 1],
            &[w, x],
            Some(compute),
            std::ptr::null_mut(),
        )
    }
}

/// Per-thread scratch: the activations quantized to Q8_1 and a tile's scales. ggml's thread
/// pool keeps its threads, so these grow once and are reused.
#[derive(Default)]
struct Scratch {
    y: Vec<BlockQ8_1>,
    scales: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// ggml's CPU quantizer for Q8_1: what its `mul_mat` applies to activations for Q4_1.
fn quantize_row_q8_1() -> unsafe extern "C" fn(*const f32, *mut c_void, i64) {
    static FROM_FLOAT: OnceLock<unsafe extern "C" fn(*const f32, *mut c_void, i64)> = OnceLock::new();
    // SAFETY: ggml's CPU type traits are static; Q8_1 has a quantizer on every CPU build.
    *FROM_FLOAT.get_or_init(|| unsafe {
        (*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q8_1))
            .from_float
            .expect("ggml's CPU backend quantizes Q8_1")
    })
}

/// The custom op's body on thread `ith` of `nth`: quantize every activation row (as
/// `ggml_mul_mat` does, once per row), then compute this thread's share of weight rows.
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, _: *mut c_void) {
    let Some(kernel) = kernel() else { return };
    let quantize = quantize_row_q8_1();
    // SAFETY: ggml calls this with the tensor `mul_mat` built, its sources and destination
    // allocated; `applies` checked their types and layout. Threads write disjoint rows of dst.
    unsafe {
        let (w, x) = (&*(*dst).src[0], &*(*dst).src[1]);
        let k = w.ne[0] as usize;
        let (m, n) = (w.ne[1] as usize, x.ne[1] as usize);
        let nb = k / 32;
        let per_thread = m.div_ceil(nth.max(1) as usize).next_multiple_of(2);
        let r0 = (ith as usize * per_thread).min(m);
        let r1 = (r0 + per_thread).min(m);
        if r0 == r1 {
            return;
        }
        let weights = std::slice::from_raw_parts(w.data.cast::<BlockQ4_1>(), m * nb);
        SCRATCH.with_borrow_mut(|s| {
            s.y.clear();
            s.y.resize(n * nb, BlockQ8_1::default());
            for c in 0..n {
                let row = x.data.cast::<u8>().add(c * x.nb[1]).cast::<f32>();
                quantize(row, s.y[c * nb..].as_mut_ptr().cast(), k as i64);
            }
            gemm(kernel, weights, &s.y, nb, r0..r1, (*dst).data.cast(), m, &mut s.scales);
        });
    }
}

/// `out[c * ld + r] = dot(w row r, y row c)` for `r` in `rows` and every activation row `c`
/// of `y` (`y.len() / nb` of them), where each weight row is `nb` blocks of `w`. `scratch`
/// is working memory.
///
/// # Safety
/// The CPU must have the kernel's instructions ([`kernel`] chose it); `w` holds
/// `rows.end * nb` blocks, `y` a multiple of `nb`, and `out` is valid for writes at every
/// `(c, r)` and not read or written by anyone else there meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    kernel: Kernel,
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scratch: &mut Vec<f32>,
) {
    assert!(w.len() >= rows.end * nb && y.len().is_multiple_of(nb) && rows.end <= ld);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: by the caller.
    unsafe {
        match kernel {
            Kernel::Avx512 => gemm_avx512(w, y, nb, rows, out, ld, scratch),
            Kernel::AvxVnni => gemm_avx_vnni(w, y, nb, rows, out, ld, scratch),
            Kernel::Avx2 => gemm_avx2(w, y, nb, rows, out, ld, scratch),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, w, y, nb, rows, out, ld, scratch);
        unreachable!("`kernel()` finds no Q4_1 kernel on this architecture");
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_avx_vnni(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scratch: &mut Vec<f32>,
) {
    // SAFETY: by the caller; this function has the instructions `AvxVnni` uses.
    unsafe { gemm_body::<AvxVnni>(w, y, nb, rows, out, ld, scratch) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_avx2(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    nb: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    scratch: &mut Vec<f32>,
) {
    // SAFETY: by the caller; this function has the instructions `Avx2` uses.
    unsafe { gemm_body::<Avx2>(w, y, nb, rows, out, ld, scratch) }
}

/// Exact int32 lane sums of 4 products of unsigned 4-bit `qx` and signed 8-bit `qy` bytes.
#[cfg(target_arch = "x86_64")]
trait Dot {
    /// # Safety
    /// The CPU must have the instructions the implementation uses.
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i;
}

#[cfg(target_arch = "x86_64")]
struct AvxVnni;

#[cfg(target_arch = "x86_64")]
impl Dot for AvxVnni {
    #[inline(always)]
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qx, qy) }
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Dot for Avx2 {
    #[inline(always)]
    unsafe fn dot(qx: __m256i, qy: __m256i) -> __m256i {
        // SAFETY: by the caller (AVX2).
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)) }
    }
}

/// An f16 as f32 (exact, as ggml's `GGML_CPU_FP16_TO_FP32`).
///
/// # Safety
/// The CPU must have F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16(x: u16) -> f32 {
    // SAFETY: by the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(x)))) }
}

/// The 32 4-bit weights of a block as bytes, low nibbles first (ggml's `bytes_from_nibbles_32`).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn unpack_q4(x: &BlockQ4_1) -> __m256i {
    // SAFETY: by the caller; 16 bytes of the block are read.
    unsafe {
        let tmp = _mm_loadu_si128(x.qs.as_ptr().cast());
        let bytes = _mm256_insertf128_si256::<1>(_mm256_castsi128_si256(tmp), _mm_srli_epi16::<4>(tmp));
        _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
    }
}

/// The sum of 8 lanes in ggml's order (`hsum_float_8`): halves, then pairs, then the last two.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum(x: __m256) -> f32 {
    // SAFETY: by the caller.
    unsafe {
        let mut res = _mm256_extractf128_ps::<1>(x);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

/// Lanes of the per-tile scale vectors: one per activation row of a tile, padded to a
/// 256-bit register.
#[cfg(target_arch = "x86_64")]
const COLS: usize = 8;

/// Activation rows per tile: one accumulator register per (weight row, activation row).
#[cfg(target_arch = "x86_64")]
const TILE_COLS: usize = 4;

#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
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
    let mut c0 = 0;
    while c0 < ncols {
        let nc = TILE_COLS.min(ncols - c0);
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
        // SAFETY: by the caller; the columns c0..c0 + nc exist.
        unsafe {
            match nc {
                4 => tile::<D, 4>(w, y, scales, nb, c0, rows.clone(), out, ld),
                3 => tile::<D, 3>(w, y, scales, nb, c0, rows.clone(), out, ld),
                2 => tile::<D, 2>(w, y, scales, nb, c0, rows.clone(), out, ld),
                _ => tile::<D, 1>(w, y, scales, nb, c0, rows.clone(), out, ld),
            }
        }
        c0 += nc;
    }
}

/// [`gemm_body`] for the `N` activation rows from `c0`, 2 weight rows at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<D: Dot, const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let mut r = rows.start;
    while r + 2 <= rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<D, 2, N>(w, y, scales, nb, c0, r, out, ld) };
        r += 2;
    }
    if r < rows.end {
        // SAFETY: as for the caller.
        unsafe { tile_rows::<D, 1, N>(w, y, scales, nb, c0, r, out, ld) };
    }
}

/// `RM` weight rows from `r0` times `N` activation rows from `c0`: one accumulator register
/// per pair, each activation block loaded once per tile; the tile's scales and `m·s` sums
/// travel as 8-lane vectors (lane c for c0 + c).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // c indexes y, lanes and acc
unsafe fn tile_rows<D: Dot, const RM: usize, const N: usize>(
    w: &[BlockQ4_1],
    y: &[BlockQ8_1],
    scales: &[f32],
    nb: usize,
    c0: usize,
    r0: usize,
    out: *mut f32,
    ld: usize,
) {
    // SAFETY: the caller's CPU has the instructions used (AVX2, FMA, F16C and D's); every
    // index is in range by the caller's checks (w holds r0 + RM rows of nb blocks, y the
    // tile's columns, scales 2·COLS floats per block, out every (c, r) written).
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
                // m·s of two f16 values is exact in f32, so this sum per lane is ggml's
                // scalar `summs` whether or not either side fuses the multiply-add.
                summs[rr] = _mm256_add_ps(summs[rr], _mm256_mul_ps(_mm256_set1_ps(f16(x.m)), ys));
                d0d1[rr] = _mm256_mul_ps(_mm256_set1_ps(f16(x.d)), yd);
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
#[cfg(target_arch = "x86_64")]
const TILE_COLS_512: usize = 8;

/// Floats of scales per block in the 512-bit kernel: per pair of activation rows, 8 copies
/// of each row's `d`; then the tile's `s` in 16 lanes.
#[cfg(target_arch = "x86_64")]
const STRIDE_512: usize = TILE_COLS_512 * 8 + 16;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
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
    // Tiles of even widths: 9 rows as 5 + 4, not 8 + 1 (a tile costs about as much at one
    // row as at two).
    let mut tiles_left = ncols.div_ceil(TILE_COLS_512);
    let mut c0 = 0;
    while c0 < ncols {
        let nc = (ncols - c0).div_ceil(tiles_left);
        tiles_left -= 1;
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
        c0 += nc;
    }
}

/// [`gemm_avx512`] for the `nc` (≤ 2·`NP`) activation rows from `c0`, 2 weight rows at a time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
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
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::time::Instant;

    use llama_cpp_sys_2 as sys;

    use super::*;

    /// Random Q4_1 weights (`rows × k`) and Q8_1 activations (`cols × k`), quantized by ggml.
    fn data(rows: usize, cols: usize, k: usize, seed: u64) -> (Vec<BlockQ4_1>, Vec<BlockQ8_1>) {
        let mut state = seed;
        let mut rand = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let wf: Vec<f32> = (0..rows * k).map(|_| rand()).collect();
        let yf: Vec<f32> = (0..cols * k).map(|_| rand() * 3.0).collect();
        let nb = k / 32;
        let mut w = vec![BlockQ4_1 { d: 0, m: 0, qs: [0; 16] }; rows * nb];
        let mut y = vec![BlockQ8_1 { d: 0, s: 0, qs: [0; 32] }; cols * nb];
        // SAFETY: buffers sized for the blocks; ggml's CPU quantizer for Q8_1 is what its
        // matrix product uses on activations.
        unsafe {
            sys::ggml_quantize_chunk(
                sys::GGML_TYPE_Q4_1,
                wf.as_ptr(),
                w.as_mut_ptr().cast(),
                0,
                rows as i64,
                k as i64,
                std::ptr::null(),
            );
            let from_float = (*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q8_1)).from_float.unwrap();
            for c in 0..cols {
                from_float(yf[c * k..].as_ptr(), y[c * nb..].as_mut_ptr().cast(), k as i64);
            }
        }
        (w, y)
    }

    fn vec_dot(w: &[BlockQ4_1], y: &[BlockQ8_1], nb: usize, r: usize, c: usize) -> f32 {
        let mut s = 0f32;
        // SAFETY: one row of each, nb blocks; ggml's own one-row kernel.
        unsafe {
            let dot = (*sys::ggml_get_type_traits_cpu(sys::GGML_TYPE_Q4_1)).vec_dot.unwrap();
            dot(
                (nb * 32) as i32,
                &mut s,
                0,
                w[r * nb..].as_ptr().cast(),
                0,
                y[c * nb..].as_ptr().cast(),
                0,
                1,
            );
        }
        s
    }

    /// The kernels this CPU can run: the one chosen, and AVX2 beside VNNI.
    fn kernels() -> Vec<Kernel> {
        match detect() {
            Some(k) => {
                let mut all = vec![k, Kernel::Avx2];
                if k == Kernel::Avx512 && is_x86_feature_detected!("avxvnni") {
                    all.insert(1, Kernel::AvxVnni);
                }
                all.dedup();
                all
            }
            None => Vec::new(),
        }
    }

    #[test]
    fn every_element_is_what_the_one_row_kernel_computes() {
        crate::ffi::init();
        // Every tile width of every kernel, odd and even weight rows.
        let shapes =
            [(64, 1, 576), (37, 9, 576), (16, 17, 1536), (5, 8, 32), (8, 3, 64), (6, 7, 96), (3, 5, 32)];
        for (rows, cols, k) in shapes {
            let nb = k / 32;
            let (w, y) = data(rows, cols, k, rows as u64 * 31 + cols as u64);
            for kernel in kernels() {
                let mut out = vec![0f32; cols * rows];
                // SAFETY: a kernel this CPU has; sizes as documented.
                unsafe { gemm(kernel, &w, &y, nb, 0..rows, out.as_mut_ptr(), rows, &mut Vec::new()) };
                for c in 0..cols {
                    for r in 0..rows {
                        let want = vec_dot(&w, &y, nb, r, c);
                        let got = out[c * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{kernel:?}: row {r} col {c} of {rows}x{cols}x{k}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[ignore = "timing, run by hand: cargo test --release -p pocket-ggml q4_1_gemm -- --ignored --nocapture"]
    fn time_against_the_one_row_kernel() {
        crate::ffi::init();
        let (rows, k) = (1536, 576);
        let nb = k / 32;
        for cols in [1, 2, 4, 8, 9, 16] {
            let (w, y) = data(rows, cols, k, 7);
            let mut out = vec![0f32; cols * rows];
            let reps = 200;
            let t = Instant::now();
            for _ in 0..reps {
                for c in 0..cols {
                    for r in 0..rows {
                        out[c * rows + r] = vec_dot(&w, &y, nb, r, c);
                    }
                }
            }
            let one_row = t.elapsed().as_secs_f64() / reps as f64;
            for kernel in kernels() {
                let mut scratch = Vec::new();
                let t = Instant::now();
                for _ in 0..reps {
                    // SAFETY: as in the equality test.
                    unsafe { gemm(kernel, &w, &y, nb, 0..rows, out.as_mut_ptr(), rows, &mut scratch) };
                }
                let tiled = t.elapsed().as_secs_f64() / reps as f64;
                eprintln!(
                    "{cols:2} columns: one-row kernel {:.1} µs, {kernel:?} kernel {:.1} µs ({:.2}x)",
                    one_row * 1e6,
                    tiled * 1e6,
                    one_row / tiled
                );
            }
        }
    }
}
