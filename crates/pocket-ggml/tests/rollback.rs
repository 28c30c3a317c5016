//! `Session::truncate`: rejected drafts are dropped, and what follows is computed as if they
//! had never been decoded.
//!
//! Comparisons are bitwise: ggml's CPU kernels give identical results for identical pass
//! shapes, so both sessions decode with the same batch shapes and any difference is state that
//! leaked through the truncation.

mod common;

use common::*;
use pocket_core::{Error, Model, Rows, Session, argmax};
use pocket_ggml::{GgmlSession, KV_BLOCK_TOKENS};

/// Decode `batch` asking for every row, and return them.
fn all_rows(s: &mut GgmlSession, plan: &pocket_core::LayerPlan, batch: &[u32]) -> Vec<f32> {
    s.decode(batch, plan, Rows::Tail(batch.len())).map(|l| collect(&l)).unwrap()
}

/// Greedy-decode `n` tokens one at a time after `last` (the logits row the session ended on);
/// returns the tokens and every row.
fn greedy(
    s: &mut GgmlSession,
    plan: &pocket_core::LayerPlan,
    last: &[f32],
    n: usize,
) -> (Vec<u32>, Vec<f32>) {
    let mut next = argmax(last);
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    for _ in 0..n {
        tokens.push(next);
        let logits = s.decode(&[next], plan, Rows::Last).unwrap();
        rows.extend_from_slice(logits.last());
        next = argmax(logits.last());
    }
    (tokens, rows)
}

#[test]
fn truncating_a_continuation_then_decoding_another_equals_a_fresh_session() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let prompt = prose(&model, 24);
    // A is longer than B, so stale KV from A lies past the end of B after the truncation.
    let a = other_prose(&model, 20);
    let b: Vec<u32> = prose(&model, 40)[24..31].to_vec();

    let mut rolled = session(&model, &config(256));
    rolled.decode(&prompt, &plan, Rows::Last).unwrap();
    rolled.decode(&a, &plan, Rows::Tail(a.len())).unwrap();
    assert_eq!(rolled.len(), prompt.len() + a.len());
    rolled.truncate(prompt.len()).unwrap();
    assert_eq!(rolled.len(), prompt.len());
    assert_eq!(rolled.tokens(), &prompt[..]);
    let rolled_rows = all_rows(&mut rolled, &plan, &b);

    let mut fresh = session(&model, &config(256));
    fresh.decode(&prompt, &plan, Rows::Last).unwrap();
    let fresh_rows = all_rows(&mut fresh, &plan, &b);
    assert_bitwise("prompt + A, truncated, + B vs prompt + B", &rolled_rows, &fresh_rows, n_vocab);

    // And generation goes on identically from there.
    let last = &fresh_rows[fresh_rows.len() - n_vocab..];
    let (rolled_tokens, rolled_gen) = greedy(&mut rolled, &plan, last, 8);
    let (fresh_tokens, fresh_gen) = greedy(&mut fresh, &plan, last, 8);
    assert_eq!(rolled_tokens, fresh_tokens);
    assert_bitwise("greedy continuation after the rollback", &rolled_gen, &fresh_gen, n_vocab);
}

#[test]
fn truncating_across_kv_blocks_releases_them_and_redecoding_equals_a_fresh_session() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let bpt = model.kv_bytes_per_token(pocket_core::KvType::F16);
    let text = prose(&model, 200);
    // 100 new tokens from position 10 write into the blocks the truncation released.
    let b = other_prose(&model, 100);

    let mut rolled = session(&model, &config(512));
    rolled.decode(&text[..10], &plan, Rows::None).unwrap();
    rolled.decode(&text[10..], &plan, Rows::Last).unwrap();
    assert_eq!(rolled.kv_bytes(), 200usize.next_multiple_of(KV_BLOCK_TOKENS) * bpt);
    rolled.truncate(10).unwrap();
    assert_eq!(rolled.kv_bytes(), KV_BLOCK_TOKENS * bpt, "the blocks past the first are released");
    let rolled_rows = all_rows(&mut rolled, &plan, &b);
    assert_eq!(rolled.kv_bytes(), 128 * bpt);

    let mut fresh = session(&model, &config(512));
    fresh.decode(&text[..10], &plan, Rows::None).unwrap();
    let fresh_rows = all_rows(&mut fresh, &plan, &b);
    assert_bitwise("200 tokens truncated to 10, + 100 vs 10 + 100", &rolled_rows, &fresh_rows, n_vocab);
}

#[test]
fn truncating_to_the_current_length_changes_nothing() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let prompt = prose(&model, 12);
    let mut s = session(&model, &config(64));
    s.decode(&prompt, &plan, Rows::None).unwrap();
    s.truncate(12).unwrap();
    assert_eq!(s.tokens(), &prompt[..]);
    s.truncate(0).unwrap();
    assert!(s.is_empty());
    assert_eq!(s.kv_bytes(), 0, "an empty session holds no KV blocks");
}

#[test]
fn truncating_beyond_the_length_is_an_error_that_changes_nothing() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let prompt = prose(&model, 5);
    let mut s = session(&model, &config(64));
    s.decode(&prompt, &plan, Rows::None).unwrap();
    let err = s.truncate(6).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("5") && msg.contains("6"), "the message names both lengths: {msg}");
    assert_eq!(s.tokens(), &prompt[..]);
    // The session is still usable.
    s.decode(&other_prose(&model, 1), &plan, Rows::Last).unwrap();
    assert_eq!(s.len(), 6);
}
