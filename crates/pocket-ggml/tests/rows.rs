//! `Rows`: which logits a pass returns, and how a batch is split into passes.
//!
//! Where two computations have the same pass shapes they must agree bitwise. Where the shapes
//! differ (a 40-token batch against 40 one-token passes, one pass of 300 tokens against passes
//! of 100) every row is still computed from the same inputs, but ggml's CPU kernels may take
//! other paths for other numbers of rows (matrix-vector against tiled matrix-matrix products,
//! with tiles that depend on the row count; on some CPUs these sum in different orders). So
//! there the rows must pick the same token and agree to within 1e-3: far below what could
//! change a sampled token, far above rounding noise. (On x86-64 with AVX-512 they are in fact
//! bitwise equal.)
//!
//! One path change is far larger and is avoided here: ggml's CPU flash attention handles a pass
//! of fewer than 64 query rows (`GGML_FA_TILE_Q`) one row at a time, with Q rounded to f16 and,
//! for an f16 cache, the weighted sum of V accumulated in f16, while passes of 64 rows or more
//! go through a tiled kernel in f32. The last row of a prompt decoded in passes of 64 (the last
//! one 44 tokens) differs from one pass of 300 by about 1 logit on SmolLM2; llama.cpp's own
//! results differ exactly as much for n_ubatch 64 against 512 (see parity.rs). Comparisons
//! below keep both sides on the same side of that line.

mod common;

use common::*;
use pocket_core::{Model, Rows, Session};
use pocket_ggml::MAX_LOGIT_ROWS;

/// Tolerance between computations of the same rows in differently shaped passes.
const TOL: f32 = 1e-3;

#[test]
fn last_is_the_last_row_of_the_whole_tail() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let prompt = prose(&model, 24);

    let mut a = session(&model, &config(64));
    let last = collect(&a.decode(&prompt, &full(&model), Rows::Last).unwrap());
    assert_eq!(last.len(), n_vocab, "Rows::Last is one row");

    let mut b = session(&model, &config(64));
    let tail = b.decode(&prompt, &full(&model), Rows::Tail(prompt.len())).unwrap();
    assert_eq!(tail.rows(), prompt.len());
    // Rows::Last computes the last layer's feed-forward and the output projection for one row
    // only, Rows::Tail(n) for all n; the row is the same row either way.
    assert_bitwise("Rows::Last vs the last row of Rows::Tail(n)", &last, tail.last(), n_vocab);
}

#[test]
fn none_returns_no_rows_but_fills_the_cache() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let prompt = prose(&model, 24);
    let (head, last) = prompt.split_at(prompt.len() - 1);

    let mut split = session(&model, &config(64));
    let none = split.decode(head, &plan, Rows::None).unwrap();
    assert_eq!(none.rows(), 0);
    assert_eq!(split.len(), head.len());
    // The pass that returns no rows still wrote every layer's KV (the last layer's included,
    // whose output nothing reads): the next token sees the whole prompt.
    let got = collect(&split.decode(last, &plan, Rows::Last).unwrap());

    let mut whole = session(&model, &config(64));
    let expected = collect(&whole.decode(&prompt, &plan, Rows::Last).unwrap());
    // 23 + 1 tokens against 24 in one pass: shapes differ (see the top of this file).
    let d = assert_close("Rows::None then one token vs the whole prompt", &got, &expected, n_vocab, TOL);
    eprintln!("Rows::None prefill vs one pass: max |Δ| {d:e}");
}

#[test]
fn a_tail_longer_than_max_logit_rows_equals_its_passes_and_one_token_at_a_time() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let prompt = prose(&model, 16);
    let n = MAX_LOGIT_ROWS + 8;
    let more = other_prose(&model, n);

    let mut batched = session(&model, &config(128));
    batched.decode(&prompt, &plan, Rows::Last).unwrap();
    let tail = batched.decode(&more, &plan, Rows::Tail(n)).unwrap();
    assert_eq!(tail.rows(), n);
    let tail = collect(&tail);

    // The engine splits the batch into passes of MAX_LOGIT_ROWS rows: the same passes made
    // by hand give the same rows, bitwise.
    let mut by_hand = session(&model, &config(128));
    by_hand.decode(&prompt, &plan, Rows::Last).unwrap();
    let mut passes =
        collect(&by_hand.decode(&more[..MAX_LOGIT_ROWS], &plan, Rows::Tail(MAX_LOGIT_ROWS)).unwrap());
    passes.extend(collect(&by_hand.decode(&more[MAX_LOGIT_ROWS..], &plan, Rows::Tail(8)).unwrap()));
    assert_bitwise("Tail(40) vs passes of 32 + 8 by hand", &tail, &passes, n_vocab);

    // One token per pass: each row comes from a one-row pass (see the top of this file).
    let mut single = session(&model, &config(128));
    single.decode(&prompt, &plan, Rows::Last).unwrap();
    let mut rows = Vec::with_capacity(n * n_vocab);
    for t in &more {
        rows.extend(collect(&single.decode(std::slice::from_ref(t), &plan, Rows::Last).unwrap()));
    }
    let d = assert_close("Tail(40) vs one token at a time", &tail, &rows, n_vocab, TOL);
    eprintln!("Tail({n}) vs one token at a time: max |Δ| {d:e}");
}

#[test]
fn a_prompt_longer_than_n_batch_gives_the_same_last_row() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let prompt = prose(&model, 300);
    // Passes of at least 64 tokens (100 + 100 + 100) take the same attention
    // kernel as one pass of 300; see the top of this file, and parity.rs for passes below it.
    let small = pocket_core::SessionConfig { n_batch: 100, ..config(512) };
    let large = pocket_core::SessionConfig { n_batch: 512, ..config(512) };

    let mut split = session(&model, &small);
    assert_eq!(split.config().n_batch, 100);
    let got = collect(&split.decode(&prompt, &plan, Rows::Last).unwrap());
    assert_eq!(split.len(), 300);

    // The same passes by hand, bitwise.
    let mut by_hand = session(&model, &large);
    by_hand.decode(&prompt[..100], &plan, Rows::None).unwrap();
    by_hand.decode(&prompt[100..200], &plan, Rows::None).unwrap();
    let hand = collect(&by_hand.decode(&prompt[200..], &plan, Rows::Last).unwrap());
    assert_bitwise("passes of n_batch vs the same passes by hand", &got, &hand, n_vocab);

    // One pass of 300.
    let mut one = session(&model, &large);
    let expected = collect(&one.decode(&prompt, &plan, Rows::Last).unwrap());
    let d = assert_close("300 tokens in passes of 100 vs one pass", &got, &expected, n_vocab, TOL);
    eprintln!("n_batch 100 vs 512 over 300 tokens: max |Δ| {d:e}");
}

/// A decode step computed as two rows (the token repeated: what the probe of exact widths
/// may choose on a device) gives the one row's logits, and leaves the cache as a one-row step
/// does: the steps after it agree too. On the CPU every row rounds as one row alone does.
#[test]
fn a_step_computed_as_two_rows_is_the_one_row_step() {
    let _serial = serial();
    let path = model_path(SMOL);
    let options = pocket_ggml::LoadOptions { device: pocket_ggml::DeviceChoice::Cpu, ..Default::default() };
    let model = pocket_ggml::GgmlModel::load(&path, &options).unwrap();
    let prompt = prose(&model, 40);
    let steps = |rows: usize| {
        model.set_step_rows(rows);
        let mut s = session(&model, &config(128));
        let mut next = pocket_core::argmax(s.decode(&prompt, &full(&model), Rows::Last).unwrap().last());
        let mut out = Vec::new();
        for _ in 0..12 {
            let logits = collect(&s.decode(&[next], &full(&model), Rows::Last).unwrap());
            next = pocket_core::argmax(&logits);
            out.push(logits);
        }
        out
    };
    let (one, two) = (steps(1), steps(2));
    assert_eq!(model.step_rows(), 2);
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        assert_bitwise(&format!("step {i} as two rows"), b, a, model.info().n_vocab);
    }
}
