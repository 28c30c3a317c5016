//! `cargo bench --bench grammar`: what a JSON schema costs and what its forced tokens save, on
//! the default model, through the request pipeline the daemon uses, in one run.
//!
//! For each schema of `tests/fixtures/schemas.json` (with its prompt) it generates, alternating:
//! free text (no schema) to time a plain decode step; the schema with plain decoding (`off`):
//! the grammar's per-token cost (token masks, advancing the parser) against that step; and the
//! schema with speculation (`suffix`, `auto`): the grammar's forced tokens drafted for free,
//! which must give exactly the tokens of `off`. Prints the totals and writes
//! `target/bench/grammar.json`. `POCKET_BENCH_THREADS` sets the threads (default: every core).

mod common;

use std::ops::ControlFlow;
use std::process::ExitCode;

use anyhow::{Context, ensure};
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{ChatMessage, Generation, Role, SessionConfig};
use pocket_runtime::grammar::Grammar;
use pocket_runtime::pipeline::{self, Input, OnEvent, Request};
use pocket_runtime::{LoadedModel, OpenOptions};
use serde_json::{Value, json};

fn main() -> ExitCode {
    pocket_bench::cargo_bench_main("grammar", run)
}

fn generate(
    model: &LoadedModel,
    prompt: &str,
    grammar: Option<&Value>,
    spec: SpecMode,
    threads: usize,
) -> anyhow::Result<Generation> {
    let mut r = Request::new(Input::Chat(vec![ChatMessage::new(Role::User, prompt)]));
    r.grammar = grammar.map(|schema| Grammar::JsonSchema { schema: schema.clone(), strict: true });
    r.spec = spec;
    r.stop.max_tokens = 400;
    r.prompt_cache = false;
    r.session = SessionConfig {
        threads: pocket_core::Threads::Fixed(threads),
        n_ctx: 2048,
        ..SessionConfig::default()
    };
    let ledger = Ledger::unlimited();
    let prepared = pipeline::prepare(model, None, &r, &ledger)?;
    let outcome =
        pipeline::run(model, None, &prepared, &ledger, &mut OnEvent::new(|_| ControlFlow::Continue(())))?;
    Ok(outcome.generation)
}

/// Seconds per generated token after the first.
fn step(g: &Generation) -> f64 {
    g.decode_seconds / (g.tokens.len().saturating_sub(1).max(1)) as f64
}

fn run() -> anyhow::Result<()> {
    let threads = common::threads();
    let (name, path) = common::default_model()?;
    let model = LoadedModel::open(&path, &OpenOptions::default())?;
    let schemas: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas.json"),
    )?)?;
    println!("grammar: {name}, {threads} threads, kernels {}, {} schemas", model.kernels(), schemas.len());
    let modes = [SpecMode::Suffix, SpecMode::Auto];
    let (mut free_step, mut plain_s, mut plain_tokens, mut mask_s) = (0.0, 0.0, 0usize, 0.0);
    let mut spec_s = vec![0.0; modes.len()];
    let mut forced = vec![(0usize, 0usize); modes.len()];
    let mut rows = Vec::new();
    for case in &schemas {
        let (prompt, schema) = (case["prompt"].as_str().context("prompt")?, &case["schema"]);
        let free = generate(&model, prompt, None, SpecMode::Off, threads)?;
        let plain = generate(&model, prompt, Some(schema), SpecMode::Off, threads)?;
        serde_json::from_str::<Value>(&plain.text)
            .with_context(|| format!("{}: not JSON: {}", case["name"], plain.text))?;
        let n = plain.tokens.len().saturating_sub(1);
        free_step += step(&free) * n as f64;
        plain_s += plain.decode_seconds;
        plain_tokens += n;
        mask_s += plain.spec.constraint_seconds;
        let mut row = json!({"schema": case["name"], "tokens": plain.tokens.len(),
            "free_step_ms": step(&free) * 1e3, "off_step_ms": step(&plain) * 1e3,
            "mask_ms_per_token": plain.spec.constraint_seconds / plain.tokens.len().max(1) as f64 * 1e3});
        for (i, &mode) in modes.iter().enumerate() {
            let fast = generate(&model, prompt, Some(schema), mode, threads)?;
            ensure!(fast.tokens == plain.tokens, "{}: {mode} changed the tokens", case["name"]);
            spec_s[i] += fast.decode_seconds;
            forced[i].0 += fast.spec.forced;
            forced[i].1 += fast.spec.forced_accepted;
            row[format!("{mode}_step_ms")] = json!(step(&fast) * 1e3);
        }
        rows.push(row);
    }
    let mask_per_token = mask_s / plain_tokens.max(1) as f64;
    let free_per_token = free_step / plain_tokens.max(1) as f64;
    println!(
        "mask: {:.3} ms per token = {:.1}% of a decode step ({:.2} ms, free text on the same prompts)",
        mask_per_token * 1e3,
        100.0 * mask_per_token / free_per_token,
        free_per_token * 1e3
    );
    println!("off (constrained plain decoding): {:.1} tok/s", plain_tokens as f64 / plain_s);
    for (i, mode) in modes.iter().enumerate() {
        println!(
            "{mode}: {:.1} tok/s, {:.2}x off, identical tokens; forced tokens drafted {}, accepted {}",
            plain_tokens as f64 / spec_s[i],
            plain_s / spec_s[i],
            forced[i].0,
            forced[i].1
        );
    }
    let out = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("target/bench");
    std::fs::create_dir_all(&out)?;
    let report = json!({"model": name, "threads": threads, "kernels": model.kernels(), "schemas": rows,
        "mask_ms_per_token": mask_per_token * 1e3, "free_step_ms": free_per_token * 1e3,
        "off_tok_per_s": plain_tokens as f64 / plain_s,
        "speedup": modes.iter().enumerate().map(|(i, m)| (m.to_string(), json!(plain_s / spec_s[i]))).collect::<serde_json::Map<_, _>>()});
    std::fs::write(out.join("grammar.json"), serde_json::to_string_pretty(&report)?)?;
    Ok(())
}
