//! Sessions of one model that decode at the same time share their passes, and each session's
//! greedy output — every row of its logits — is exactly what it computes alone: with plain
//! decoding, with speculation, with a long prompt read beside others' decoding, and with
//! caches of different types in one pass.

mod common;

use std::ops::ControlFlow;
use std::sync::Barrier;

use common::*;
use pocket_core::cost::CostModel;
use pocket_core::spec::{Drafter, SuffixDrafter};
use pocket_core::{
    GenerateRequest, Generation, KvType, Model, Rows, SamplingConfig, Session, SessionConfig, StopConfig,
    Threads, Token, generate_speculative,
};
use pocket_ggml::GgmlModel;

const STEPS: usize = 24;

/// Prompts of different lengths and kinds, one per session.
const PROMPTS: [&str; 4] = [
    "Write a short poem about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a paperclip.",
    "Explain in two sentences why the sky is blue.",
];

fn config_of(kv: KvType) -> SessionConfig {
    SessionConfig { kv, n_ctx: 1024, threads: Threads::Fixed(THREADS), ..SessionConfig::default() }
}

/// The prompt's last row of logits and `STEPS` greedy steps after it, in a new session.
fn greedy(model: &GgmlModel, prompt: &[Token], kv: KvType) -> (Vec<Token>, Vec<f32>) {
    let plan = full(model);
    let mut s = session(model, &config_of(kv));
    let (mut picked, mut rows) = (Vec::new(), Vec::new());
    let mut input = prompt.to_vec();
    for _ in 0..=STEPS {
        let logits = s.decode(&input, &plan, Rows::Last).expect("decode");
        rows.extend_from_slice(logits.last());
        let next = pocket_core::argmax(logits.last()) as Token;
        picked.push(next);
        input = vec![next];
    }
    (picked, rows)
}

/// [`greedy`] for every prompt at once, on threads of their own that start together.
fn greedy_together(model: &GgmlModel, prompts: &[(Vec<Token>, KvType)]) -> Vec<(Vec<Token>, Vec<f32>)> {
    let start = Barrier::new(prompts.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|(p, kv)| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    greedy(model, p, *kv)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a session's thread")).collect()
    })
}

fn same_together_as_alone(model: &GgmlModel, prompts: Vec<(Vec<Token>, KvType)>) {
    let n_vocab = model.info().n_vocab;
    let alone: Vec<_> = prompts.iter().map(|(p, kv)| greedy(model, p, *kv)).collect();
    let before = model.shared_passes().expect("this model's sessions share passes here");
    let together = greedy_together(model, &prompts);
    let after = model.shared_passes().unwrap();
    for (i, ((a_tokens, a_rows), (t_tokens, t_rows))) in alone.iter().zip(&together).enumerate() {
        assert_eq!(t_tokens, a_tokens, "session {i}: tokens together vs alone");
        assert_bitwise(&format!("session {i}: logits together vs alone"), t_rows, a_rows, n_vocab);
    }
    let shared = after.shared - before.shared;
    assert!(shared > 0, "no pass was shared: {before:?} -> {after:?}");
    eprintln!(
        "{} sessions: {} passes, {shared} shared ({:.1} sessions each)",
        prompts.len(),
        after.passes - before.passes,
        (after.jobs - before.jobs) as f64 / shared as f64
    );
}

#[test]
fn four_sessions_of_smollm2_decode_as_alone() {
    let _serial = serial();
    let model = smol();
    let prompts = PROMPTS.iter().map(|p| (chat(&model, p), KvType::F16)).collect();
    same_together_as_alone(&model, prompts);
}

#[test]
fn two_sessions_of_qwen_decode_as_alone() {
    let _serial = serial();
    let model = model(QWEN);
    let prompts = PROMPTS[..2].iter().map(|p| (chat(&model, p), KvType::F16)).collect();
    same_together_as_alone(&model, prompts);
}

#[test]
fn caches_of_different_types_share_a_pass() {
    let _serial = serial();
    let model = smol();
    let kvs =
        [KvType::F16, KvType::Q8_0, KvType::new(pocket_core::KvElement::Q8_0, pocket_core::KvElement::Q4_0)];
    let prompts = PROMPTS.iter().zip(kvs).map(|(p, kv)| (chat(&model, p), kv)).collect();
    same_together_as_alone(&model, prompts);
}

/// A long prompt read while others decode: it is read in shared chunks, and every session's
/// rows are still what they are alone.
#[test]
fn a_long_prompt_beside_decoding_sessions() {
    let _serial = serial();
    let model = smol();
    let mut prompts: Vec<_> = PROMPTS[..2].iter().map(|p| (chat(&model, p), KvType::F16)).collect();
    prompts.push((prose(&model, 700), KvType::F16));
    same_together_as_alone(&model, prompts);
}

/// Suffix speculation in every session: each one's greedy output equals plain decoding alone.
#[test]
fn speculating_sessions_give_plain_decodings_tokens() {
    let _serial = serial();
    let model = smol();
    // Prompts whose answers copy from them, so that the suffix drafter drafts.
    let prompts: Vec<Vec<Token>> = [
        "Repeat this sentence exactly, twice: the quick brown fox jumps over the lazy dog.",
        "Copy this list: apples, pears, plums, cherries, grapes, melons, lemons.",
        "Rewrite in capital letters: the lighthouse keeper climbed the stairs.",
    ]
    .iter()
    .map(|p| chat(&model, p))
    .collect();
    let run = |prompt: &[Token], speculate: bool| -> Generation {
        let mut s = model.session(&config_of(KvType::F16)).expect("session");
        let request = GenerateRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens: 48, stop: Vec::new() },
        };
        let mut drafter = SuffixDrafter::with_cost(6, CostModel::linear(0.0));
        let drafter: Option<&mut dyn Drafter> = if speculate { Some(&mut drafter) } else { None };
        generate_speculative(model.info(), s.as_mut(), model.tokenizer(), &request, drafter, &mut |_| {
            ControlFlow::Continue(())
        })
        .expect("generate")
    };
    let plain: Vec<_> = prompts.iter().map(|p| run(p, false)).collect();
    let before = model.shared_passes().unwrap();
    let start = Barrier::new(prompts.len());
    let together: Vec<Generation> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (start, run) = (&start, &run);
                scope.spawn(move || {
                    start.wait();
                    run(p, true)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a session's thread")).collect()
    });
    let after = model.shared_passes().unwrap();
    for (i, (p, t)) in plain.iter().zip(&together).enumerate() {
        assert_eq!(t.tokens, p.tokens, "session {i}: speculating together vs plain alone");
    }
    assert!(together.iter().any(|g| g.spec.accepted > 0), "the drafter drafted nothing accepted");
    assert!(after.shared > before.shared, "no pass was shared");
}

/// Trees of drafts verified in shared passes: each session's tree rows, and the pass after it
/// keeps a path, are bitwise what they are alone (the parents travel with each session's job).
#[test]
fn trees_in_shared_passes_give_their_rows_alone() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    // Token 0 is pending; branches at 0 and 1 (the shape the suffix drafter makes).
    let parents: [u8; 6] = [0, 0, 1, 1, 0, 4];
    let kept: [u8; 3] = [0, 1, 3];
    const ROUNDS: usize = 4;
    // Per session: its prefix and the trees it verifies, one per round.
    let text = other_prose(&model, parents.len() * 3 * ROUNDS);
    let mut pieces = text.chunks(parents.len()).map(<[Token]>::to_vec);
    let sessions: Vec<(Vec<Token>, Vec<Vec<Token>>)> =
        PROMPTS[..3].iter().map(|p| (chat(&model, p), pieces.by_ref().take(ROUNDS).collect())).collect();
    let plan = full(&model);
    // Every tree's rows, then the rows of a pass after its kept path, as one vector.
    let run = |prefix: &[Token], trees: &[Vec<Token>], start: Option<&Barrier>| -> Option<Vec<f32>> {
        let mut s = session(&model, &config_of(KvType::F16));
        if !s.decodes_trees() {
            return None;
        }
        s.decode(prefix, &plan, Rows::None).expect("prefix");
        if let Some(start) = start {
            start.wait();
        }
        let mut rows = Vec::new();
        for tree in trees {
            let held = s.len();
            rows.extend(collect(&s.decode_tree(tree, &parents, &plan).expect("tree")));
            s.keep_path(held, &kept).expect("keep a path");
        }
        rows.extend(collect(&s.decode(&trees[0][..2], &plan, Rows::Tail(2)).expect("after")));
        Some(rows)
    };
    let alone: Vec<_> = sessions.iter().map(|(p, t)| run(p, t, None)).collect();
    if alone.iter().any(Option::is_none) {
        eprintln!("drafts are verified as paths here, not trees");
        return;
    }
    let before = model.shared_passes().unwrap();
    let start = Barrier::new(sessions.len());
    let together: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .iter()
            .map(|(p, t)| {
                let (start, run) = (&start, &run);
                scope.spawn(move || run(p, t, Some(start)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a session's thread")).collect()
    });
    let after = model.shared_passes().unwrap();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        let (a, t) = (a.as_ref().unwrap(), t.as_ref().unwrap());
        assert_bitwise(&format!("session {i}: tree rows together vs alone"), t, a, n_vocab);
    }
    assert!(after.shared > before.shared, "no pass was shared: {before:?} -> {after:?}");
}
