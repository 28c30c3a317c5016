//! The helpers architectures build their layers from — norm, rope, linear, attention, FFN —
//! each naming what it makes as llama.cpp's graph does (`cb(cur, "attn_norm", il)`), so that
//! an intermediate can be compared with llama.cpp's by name.

use super::{Inputs, LoneQuery, PassShape, Segment, SegmentInputs};
use crate::attention;
use crate::ffi::graph::{Ctx, Tensor};
use crate::gemm;
use crate::hparams::Hparams;
use crate::weights::{LayerWeights, Slot, Weights};

/// What a layer is built with: the graph's context and inputs, the model and the pass.
pub(crate) struct Builder<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) hp: &'a Hparams,
    pub(crate) w: &'a Weights,
    /// The sessions whose rows the pass carries, in row order.
    pub(crate) segments: &'a [Segment<'a>],
    /// Rows of the pass, and rows of logits wanted, over all segments.
    pub(crate) n_tokens: usize,
    pub(crate) n_out: usize,
    pub(crate) inp: &'a Inputs,
    /// The last layer the pass runs (its output rows are cut to the wanted ones).
    pub(crate) last_layer: usize,
    /// Activations quantized for the multi-row kernels, shared by the matrices that multiply
    /// the same rows.
    pub(crate) quantized: gemm::Quantized,
}

/// The activation of a gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU).
    Gelu,
}

impl Builder<'_> {
    /// Name `t` `name-il`.
    pub(crate) fn cb(&self, t: Tensor, name: &str, il: usize) -> Tensor {
        self.ctx.name(t, name, Some(il))
    }

    /// RMS norm of `x` (over its first dimension) times `weight`.
    pub(crate) fn norm(&self, x: Tensor, weight: Tensor, name: &str, il: usize) -> Tensor {
        let y = self.ctx.mul(self.ctx.rms_norm(x, self.hp.rms_eps), weight);
        self.cb(y, name, il)
    }

    /// `w · x (+ b)`.
    pub(crate) fn linear(&self, w: Tensor, b: Option<Tensor>, x: Tensor) -> Tensor {
        let y = gemm::mul_mat_or_ggml(self.ctx, w, x, &self.quantized);
        match b {
            Some(b) => self.ctx.add(y, b),
            None => y,
        }
    }

    /// Q, K (`[head_dim, heads, n_tokens]`) and V (`[head_dim · kv_heads, n_tokens]`,
    /// contiguous) from a fused `attn_qkv` or separate projections, biases added (llama.cpp's
    /// `build_qkv`).
    pub(crate) fn qkv(&self, lw: &LayerWeights, x: Tensor, il: usize) -> (Tensor, Tensor, Tensor) {
        let hp = self.hp;
        let n_tokens = self.n_tokens as i64;
        let (hd, nh, nkv) = (hp.head_dim as i64, hp.n_head as i64, hp.n_head_kv as i64);
        let (q, k, v) = if let Some(wqkv) = lw.get(Slot::Wqkv) {
            let mut qkv = self.cb(self.linear(wqkv, None, x), "wqkv", il);
            if let Some(b) = lw.get(Slot::Bqkv) {
                qkv = self.ctx.add(qkv, b);
            } else if let (Some(bq), Some(bk), Some(bv)) =
                (lw.get(Slot::Bq), lw.get(Slot::Bk), lw.get(Slot::Bv))
            {
                let b = self.ctx.concat(self.ctx.concat(bq, bk, 0), bv, 0);
                qkv = self.ctx.add(qkv, b);
            }
            let row = qkv.nb()[1];
            let f32s = size_of::<f32>();
            let q = self.ctx.view(qkv, &[hd, nh, n_tokens], &[hd as usize * f32s, row], 0);
            let k = self.ctx.view(
                qkv,
                &[hd, nkv, n_tokens],
                &[hd as usize * f32s, row],
                (hd * nh) as usize * f32s,
            );
            let v = self.ctx.view(qkv, &[hd * nkv, n_tokens], &[row], (hd * (nh + nkv)) as usize * f32s);
            (q, k, self.ctx.cont(v))
        } else {
            let q = self.linear(lw.req(Slot::Wq), lw.get(Slot::Bq), x);
            let k = self.linear(lw.req(Slot::Wk), lw.get(Slot::Bk), x);
            let v = self.linear(lw.req(Slot::Wv), lw.get(Slot::Bv), x);
            (self.ctx.reshape(q, &[hd, nh, n_tokens]), self.ctx.reshape(k, &[hd, nkv, n_tokens]), v)
        };
        (self.cb(q, "Qcur", il), self.cb(k, "Kcur", il), self.cb(v, "Vcur", il))
    }

    /// The rotary embedding of layer `il` (its base and scale; Llama 3's `rope_freqs`).
    pub(crate) fn rope(&self, x: Tensor, il: usize) -> Tensor {
        let hp = self.hp;
        let (base, scale) = hp.rope_of(il);
        self.ctx.rope(
            x,
            self.inp.pos,
            self.w.rope_freqs,
            hp.n_rot,
            hp.arch.rope_mode(),
            hp.n_ctx_train,
            base,
            scale,
        )
    }

    /// Self-attention of layer `il`: append K and V to each segment's cache, attend over it
    /// with scores scaled by `kq_scale`, and return `[head_dim · n_head, n_tokens]` (before
    /// the output projection). `None` when nothing reads this layer's output: the pass only
    /// fills the caches, and stops here.
    pub(crate) fn attention(
        &self,
        il: usize,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kq_scale: f32,
    ) -> Option<Tensor> {
        let ctx = self.ctx;
        // Q and K come here roped (a new, contiguous tensor) unless the layer has no RoPE;
        // then from a fused projection they are views with gaps, which the reshapes below
        // (and ggml's) cannot take.
        let dense = |t: Tensor| if t.is_contiguous() { t } else { ctx.cont(t) };
        let (q, k) = (dense(q), dense(k));
        let [segment] = self.segments else {
            return self.attention_of_segments(il, q, k, v, kq_scale);
        };
        let q = self.write_kv(il, segment, &self.inp.segments[0], (q, k, v));
        if il == self.last_layer && self.n_out == 0 {
            return None;
        }
        let attn = self.attend(il, segment, &self.inp.segments[0], q, kq_scale);
        Some(self.cb(attn, "kqv_out", il))
    }

    /// [`Builder::attention`] of a pass of several segments: each segment's rows of Q, K and
    /// V (views: the rows of one segment are contiguous) write its cache and attend over it,
    /// and the results are joined again in row order.
    fn attention_of_segments(
        &self,
        il: usize,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kq_scale: f32,
    ) -> Option<Tensor> {
        let ctx = self.ctx;
        // Rows r0.. of Q or K (`[head_dim, heads, tokens]`) and of V (`[width, tokens]`).
        let heads_rows = |t: Tensor, r0: usize, n: usize| {
            let (ne, nb) = (t.ne(), t.nb());
            ctx.view(t, &[ne[0], ne[1], n as i64], &[nb[1], nb[2]], r0 * nb[2])
        };
        let rows = |t: Tensor, r0: usize, n: usize| {
            ctx.view(t, &[t.ne()[0], n as i64], &[t.nb()[1]], r0 * t.nb()[1])
        };
        let mut parts = Vec::with_capacity(self.segments.len());
        let mut r0 = 0;
        for (segment, inp) in self.segments.iter().zip(&self.inp.segments) {
            let n = segment.shape.n_tokens;
            let qkv = (heads_rows(q, r0, n), heads_rows(k, r0, n), rows(v, r0, n));
            parts.push((segment, inp, self.write_kv(il, segment, inp, qkv)));
            r0 += n;
        }
        if il == self.last_layer && self.n_out == 0 {
            return None;
        }
        let attn = parts
            .into_iter()
            .map(|(segment, inp, q)| self.attend(il, segment, inp, q, kq_scale))
            .reduce(|joined, next| ctx.concat(joined, next, 1))
            .expect("a pass has a segment");
        Some(self.cb(attn, "kqv_out", il))
    }

    /// Rotate a segment's Q and K (and V) where its cache is quantized, and append its K and V
    /// to the cache: returns Q as rotated.
    fn write_kv(
        &self,
        il: usize,
        segment: &Segment<'_>,
        inp: &SegmentInputs,
        (mut q, mut k, mut v): (Tensor, Tensor, Tensor),
    ) -> Tensor {
        let (ctx, kv) = (self.ctx, segment.kv);
        if let Some(r) = self.inp.k_rot.filter(|_| kv.k_quantized()) {
            q = rotate(ctx, q, r);
            k = rotate(ctx, k, r);
        }
        if let Some(r) = self.inp.v_rot.filter(|_| kv.v_quantized()) {
            v = rotate(ctx, v, r);
        }
        let n_tokens = segment.shape.n_tokens as i64;
        let n_embd_kv = self.hp.n_embd_kv() as i64;
        let k_rows = ctx.reshape(k, &[n_embd_kv, n_tokens]);
        let v_rows = ctx.reshape(v, &[n_embd_kv, n_tokens]);
        // Added to the graph before the attention that reads the cache, so they run first.
        ctx.expand(ctx.set_rows(kv.k(il), k_rows, inp.kv_idxs));
        ctx.expand(ctx.set_rows(kv.v(il), v_rows, inp.kv_idxs));
        q
    }

    /// A segment's attention over its cache (its K and V written): `[head_dim · n_head,
    /// n_tokens]`, rotated back where its V is quantized.
    fn attend(
        &self,
        il: usize,
        segment: &Segment<'_>,
        inp: &SegmentInputs,
        q: Tensor,
        kq_scale: f32,
    ) -> Tensor {
        let (ctx, hp, kv, shape) = (self.ctx, self.hp, segment.kv, segment.shape);
        let mask = match inp.mask_swa {
            Some(swa) if hp.is_swa(il) => swa,
            _ => inp.mask,
        };
        let (k_cache, v_cache) = (kv.k(il), kv.v(il));
        // One cached row holds all KV heads of a token; heads are row / n_head_kv bytes apart.
        // K's and V's rows differ in size where their types do.
        let rows = (kv.k_row_bytes(), kv.v_row_bytes());
        let (hd, nkv, n_kv) = (hp.head_dim as i64, hp.n_head_kv as i64, shape.n_kv as i64);
        let mut attn = if shape.own_attention {
            let view = |cache, row: usize| ctx.view(cache, &[hd, nkv, n_kv], &[row / hp.n_head_kv, row], 0);
            attention::attend(ctx, q, view(k_cache, rows.0), view(v_cache, rows.1), mask, kq_scale)
        } else {
            flash_attention(ctx, q, (k_cache, v_cache), mask, hp, rows, shape, kq_scale)
        };
        if let Some(r) = self.inp.v_rot.filter(|_| kv.v_quantized()) {
            attn = rotate(ctx, attn, r);
        }
        attn
    }

    /// In the last layer, keep only the rows whose logits are wanted, of both the branch and
    /// the residual.
    pub(crate) fn out_rows(&self, il: usize, cur: Tensor, residual: Tensor) -> (Tensor, Tensor) {
        match self.inp.out_ids {
            Some(ids) if il == self.last_layer => {
                (self.ctx.get_rows(cur, ids), self.ctx.get_rows(residual, ids))
            }
            _ => (cur, residual),
        }
    }

    /// The gated feed-forward block: `down(act(gate · x) * (up · x))`, with gate and up
    /// separate or (Phi-3) one matrix whose halves they are.
    pub(crate) fn ffn(&self, lw: &LayerWeights, x: Tensor, act: Act, il: usize) -> Tensor {
        let up = self.linear(lw.req(Slot::FfnUp), None, x);
        let h = match lw.get(Slot::FfnGate) {
            Some(gate) => {
                let gate = self.linear(gate, None, x);
                match act {
                    Act::Silu => self.cb(self.ctx.swiglu_split(gate, up), "ffn_swiglu", il),
                    Act::Gelu => self.cb(self.ctx.geglu_split(gate, up), "ffn_geglu", il),
                }
            }
            None => {
                debug_assert_eq!(act, Act::Silu, "fused gate/up only with SiLU (Phi-3)");
                self.cb(self.ctx.swiglu(up), "ffn_swiglu", il)
            }
        };
        self.cb(self.linear(lw.req(Slot::FfnDown), None, h), "ffn_out", il)
    }

    /// `a + b`, named.
    pub(crate) fn add(&self, a: Tensor, b: Tensor, name: &str, il: usize) -> Tensor {
        self.cb(self.ctx.add(a, b), name, il)
    }
}

/// Rotate every `n`-wide slice of `x` (contiguous) by the Hadamard matrix `rot` (`[n, n]`).
fn rotate(ctx: &Ctx, x: Tensor, rot: Tensor) -> Tensor {
    let n = rot.ne()[0];
    let ne = x.ne();
    let flat = ctx.reshape(x, &[n, x.nelements() / n]);
    let y = ctx.mul_mat_hadamard(rot, flat);
    ctx.reshape(y, &ne)
}

/// ggml's flash attention of `q` (`[head_dim, n_head, n_tokens]`) over the cached K and V,
/// `[head_dim · n_head, n_tokens]`: for caches our own [`attention`] does not take.
/// `rows` are the bytes of one token's K and of its V.
#[allow(clippy::too_many_arguments)]
fn flash_attention(
    ctx: &Ctx,
    q: Tensor,
    (k_cache, v_cache): (Tensor, Tensor),
    mask: Tensor,
    hp: &Hparams,
    rows: (usize, usize),
    shape: PassShape,
    kq_scale: f32,
) -> Tensor {
    let (head_dim, n_head, n_head_kv) = (hp.head_dim as i64, hp.n_head as i64, hp.n_head_kv as i64);
    let (n_tokens, n_kv, q_rows) = (shape.n_tokens as i64, shape.n_kv as i64, shape.q_rows as i64);
    // [head_dim, heads / g, tokens, g]: g = 1, except that a lone query over a long cache
    // puts each KV head's group of query heads in dimension 3 (see LoneQuery).
    let g = if shape.lone_query == LoneQuery::HeadsApart { n_head_kv } else { 1 };
    let q = if q_rows > n_tokens { ctx.concat(q, q, 2) } else { q };
    let q = ctx.reshape(q, &[head_dim, n_head / g, q_rows, g]);
    let kv_view = |cache, row: usize| {
        let head_stride = row / hp.n_head_kv;
        let stride3 = head_stride * (hp.n_head_kv / g as usize);
        ctx.view(cache, &[head_dim, n_head_kv / g, n_kv, g], &[head_stride, row, stride3], 0)
    };
    let perm = [0, 2, 1, 3];
    let attn = ctx.flash_attn(
        ctx.permute(q, perm),
        ctx.permute(kv_view(k_cache, rows.0), perm),
        ctx.permute(kv_view(v_cache, rows.1), perm),
        mask,
        kq_scale,
    );
    let attn = ctx.reshape(attn, &[head_dim * n_head, q_rows]);
    if q_rows > n_tokens { ctx.view(attn, &[head_dim * n_head, n_tokens], &[attn.nb()[1]], 0) } else { attn }
}
