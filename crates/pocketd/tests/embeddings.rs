//! Embeddings end to end: all-MiniLM-L6-v2 (pulled by `scripts/test`) served by a fresh
//! pocketd, asked by the `openai` package and over D-Bus, checked against the vectors
//! sentence-transformers computes (fixtures/embeddings/, with the script that made them).

mod common;

use std::path::PathBuf;

use common::{Daemon, Setup, root};

fn minilm() -> PathBuf {
    let p = root().join("models/store/all-MiniLM-L6-v2.f16.gguf");
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
    let python = root().join("target/pyenv/bin/python");
    assert!(python.exists(), "the tests need the test venv: run scripts/test");
    let o = std::process::Command::new(&python)
        .arg(root().join("crates/pocketd/tests/embeddings.py"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["--model", "all-minilm-l6-v2"])
        .arg("--fixture")
        .arg(fixture())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("all passed"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn dbus_embed_gives_the_reference_vectors() {
    let d = daemon();
    let fx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let texts: Vec<&str> =
        fx["sentences"].as_array().unwrap()[..4].iter().map(|s| s.as_str().unwrap()).collect();
    let mut args = vec![
        "--json=short",
        "call",
        "org.pocketd.Pocketd1",
        "/org/pocketd/Pocketd1",
        "org.pocketd.Pocketd1",
        "Embed",
        "sasb",
        "all-minilm-l6-v2",
        "4",
    ];
    args.extend(&texts);
    args.push("false");
    let o = d.dbus(&args);
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
    let call = |truncate: &str| {
        d.dbus(&[
            "call",
            "org.pocketd.Pocketd1",
            "/org/pocketd/Pocketd1",
            "org.pocketd.Pocketd1",
            "Embed",
            "sasb",
            "all-minilm-l6-v2",
            "1",
            long,
            truncate,
        ])
    };
    let refused = call("false");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && err.contains("256"), "{err}");
    assert!(call("true").status.success());

    // A text model has no Embed.
    let o = d.dbus(&[
        "call",
        "org.pocketd.Pocketd1",
        "/org/pocketd/Pocketd1",
        "org.pocketd.Pocketd1",
        "Embed",
        "sasb",
        "",
        "1",
        "x",
        "false",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("embedding model"), "{err}");
}
