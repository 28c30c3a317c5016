//! `cargo bench --bench fresh`: what a new user's first short requests get from a fresh
//! daemon with its default settings (`spec = auto`, learning while idle), against the same
//! requests with `"spec": "off"`, alternating, through the socket.
//!
//! 1. A fresh pocketd on the default model with an empty cache directory. Ten short chat
//!    questions (at most 40 tokens each, the D-Bus case), each asked twice in a row — once
//!    with the daemon's default and once with speculation off, the order alternating — with
//!    no pause, as an app asks them. Nothing is measured on this device yet, so `auto` must
//!    not cost anything.
//! 2. The daemon is left idle until it has learned what `auto` needs (its `/v1/status` says
//!    while it learns), then the same pairs again: what `auto` does once it knows the device.
//!
//! Speeds are the daemon's own decode tok/s (the tokens after the first over their time);
//! the ratio is the median over pairs of auto over off. Prints a table and writes
//! `target/bench/fresh.json`. `POCKET_BENCH_THREADS` sets the threads (default: every core).

mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use pocket_api::client::Client;

const QUESTIONS: [&str; 10] = [
    "In one sentence, what is a Raspberry Pi?",
    "Name the capital of Italy.",
    "What does a thermostat do? Answer briefly.",
    "Give one word that rhymes with light.",
    "In one sentence, why is the sky blue?",
    "What is 12 times 12?",
    "Suggest a name for a grey cat.",
    "In one sentence, what is D-Bus?",
    "Which planet is closest to the sun?",
    "Say good morning in French.",
];

/// Most tokens per answer.
const MAX_TOKENS: u32 = 40;

/// The longest the daemon gets to learn while idle.
const LEARN_WITHIN: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    pocket_bench::cargo_bench_main("fresh", run)
}

/// One answer's figures, from the daemon's `timings`.
#[derive(Debug, Clone, serde::Serialize)]
struct Answer {
    question: &'static str,
    spec: &'static str,
    generated: u32,
    decode_tok_per_s: f64,
    prefill_ms: f64,
    drafter: Option<String>,
}

async fn ask(client: &Client, question: &'static str, off: bool) -> anyhow::Result<Answer> {
    let mut body = serde_json::json!({
        "messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS,
    });
    if off {
        body["spec"] = "off".into();
    }
    let r: pocket_api::ChatCompletion = client.post("/v1/chat/completions", &body).await?;
    let t = r.timings.unwrap_or_default();
    Ok(Answer {
        question,
        spec: if off { "off" } else { "default (auto)" },
        generated: r.usage.completion_tokens,
        decode_tok_per_s: t.decode_tok_per_s,
        prefill_ms: t.prefill_ms,
        drafter: t.drafter,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Every question as a pair (default, off), the order alternating; the ratio of each pair.
async fn pairs(client: &Client) -> anyhow::Result<(Vec<Answer>, Vec<f64>)> {
    let (mut answers, mut ratios) = (Vec::new(), Vec::new());
    for (i, q) in QUESTIONS.iter().enumerate() {
        let (auto, off) = if i % 2 == 0 {
            let a = ask(client, q, false).await?;
            (a, ask(client, q, true).await?)
        } else {
            let o = ask(client, q, true).await?;
            (ask(client, q, false).await?, o)
        };
        if auto.generated >= 2 && off.decode_tok_per_s > 0.0 {
            ratios.push(auto.decode_tok_per_s / off.decode_tok_per_s);
        }
        answers.extend([auto, off]);
    }
    Ok((answers, ratios))
}

fn print(title: &str, answers: &[Answer], ratios: &[f64]) {
    println!("{title}");
    println!("  {:<46} {:>15} {:>4} {:>9} {:>9}  drafter", "question", "spec", "tok", "tok/s", "prefill");
    for a in answers {
        println!(
            "  {:<46} {:>15} {:>4} {:>9.1} {:>7.1}ms  {}",
            a.question,
            a.spec,
            a.generated,
            a.decode_tok_per_s,
            a.prefill_ms,
            a.drafter.as_deref().unwrap_or("-")
        );
    }
    let speed =
        |spec: &str| median(answers.iter().filter(|a| a.spec == spec).map(|a| a.decode_tok_per_s).collect());
    println!(
        "  median decode: default {:.1} tok/s, off {:.1} tok/s; median of per-pair ratios {:.3}x (min {:.3}x)\n",
        speed("default (auto)"),
        speed("off"),
        median(ratios.to_vec()),
        ratios.iter().copied().fold(f64::INFINITY, f64::min)
    );
}

fn run() -> anyhow::Result<()> {
    let (name, _) = common::default_model()?;
    let threads = common::threads();
    // The defaults but for where it listens, its models and its threads.
    let daemon = common::Daemon::start(threads, "")?;
    let client = Client::new(&daemon.socket);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = (|| {
        let fresh = rt.block_on(pairs(&client))?;
        // Idle until the daemon has learned what auto needs (its status says so).
        let idle = Instant::now();
        loop {
            let status: pocket_api::Status = rt.block_on(client.get("/v1/status"))?;
            if status.loaded.iter().all(|m| m.tuned == Some(true)) && status.learning.is_none() {
                break;
            }
            anyhow::ensure!(idle.elapsed() < LEARN_WITHIN, "pocketd learned nothing within {LEARN_WITHIN:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let learned_in = idle.elapsed().as_secs_f64();
        let tuned = rt.block_on(pairs(&client))?;
        Ok((fresh, learned_in, tuned))
    })();
    let ((fresh, fresh_ratios), learned_in, (tuned, tuned_ratios)) =
        result.map_err(|e: anyhow::Error| e.context(daemon.log()))?;
    drop(daemon);
    println!(
        "{name}, {threads} threads, a fresh pocketd with the default settings, {MAX_TOKENS} tokens at most\n"
    );
    print("1. fresh: nothing measured on this device yet", &fresh, &fresh_ratios);
    println!("(the daemon learned while idle for {learned_in:.1} s)\n");
    print("2. after learning while idle", &tuned, &tuned_ratios);
    let report = serde_json::json!({
        "model": name, "threads": threads, "max_tokens": MAX_TOKENS,
        "fresh": {"answers": fresh, "ratio_median": median(fresh_ratios.clone()), "ratios": fresh_ratios},
        "learned_in_seconds": learned_in,
        "tuned": {"answers": tuned, "ratio_median": median(tuned_ratios.clone()), "ratios": tuned_ratios},
    });
    std::fs::write(common::out_dir()?.join("fresh.json"), serde_json::to_vec_pretty(&report)?)?;
    Ok(())
}
