//! `llama` (SmolLM2, Llama 3.x, TinyLlama), after llama.cpp's `src/models/llama.cpp`:
//! pre-norm attention and SwiGLU feed-forward, normal RoPE. Llama 3.x carries its RoPE
//! scaling as per-dimension factors (`rope_freqs.weight`), which the rotary embedding takes.
//! Qwen2 and SmolLM3 build their layers here too.

use crate::Result;
use crate::ffi::gguf::GgufFile;
use crate::ffi::graph::Tensor;
use crate::graph::{Act, Builder};
use crate::hparams::Hparams;
use crate::weights::LayerWeights;
use crate::weights::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = &[
    (Slot::AttnNorm, Need::Required),
    (Slot::Wo, Need::Required),
    (Slot::Bo, Need::Optional),
    (Slot::FfnNorm, Need::Required),
    (Slot::FfnGate, Need::Required),
    (Slot::FfnUp, Need::Required),
    (Slot::FfnDown, Need::Required),
];

pub(super) fn read_hparams(_f: &GgufFile, _hp: &mut Hparams) -> Result<()> {
    Ok(())
}

/// One layer; layers without RoPE (`Hparams::no_rope`, SmolLM3) skip it.
pub(super) fn layer(b: &Builder, lw: &LayerWeights, il: usize, inp: Tensor) -> Option<Tensor> {
    let cur = b.norm(inp, lw.req(Slot::AttnNorm), "attn_norm", il);
    let (mut q, mut k, v) = b.qkv(lw, cur, il);
    if !b.hp.no_rope[il] {
        q = b.rope(q, il);
        k = b.rope(k, il);
    }
    let attn = b.attention(il, q, k, v, b.hp.kq_scale)?;
    let cur = b.linear(lw.req(Slot::Wo), lw.get(Slot::Bo), attn);
    let (cur, inp) = b.out_rows(il, cur, inp);
    let ffn_inp = b.add(cur, inp, "ffn_inp", il);
    let cur = b.norm(ffn_inp, lw.req(Slot::FfnNorm), "ffn_norm", il);
    let cur = b.ffn(lw, cur, Act::Silu, il);
    Some(b.add(cur, ffn_inp, "l_out", il))
}
