//! The decoder's forward graph, built per pass from the layers a [`LayerPlan`] runs.
//!
//! It follows llama.cpp's graphs (`src/models/*.cpp`) op for op — each architecture's layer
//! is in `arch/`, built from the helpers of [`Builder`] — so that our logits can be checked
//! against llama.cpp's. What differs is what llama.cpp cannot do: a skipped layer is simply
//! not built (the residual stream passes through), the KV cache is ours, and on the CPU two
//! kernels are ours (multi-row Q4_1 products and attention over an f16 cache), each computing
//! a row of a pass independently of the others.
//!
//! A pass can carry several sessions' tokens ([`Segment`]s): the rows go through every matrix
//! product together — one read of the weights for all of them — and each session's rows
//! attend over its own cache. Every op but attention works row by row, and attention works
//! per segment as it would alone, so each row is what that session's pass alone computes.

mod builder;
pub(crate) mod inputs;

pub(crate) use builder::{Act, Builder};

use llama_cpp_sys_2 as sys;
use pocket_core::LayerPlan;

use crate::attention;
use crate::attention::AttentionKernel;
use crate::ffi::graph::{Ctx, Tensor};
use crate::hparams::Hparams;
use crate::kv::{KV_PAD, KvLayout};
use crate::weights::{LayerWeights, Weights};

/// Nodes (and leaves) a graph of up to `segments` segments may hold: about 30 per layer, with
/// room to spare, and up to 30 more per layer for each segment after the first (its views of
/// Q, K and V, rotations, cache writes, attention, the join).
pub(crate) fn graph_nodes(hp: &Hparams, segments: usize) -> usize {
    ((64 + 32 * segments.saturating_sub(1)) * hp.n_layer + 256).next_power_of_two()
}

/// The shape of one session's part of a forward pass: everything the graph's structure
/// depends on. Positions are inputs, not part of the shape, so consecutive decode steps share
/// a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassShape {
    /// Tokens in the pass.
    pub(crate) n_tokens: usize,
    /// Cache positions attention reads: the tokens held after the pass, padded to [`KV_PAD`].
    pub(crate) n_kv: usize,
    /// Rows of logits wanted: the last `n_out` tokens of the pass (0 = fill the cache only).
    pub(crate) n_out: usize,
    /// Query rows attention computes (the tokens, or two for [`LoneQuery::Duplicated`]).
    pub(crate) q_rows: usize,
    /// How a single-token pass keeps off ggml's split-KV path ([`lone_query`]).
    pub(crate) lone_query: LoneQuery,
    /// Whether attention is our own ([`attention`]) rather than ggml's flash attention.
    pub(crate) own_attention: bool,
}

impl PassShape {
    /// The shape of a pass of `n_tokens` tokens starting at `pos0` in `kv`, the cache of a
    /// model with hyperparameters `hp` whose graph attends with `attention`.
    pub(crate) fn new(
        pos0: usize,
        n_tokens: usize,
        n_out: usize,
        kv: &KvLayout,
        hp: &Hparams,
        attention: AttentionKernel,
    ) -> Self {
        let n_kv = (pos0 + n_tokens).next_multiple_of(KV_PAD).min(kv.n_ctx());
        let own_attention = attention == AttentionKernel::Auto && attention::applies(kv, hp.head_dim);
        let lone_query =
            if own_attention { LoneQuery::No } else { lone_query(n_tokens, n_kv, kv, hp.n_head_kv) };
        let q_rows = if lone_query == LoneQuery::Duplicated { 2 } else { n_tokens };
        PassShape { n_tokens, n_kv, n_out, q_rows, lone_query, own_attention }
    }

    /// This shape of a single token (with no lone-query layout), computed as `rows` rows: the
    /// token repeated, every row kept to the end (its logits are row 0), the cache read as for
    /// the one token.
    pub(crate) fn with_rows(self, rows: usize) -> Self {
        debug_assert!(self.n_tokens == 1 && self.lone_query == LoneQuery::No);
        PassShape { n_tokens: rows, n_out: rows, q_rows: rows, ..self }
    }
}

/// One session's part of a pass: the cache its rows attend over and write to, and its shape.
/// A pass's rows are its segments' tokens, one segment after another.
#[derive(Clone, Copy)]
pub(crate) struct Segment<'a> {
    pub(crate) kv: &'a KvLayout,
    pub(crate) shape: PassShape,
}

/// The inputs of a graph, set before each computation.
pub(crate) struct Inputs {
    /// Every row's token and position, segment after segment.
    pub(crate) tokens: Tensor,
    pub(crate) pos: Tensor,
    /// Rows of the last layer whose logits are wanted (none: all of them).
    pub(crate) out_ids: Option<Tensor>,
    /// Hadamard rotations applied around a quantized K (and Q) and V cache.
    pub(crate) k_rot: Option<Tensor>,
    pub(crate) v_rot: Option<Tensor>,
    /// Each segment's own.
    pub(crate) segments: Vec<SegmentInputs>,
}

/// The inputs of one segment.
pub(crate) struct SegmentInputs {
    /// The causal mask, `[n_kv, q_rows]`.
    pub(crate) mask: Tensor,
    /// The causal mask of sliding-window layers, where the model has them.
    pub(crate) mask_swa: Option<Tensor>,
    /// Cache rows the segment writes K and V to (its positions).
    pub(crate) kv_idxs: Tensor,
}

/// A built graph: its context, inputs and logits.
pub(crate) struct Graph {
    pub(crate) ctx: Ctx,
    pub(crate) inputs: Inputs,
    pub(crate) logits: Option<Tensor>,
}

/// Sizes of the Hadamard rotations for a quantized cache, as llama.cpp chooses them: K (and
/// Q) by the largest power of two ≥ 64 dividing the head size, V by 64. Rotating spreads
/// outlier channels over the block before quantization, which is most of q4_0's error; the
/// rotation is orthonormal and its own inverse, so attention scores are unchanged, and the
/// attention output is rotated back.
pub(crate) fn rotation_sizes(
    hp: &Hparams,
    k_quantized: bool,
    v_quantized: bool,
) -> (Option<usize>, Option<usize>) {
    let k = (k_quantized && hp.head_dim.is_multiple_of(64)).then(|| {
        let mut n = 64;
        while hp.head_dim.is_multiple_of(2 * n) {
            n *= 2;
        }
        n
    });
    let v = (v_quantized && hp.head_dim.is_multiple_of(64)).then_some(64);
    (k, v)
}

/// The orthonormal Walsh-Hadamard matrix of size `n` (a power of two), row-major.
pub(crate) fn hadamard(n: usize) -> Vec<f32> {
    let mut h = vec![0.0f32; n * n];
    h[0] = 1.0 / (n as f32).sqrt();
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

/// What builds one layer of an architecture (each file under `arch/` has one) on the residual stream:
/// `None` when the pass only fills the cache and nothing reads this layer's output.
pub(crate) type LayerFn = fn(&Builder, &LayerWeights, usize, Tensor) -> Option<Tensor>;

/// Build the forward graph of a pass over `segments` (at least one) for the layers of `plan`
/// in `ctx`, each built by `layer`.
pub(crate) fn build(
    ctx: Ctx,
    (hp, layer): (&Hparams, LayerFn),
    w: &Weights,
    plan: &LayerPlan,
    segments: &[Segment<'_>],
) -> Graph {
    use sys::{GGML_TYPE_F16 as F16, GGML_TYPE_F32 as F32, GGML_TYPE_I32 as I32, GGML_TYPE_I64 as I64};
    assert!(!segments.is_empty(), "a pass of no segments");
    let n_tokens: usize = segments.iter().map(|s| s.shape.n_tokens).sum();
    let n_out: usize = segments.iter().map(|s| s.shape.n_out).sum();
    // Every segment of a quantized cache is rotated with the same matrices (their sizes
    // depend on the model only).
    let k_quantized = segments.iter().any(|s| s.kv.k_quantized());
    let v_quantized = segments.iter().any(|s| s.kv.v_quantized());
    let (k_rot, v_rot) = rotation_sizes(hp, k_quantized, v_quantized);
    // One segment's inputs keep llama.cpp's names; more are numbered.
    let named = |name: &str, i: usize| if i == 0 { name.to_owned() } else { format!("{name}.{i}") };
    let inputs = Inputs {
        tokens: ctx.input(I32, &[n_tokens as i64], "inp_tokens"),
        pos: ctx.input(I32, &[n_tokens as i64], "inp_pos"),
        out_ids: (n_out > 0 && n_out < n_tokens).then(|| ctx.input(I32, &[n_out as i64], "inp_out_ids")),
        k_rot: k_rot.map(|n| ctx.input(F32, &[n as i64, n as i64], "k_rot")),
        v_rot: v_rot.map(|n| ctx.input(F32, &[n as i64, n as i64], "v_rot")),
        segments: segments
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (n_kv, q_rows) = (s.shape.n_kv as i64, s.shape.q_rows as i64);
                SegmentInputs {
                    mask: ctx.input(F16, &[n_kv, q_rows], &named("kq_mask", i)),
                    mask_swa: hp
                        .swa
                        .is_some()
                        .then(|| ctx.input(F16, &[n_kv, q_rows], &named("kq_mask_swa", i))),
                    kv_idxs: ctx.input(I64, &[s.shape.n_tokens as i64], &named("kv_idxs", i)),
                }
            })
            .collect(),
    };
    let last_layer = plan.layers().last().unwrap_or(0);
    let logits = {
        let b = Builder {
            ctx: &ctx,
            hp,
            w,
            segments,
            n_tokens,
            n_out,
            inp: &inputs,
            last_layer,
            quantized: Default::default(),
        };
        // The first node's name carries the pass's rows and outputs. ggml-openvino keys the
        // models it compiles by node count and first and last names only, and runs a pass of
        // any width on the model it compiled from the first graph of its key; translated from
        // a width that equals another of the graph's sizes (1, the KV heads, the heads, the
        // head size), that model reads heads as tokens or fails at other widths.
        let first = format!("inp_embd.{n_tokens}.{n_out}");
        let mut x = ctx.name(ctx.get_rows(w.tok_embd, inputs.tokens), &first, None);
        if let Some(s) = hp.embd_scale {
            x = ctx.name(ctx.scale(x, s), "inp_embd", None);
        }
        let mut x = Some(x);
        for il in plan.layers() {
            x = x.and_then(|x| layer(&b, &w.layers[il], il, x));
        }
        // A pass that only fills the cache has no output: its last layer returned None.
        x.map(|x| {
            let h = ctx.name(ctx.mul(ctx.rms_norm(x, hp.rms_eps), w.output_norm), "result_norm", None);
            let mut logits = b.linear(w.output, None, h);
            if let Some(c) = hp.logit_softcap {
                logits = ctx.scale(ctx.tanh(ctx.scale(logits, 1.0 / c)), c);
            }
            let logits = ctx.name(logits, "result_output", None);
            ctx.output(logits);
            ctx.expand(logits);
            logits
        })
    };
    Graph { ctx, inputs, logits }
}

/// Fill the causal mask of a pass: query `i` (at `p = pos0 + i`) sees cache positions
/// `0..=p` of the `n_kv` it reads — or, with a sliding `window`, only `p + 1 − window..=p`, as
/// llama.cpp's `is_masked_swa` has it; the padding past them is masked. Query rows past the
/// tokens (see [`LoneQuery::Duplicated`]) repeat the last token's row. With `parents` (a tree
/// of drafts) query `i` sees what precedes `pos0` and the rows of its path through the tree.
pub(crate) fn fill_mask(
    mask: &mut Vec<u16>,
    pos0: usize,
    n_tokens: usize,
    n_rows: usize,
    n_kv: usize,
    window: Option<usize>,
    parents: &[u8],
) {
    const ZERO: u16 = 0x0000;
    const NEG_INF: u16 = 0xFC00; // f16 −∞
    mask.clear();
    mask.resize(n_kv * n_rows, NEG_INF);
    for (i, row) in mask.chunks_exact_mut(n_kv).enumerate() {
        let t = i.min(n_tokens.saturating_sub(1));
        if parents.is_empty() {
            let visible = pos0 + t + 1;
            let first = window.map_or(0, |w| visible.saturating_sub(w));
            row[first..visible].fill(ZERO);
            continue;
        }
        // A tree's token sees what the session held and the rows of its path: itself and
        // its ancestors, one per position before its own (a window longer than a draft
        // holds them all).
        let (mut j, mut depth) = (t, 0);
        loop {
            row[pos0 + j] = ZERO;
            if j == 0 {
                break;
            }
            j = usize::from(parents[j]);
            depth += 1;
        }
        let first = window.map_or(0, |w| (pos0 + depth + 1).saturating_sub(w));
        row[first.min(pos0)..pos0].fill(ZERO);
    }
}

/// Below this many cached positions ggml's CPU flash attention never splits one query's keys
/// across threads (its `use_split_kv_path`).
const SPLIT_KV_MIN: usize = 512;

/// How attention keeps a single-token pass off ggml's split-KV path.
///
/// ggml's CPU flash attention takes a split-KV path for a lone query (one token, nothing in
/// dimension 3) over 512 or more f16/f32 positions, whose partial sums round differently from
/// the per-row path every multi-token pass takes: with two threads a token decoded alone then
/// differed from its row in a verification pass (max |Δ| 0.5 in logits). Each row of a
/// verification pass must be exactly what decoding that token alone computes, so such a pass
/// is shaped to take the per-row path, whose arithmetic for a row does not depend on the
/// others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoneQuery {
    /// Not needed: several tokens, a short cache, or a quantized one.
    No,
    /// Query heads laid out by KV head in dimension 3 (`[head_dim, 1, heads per KV head,
    /// KV heads]`, K and V viewed alike): the same rows, the same memory, no split-KV path.
    HeadsApart,
    /// A model with one KV head cannot spread heads apart: the query attends twice and the
    /// copy is dropped (twice the attention work).
    Duplicated,
}

/// Only ggml's CPU kernels (a cache in host memory) have the split-KV path: a device's
/// attention is left as it is (its kernels have their own, which the probe of exact widths
/// measures, `exact`), and gets no duplicated query.
fn lone_query(n_tokens: usize, n_kv: usize, kv: &KvLayout, n_head_kv: usize) -> LoneQuery {
    if n_tokens != 1 || n_kv < SPLIT_KV_MIN || kv.k_quantized() || kv.v_quantized() || !kv.in_host_memory() {
        LoneQuery::No
    } else if n_head_kv >= 2 {
        LoneQuery::HeadsApart
    } else {
        LoneQuery::Duplicated
    }
}
