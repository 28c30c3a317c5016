//! The architectures our graph builds, one file each, in the shape of llama.cpp's
//! `src/models/*.cpp`: each reads the hyperparameters it adds, declares its layer's tensors
//! by their GGUF names, and builds its layer from the shared helpers of
//! [`crate::graph::Builder`]. What every architecture has — the hyperparameters
//! (`hparams.rs`) and the tensor slots (`weights.rs`) — sits below, for the graph and the
//! weights to read without this module.
//!
//! Adding an architecture is a new file here, a variant of [`Arch`] (`hparams.rs`) and its name
//! in `SUPPORTED_ARCHITECTURES`, its arms in the matches here, and its synthetic model in the
//! parity tests (`tests/architectures.rs`); docs/architecture.md walks through it. A file of an architecture not listed here, or
//! with a feature its file does not build (say, a RoPE scaling we do not implement), is
//! refused with `Error::Unsupported`; pocket-runtime then runs it through llama.cpp itself.

mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod smollm3;

use crate::error::Result;
use crate::ffi::gguf::GgufFile;
use crate::graph::LayerFn;
use crate::hparams::{Arch, Hparams};
use crate::weights::{Need, Slot};

/// The hyperparameters of the model in `f`: what every architecture has, then what its own
/// adds; what its graph does not build is refused.
pub(crate) fn read_hparams(f: &GgufFile) -> Result<Hparams> {
    let mut hp = Hparams::read_common(f)?;
    match hp.arch {
        Arch::Llama => llama::read_hparams(f, &mut hp)?,
        Arch::Qwen2 | Arch::Qwen3 => {}
        Arch::Gemma3 => gemma3::read_hparams(f, &mut hp)?,
        Arch::Phi3 => phi3::read_hparams(f, &mut hp)?,
        Arch::SmolLm3 => smollm3::read_hparams(f, &mut hp)?,
    }
    Ok(hp)
}

/// The tensors of each layer of `arch` besides its attention projections
/// ([`crate::weights::QKV`], the same for every architecture), and whether each must be in
/// the file.
pub(crate) fn layer_tensors(arch: Arch) -> &'static [(Slot, Need)] {
    match arch {
        Arch::Llama | Arch::SmolLm3 => llama::LAYER_TENSORS,
        Arch::Qwen2 => qwen2::LAYER_TENSORS,
        Arch::Qwen3 => qwen3::LAYER_TENSORS,
        Arch::Gemma3 => gemma3::LAYER_TENSORS,
        Arch::Phi3 => phi3::LAYER_TENSORS,
    }
}

/// What builds a layer of `arch`.
pub(crate) fn layer(arch: Arch) -> LayerFn {
    match arch {
        Arch::Llama | Arch::Qwen2 | Arch::SmolLm3 => llama::layer,
        Arch::Qwen3 => qwen3::layer,
        Arch::Gemma3 => gemma3::layer,
        Arch::Phi3 => phi3::layer,
    }
}
