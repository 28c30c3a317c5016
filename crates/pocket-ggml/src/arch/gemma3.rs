//! `gemma3` (Gemma 3 270M–27B), after llama.cpp's `src/models/gemma3.cpp`: embeddings scaled
//! by √n_embd; in each layer q/k RMS norms, a norm after attention and after the
//! feed-forward as well as before, GeGLU; sliding-window layers (five in six by default) with
//! a RoPE base of their own; queries scaled before attention rather than the scores.

use crate::Result;
use crate::ffi::gguf::GgufFile;
use crate::ffi::graph::Tensor;
use crate::graph::{Act, Builder};
use crate::hparams::{Hparams, Swa};
use crate::weights::LayerWeights;
use crate::weights::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = &[
    (Slot::AttnNorm, Need::Required),
    (Slot::QNorm, Need::Required),
    (Slot::KNorm, Need::Required),
    (Slot::Wo, Need::Required),
    (Slot::AttnPostNorm, Need::Required),
    (Slot::FfnNorm, Need::Required),
    (Slot::FfnGate, Need::Required),
    (Slot::FfnUp, Need::Required),
    (Slot::FfnDown, Need::Required),
    (Slot::FfnPostNorm, Need::Required),
];

/// Every how many layers one is global, unless the file says (llama.cpp's default for Gemma 3).
const DEFAULT_SWA_PATTERN: usize = 6;

pub(super) fn read_hparams(f: &GgufFile, hp: &mut Hparams) -> Result<()> {
    let a = hp.arch_name.clone();
    let window = f.get_u64(&format!("{a}.attention.sliding_window")).unwrap_or(0) as usize;
    if window > 0 {
        let key = format!("{a}.attention.sliding_window_pattern");
        let layers = match f.get_bool_array(&key) {
            Some(layers) if layers.len() >= hp.n_layer => layers[..hp.n_layer].to_vec(),
            Some(layers) => {
                return Err(
                    hp.unsupported(f, format!("{key} lists {} of {} layers", layers.len(), hp.n_layer))
                );
            }
            None => {
                // A global layer closes each group of `pattern` (llama.cpp's set_swa_pattern);
                // 0 makes every layer a sliding-window one.
                let pattern = f.get_u64(&key).map_or(DEFAULT_SWA_PATTERN, |p| p as usize);
                (0..hp.n_layer).map(|il| pattern == 0 || il % pattern < pattern - 1).collect()
            }
        };
        hp.swa = Some(Swa {
            window,
            layers,
            rope_base: f.get_f32(&format!("{a}.rope.freq_base_swa")).unwrap_or(10_000.0),
            rope_freq_scale: 1.0,
        });
    }
    hp.logit_softcap = f.get_f32(&format!("{a}.final_logit_softcapping")).filter(|&c| c > 0.0);
    // Gemma 3 27B (62 layers) scales queries by n_embd / n_head rather than the head size
    // (gemma_pytorch's config, as llama.cpp follows it).
    let scale_dim = if hp.n_layer == 62 { hp.n_embd / hp.n_head } else { hp.head_dim };
    hp.kq_scale = 1.0 / (scale_dim as f32).sqrt();
    hp.embd_scale = Some((hp.n_embd as f32).sqrt());
    Ok(())
}

pub(super) fn layer(b: &Builder, lw: &LayerWeights, il: usize, inp: Tensor) -> Option<Tensor> {
    let cur = b.norm(inp, lw.req(Slot::AttnNorm), "attn_norm", il);
    let (q, k, v) = b.qkv(lw, cur, il);
    let q = b.rope(b.norm(q, lw.req(Slot::QNorm), "Qcur_normed", il), il);
    let k = b.rope(b.norm(k, lw.req(Slot::KNorm), "Kcur_normed", il), il);
    // The queries are scaled, and the scores not again.
    let q = b.ctx.scale(q, b.hp.kq_scale);
    let attn = b.attention(il, q, k, v, 1.0)?;
    let cur = b.linear(lw.req(Slot::Wo), None, attn);
    let (cur, inp) = b.out_rows(il, cur, inp);
    let cur = b.norm(cur, lw.req(Slot::AttnPostNorm), "attn_post_norm", il);
    let sa_out = b.add(cur, inp, "sa_out", il);
    let cur = b.norm(sa_out, lw.req(Slot::FfnNorm), "ffn_norm", il);
    let cur = b.ffn(lw, cur, Act::Gelu, il);
    let cur = b.norm(cur, lw.req(Slot::FfnPostNorm), "ffn_post_norm", il);
    Some(b.add(cur, sa_out, "l_out", il))
}
