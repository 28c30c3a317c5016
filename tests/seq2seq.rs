//! Encoder-decoder models through the whole stack: `pocket run` on flan-t5-small, and
//! speculative decoding (inputcopy, suffix, auto) giving exactly plain decoding's greedy
//! tokens on both engine paths — flan-t5-small without a KV cache, t5-tiny with one (f32 and
//! quantized).

use std::path::Path;
use std::process::Command;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{Generation, KvType, Model, SamplingConfig, SessionConfig, StopConfig};
use pocket_tract::TractModel;

fn flan_t5() -> TractModel {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/store/flan-t5-small");
    assert!(dir.is_dir(), "run: pocket pull flan-t5-small (missing {})", dir.display());
    TractModel::load(&dir).unwrap()
}

fn t5_tiny() -> TractModel {
    TractModel::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/pocket-tract/tests/fixtures/t5-tiny"),
    )
    .unwrap()
}

fn generate(model: &TractModel, text: &str, mode: SpecMode, kv: KvType, max_tokens: usize) -> Generation {
    let source = model.tokenizer().encode(text, true).unwrap();
    let config = SessionConfig { kv, n_ctx: 256, threads: 2, ..SessionConfig::default() };
    let ledger = Ledger::unlimited();
    // A cost curve that lets every draft pay, so that the drafters draft wherever they can.
    let cost = pocket_core::cost::CostModel::linear(0.05);
    let mut drafter = pocketd::seq2seq::drafter(mode, &source, cost, 8).unwrap();
    let mut session = model.new_session(&config, &ledger).unwrap();
    pocketd::seq2seq::generate(
        model,
        &mut session,
        &source,
        SamplingConfig::default(),
        StopConfig { max_tokens, stop: Vec::new() },
        drafter.as_mut(),
        &mut |_| std::ops::ControlFlow::Continue(()),
    )
    .unwrap()
}

#[test]
fn pocket_run_translates_with_flan_t5() {
    let out = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args([
            "run",
            "-m",
            "flan-t5-small",
            "-t",
            "2",
            "translate English to German: The house is wonderful.",
        ])
        .env("POCKET_MODELS_DIR", Path::new(env!("CARGO_MANIFEST_DIR")).join("models/store"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), "Das Haus ist wunderbar.");
}

#[test]
fn drafting_keeps_flan_t5s_greedy_output() {
    let model = flan_t5();
    let mut accepted = 0;
    for text in [
        "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank.",
        "Fix the grammar: she go to the market every days and buy three apple for her family.",
    ] {
        let plain = generate(&model, text, SpecMode::Off, KvType::F32, 40);
        for mode in [SpecMode::InputCopy, SpecMode::Suffix, SpecMode::Auto] {
            let g = generate(&model, text, mode, KvType::F32, 40);
            assert_eq!(g.tokens, plain.tokens, "{mode} on {text:?}: {:?} vs {:?}", g.text, plain.text);
            if mode == SpecMode::InputCopy {
                accepted += g.spec.accepted;
            }
        }
    }
    // The model writes short titles, which copy little of their input, but some.
    assert!(accepted > 0, "input copying had no draft token accepted");
}

#[test]
fn drafting_keeps_greedy_output_with_a_kv_cache_quantized_or_not() {
    let model = t5_tiny();
    for kv in [KvType::F32, KvType::Q8_0, KvType::Q4_0] {
        let text = "translate English to German: The house is wonderful.";
        let plain = generate(&model, text, SpecMode::Off, kv, 60);
        for mode in [SpecMode::InputCopy, SpecMode::Suffix, SpecMode::Auto] {
            let g = generate(&model, text, mode, kv, 60);
            assert_eq!(g.tokens, plain.tokens, "{kv} {mode}");
        }
    }
}

#[test]
fn layer_skipping_and_draft_models_are_refused_for_encoder_decoders() {
    let cost = pocket_core::cost::CostModel::linear(0.1);
    for mode in [SpecMode::LayerSkip, SpecMode::Draft] {
        let e = pocketd::seq2seq::drafter(mode, &[1, 2], cost.clone(), 8).err().unwrap().to_string();
        assert!(e.contains("not available for encoder-decoder models"), "{e}");
    }
}
