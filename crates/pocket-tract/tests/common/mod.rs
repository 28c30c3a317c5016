//! The t5-tiny fixture and its PyTorch reference.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use pocket_core::{KvType, Logits, SessionConfig};
use serde_json::Value;

/// The fixture directory (a copy of `shared/fixtures/t5-tiny`, so a clean clone has it).
pub fn t5_tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/t5-tiny")
}

/// A directory of symlinks to t5-tiny's files without the with-past decoder: the same
/// model on the no-cache path.
pub fn t5_tiny_without_past() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["encoder_model.onnx", "decoder_model.onnx", "tokenizer.json", "config.json"] {
        std::os::unix::fs::symlink(t5_tiny().join(name), dir.path().join(name)).unwrap();
    }
    dir
}

/// One case of reference.json.
pub struct Case {
    pub text: String,
    pub input_ids: Vec<u32>,
    pub decoder_input_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    /// Per step: the top-5 `(id, logit)`.
    pub steps: Vec<Vec<(u32, f32)>>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

pub fn cases() -> Vec<Case> {
    let r: Value = serde_json::from_slice(&std::fs::read(t5_tiny().join("reference.json")).unwrap()).unwrap();
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_owned(),
            input_ids: ids(&c["input_ids"]),
            decoder_input_ids: ids(&c["decoder_input_ids"]),
            output_ids: ids(&c["output_ids"]),
            steps: c["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    s["top5"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| (t["id"].as_u64().unwrap() as u32, t["logit"].as_f64().unwrap() as f32))
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// The largest difference between `row` and the reference top-5 logits of `step`.
pub fn top5_error(row: &[f32], step: &[(u32, f32)]) -> f32 {
    step.iter().map(|&(id, logit)| (row[id as usize] - logit).abs()).fold(0.0, f32::max)
}

/// Check row `i` of `logits` against reference step `k` of `case` (1e-4).
pub fn check_row(logits: &Logits<'_>, i: usize, case: &Case, k: usize, what: &str) {
    let row = logits.row(i);
    let err = top5_error(row, &case.steps[k]);
    assert!(err < 1e-4, "{what}: step {k} of {:?}: top-5 logits off by {err}", case.text);
    assert_eq!(pocket_core::argmax(row), case.output_ids[k], "{what}: step {k} of {:?}", case.text);
}

pub fn config(kv: KvType) -> SessionConfig {
    SessionConfig { kv, n_ctx: 128, threads: pocket_core::Threads::Fixed(1), ..SessionConfig::default() }
}
