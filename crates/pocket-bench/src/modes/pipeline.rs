//! Our engine through the one request pipeline: `vanilla` (no drafter), `suffix`,
//! `layerskip`, `draft:MODEL`, `auto` and `inputcopy`, and each of them `naive:`.

use std::ops::ControlFlow;
use std::sync::Arc;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{SamplingConfig, SessionConfig, StopConfig};
use pocket_runtime::pipeline::{self, Input, OnEvent, Request};
use pocket_runtime::{DEFAULT_MAX_DRAFT, LoadedModel};

use super::{PromptRun, RunMode, RunOutput, Runner, RunnerContext};
use crate::Error;

/// Runs a prompt as `pocket run` and the daemon run a request: [`pipeline::prepare`] (planned,
/// under the budget when there is one) then [`pipeline::run`], with a new session and drafter
/// each time, dropped at the end; `vanilla` has no drafter, which is plain decoding.
///
/// Sessions and drafters pay in a ledger of the runner's own (a part of the budget), whose
/// peak during a run is the run's generation memory. `naive:` modes hold their KV caches for
/// the whole context from the start and are not planned.
pub struct PipelineRunner {
    name: String,
    spec: SpecMode,
    model: Arc<LoadedModel>,
    draft_model: Option<Arc<LoadedModel>>,
    session: SessionConfig,
    ledger: Ledger,
    /// Planned as every request is (not `naive:`).
    planned: bool,
    /// Under a memory budget (the plan is then recorded).
    budgeted: bool,
    kv_bytes_per_token: u64,
}

impl PipelineRunner {
    /// A runner for `mode` (`spec` its speculation).
    pub fn new(
        mode: &RunMode,
        spec: SpecMode,
        draft_model: Option<Arc<LoadedModel>>,
        cx: RunnerContext<'_>,
    ) -> Result<Self, Error> {
        let session = SessionConfig { preallocate: mode.naive, ..cx.session.clone() };
        // A naive mode is what an engine without a budget holds: it is measured, not planned.
        let ledger = if mode.naive { Ledger::unlimited() } else { cx.ledger.sub() };
        Ok(PipelineRunner {
            name: mode.name(),
            spec,
            kv_bytes_per_token: cx.model.kv_bytes_per_token(&session)?,
            model: cx.model.clone(),
            draft_model,
            session,
            ledger,
            planned: !mode.naive,
            budgeted: cx.budgeted,
        })
    }
}

impl Runner for PipelineRunner {
    fn name(&self) -> &str {
        &self.name
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    fn accounts_memory(&self) -> bool {
        true
    }

    fn run(&mut self, prompt: &PromptRun<'_>) -> Result<RunOutput, Error> {
        self.ledger.reset_peak();
        self.run_one(prompt)
    }

    /// Every prompt on a thread of its own, started together: sessions of a model that
    /// shares passes share them.
    fn run_concurrent(&mut self, prompts: &[PromptRun<'_>]) -> Result<Vec<RunOutput>, Error> {
        self.ledger.reset_peak();
        let start = std::time::Instant::now();
        let this = &*self;
        std::thread::scope(|scope| {
            let runs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    scope.spawn(move || {
                        let begun = start.elapsed().as_secs_f64();
                        this.run_one(p).map(|mut out| {
                            // The time to the first token counts from the common start.
                            out.prefill_seconds += begun;
                            out
                        })
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().expect("a request's thread")).collect()
        })
    }
}

impl PipelineRunner {
    /// One prompt through the pipeline, as [`Runner::run`] describes.
    fn run_one(&self, prompt: &PromptRun<'_>) -> Result<RunOutput, Error> {
        let request = Request {
            input: Input::Tokens(prompt.tokens.to_vec()),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens: prompt.max_tokens, stop: Vec::new() },
            spec: self.spec,
            session: self.session.clone(),
            max_draft: DEFAULT_MAX_DRAFT,
            planned: self.planned,
            // Each prompt is measured from nothing (the benchmark's models have no prompt
            // cache either); conversations measure the cache through the daemon.
            prompt_cache: false,
            cache_hint: None,
            grammar: None,
            logprobs: None,
            tools: Default::default(),
            template_kwargs: Default::default(),
        };
        let draft = self.draft_model.as_deref();
        let prepared = pipeline::prepare(&self.model, draft, &request, &self.ledger)?;
        let outcome = pipeline::run(
            &self.model,
            draft,
            &prepared,
            &self.ledger,
            &mut OnEvent::new(|_| ControlFlow::Continue(())),
        )?;
        let g = outcome.generation;
        Ok(RunOutput {
            tokens: g.tokens,
            prefill_seconds: g.prefill_seconds,
            decode_seconds: g.decode_seconds,
            drafted: g.spec.drafted as u64,
            accepted: g.spec.accepted as u64,
            draft_steps: g.spec.drafts as u64,
            drafter: outcome.drafter.map(|d| d.to_string()),
            generation_memory_bytes: self.ledger.peak(),
            plan: outcome.plan.filter(|_| self.budgeted),
            passes: Some(g.passes),
        })
    }
}
