//! `cargo bench --bench ttft`: time to the first token through pocketd's socket against
//! generating in this process, on the same prompt, alternating, in one run.
//!
//! In-process is what `pocket run` does once its model is loaded: make a session, tokenize,
//! prefill, sample, until the first text. Through the socket it is what an app sees: a
//! streamed `/v1/chat/completions` on a warm daemon (model loaded), from connecting until the
//! first chunk with text — HTTP, the chat template, planning under the budget, the session,
//! the prefill, SSE. Both use the default model, greedy, no speculation, the same threads.
//! Prints medians and writes `target/bench/ttft.json`. `POCKET_BENCH_REPS` sets the number of
//! pairs (default 30); `POCKET_BENCH_THREADS` the threads (default: every core).

mod common;

use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Instant;

use pocket_api::client::Client;
use pocket_core::memory::Ledger;
use pocket_core::{ChatMessage, SessionConfig};
use pocket_runtime::pipeline::{self, Input, OnEvent, Request};
use pocket_runtime::{LoadedModel, OpenOptions};

const PROMPT: &str = "In one sentence, what is a Raspberry Pi?";

fn main() -> ExitCode {
    pocket_bench::cargo_bench_main("ttft", run)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// What `pocket run` does once its model is loaded, through the same pipeline as the daemon:
/// render, tokenize, prepare, make the session, prefill, sample, until the first text.
fn in_process(model: &LoadedModel, threads: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut request = Request::new(Input::Chat(vec![ChatMessage::new(pocket_core::Role::User, PROMPT)]));
    request.stop.max_tokens = 8;
    request.session =
        SessionConfig { threads: pocket_core::Threads::Fixed(threads), ..SessionConfig::default() };
    let ledger = Ledger::unlimited();
    let prepared = pipeline::prepare(model, None, &request, &ledger)?;
    let mut first = None;
    pipeline::run(
        model,
        None,
        &prepared,
        &ledger,
        &mut OnEvent::new(|event: pocket_core::Event<'_>| {
            if !event.text.is_empty() && first.is_none() {
                first = Some(start.elapsed().as_secs_f64() * 1e3);
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        }),
    )?;
    first.ok_or_else(|| anyhow::anyhow!("no text generated"))
}

async fn through_socket(client: &Client) -> anyhow::Result<f64> {
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "stream": true, "spec": "off"
    });
    let start = Instant::now();
    let mut first = None;
    client
        .stream("/v1/chat/completions", &body, &mut |data| {
            let v: serde_json::Value = serde_json::from_str(data)?;
            if first.is_none() && v["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty())
            {
                first = Some(start.elapsed().as_secs_f64() * 1e3);
            }
            Ok(())
        })
        .await?;
    first.ok_or_else(|| anyhow::anyhow!("no text streamed"))
}

fn run() -> anyhow::Result<()> {
    let (name, path) = common::default_model()?;
    let threads = common::threads();
    let reps: usize = std::env::var("POCKET_BENCH_REPS").ok().and_then(|t| t.parse().ok()).unwrap_or(30);
    let daemon = common::Daemon::start(threads, "spec = \"off\"\ntune_when_idle = false\n")?;
    let model = LoadedModel::open(&path, &OpenOptions::default())?;
    let client = Client::new(&daemon.socket);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Warm both: the daemon loads its model on the first request.
    rt.block_on(through_socket(&client))?;
    in_process(&model, threads)?;
    let (mut all_local, mut all_remote) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        all_local.push(in_process(&model, threads)?);
        all_remote.push(rt.block_on(through_socket(&client))?);
    }
    drop(daemon);
    let (local, remote) = (median(&mut all_local.clone()), median(&mut all_remote.clone()));
    println!("time to first token, {name}, {threads} threads, {reps} pairs (median):");
    println!("  in-process        {local:8.2} ms");
    println!("  through pocketd   {remote:8.2} ms");
    println!("  difference        {:+8.2} ms", remote - local);
    let report = serde_json::json!({
        "model": name, "threads": threads, "prompt": PROMPT, "reps": reps,
        "in_process_ms_median": local, "socket_ms_median": remote, "difference_ms": remote - local,
        "in_process_ms": all_local, "socket_ms": all_remote,
    });
    std::fs::write(common::out_dir()?.join("ttft.json"), serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}
