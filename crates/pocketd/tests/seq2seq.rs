//! Encoder-decoder models through the whole stack: `pocket run` on flan-t5-small, and
//! speculative decoding (inputcopy, suffix, auto) giving exactly plain decoding's greedy
//! tokens on both engine paths — flan-t5-small without a KV cache, t5-tiny with one (f32 and
//! quantized).

use std::ops::ControlFlow;
use std::path::Path;
use std::process::Command;

use pocket_core::cost::CostPoint;
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{Generation, KvType, SessionConfig};
use pocket_runtime::pipeline::{self, Input, OnEvent, Request};
use pocket_runtime::{LoadedModel, OpenOptions};

/// `dir` opened through the pipeline, with what it learns kept in `cache`.
fn open(dir: &Path, cache: &Path) -> LoadedModel {
    let options = OpenOptions { cache_dir: Some(cache.to_path_buf()), ..OpenOptions::default() };
    LoadedModel::open(dir, &options).unwrap()
}

fn flan_t5(cache: &Path) -> LoadedModel {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("models/store/flan-t5-small");
    assert!(dir.is_dir(), "run: pocket pull flan-t5-small (missing {})", dir.display());
    open(&dir, cache)
}

fn t5_tiny(cache: &Path) -> LoadedModel {
    open(
        &Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("crates/pocket-tract/tests/fixtures/t5-tiny"),
        cache,
    )
}

/// A cost curve on which every draft pays, remembered for `kv`, so that the drafters (auto
/// too) draft wherever they can.
fn flat_curve(model: &LoadedModel, kv: KvType) {
    let curve =
        [(1, 1.0), (16, 1.5)].map(|(n, relative)| CostPoint { n, seconds: 0.01 * relative, relative });
    model.knowledge().remember_cost_curve(2, kv, curve.to_vec());
}

fn generate(model: &LoadedModel, text: &str, mode: SpecMode, kv: KvType, max_tokens: usize) -> Generation {
    let mut request = Request::new(Input::Text(text.to_owned()));
    request.spec = mode;
    request.stop.max_tokens = max_tokens;
    request.session =
        SessionConfig { kv, n_ctx: 256, threads: pocket_core::Threads::Fixed(2), ..SessionConfig::default() };
    let ledger = Ledger::unlimited();
    let prepared = pipeline::prepare(model, None, &request, &ledger).unwrap();
    let outcome =
        pipeline::run(model, None, &prepared, &ledger, &mut OnEvent::new(|_| ControlFlow::Continue(())))
            .unwrap();
    outcome.generation
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
        .env(
            "POCKET_MODELS_DIR",
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("models/store"),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), "Das Haus ist wunderbar.");
}

#[test]
fn drafting_keeps_flan_t5s_greedy_output() {
    let cache = tempfile::tempdir().unwrap();
    let model = flan_t5(cache.path());
    flat_curve(&model, KvType::F32);
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
    let cache = tempfile::tempdir().unwrap();
    let model = t5_tiny(cache.path());
    for kv in [KvType::F32, KvType::Q8_0, KvType::Q4_0] {
        flat_curve(&model, kv);
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
    let cache = tempfile::tempdir().unwrap();
    let model = t5_tiny(cache.path());
    for mode in [SpecMode::LayerSkip, SpecMode::Draft] {
        let mut request = Request::new(Input::Text("translate English to German: Hello.".into()));
        request.spec = mode;
        let e = pipeline::prepare(&model, None, &request, &Ledger::unlimited()).unwrap_err();
        assert_eq!(e.param(), Some("spec"), "{mode}: {e}");
    }
    let mut request = Request::new(Input::Text("x".into()));
    request.spec = SpecMode::LayerSkip;
    let e = pipeline::prepare(&model, None, &request, &Ledger::unlimited()).unwrap_err().to_string();
    assert!(e.contains("not available") && e.contains("inputcopy"), "{e}");
    // Chat messages need a chat template, which an encoder-decoder model does not have.
    let chat = Request::new(Input::Chat(vec![pocket_core::ChatMessage::new(pocket_core::Role::User, "hi")]));
    let e = pipeline::prepare(&model, None, &chat, &Ledger::unlimited()).unwrap_err().to_string();
    assert!(e.contains("no chat template") && e.contains("completion prompt"), "{e}");
}
