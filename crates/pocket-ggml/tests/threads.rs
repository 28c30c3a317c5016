//! What a pass computes does not depend on how many threads compute it: with
//! `threads = "auto"` the count changes from pass to pass as other programs come and go, and a
//! greedy answer must not change with it.
//!
//! Each case decodes a prompt and then greedy steps on 1 thread and on 2 up to the cores (at
//! most 4), and compares every row of logits bit for bit; a
//! session on `auto` gives the same tokens whatever counts it ran on. The prompt crosses 512 cached positions in one case, where
//! ggml's attention would split one query's keys over the threads (see `graph::LoneQuery`).

mod common;

use common::*;
use pocket_core::{KvType, Model, Rows, Session, SessionConfig, Threads, Token};
use pocket_ggml::GgmlModel;

/// Greedy steps after the prompt.
const STEPS: usize = 12;

/// The tokens and logits of the prompt's last token and of `STEPS` greedy steps after it, on
/// `threads` threads.
fn greedy_rows(model: &GgmlModel, prompt: &[Token], kv: KvType, threads: usize) -> (Vec<Token>, Vec<f32>) {
    let plan = full(model);
    let config =
        SessionConfig { kv, n_ctx: prompt.len() + STEPS + 8, threads: Threads::Fixed(threads), ..config(0) };
    let mut s = session(model, &config);
    let (mut picked, mut rows) = (Vec::new(), Vec::new());
    let mut input = prompt.to_vec();
    for _ in 0..=STEPS {
        let logits = s.decode(&input, &plan, Rows::Last).expect("decode");
        let next = pocket_core::argmax(logits.last()) as Token;
        rows.extend_from_slice(logits.last());
        picked.push(next);
        input = vec![next];
    }
    assert_eq!(s.pass_stats().threads, s.pass_stats().passes * threads as u64, "fixed: exactly {threads}");
    (picked, rows)
}

fn same_on_every_count(name: &str, prompt_len: usize, kv: KvType) {
    let _serial = serial();
    let model = model(name);
    let prompt = prose(&model, prompt_len);
    let n_vocab = model.info().n_vocab;
    let (tokens_1, rows_1) = greedy_rows(&model, &prompt, kv, 1);
    // More threads than cores would make the spinning barriers crawl: up to the cores (at
    // least 2, at most 4).
    for threads in 2..=Threads::Auto.max().clamp(2, 4) {
        let (tokens, rows) = greedy_rows(&model, &prompt, kv, threads);
        assert_eq!(tokens, tokens_1, "{name} {kv}: greedy tokens on {threads} threads vs 1");
        assert_bitwise(&format!("{name} {kv}, {threads} threads vs 1"), &rows, &rows_1, n_vocab);
    }
}

#[test]
fn smollm2_f16_long_context() {
    same_on_every_count(SMOL, 600, KvType::F16);
}

#[test]
fn smollm2_q8_0() {
    same_on_every_count(SMOL, 100, KvType::Q8_0);
}

#[test]
fn qwen_f16() {
    same_on_every_count(QWEN, 60, KvType::F16);
}

/// `auto` gives the same tokens as a fixed count, whatever count it picks pass by pass.
#[test]
fn auto_gives_what_one_thread_gives() {
    let _serial = serial();
    let model = smol();
    let prompt = prose(&model, 80);
    let plan = full(&model);
    let run = |threads: Threads| {
        let config = SessionConfig { threads, n_ctx: 128, ..config(0) };
        let mut s = session(&model, &config);
        let mut out = Vec::new();
        let mut next = pocket_core::argmax(s.decode(&prompt, &plan, Rows::Last).unwrap().last()) as Token;
        for _ in 0..STEPS {
            out.push(next);
            next = pocket_core::argmax(s.decode(&[next], &plan, Rows::Last).unwrap().last()) as Token;
        }
        let used = s.pass_stats();
        // The prompt of 80 tokens is read in two passes: a first chunk of 64 (that sessions
        // starting with this one could join), then the rest.
        assert_eq!(used.passes, STEPS as u64 + 2, "every pass counted");
        (out, used)
    };
    let (fixed, used) = run(Threads::Fixed(1));
    assert_eq!(used.threads, used.passes, "one thread each");
    let (auto, used) = run(Threads::Auto);
    assert_eq!(auto, fixed);
    assert!(used.mean() >= 1.0 && used.mean() <= Threads::Auto.max() as f64, "{used:?}");
}
