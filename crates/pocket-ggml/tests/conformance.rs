//! The engine boundary's conformance suite (`pocket_core::conformance`) on our ggml graph:
//! SmolLM2 (llama) and Qwen2.5-Coder-0.5B (qwen2), each with an f16 and a q8_0 cache; and on
//! the llama.cpp engine: SmolLM2 put on it, and a synthetic OLMo-2 (which only it runs).

mod common;

use common::*;
use pocket_core::conformance::Subject;
use pocket_core::{KvType, Model, SessionConfig};
use pocket_ggml::{DeviceChoice, LlamaCppModel, LoadOptions};

fn subject(model: impl Model + 'static, kv: KvType) -> Subject {
    let serial = serial();
    let prompt = prose_of(&model, 24);
    Subject {
        model: Box::new(model),
        prompt,
        config: SessionConfig { kv, ..config(128) },
        // Rows of passes of different shapes agree to within this on the test device.
        tolerance: width_tolerance(),
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

/// SmolLM2 on the llama.cpp engine, which these tests put on the CPU whatever the test device.
fn llama_cpp_smol(kv: KvType) -> Subject {
    Subject { tolerance: 1e-3, ..subject(on_llama_cpp(&model_path(SMOL)), kv) }
}

fn llama_cpp_smol_f16() -> Subject {
    llama_cpp_smol(KvType::F16)
}

fn llama_cpp_smol_q8_0() -> Subject {
    llama_cpp_smol(KvType::Q8_0)
}

fn llama_cpp_smol_q8_0_q4_0() -> Subject {
    llama_cpp_smol(KvType::Q8_0_Q4_0)
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

/// A pass of each width gives, after passes of other widths in the same session, the rows a
/// fresh session's pass of that width gives. (ggml-openvino compiled one model per graph
/// structure, whatever the width, and translated it from the first width it saw: after a
/// single-token pass, a pass of 4 read heads as tokens; after one of 3, the next failed.)
#[test]
fn passes_of_each_width_agree_with_a_fresh_session_after_other_widths() {
    let _serial = serial();
    let model = smol();
    let tokens = prose_of(&model, 96);
    let (head, rest) = tokens.split_at(24);
    let cfg = SessionConfig { kv: KvType::F16, ..config(128) };
    let plan = pocket_core::LayerPlan::full(model.info().n_layers).unwrap();
    let mut a = model.session(&cfg).unwrap();
    a.decode(head, &plan, pocket_core::Rows::None).unwrap();
    // 1, SmolLM2's KV heads, its heads, its head size, and widths between.
    for width in [1, 3, 9, 64, 4, 2, 1] {
        a.truncate(head.len()).unwrap();
        let got = collect(&a.decode(&rest[..width], &plan, pocket_core::Rows::Tail(width)).unwrap());
        let mut b = model.session(&cfg).unwrap();
        b.decode(head, &plan, pocket_core::Rows::None).unwrap();
        let fresh = collect(&b.decode(&rest[..width], &plan, pocket_core::Rows::Tail(width)).unwrap());
        assert!(got == fresh, "a pass of {width} after other widths differs from a fresh session's");
    }
}
