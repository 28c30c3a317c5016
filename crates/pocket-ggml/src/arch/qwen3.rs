//! `qwen3` (Qwen3 0.6B–32B), after llama.cpp's `src/models/qwen3.cpp`: the llama layer with
//! a per-head RMS norm of q and k before RoPE, NeoX RoPE, and a head size of its own
//! (`attention.key_length`, not n_embd / n_head).

use crate::ffi::graph::Tensor;
use crate::graph::{Act, Builder};
use crate::weights::LayerWeights;
use crate::weights::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = &[
    (Slot::AttnNorm, Need::Required),
    (Slot::QNorm, Need::Required),
    (Slot::KNorm, Need::Required),
    (Slot::Wo, Need::Required),
    (Slot::FfnNorm, Need::Required),
    (Slot::FfnGate, Need::Required),
    (Slot::FfnUp, Need::Required),
    (Slot::FfnDown, Need::Required),
];

pub(super) fn layer(b: &Builder, lw: &LayerWeights, il: usize, inp: Tensor) -> Option<Tensor> {
    let cur = b.norm(inp, lw.req(Slot::AttnNorm), "attn_norm", il);
    let (q, k, v) = b.qkv(lw, cur, il);
    let q = b.rope(b.norm(q, lw.req(Slot::QNorm), "Qcur_normed", il), il);
    let k = b.rope(b.norm(k, lw.req(Slot::KNorm), "Kcur_normed", il), il);
    let attn = b.attention(il, q, k, v, b.hp.kq_scale)?;
    let cur = b.linear(lw.req(Slot::Wo), None, attn);
    let (cur, inp) = b.out_rows(il, cur, inp);
    let ffn_inp = b.add(cur, inp, "ffn_inp", il);
    let cur = b.norm(ffn_inp, lw.req(Slot::FfnNorm), "ffn_norm", il);
    let cur = b.ffn(lw, cur, Act::Silu, il);
    Some(b.add(cur, ffn_inp, "l_out", il))
}
