//! Speculative decoding on real models: every drafter's greedy output is token for token what
//! plain decoding gives, and the session is left exactly as plain decoding leaves it.
//!
//! The drafters are set up to draft as much as they can (a flat cost model, no confidence
//! stop), since the point here is to put many verification passes and rejections through
//! the engine, not to be fast.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use common::*;
use pocket_core::cost::CostModel;
use pocket_core::spec::{
    AutoConfig, AutoDrafter, DraftModelDrafter, Drafter, History, LayerSkipConfig, LayerSkipDrafter, Recall,
    SearchConfig, SkipSet, SuffixDrafter,
};
use pocket_core::{
    GenerateRequest, Generation, KvType, Model, Rows, SamplingConfig, Session, StopConfig, Token,
    generate_speculative,
};
use pocket_ggml::{GgmlModel, WeightFormat};

/// One prompt of each kind the issue names: edit (output copies the input), summarize
/// (grounded in the input) and qa (open-ended).
const PROMPTS: [(&str, &str); 3] = [
    (
        "edit",
        "Rename the parameter `data` to `values` in this Python function and return the full \
         function.\n\n```python\ndef mean(data):\n    \"\"\"Return the arithmetic mean of data.\"\"\"\n    \
         n = len(data)\n    if n < 1:\n        raise ValueError(\"mean requires at least one data \
         point\")\n    total = 0\n    for x in data:\n        total += x\n    return total / n\n```",
    ),
    (
        "summarize",
        "Summarize in two sentences what this Python function does.\n\n```python\ndef \
         chunked(iterable, size):\n    if size < 1:\n        raise ValueError(\"size must be at least \
         1\")\n    chunk = []\n    for item in iterable:\n        chunk.append(item)\n        if \
         len(chunk) == size:\n            yield chunk\n            chunk = []\n    if chunk:\n        \
         yield chunk\n```",
    ),
    ("qa", "Why is the sky blue? Answer in three sentences."),
];

const MAX_TOKENS: usize = 64;

/// Generate `prompt` in a fresh session; returns the generation and the session.
fn run(
    model: &GgmlModel,
    prompt: &[Token],
    sampling: &SamplingConfig,
    drafter: Option<&mut dyn Drafter>,
) -> (Generation, Box<dyn Session>) {
    let mut session = model.session(&config(1024)).expect("session");
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: sampling.clone(),
        stop: StopConfig { max_tokens: MAX_TOKENS, stop: Vec::new() },
    };
    let g = generate_speculative(
        model.info(),
        session.as_mut(),
        model.tokenizer(),
        &request,
        drafter,
        &mut |_| ControlFlow::Continue(()),
    )
    .expect("generate");
    (g, session)
}

/// A flat cost model: every drafter drafts as long as it can.
fn flat() -> CostModel {
    CostModel::linear(0.0)
}

/// A fixed skip set for `model`: every other layer of the middle half (no search, so the test
/// is quick; the search has its own test).
fn middle_skip(model: &GgmlModel) -> SkipSet {
    let n = model.info().n_layers;
    SkipSet { n_layers: n, skip: (n / 4..3 * n / 4).step_by(2).collect(), agreement: 0.9 }
}

fn layerskip(model: &GgmlModel) -> LayerSkipDrafter {
    let config = LayerSkipConfig { tau: 0.0, ..LayerSkipConfig::default() };
    LayerSkipDrafter::new(model.info().n_layers, config, Some(&middle_skip(model)), flat()).unwrap()
}

/// `model` drafting for itself with a 4-bit KV cache: same vocabulary, slightly different
/// predictions, so drafts are mostly but not always accepted. (On an OpenVINO device, whose
/// caches are f16 only, with an f16 one.)
fn self_draft(model: &GgmlModel) -> DraftModelDrafter {
    let kv = if quantized_kv() { KvType::Q4_0 } else { KvType::F16 };
    let draft_config = pocket_core::SessionConfig { kv, ..config(1024) };
    DraftModelDrafter::new(model, model, &draft_config, 8).unwrap()
}

/// Every drafter on every prompt gives plain decoding's tokens and leaves the session holding
/// the same tokens with the same cache (the next pass's logits are bitwise equal).
fn identical_for_every_drafter(model: &GgmlModel) {
    let greedy = SamplingConfig::default();
    for (kind, text) in PROMPTS {
        let prompt = chat(model, text);
        let (plain, mut plain_session) = run(model, &prompt, &greedy, None);
        assert!(plain.tokens.len() > 8, "{kind}: too short to test: {:?}", plain.text);
        let plain_held = plain_session.tokens().to_vec();
        let probe: Vec<Token> = plain.tokens.iter().rev().take(2).copied().collect();
        let plain_next = collect(&plain_session.decode(&probe, &full(model), Rows::Tail(2)).unwrap());

        let drafters: Vec<Box<dyn Drafter>> = vec![
            Box::new(SuffixDrafter::with_cost(8, flat())),
            Box::new(layerskip(model)),
            Box::new(self_draft(model)),
            Box::new(AutoDrafter::new(
                AutoConfig::new(flat()),
                Some(layerskip(model)),
                Some(self_draft(model)),
            )),
        ];
        for mut d in drafters {
            let (spec, mut session) = run(model, &prompt, &greedy, Some(d.as_mut()));
            let what = format!("{} on {kind} with {}", model.info().name, d.report());
            assert_eq!(spec.tokens, plain.tokens, "{what}: {:?} vs {:?}", spec.text, plain.text);
            assert_eq!(spec.stop, plain.stop, "{what}");
            // Where the device cannot verify even one drafted token exactly, nothing is
            // drafted (never inexact); elsewhere drafts are made.
            match &model.info().exact_passes {
                Some(exact) if !exact.allows_drafts() => {
                    assert_eq!(spec.spec.drafted, 0, "{what}: drafted where {}", exact.why)
                }
                _ => assert!(spec.spec.drafted > 0, "{what}: nothing was drafted"),
            }
            assert_eq!(session.tokens(), &plain_held[..], "{what}: the session holds other tokens");
            let next = collect(&session.decode(&probe, &full(model), Rows::Tail(2)).unwrap());
            assert_bitwise(
                &format!("{what}: the pass after generation"),
                &next,
                &plain_next,
                model.info().n_vocab,
            );
            eprintln!(
                "{what}: drafted {} accepted {} in {} passes",
                spec.spec.drafted, spec.spec.accepted, spec.spec.passes
            );
        }
    }
}

/// Each row of a verification pass of n tokens is bitwise what decoding that token alone
/// gives, for every pass size a draft can make.
fn verification_rows_equal_single_steps(model: &GgmlModel, threads: usize) {
    // 250 tokens: passes that reach past 256 attend over a longer padded cache.
    rows_equal_single_steps(model, threads, &[100, 250], &[2, 3, 4, 5, 8, 9, 16, 17]);
}

/// Each row of a pass of `n` tokens (for each of `passes`) after `prefix_lens` tokens is
/// bitwise the logits of decoding that token alone — on a device whose probe at load found
/// fewer widths exact, for the passes it allows there (what drafting keeps to).
fn rows_equal_single_steps(model: &GgmlModel, threads: usize, prefix_lens: &[usize], passes: &[usize]) {
    let config =
        |n| pocket_core::SessionConfig { threads: pocket_core::Threads::Fixed(threads), ..config(n) };
    let n_vocab = model.info().n_vocab;
    for &prefix_len in prefix_lens {
        let prefix = prose(model, prefix_len);
        let extra = other_prose(model, pocket_core::spec::MAX_DRAFT + 1);
        let mut one = session(model, &config(512));
        one.decode(&prefix, &full(model), Rows::None).unwrap();
        let singles: Vec<Vec<f32>> =
            extra.iter().map(|&t| collect(&one.decode(&[t], &full(model), Rows::Last).unwrap())).collect();
        for &n in passes {
            if let Some(exact) = model.info().exact_passes.as_ref().filter(|e| n > e.at(prefix_len)) {
                eprintln!(
                    "{}: a pass of {n} after {prefix_len} is not made there: {}",
                    model.info().name,
                    exact.why
                );
                continue;
            }
            let mut s = session(model, &config(512));
            s.decode(&prefix, &full(model), Rows::None).unwrap();
            let rows = collect(&s.decode(&extra[..n], &full(model), Rows::Tail(n)).unwrap());
            for (i, single) in singles[..n].iter().enumerate() {
                let what = format!(
                    "{}, {threads} threads: row {i} of a pass of {n} after {prefix_len}",
                    model.info().name
                );
                assert_bitwise(&what, &rows[i * n_vocab..(i + 1) * n_vocab], single, n_vocab);
            }
        }
    }
}

#[test]
fn verification_is_batch_invariant_on_smollm2() {
    let _serial = serial();
    verification_rows_equal_single_steps(&smol(), 1);
    verification_rows_equal_single_steps(&smol(), 2);
}

/// The same, short enough to run under qemu (`cross/build test`): there it checks the NEON
/// kernels in the whole graph.
#[test]
fn verification_is_batch_invariant_on_smollm2_in_short() {
    let _serial = serial();
    let model = smol();
    eprintln!("kernels: {}", model.kernels());
    if let Some(isa) = pocket_ggml::kernel_isa() {
        assert!(model.kernels().contains(&format!("mm-{isa}(")), "{}", model.kernels());
    }
    rows_equal_single_steps(&model, 2, &[20], &[2, 5, 8]);
}

#[test]
fn verification_is_batch_invariant_on_qwen() {
    let _serial = serial();
    verification_rows_equal_single_steps(&model(QWEN), 1);
}

#[test]
fn verification_is_batch_invariant_with_weights_widened_to_q8_0() {
    let _serial = serial();
    let smol = model_as(SMOL, WeightFormat::Q8_0);
    verification_rows_equal_single_steps(&smol, 1);
    verification_rows_equal_single_steps(&smol, 2);
    verification_rows_equal_single_steps(&model_as(QWEN, WeightFormat::Q8_0), 1);
}

#[test]
fn every_drafter_matches_plain_decoding_on_smollm2() {
    let _serial = serial();
    identical_for_every_drafter(&smol());
}

#[test]
fn every_drafter_matches_plain_decoding_on_qwen() {
    let _serial = serial();
    identical_for_every_drafter(&model(QWEN));
}

/// Each row of a pass over a tree of drafts is bitwise what decoding its path gives, and
/// keeping one path leaves the session as decoding that path would: the next pass's logits
/// are bitwise equal.
fn tree_rows_equal_their_paths(model: &GgmlModel) {
    let n_vocab = model.info().n_vocab;
    // Token 0 is the pending one; the others branch at 0, 1 and 3 (depths up to 4).
    let parents: [u8; 9] = [0, 0, 1, 1, 0, 2, 4, 3, 7];
    let kept: [u8; 4] = [0, 1, 3, 7];
    let path_to = |mut i: usize| {
        let mut path = vec![i];
        while i > 0 {
            i = usize::from(parents[i]);
            path.push(i);
        }
        path.reverse();
        path
    };
    for prefix_len in [100, 250] {
        let prefix = prose(model, prefix_len);
        let tree = other_prose(model, parents.len());
        let mut s = session(model, &config(512));
        if !s.decodes_trees() {
            eprintln!("{}: drafts are verified as paths here, not trees", model.info().name);
            return;
        }
        s.decode(&prefix, &full(model), Rows::None).unwrap();
        let rows = collect(&s.decode_tree(&tree, &parents, &full(model)).unwrap());
        let mut one = session(model, &config(512));
        one.decode(&prefix, &full(model), Rows::None).unwrap();
        for i in 0..parents.len() {
            let path: Vec<Token> = path_to(i).into_iter().map(|j| tree[j]).collect();
            let want = collect(&one.decode(&path, &full(model), Rows::Last).unwrap());
            one.truncate(prefix_len).unwrap();
            let what = format!("{}: row {i} of a tree after {prefix_len}", model.info().name);
            assert_bitwise(&what, &rows[i * n_vocab..(i + 1) * n_vocab], &want, n_vocab);
        }
        s.keep_path(prefix_len, &kept).unwrap();
        let path: Vec<Token> = kept.iter().map(|&j| tree[usize::from(j)]).collect();
        let mut held = prefix.clone();
        held.extend(&path);
        assert_eq!(s.tokens(), &held[..]);
        one.decode(&path, &full(model), Rows::None).unwrap();
        let probe = &tree[1..3];
        let next = collect(&s.decode(probe, &full(model), Rows::Tail(2)).unwrap());
        let want = collect(&one.decode(probe, &full(model), Rows::Tail(2)).unwrap());
        let what =
            format!("{}: the pass after keeping a path of a tree after {prefix_len}", model.info().name);
        assert_bitwise(&what, &next, &want, n_vocab);
        // A path the tree does not have is refused, and the session holds what it held
        // before the tree.
        let held = s.len();
        s.decode_tree(&tree, &parents, &full(model)).unwrap();
        let err = s.keep_path(held, &[0, 2, 1]).unwrap_err().to_string();
        assert!(err.contains("no path"), "{err}");
        assert_eq!(s.len(), held);
    }
}

#[test]
fn tree_rows_equal_their_paths_on_smollm2() {
    let _serial = serial();
    tree_rows_equal_their_paths(&smol());
}

#[test]
fn tree_rows_equal_their_paths_on_qwen() {
    let _serial = serial();
    tree_rows_equal_their_paths(&model(QWEN));
}

/// Drafting trees from earlier answers that part ways gives plain decoding's tokens and
/// leaves the session as plain decoding does.
#[test]
fn trees_from_earlier_answers_match_plain_decoding_on_smollm2() {
    let _serial = serial();
    let model = smol();
    let greedy = SamplingConfig::default();
    let mut trees = 0;
    for (kind, text) in PROMPTS {
        let prompt = chat(&model, text);
        let (plain, mut plain_session) = run(&model, &prompt, &greedy, None);
        let probe: Vec<Token> = plain.tokens.iter().rev().take(2).copied().collect();
        let plain_next = collect(&plain_session.decode(&probe, &full(&model), Rows::Tail(2)).unwrap());
        // Earlier answers: this one twice and, as often, one that parts from it at a third
        // (a token swapped), so drafts branch there.
        let a = &plain.tokens;
        let mut swapped = a.clone();
        swapped[a.len() / 3] = a[0];
        let mut history = History::new();
        for answer in [a, &swapped, a, &swapped] {
            history.push(&prompt, answer);
        }
        let mut d = SuffixDrafter::with_cost(8, flat()).with_history(Arc::new(history), &Recall::default());
        let (spec, mut session) = run(&model, &prompt, &greedy, Some(&mut d));
        let what = format!("{} on {kind} with trees from earlier answers", model.info().name);
        assert_eq!(spec.tokens, plain.tokens, "{what}: {:?} vs {:?}", spec.text, plain.text);
        assert_eq!(session.tokens(), plain_session.tokens().split_at(plain_session.len() - 2).0, "{what}");
        let next = collect(&session.decode(&probe, &full(&model), Rows::Tail(2)).unwrap());
        assert_bitwise(
            &format!("{what}: the pass after generation"),
            &next,
            &plain_next,
            model.info().n_vocab,
        );
        eprintln!("{what}: {:?}", spec.spec);
        trees += spec.spec.trees;
    }
    if session(&model, &config(64)).decodes_trees() {
        assert!(trees > 0, "no draft branched");
    }
}

#[test]
fn speculative_sampling_is_seeded_and_keeps_the_prompt() {
    let _serial = serial();
    let model = smol();
    let prompt = chat(&model, PROMPTS[0].1);
    let sampling = SamplingConfig { temperature: 0.7, top_p: 0.95, seed: 3, ..SamplingConfig::default() };
    let mut a = SuffixDrafter::with_cost(8, flat());
    let mut b = SuffixDrafter::with_cost(8, flat());
    let (ga, sa) = run(&model, &prompt, &sampling, Some(&mut a));
    let (gb, _) = run(&model, &prompt, &sampling, Some(&mut b));
    assert_eq!(ga.tokens, gb.tokens, "same seed, same tokens");
    assert!(ga.spec.drafted > 0 && ga.spec.accepted > 0, "{:?}", ga.spec);
    assert_eq!(&sa.tokens()[..prompt.len()], &prompt[..]);
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let _serial = serial();
    let (smol, qwen) = (smol(), model(QWEN));
    let err = DraftModelDrafter::new(&qwen, &smol, &config(256), 8).err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("vocabulary") && msg.contains("49152"), "{msg}");
}

#[test]
fn the_skip_set_search_is_reproducible_with_a_seed() {
    let _serial = serial();
    let model = smol();
    let prompt = chat(&model, PROMPTS[1].1);
    let found = |seed| {
        let search = SearchConfig { seed, max_trials: 6, window: 16, ..SearchConfig::default() };
        let config = LayerSkipConfig { search, ..LayerSkipConfig::default() };
        let mut d =
            LayerSkipDrafter::new(model.info().n_layers, config, None, CostModel::linear(0.1)).unwrap();
        let (g, _) = run(&model, &prompt, &SamplingConfig::default(), Some(&mut d));
        assert!(!d.searching(), "6 trials fit in {} tokens", g.tokens.len());
        d.skip_set().expect("a skip set")
    };
    let (a, b) = (found(11), found(11));
    assert_eq!(a, b);
    assert!(!a.skip.is_empty() && a.agreement > 0.0, "{a:?}");
    assert!(!a.skip.contains(&0) && !a.skip.contains(&(model.info().n_layers - 1)), "{a:?}");
}

/// A quantized KV cache works where the device keeps one, and is refused with a clear error on
/// an OpenVINO device (whose backend takes no view of one: ggml aborted the process there).
#[test]
fn a_quantized_cache_works_or_is_refused_clearly_on_smollm2() {
    let _serial = serial();
    let model = smol();
    let result = model.new_session(&pocket_core::SessionConfig { kv: KvType::Q8_0, ..config(128) });
    match (result, quantized_kv()) {
        (Ok(_), true) => {}
        (Err(e), false) => {
            let e = e.to_string();
            assert!(e.contains("f16 only") && e.contains("q8_0"), "{e}");
        }
        (Ok(_), false) => panic!("a q8_0 cache was made on {}", model.device_name()),
        (Err(e), true) => panic!("a q8_0 cache on {}: {e}", model.device_name()),
    }
}
