//! `vanilla`: our engine, plain greedy decoding.

use std::ops::ControlFlow;

use pocket_core::stop::StopConfig;
use pocket_core::{GenerateRequest, Model, SamplingConfig, Session, Token, generate};
use pocket_ggml::{GgmlModel, GgmlSession};

use super::{RunOutput, Runner, RunnerContext};
use crate::bench::Error;

/// Runs [`pocket_core::generate()`] on a [`GgmlSession`].
///
/// One session serves every prompt, emptied with `truncate(0)` before each: this mirrors the
/// llama.cpp baseline, whose context is made once and cleared per prompt, so neither mode's
/// timing or generation memory includes setting up its per-conversation state (compute
/// buffers, graph), and both include the KV cache growing with the tokens held.
pub struct VanillaRunner {
    model: GgmlModel,
    session: GgmlSession,
    kv_bytes_per_token: u64,
}

impl VanillaRunner {
    /// A runner with its session made up front.
    pub fn new(cx: RunnerContext<'_>) -> Result<Self, Error> {
        Ok(VanillaRunner {
            model: cx.model.clone(),
            session: cx.model.new_session(cx.session)?,
            kv_bytes_per_token: cx.model.kv_bytes_per_token(cx.session.kv) as u64,
        })
    }
}

impl Runner for VanillaRunner {
    fn name(&self) -> &str {
        "vanilla"
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    fn run(&mut self, prompt: &[Token], max_tokens: usize) -> Result<RunOutput, Error> {
        self.session.truncate(0)?;
        let request = GenerateRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens, stop: Vec::new() },
        };
        let g =
            generate(self.model.info(), &mut self.session, self.model.tokenizer(), &request, &mut |_| {
                ControlFlow::Continue(())
            })?;
        // Release the KV cache now rather than at the next prompt, so the next mode's run
        // does not start with (and count) this one's memory.
        self.session.truncate(0)?;
        Ok(RunOutput {
            tokens: g.tokens,
            prefill_seconds: g.prefill_seconds,
            decode_seconds: g.decode_seconds,
            ..RunOutput::default()
        })
    }
}
