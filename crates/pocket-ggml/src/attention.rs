//! Attention over an f16 KV cache in host memory, as a ggml custom op: every query row's
//! arithmetic is fixed by that row alone, whatever the pass size or thread count, and it costs
//! a fraction of ggml's CPU flash attention.
//!
//! ggml's CPU flash attention visits cached positions one at a time for each query row and
//! head: a call to its f16 dot product, a scalar `expf`, and an update of an f16 accumulator
//! (converted to f32 and back for every position). At the 300–500 positions of a chat turn
//! that was 28% of a speculative run's time on this project's CPU (`perf`), as much as all the
//! layers' matrix products; and a verification pass of n tokens pays it n times, which
//! steepens the cost curve that speculation lives on. Its split-KV path for a lone query also
//! rounds differently from the per-row path (see `graph::LoneQuery`).
//!
//! Here the query heads that share a KV head are attended together, so each block of 16
//! cached positions is converted to f32 once for all of them, and each row goes in three
//! vectorised sweeps: the scores (dot products in 16 lanes, summed in a fixed tree), their
//! softmax (an `exp` of our own, branch-free so that it vectorises), and the weighted sum of
//! V rows accumulated in f32. Positions past a row's causal limit (the cache is read in
//! lengths padded to 256) are not visited. The result for a row depends only on its query,
//! the cached K and V and its mask row: a row of a verification pass is bitwise what decoding
//! that token alone gives, by construction.
//!
//! It accumulates in f32 where ggml accumulates V in f16, and keeps the query in f32 where
//! ggml rounds it to f16. SmolLM2's logits are sensitive to that: they move against
//! llama.cpp's by up to about one at some positions, as ggml's own one-row and tiled
//! attention paths differ by. So the parity tests check the rest of the graph to llama.cpp's
//! rounding with ggml's attention (`AttentionKernel::Ggml`), and hold this kernel to an exact
//! softmax (its unit test) and to top-1 agreement with llama.cpp. Quantized and f32 caches,
//! GPU caches and head sizes that are not a multiple of 16 keep ggml's flash attention; so
//! does everything when `POCKET_GGML_FLASH_ATTN=1` is set, for comparing the two.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;

use crate::ffi::chunks::{Chunks, chunk_size};
use crate::ffi::graph::{Ctx, Tensor};
use crate::kv::KvLayout;

/// The attention kernel of a model's graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// Our own where it applies (an f16 cache in host memory): several times cheaper per
    /// query row, f32 throughout, every row independent of the pass (see `attention.rs`).
    /// Elsewhere ggml's.
    #[default]
    Auto,
    /// ggml's flash attention everywhere, as llama.cpp computes it: for checking the rest of
    /// the graph against llama.cpp bit for bit (its f16 accumulation rounds differently).
    Ggml,
}

/// Lanes of the fixed-width partial sums, and positions per block of converted K and V.
const LANES: usize = 16;
/// Query rows attended together (sharing each converted block).
const BATCH: usize = 8;
/// f16 −∞, as the causal mask holds it.
const F16_NEG_INF: u16 = 0xFC00;

/// The instruction set the op's loops are compiled for; results are the same on all of
/// them (lane-wise arithmetic, fused multiply-adds, fixed reduction trees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// AVX-512F with FMA.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// AVX2 with FMA.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// The target's baseline (NEON on aarch64, where FMA is part of it).
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    Baseline,
}

impl Kernel {
    /// A short name, as `GgmlModel::kernels` reports it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "attn-avx512",
            Kernel::Avx2 => "attn-avx2",
            Kernel::Baseline => "attn",
        }
    }
}

/// The kernel this process uses, or `None` where the graph keeps ggml's flash attention.
pub(crate) fn kernel() -> Option<Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if std::env::var_os("POCKET_GGML_FLASH_ATTN").is_some_and(|v| v == "1") {
            return None;
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Option<Kernel> {
    // Without FMA, `f32::mul_add` would be a call into libm for every lane.
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    if is_x86_feature_detected!("avx512f") { Some(Kernel::Avx512) } else { Some(Kernel::Avx2) }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Option<Kernel> {
    Some(Kernel::Baseline)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Option<Kernel> {
    None
}

/// Whether the graph attends over `kv` with [`attend`]: an f16 cache in host memory, heads of
/// a multiple of 16, and a [`Kernel`] for this CPU.
pub(crate) fn applies(kv: &KvLayout, head_dim: usize) -> bool {
    kv.is_f16() && kernel_for(kv.in_host_memory(), head_dim).is_some()
}

/// The kernel that attends over an f16 cache of heads of `head_dim`, in host memory or not.
pub(crate) fn kernel_for(host_memory: bool, head_dim: usize) -> Option<Kernel> {
    kernel().filter(|_| host_memory && head_dim.is_multiple_of(LANES))
}

/// Attention of `q` (`[head_dim, n_head, n_tokens]`, f32, contiguous) over the cached `k` and
/// `v` (`[head_dim, n_head_kv, n_kv]` f16 views of the cache) under `mask` (`[n_kv, n_tokens]`,
/// f16, 0 or −∞), scores scaled by `scale`: `[head_dim · n_head, n_tokens]` f32, the layout
/// ggml's flash attention gives after its reshape. Call only where [`applies`] holds.
pub(crate) fn attend(ctx: &Ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: f32) -> Tensor {
    debug_assert!(q.ne()[1] % k.ne()[1] == 0 && k.ty() == sys::GGML_TYPE_F16);
    let ne = [q.ne()[0] * q.ne()[1], q.ne()[2], 1, 1];
    // The scale travels with the node's chunk counter, as its bits.
    let userdata = ctx.chunks(u64::from(scale.to_bits()));
    // SAFETY: `compute` reads sources of exactly these shapes (documented above, checked by
    // `applies` and the graph) and the graph's chunks for the node; each chunk of query rows is
    // claimed by one thread, which writes those rows of the destination.
    unsafe { ctx.custom(sys::GGML_TYPE_F32, ne, &[q, k, v, mask], Some(compute), userdata) }
}

/// Per-thread working memory, grown once and reused (ggml's pool keeps its threads).
#[derive(Default)]
struct Scratch {
    /// The batch's queries, `BATCH × head_dim`.
    q: Vec<f32>,
    /// One block of K or V rows of one KV head, converted: `LANES × head_dim`.
    block: Vec<f32>,
    /// Scores, then softmax weights: `BATCH × n_kv`.
    p: Vec<f32>,
    /// Weighted sums of V: `BATCH × head_dim`.
    out: Vec<f32>,
    /// A row's visible scores packed together (a tree's row, see [`holes_from`]).
    packed: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Shapes and strides the op reads, from its tensors.
struct Shape {
    head_dim: usize,
    n_head: usize,
    n_tokens: usize,
    n_head_kv: usize,
    n_kv: usize,
    /// The scores' scale.
    scale: f32,
}

/// One query row: token `t`, head `h`, attending to positions `..limit`.
#[derive(Clone, Copy)]
struct Query {
    t: usize,
    h: usize,
    limit: usize,
}

/// # Safety
/// Only ggml calls it, from its CPU backend's threads, with `dst` the node this module
/// built (its sources as set there) and `userdata` that node's [`Chunks`].
unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _ith: c_int, nth: c_int, userdata: *mut c_void) {
    // SAFETY: the graph's chunk counter for this node (`attend`).
    let chunks = unsafe { &*userdata.cast::<Chunks>() };
    let scale = f32::from_bits(chunks.data as u32);
    if let Some(kernel) = kernel() {
        // SAFETY: ggml calls this with the tensor `attend` built, its sources and destination
        // allocated.
        unsafe { compute_with(kernel, dst, chunks, nth, scale) }
    }
}

/// The op's body on one of `nth` threads, with `kernel`: chunks of query rows, claimed one
/// after another.
///
/// # Safety
/// `dst` is the tensor [`attend`] built, its sources and destination allocated, and `chunks`
/// its counter; the CPU has `kernel`'s instructions.
unsafe fn compute_with(kernel: Kernel, dst: *mut sys::ggml_tensor, chunks: &Chunks, nth: c_int, scale: f32) {
    // SAFETY: by the caller; each chunk of (token, head) rows is claimed by one thread, which
    // alone writes them.
    unsafe {
        let (q, k, v, mask) = (&*(*dst).src[0], &*(*dst).src[1], &*(*dst).src[2], &*(*dst).src[3]);
        let shape = Shape {
            head_dim: q.ne[0] as usize,
            n_head: q.ne[1] as usize,
            n_tokens: q.ne[2] as usize,
            n_head_kv: k.ne[1] as usize,
            n_kv: k.ne[2] as usize,
            scale,
        };
        let group = shape.n_head / shape.n_head_kv;
        // Queries in order of KV head, so that a thread's share is a few runs over one head.
        let total = shape.n_head * shape.n_tokens;
        let chunk = chunk_size(total, nth.max(1) as usize);
        let query = |i: usize| {
            let (g, r) = (i / (group * shape.n_tokens), i % (group * shape.n_tokens));
            let (t, h) = (r / group, g * group + r % group);
            let row = std::slice::from_raw_parts(
                mask.data.cast::<u8>().add(t * mask.nb[1]).cast::<u16>(),
                shape.n_kv,
            );
            Query { t, h, limit: row.iter().rposition(|&m| m != F16_NEG_INF).map_or(0, |p| p + 1) }
        };
        SCRATCH.with_borrow_mut(|s| {
            for range in chunks.ranges(total, chunk) {
                let (mut i, i1) = (range.start, range.end);
                while i < i1 {
                    let g = i / (group * shape.n_tokens);
                    let end = i1.min((g + 1) * group * shape.n_tokens).min(i + BATCH);
                    let mut queries = [Query { t: 0, h: 0, limit: 0 }; BATCH];
                    for (slot, j) in queries.iter_mut().zip(i..end) {
                        *slot = query(j);
                    }
                    let batch = &queries[..end - i];
                    match kernel {
                        #[cfg(target_arch = "x86_64")]
                        Kernel::Avx512 => attend_avx512(&shape, g, batch, q, k, v, mask, dst, s),
                        #[cfg(target_arch = "x86_64")]
                        Kernel::Avx2 => attend_avx2(&shape, g, batch, q, k, v, mask, dst, s),
                        _ => attend_batch::<false>(&shape, g, batch, q, k, v, mask, dst, s),
                    }
                    i = end;
                }
            }
        });
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
/// # Safety
/// The CPU must have the instructions it is compiled for (`attend` checked them), and
/// `q`, `k`, `v`, `mask` and `dst` must be the node's tensors as `shape` describes them.
unsafe fn attend_avx512(
    shape: &Shape,
    g: usize,
    batch: &[Query],
    q: &sys::ggml_tensor,
    k: &sys::ggml_tensor,
    v: &sys::ggml_tensor,
    mask: &sys::ggml_tensor,
    dst: *mut sys::ggml_tensor,
    s: &mut Scratch,
) {
    // SAFETY: by the caller; this function has F16C.
    unsafe { attend_batch::<true>(shape, g, batch, q, k, v, mask, dst, s) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
/// # Safety
/// The CPU must have the instructions it is compiled for (`attend` checked them), and
/// `q`, `k`, `v`, `mask` and `dst` must be the node's tensors as `shape` describes them.
unsafe fn attend_avx2(
    shape: &Shape,
    g: usize,
    batch: &[Query],
    q: &sys::ggml_tensor,
    k: &sys::ggml_tensor,
    v: &sys::ggml_tensor,
    mask: &sys::ggml_tensor,
    dst: *mut sys::ggml_tensor,
    s: &mut Scratch,
) {
    // SAFETY: by the caller; this function has F16C.
    unsafe { attend_batch::<true>(shape, g, batch, q, k, v, mask, dst, s) }
}

/// Attend the queries of `batch`, all of KV head `g`, and write their rows of `dst`.
/// `F16C`: convert f16 with x86's F16C instructions inline (else with ggml's converter).
///
/// # Safety
/// The tensors are the op's, allocated, with the shapes [`attend`] documents; with `F16C`,
/// the CPU has F16C and the caller is compiled for it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_batch<const F16C: bool>(
    shape: &Shape,
    g: usize,
    batch: &[Query],
    q: &sys::ggml_tensor,
    k: &sys::ggml_tensor,
    v: &sys::ggml_tensor,
    mask: &sys::ggml_tensor,
    dst: *mut sys::ggml_tensor,
    s: &mut Scratch,
) {
    let hd = shape.head_dim;
    let n_kv = shape.n_kv;
    let scale = shape.scale;
    let longest = batch.iter().map(|b| b.limit).max().unwrap_or(0);
    s.q.resize(BATCH * hd, 0.0);
    s.block.resize(LANES * hd, 0.0);
    s.p.resize(BATCH * n_kv, 0.0);
    s.out.clear();
    s.out.resize(BATCH * hd, 0.0);
    // SAFETY: every offset is within the tensors by the shapes above; K and V rows below
    // `longest` are positions the pass wrote or the cache held.
    unsafe {
        for (b, query) in batch.iter().enumerate() {
            let src = q.data.cast::<u8>().add(query.t * q.nb[2] + query.h * q.nb[1]).cast::<f32>();
            s.q[b * hd..(b + 1) * hd].copy_from_slice(std::slice::from_raw_parts(src, hd));
        }
        // Convert rows c.. (up to LANES) of KV head g of `cache` to f32 in `block`.
        let convert = |cache: &sys::ggml_tensor, c: usize, n: usize, block: &mut [f32]| {
            for j in 0..n {
                let row = cache.data.cast::<u8>().add((c + j) * cache.nb[2] + g * cache.nb[1]);
                f16_to_f32::<F16C>(row.cast(), &mut block[j * hd..(j + 1) * hd]);
            }
        };

        // Scores: q·k scaled, plus the mask.
        for c in (0..longest).step_by(LANES) {
            let n = LANES.min(longest - c);
            convert(k, c, n, &mut s.block);
            for (b, query) in batch.iter().enumerate() {
                let qb = &s.q[b * hd..(b + 1) * hd];
                for j in 0..n.min(query.limit.saturating_sub(c)) {
                    let score = dot(qb, &s.block[j * hd..(j + 1) * hd]) * scale;
                    s.p[b * n_kv + c + j] = score + mask_value(mask, query.t, c + j);
                }
            }
        }
        // Softmax weights (unnormalised) and their sum.
        let mut sums = [0f32; BATCH];
        for (b, query) in batch.iter().enumerate() {
            let scores = &mut s.p[b * n_kv..b * n_kv + query.limit];
            sums[b] = match holes_from(mask, query) {
                None => softmax_weights(scores),
                Some(h) => softmax_weights_around_holes(scores, h, &mut s.packed),
            };
        }
        // Weighted sums of V rows, in position order, in registers: 64 channels at a time
        // where the head has a multiple of 64 (eight independent chains of multiply-adds per
        // position; with 16, two chains waited on the multiply-add's latency), else 16.
        for c in (0..longest).step_by(LANES) {
            let n = LANES.min(longest - c);
            convert(v, c, n, &mut s.block);
            for (b, query) in batch.iter().enumerate() {
                let p = &s.p[b * n_kv + c..b * n_kv + c + n.min(query.limit.saturating_sub(c))];
                let out = &mut s.out[b * hd..(b + 1) * hd];
                if hd.is_multiple_of(WIDE) {
                    weighted_sum::<WIDE>(out, p, &s.block, hd);
                } else {
                    weighted_sum::<LANES>(out, p, &s.block, hd);
                }
            }
        }
        for (b, query) in batch.iter().enumerate() {
            let inv = if sums[b] == 0.0 { 0.0 } else { 1.0 / sums[b] };
            let row = (*dst).data.cast::<u8>().add(query.t * (*dst).nb[1]).cast::<f32>().add(query.h * hd);
            let row = std::slice::from_raw_parts_mut(row, hd);
            for (o, &x) in row.iter_mut().zip(&s.out[b * hd..(b + 1) * hd]) {
                *o = x * inv;
            }
        }
    }
}

/// Most positions before a row's limit where a tree of drafts can mask rows out: a tree is one
/// pass of at most this many tokens (the pending one and a draft).
const TREE_SPAN: usize = 32;

/// Where masked positions interrupt `query`'s visible ones, if they do: the first such
/// position. Only a tree of drafts leaves such holes (its rows see their own path, not the
/// other branches), and only among its own rows, the last [`TREE_SPAN`] before the limit;
/// a sequence's row sees one run of positions (from the start, or a sliding window's).
///
/// # Safety
/// `mask` is an allocated f16 tensor with a row `query.t` of at least `query.limit` values.
#[inline(always)]
unsafe fn holes_from(mask: &sys::ggml_tensor, query: &Query) -> Option<usize> {
    // SAFETY: by the caller.
    let row = unsafe {
        std::slice::from_raw_parts(
            mask.data.cast::<u8>().add(query.t * mask.nb[1]).cast::<u16>(),
            query.limit,
        )
    };
    let tail = query.limit.saturating_sub(TREE_SPAN);
    let first_visible = tail + row[tail..].iter().position(|&m| m != F16_NEG_INF)?;
    row[first_visible..].iter().position(|&m| m == F16_NEG_INF).map(|h| first_visible + h)
}

/// [`softmax_weights`] of a row whose positions from `hole` on are partly masked (a tree's
/// row): its visible scores are packed together first, so that each lands in the lane it
/// holds in the row of the same path decoded as a sequence, and the sum is bitwise that
/// row's; then the weights go back to their positions, 0 at the masked ones.
fn softmax_weights_around_holes(scores: &mut [f32], hole: usize, packed: &mut Vec<f32>) -> f32 {
    packed.clear();
    packed.extend_from_slice(&scores[..hole]);
    packed.extend(scores[hole..].iter().copied().filter(|&x| x != f32::NEG_INFINITY));
    let sum = softmax_weights(packed);
    scores[..hole].copy_from_slice(&packed[..hole]);
    let mut visible = packed[hole..].iter();
    for x in &mut scores[hole..] {
        *x = if *x == f32::NEG_INFINITY { 0.0 } else { visible.next().copied().unwrap_or(0.0) };
    }
    sum
}

/// The mask's value for token `t` at position `c`: 0 nearly always, so converted only when not.
///
/// # Safety
/// `mask` is an allocated f16 tensor with a row `t` of more than `c` values.
#[inline(always)]
unsafe fn mask_value(mask: &sys::ggml_tensor, t: usize, c: usize) -> f32 {
    // SAFETY: by the caller.
    unsafe {
        let m = *mask.data.cast::<u8>().add(t * mask.nb[1]).cast::<u16>().add(c);
        if m == 0 { 0.0 } else { sys::ggml_fp16_to_fp32(m) }
    }
}

/// `a · b` (lengths a multiple of [`LANES`]): lane-wise fused multiply-adds, then a fixed tree.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    tree_sum(acc)
}

/// Channels of V summed at once by [`weighted_sum`] where the head has a multiple of them.
const WIDE: usize = 4 * LANES;

/// `out[ch] += p[j] · block[j][ch]` over the positions `j` in order, for every channel `ch` of
/// `out` (rows of `hd` channels in `block`), `W` channels at a time held in registers. Each
/// channel's sum is the same chain of fused multiply-adds whatever `W` is.
#[inline(always)]
fn weighted_sum<const W: usize>(out: &mut [f32], p: &[f32], block: &[f32], hd: usize) {
    for (i, out) in out.chunks_exact_mut(W).enumerate() {
        let mut acc = [0f32; W];
        acc.copy_from_slice(out);
        for (j, &pj) in p.iter().enumerate() {
            // A weight of 0 (a masked position) adds nothing: skipping it keeps whatever the
            // row holds from mattering.
            if pj != 0.0 {
                let x = &block[j * hd + i * W..j * hd + (i + 1) * W];
                for l in 0..W {
                    acc[l] = pj.mul_add(x[l], acc[l]);
                }
            }
        }
        out.copy_from_slice(&acc);
    }
}

/// The sum of 16 lanes, halving: the same order wherever it runs.
#[inline(always)]
fn tree_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Convert `dst.len()` (a multiple of 8) f16 values from `src`.
///
/// # Safety
/// `src` holds `dst.len()` values; with `F16C`, as for [`attend_batch`].
#[inline(always)]
unsafe fn f16_to_f32<const F16C: bool>(src: *const u16, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
        for (i, out) in dst.chunks_exact_mut(8).enumerate() {
            // SAFETY: by the caller: 8 values at src + 8i, and F16C.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr(),
                    _mm256_cvtph_ps(_mm_loadu_si128(src.add(8 * i).cast::<__m128i>())),
                )
            };
        }
        return;
    }
    // SAFETY: by the caller.
    unsafe { sys::ggml_cpu_fp16_to_fp32(src.cast(), dst.as_mut_ptr(), dst.len() as i64) };
}

/// Replace scores by `exp(score − max)` and return their sum (in 16 lanes, then a tree).
#[inline(always)]
fn softmax_weights(scores: &mut [f32]) -> f32 {
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut chunks = scores.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            max[l] = max[l].max(c[l]);
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        max[l] = max[l].max(x);
    }
    let max = max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        scores.fill(0.0);
        return 0.0;
    }
    let mut sum = [0f32; LANES];
    let mut chunks = scores.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            c[l] = exp(c[l] - max);
            sum[l] += c[l];
        }
    }
    for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
        *x = exp(*x - max);
        sum[l] += *x;
    }
    tree_sum(sum)
}

/// `e^x` for `x ≤ 0` to within about 2 ulp, 0 below −87 (where it is under f32's normal
/// range, and as a softmax weight beside the maximum's 1 it is nothing). Branch-free, so a
/// loop over it vectorises; the same result on every instruction set.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n·LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(-87.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, xc));
    // Cephes' expf polynomial on |r| ≤ ln2/2.
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let y = (p * r).mul_add(r, r) + 1.0;
    // 2^n from the bits of n + 127 + 2²³, whose low mantissa bits are that integer (no
    // float-to-int conversion, which would not vectorise as well).
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() & 0xFF;
    let pow2n = f32::from_bits(biased << 23);
    if x < -87.0 { 0.0 } else { y * pow2n }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value() {
        let mut x = -87.0f32;
        while x <= 0.0 {
            let got = exp(x);
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits().abs_diff(got.to_bits());
            assert!(ulp <= 2, "exp({x}) = {got}, want {want} ({ulp} ulp)");
            x += 0.0137;
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn softmax_weights_sum_and_skip_nothing() {
        let mut s: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
        let want: Vec<f64> = {
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            s.iter().map(|&x| (x as f64 - m).exp()).collect()
        };
        let sum = softmax_weights(&mut s);
        let want_sum: f64 = want.iter().sum();
        assert!((sum as f64 - want_sum).abs() < 1e-5 * want_sum);
        for (a, b) in s.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}

#[cfg(test)]
mod op_tests {
    use super::*;

    /// A host tensor over `data` with shape `ne` (contiguous unless `nb` is given).
    fn tensor<T>(
        data: &mut [T],
        ty: sys::ggml_type,
        ne: [i64; 4],
        nb: Option<[usize; 4]>,
    ) -> sys::ggml_tensor {
        // SAFETY: ggml_tensor is a plain C struct; all-zero is a valid (empty) value.
        let mut t: sys::ggml_tensor = unsafe { std::mem::zeroed() };
        t.type_ = ty;
        t.ne = ne;
        let es = size_of::<T>();
        t.nb = nb.unwrap_or([
            es,
            es * ne[0] as usize,
            es * (ne[0] * ne[1]) as usize,
            es * (ne[0] * ne[1] * ne[2]) as usize,
        ]);
        t.data = data.as_mut_ptr().cast();
        t
    }

    fn f16(x: f32) -> u16 {
        // SAFETY: a pure conversion.
        unsafe { sys::ggml_fp32_to_fp16(x) }
    }

    #[test]
    fn matches_a_plain_softmax_attention_with_the_same_bits_on_every_kernel() {
        let Some(_) = kernel() else { return };
        crate::ffi::init();
        let (hd, n_head, n_head_kv, n_tokens, n_kv, pos0) =
            (32usize, 4usize, 2usize, 3usize, 256usize, 5usize);
        let held = pos0 + n_tokens;
        let val = |i: usize, salt: f32| (i as f32 * 0.731 + salt).sin() * 1.5;
        let mut q: Vec<f32> = (0..hd * n_head * n_tokens).map(|i| val(i, 0.3)).collect();
        // The cache: one row per position holding every KV head; garbage past `held`.
        let row = hd * n_head_kv;
        let mut k: Vec<u16> =
            (0..row * n_kv).map(|i| if i < row * held { f16(val(i, 1.1)) } else { 0x7E00 }).collect();
        let mut v: Vec<u16> =
            (0..row * n_kv).map(|i| if i < row * held { f16(val(i, 2.7)) } else { 0x7E00 }).collect();
        let mut mask: Vec<u16> = vec![F16_NEG_INF; n_kv * n_tokens];
        for t in 0..n_tokens {
            mask[t * n_kv..t * n_kv + pos0 + t + 1].fill(0);
        }
        let mut out = vec![0f32; hd * n_head * n_tokens];
        let kv_nb = Some([2, 2 * hd, 2 * row, 2 * row * n_kv]);
        let mut qt = tensor(&mut q, sys::GGML_TYPE_F32, [hd as i64, n_head as i64, n_tokens as i64, 1], None);
        let mut kt = tensor(&mut k, sys::GGML_TYPE_F16, [hd as i64, n_head_kv as i64, n_kv as i64, 1], kv_nb);
        let mut vt = tensor(&mut v, sys::GGML_TYPE_F16, [hd as i64, n_head_kv as i64, n_kv as i64, 1], kv_nb);
        let mut mt = tensor(&mut mask, sys::GGML_TYPE_F16, [n_kv as i64, n_tokens as i64, 1, 1], None);
        let mut dst =
            tensor(&mut out, sys::GGML_TYPE_F32, [(hd * n_head) as i64, n_tokens as i64, 1, 1], None);
        dst.src[0] = &mut qt;
        dst.src[1] = &mut kt;
        dst.src[2] = &mut vt;
        dst.src[3] = &mut mt;
        #[cfg(target_arch = "x86_64")]
        let kernels = {
            let mut kernels = vec![Kernel::Baseline, Kernel::Avx2];
            if is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Avx512);
            }
            kernels
        };
        #[cfg(not(target_arch = "x86_64"))]
        let kernels = [Kernel::Baseline];
        let mut first: Option<Vec<f32>> = None;
        let pass = crate::ffi::chunks::PassCount::default();
        let chunks = Chunks::new(&pass, 0);
        for (kernel, nth) in kernels.iter().flat_map(|&k| [(k, 1), (k, 3)]) {
            pass.next();
            for _ in 0..nth {
                // SAFETY: the tensors above, shaped as `attend` documents; `kernel()` found
                // AVX2 and FMA (the test returned early otherwise).
                unsafe { compute_with(kernel, &mut dst, &chunks, nth, 1.0 / (hd as f32).sqrt()) };
            }
            // Every kernel and thread count gives the same bits.
            match &first {
                None => first = Some(out.clone()),
                Some(f) => assert!(
                    f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kernel:?} on {nth} threads differs from {:?} on 1",
                    kernels[0]
                ),
            }
            // SAFETY: a pure conversion.
            let to32 = |x: u16| -> f64 { f64::from(unsafe { sys::ggml_fp16_to_fp32(x) }) };
            for t in 0..n_tokens {
                for h in 0..n_head {
                    let g = h / (n_head / n_head_kv);
                    let qv = &q[(t * n_head + h) * hd..][..hd];
                    let scores: Vec<f64> = (0..pos0 + t + 1)
                        .map(|c| {
                            let kr = &k[c * row + g * hd..][..hd];
                            qv.iter().zip(kr).map(|(&a, &b)| f64::from(a) * to32(b)).sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for d in 0..hd {
                        let want: f64 =
                            w.iter().enumerate().map(|(c, p)| p * to32(v[c * row + g * hd + d])).sum::<f64>()
                                / sum;
                        let got = f64::from(out[t * hd * n_head + h * hd + d]);
                        assert!((got - want).abs() < 1e-5, "nth {nth} t {t} h {h} d {d}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
