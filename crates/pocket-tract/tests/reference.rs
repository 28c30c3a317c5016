//! t5-tiny against PyTorch's greedy ids and logits (reference.json): the no-cache path, the
//! with-past path one token at a time, several tokens per with-past call, and a rejected
//! draft cut back out of the cache.

mod common;

use common::{cases, check_row, config, t5_tiny, t5_tiny_without_past};
use pocket_core::{KvType, LayerPlan, Model, Rows};
use pocket_tract::TractModel;

fn full(model: &TractModel) -> LayerPlan {
    LayerPlan::full(model.info().n_layers).unwrap()
}

#[test]
fn the_tokenizer_gives_the_reference_ids() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    for case in cases() {
        assert_eq!(model.tokenizer().encode(&case.text, true).unwrap(), case.input_ids, "{:?}", case.text);
    }
    assert_eq!(model.decoder_start(), 0);
    assert!(model.tokenizer().is_end(1));
    assert_eq!(model.info().n_vocab, 32128);
    assert_eq!(model.info().n_layers, 2);
}

/// Greedy decoding one token per call, checking every step against the reference.
fn greedy_stepwise(model: &TractModel, what: &str) {
    let plan = full(model);
    for case in cases() {
        let mut s = model.session(&config(KvType::F32)).unwrap();
        s.encode(&case.input_ids).unwrap();
        let mut next = model.decoder_start();
        for k in 0..case.output_ids.len() {
            let logits = s.decode(&[next], &plan, Rows::Last).unwrap();
            check_row(&logits, 0, &case, k, what);
            next = pocket_core::argmax(logits.last());
        }
        assert_eq!(s.len(), case.output_ids.len());
    }
}

#[test]
fn no_past_path_matches_the_reference() {
    let dir = t5_tiny_without_past();
    let model = TractModel::load(dir.path()).unwrap();
    assert!(!model.has_kv_cache());
    greedy_stepwise(&model, "no past");
}

#[test]
fn with_past_path_matches_the_reference() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    assert!(model.has_kv_cache());
    greedy_stepwise(&model, "with past");
}

/// Teacher forcing: the start token alone, then calls of 3 tokens whose rows must reproduce
/// the next 3 steps; then the first call with 3 tokens at once.
fn several_tokens_per_call(model: &TractModel, what: &str) {
    let plan = full(model);
    for case in cases() {
        let d = &case.decoder_input_ids;
        let mut s = model.session(&config(KvType::F32)).unwrap();
        s.encode(&case.input_ids).unwrap();
        let logits = s.decode(&d[..1], &plan, Rows::Last).unwrap();
        check_row(&logits, 0, &case, 0, what);
        for start in (1..d.len()).step_by(3) {
            let end = (start + 3).min(d.len());
            let logits = s.decode(&d[start..end], &plan, Rows::Tail(end - start)).unwrap();
            for (i, k) in (start..end).enumerate() {
                check_row(&logits, i, &case, k, what);
            }
        }
        s.truncate(0).unwrap();
        let logits = s.decode(&d[..3], &plan, Rows::Tail(3)).unwrap();
        for k in 0..3 {
            check_row(&logits, k, &case, k, what);
        }
    }
}

#[test]
fn a_with_past_call_of_several_tokens_matches_the_reference() {
    several_tokens_per_call(&TractModel::load(&t5_tiny()).unwrap(), "with past, 3 per call");
}

#[test]
fn a_no_past_call_of_several_tokens_matches_the_reference() {
    let dir = t5_tiny_without_past();
    several_tokens_per_call(&TractModel::load(dir.path()).unwrap(), "no past, 3 per call");
}

#[test]
fn a_rejected_draft_is_cut_out_of_the_cache() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    let plan = full(&model);
    for case in cases() {
        let out = &case.output_ids;
        let mut s = model.session(&config(KvType::F32)).unwrap();
        s.encode(&case.input_ids).unwrap();
        s.decode(&[0], &plan, Rows::Last).unwrap();
        // The right first token, then two wrong ones.
        let wrong = (out[1] + 1) % 32100;
        let logits = s.decode(&[out[0], wrong, wrong], &plan, Rows::Tail(3)).unwrap();
        check_row(&logits, 0, &case, 1, "draft");
        s.truncate(2).unwrap();
        let mut next = out[1];
        for k in 2..out.len() {
            let logits = s.decode(&[next], &plan, Rows::Last).unwrap();
            check_row(&logits, 0, &case, k, "after the rollback");
            next = pocket_core::argmax(logits.last());
        }
    }
}

#[test]
fn a_new_source_starts_over() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    let plan = full(&model);
    let cases = cases();
    let mut s = model.session(&config(KvType::F32)).unwrap();
    for case in cases.iter().chain(cases.iter().rev()) {
        s.encode(&case.input_ids).unwrap();
        assert_eq!(s.len(), 0);
        let logits = s.decode(&[0], &plan, Rows::Last).unwrap();
        check_row(&logits, 0, case, 0, "re-encoded");
    }
}
