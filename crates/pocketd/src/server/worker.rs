//! The generation worker: one request's generation on a blocking thread, through the request
//! pipeline, with its text forwarded to the request's channel and its session shown in the
//! session table while it runs; at its end, the outcome as a [`Finished`] and its memory back.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pocket_api::FinishReason;
use pocket_core::memory::{Ledger, Plan};
use pocket_core::{StopReason, Tokenizer};
use pocket_runtime::pipeline::{self, Prepared, Sink};
use pocket_runtime::reasoning::Part;
use tokio::sync::{Notify, mpsc, oneshot};

use super::error::ServeError;
use super::job::{Finished, Piece, Started};
use super::metrics::Metrics;
use super::registry::{Registry, ServedModel};

/// A session shown in `/v1/status`.
pub(super) struct SessionEntry {
    pub(super) model: String,
    pub(super) generated: Arc<AtomicU64>,
    pub(super) plan: Plan,
    pub(super) ledger: Ledger,
    pub(super) cancel: Arc<AtomicBool>,
}

/// The sessions generating now, by request id.
pub(super) type Sessions = Mutex<BTreeMap<String, SessionEntry>>;

/// The sessions generating now, as `/v1/status` shows them.
pub(super) fn session_statuses(sessions: &Sessions) -> Vec<pocket_api::SessionStatus> {
    lock(sessions)
        .iter()
        .map(|(id, s)| pocket_api::SessionStatus {
            id: id.clone(),
            model: s.model.clone(),
            generated_tokens: s.generated.load(Ordering::Relaxed),
            plan: serde_json::json!({
                "plan": s.plan,
                "used_bytes": s.ledger.used(),
                "peak_bytes": s.ledger.peak(),
            }),
        })
        .collect()
}

/// What a generation reports to: the daemon's budget, its session table, its models (which it
/// releases at the end) and counters, and who waits for a session to end.
pub(super) struct Worker {
    pub(super) ledger: Ledger,
    pub(super) sessions: Arc<Sessions>,
    pub(super) registry: Arc<Registry>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) session_ended: Arc<Notify>,
}

/// One request's generation: what it runs and what it holds until it ends — `permits`
/// (its place and turn) until its result is sent, `arrival` (what keeps the learner away)
/// until everything else is done.
pub(super) struct GenerationContext<P, A> {
    pub(super) id: String,
    pub(super) model: Arc<ServedModel>,
    pub(super) draft: Option<Arc<ServedModel>>,
    pub(super) prepared: Prepared,
    pub(super) return_tokens: bool,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) queued_seconds: f64,
    pub(super) permits: P,
    pub(super) arrival: A,
}

impl Worker {
    /// Run one generation (blocking thread).
    pub(super) fn generate<P, A>(
        &self,
        ctx: GenerationContext<P, A>,
        started: oneshot::Sender<Result<Started, ServeError>>,
        tx: mpsc::UnboundedSender<Piece>,
    ) {
        let GenerationContext {
            id,
            model,
            draft,
            prepared,
            return_tokens,
            cancel,
            queued_seconds,
            permits,
            arrival,
        } = ctx;
        let ledger = self.ledger.sub();
        let generated = Arc::new(AtomicU64::new(0));
        let mut sink = Forward {
            sessions: &self.sessions,
            registry: &self.registry,
            id: &id,
            model: &model,
            prepared: &prepared,
            ledger: &ledger,
            cancel: &cancel,
            generated: &generated,
            tx: &tx,
            queued_seconds,
            started: Some(started),
            logprobs: Vec::new(),
            thinking: prepared.thinking.map(pocket_runtime::reasoning::Splitter::new),
        };
        let result =
            pipeline::run(&model.model, draft.as_ref().map(|d| &d.model), &prepared, &ledger, &mut sink);
        let not_started = sink.started.take();
        // The session and drafter are dropped by now: their memory is back in the budget.
        let peak_bytes = ledger.peak();
        lock(&self.sessions).remove(&id);
        self.registry.release(&model.name);
        if let Some(d) = &draft {
            self.registry.release(&d.name);
        }
        // Token texts (for log-probabilities) need the tokenizer, before the model is released.
        let result = result.map(|outcome| finished(&outcome, return_tokens, model.model.model().tokenizer()));
        drop((model, draft, permits));
        match result {
            Ok(mut finished) => {
                finished.peak_bytes = peak_bytes;
                finished.timings.peak_bytes = peak_bytes;
                finished.timings.queued_ms = queued_seconds * 1e3;
                tracing::info!(
                    id = %id,
                    prompt_tokens = finished.usage.prompt_tokens,
                    generated = finished.usage.completion_tokens,
                    decode_tok_per_s = format!("{:.1}", finished.timings.decode_tok_per_s),
                    drafter = finished.timings.drafter.as_deref().unwrap_or("none"),
                    finish = finished.finish_reason.as_str(),
                    peak_bytes,
                    "done"
                );
                self.metrics.finished(&finished);
                let _ = tx.send(Piece::Done(Box::new(finished)));
            }
            Err(e) => {
                let e = ServeError::from_runtime(e, Some(&id));
                match not_started {
                    // Before the start, `submit` returns the error (and counts it).
                    Some(s) => {
                        let _ = s.send(Err(e));
                    }
                    None => {
                        tracing::warn!(id = %id, "failed: {e}");
                        self.metrics.failed(&e);
                        let _ = tx.send(Piece::Failed(e));
                    }
                }
            }
        }
        self.session_ended.notify_waiters();
        self.registry.changed();
        drop(arrival);
    }
}

/// Where a running generation reports: the session table once it starts, the request's
/// channel for every token.
struct Forward<'a> {
    sessions: &'a Sessions,
    registry: &'a Registry,
    id: &'a str,
    model: &'a ServedModel,
    prepared: &'a Prepared,
    ledger: &'a Ledger,
    cancel: &'a Arc<AtomicBool>,
    generated: &'a Arc<AtomicU64>,
    tx: &'a mpsc::UnboundedSender<Piece>,
    queued_seconds: f64,
    started: Option<oneshot::Sender<Result<Started, ServeError>>>,
    /// Log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<pocket_api::TokenLogprob>,
    /// A thinking model's output, told apart into thinking and answer as it comes.
    thinking: Option<pocket_runtime::reasoning::Splitter>,
}

impl Sink for Forward<'_> {
    fn started(&mut self) {
        lock(self.sessions).insert(
            self.id.to_owned(),
            SessionEntry {
                model: self.model.name.clone(),
                generated: self.generated.clone(),
                plan: self.prepared.plan.clone().unwrap_or_else(|| unplanned(self.prepared)),
                ledger: self.ledger.clone(),
                cancel: self.cancel.clone(),
            },
        );
        self.registry.changed();
        if let Some(s) = self.started.take() {
            let _ = s.send(Ok(Started {
                id: self.id.to_owned(),
                model: self.model.name.clone(),
                prompt_tokens: self.prepared.tokens.len(),
                plan: self.prepared.plan.clone().unwrap_or_else(|| unplanned(self.prepared)),
                queued_seconds: self.queued_seconds,
                tools: !self.prepared.tool_names.is_empty(),
            }));
        }
    }

    /// Pass one generation event on: count the token, send the text; stop when the client is
    /// gone or the request is cancelled.
    fn event(&mut self, event: pocket_core::Event<'_>) -> ControlFlow<()> {
        if event.token.is_some() {
            self.generated.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(lp) = event.logprob {
            self.logprobs.push(wire_logprob(lp, self.model.model.model().tokenizer()));
        }
        // A token's log-probability goes with the text it made final (text held back, as a
        // possible stop string, takes its tokens' along when it comes).
        let pieces = match self.thinking.as_mut() {
            None if event.text.is_empty() => Vec::new(),
            None => vec![Part::Answer(event.text.to_owned())],
            Some(splitter) => {
                let mut parts = splitter.push(event.text);
                if event.token.is_none() {
                    parts.extend(splitter.finish());
                }
                parts
            }
        };
        for part in pieces {
            let piece = match part {
                Part::Answer(text) => Piece::Text { text, logprobs: std::mem::take(&mut self.logprobs) },
                // The thinking's tokens' log-probabilities are not streamed.
                Part::Thinking(text) => {
                    self.logprobs.clear();
                    Piece::Reasoning(text)
                }
            };
            if self.tx.send(piece).is_err() {
                return ControlFlow::Break(()); // the client is gone
            }
        }
        if self.cancel.load(Ordering::Relaxed) || self.tx.is_closed() {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

/// The plan of a request that was not planned (the daemon plans every one; for the type).
fn unplanned(p: &Prepared) -> Plan {
    Plan {
        kv: p.config.kv,
        n_ctx: p.config.n_ctx,
        n_batch: p.config.n_batch,
        max_rows: p.config.max_rows,
        spec: p.spec,
        draft_model: p.draft_model,
        max_draft: p.max_draft,
        bytes: 0,
        available: 0,
        degraded: Vec::new(),
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain inserts, removals and reads: a panic elsewhere cannot leave them half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A token's log-probability as the API sends it: the token's text and bytes, and its
/// alternatives'.
fn wire_logprob(
    lp: &pocket_core::sampling::TokenLogprob,
    tokenizer: &dyn Tokenizer,
) -> pocket_api::TokenLogprob {
    let wire = |token: u32, logprob: f32| {
        let bytes = tokenizer.piece(token);
        // OpenAI never sends -inf; JSON cannot carry it.
        let logprob = if logprob.is_finite() { logprob } else { -9999.0 };
        (String::from_utf8_lossy(&bytes).into_owned(), logprob, bytes)
    };
    let (token, logprob, bytes) = wire(lp.token, lp.logprob);
    let top_logprobs = lp
        .top
        .iter()
        .map(|&(t, l)| {
            let (token, logprob, bytes) = wire(t, l);
            pocket_api::TopLogprob { token, logprob, bytes }
        })
        .collect();
    pocket_api::TokenLogprob { token, logprob, bytes, top_logprobs }
}

/// What a finished generation reports.
fn finished(outcome: &pocket_runtime::Outcome, return_tokens: bool, tokenizer: &dyn Tokenizer) -> Finished {
    let generation = &outcome.generation;
    let finish_reason = match generation.stop {
        StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
        StopReason::Cancelled => FinishReason::Cancelled,
        StopReason::Eos | StopReason::StopString if !outcome.tool_calls.is_empty() => FinishReason::ToolCalls,
        StopReason::Eos | StopReason::StopString => FinishReason::Stop,
    };
    let completion = generation.tokens.len() as u32;
    let logprobs = (!generation.logprobs.is_empty())
        .then(|| generation.logprobs.iter().map(|lp| wire_logprob(lp, tokenizer)).collect());
    Finished {
        text: generation.text.clone(),
        content: outcome.content.clone(),
        reasoning: outcome.reasoning.clone(),
        tool_calls: outcome.tool_calls.clone(),
        logprobs,
        tokens: return_tokens.then(|| generation.tokens.clone()),
        finish_reason,
        stop_string: generation.stop_string.clone(),
        usage: pocket_api::Usage {
            prompt_tokens: generation.prompt_tokens as u32,
            completion_tokens: completion,
            total_tokens: generation.prompt_tokens as u32 + completion,
            prompt_tokens_details: Some(pocket_api::PromptTokensDetails {
                cached_tokens: generation.cached_tokens as u32,
            }),
            completion_tokens_details: outcome.reasoning.is_some().then_some(
                pocket_api::CompletionTokensDetails { reasoning_tokens: outcome.reasoning_tokens as u32 },
            ),
        },
        timings: pocket_api::Timings {
            prefill_ms: generation.prefill_seconds * 1e3,
            prefill_tok_per_s: generation.prefill_tok_per_s(),
            cached_tokens: generation.cached_tokens as u64,
            decode_tok_per_s: generation.decode_tok_per_s(),
            drafted: generation.spec.drafted as u64,
            accepted: generation.spec.accepted as u64,
            drafts: generation.spec.drafts as u64,
            trees: generation.spec.trees as u64,
            tree_tokens: generation.spec.tree_tokens as u64,
            recalled: outcome.recalled.1 as u64,
            drafter: outcome.drafter.as_ref().map(ToString::to_string),
            queued_ms: 0.0,
            peak_bytes: 0,
            grammar_ms: outcome.grammar_seconds * 1e3,
            constraint_ms: generation.spec.constraint_seconds * 1e3,
            forced: generation.spec.forced as u64,
            forced_accepted: generation.spec.forced_accepted as u64,
            threads: generation.passes.mean(),
        },
        peak_bytes: 0,
        decode_seconds: generation.decode_seconds,
    }
}
