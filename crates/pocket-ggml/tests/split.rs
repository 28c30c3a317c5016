//! A model split across this machine and a peer through ggml's RPC backend: the peer is a real
//! RPC server (ours, `pocket_ggml::rpc::serve`, as `pocket rpc-serve` runs it) on loopback in
//! this process. The split gives the unsplit model's logits to rounding, and speculation across
//! it gives plain decoding's tokens exactly.

mod common;

use std::sync::OnceLock;

use common::*;
use pocket_core::cost::CostModel;
use pocket_core::spec::{AutoConfig, AutoDrafter, Drafter, SuffixDrafter};
use pocket_core::{Model, Rows, Session};
use pocket_ggml::rpc::{RemoteLayers, SplitOptions, serve_on_loopback};
use pocket_ggml::{AttentionKernel, DeviceChoice, GgmlModel, LoadOptions, Repack};

/// The peer: a CPU lending 512 MiB on a free loopback port, one per test process (a process
/// lends one device).
fn peer() -> &'static str {
    static ENDPOINT: OnceLock<String> = OnceLock::new();
    ENDPOINT.get_or_init(|| serve_on_loopback(512 << 20, THREADS).expect("an RPC server on loopback"))
}

/// `name` with its last `remote` layers on the peer, attending with ggml's flash attention
/// (what the layers on the peer use; our own CPU attention kernel is for unsplit models), its
/// weights as stored (the peer's are: ggml's Q4_K layout for 4 tokens at once rounds otherwise
/// than its one-row kernel, which is what the peer runs).
fn split(name: &str, remote: usize) -> GgmlModel {
    static MODELS: std::sync::Mutex<Vec<(String, usize, GgmlModel)>> = std::sync::Mutex::new(Vec::new());
    let mut models = MODELS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((.., m)) = models.iter().find(|(n, r, _)| n == name && *r == remote) {
        return m.clone();
    }
    let options = LoadOptions {
        device: DeviceChoice::Cpu,
        attention: AttentionKernel::Ggml,
        repack: Repack::None,
        split: Some(SplitOptions { peers: vec![peer().to_owned()], layers: RemoteLayers::Last(remote) }),
        ..LoadOptions::default()
    };
    let m = GgmlModel::load(&model_path(name), &options).expect("the split model loads");
    let placement = &m.info().placement;
    let on_peer =
        placement.iter().filter(|p| p.peer.as_deref() == Some(peer())).map(|p| p.n_layers).sum::<usize>();
    assert_eq!(on_peer, remote.min(m.info().n_layers), "{placement:?}");
    models.push((name.to_owned(), remote, m.clone()));
    m
}

fn unsplit(name: &str) -> GgmlModel {
    let options = LoadOptions {
        device: DeviceChoice::Cpu,
        attention: AttentionKernel::Ggml,
        repack: Repack::None,
        ..LoadOptions::default()
    };
    GgmlModel::load(&model_path(name), &options).expect("the model loads")
}

#[test]
fn split_logits_match_the_unsplit_model() {
    let _serial = serial();
    logits_match(SMOL, 15);
    // Q4_K and Q6_K matrices, and a verification-width probe at load that puts our CPU ops
    // beside the peer's output.
    logits_match(QWEN, 12);
}

fn logits_match(name: &str, remote: usize) {
    let (whole, half) = (unsplit(name), split(name, remote));
    let prompt = prose(&whole, 48);
    let n_vocab = whole.info().n_vocab;
    let mut a = session(&whole, &config(256));
    let mut b = session(&half, &config(256));
    let la = collect(&a.decode(&prompt, &full(&whole), Rows::Tail(prompt.len())).unwrap());
    let lb = collect(&b.decode(&prompt, &full(&half), Rows::Tail(prompt.len())).unwrap());
    let mut worst = 0f32;
    for (i, (x, y)) in la.chunks(n_vocab).zip(lb.chunks(n_vocab)).enumerate() {
        worst = worst.max(max_abs_diff(x, y));
        assert_eq!(pocket_core::argmax(x), pocket_core::argmax(y), "row {i}: top-1 differs");
    }
    // Decode steps after the prompt.
    let mut next = pocket_core::argmax(&la[la.len() - n_vocab..]) as u32;
    for step in 0..8 {
        let x = collect(&a.decode(&[next], &full(&whole), Rows::Last).unwrap());
        let y = collect(&b.decode(&[next], &full(&half), Rows::Last).unwrap());
        worst = worst.max(max_abs_diff(&x, &y));
        assert_eq!(pocket_core::argmax(&x), pocket_core::argmax(&y), "step {step}: top-1 differs");
        next = pocket_core::argmax(&x) as u32;
    }
    eprintln!(
        "{name} split across a loopback peer vs unsplit: max |Δ| {worst:e} over 48 prompt rows and 8 steps"
    );
    // ggml's kernels on both sides of the link; what differs is where each runs. llama.cpp's
    // own noise against us on this model is of this order (pocket parity).
    assert!(worst < 0.05, "max |Δ| {worst}");
}

#[test]
fn greedy_speculation_across_the_split_equals_plain_decoding() {
    let _serial = serial();
    let model = split(SMOL, 15);
    let prompt = chat(&model, "Rename the variable `n` to `count` in: def f(n):\n    return n * n + n\n");
    let run = |drafter: Option<&mut dyn Drafter>| greedy(&model, &prompt, 48, drafter);
    let plain = run(None);
    assert!(plain.tokens.len() > 8, "too short: {:?}", plain.text);
    let flat = CostModel::linear(0.0);
    let drafters: Vec<Box<dyn Drafter>> = vec![
        Box::new(SuffixDrafter::with_cost(8, flat.clone())),
        Box::new(AutoDrafter::new(AutoConfig::new(flat), None, None)),
    ];
    for mut d in drafters {
        let spec = run(Some(d.as_mut()));
        let what = d.report();
        assert_eq!(spec.tokens, plain.tokens, "{what}: {:?} vs {:?}", spec.text, plain.text);
        if model.info().exact_passes.as_ref().is_none_or(|e| e.allows_drafts()) {
            assert!(spec.spec.drafted > 0, "{what}: nothing was drafted");
        }
        eprintln!(
            "{what}: drafted {} accepted {} in {} passes",
            spec.spec.drafted, spec.spec.accepted, spec.spec.passes
        );
    }
}

#[test]
fn a_peer_that_is_down_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = LoadOptions {
        device: DeviceChoice::Cpu,
        split: Some(SplitOptions { peers: vec![format!("127.0.0.1:{port}")], layers: RemoteLayers::Last(4) }),
        ..LoadOptions::default()
    };
    let err = GgmlModel::load(&model_path(SMOL), &options).err().expect("no peer, no split").to_string();
    assert!(err.contains(&format!("peer 127.0.0.1:{port} is down")), "{err}");
}

#[test]
fn a_split_cache_grows_past_its_first_block() {
    let _serial = serial();
    let (whole, half) = (unsplit(SMOL), split(SMOL, 15));
    let prompt = prose(&whole, 200);
    let mut a = session(&whole, &config(1024));
    let mut b = session(&half, &config(1024));
    let la = collect(&a.decode(&prompt, &full(&whole), Rows::Last).unwrap());
    let lb = collect(&b.decode(&prompt, &full(&half), Rows::Last).unwrap());
    assert_eq!(pocket_core::argmax(&la), pocket_core::argmax(&lb));
    let mut next = pocket_core::argmax(&la) as u32;
    // Past 256 positions the cache of both sides of the link is reallocated.
    for step in 0..120 {
        let x = collect(&a.decode(&[next], &full(&whole), Rows::Last).unwrap());
        let y = collect(&b.decode(&[next], &full(&half), Rows::Last).unwrap());
        assert_eq!(pocket_core::argmax(&x), pocket_core::argmax(&y), "step {step}: top-1 differs");
        next = pocket_core::argmax(&x) as u32;
    }
}

#[test]
fn a_peer_of_another_protocol_is_refused_by_name() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    // A server of protocol 6.0.0: it answers the handshake with its version.
    std::thread::spawn(move || {
        for mut sock in listener.incoming().flatten() {
            let mut hello = [0u8; 1 + 8 + 24];
            if sock.read_exact(&mut hello).is_err() {
                continue;
            }
            let mut reply = 28u64.to_le_bytes().to_vec();
            reply.extend([6, 0, 0, 0]);
            reply.extend([0u8; 24]);
            let _ = sock.write_all(&reply);
        }
    });
    let options = LoadOptions {
        device: DeviceChoice::Cpu,
        split: Some(SplitOptions { peers: vec![endpoint.clone()], layers: RemoteLayers::Last(4) }),
        ..LoadOptions::default()
    };
    let err = GgmlModel::load(&model_path(SMOL), &options).err().expect("refused").to_string();
    assert!(err.contains(&format!("peer {endpoint} speaks RPC protocol 6.0.0")), "{err}");
}

/// A file our graph does not build (OLMo-2, synthetic) on llama.cpp's graph with its last
/// layers on the peer, as llama.cpp's `--rpc` places them: the same greedy tokens as unsplit.
#[test]
fn llama_cpps_graph_splits_the_same_way() {
    let _serial = serial();
    let path = Synthetic { arch: "olmo2", args: &[], weights: "f16" }.path();
    let load = |split: Option<SplitOptions>| {
        let options = LoadOptions { device: DeviceChoice::Cpu, split, ..LoadOptions::default() };
        pocket_ggml::LlamaCppModel::load(&path, &options).expect("llama.cpp loads it")
    };
    let whole = load(None);
    let n_layers = whole.info().n_layers;
    let half =
        load(Some(SplitOptions { peers: vec![peer().to_owned()], layers: RemoteLayers::Last(n_layers / 2) }));
    let on_peer: usize = half.info().placement.iter().filter(|p| p.peer.is_some()).map(|p| p.n_layers).sum();
    assert_eq!(on_peer, n_layers / 2, "{:?}", half.info().placement);
    let generate = |model: &dyn Model| {
        let prompt =
            model.tokenizer().encode("one two three four five six seven one two three", true).unwrap();
        greedy(model, &prompt, 24, None).tokens
    };
    assert_eq!(generate(&half), generate(&whole));
}

/// A model that fits is not split, and its peers are not even asked (this one is down).
#[test]
fn a_model_that_fits_stays_whole() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let options = LoadOptions {
        device: DeviceChoice::Cpu,
        split: Some(SplitOptions {
            peers: vec![format!("127.0.0.1:{port}")],
            layers: RemoteLayers::Fit { local_bytes: 1 << 30 },
        }),
        ..LoadOptions::default()
    };
    let model = GgmlModel::load(&model_path(SMOL), &options).expect("it fits");
    assert!(model.info().placement.is_empty(), "{:?}", model.info().placement);
}
