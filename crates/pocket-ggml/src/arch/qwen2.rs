//! `qwen2` (Qwen2, Qwen2.5), after llama.cpp's `src/models/qwen2.cpp`: the llama layer
//! ([`super::llama::layer`]) with biases on q, k and v (which every architecture's projections
//! may have, see [`super::QKV`]) and NeoX RoPE ([`super::Arch::rope_mode`]).

use super::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = super::llama::LAYER_TENSORS;
