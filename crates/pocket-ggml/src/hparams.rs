//! Hyperparameters, from the GGUF metadata: the architecture, and what every architecture
//! has, read here (what each adds is read in its own file under `arch/`, which
//! `arch::read_hparams` calls after [`Hparams::read_common`]).

use crate::error::{Error, Result};
use crate::ffi::gguf::GgufFile;

/// The architectures this engine builds graphs for, by their GGUF names.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3"];

/// An architecture our graph builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    /// Llama family (SmolLM2, Llama 3.x with `rope_freqs`, TinyLlama).
    Llama,
    /// Qwen2 / Qwen2.5: llama with q, k, v biases and NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head RMS norm of q and k, head size of its own.
    Qwen3,
    /// Gemma 3: sliding-window and global layers, q/k norms, post-norms, GELU, scaled
    /// embeddings.
    Gemma3,
    /// Phi-3 / Phi-4-mini: fused QKV and gate/up projections.
    Phi3,
    /// SmolLM3: llama with no RoPE in every fourth layer.
    SmolLm3,
}

impl Arch {
    /// The architecture named `name` in a GGUF file, if our graph builds it.
    pub(crate) fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "smollm3" => Arch::SmolLm3,
            _ => return None,
        })
    }

    /// ggml's RoPE mode: 0 = normal (adjacent pairs), 2 = NeoX (halves), as llama.cpp's
    /// `llama_model_rope_type` gives it.
    pub(crate) fn rope_mode(self) -> i32 {
        match self {
            Arch::Llama | Arch::SmolLm3 => 0,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Phi3 => 2,
        }
    }
}

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
    /// What every architecture has; the architecture's own additions are not read yet.
    pub(crate) fn read_common(f: &GgufFile) -> Result<Self> {
        let bad = |reason: String| Error::BadModel { path: f.path().to_owned(), reason };
        let arch_name =
            f.get_str("general.architecture").ok_or_else(|| bad("no general.architecture key".into()))?;
        let arch = Arch::from_name(&arch_name).ok_or_else(|| Error::UnsupportedArchitecture {
            arch: arch_name.clone(),
            supported: SUPPORTED_ARCHITECTURES,
        })?;
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
        let hp = Hparams {
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
        Ok(hp)
    }

    /// `Error::Unsupported` for a feature of `f` the graph of this architecture does not
    /// build.
    pub(crate) fn unsupported(&self, f: &GgufFile, what: String) -> Error {
        Error::Unsupported { path: f.path().to_owned(), arch: self.arch_name.clone(), reason: what }
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
