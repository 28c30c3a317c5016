//! pocket-core's generation loop on a real model: greedy answers are right, seeded sampling is
//! reproducible, and the stop conditions hold.

mod common;

use std::ops::ControlFlow;

use common::*;
use pocket_core::{
    GenerateRequest, Generation, Model, SamplingConfig, Session, StopConfig, StopReason, Token, generate,
};
use pocket_ggml::GgmlModel;

/// Generate in a fresh session; returns the generation and the tokens the session holds after.
fn run(
    model: &GgmlModel,
    prompt: &[Token],
    sampling: SamplingConfig,
    max_tokens: usize,
) -> (Generation, Vec<Token>) {
    let mut session = session(model, &config(512));
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        sampling,
        stop: StopConfig { max_tokens, stop: Vec::new() },
    };
    let mut streamed = String::new();
    let generation = generate(model.info(), &mut session, model.tokenizer(), &request, &mut |event| {
        streamed.push_str(event.text);
        ControlFlow::Continue(())
    })
    .expect("generate");
    assert_eq!(streamed, generation.text, "the events carry the whole text");
    (generation, session.tokens().to_vec())
}

#[test]
fn greedy_chat_answers_the_capital_of_france() {
    let _serial = serial();
    let model = smol();
    let prompt = chat(&model, "What is the capital of France?");
    let (generation, _) = run(&model, &prompt, SamplingConfig::default(), 32);
    assert!(generation.text.contains("Paris"), "answer: {:?}", generation.text);
    assert_eq!(generation.prompt_tokens, prompt.len());
}

#[test]
fn seeded_sampling_is_reproducible_and_stops_at_max_tokens() {
    let _serial = serial();
    let model = smol();
    let prompt = chat(&model, "Write a short poem about the sea.");
    let sampling = SamplingConfig { temperature: 0.8, top_p: 0.9, seed: 42, ..SamplingConfig::default() };
    let max_tokens = 16;

    let (first, held) = run(&model, &prompt, sampling.clone(), max_tokens);
    let (second, _) = run(&model, &prompt, sampling, max_tokens);
    assert_eq!(first.tokens, second.tokens, "same seed, same model, same tokens");
    assert_eq!(first.text, second.text);

    assert_eq!(first.stop, StopReason::MaxTokens, "text: {:?}", first.text);
    assert_eq!(first.tokens.len(), max_tokens);
    // The last sampled token is not decoded: nobody needs its logits.
    let expected_held = [&prompt[..], &first.tokens[..max_tokens - 1]].concat();
    assert_eq!(held, expected_held);

    // Sampling really samples: over 16 tokens of a poem, at temperature 0.8, some token is
    // not the argmax.
    let (greedy, _) = run(&model, &prompt, SamplingConfig::default(), max_tokens);
    assert_ne!(first.tokens, greedy.tokens, "sampled output equals greedy output");
}
