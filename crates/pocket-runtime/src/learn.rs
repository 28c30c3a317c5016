//! Learning about a model on this device — its verification cost curve, how well it keeps its
//! answers with quantized KV caches, and a skip set for layer-skip drafting — off the request
//! path: while the daemon is otherwise idle, or on an
//! explicit `pocket tune`. What is learned is remembered ([`crate::Knowledge`]) and used by
//! every later request; until it is, `auto` decodes plainly.
//!
//! Everything here can be cancelled between two forward passes (`cancelled` is asked before
//! each): the daemon cancels the moment a request arrives. A skip-set search that is cancelled
//! keeps its state in the model and resumes where it stopped.

use std::ops::ControlFlow;

use pocket_core::cost::{CostModel, CostPoint, measure_cost_curve};
use pocket_core::memory::Ledger;
use pocket_core::spec::{AutoConfig, LayerSkipConfig, LayerSkipDrafter, MAX_DRAFT, SkipSet, SpecMode};
use pocket_core::{
    ChatMessage, GenerateRequest, KvType, LayerPlan, Model, ModelKind, Rows, SamplingConfig, Session,
    SessionConfig, StopConfig, Threads, Token, argmax, generate_speculative,
};

use crate::learning_text::{PROSE, SEARCH_QUESTIONS};
use crate::{DEFAULT_MAX_DRAFT, Error, Known, LoadedModel, Result};

/// Agreement a skip set must reach for the search to count it good (SWIFT stops near 0.93).
const GOOD_AGREEMENT: f64 = 0.93;

/// Prompt tokens decoded per pass while learning: small enough that a request waits at most
/// one short pass for the learner to give way.
const PREFILL_CHUNK: usize = 16;

/// Positions compared when measuring a KV type's agreement: enough that one flip moves it by
/// well under the margin that decides ([`crate::GOOD_KV_AGREEMENT`]).
const AGREEMENT_TOKENS: usize = 256;

/// The KV types whose agreement the memory ladder asks about ([`crate::Knowledge::lowest_kv`]).
pub const MEASURED_KV_TYPES: [KvType; 2] = [KvType::Q8_0_Q4_0, KvType::Q4_0];

/// Tokens generated per round of a skip-set search.
const SEARCH_TOKENS: usize = 128;

/// Rounds of generation a skip-set search takes at most before it settles for the best set
/// found.
const SEARCH_ROUNDS: usize = 8;

/// When to search a skip set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipSearch {
    /// Where the model offers layer skipping and the cost curve says that a good skip set
    /// (half the layers at 0.93 agreement) could beat plain decoding.
    WhereItCouldPay,
    /// Wherever the model offers layer skipping (a benchmark of `layerskip` needs a set).
    Always,
    /// Never.
    Never,
}

/// What to learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneSettings {
    /// Threads requests run with (a cost curve holds for one thread count).
    pub threads: usize,
    /// KV type requests run with (a cost curve holds for one KV type).
    pub kv: KvType,
    /// When to search a skip set.
    pub skip_search: SkipSearch,
    /// Measure again what is already known.
    pub again: bool,
}

impl TuneSettings {
    /// Learn what `auto` needs for sessions of `threads` threads and a `kv` cache.
    pub fn new(threads: usize, kv: KvType) -> Self {
        TuneSettings { threads, kv, skip_search: SkipSearch::WhereItCouldPay, again: false }
    }
}

/// How far learning has got, for a progress display.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// The cost curve is being measured.
    MeasuringCurve,
    /// The cost curve is measured.
    Curve(&'a [CostPoint]),
    /// The quantized KV types' agreement is being measured.
    MeasuringKvAgreement,
    /// A KV type's top-1 agreement with an f16 cache was measured.
    KvAgreement(KvType, f64),
    /// A skip-set search started (or resumed).
    Searching,
    /// A skip set was found.
    SkipSet(&'a SkipSet),
    /// No skip set is searched, and why.
    NoSearch(&'a str),
}

/// What learning did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tuned {
    /// What is known now.
    pub known: Known,
    /// Whether the cost curve was measured now (rather than known).
    pub measured_curve: bool,
    /// Whether a skip set was found now.
    pub found_skip_set: bool,
    /// Whether the KV types' agreement was measured now.
    pub measured_kv_agreement: bool,
    /// Whether learning stopped because it was cancelled (what was done is kept).
    pub cancelled: bool,
}

/// Whether a good skip set could beat plain decoding on `cost`: half the layers at the
/// agreement a search aims for.
pub fn layerskip_could_pay(cost: &CostModel) -> bool {
    AutoConfig::new(cost.clone()).model_drafting_pays(cost.best_k(GOOD_AGREEMENT, 0.5, DEFAULT_MAX_DRAFT).1)
}

/// Whether [`tune`] with `settings` has anything to do for `model`.
pub fn needs_tuning(model: &LoadedModel, settings: &TuneSettings) -> bool {
    // A model that only decodes plainly (a recurrent state on llama.cpp) has no use for a
    // cost curve, and could not measure one (that rolls back).
    if !model.offers(SpecMode::Suffix) {
        return false;
    }
    // Nor one on a device where a token and a draft never pass exactly (no drafts are made
    // there): measuring would only compile, and on an OpenVINO device keep while the model is
    // loaded, a model for every pass width and layer plan it tried.
    if !drafts_verified(model) {
        return false;
    }
    let known = model.knowledge().known(settings.threads, settings.kv);
    let Some(cost) = known.cost().filter(|_| !settings.again) else { return true };
    kv_agreement_wanted(model) || (known.skip_set.is_none() && search_wanted(model, settings, &cost))
}

/// Whether a decoder's KV agreement is still to be measured (an encoder-decoder model's
/// cache is quantized its own way, and stays at 8-bit keys).
fn kv_agreement_wanted(model: &LoadedModel) -> bool {
    model.model().info().kind == ModelKind::Decoder
        && MEASURED_KV_TYPES.iter().any(|&kv| model.knowledge().kv_agreement(kv).is_none())
}

fn search_wanted(model: &LoadedModel, settings: &TuneSettings, cost: &CostModel) -> bool {
    model.offers(SpecMode::LayerSkip)
        && drafts_verified(model)
        && match settings.skip_search {
            SkipSearch::WhereItCouldPay => layerskip_could_pay(cost),
            SkipSearch::Always => true,
            SkipSearch::Never => false,
        }
}

/// Whether drafts are verified on `model`'s device: not where its probe at load found no
/// exact pass of a token and a draft (a skip set, and the curve's wide passes, serve nothing
/// there).
fn drafts_verified(model: &LoadedModel) -> bool {
    model.model().info().exact_passes.as_ref().is_none_or(|e| e.max_tokens > 1)
}

/// Learn what `settings` ask for about `model`: its cost curve (unless known), then, where it
/// could pay, a skip set (unless known). Sessions pay for their memory in `ledger`; `cancelled`
/// is asked before every pass, and a cancelled tune returns what it had learned so far with
/// [`Tuned::cancelled`] set.
pub fn tune(
    model: &LoadedModel,
    settings: &TuneSettings,
    ledger: &Ledger,
    cancelled: &dyn Fn() -> bool,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Tuned> {
    let knowledge = model.knowledge();
    let mut tuned = Tuned::default();
    let curve = match knowledge.cost_curve(settings.threads, settings.kv).filter(|_| !settings.again) {
        Some(curve) => curve,
        None => {
            progress(Progress::MeasuringCurve);
            match measure_curve(model, settings.threads, settings.kv, ledger, cancelled) {
                Ok(curve) => {
                    tracing::info!(model = %model.model().info().name, threads = settings.threads, kv = %settings.kv,
                        "measured the verification cost curve");
                    knowledge.remember_cost_curve(settings.threads, settings.kv, curve.clone());
                    tuned.measured_curve = true;
                    progress(Progress::Curve(&curve));
                    curve
                }
                Err(Error::Core(pocket_core::Error::Cancelled)) => {
                    tuned.cancelled = true;
                    tuned.known = knowledge.known(settings.threads, settings.kv);
                    return Ok(tuned);
                }
                Err(e) => return Err(e),
            }
        }
    };
    if settings.again || kv_agreement_wanted(model) {
        progress(Progress::MeasuringKvAgreement);
        match measure_kv_agreement(model, settings.threads, &MEASURED_KV_TYPES, ledger, cancelled) {
            Ok(measured) => {
                for (kv, agreement) in measured {
                    tracing::info!(model = %model.model().info().name, %kv, agreement,
                        "measured a KV type's agreement with an f16 cache");
                    knowledge.remember_kv_agreement(kv, agreement);
                    progress(Progress::KvAgreement(kv, agreement));
                }
                tuned.measured_kv_agreement = true;
            }
            Err(Error::Core(pocket_core::Error::Cancelled)) => {
                tuned.cancelled = true;
                tuned.known = knowledge.known(settings.threads, settings.kv);
                return Ok(tuned);
            }
            // A type the engine does not offer for this model (heads not a multiple of 32):
            // nothing to learn, and the ladder never reaches it either.
            Err(e) => tracing::info!(model = %model.model().info().name, "no KV agreement measured: {e}"),
        }
    }
    let cost = CostModel::from_curve(&curve);
    let searching =
        (settings.again || knowledge.skip_set().is_none()) && search_wanted(model, settings, &cost);
    if searching {
        progress(Progress::Searching);
        match search_skip_set(model, settings, cost, ledger, cancelled)? {
            Some(set) => {
                tracing::info!(model = %model.model().info().name, skip = ?set.skip, agreement = set.agreement,
                    "found a layer-skip set");
                knowledge.remember_skip_set(set.clone());
                tuned.found_skip_set = true;
                progress(Progress::SkipSet(&set));
            }
            None => tuned.cancelled = true,
        }
    } else if knowledge.skip_set().is_none() {
        let why = if !model.offers(SpecMode::LayerSkip) {
            "this model does not skip layers"
        } else if settings.skip_search == SkipSearch::Never {
            "not asked for"
        } else {
            "on this cost curve even a good skip set would not beat plain decoding"
        };
        progress(Progress::NoSearch(why));
    }
    tuned.known = knowledge.known(settings.threads, settings.kv);
    Ok(tuned)
}

/// The tokens learning runs on: the built-in prose, tokenized by the model.
fn filler(model: &dyn Model) -> Result<Vec<Token>> {
    let tokens = model.tokenizer().encode(PROSE, false)?;
    if tokens.is_empty() {
        return Err(pocket_core::Error::engine("the tokenizer gives no tokens for plain English text").into());
    }
    Ok(tokens)
}

/// Decode `tokens` into `session` in small passes, asking `cancelled` before each; false if it
/// was cancelled.
fn prefill(
    session: &mut dyn Session,
    n_layers: usize,
    tokens: &[Token],
    cancelled: &dyn Fn() -> bool,
) -> Result<bool> {
    let plan = LayerPlan::full(n_layers)?;
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        if cancelled() {
            return Ok(false);
        }
        session.decode(chunk, &plan, Rows::None)?;
    }
    Ok(true)
}

/// Measure `model`'s cost curve now for sessions of `threads` threads and a `kv` cache, as
/// the model says it is measured ([`Model::cost_curve_config`]), on the built-in prose (an
/// encoder-decoder model's decoder attends to a sentence or two of it). Nothing is remembered:
/// [`tune`] remembers what it measures. [`pocket_core::Error::Cancelled`] when `cancelled`.
pub fn measure_curve(
    model: &LoadedModel,
    threads: usize,
    kv: KvType,
    ledger: &Ledger,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<CostPoint>> {
    let target = model.model();
    let info = target.info();
    let cc = target.cost_curve_config();
    let largest = cc.sizes.iter().copied().max().unwrap_or(1);
    let tokens = filler(target)?;
    let cycled: Vec<Token> = tokens.iter().copied().cycle().take(cc.context).collect();
    // An encoder-decoder model's decoder attends to a source: a sentence or two of it.
    let source = &tokens[..tokens.len().min(48)];
    let n_ctx = (cc.context + largest).max(source.len()).min(info.n_ctx_train.max(cc.context + largest));
    // A curve holds for one thread count: measured on exactly that many.
    let threads = Threads::Fixed(threads);
    let config = SessionConfig { kv, threads, n_ctx, max_rows: largest, ..SessionConfig::default() };
    let mut session = target.session_in(&config, ledger)?;
    if info.kind == ModelKind::EncoderDecoder {
        session.encode(source)?;
    }
    if !prefill(session.as_mut(), info.n_layers, &cycled, cancelled)? {
        return Err(pocket_core::Error::Cancelled.into());
    }
    Ok(measure_cost_curve(session.as_mut(), info.n_layers, &tokens, &cc, cancelled)?)
}

/// Where a decode step's time goes for `model` on its device, sessions of `threads` threads
/// and a `kv` cache: [`STEP_PROFILE_STEPS`] greedy single-token steps after a prompt of the
/// built-in prose, each timed from the call to the engine until its next token is chosen.
pub fn profile_steps(
    model: &LoadedModel,
    threads: usize,
    kv: KvType,
    ledger: &Ledger,
) -> Result<StepProfile> {
    let target = model.model();
    let info = target.info();
    let tokens = filler(target)?;
    let prompt = &tokens[..tokens.len().min(128)];
    let n_ctx = (prompt.len() + STEP_PROFILE_STEPS + 1).min(info.n_ctx_train);
    let config = SessionConfig { kv, threads: Threads::Fixed(threads), n_ctx, ..SessionConfig::default() };
    let mut session = target.session_in(&config, ledger)?;
    if info.kind == ModelKind::EncoderDecoder {
        session.encode(&prompt[..prompt.len().min(48)])?;
    }
    let plan = LayerPlan::full(info.n_layers)?;
    let mut next = argmax(session.decode(prompt, &plan, Rows::Last)?.last());
    // The first steps build and warm the decode graph (and a device's graph capture).
    let warm_up = 4;
    let steps = STEP_PROFILE_STEPS.min(n_ctx.saturating_sub(prompt.len() + warm_up + 1));
    for _ in 0..warm_up {
        next = argmax(session.decode(&[next], &plan, Rows::Last)?.last());
    }
    let before = session.pass_stats();
    let start = std::time::Instant::now();
    for _ in 0..steps {
        next = argmax(session.decode(&[next], &plan, Rows::Last)?.last());
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(StepProfile { steps, seconds, passes: session.pass_stats().since(before) })
}

/// Greedy steps [`profile_steps`] times.
pub const STEP_PROFILE_STEPS: usize = 64;

/// What [`profile_steps`] measured.
#[derive(Debug, Clone, Copy)]
pub struct StepProfile {
    /// Steps timed.
    pub steps: usize,
    /// Their seconds in all.
    pub seconds: f64,
    /// Their passes, as the engine counts them.
    pub passes: pocket_core::PassStats,
}

impl std::fmt::Display for StepProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let step = self.seconds * 1e3 / self.steps.max(1) as f64;
        let p = self.passes;
        write!(f, "a decode step takes {step:.2} ms ({:.0} tok/s)", 1e3 / step.max(1e-9))?;
        if p.passes > 0 && p.pass_ns > 0 {
            write!(
                f,
                ": graph {:.2} ms, the engine's host work around it {:.2} ms, sampling and the rest {:.2} ms",
                p.graph_ms(),
                p.pass_ms() - p.graph_ms(),
                step - p.pass_ms() * p.passes as f64 / self.steps.max(1) as f64
            )?;
        }
        if p.splits > 0 {
            write!(f, "; {:.0} graph splits a pass", p.splits_per_pass())?;
        }
        Ok(())
    }
}

/// Measure how often `model` picks the same next token with each of `kv_types` as with an f16
/// cache: the built-in prose is fed through a session of each type (teacher forcing, so one
/// flip cannot cascade), and the top-1 token at every position compared with the f16
/// session's. [`pocket_core::Error::Cancelled`] when `cancelled`.
pub fn measure_kv_agreement(
    model: &LoadedModel,
    threads: usize,
    kv_types: &[KvType],
    ledger: &Ledger,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<(KvType, f64)>> {
    let target = model.model();
    let info = target.info();
    let text = filler(target)?;
    // Not cycled: a repeat is copied by any cache, which would flatter the quantized ones.
    let tokens: Vec<Token> = text.iter().copied().take(AGREEMENT_TOKENS.min(info.n_ctx_train)).collect();
    let plan = LayerPlan::full(info.n_layers)?;
    let top1 = |kv: KvType| -> Result<Vec<Token>> {
        let config = SessionConfig {
            kv,
            threads: Threads::Fixed(threads),
            n_ctx: tokens.len(),
            n_batch: PREFILL_CHUNK,
            max_rows: PREFILL_CHUNK,
            ..SessionConfig::default()
        };
        let mut session = target.session_in(&config, ledger)?;
        let mut picked = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            if cancelled() {
                return Err(pocket_core::Error::Cancelled.into());
            }
            let logits = session.decode(chunk, &plan, Rows::Tail(chunk.len()))?;
            picked.extend((0..logits.rows()).map(|i| argmax(logits.row(i))));
        }
        Ok(picked)
    };
    let reference = top1(KvType::F16)?;
    kv_types
        .iter()
        .map(|&kv| {
            let picked = top1(kv)?;
            let same = picked.iter().zip(&reference).filter(|(a, b)| a == b).count();
            Ok((kv, same as f64 / reference.len().max(1) as f64))
        })
        .collect()
}

/// Search a skip set by generating answers to the built-in questions with layer-skip drafting
/// until the search ends (SWIFT's on-the-fly search, run here instead of inside a request).
/// `None` when cancelled: the search's state stays with the model and resumes next time.
fn search_skip_set(
    model: &LoadedModel,
    settings: &TuneSettings,
    cost: CostModel,
    ledger: &Ledger,
    cancelled: &dyn Fn() -> bool,
) -> Result<Option<SkipSet>> {
    let target = model.model();
    let info = target.info();
    let mut slot = model.search.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() || settings.again {
        let config = LayerSkipConfig { max_draft: DEFAULT_MAX_DRAFT, ..LayerSkipConfig::default() };
        *slot = Some(LayerSkipDrafter::new(info.n_layers, config, None, cost)?);
    }
    let Some(drafter) = slot.as_mut() else { return Ok(None) };
    for round in 0..SEARCH_ROUNDS {
        if !drafter.searching() {
            break;
        }
        let question = SEARCH_QUESTIONS[round % SEARCH_QUESTIONS.len()];
        let prompt = search_prompt(target, question)?;
        let config = SessionConfig {
            kv: settings.kv,
            threads: Threads::Fixed(settings.threads),
            n_ctx: (prompt.len() + SEARCH_TOKENS + MAX_DRAFT + 2).min(info.n_ctx_train.max(16)),
            max_rows: MAX_DRAFT + 1,
            ..SessionConfig::default()
        };
        let mut session = target.session_in(&config, ledger)?;
        let (held, last) = prompt.split_at(prompt.len() - 1);
        if !prefill(session.as_mut(), info.n_layers, held, cancelled)? {
            return Ok(None);
        }
        let request = GenerateRequest {
            prompt: last.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens: SEARCH_TOKENS.min(config.n_ctx - prompt.len()), stop: Vec::new() },
        };
        let generation = generate_speculative(
            info,
            session.as_mut(),
            target.tokenizer(),
            &request,
            Some(drafter),
            &mut |_| if cancelled() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) },
        )?;
        if generation.stop == pocket_core::StopReason::Cancelled && drafter.searching() {
            return Ok(None);
        }
    }
    let set = drafter.skip_set();
    *slot = None;
    set.map(Some).ok_or_else(|| pocket_core::Error::engine("the skip-set search scored no candidate").into())
}

/// The prompt of a search round: the question and the built-in prose, as a chat message where
/// the model has a chat template.
fn search_prompt(model: &dyn Model, question: &str) -> Result<Vec<Token>> {
    let text = format!("{question}\n\n{PROSE}");
    let tokenizer = model.tokenizer();
    let message = ChatMessage::new(pocket_core::Role::User, text.clone());
    let rendered = tokenizer.apply_chat_template(&[message], true).unwrap_or(text);
    Ok(tokenizer.encode(&rendered, true)?)
}
