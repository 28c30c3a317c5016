//! ggml's RPC backend through the real binaries: `pocket rpc-serve` on loopback, as a board
//! lending its CPU to a peer runs it, and pocketd placing a model too large for its budget on
//! it.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{Daemon, Setup, root};
use pocket_runtime::rpc;
use serde_json::json;

fn pocket(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).output().expect("the pocket binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A `pocket rpc-serve` child, killed when dropped.
struct Server {
    child: Child,
    endpoint: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `pocket rpc-serve` on a free loopback port with `args`, once it answers a probe.
fn rpc_serve(args: &[&str]) -> Server {
    rpc_serve_on(&format!("127.0.0.1:{}", free_port()), args)
}

/// `pocket rpc-serve` on `endpoint` with `args`, once it answers a probe.
fn rpc_serve_on(endpoint: &str, args: &[&str]) -> Server {
    let endpoint = endpoint.to_owned();
    let child = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(["rpc-serve", "--listen", &endpoint, "--threads", "1"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("pocket rpc-serve starts");
    let server = Server { child, endpoint };
    for _ in 0..200 {
        if rpc::probe(&server.endpoint, Duration::from_secs(1)).is_ok() {
            return server;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("pocket rpc-serve on {} did not answer", server.endpoint);
}

#[test]
fn version_names_the_rpc_protocol() {
    let o = pocket(&["--version"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let protocol = rpc::protocol().expect("RPC is in every build");
    assert!(out.contains(&format!("ggml RPC protocol {protocol}")), "{out}");
}

#[test]
fn rpc_serve_offers_peers_the_memory_it_was_given() {
    let server = rpc_serve(&["--memory", "200MiB"]);
    let peer = rpc::probe(&server.endpoint, Duration::from_secs(2)).unwrap();
    assert_eq!(peer.version.to_string(), rpc::protocol().unwrap());
    assert_eq!(peer.devices.len(), 1);
    assert_eq!(peer.devices[0].total_bytes, 200 << 20);
    assert_eq!(peer.devices[0].free_bytes, 200 << 20);
    assert!(peer.round_trip < Duration::from_secs(1), "{:?}", peer.round_trip);
}

#[test]
fn rpc_serve_refuses_a_network_address_without_the_flag() {
    let o = pocket(&["rpc-serve", "--listen", "0.0.0.0:50999", "--memory", "10MiB"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("not a loopback address") && err.contains("--allow-network"), "{err}");

    let o = pocket(&["rpc-serve", "--listen", "[::1]:50999"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IPv4 addresses only"), "{}", stderr(&o));
}

#[test]
fn a_port_in_use_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = taken.local_addr().unwrap().to_string();
    let o = pocket(&["rpc-serve", "--listen", &endpoint, "--memory", "10MiB", "--threads", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("address is in use"), "{}", stderr(&o));
}

/// Qwen2.5-Coder-1.5B (1.04 GiB of weights), pulled by `scripts/test`.
fn qwen_1_5b() -> std::path::PathBuf {
    let p = root().join("models/store/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    assert!(p.is_file(), "run: pocket pull qwen2.5-coder-1.5b (missing {})", p.display());
    p
}

fn ask(d: &Daemon) -> (u16, serde_json::Value) {
    ask_for(d, "qwen-1.5b", 12)
}

fn ask_for(d: &Daemon, model: &str, max_tokens: u32) -> (u16, serde_json::Value) {
    d.post(
        "/v1/chat/completions",
        &json!({
            "model": model,
            "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
            "max_tokens": max_tokens,
        }),
    )
}

#[test]
fn a_model_too_large_for_the_budget_runs_with_its_last_layers_on_a_peer() {
    let setup = || Setup { models: vec![("qwen-1.5b.gguf".into(), qwen_1_5b())], ..Setup::default() };
    // Alone, 700 MiB cannot hold its weights.
    let alone = Daemon::start(setup().with_budget("700MiB"));
    let (code, body) = ask(&alone);
    assert_ne!(code, 200, "the model fit alone: {body}");
    assert!(body.to_string().contains("budget"), "{body}");
    drop(alone);

    let server = rpc_serve(&["--memory", "1GiB"]);
    let mut with_peer = setup().with_budget("700MiB");
    with_peer.extra.push_str(&format!("rpc = [{:?}]\n", server.endpoint));
    let d = Daemon::start(with_peer);
    let (code, body) = ask(&d);
    assert_eq!(code, 200, "{body}\n{}", d.log());
    let answer = body["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(!answer.trim().is_empty(), "{body}");

    let status = d.get("/v1/status");
    let model = &status["loaded"][0];
    let placement = model["placement"].as_array().expect("a split model shows its placement");
    let on_peer: u64 = placement
        .iter()
        .filter(|run| run["peer"] == server.endpoint.as_str())
        .map(|run| run["n_layers"].as_u64().unwrap())
        .sum();
    let here: u64 = placement
        .iter()
        .filter(|run| run["peer"].is_null())
        .map(|run| run["n_layers"].as_u64().unwrap())
        .sum();
    assert!(on_peer > 0 && here > 0 && on_peer + here == 28, "{placement:?}");
    // This process keeps within its budget: what it reserved, and what is resident.
    let budget = status["memory"]["budget_bytes"].as_u64().unwrap();
    assert!(status["memory"]["peak_bytes"].as_u64().unwrap() <= budget, "{status}");
    assert!(status["memory"]["resident_bytes"].as_u64().unwrap() < budget, "{status}");
    assert_eq!(status["rpc"]["protocol"], rpc::protocol().unwrap());
    let peer = &status["rpc"]["peers"][0];
    assert_eq!(peer["peer"], server.endpoint.as_str(), "{status}");
    assert_eq!(peer["connected"], true, "{status}");
    assert!(peer["round_trip_last_us"].as_u64().is_some(), "{status}");
    // The weights on the peer crossed the link.
    assert!(peer["bytes_to_peer"].as_u64().unwrap() > 500 << 20, "{status}");
}

#[test]
fn a_peer_killed_mid_request_fails_that_request_and_the_model_comes_back_with_it() {
    let endpoint = format!("127.0.0.1:{}", free_port());
    let server = rpc_serve_on(&endpoint, &["--memory", "1GiB"]);
    let mut setup = Setup { models: vec![("qwen-1.5b.gguf".into(), qwen_1_5b())], ..Setup::default() };
    setup = setup.with_budget("700MiB");
    setup.extra.push_str(&format!("rpc = [{endpoint:?}]\n"));
    let d = Daemon::start(setup);
    assert_eq!(ask(&d).0, 200, "{}", d.log());

    let killed = std::thread::scope(|s| {
        let long = s.spawn(|| ask_for(&d, "qwen-1.5b", 1000));
        d.wait_generating();
        std::thread::sleep(Duration::from_millis(500));
        drop(server);
        let killed = std::time::Instant::now();
        let (code, body) = long.join().unwrap();
        assert_eq!(code, 503, "{body}");
        assert_eq!(body["error"]["code"], "peer_unavailable", "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(&endpoint), "{body}");
        killed.elapsed()
    });
    assert!(killed < Duration::from_secs(10), "the request failed {killed:?} after the peer died");

    // The daemon is up and its other models serve; the split model waits for its peer.
    assert_eq!(ask_for(&d, "smollm2", 8).0, 200, "{}", d.log());
    let (code, body) = ask(&d);
    assert_eq!(code, 503, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("is down"), "{body}");

    let _back = rpc_serve_on(&endpoint, &["--memory", "1GiB"]);
    let (code, body) = ask(&d);
    assert_eq!(code, 200, "{body}\n{}", d.log());
}
