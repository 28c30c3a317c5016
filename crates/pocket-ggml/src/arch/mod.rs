//! The architectures our graph builds, one file each, in the shape of llama.cpp's
//! `src/models/*.cpp`: each reads the hyperparameters it needs, declares its tensors by their
//! GGUF names, and builds its layer from the shared helpers of [`crate::graph::Builder`].
//!
//! Adding an architecture is a new file here, a variant of [`Arch`] with its arms in the
//! matches over it and its name in `SUPPORTED_ARCHITECTURES`, and its synthetic model in the
//! parity tests (`tests/architectures.rs`); docs/architecture.md walks through it. A file of an architecture not listed here, or
//! with a feature its file does not build (say, a RoPE scaling we do not implement), is
//! refused with [`Error::Unsupported`]; pocket-runtime then runs it through llama.cpp itself.

mod gemma3;
mod hparams;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod smollm3;

pub(crate) use hparams::{Hparams, Swa};

use crate::ffi::device::WeightOp;
use crate::ffi::gguf::GgufFile;
use crate::ffi::graph::Tensor;
use crate::graph::Builder;
use crate::weights::LayerWeights;
use crate::{Error, Result};

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

    /// Read what this architecture adds to the common hyperparameters; refuse what its
    /// graph does not build.
    pub(crate) fn read_hparams(self, f: &GgufFile, hp: &mut Hparams) -> Result<()> {
        match self {
            Arch::Llama => llama::read_hparams(f, hp),
            Arch::Qwen2 | Arch::Qwen3 => Ok(()),
            Arch::Gemma3 => gemma3::read_hparams(f, hp),
            Arch::Phi3 => phi3::read_hparams(f, hp),
            Arch::SmolLm3 => smollm3::read_hparams(f, hp),
        }
    }

    /// The tensors of each layer besides its attention projections ([`QKV`], the same for
    /// every architecture), and whether each must be in the file.
    pub(crate) fn layer_tensors(self) -> &'static [(Slot, Need)] {
        match self {
            Arch::Llama | Arch::SmolLm3 => llama::LAYER_TENSORS,
            Arch::Qwen2 => qwen2::LAYER_TENSORS,
            Arch::Qwen3 => qwen3::LAYER_TENSORS,
            Arch::Gemma3 => gemma3::LAYER_TENSORS,
            Arch::Phi3 => phi3::LAYER_TENSORS,
        }
    }

    /// Build layer `il` on the residual stream `x`; `None` when the pass only fills the
    /// cache and nothing reads this layer's output.
    pub(crate) fn build_layer(self, b: &Builder, lw: &LayerWeights, il: usize, x: Tensor) -> Option<Tensor> {
        match self {
            Arch::Llama | Arch::Qwen2 | Arch::SmolLm3 => llama::layer(b, lw, il, x),
            Arch::Qwen3 => qwen3::layer(b, lw, il, x),
            Arch::Gemma3 => gemma3::layer(b, lw, il, x),
            Arch::Phi3 => phi3::layer(b, lw, il, x),
        }
    }
}

/// Whether a layer tensor must be in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Required,
    Optional,
    /// Required unless the layer has a fused `attn_qkv` (llama.cpp's `create_tensor_qkv`).
    UnlessFused,
}

/// A tensor of a layer, named as llama.cpp's `llama-arch.cpp` names it (`blk.N.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub(crate) enum Slot {
    AttnNorm,
    Wqkv,
    Bqkv,
    Wq,
    Wk,
    Wv,
    Bq,
    Bk,
    Bv,
    QNorm,
    KNorm,
    Wo,
    Bo,
    AttnPostNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnPostNorm,
}

impl Slot {
    /// Every slot, in the order of [`LayerWeights`]' table.
    pub(crate) const ALL: [Slot; 19] = [
        Slot::AttnNorm,
        Slot::Wqkv,
        Slot::Bqkv,
        Slot::Wq,
        Slot::Wk,
        Slot::Wv,
        Slot::Bq,
        Slot::Bk,
        Slot::Bv,
        Slot::QNorm,
        Slot::KNorm,
        Slot::Wo,
        Slot::Bo,
        Slot::AttnPostNorm,
        Slot::FfnNorm,
        Slot::FfnGate,
        Slot::FfnUp,
        Slot::FfnDown,
        Slot::FfnPostNorm,
    ];

    /// The tensor's name in a layer, after `blk.N.`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Slot::AttnNorm => "attn_norm.weight",
            Slot::Wqkv => "attn_qkv.weight",
            Slot::Bqkv => "attn_qkv.bias",
            Slot::Wq => "attn_q.weight",
            Slot::Wk => "attn_k.weight",
            Slot::Wv => "attn_v.weight",
            Slot::Bq => "attn_q.bias",
            Slot::Bk => "attn_k.bias",
            Slot::Bv => "attn_v.bias",
            Slot::QNorm => "attn_q_norm.weight",
            Slot::KNorm => "attn_k_norm.weight",
            Slot::Wo => "attn_output.weight",
            Slot::Bo => "attn_output.bias",
            Slot::AttnPostNorm => "post_attention_norm.weight",
            Slot::FfnNorm => "ffn_norm.weight",
            Slot::FfnGate => "ffn_gate.weight",
            Slot::FfnUp => "ffn_up.weight",
            Slot::FfnDown => "ffn_down.weight",
            Slot::FfnPostNorm => "post_ffw_norm.weight",
        }
    }

    /// What the graph does with it (where it is placed depends on that).
    pub(crate) fn op(self) -> WeightOp {
        match self {
            Slot::Wqkv
            | Slot::Wq
            | Slot::Wk
            | Slot::Wv
            | Slot::Wo
            | Slot::FfnGate
            | Slot::FfnUp
            | Slot::FfnDown => WeightOp::MulMat,
            _ => WeightOp::Elementwise,
        }
    }

    /// The shape (ne0, ne1) the graph expects of it; a mismatch would make ggml abort, so it
    /// is an error at load time instead.
    pub(crate) fn shape(self, hp: &Hparams) -> Vec<usize> {
        let (q, kv, e) = (hp.n_head * hp.head_dim, hp.n_embd_kv(), hp.n_embd);
        // Phi-3 keeps gate and up in one matrix of twice the width.
        let up = if hp.arch == Arch::Phi3 { 2 * hp.n_ff } else { hp.n_ff };
        match self {
            Slot::AttnNorm | Slot::AttnPostNorm | Slot::FfnNorm | Slot::FfnPostNorm | Slot::Bo => vec![e],
            Slot::Wqkv => vec![e, q + 2 * kv],
            Slot::Bqkv => vec![q + 2 * kv],
            Slot::Wq => vec![e, q],
            Slot::Wk | Slot::Wv => vec![e, kv],
            Slot::Bq => vec![q],
            Slot::Bk | Slot::Bv => vec![kv],
            Slot::QNorm | Slot::KNorm => vec![hp.head_dim],
            Slot::Wo => vec![q, e],
            Slot::FfnGate => vec![e, hp.n_ff],
            Slot::FfnUp => vec![e, up],
            Slot::FfnDown => vec![hp.n_ff, e],
        }
    }
}

/// The tensors every architecture has around its layers, with the shapes expected of them.
pub(crate) fn global_tensors(hp: &Hparams) -> [(&'static str, WeightOp, bool, Vec<usize>); 3] {
    [
        ("token_embd.weight", WeightOp::GetRows, true, vec![hp.n_embd, hp.n_vocab]),
        ("output_norm.weight", WeightOp::Elementwise, true, vec![hp.n_embd]),
        ("rope_freqs.weight", WeightOp::Elementwise, false, vec![hp.n_rot / 2]),
    ]
}

/// The attention projections every architecture takes the same way, fused or separate, each
/// with an optional bias (llama.cpp's `create_tensor_qkv`).
pub(crate) const QKV: [(Slot, Need); 8] = [
    (Slot::Wqkv, Need::Optional),
    (Slot::Bqkv, Need::Optional),
    (Slot::Wq, Need::UnlessFused),
    (Slot::Wk, Need::UnlessFused),
    (Slot::Wv, Need::UnlessFused),
    (Slot::Bq, Need::Optional),
    (Slot::Bk, Need::Optional),
    (Slot::Bv, Need::Optional),
];

/// `Error::Unsupported` for a feature of `f` the graph of `hp.arch` does not build.
pub(crate) fn unsupported(f: &GgufFile, hp: &Hparams, what: String) -> Error {
    Error::Unsupported { path: f.path().to_owned(), arch: hp.arch_name.clone(), reason: what }
}
