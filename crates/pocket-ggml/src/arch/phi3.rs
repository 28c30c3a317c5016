//! `phi3` (Phi-3-mini, Phi-4-mini), after llama.cpp's `src/models/phi3.cpp`: fused QKV, gate
//! and up in one matrix (`ffn_up` of twice the feed-forward width, SwiGLU over its halves),
//! NeoX RoPE, queries scaled before attention. The 128k-context variants' LongRoPE factors
//! are not built here (llama.cpp runs those files).

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
    (Slot::FfnUp, Need::Required),
    (Slot::FfnDown, Need::Required),
];

pub(super) fn read_hparams(f: &GgufFile, hp: &mut Hparams) -> Result<()> {
    for name in ["rope_factors_long.weight", "rope_factors_short.weight", "output.bias"] {
        if f.tensor(name).is_some() {
            return Err(hp.unsupported(f, format!("tensor {name}")));
        }
    }
    // llama.cpp ignores Phi's sliding window (it disables it for all Phi-3 files), so do we.
    Ok(())
}

pub(super) fn layer(b: &Builder, lw: &LayerWeights, il: usize, inp: Tensor) -> Option<Tensor> {
    let cur = b.norm(inp, lw.req(Slot::AttnNorm), "attn_norm", il);
    let (q, k, v) = b.qkv(lw, cur, il);
    let (q, k) = (b.rope(q, il), b.rope(k, il));
    let q = b.ctx.scale(q, b.hp.kq_scale);
    let attn = b.attention(il, q, k, v, 1.0)?;
    let cur = b.linear(lw.req(Slot::Wo), lw.get(Slot::Bo), attn);
    let (cur, inp) = b.out_rows(il, cur, inp);
    let residual = b.add(cur, inp, "ffn_inp", il);
    let cur = b.norm(residual, lw.req(Slot::FfnNorm), "ffn_norm", il);
    let cur = b.ffn(lw, cur, Act::Silu, il);
    Some(b.add(residual, cur, "l_out", il))
}
