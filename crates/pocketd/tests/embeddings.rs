//! Embeddings end to end: all-MiniLM-L6-v2 (pulled by `scripts/test`) served by a fresh
//! pocketd, asked by the `openai` package and over D-Bus, checked against the vectors
//! sentence-transformers computes (fixtures/embeddings/, with the script that made them).

mod common;

use std::path::PathBuf;

use common::{Daemon, Setup, python_checks, root};

fn minilm() -> PathBuf {
    let p = root().join("models/store/all-MiniLM-L6-v2.f32.gguf");
    assert!(p.exists(), "{} is missing: run `pocket pull all-minilm-l6-v2` (scripts/test does)", p.display());
    p
}

fn fixture() -> PathBuf {
    root().join("crates/pocketd/tests/fixtures/embeddings/all-minilm-l6-v2.json")
}

fn daemon() -> Daemon {
    Daemon::start(Setup {
        dbus: true,
        models: vec![("all-minilm-l6-v2.gguf".into(), minilm())],
        ..Setup::default()
    })
}

#[test]
fn the_openai_client_gets_the_reference_vectors_and_clear_refusals() {
    let d = daemon();
    let fixture = fixture();
    python_checks(
        &d,
        "embeddings.py",
        &["--model", "all-minilm-l6-v2", "--fixture", fixture.to_str().unwrap()],
    );
}

/// `Embed` through busctl (`flags` before the call, `--json=short`).
fn embed(d: &Daemon, flags: &[&str], model: &str, texts: &[&str], truncate: bool) -> std::process::Output {
    let n = texts.len().to_string();
    let mut args = vec![model, &n];
    args.extend(texts);
    args.push(if truncate { "true" } else { "false" });
    d.busctl_call(flags, "Embed", "sasb", &args)
}

#[test]
fn dbus_embed_gives_the_reference_vectors() {
    let d = daemon();
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let texts: Vec<&str> =
        fx["sentences"].as_array().unwrap()[..4].iter().map(|s| s.as_str().unwrap()).collect();
    let o = embed(&d, &["--json=short"], "all-minilm-l6-v2", &texts, false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let vectors = reply["data"][0].as_array().unwrap();
    assert_eq!(vectors.len(), 4);
    for (i, v) in vectors.iter().enumerate() {
        let ours: Vec<f64> = v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let theirs: Vec<f64> =
            fx["embeddings"][i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(ours.len(), 384);
        let dot: f64 = ours.iter().zip(&theirs).map(|(a, b)| a * b).sum();
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cos = dot / norm(&ours) / norm(&theirs);
        assert!(cos >= 0.999, "sentence {i}: cosine {cos}");
        assert!((norm(&ours) - 1.0).abs() < 1e-4, "sentence {i} is not a unit vector");
    }

    // A text over the model's length: refused by name, unless truncated.
    let long = fx["sentences"][fx["long"][0].as_u64().unwrap() as usize].as_str().unwrap();
    let refused = embed(&d, &[], "all-minilm-l6-v2", &[long], false);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("256"), "{err}");
    assert!(embed(&d, &[], "all-minilm-l6-v2", &[long], true).status.success());

    // A text model has no Embed.
    let o = embed(&d, &[], "", &["x"], false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("embedding model"), "{err}");
}
