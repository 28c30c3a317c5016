//! Hyperparameters, from the GGUF metadata: those every architecture has, read here, and
//! what each architecture adds, read in its own file.

use super::Arch;
use crate::ffi::gguf::GgufFile;
use crate::{Error, Result};

/// Hyperparameters of a decoder.
#[derive(Debug, Clone)]
pub(crate) struct Hparams {
    pub(crate) arch: Arch,
    pub(crate) arch_name: String,
    pub(crate) name: String,
    pub(crate) n_layer: usize,
    pub(crate) n_embd: usize,
    pub(crate) n_head: usize,
    pub(crate) n_head_kv: usize,
    pub(crate) head_dim: usize,
    pub(crate) n_ff: usize,
    pub(crate) n_vocab: usize,
    pub(crate) n_ctx_train: usize,
    pub(crate) n_rot: usize,
    pub(crate) rms_eps: f32,
    pub(crate) rope_base: f32,
    pub(crate) rope_freq_scale: f32,
    /// Sliding-window attention, where some layers attend only to the last tokens.
    pub(crate) swa: Option<Swa>,
    /// Layers that apply no rotary embedding (SmolLM3's NoPE layers).
    pub(crate) no_rope: Vec<bool>,
    /// The scale of the attention scores (1/√head_dim unless the architecture says other).
    pub(crate) kq_scale: f32,
    /// Token embeddings are multiplied by this (Gemma: √n_embd).
    pub(crate) embd_scale: Option<f32>,
    /// Final logits are soft-capped at ± this (`c · tanh(x / c)`).
    pub(crate) logit_softcap: Option<f32>,
}

/// Sliding-window attention: which layers use it, how far back they see, and their RoPE.
#[derive(Debug, Clone)]
pub(crate) struct Swa {
    /// A query at position p sees keys at p − window + 1 ..= p.
    pub(crate) window: usize,
    /// Per layer: whether it is a sliding-window layer.
    pub(crate) layers: Vec<bool>,
    /// RoPE frequency base and scale of the sliding-window layers.
    pub(crate) rope_base: f32,
    pub(crate) rope_freq_scale: f32,
}

impl Hparams {
    pub(crate) fn read(f: &GgufFile) -> Result<Self> {
        let bad = |reason: String| Error::BadModel { path: f.path().to_owned(), reason };
        let arch_name =
            f.get_str("general.architecture").ok_or_else(|| bad("no general.architecture key".into()))?;
        let arch = Arch::from_name(&arch_name)
            .ok_or_else(|| Error::UnsupportedArchitecture { arch: arch_name.clone() })?;
        let a = &arch_name;
        let req = |key: &str| -> Result<usize> {
            let key = format!("{a}.{key}");
            f.get_u64(&key)
                .map(|v| v as usize)
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("missing or zero metadata key {key}")))
        };
        let opt = |key: &str| f.get_u64(&format!("{a}.{key}")).map(|v| v as usize);
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv").unwrap_or(n_head);
        let head_dim = opt("attention.key_length").unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length").unwrap_or(head_dim);
        let n_vocab = opt("vocab_size")
            .or_else(|| f.get_arr_len("tokenizer.ggml.tokens"))
            .ok_or_else(|| bad("no vocabulary size".into()))?;
        let rope_freq_scale = match f.get_str(&format!("{a}.rope.scaling.type")).as_deref() {
            None | Some("none") => 1.0,
            Some("linear") => {
                1.0 / f.get_f32(&format!("{a}.rope.scaling.factor")).filter(|&x| x > 0.0).unwrap_or(1.0)
            }
            Some(other) => {
                return Err(Error::Unsupported {
                    path: f.path().to_owned(),
                    arch: arch_name.clone(),
                    reason: format!("RoPE scaling {other:?}"),
                });
            }
        };
        let mut hp = Hparams {
            arch,
            name: f.get_str("general.name").unwrap_or_default(),
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: req("feed_forward_length")?,
            n_vocab,
            n_ctx_train: req("context_length")?,
            n_rot: opt("rope.dimension_count").unwrap_or(head_dim),
            rms_eps: f.get_f32(&format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: f.get_f32(&format!("{a}.rope.freq_base")).unwrap_or(10_000.0),
            rope_freq_scale,
            swa: None,
            no_rope: vec![false; n_layer],
            kq_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: None,
            logit_softcap: None,
            arch_name,
        };
        let shape_error = || {
            bad(format!(
                "unsupported shape: {} heads, {} KV heads, head size {} (values {head_dim_v}), {} rotary \
                 dimensions, {} layers",
                hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_rot, hp.n_layer
            ))
        };
        if n_head_kv == 0
            || head_dim == 0
            || !n_head.is_multiple_of(n_head_kv)
            || head_dim_v != head_dim
            || !head_dim.is_multiple_of(2)
            || hp.n_rot > head_dim
            || n_layer > pocket_core::MAX_LAYERS
        {
            return Err(shape_error());
        }
        arch.read_hparams(f, &mut hp)?;
        Ok(hp)
    }

    /// Width of one token's K (or V) over all KV heads of a layer.
    pub(crate) fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Whether layer `il` attends through a sliding window.
    pub(crate) fn is_swa(&self, il: usize) -> bool {
        self.swa.as_ref().is_some_and(|s| s.layers[il])
    }

    /// RoPE frequency base and scale of layer `il`.
    pub(crate) fn rope_of(&self, il: usize) -> (f32, f32) {
        match &self.swa {
            Some(s) if s.layers[il] => (s.rope_base, s.rope_freq_scale),
            _ => (self.rope_base, self.rope_freq_scale),
        }
    }
}
