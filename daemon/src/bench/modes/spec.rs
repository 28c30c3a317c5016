//! Our engine: `vanilla` (no drafter), `suffix`, `layerskip`, `draft:MODEL` and `auto`.

use std::ops::ControlFlow;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::stop::StopConfig;
use pocket_core::{GenerateRequest, Model, SamplingConfig, Session, Token, generate_speculative};
use pocket_ggml::{GgmlModel, GgmlSession};

use super::{RunOutput, Runner, RunnerContext};
use crate::bench::Error;
use crate::spec::{DEFAULT_MAX_DRAFT, SpecSetup};

/// Runs [`pocket_core::generate_speculative`] with a fresh drafter per prompt (a drafter's
/// acceptance estimates belong to one request); `vanilla` has none, which is plain decoding.
///
/// One session serves every prompt, emptied with `truncate(0)` before each: this mirrors the
/// llama.cpp baseline, whose context is made once and cleared per prompt, so neither mode's
/// timing or generation memory includes setting up its per-conversation state (compute
/// buffers, graph), and both include the KV cache growing with the tokens held.
pub struct SpecRunner {
    name: String,
    mode: SpecMode,
    model: GgmlModel,
    draft_model: Option<GgmlModel>,
    session: GgmlSession,
    cost: pocket_core::cost::CostModel,
    skip_set: Option<pocket_core::spec::SkipSet>,
    kv_bytes_per_token: u64,
}

impl SpecRunner {
    /// A runner for `mode`, named `name` in the results.
    pub fn new(
        name: String,
        mode: SpecMode,
        draft_model: Option<GgmlModel>,
        cx: RunnerContext<'_>,
    ) -> Result<Self, Error> {
        Ok(SpecRunner {
            name,
            mode,
            model: cx.model.clone(),
            draft_model,
            session: cx.model.new_session(cx.session)?,
            cost: cx.cost.clone(),
            skip_set: cx.skip_set.cloned(),
            kv_bytes_per_token: cx.model.kv_bytes_per_token(cx.session.kv) as u64,
        })
    }
}

impl Runner for SpecRunner {
    fn name(&self) -> &str {
        &self.name
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    fn run(&mut self, prompt: &[Token], max_tokens: usize) -> Result<RunOutput, Error> {
        self.session.truncate(0)?;
        let setup = SpecSetup {
            model: &self.model,
            session: self.session.config(),
            cost: self.cost.clone(),
            skip_set: self.skip_set.clone(),
            draft_model: self.draft_model.as_ref(),
            seed: 0,
            max_draft: DEFAULT_MAX_DRAFT,
            ledger: Ledger::unlimited(),
        };
        let mut drafter = setup.build(self.mode).map_err(|e| Error::Invalid(format!("{e:#}")))?;
        let request = GenerateRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens, stop: Vec::new() },
        };
        let d = drafter.as_mut().map(|d| d.as_drafter());
        let g = generate_speculative(
            self.model.info(),
            &mut self.session,
            self.model.tokenizer(),
            &request,
            d,
            &mut |_| ControlFlow::Continue(()),
        )?;
        // Release the KV cache now rather than at the next prompt, so the next mode's run
        // does not start with (and count) this one's memory.
        self.session.truncate(0)?;
        let detail = drafter.as_mut().map(|d| d.as_drafter().describe());
        Ok(RunOutput {
            tokens: g.tokens,
            prefill_seconds: g.prefill_seconds,
            decode_seconds: g.decode_seconds,
            drafted: g.spec.drafted as u64,
            accepted: g.spec.accepted as u64,
            draft_steps: g.spec.drafts as u64,
            drafter: detail,
        })
    }
}
