//! Quantized matrix products over several activation rows whose every output element is
//! bitwise what ggml's one-row kernel (`ggml_vec_dot_*`) computes, and the ggml custom op that
//! puts them in the graph for passes of two or more tokens.
//!
//! Speculation pays only where verifying n tokens costs much less than n decode steps. ggml
//! multiplies K-quant matrices by a batch with one one-row dot product per (weight row,
//! activation row), and llamafile's tiled kernels, which it uses for Q4_0, Q5_0 and Q8_0,
//! unpack each weight block again for every activation row. Our kernels unpack a weight block
//! once and use it for every activation row of the pass, and keep the one-row kernel's
//! arithmetic per element: the same exact int32 lane sums (integers, so any order of integer
//! adds gives the same value), the same f32 scale products, the same fused multiply-adds over
//! blocks in order and the same horizontal sums. So a row of a verification pass is bitwise
//! what decoding that token alone computes, whatever the number of rows or threads.
//!
//! One module per block format: `q4_1` (× Q8_1), `q0` (Q4_0, Q5_0, Q8_0 × Q8_0) and
//! `k_quants` (Q4_K, Q6_K × Q8_K), for x86-64 in `x86` and for aarch64 in `neon`. The
//! instructions are chosen at run time ([`Isa`]) to sum as this build of ggml sums. On other
//! architectures, or where ggml's one-row kernels take paths ours do not follow (x86 without
//! AVX2, ARM with SVE), the graph keeps ggml's `mul_mat`. `POCKET_GGML_MUL_MAT=1` does the
//! same, for measuring one against the other.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;

use crate::ffi::chunks::{Chunks, chunk_size};
use crate::ffi::graph::{Ctx, Tensor};

/// `$body` for each `$c` in `0..$n` (`$n` ≤ 8 and known at compile time), written out one
/// after another with `$c` a constant, so that arrays indexed by it stay in registers.
macro_rules! unroll_cols {
    ($c:ident, $n:expr, $body:block) => {
        unroll_cols!(@one $c, $n, 0, $body);
        unroll_cols!(@one $c, $n, 1, $body);
        unroll_cols!(@one $c, $n, 2, $body);
        unroll_cols!(@one $c, $n, 3, $body);
        unroll_cols!(@one $c, $n, 4, $body);
        unroll_cols!(@one $c, $n, 5, $body);
        unroll_cols!(@one $c, $n, 6, $body);
        unroll_cols!(@one $c, $n, 7, $body);
    };
    (@one $c:ident, $n:expr, $i:literal, $body:block) => {
        if $i < $n {
            let $c: usize = $i;
            $body
        }
    };
}

pub(crate) mod blocks;
pub(crate) mod dense;
#[cfg(target_arch = "aarch64")]
mod neon;
pub(crate) mod repacked;
pub(crate) mod timing;

/// The formats with kernels, by name: ggml's, and `q4_Kx8` for Q4_K in ggml's repacked
/// layout where this CPU uses it.
pub fn kernel_formats() -> Vec<&'static str> {
    let mut formats: Vec<&str> = Quant::ALL.iter().map(|q| q.name()).collect();
    if repacked::buffer_type().is_some() {
        formats.push("q4_Kx8");
    }
    formats
}

/// Time `format` (one of [`kernel_formats`]) on an `m × k` matrix by each of `rows`
/// activation rows, on one thread: the best of `reps` runs of each kernel. `k` must be a
/// multiple of the format's block (256 for K-quants, else 32).
pub fn time_kernel(
    format: &str,
    m: usize,
    k: usize,
    rows: &[usize],
    reps: usize,
) -> Option<Vec<timing::KernelTiming>> {
    crate::ffi::init();
    match format {
        "q4_Kx8" => repacked::time(m, k, rows, reps),
        _ => timing::time_stored(format, m, k, rows, reps),
    }
}
#[cfg(target_arch = "x86_64")]
mod x86;

/// The instructions the kernels use, chosen at run time. Each gives the same bits; the
/// choice changes speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 with VNNI: `vpdpbusd` (on 512-bit registers in the Q4_1 kernel, 256-bit
    /// elsewhere).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX-VNNI (`vpdpbusd`, VEX-encoded, on 256-bit registers: Intel's client CPUs
    /// without AVX-512).
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX2 (`vpmaddubsw` then `vpmaddwd`).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// NEON with the dot-product instructions (`sdot`), for a ggml built with them
    /// (`armv8.2-a+dotprod` and later): its lane sums are `sdot`'s.
    #[cfg(target_arch = "aarch64")]
    NeonDot,
    /// `sdot` on operands whose bytes are permuted so that it forms the lanes of a ggml built
    /// without the dot-product instructions, on a CPU that has them (a Raspberry Pi 5 running
    /// the default build).
    #[cfg(target_arch = "aarch64")]
    NeonPermuted,
    /// Plain NEON, for a ggml built without the dot-product instructions (the default
    /// `armv8-a`), whose lane sums are those of its `vmull_s8` + `vpaddlq_s16` stand-in, on a
    /// CPU without them (a Raspberry Pi 4).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// A short name, as `GgmlModel::kernels` reports it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Isa::AvxVnni => "avxvnni",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDot => "neon-dotprod",
            #[cfg(target_arch = "aarch64")]
            Isa::NeonPermuted => "neon-sdot-permuted",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "neon",
        }
    }
}

/// The instructions this process's kernels use, or `None` where the graph keeps ggml's
/// `mul_mat`.
pub(crate) fn isa() -> Option<Isa> {
    static ISA: OnceLock<Option<Isa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var_os("POCKET_GGML_MUL_MAT").is_some_and(|v| v == "1") {
            return None;
        }
        crate::ffi::init();
        detect()
    })
}

/// The kernels that sum as this build of ggml's one-row kernels do, on this CPU.
#[cfg(target_arch = "x86_64")]
fn detect() -> Option<Isa> {
    // SAFETY: a query of how ggml was compiled.
    let ggml_avx2 = unsafe { sys::ggml_cpu_has_avx2() != 0 && sys::ggml_cpu_has_fma() != 0 };
    // Without AVX2, ggml's one-row kernels sum in other orders.
    if ggml_avx2 { x86::detect() } else { None }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Option<Isa> {
    neon::detect()
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Option<Isa> {
    None
}

/// The weight formats with a kernel here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Quant {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
}

impl Quant {
    /// Every format, in the order `GgmlModel::kernels` names them.
    pub(crate) const ALL: [Quant; 6] =
        [Quant::Q4_0, Quant::Q4_1, Quant::Q5_0, Quant::Q8_0, Quant::Q4K, Quant::Q6K];

    /// The format of ggml type `ty`, if it has a kernel.
    pub(crate) fn of(ty: sys::ggml_type) -> Option<Quant> {
        Quant::ALL.into_iter().find(|q| q.ggml() == ty)
    }

    /// The ggml type.
    pub(crate) fn ggml(self) -> sys::ggml_type {
        match self {
            Quant::Q4_0 => sys::GGML_TYPE_Q4_0,
            Quant::Q4_1 => sys::GGML_TYPE_Q4_1,
            Quant::Q5_0 => sys::GGML_TYPE_Q5_0,
            Quant::Q8_0 => sys::GGML_TYPE_Q8_0,
            Quant::Q4K => sys::GGML_TYPE_Q4_K,
            Quant::Q6K => sys::GGML_TYPE_Q6_K,
        }
    }

    /// The name, as in ggml.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Quant::Q4_0 => "q4_0",
            Quant::Q4_1 => "q4_1",
            Quant::Q5_0 => "q5_0",
            Quant::Q8_0 => "q8_0",
            Quant::Q4K => "q4_K",
            Quant::Q6K => "q6_K",
        }
    }

    /// The format ggml quantizes activations to for this weight format (its `vec_dot_type`).
    pub(crate) fn activations(self) -> sys::ggml_type {
        match self {
            Quant::Q4_1 => sys::GGML_TYPE_Q8_1,
            Quant::Q4K | Quant::Q6K => sys::GGML_TYPE_Q8_K,
            Quant::Q4_0 | Quant::Q5_0 | Quant::Q8_0 => sys::GGML_TYPE_Q8_0,
        }
    }

    /// Weights per block.
    pub(crate) fn block_len(self) -> usize {
        match self {
            Quant::Q4K | Quant::Q6K => 256,
            _ => 32,
        }
    }
}

/// Whether [`mul_mat`] computes `w · x`: weights of a format with a kernel, in plain host
/// memory (not repacked), times several f32 rows, on a CPU with our kernels.
pub(crate) fn applies(w: Tensor, x: Tensor) -> bool {
    has_kernel(w) && several_rows_for(w, x)
}

/// Whether `x` is what our matrix kernels take beside `w`: two or more dense f32 rows of
/// `w`'s width, in one plain matrix.
pub(crate) fn several_rows_for(w: Tensor, x: Tensor) -> bool {
    let (xn, xb) = (x.ne(), x.nb());
    x.ty() == sys::GGML_TYPE_F32
        && xn[0] == w.ne()[0]
        && xn[1] >= 2
        && xn[2] == 1
        && xn[3] == 1
        && xb[0] == size_of::<f32>()
}

/// Whether [`mul_mat`] takes the matrix `w` (with activation rows that fit it): a format with
/// a kernel that agreed with ggml, whole blocks, one plain matrix in host memory.
fn has_kernel(w: Tensor) -> bool {
    let Some(quant) = Quant::of(w.ty()) else { return false };
    if !verified(quant) {
        return false;
    }
    let (wn, wb) = (w.ne(), w.nb());
    let k = wn[0];
    // SAFETY: live tensors (graph handles); reading where a weight's data lies.
    let plain_host = unsafe {
        let raw = &*w.ptr();
        raw.extra.is_null() && !raw.buffer.is_null() && sys::ggml_backend_buffer_is_host(raw.buffer)
    };
    // SAFETY: a pure function of a type and a length.
    let row_bytes = unsafe { sys::ggml_row_size(w.ty(), k) };
    k % quant.block_len() as i64 == 0 && wn[2] == 1 && wn[3] == 1 && wb[1] == row_bytes && plain_host
}

/// Whether a pass of several rows multiplies `w` with a kernel of ours, which computes each
/// row as the one-token pass does (ggml's one-row kernel, or for a repacked Q4_K matrix its
/// one-token kernel): what makes every row of a shared pass what that row's pass alone gives.
pub(crate) fn rows_exact(w: Tensor) -> bool {
    has_kernel(w) || repacked::is_repacked(w)
}

/// `w · x`: our kernel where it [`applies`] (or, for a matrix ggml repacked, where
/// [`repacked::applies`]), ggml's `mul_mat` elsewhere (one token, other formats, other CPUs). `x` is quantized for the kernel once per graph and activation
/// format, in `quantized`, however many matrices multiply it (a layer's Q, K and V
/// projections, its gate and up projections).
pub(crate) fn mul_mat_or_ggml(ctx: &Ctx, w: Tensor, x: Tensor, quantized: &Quantized) -> Tensor {
    if repacked::applies(w, x) {
        return repacked::mul_mat(ctx, w, quantized.get(ctx, x, sys::GGML_TYPE_Q8_K));
    }
    match Quant::of(w.ty()) {
        Some(quant) if applies(w, x) => mul_mat(ctx, w, quantized.get(ctx, x, quant.activations())),
        _ => ctx.mul_mat(w, x),
    }
}

/// The activation rows of a graph quantized as the kernels read them: one node per source
/// tensor and activation format.
#[derive(Default)]
pub(crate) struct Quantized(RefCell<Vec<(*mut sys::ggml_tensor, sys::ggml_type, Tensor)>>);

impl Quantized {
    /// `x`'s rows in format `ty`, as ggml's `mul_mat` quantizes them: the node made for them
    /// before, or a new one.
    fn get(&self, ctx: &Ctx, x: Tensor, ty: sys::ggml_type) -> Tensor {
        let mut made = self.0.borrow_mut();
        if let Some(&(_, _, q)) = made.iter().find(|(src, t, _)| *src == x.ptr() && *t == ty) {
            return q;
        }
        // SAFETY: a pure function of a type and a length.
        let row = unsafe { sys::ggml_row_size(ty, x.ne()[0]) };
        // SAFETY: `quantize_rows` writes each f32 row of x (each row contiguous: checked by
        // `applies`) quantized to the type its userdata names into a row of `row` bytes;
        // threads take rows apart.
        let q = unsafe {
            ctx.custom(
                sys::GGML_TYPE_I8,
                [row as i64, x.ne()[1], 1, 1],
                &[x],
                Some(quantize_rows),
                ty as usize as *mut c_void,
            )
        };
        made.push((x.ptr(), ty, q));
        q
    }
}

/// The quantizing node's body on thread `ith` of `nth`: rows `ith`, `ith + nth`, ….
///
/// # Safety
/// Only ggml calls it, from its CPU backend's threads, with `dst` the node
/// `Quantized::get` built and `ty` the element type it quantizes to.
unsafe extern "C" fn quantize_rows(dst: *mut sys::ggml_tensor, ith: c_int, nth: c_int, ty: *mut c_void) {
    // SAFETY: ggml calls this with the node `Quantized::get` built: f32 rows of `k` in src 0,
    // a destination of as many rows of `ggml_row_size(ty, k)` bytes; rows apart per thread.
    unsafe {
        let (x, dst) = (&*(*dst).src[0], &*dst);
        let quantize = quantizer(ty as usize as sys::ggml_type);
        for c in (ith.max(0) as usize..x.ne[1] as usize).step_by(nth.max(1) as usize) {
            let row = x.data.cast::<u8>().add(c * x.nb[1]).cast::<f32>();
            quantize(row, dst.data.cast::<u8>().add(c * dst.nb[1]).cast(), x.ne[0]);
        }
    }
}

/// The kernels' name as `GgmlModel::kernels` reports it: the instructions and the formats,
/// `mm-avx2(q4_0,q4_1,…)`, or `None` where the graph keeps ggml's `mul_mat`.
pub(crate) fn name() -> Option<String> {
    let mut formats: Vec<&str> = Quant::ALL.into_iter().filter(|&q| verified(q)).map(|q| q.name()).collect();
    if repacked::buffer_type().is_some() {
        formats.push("q4_Kx8");
    }
    isa().filter(|_| !formats.is_empty()).map(|isa| format!("mm-{}({})", isa.name(), formats.join(",")))
}

/// Whether this process multiplies `quant` with our kernel: there is one for this CPU
/// ([`isa`]) and it agreed with ggml's one-row kernel, bit for bit, on a probe when first
/// asked. The kernels follow ggml's arithmetic as its compiler translated it (on ARM, GCC
/// fuses some of ggml's scalar multiply-adds and not its vector ones); a ggml built by
/// another compiler may round otherwise, and then that format keeps ggml's `mul_mat` (and a
/// warning says so) rather than letting a verification pass round unlike a decode step.
pub(crate) fn verified(quant: Quant) -> bool {
    static VERIFIED: OnceLock<Vec<Quant>> = OnceLock::new();
    VERIFIED
        .get_or_init(|| {
            let Some(isa) = isa() else { return Vec::new() };
            Quant::ALL
                .into_iter()
                .filter(|&q| {
                    let agrees = agrees_with_ggml(isa, q);
                    if !agrees {
                        tracing::warn!(
                            format = q.name(),
                            kernels = isa.name(),
                            "our multi-row kernel does not round as this build of ggml does; using ggml's mul_mat for this format"
                        );
                    }
                    agrees
                })
                .collect()
        })
        .contains(&quant)
}

/// Whether `isa`'s kernel for `quant` gives ggml's one-row results bit for bit on random
/// operands: 3 weight rows × 3 activation rows of 3 blocks (so an odd last block too).
fn agrees_with_ggml(isa: Isa, quant: Quant) -> bool {
    let (m, n, k) = (3, 3, 3 * quant.block_len());
    let (w, y) = timing::random_operands(quant, m, n, k, 0x5eed);
    let mut out = vec![f32::NAN; m * n];
    let rows = Rows { w: w.as_ptr().cast(), y: y.as_ptr().cast(), k, n, range: 0..m };
    // SAFETY: an instruction set this CPU has (`isa`); the operands hold m and n rows of k,
    // out m × n.
    unsafe { gemm(isa, quant, rows, out.as_mut_ptr(), m, &mut Work::default()) };
    (0..n).all(|c| {
        (0..m).all(|r| out[c * m + r].to_bits() == timing::one_row_dot(quant, &w, &y, k, r, c).to_bits())
    })
}

/// `w · x` as a ggml custom op, `x` quantized by [`Quantized`]: `[w.ne1, x.ne1]` f32, each
/// row what `ggml_mul_mat` gives. Call only where [`applies`] holds.
fn mul_mat(ctx: &Ctx, w: Tensor, x: Tensor) -> Tensor {
    // SAFETY: `compute` reads a matrix of a format with a kernel and rows of its activation
    // format of the shapes `applies` checked, and chunks of the graph's (its user data); each
    // thread writes the rows of the chunks it claims.
    unsafe {
        ctx.custom(sys::GGML_TYPE_F32, [w.ne()[1], x.ne()[1], 1, 1], &[w, x], Some(compute), ctx.chunks(0))
    }
}

/// Working memory of the kernels: per-tile scales, per-block sums of activations, tiles.
#[derive(Default)]
pub(crate) struct Work {
    pub(crate) floats: Vec<f32>,
    pub(crate) ints: Vec<i32>,
    /// Tiles of activation rows: (first row, rows).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) tiles: Vec<(usize, usize)>,
    /// Activation blocks rearranged for a kernel (as 8-byte words, for alignment).
    pub(crate) acts: Vec<u64>,
}

thread_local! {
    /// Per thread: ggml's thread pool keeps its threads, so this grows once and is reused.
    static WORK: RefCell<Work> = RefCell::new(Work::default());
}

/// ggml's CPU quantizer for activations of type `ty`: what its `mul_mat` applies.
fn quantizer(ty: sys::ggml_type) -> unsafe extern "C" fn(*const f32, *mut c_void, i64) {
    // SAFETY: ggml's CPU type traits are static; the activation types have quantizers on
    // every CPU build.
    unsafe {
        (*sys::ggml_get_type_traits_cpu(ty)).from_float.expect("ggml's CPU backend quantizes activations")
    }
}

/// Weight rows per chunk are a multiple of this, so that every kernel's tiles stay whole.
const ROW_STEP: usize = 4;

/// The custom op's body on thread `ith` of `nth`: chunks of weight rows, claimed one after
/// another (`userdata` is the graph's [`Chunks`] for the node), times every activation row
/// (quantized, as `ggml_mul_mat` quantizes them, by the node before).
///
/// # Safety
/// Only ggml calls it, from its CPU backend's threads, with `dst` the node this module
/// built (its sources as set there) and `userdata` that node's [`Chunks`].
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _ith: c_int, nth: c_int, userdata: *mut c_void) {
    let Some(isa) = isa() else { return };
    // SAFETY: ggml calls this with the tensor `mul_mat` built, its sources and destination
    // allocated, and the graph's chunk counter for it; `applies` checked their types and
    // layout, and the quantized rows are contiguous whole blocks in memory ggml aligns (a
    // fresh node's). Each chunk is claimed by one thread, which writes its rows of dst.
    unsafe {
        let chunks = &*userdata.cast::<Chunks>();
        let (w, y) = (&*(*dst).src[0], &*(*dst).src[1]);
        let Some(quant) = Quant::of(w.type_) else { return };
        let k = w.ne[0] as usize;
        let (m, n) = (w.ne[1] as usize, y.ne[1] as usize);
        let chunk = chunk_size(m, nth.max(1) as usize).next_multiple_of(ROW_STEP);
        WORK.with_borrow_mut(|work| {
            for range in chunks.ranges(m, chunk) {
                let rows = Rows { w: w.data.cast_const().cast(), y: y.data.cast_const().cast(), k, n, range };
                gemm(isa, quant, rows, (*dst).data.cast(), m, work);
            }
        });
    }
}

/// The operands of one call of a kernel: weight rows of `k` weights (from `w`, contiguous,
/// in the weight format), `n` activation rows (from `y`, contiguous, in its activation
/// format), and the weight rows this call computes.
pub(crate) struct Rows {
    pub(crate) w: *const u8,
    pub(crate) y: *const u8,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) range: std::ops::Range<usize>,
}

/// `out[c * ld + r] = dot(weight row r, activation row c)` for `r` in `rows.range` and every
/// activation row `c`, with `isa`'s instructions. `work` is working memory.
///
/// # Safety
/// The CPU must have `isa`'s instructions ([`isa`] chose it); `rows.w` holds `rows.range.end`
/// rows of `quant`, `rows.y` `rows.n` rows of its activation format, both of `rows.k` weights;
/// `out` is valid for writes at every `(c, r)` and not read or written by anyone else there
/// meanwhile, and `rows.range.end <= ld`.
pub(crate) unsafe fn gemm(isa: Isa, quant: Quant, rows: Rows, out: *mut f32, ld: usize, work: &mut Work) {
    assert!(rows.range.end <= ld && rows.k.is_multiple_of(quant.block_len()));
    // SAFETY: by the caller.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::gemm(isa, quant, rows, out, ld, work)
    }
    // SAFETY: by the caller.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        neon::gemm(isa, quant, rows, out, ld, work)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (isa, quant, rows, out, ld, work);
        unreachable!("`isa()` finds no kernels on this architecture");
    }
}

/// `ncols` activation rows split into tiles of at most `width`, as evenly as they go (9 rows
/// in tiles of 8 are 5 + 4, not 8 + 1: a tile costs about as much at one row as at two), as
/// (first row, rows).
pub(crate) fn balanced_tiles(ncols: usize, width: usize) -> impl Iterator<Item = (usize, usize)> {
    let ntiles = ncols.div_ceil(width);
    (0..ntiles).scan(0, move |c0, t| {
        let nc = (ncols - *c0).div_ceil(ntiles - t);
        let tile = (*c0, nc);
        *c0 += nc;
        Some(tile)
    })
}

/// Raw rows of blocks as a slice: `len` blocks of `T` from `p`.
///
/// # Safety
/// `p` points at `len` initialized blocks, aligned for `T`, that live as long as `'a`.
pub(crate) unsafe fn blocks<'a, T>(p: *const u8, len: usize) -> &'a [T] {
    // SAFETY: by the caller.
    unsafe { std::slice::from_raw_parts(p.cast::<T>(), len) }
}

#[cfg(test)]
mod tests;
