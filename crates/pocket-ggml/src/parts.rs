//! The parts of a loaded model that its passes read ([`Parts`]): weights, tokenizer,
//! hyperparameters, device and what it was loaded with. Graphs, computes and shared passes
//! take these; sessions hold the whole model (`Inner`, in `loaded.rs`).

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::{CacheKey, ModelInfo};

use crate::attention::AttentionKernel;
use crate::convert::WeightFormat;
use crate::ffi::device::{Device, Repack};
use crate::ffi::gguf::GgufFile;
use crate::ffi::vocab::Vocab;
use crate::hparams::Hparams;
use crate::weights::Weights;

/// What a model's passes read.
pub(crate) struct Parts {
    // Field order is drop order: the weights' buffers wrap the file mapping, so they go
    // before it.
    pub(crate) weights: Weights,
    pub(crate) vocab: Vocab,
    pub(crate) hp: Hparams,
    pub(crate) device: Device,
    pub(crate) info: ModelInfo,
    pub(crate) repack: Repack,
    pub(crate) format: WeightFormat,
    pub(crate) attention: AttentionKernel,
    pub(crate) file: GgufFile,
    /// What measurements of this model are remembered under (none if the file could not be
    /// fingerprinted).
    pub(crate) cache_key: Option<CacheKey>,
    /// The ledger the model is paid for in (unlimited without a budget): shared passes'
    /// compute buffers are too.
    pub(crate) ledger: Ledger,
    /// The weights' bytes in the memory ledger, on the device and in host memory (dropped
    /// last).
    pub(crate) _reservations: Vec<Reservation>,
}
