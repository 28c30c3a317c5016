//! Bad model directories and misuse of a session: clear errors, never a panic.

mod common;

use std::path::Path;

use common::{config, t5_tiny};
use pocket_core::{Error, KvType, LayerPlan, Model, Rows};
use pocket_tract::TractModel;

/// A model directory made of t5-tiny's files under other names: `(name in the new
/// directory, fixture file)`.
fn dir_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, from) in files {
        std::fs::copy(t5_tiny().join(from), dir.path().join(name)).unwrap();
    }
    dir
}

fn load_error(dir: &Path) -> String {
    match TractModel::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_file_is_named() {
    let d = dir_of(&[("encoder_model.onnx", "encoder_model.onnx"), ("tokenizer.json", "tokenizer.json")]);
    let e = load_error(d.path());
    assert!(e.contains("decoder_model.onnx is missing"), "{e}");
    let d =
        dir_of(&[("encoder_model.onnx", "encoder_model.onnx"), ("decoder_model.onnx", "decoder_model.onnx")]);
    let e = load_error(d.path());
    assert!(e.contains("tokenizer.json is missing"), "{e}");
    let e = load_error(&t5_tiny().join("config.json"));
    assert!(e.contains("is not a directory"), "{e}");
}

#[test]
fn graphs_with_the_wrong_inputs_are_refused() {
    // A decoder where the encoder should be.
    let d = dir_of(&[
        ("encoder_model.onnx", "decoder_model.onnx"),
        ("decoder_model.onnx", "decoder_model.onnx"),
        ("tokenizer.json", "tokenizer.json"),
    ]);
    let e = load_error(d.path());
    assert!(e.contains("encoder_model.onnx") && e.contains("a decoder graph, not an encoder"), "{e}");
    // The with-past decoder where the first decoder should be.
    let d = dir_of(&[
        ("encoder_model.onnx", "encoder_model.onnx"),
        ("decoder_model.onnx", "decoder_with_past_model.onnx"),
        ("tokenizer.json", "tokenizer.json"),
    ]);
    let e = load_error(d.path());
    assert!(e.contains("takes past_key_values"), "{e}");
    // The encoder where a decoder should be.
    let d = dir_of(&[
        ("encoder.onnx", "encoder_model.onnx"),
        ("decoder.onnx", "encoder_model.onnx"),
        ("tokenizer.json", "tokenizer.json"),
    ]);
    let e = load_error(d.path());
    assert!(e.contains("decoder.onnx") && e.contains("encoder_hidden_states"), "{e}");
}

#[test]
fn a_decoder_only_export_is_refused() {
    let d = dir_of(&[("model.onnx", "decoder_model.onnx"), ("tokenizer.json", "tokenizer.json")]);
    let e = load_error(d.path());
    assert!(e.contains("decoder-only") && e.contains("GGUF"), "{e}");
}

#[test]
fn corrupt_files_are_refused() {
    let d = dir_of(&[
        ("encoder_model.onnx", "encoder_model.onnx"),
        ("decoder_model.onnx", "decoder_model.onnx"),
        ("tokenizer.json", "tokenizer.json"),
    ]);
    // Cut the decoder short.
    let bytes = std::fs::read(d.path().join("decoder_model.onnx")).unwrap();
    std::fs::write(d.path().join("decoder_model.onnx"), &bytes[..bytes.len() / 3]).unwrap();
    let e = load_error(d.path());
    assert!(e.contains("decoder_model.onnx") && e.contains("not a loadable ONNX graph"), "{e}");
    std::fs::write(d.path().join("decoder_model.onnx"), bytes).unwrap();
    std::fs::write(d.path().join("tokenizer.json"), b"{\"not\": \"a tokenizer\"}").unwrap();
    let e = load_error(d.path());
    assert!(e.contains("tokenizer.json: not a usable tokenizer.json"), "{e}");
}

#[test]
fn session_misuse_is_an_error() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    let plan = LayerPlan::full(model.info().n_layers).unwrap();
    let mut s = model.session(&config(KvType::F32)).unwrap();
    let e = s.decode(&[0], &plan, Rows::Last).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { message: ref m, .. } if m.contains("encode")), "{e}");
    assert!(matches!(s.encode(&[]).unwrap_err(), Error::InvalidArgument { .. }));
    let long = vec![5; 200];
    assert!(matches!(s.encode(&long).unwrap_err(), Error::ContextOverflow { needed: 200, limit: 128, .. }));
    s.encode(&[37, 629, 1]).unwrap();
    assert!(matches!(s.decode(&[40_000], &plan, Rows::Last).unwrap_err(), Error::InvalidArgument { .. }));
    let skipping = plan.without(0..1).unwrap();
    assert!(matches!(s.decode(&[0], &skipping, Rows::Last).unwrap_err(), Error::Unsupported(_)));
    assert!(matches!(s.decode(&[0, 1], &plan, Rows::Tail(3)).unwrap_err(), Error::InvalidArgument { .. }));
    assert!(matches!(s.truncate(5).unwrap_err(), Error::InvalidArgument { .. }));
    let too_many = vec![0; 129];
    assert!(matches!(s.decode(&too_many, &plan, Rows::Last).unwrap_err(), Error::ContextOverflow { .. }));
    // The session still works.
    s.decode(&[0], &plan, Rows::Last).unwrap();
    let e = model.tokenizer().apply_chat_template(&[], true).unwrap_err().to_string();
    assert!(e.contains("no chat template"), "{e}");
}

#[test]
fn a_budget_too_small_is_refused_before_anything_is_allocated() {
    let ledger = pocket_core::memory::Ledger::new(1 << 20);
    let e = match TractModel::load_in(&t5_tiny(), &ledger) {
        Ok(_) => panic!("loaded in 1 MiB"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("over the memory budget"), "{e}");
    assert_eq!(ledger.used(), 0);
}
