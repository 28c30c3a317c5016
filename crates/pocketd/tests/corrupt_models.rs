//! Damaged and hostile model files in the models directory: each request for one is refused
//! with what is wrong, nothing is kept in the budget, and the daemon goes on serving the
//! good ones. (Damaged ONNX graphs are refused by pocket-tract: its `bad_input` tests.)

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Daemon, Setup, smollm2, used_without_parked};
use serde_json::json;

/// The built-in manifest's pins of SmolLM2's file.
const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

fn hostile_header() -> Vec<u8> {
    // GGUF v3 claiming 2^50 tensors and no metadata, in 24 bytes.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((1u64 << 50).to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b
}

#[test]
fn damaged_and_hostile_model_files_are_each_refused_with_what_is_wrong() {
    let d = Daemon::start(Setup::default());
    let models = d.dir.path().join("models");
    let real = std::fs::read(smollm2()).unwrap();
    std::fs::write(models.join("empty.gguf"), b"").unwrap();
    std::fs::write(models.join("notes.gguf"), b"these are my notes, not a model\n").unwrap();
    std::fs::write(models.join("cut.gguf"), &real[..real.len() / 2]).unwrap();
    std::fs::write(models.join("many.gguf"), hostile_header()).unwrap();
    // A pulled model whose file changed after the pull: one byte of its weights flipped.
    let mut tampered = real.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x55;
    std::fs::write(models.join("tampered.gguf"), &tampered).unwrap();
    std::fs::write(
        models.join("tampered.toml"),
        format!(
            "name = \"tampered\"\ndescription = \"SmolLM2, changed after its pull\"\nformat = \"gguf\"\n\n\
             [[files]]\nname = \"tampered.gguf\"\nsha256 = \"{SMOLLM2_SHA256}\"\nsize = {}\n\n\
             [[files.sources]]\nkind = \"file\"\npath = {:?}\n",
            real.len(),
            smollm2()
        ),
    )
    .unwrap();
    drop((real, tampered));

    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(code, 200);
    let idle = used_without_parked(&d.idle_status(Duration::from_secs(5)));
    let cases = [
        ("empty", "not a GGUF model"),
        ("notes", "\"thes\""),
        ("cut", "truncated"),
        ("many", "more than a file of 24 bytes"),
        ("tampered", "does not have the sha256 its manifest pins"),
    ];
    for (model, says) in cases {
        let (code, r) = d.post("/v1/completions", &json!({"model": model, "prompt": "Hi", "max_tokens": 2}));
        let message = r["error"]["message"].as_str().unwrap_or_default();
        eprintln!("{model}: {code} {message}");
        assert_eq!(code, 400, "{model}: {r}");
        assert_eq!(r["error"]["param"], "model", "{model}: {r}");
        assert!(message.contains(says), "{model}: {message}");
        // Where the daemon keeps its models is not the client's to see.
        assert!(!message.contains(models.to_str().unwrap()), "{model}: {message}");
    }
    // Nothing of them is held, and the good model still answers.
    let st = d.idle_status(Duration::from_secs(5));
    assert_eq!(used_without_parked(&st), idle, "{st}");
    assert_eq!(st["loaded"].as_array().unwrap().len(), 1, "{st}");
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(code, 200);
    assert!(Path::new(&d.socket).exists());
}
