//! The decoder's forward graph, built per pass from the layers a [`LayerPlan`] runs.
//!
//! It follows llama.cpp's graph for the llama and qwen2 architectures (src/models/llama.cpp,
//! qwen2.cpp) op for op — RMS norm, rotary embeddings, flash attention over the cache, SwiGLU
//! — so that our logits can be checked against llama.cpp's. What differs is what llama.cpp
//! cannot do: a skipped layer is simply not built (the residual stream passes through), the
//! KV cache is ours, and on the CPU two kernels are ours (multi-row Q4_1 products and
//! attention over an f16 cache), each computing a row of a pass independently of the others.

use llama_cpp_sys_2 as sys;
use pocket_core::LayerPlan;

use crate::attention;
use crate::kv::KvCache;
use crate::model::AttentionKernel;
use crate::q4_1_gemm;
use crate::weights::{Hparams, Tensor, Weights};

/// Nodes a graph may hold: about 30 per layer, with room to spare.
pub(crate) fn graph_nodes(hp: &Hparams) -> usize {
    (64 * hp.n_layer + 256).next_power_of_two()
}

/// Attention reads the cache in lengths padded to this many positions (masked past the tokens
/// held), as llama.cpp does: a decode step's graph then keeps its shape for this many steps and
/// is reused instead of rebuilt.
pub(crate) const KV_PAD: usize = 256;

/// The shape of one forward pass: everything the graph's structure depends on. Positions are
/// inputs, not part of the shape, so consecutive decode steps share a graph.
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
        kv: &KvCache,
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
}

/// A built graph and its input and output tensors.
pub(crate) struct Graph {
    pub(crate) gf: *mut sys::ggml_cgraph,
    pub(crate) tokens: *mut sys::ggml_tensor,
    pub(crate) pos: *mut sys::ggml_tensor,
    pub(crate) mask: *mut sys::ggml_tensor,
    /// Cache rows the pass writes K and V to (its positions).
    pub(crate) kv_idxs: *mut sys::ggml_tensor,
    pub(crate) out_ids: Option<*mut sys::ggml_tensor>,
    /// Hadamard rotations applied around a quantized K (and Q) and V cache.
    pub(crate) k_rot: Option<*mut sys::ggml_tensor>,
    pub(crate) v_rot: Option<*mut sys::ggml_tensor>,
    pub(crate) logits: Option<*mut sys::ggml_tensor>,
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

/// Rotate every `n`-wide slice of `x` by the Hadamard matrix `rot` (`[n, n]`).
///
/// # Safety
/// `ctx` must be a live context; `x` must be contiguous with a multiple of `n` elements.
unsafe fn rotate(
    ctx: *mut sys::ggml_context,
    x: *mut sys::ggml_tensor,
    rot: *mut sys::ggml_tensor,
) -> *mut sys::ggml_tensor {
    // SAFETY: guaranteed by the caller.
    unsafe {
        let n = (*rot).ne[0];
        let ne = (*x).ne;
        let flat = sys::ggml_reshape_2d(ctx, x, n, sys::ggml_nelements(x) / n);
        let y = sys::ggml_mul_mat(ctx, rot, flat);
        sys::ggml_mul_mat_set_hint(y, sys::GGML_HINT_SRC0_IS_HADAMARD);
        sys::ggml_reshape_4d(ctx, y, ne[0], ne[1], ne[2], ne[3])
    }
}

/// Build the forward graph of `shape` for the layers of `plan` in the no_alloc context `ctx`.
///
/// # Safety
/// `ctx` must be a live no_alloc ggml context with room for [`graph_nodes`] tensors and a graph
/// of that size; `w` and `kv` must outlive the graph's computation.
pub(crate) unsafe fn build(
    ctx: *mut sys::ggml_context,
    hp: &Hparams,
    w: &Weights,
    kv: &KvCache,
    plan: &LayerPlan,
    shape: PassShape,
) -> Graph {
    let n_tokens = shape.n_tokens as i64;
    let n_kv = shape.n_kv as i64;
    let head_dim = hp.head_dim as i64;
    let n_head = hp.n_head as i64;
    let n_head_kv = hp.n_head_kv as i64;
    let n_embd_kv = hp.n_embd_kv() as i64;
    let kq_scale = 1.0 / (hp.head_dim as f32).sqrt();
    let last_layer = plan.layers().last().unwrap_or(0);

    // SAFETY: every call below builds graph nodes in `ctx` from tensors that are either
    // created here or owned by `w` and `kv`, with shapes checked at load time.
    unsafe {
        let gf = sys::ggml_new_graph_custom(ctx, graph_nodes(hp), false);
        let input = |t: *mut sys::ggml_tensor, name: &std::ffi::CStr| {
            sys::ggml_set_name(t, name.as_ptr());
            sys::ggml_set_input(t);
            t
        };
        let tokens = input(sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, n_tokens), c"inp_tokens");
        let pos = input(sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, n_tokens), c"inp_pos");
        let q_rows = shape.q_rows;
        let mask = input(sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F16, n_kv, q_rows as i64), c"kq_mask");
        let kv_idxs = input(sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I64, n_tokens), c"kv_idxs");
        let out_ids = (shape.n_out > 0 && shape.n_out < shape.n_tokens).then(|| {
            input(sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, shape.n_out as i64), c"inp_out_ids")
        });
        let (k_rot_n, v_rot_n) = rotation_sizes(hp, kv.k_quantized(), kv.v_quantized());
        let k_rot = k_rot_n
            .map(|n| input(sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, n as i64, n as i64), c"k_rot"));
        let v_rot = v_rot_n
            .map(|n| input(sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, n as i64, n as i64), c"v_rot"));
        let rope_freqs = w.rope_freqs.map_or(std::ptr::null_mut(), Tensor::ptr);
        let rope = |x: *mut sys::ggml_tensor| {
            sys::ggml_rope_ext(
                ctx,
                x,
                pos,
                rope_freqs,
                hp.n_rot as i32,
                hp.arch.rope_mode(),
                hp.n_ctx_train as i32,
                hp.rope_base,
                hp.rope_freq_scale,
                0.0,  // ext_factor: no YaRN
                1.0,  // attn_factor
                32.0, // beta_fast
                1.0,  // beta_slow
            )
        };
        let norm = |x: *mut sys::ggml_tensor, weight: Tensor| {
            sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, x, hp.rms_eps), weight.ptr())
        };
        let linear = |wt: Tensor, b: Option<Tensor>, x: *mut sys::ggml_tensor| {
            // Q4_1 over several tokens: our multi-row kernel, bitwise what ggml's one-row
            // kernel gives each row, so verification stays batch-invariant.
            let y = if q4_1_gemm::applies(wt.ptr(), x) {
                q4_1_gemm::mul_mat(ctx, wt.ptr(), x)
            } else {
                sys::ggml_mul_mat(ctx, wt.ptr(), x)
            };
            match b {
                Some(b) => sys::ggml_add(ctx, y, b.ptr()),
                None => y,
            }
        };

        let mut x = sys::ggml_get_rows(ctx, w.tok_embd.ptr(), tokens);
        let mut out = None;
        for il in plan.layers() {
            let lw = &w.layers[il];
            let mut residual = x;
            let cur = norm(x, lw.attn_norm);

            // Self-attention: project, rotate, append K and V to the cache, attend over it.
            let q = sys::ggml_reshape_3d(ctx, linear(lw.wq, lw.bq, cur), head_dim, n_head, n_tokens);
            let k = sys::ggml_reshape_3d(ctx, linear(lw.wk, lw.bk, cur), head_dim, n_head_kv, n_tokens);
            let v = linear(lw.wv, lw.bv, cur);
            let mut q = rope(q);
            let mut k = rope(k);
            let mut v = v;
            if let Some(r) = k_rot {
                q = rotate(ctx, q, r);
                k = rotate(ctx, k, r);
            }
            if let Some(r) = v_rot {
                v = rotate(ctx, v, r);
            }
            let (k_cache, v_cache) = (kv.k(il).ptr(), kv.v(il).ptr());
            let row = kv.row_bytes();
            let k_rows = sys::ggml_reshape_2d(ctx, k, n_embd_kv, n_tokens);
            let v_rows = sys::ggml_reshape_2d(ctx, v, n_embd_kv, n_tokens);
            // Added to the graph before the attention that reads the cache, so they run first.
            sys::ggml_build_forward_expand(gf, sys::ggml_set_rows(ctx, k_cache, k_rows, kv_idxs));
            sys::ggml_build_forward_expand(gf, sys::ggml_set_rows(ctx, v_cache, v_rows, kv_idxs));
            if il == last_layer && shape.n_out == 0 {
                // Nothing reads this layer's output: the pass only fills the cache.
                break;
            }

            // One cached row holds all KV heads of a token; heads are head_stride bytes apart.
            let head_stride = row / hp.n_head_kv;
            let mut attn = if shape.own_attention {
                let view =
                    |cache| sys::ggml_view_3d(ctx, cache, head_dim, n_head_kv, n_kv, head_stride, row, 0);
                attention::attend(ctx, q, view(k_cache), view(v_cache), mask)
            } else {
                flash_attention(ctx, q, k_cache, v_cache, mask, hp, row, shape, kq_scale)
            };
            if let Some(r) = v_rot {
                attn = rotate(ctx, attn, r);
            }
            let mut cur = linear(lw.wo, None, attn);

            // Only the rows whose logits are wanted go on past the last layer's attention.
            if il == last_layer
                && let Some(ids) = out_ids
            {
                cur = sys::ggml_get_rows(ctx, cur, ids);
                residual = sys::ggml_get_rows(ctx, residual, ids);
            }
            let ffn_inp = sys::ggml_add(ctx, cur, residual);

            // Feed-forward: SwiGLU.
            let h = norm(ffn_inp, lw.ffn_norm);
            let gate = linear(lw.ffn_gate, None, h);
            let up = linear(lw.ffn_up, None, h);
            let ffn = linear(lw.ffn_down, None, sys::ggml_swiglu_split(ctx, gate, up));
            x = sys::ggml_add(ctx, ffn, ffn_inp);
            if il == last_layer {
                out = Some(x);
            }
        }

        let logits = out.map(|x| {
            let h = norm(x, w.output_norm);
            let logits = sys::ggml_mul_mat(ctx, w.output.ptr(), h);
            sys::ggml_set_name(logits, c"result_output".as_ptr());
            sys::ggml_set_output(logits);
            sys::ggml_build_forward_expand(gf, logits);
            logits
        });
        Graph { gf, tokens, pos, mask, kv_idxs, out_ids, k_rot, v_rot, logits }
    }
}

/// ggml's flash attention of `q` (`[head_dim, n_head, n_tokens]`) over the cached K and V,
/// `[head_dim · n_head, n_tokens]`: for caches our own [`attention`] does not take.
///
/// # Safety
/// As for [`build`]; `k_cache` and `v_cache` are a layer's cache tensors.
#[allow(clippy::too_many_arguments)]
unsafe fn flash_attention(
    ctx: *mut sys::ggml_context,
    q: *mut sys::ggml_tensor,
    k_cache: *mut sys::ggml_tensor,
    v_cache: *mut sys::ggml_tensor,
    mask: *mut sys::ggml_tensor,
    hp: &Hparams,
    row: usize,
    shape: PassShape,
    kq_scale: f32,
) -> *mut sys::ggml_tensor {
    let (head_dim, n_head, n_head_kv) = (hp.head_dim as i64, hp.n_head as i64, hp.n_head_kv as i64);
    let (n_tokens, n_kv, q_rows) = (shape.n_tokens as i64, shape.n_kv as i64, shape.q_rows as i64);
    let head_stride = row / hp.n_head_kv;
    // SAFETY: by the caller.
    unsafe {
        // [head_dim, heads / g, tokens, g]: g = 1, except that a lone query over a long
        // cache puts each KV head's group of query heads in dimension 3 (see LoneQuery).
        let g = if shape.lone_query == LoneQuery::HeadsApart { n_head_kv } else { 1 };
        let q = if q_rows > n_tokens { sys::ggml_concat(ctx, q, q, 2) } else { q };
        let q = sys::ggml_reshape_4d(ctx, q, head_dim, n_head / g, q_rows, g);
        let kv_view = |cache| {
            let stride3 = head_stride * (hp.n_head_kv / g as usize);
            sys::ggml_view_4d(ctx, cache, head_dim, n_head_kv / g, n_kv, g, head_stride, row, stride3, 0)
        };
        let attn = sys::ggml_flash_attn_ext(
            ctx,
            sys::ggml_permute(ctx, q, 0, 2, 1, 3),
            sys::ggml_permute(ctx, kv_view(k_cache), 0, 2, 1, 3),
            sys::ggml_permute(ctx, kv_view(v_cache), 0, 2, 1, 3),
            mask,
            kq_scale,
            0.0,
            0.0,
        );
        sys::ggml_prec_set_acc(attn, sys::GGML_PREC_F32);
        let attn = sys::ggml_reshape_2d(ctx, attn, head_dim * n_head, q_rows);
        if q_rows > n_tokens {
            sys::ggml_view_2d(ctx, attn, head_dim * n_head, n_tokens, (*attn).nb[1], 0)
        } else {
            attn
        }
    }
}

/// Fill the causal mask of a pass: query `i` (at `pos0 + i`) sees cache positions `0..=pos0 + i`
/// of the `n_kv` it reads; the padding past them is masked. Query rows past the tokens (see
/// [`attention_rows`]) repeat the last token's row.
pub(crate) fn fill_mask(mask: &mut Vec<u16>, pos0: usize, n_tokens: usize, n_rows: usize, n_kv: usize) {
    const ZERO: u16 = 0x0000;
    const NEG_INF: u16 = 0xFC00; // f16 −∞
    mask.clear();
    mask.resize(n_kv * n_rows, NEG_INF);
    for i in 0..n_rows {
        let visible = pos0 + i.min(n_tokens.saturating_sub(1)) + 1;
        mask[i * n_kv..i * n_kv + visible].fill(ZERO);
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

/// Heads are spread apart only where ggml's CPU kernels attend (a cache in host memory):
/// that is where the layout was measured.
fn lone_query(n_tokens: usize, n_kv: usize, kv: &KvCache, n_head_kv: usize) -> LoneQuery {
    if n_tokens != 1 || n_kv < SPLIT_KV_MIN || kv.k_quantized() || kv.v_quantized() {
        LoneQuery::No
    } else if n_head_kv >= 2 && kv.in_host_memory() {
        LoneQuery::HeadsApart
    } else {
        LoneQuery::Duplicated
    }
}
