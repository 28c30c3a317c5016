//! Embedding models on both graphs that compute them — our encoder and llama.cpp's — on
//! all-MiniLM-L6-v2 (pulled by `scripts/test`): each against the vectors sentence-transformers
//! computes (the fixture beside the daemon's embedding tests, with the script that made it),
//! one text at a time against many to a pass, and one thread against two.

mod common;

use pocket_core::{Embedder, Threads, Token};
use pocket_ggml::{DeviceChoice, EmbeddingGraph, EmbeddingModel, LoadOptions};

struct Fixture {
    sentences: Vec<String>,
    /// Before truncation.
    token_counts: Vec<usize>,
    max_seq_length: usize,
    embeddings: Vec<Vec<f32>>,
}

fn fixture() -> Fixture {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pocketd/tests/fixtures/embeddings/all-minilm-l6-v2.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let list = |k: &str| json[k].as_array().unwrap_or_else(|| panic!("{k} in {}", path.display())).clone();
    Fixture {
        sentences: list("sentences").iter().map(|s| s.as_str().unwrap().to_owned()).collect(),
        token_counts: list("token_counts").iter().map(|n| n.as_u64().unwrap() as usize).collect(),
        max_seq_length: json["max_seq_length"].as_u64().unwrap() as usize,
        embeddings: list("embeddings")
            .iter()
            .map(|v| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect(),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
    dot(a, b) / (dot(a, a).sqrt() * dot(b, b).sqrt())
}

fn load(graph: EmbeddingGraph) -> EmbeddingModel {
    let path = common::model_path("all-minilm-l6-v2");
    let options = LoadOptions { device: DeviceChoice::Cpu, ..LoadOptions::default() };
    EmbeddingModel::load_on(&path, &options, graph).expect("all-MiniLM-L6-v2 loads")
}

/// The fixture's sentences as the model's tokens, cut at its length as the reference does.
fn tokens(model: &EmbeddingModel, f: &Fixture) -> Vec<Vec<Token>> {
    let inputs: Vec<Vec<Token>> =
        f.sentences.iter().map(|s| model.truncate(&model.tokenize(s).unwrap())).collect();
    let counts: Vec<usize> = inputs.iter().map(Vec::len).collect();
    let want: Vec<usize> = f.token_counts.iter().map(|&n| n.min(f.max_seq_length)).collect();
    assert_eq!(counts, want, "the reference's tokens, cut at its length");
    inputs
}

#[test]
fn our_encoder_gives_the_reference_vectors_whatever_the_batch_and_threads() {
    let f = fixture();
    let model = load(EmbeddingGraph::Auto);
    assert!(
        model.kernels().starts_with("encoder-f32+gemm-"),
        "BERT on the CPU runs on ours: {}",
        model.kernels()
    );
    let inputs = tokens(&model, &f);
    let batched = model.embed(&inputs, Threads::Fixed(2)).unwrap();
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|t| model.embed(std::slice::from_ref(t), Threads::Fixed(1)).unwrap().remove(0))
        .collect();
    let alone_two: Vec<Vec<f32>> = inputs
        .iter()
        .map(|t| model.embed(std::slice::from_ref(t), Threads::Fixed(2)).unwrap().remove(0))
        .collect();
    for (i, want) in f.embeddings.iter().enumerate() {
        let norm = batched[i].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "sentence {i}: norm {norm}");
        let cos = cosine(&batched[i], want);
        assert!(cos >= 0.99999, "sentence {i}: cosine {cos} with the reference");
        for other in [&alone[i], &alone_two[i]] {
            let diff = batched[i].iter().zip(other.iter()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-5, "sentence {i}: alone and in a batch differ by {diff}");
        }
    }
}

#[test]
fn llama_cpps_graph_gives_the_same_vectors_as_ours() {
    let f = fixture();
    let (ours, theirs) = (load(EmbeddingGraph::Auto), load(EmbeddingGraph::LlamaCpp));
    assert!(theirs.kernels().starts_with("llama.cpp"), "{}", theirs.kernels());
    let inputs = tokens(&ours, &f);
    let a = ours.embed(&inputs, Threads::Fixed(2)).unwrap();
    let b = theirs.embed(&inputs, Threads::Fixed(2)).unwrap();
    for i in 0..inputs.len() {
        // llama.cpp's GELU is the tanh approximation, ours and the reference's use erf.
        let cos = cosine(&a[i], &b[i]);
        assert!(cos >= 0.9999, "sentence {i}: cosine {cos} between the graphs");
        assert!(cosine(&b[i], &f.embeddings[i]) >= 0.999, "sentence {i}: llama.cpp against the reference");
    }
}
