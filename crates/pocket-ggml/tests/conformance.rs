//! The engine boundary's conformance suite (`pocket_core::conformance`) on our ggml graph:
//! SmolLM2 (llama) and Qwen2.5-Coder-0.5B (qwen2), each with an f16 and a q8_0 cache; and on
//! the llama.cpp engine: SmolLM2 put on it, and a synthetic OLMo-2 (which only it runs).

mod common;

use common::*;
use pocket_core::conformance::Subject;
use pocket_core::{KvType, Model, SessionConfig};
use pocket_ggml::{DeviceChoice, LlamaCppModel, LoadOptions};

/// Rows of passes of different shapes agree to within this (rows.rs says why; on x86-64 with
/// AVX-512 they are bitwise equal).
const TOL: f32 = 1e-3;

fn subject(model: impl Model + 'static, kv: KvType) -> Subject {
    let serial = serial();
    let prompt = prose_of(&model, 24);
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

fn smol_q8_0_q4_0() -> Subject {
    subject(smol(), KvType::Q8_0_Q4_0)
}

fn qwen_f16() -> Subject {
    subject(model(QWEN), KvType::F16)
}

pocket_core::conformance_tests!(smollm2_f16, smol_f16);
pocket_core::conformance_tests!(smollm2_q8_0, smol_q8_0);
pocket_core::conformance_tests!(smollm2_q8_0_q4_0, smol_q8_0_q4_0);
pocket_core::conformance_tests!(qwen2_f16, qwen_f16);

fn on_llama_cpp(path: &std::path::Path) -> LlamaCppModel {
    LlamaCppModel::load(path, &LoadOptions { device: DeviceChoice::Cpu, ..Default::default() }).expect("load")
}

fn llama_cpp_smol_f16() -> Subject {
    subject(on_llama_cpp(&model_path(SMOL)), KvType::F16)
}

fn llama_cpp_smol_q8_0() -> Subject {
    subject(on_llama_cpp(&model_path(SMOL)), KvType::Q8_0)
}

fn llama_cpp_smol_q8_0_q4_0() -> Subject {
    subject(on_llama_cpp(&model_path(SMOL)), KvType::Q8_0_Q4_0)
}

fn llama_cpp_olmo2_f16() -> Subject {
    let model = on_llama_cpp(&Synthetic { arch: "olmo2", args: &[], weights: "f16" }.path());
    // Random weights make logits several times larger than a trained model's, and llama.cpp's
    // f16 matrix products round a batch's rows other than a single row's (measured: 1.4e-3).
    Subject { tolerance: 1e-2, ..subject(model, KvType::F16) }
}

pocket_core::conformance_tests!(llama_cpp_smollm2_f16, llama_cpp_smol_f16);
pocket_core::conformance_tests!(llama_cpp_smollm2_q8_0, llama_cpp_smol_q8_0);
pocket_core::conformance_tests!(llama_cpp_smollm2_q8_0_q4_0, llama_cpp_smol_q8_0_q4_0);
pocket_core::conformance_tests!(llama_cpp_olmo2_f16, llama_cpp_olmo2_f16);
