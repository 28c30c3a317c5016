//! Layer plans: a partial plan really skips layers, and the positions it decoded are
//! recomputed by the next pass with a different plan, so verification sees exactly what plain
//! decoding would have (the `Session` contract self-speculation rests on).
//!
//! Comparisons between sessions are bitwise and like for like: the recomputation makes the
//! verifying pass one batch from the last fully decoded position, so the plain session decodes
//! that same batch in one pass too.

mod common;

use common::*;
use pocket_core::{Error, LayerPlan, Model, Rows, Session, argmax};

/// SmolLM2's 30 layers with the middle third skipped: a typical self-drafting plan.
fn draft_plan(n_layers: usize) -> LayerPlan {
    LayerPlan::full(n_layers).unwrap().without(10..20).unwrap()
}

#[test]
fn a_partial_plan_gives_different_logits_than_the_full_plan() {
    let _serial = serial();
    let model = smol();
    let n_layers = model.info().n_layers;
    let prompt = prose(&model, 16);

    let mut plain = session(&model, &config(64));
    let full_rows = collect(&plain.decode(&prompt, &full(&model), Rows::Tail(4)).unwrap());
    let mut drafting = session(&model, &config(64));
    let draft_rows = collect(&drafting.decode(&prompt, &draft_plan(n_layers), Rows::Tail(4)).unwrap());

    let d = max_abs_diff(&full_rows, &draft_rows);
    assert!(d > 0.1, "skipping 10 of 30 layers changed the logits by only {d}: were they skipped?");
    assert!(draft_rows.iter().all(|v| v.is_finite()));
}

#[test]
fn a_full_plan_after_partial_plans_reproduces_plain_decoding() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let n_layers = model.info().n_layers;
    let plan = full(&model);
    let draft_a = draft_plan(n_layers);
    // A second, different partial plan: switching between partial plans recomputes too.
    let draft_b = LayerPlan::skipping(n_layers, [3, 7, 11, 15, 19, 23]).unwrap();
    let prompt = prose(&model, 20);
    let more = other_prose(&model, 9);

    // prompt (full) | 2 tokens (plan A, one batch) | 1 token (A) | 2 tokens (B) | 4 tokens (full)
    let mut mixed = session(&model, &config(128));
    mixed.decode(&prompt, &plan, Rows::Last).unwrap();
    mixed.decode(&more[0..2], &draft_a, Rows::Last).unwrap();
    mixed.decode(&more[2..3], &draft_a, Rows::Last).unwrap();
    mixed.decode(&more[3..5], &draft_b, Rows::Tail(5)).unwrap();
    assert_eq!(mixed.len(), prompt.len() + 5);
    let mixed_rows = collect(&mixed.decode(&more[5..9], &plan, Rows::Tail(9)).unwrap());

    let mut plain = session(&model, &config(128));
    plain.decode(&prompt, &plan, Rows::Last).unwrap();
    let plain_rows = collect(&plain.decode(&more, &plan, Rows::Tail(9)).unwrap());
    assert_bitwise("full plan after partial plans vs plain", &mixed_rows, &plain_rows, n_vocab);

    // The recomputed KV is the plain KV: the sessions go on identically.
    let next = [argmax(&plain_rows[plain_rows.len() - n_vocab..])];
    let a = collect(&mixed.decode(&next, &plan, Rows::Last).unwrap());
    let b = collect(&plain.decode(&next, &plan, Rows::Last).unwrap());
    assert_bitwise("the next token after the recomputation", &a, &b, n_vocab);
}

#[test]
fn tail_after_drafting_one_by_one_returns_the_verification_rows() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let draft = draft_plan(model.info().n_layers);
    let prompt = prose(&model, 20);
    let k = 5;

    // The speculative loop: the pending token and each drafted one go through the draft plan
    // one at a time, then the last drafted token goes in with the full plan, asking for the
    // k + 1 rows that verify the pending token's successor and each draft.
    let mut spec = session(&model, &config(128));
    let first = spec.decode(&prompt, &plan, Rows::Last).unwrap();
    let mut batch = vec![argmax(first.last())];
    for _ in 0..k {
        let pending = *batch.last().unwrap();
        let logits = spec.decode(&[pending], &draft, Rows::Last).unwrap();
        assert_eq!(logits.rows(), 1);
        batch.push(argmax(logits.last()));
    }
    let verify = spec.decode(&batch[k..], &plan, Rows::Tail(k + 1)).unwrap();
    assert_eq!(verify.rows(), k + 1, "the rows count from the start of the recomputed batch");
    let verify = collect(&verify);
    assert_eq!(spec.tokens(), [&prompt[..], &batch[..]].concat());

    let mut plain = session(&model, &config(128));
    plain.decode(&prompt, &plan, Rows::Last).unwrap();
    let expected = collect(&plain.decode(&batch, &plan, Rows::Tail(k + 1)).unwrap());
    assert_bitwise("verification rows after drafting", &verify, &expected, n_vocab);
}

#[test]
fn rejecting_drafts_then_verifying_reproduces_plain_decoding() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let draft = draft_plan(model.info().n_layers);
    let prompt = prose(&model, 20);
    let more = other_prose(&model, 6);

    // Draft 4, reject the last 2 (truncate), then verify with one new token: the pass
    // recomputes the 2 kept drafted positions.
    let mut spec = session(&model, &config(128));
    spec.decode(&prompt, &plan, Rows::Last).unwrap();
    for t in &more[..4] {
        spec.decode(std::slice::from_ref(t), &draft, Rows::Last).unwrap();
    }
    spec.truncate(prompt.len() + 2).unwrap();
    let got = collect(&spec.decode(&more[4..5], &plan, Rows::Tail(3)).unwrap());

    let mut plain = session(&model, &config(128));
    plain.decode(&prompt, &plan, Rows::Last).unwrap();
    let batch = [more[0], more[1], more[4]];
    let expected = collect(&plain.decode(&batch, &plan, Rows::Tail(3)).unwrap());
    assert_bitwise("verification after rejecting drafts", &got, &expected, n_vocab);

    // Rejecting every draft leaves a complete prefix: the next full pass recomputes nothing.
    let mut spec = session(&model, &config(128));
    spec.decode(&prompt, &plan, Rows::Last).unwrap();
    spec.decode(&more[..2], &draft, Rows::Last).unwrap();
    spec.truncate(prompt.len()).unwrap();
    let err = spec.decode(&more[4..5], &plan, Rows::Tail(2)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let got = collect(&spec.decode(&more[4..5], &plan, Rows::Last).unwrap());
    let mut plain = session(&model, &config(128));
    plain.decode(&prompt, &plan, Rows::Last).unwrap();
    let expected = collect(&plain.decode(&more[4..5], &plan, Rows::Last).unwrap());
    assert_bitwise("full pass after rejecting every draft", &got, &expected, n_vocab);
}

#[test]
fn a_verification_longer_than_n_batch_is_split_like_a_plain_batch() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let draft = draft_plan(model.info().n_layers);
    let prompt = prose(&model, 20);
    let more = other_prose(&model, 7);
    // Passes of at most 4 tokens: the 7 recomputed positions go in passes of 4 + 3.
    let config = pocket_core::SessionConfig { n_batch: 4, ..config(64) };

    let mut spec = session(&model, &config);
    spec.decode(&prompt, &plan, Rows::None).unwrap();
    for t in &more[..6] {
        spec.decode(std::slice::from_ref(t), &draft, Rows::Last).unwrap();
    }
    let got = collect(&spec.decode(&more[6..], &plan, Rows::Tail(7)).unwrap());

    let mut plain = session(&model, &config);
    plain.decode(&prompt, &plan, Rows::None).unwrap();
    let expected = collect(&plain.decode(&more, &plan, Rows::Tail(7)).unwrap());
    assert_bitwise("verification split into passes vs plain", &got, &expected, n_vocab);
}

#[test]
fn partial_plans_return_the_rows_asked_whichever_layers_they_skip() {
    let _serial = serial();
    let model = smol();
    let n_layers = model.info().n_layers;
    let n_vocab = model.info().n_vocab;
    let prompt = prose(&model, 12);
    // The last layer is where only the rows asked for go on; skipping it moves that to the
    // last layer the plan runs. Skipping the first makes the embeddings the next layer's input.
    for plan in [
        LayerPlan::full(n_layers).unwrap().without(n_layers - 5..n_layers).unwrap(),
        LayerPlan::full(n_layers).unwrap().without(0..5).unwrap(),
        LayerPlan::skipping(n_layers, [0, n_layers - 1]).unwrap(),
        LayerPlan::skipping(n_layers, (1..n_layers).collect::<Vec<_>>()).unwrap(),
    ] {
        let mut a = session(&model, &config(64));
        let tail = collect(&a.decode(&prompt, &plan, Rows::Tail(prompt.len())).unwrap());
        let mut b = session(&model, &config(64));
        let last = collect(&b.decode(&prompt, &plan, Rows::Last).unwrap());
        assert_bitwise(&format!("{plan:?}: Last vs Tail(n)"), &last, &tail[tail.len() - n_vocab..], n_vocab);
        assert!(tail.iter().all(|v| v.is_finite()), "{plan:?}");
        let mut c = session(&model, &config(64));
        assert_eq!(c.decode(&prompt, &plan, Rows::None).unwrap().rows(), 0, "{plan:?}");
    }
}

#[test]
fn a_plan_for_another_layer_count_is_an_error() {
    let _serial = serial();
    let model = smol();
    let n_layers = model.info().n_layers;
    let mut s = session(&model, &config(64));
    let prompt = prose(&model, 4);
    for wrong in [n_layers - 1, n_layers + 1] {
        let err = s.decode(&prompt, &LayerPlan::full(wrong).unwrap(), Rows::Last).unwrap_err();
        assert!(matches!(err, Error::LayerPlan(_)), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&wrong.to_string()) && msg.contains(&n_layers.to_string()),
            "the message names both layer counts: {msg}"
        );
    }
    assert!(s.is_empty(), "a rejected plan decodes nothing");
    s.decode(&prompt, &full(&model), Rows::Last).unwrap();
}

#[test]
fn a_plan_that_skips_every_layer_is_an_error() {
    let _serial = serial();
    let model = smol();
    let n_layers = model.info().n_layers;
    let mut s = session(&model, &config(64));
    let prompt = prose(&model, 4);
    let none = LayerPlan::full(n_layers).unwrap().without(0..n_layers).unwrap();
    let err = s.decode(&prompt, &none, Rows::Last).unwrap_err();
    assert!(matches!(err, Error::LayerPlan(_)), "{err:?}");
    assert!(err.to_string().contains("at least one layer"), "{err}");
    assert!(s.is_empty());
}
