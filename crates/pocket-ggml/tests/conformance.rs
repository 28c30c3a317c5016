//! The engine boundary's conformance suite (`pocket_core::conformance`) on our ggml graph:
//! SmolLM2 (llama) and Qwen2.5-Coder-0.5B (qwen2), each with an f16 and a q8_0 cache.

mod common;

use common::*;
use pocket_core::conformance::Subject;
use pocket_core::{KvType, SessionConfig};
use pocket_ggml::GgmlModel;

/// Rows of passes of different shapes agree to within this (rows.rs says why; on x86-64 with
/// AVX-512 they are bitwise equal).
const TOL: f32 = 1e-3;

fn subject(model: GgmlModel, kv: KvType) -> Subject {
    let serial = serial();
    let prompt = prose(&model, 24);
    Subject {
        model: Box::new(model),
        prompt,
        config: SessionConfig { kv, ..config(128) },
        tolerance: TOL,
        serial: Some(serial),
    }
}

fn smol_f16() -> Subject {
    subject(smol(), KvType::F16)
}

fn smol_q8_0() -> Subject {
    subject(smol(), KvType::Q8_0)
}

fn qwen_f16() -> Subject {
    subject(model(QWEN), KvType::F16)
}

pocket_core::conformance_tests!(smollm2_f16, smol_f16);
pocket_core::conformance_tests!(smollm2_q8_0, smol_q8_0);
pocket_core::conformance_tests!(qwen2_f16, qwen_f16);
