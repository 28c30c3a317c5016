//! `qwen2` (Qwen2, Qwen2.5), after llama.cpp's `src/models/qwen2.cpp`: the llama layer with
//! biases on q, k and v and NeoX RoPE ([`super::Arch::rope_mode`]).

use super::{Need, Slot};

pub(super) const LAYER_TENSORS: &[(Slot, Need)] = &[
    (Slot::AttnNorm, Need::Required),
    (Slot::Wqkv, Need::Optional),
    (Slot::Bqkv, Need::Optional),
    (Slot::Wq, Need::UnlessFused),
    (Slot::Wk, Need::UnlessFused),
    (Slot::Wv, Need::UnlessFused),
    (Slot::Bq, Need::Optional),
    (Slot::Bk, Need::Optional),
    (Slot::Bv, Need::Optional),
    (Slot::Wo, Need::Required),
    (Slot::FfnNorm, Need::Required),
    (Slot::FfnGate, Need::Required),
    (Slot::FfnUp, Need::Required),
    (Slot::FfnDown, Need::Required),
];
