//! `qwen2` (Qwen2, Qwen2.5), after llama.cpp's `src/models/qwen2.cpp`: the llama layer
//! ([`super::llama::layer`]) with biases on q, k and v (which every architecture's projections
//! may have, see [`crate::weights::QKV`]) and NeoX RoPE ([`crate::hparams::Arch::rope_mode`]).

use crate::weights::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = super::llama::LAYER_TENSORS;
