//! Our engine: `vanilla` (no drafter), `suffix`, `layerskip`, `draft:MODEL` and `auto`, and
//! each of them `naive:`.

use std::ops::ControlFlow;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::stop::StopConfig;
use pocket_core::{
    GenerateRequest, Model, SamplingConfig, Session, SessionConfig, Token, generate_speculative,
};
use pocket_ggml::{GgmlModel, GgmlSession};

use super::{RunMode, RunOutput, Runner, RunnerContext};
use crate::bench::Error;
use crate::spec::{DEFAULT_MAX_DRAFT, SpecSetup, plan_session};

/// Runs [`pocket_core::generate_speculative`] with a fresh drafter per prompt (a drafter's
/// acceptance estimates belong to one request); `vanilla` has none, which is plain decoding.
///
/// Without a memory budget, one session serves every prompt, emptied with `truncate(0)`
/// before each: this mirrors the llama.cpp baseline, whose context is made once and cleared
/// per prompt, so neither mode's timing includes setting up its per-conversation state
/// (compute buffers, graph), and both include the KV cache growing with the tokens held.
/// Under a budget, each prompt is planned (as `pocket run` plans its one request) and gets a
/// session of the plan, dropped after it: the budget holds one mode's session at a time.
/// (`naive:` modes are not planned, but under a budget they too make a session per prompt,
/// so that what they hold is not resident during the other modes' runs.)
///
/// Every session and the drafter pay in a ledger of the runner's own (a part of the budget),
/// whose peak during a run is the run's generation memory.
pub struct SpecRunner {
    name: String,
    mode: SpecMode,
    model: GgmlModel,
    draft_model: Option<GgmlModel>,
    config: SessionConfig,
    /// The session kept between runs (without a budget).
    session: Option<GgmlSession>,
    ledger: Ledger,
    /// Whether each run is planned under the budget.
    planned: bool,
    cost: pocket_core::cost::CostModel,
    skip_set: Option<pocket_core::spec::SkipSet>,
    kv_bytes_per_token: u64,
}

impl SpecRunner {
    /// A runner for `mode` (`spec` its speculation).
    pub fn new(
        mode: &RunMode,
        spec: SpecMode,
        draft_model: Option<GgmlModel>,
        cx: RunnerContext<'_>,
    ) -> Result<Self, Error> {
        let config = SessionConfig { preallocate: mode.naive, ..cx.session.clone() };
        // A naive mode is what an engine without a budget holds: it is measured, not planned.
        let ledger = if mode.naive { Ledger::unlimited() } else { cx.ledger.sub() };
        let session = if cx.budgeted { None } else { Some(cx.model.new_session_in(&config, &ledger)?) };
        Ok(SpecRunner {
            name: mode.name(),
            mode: spec,
            model: cx.model.clone(),
            draft_model,
            kv_bytes_per_token: cx.model.kv_bytes_per_token(config.kv) as u64,
            config,
            session,
            ledger,
            planned: cx.budgeted && !mode.naive,
            cost: cx.cost.clone(),
            skip_set: cx.skip_set.cloned(),
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

    fn accounts_memory(&self) -> bool {
        true
    }

    fn run(&mut self, prompt: &[Token], max_tokens: usize) -> Result<RunOutput, Error> {
        let invalid = |e: anyhow::Error| Error::Invalid(format!("{e:#}"));
        self.ledger.reset_peak();
        let (mut config, mut mode, mut max_draft, mut draft_model) =
            (self.config.clone(), self.mode, DEFAULT_MAX_DRAFT, self.draft_model.as_ref());
        let plan = if self.planned {
            let plan = plan_session(
                &self.model,
                draft_model,
                &config,
                &self.ledger,
                prompt.len() + max_tokens,
                mode,
            )
            .map_err(invalid)?;
            plan.apply_to(&mut config);
            mode = plan.spec;
            max_draft = plan.max_draft.max(1);
            if !plan.draft_model {
                draft_model = None;
            }
            Some(plan)
        } else {
            None
        };
        let mut planned_session = None;
        let session = match &mut self.session {
            Some(s) => {
                s.truncate(0)?;
                s
            }
            None => planned_session.insert(self.model.new_session_in(&config, &self.ledger)?),
        };
        let setup = SpecSetup {
            model: &self.model,
            session: &config,
            cost: self.cost.clone(),
            skip_set: self.skip_set.clone(),
            draft_model,
            seed: 0,
            max_draft,
            ledger: self.ledger.clone(),
        };
        let mut drafter = setup.build(mode).map_err(invalid)?;
        let request = GenerateRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens, stop: Vec::new() },
        };
        let d = drafter.as_mut().map(|d| d.as_drafter());
        let g = generate_speculative(
            self.model.info(),
            session,
            self.model.tokenizer(),
            &request,
            d,
            &mut |_| ControlFlow::Continue(()),
        )?;
        // Release the KV cache now rather than at the next prompt, so the next mode's run
        // does not start with (and count) this one's memory.
        session.truncate(0)?;
        drop(planned_session);
        let detail = drafter.as_mut().map(|d| d.as_drafter().describe());
        drop(drafter);
        Ok(RunOutput {
            tokens: g.tokens,
            prefill_seconds: g.prefill_seconds,
            decode_seconds: g.decode_seconds,
            drafted: g.spec.drafted as u64,
            accepted: g.spec.accepted as u64,
            draft_steps: g.spec.drafts as u64,
            drafter: detail,
            generation_memory_bytes: self.ledger.peak(),
            plan,
        })
    }
}
