//! The plain generation loop.
//!
//! Each step has the shape speculative decoding will fill in: *propose* tokens after the
//! pending one (plain decoding proposes none) → *decode* them with the full plan in one
//! pass → *accept* what the logits agree with and sample the next pending token.

use std::ops::ControlFlow;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::constraint::{Constraint, Masker};
use crate::sampling::{Distribution, Sampler, SamplingConfig, TokenLogprob, token_logprob};
use crate::spec::{
    Batch, Draft, Drafter, MAX_DRAFT, Path, SpecStats, Verdict, verify_greedy, verify_sampled,
    verify_tree_greedy,
};
use crate::stop::{StopConfig, StopReason, TextStream};
use crate::{Error, LayerPlan, Logits, ModelInfo, PassStats, Result, Rows, Session, Token, Tokenizer};

/// What to generate from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Tokens to append to the session before generating (the whole prompt for a new
    /// session, the next turn for a continuing chat).
    pub prompt: Vec<Token>,
    /// How tokens are chosen.
    pub sampling: SamplingConfig,
    /// When to stop.
    pub stop: StopConfig,
}

/// One step of progress, passed to the caller as it happens.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Event<'a> {
    /// The token just generated; `None` for the last event, which releases text held back
    /// (a possible start of a stop string, or an incomplete character) at the end.
    pub token: Option<Token>,
    /// Text this step made final; often empty (part of a character, or held back).
    pub text: &'a str,
    /// The token's log-probability, when the guide asked for them ([`Guide::logprobs`]): a
    /// stream sends it with the text it belongs to.
    pub logprob: Option<&'a TokenLogprob>,
}

/// The result of [`generate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The generated tokens: every token sampled, the end token not included.
    pub tokens: Vec<Token>,
    /// The text of the events concatenated: up to (not including) a stop string.
    pub text: String,
    /// Why generation ended.
    pub stop: StopReason,
    /// The stop string that ended generation, when `stop` is [`StopReason::StopString`].
    pub stop_string: Option<String>,
    /// Tokens of the request's prompt.
    pub prompt_tokens: usize,
    /// Of those, how many were not decoded because a kept prefix already held them (see
    /// `pocket_runtime`'s prompt cache); [`generate`] itself sets 0.
    #[serde(default)]
    pub cached_tokens: usize,
    /// Seconds from the start of the prompt's decode until the first token was sampled.
    pub prefill_seconds: f64,
    /// Seconds from the first token's sampling until the last token's: the span in which
    /// `tokens[1..]` were produced (event callbacks included).
    pub decode_seconds: f64,
    /// What speculation did (all zero for plain decoding).
    #[serde(default)]
    pub spec: SpecStats,
    /// This generation's forward passes: their CPU threads, graph splits and time (see
    /// [`Session::pass_stats`]).
    #[serde(default, alias = "threads")]
    pub passes: PassStats,
    /// Each generated token's log-probability and the most likely alternatives, when the
    /// guide asked for them ([`Guide::logprobs`]); one per entry of `tokens`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
}

impl Generation {
    /// Prompt tokens decoded per second of prefill (0 when nothing was timed); tokens a kept
    /// prefix held are not counted.
    pub fn prefill_tok_per_s(&self) -> f64 {
        rate(self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens), self.prefill_seconds)
    }

    /// Generated tokens per second after the first: `tokens.len() - 1` over
    /// `decode_seconds` (0 when fewer than two tokens were generated).
    pub fn decode_tok_per_s(&self) -> f64 {
        rate(self.tokens.len().saturating_sub(1), self.decode_seconds)
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 }
}

/// Generate from `request.prompt`, appended to what `session` already holds.
///
/// `info` is the model the session belongs to. Every token is reported to `on_event` as
/// it is sampled; returning [`ControlFlow::Break`] ends generation with
/// [`StopReason::Cancelled`]. A last event with no token releases any text still held back;
/// its return value is ignored.
///
/// Errors before anything is decoded: an empty prompt or an invalid config is
/// [`Error::InvalidArgument`]; a prompt that leaves no room in the context for one
/// generated token is [`Error::ContextOverflow`].
///
/// On return the session holds the prompt and every generated token except the last one
/// (decoding it would cost a forward pass whose logits nobody needs); after
/// [`StopReason::Eos`] it holds them all, the end token not included.
///
/// The repetition penalty sees every token the session held before, the prompt and the
/// output: a conversation continued from a kept prefix is penalised as if its whole prompt
/// had been sent.
pub fn generate(
    info: &ModelInfo,
    session: &mut dyn Session,
    tokenizer: &dyn Tokenizer,
    request: &GenerateRequest,
    on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
) -> Result<Generation> {
    generate_speculative(info, session, tokenizer, request, None, on_event)
}

/// [`generate`] with a drafter: each step, `drafter` proposes tokens after the pending one,
/// one full-plan pass verifies them, and what the target agrees with is kept (see
/// [`crate::spec`]). Greedy output is the same, token for token, as [`generate`]'s; sampled
/// output follows the same distribution. The session ends holding what it would after
/// [`generate`]. `None` is plain decoding.
pub fn generate_speculative(
    info: &ModelInfo,
    session: &mut dyn Session,
    tokenizer: &dyn Tokenizer,
    request: &GenerateRequest,
    drafter: Option<&mut dyn Drafter>,
    on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
) -> Result<Generation> {
    let guide = Guide { drafter, ..Guide::default() };
    generate_guided(info, session, tokenizer, request, guide, on_event)
}

/// What steers a generation besides sampling: a drafter proposing tokens and a constraint
/// deciding which tokens may come at all.
#[derive(Default)]
pub struct Guide<'d, 'c> {
    /// Proposes tokens for each verification pass (`None`: plain decoding, unless forced
    /// tokens are drafted).
    pub drafter: Option<&'d mut dyn Drafter>,
    /// Masks the tokens a grammar forbids, at every step; drafted tokens it forbids are cut
    /// before verification.
    pub constraint: Option<&'c mut dyn Constraint>,
    /// The longest run of tokens the constraint forces that is drafted for free instead of
    /// asking the drafter (0: never). The session must return that many extra rows of logits.
    pub max_forced: usize,
    /// Report each generated token's log-probability under the model (its raw logits, before
    /// any mask, penalty or temperature) with this many most likely alternatives.
    pub logprobs: Option<usize>,
}

/// [`generate_speculative`] under a [`Guide`]: the constraint masks every row before it is
/// sampled, so the output is what constrained plain decoding gives (token for token when
/// greedy); where the constraint forces tokens, they are the step's draft and cost no
/// drafter time.
pub fn generate_guided(
    info: &ModelInfo,
    session: &mut dyn Session,
    tokenizer: &dyn Tokenizer,
    request: &GenerateRequest,
    guide: Guide<'_, '_>,
    on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
) -> Result<Generation> {
    let Guide { drafter, constraint, max_forced, logprobs } = guide;
    let masker = Masker::new(constraint);
    let sampler = Sampler::new(request.sampling.clone())?;
    let plan = check_request(info, session, request)?;
    let n_ctx = session.config().n_ctx;
    let held = session.len();

    let max_tokens = request.stop.max_tokens;
    let room = max_tokens.min(n_ctx - held - request.prompt.len() + 1);
    let out = Output::new(tokenizer, request, session.tokens(), room);
    // Everything the session holds, then the pending token: what drafters continue.
    let mut context = Vec::new();
    if drafter.is_some() {
        context.reserve(held + request.prompt.len() + room + MAX_DRAFT);
        context.extend_from_slice(session.tokens());
        context.extend_from_slice(&request.prompt);
    }
    let mut steps = Steps {
        info,
        session,
        plan,
        n_ctx,
        sampler,
        masker,
        drafter,
        max_forced,
        logprobs,
        out,
        context,
        stats: SpecStats::default(),
        draft: Draft::new(),
        batch: Batch::new(),
        parents: Path::new(),
        path: Path::new(),
        p: Distribution::new(),
        residual: Distribution::new(),
        pending_lp: None,
        draft_lp: Vec::new(),
    };

    let start = Instant::now();
    let passes_before = steps.session.pass_stats();
    let next = steps.prefill(&request.prompt)?;
    let first_at = Instant::now();
    let prefill_seconds = first_at.duration_since(start).as_secs_f64();
    // When the last token of `tokens` was sampled (an end token is not one of them).
    let (stop, last_at) = if max_tokens == 0 {
        (StopReason::MaxTokens, first_at)
    } else {
        steps.run(next, first_at, on_event)?
    };
    steps.stats.constraint_seconds = steps.masker.seconds();

    let Steps { session, mut out, stats, .. } = steps;
    let stop_string = out.finish(on_event);
    Ok(Generation {
        tokens: out.tokens,
        text: out.text,
        stop,
        stop_string,
        prompt_tokens: request.prompt.len(),
        cached_tokens: 0,
        prefill_seconds,
        decode_seconds: last_at.duration_since(first_at).as_secs_f64(),
        spec: stats,
        passes: session.pass_stats().since(passes_before),
        logprobs: out.logprobs,
    })
}

/// The checks made before anything is decoded; the plan of all the model's layers.
fn check_request(info: &ModelInfo, session: &dyn Session, request: &GenerateRequest) -> Result<LayerPlan> {
    request.stop.validate()?;
    if request.prompt.is_empty() {
        return Err(Error::invalid("the prompt is empty; it needs at least one token"));
    }
    let plan = LayerPlan::full(info.n_layers)?;
    let n_ctx = session.config().n_ctx;
    let held = session.len();
    let needed = held + request.prompt.len() + 1;
    if needed > n_ctx {
        return Err(Error::ContextOverflow { needed, limit: n_ctx, prompt: request.prompt.len() });
    }
    Ok(plan)
}

/// What the propose → decode → accept loop carries from one step to the next.
struct Steps<'a, 'd, 'c> {
    info: &'a ModelInfo,
    session: &'a mut dyn Session,
    plan: LayerPlan,
    n_ctx: usize,
    sampler: Sampler,
    masker: Masker<'c>,
    drafter: Option<&'d mut dyn Drafter>,
    max_forced: usize,
    logprobs: Option<usize>,
    out: Output<'a>,
    /// Everything the session holds, then the pending token: what drafters continue (empty
    /// without a drafter).
    context: Vec<Token>,
    stats: SpecStats,
    draft: Draft,
    batch: Batch,
    /// Where the draft branched: each token's parent in the verification pass (empty for a
    /// path).
    parents: Path,
    /// The path verification walked through a tree.
    path: Path,
    p: Distribution,
    residual: Distribution,
    /// The log-probabilities of the pending token and of the draft tokens accepted after it.
    pending_lp: Option<TokenLogprob>,
    draft_lp: Vec<TokenLogprob>,
}

impl Steps<'_, '_, '_> {
    /// Decode the prompt and sample the first token (the pending one), which the session does
    /// not hold yet; the drafter sees what the session holds.
    fn prefill(&mut self, prompt: &[Token]) -> Result<Token> {
        let logits = self.session.decode(prompt, &self.plan, Rows::Last)?;
        let next = self.sampler.sample(self.masker.row(last_row(&logits, self.info)?)?, &self.out.history);
        if let Some(n) = self.logprobs {
            self.pending_lp = Some(token_logprob(logits.last(), next, n));
        }
        if !self.out.tokenizer.is_end(next) {
            self.masker.advance(next)?;
        }
        // A tree of drafts is verified by the greedy pick alone: without a constraint, whose
        // checks and masks follow one path, and without log-probabilities to report.
        let trees = self.session.decodes_trees()
            && self.sampler.config().is_greedy()
            && !self.masker.is_some()
            && self.logprobs.is_none();
        if let Some(d) = self.drafter.as_deref_mut() {
            d.allow_trees(trees);
            d.prefill(self.session.tokens())?;
        }
        Ok(next)
    }

    /// Step from the pending token `next`, sampled at `first_at`, until generation stops: why
    /// it stopped, and when the last token of `tokens` was sampled.
    fn run(
        &mut self,
        mut next: Token,
        first_at: Instant,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<(StopReason, Instant)> {
        let mut sampled_at = first_at;
        // When the last token of `tokens` was sampled (an end token is not one of them).
        let mut last_at = first_at;
        let stop = loop {
            // `next` is sampled but not yet in the session.
            if !self.out.tokenizer.is_end(next) {
                last_at = sampled_at;
            }
            if let Some(lp) = self.pending_lp.take().filter(|_| !self.out.tokenizer.is_end(next)) {
                self.out.logprobs.push(lp);
            }
            if let Some(reason) = self.out.emit(next, on_event) {
                break reason;
            }
            let base = self.session.len();
            if base >= self.n_ctx {
                break StopReason::ContextFull;
            }
            let is_forced = self.propose(next, base)?;
            let verdict;
            (verdict, sampled_at) = self.verify(next)?;
            self.count(is_forced, verdict.accepted);
            if self.drafter.is_some() {
                self.context.push(next);
            }
            let accepted = self.emit_accepted(base, verdict.accepted, sampled_at, &mut last_at, on_event)?;
            if let Some(reason) = accepted {
                break reason;
            }
            // Drop the rejected rest: the session holds `next` and the accepted tokens.
            self.session.truncate(base + 1 + verdict.accepted)?;
            next = verdict.next;
            if !self.out.tokenizer.is_end(next) {
                self.masker.advance(next)?;
            }
        };
        Ok((stop, last_at))
    }

    /// Propose tokens to follow `next` into `draft`: up to what the context and the token limit
    /// leave room for after it; what the constraint forces if it forces anything, else the
    /// drafter's tokens up to the first one the constraint forbids. Whether they are forced.
    fn propose(&mut self, next: Token, base: usize) -> Result<bool> {
        self.draft.clear();
        let max = MAX_DRAFT.min(self.n_ctx - base - 1).min(self.out.max_tokens - self.out.tokens.len() - 1);
        // On a device whose kernels round a wider pass otherwise, the pass of `next` and its
        // draft keeps to the widths that give single steps' bits.
        let max = match &self.info.exact_passes {
            Some(exact) => max.min(exact.at(base).saturating_sub(1)),
            None => max,
        };
        self.masker.forced(max.min(self.max_forced), &mut self.draft)?;
        let is_forced = !self.draft.is_empty();
        if let Some(d) = self.drafter.as_deref_mut().filter(|_| max > 0 && !is_forced) {
            let t0 = Instant::now();
            self.context.push(next);
            let drafted = d.draft(self.session, &self.context, max, &mut self.draft);
            self.context.pop();
            drafted?;
            self.draft.truncate(max);
            self.parents.clear();
            if let Some(tree) = d.tree() {
                // Cut like the draft: a tree's tokens come after their parents.
                self.parents.push(0).ok();
                self.parents.extend(tree.iter().copied().take(self.draft.len()));
            }
            if self.session.len() != base {
                self.session.truncate(base)?;
            }
            self.stats.draft_seconds += t0.elapsed().as_secs_f64();
            let allowed = self.masker.allowed_prefix(&self.draft)?;
            self.draft.truncate(allowed);
        }
        Ok(is_forced)
    }

    /// Decode `next` and the draft in one full-plan pass, then accept the longest prefix of the
    /// draft the target agrees with and sample its own token: the verdict, and when it was
    /// sampled.
    fn verify(&mut self, next: Token) -> Result<(Verdict, Instant)> {
        self.batch.clear();
        self.batch.push(next).ok();
        self.batch.extend_from_slice(&self.draft).ok();
        let t0 = Instant::now();
        if self.parents.len() == self.batch.len() && self.batch.len() > 1 {
            return self.verify_tree(t0);
        }
        let rows = if self.batch.len() == 1 { Rows::Last } else { Rows::Tail(self.batch.len()) };
        let logits = self.session.decode(&self.batch, &self.plan, rows)?;
        check_rows(&logits, self.batch.len(), self.info)?;
        let (sampler, draft, h, masker) =
            (&mut self.sampler, &self.draft, &mut self.out.history, &mut self.masker);
        let verdict = if sampler.config().is_greedy() {
            verify_greedy(sampler, &logits, draft, h, masker)?
        } else {
            verify_sampled(sampler, &logits, draft, &[], h, masker, &mut self.p, &mut self.residual)?
        };
        let sampled_at = Instant::now();
        self.stats.verify_seconds += sampled_at.duration_since(t0).as_secs_f64();
        self.stats.passes += 1;
        if let Some(n) = self.logprobs {
            self.draft_lp.clear();
            self.draft_lp.extend(
                self.draft[..verdict.accepted]
                    .iter()
                    .enumerate()
                    .map(|(j, &t)| token_logprob(logits.row(j), t, n)),
            );
            self.pending_lp = Some(token_logprob(logits.row(verdict.accepted), verdict.next, n));
        }
        Ok((verdict, sampled_at))
    }

    /// [`Steps::verify`] of a draft that branched: the tree in one pass, the path the greedy
    /// picks walk through it kept in the session, and the draft rewritten as the tokens on
    /// that path (then the first rejected one, where the tree went on), as a path's
    /// verification would leave it.
    fn verify_tree(&mut self, t0: Instant) -> Result<(Verdict, Instant)> {
        let base = self.session.len();
        let logits = self.session.decode_tree(&self.batch, &self.parents, &self.plan)?;
        check_rows(&logits, self.batch.len(), self.info)?;
        let (sampler, h, masker) = (&mut self.sampler, &mut self.out.history, &mut self.masker);
        let verdict =
            verify_tree_greedy(sampler, &logits, &self.batch, &self.parents, h, masker, &mut self.path)?;
        self.session.keep_path(base, &self.path)?;
        let sampled_at = Instant::now();
        self.stats.verify_seconds += sampled_at.duration_since(t0).as_secs_f64();
        self.stats.passes += 1;
        self.stats.trees += 1;
        self.stats.tree_tokens += self.draft.len();
        let stop = usize::from(*self.path.last().unwrap_or(&0));
        let rejected = (stop + 1..self.batch.len()).find(|&c| usize::from(self.parents[c]) == stop);
        self.draft.clear();
        let walked = self.path[1..].iter().map(|&i| usize::from(i)).chain(rejected);
        self.draft.extend(walked.map(|i| self.batch[i]));
        Ok((verdict, sampled_at))
    }

    /// Count the step's draft in the stats, as forced or drafted; the drafter hears how much of
    /// its draft was accepted.
    fn count(&mut self, is_forced: bool, accepted: usize) {
        if is_forced {
            self.stats.forced += self.draft.len();
            self.stats.forced_accepted += accepted;
        } else if !self.draft.is_empty() {
            self.stats.drafts += 1;
            self.stats.drafted += self.draft.len();
            self.stats.accepted += accepted;
            if let Some(d) = self.drafter.as_deref_mut() {
                d.feedback(&self.draft, accepted);
            }
        }
    }

    /// Emit the first `accepted` draft tokens, each at `base + 1 + j` in the session; why
    /// generation must stop, if it must, with the session cut back as plain decoding would
    /// leave it.
    fn emit_accepted(
        &mut self,
        base: usize,
        accepted: usize,
        sampled_at: Instant,
        last_at: &mut Instant,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Result<Option<StopReason>> {
        for (j, &token) in self.draft[..accepted].iter().enumerate() {
            if !self.out.tokenizer.is_end(token) {
                *last_at = sampled_at;
            }
            if let Some(lp) = self.draft_lp.get(j).filter(|_| !self.out.tokenizer.is_end(token)) {
                self.out.logprobs.push(lp.clone());
            }
            if let Some(reason) = self.out.emit(token, on_event) {
                // As plain decoding would leave it: everything before the last token.
                self.session.truncate(base + 1 + j)?;
                return Ok(Some(reason));
            }
            if self.drafter.is_some() {
                self.context.push(token);
            }
        }
        Ok(None)
    }
}

/// The generated side of the loop: tokens, text and the stop checks that depend on them.
struct Output<'t> {
    tokenizer: &'t dyn Tokenizer,
    stream: TextStream,
    /// Prompt and generated tokens, for the repetition penalty.
    history: Vec<Token>,
    tokens: Vec<Token>,
    text: String,
    max_tokens: usize,
    logprobs: Vec<TokenLogprob>,
}

impl<'t> Output<'t> {
    /// Nothing generated yet; the history starts with what the session holds (`held`) and
    /// the prompt, with room for `room` generated tokens.
    fn new(tokenizer: &'t dyn Tokenizer, request: &GenerateRequest, held: &[Token], room: usize) -> Self {
        let mut out = Output {
            tokenizer,
            stream: TextStream::new(&request.stop.stop),
            history: Vec::with_capacity(held.len() + request.prompt.len() + room + MAX_DRAFT),
            tokens: Vec::with_capacity(room),
            text: String::new(),
            max_tokens: request.stop.max_tokens,
            logprobs: Vec::new(),
        };
        out.history.extend_from_slice(held);
        out.history.extend_from_slice(&request.prompt);
        out
    }

    /// Release the text held back to the end, in a last event; the stop string that ended
    /// generation, if one did.
    fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>) -> Option<String> {
        let stop_string = self.stream.stopped().map(str::to_owned);
        let tail = self.stream.finish();
        if !tail.text.is_empty() {
            self.text.push_str(tail.text);
            // Generation is over: a Break here has nothing left to cancel.
            let _ = on_event(Event { token: None, text: tail.text, logprob: None });
        }
        stop_string
    }

    /// Take `token` as generated and report it; why generation must stop, if it must.
    fn emit(
        &mut self,
        token: Token,
        on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
    ) -> Option<StopReason> {
        if self.tokenizer.is_end(token) {
            return Some(StopReason::Eos);
        }
        let piece = if self.tokens.is_empty() {
            self.tokenizer.first_piece(token)
        } else {
            self.tokenizer.piece(token)
        };
        self.tokens.push(token);
        self.history.push(token);
        let chunk = self.stream.push(&piece);
        self.text.push_str(chunk.text);
        // The token's log-probability was pushed when it was sampled, one per token.
        let logprob = self.logprobs.get(self.tokens.len() - 1);
        let flow = on_event(Event { token: Some(token), text: chunk.text, logprob });
        if chunk.stop.is_some() {
            Some(StopReason::StopString)
        } else if flow.is_break() {
            Some(StopReason::Cancelled)
        } else if self.tokens.len() >= self.max_tokens {
            Some(StopReason::MaxTokens)
        } else {
            None
        }
    }
}

/// Checks that `logits` has `rows` rows of the model's vocabulary: an engine bug becomes an
/// error.
fn check_rows(logits: &Logits<'_>, rows: usize, info: &ModelInfo) -> Result<()> {
    if logits.rows() != rows || logits.row(0).len() != info.n_vocab {
        return Err(Error::engine(format!(
            "decode returned {} rows of logits where {rows} rows of a vocabulary of {} were asked for",
            logits.rows(),
            info.n_vocab
        )));
    }
    Ok(())
}

/// The last row of `logits`, checked against the model: an engine bug becomes an error.
fn last_row<'a>(logits: &Logits<'a>, info: &ModelInfo) -> Result<&'a [f32]> {
    check_rows(logits, 1, info)?;
    Ok(logits.last())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Draft;
    use crate::testing::{FakeSession, FakeTokenizer, V};

    fn info() -> ModelInfo {
        crate::Model::info(&crate::testing::FakeModel::default()).clone()
    }

    fn request(prompt: &[Token], max_tokens: usize, stop: &[&str]) -> GenerateRequest {
        GenerateRequest {
            prompt: prompt.to_vec(),
            sampling: SamplingConfig::default(),
            stop: StopConfig { max_tokens, stop: stop.iter().map(|s| s.to_string()).collect() },
        }
    }

    /// Run `generate`, collecting the events.
    fn run(
        session: &mut FakeSession,
        tokenizer: &FakeTokenizer,
        request: &GenerateRequest,
    ) -> (Result<Generation>, Vec<(Option<Token>, String)>) {
        let mut events = Vec::new();
        let result = generate(&info(), session, tokenizer, request, &mut |e| {
            events.push((e.token, e.text.to_string()));
            ControlFlow::Continue(())
        });
        (result, events)
    }

    #[test]
    fn stops_after_max_tokens() {
        let mut s = FakeSession::new(64);
        let (g, events) = run(&mut s, &FakeTokenizer::default(), &request(&[0], 4, &[]));
        let g = g.unwrap();
        assert_eq!(g.tokens, vec![1, 2, 3, 4]);
        assert_eq!(g.text, "bcde");
        assert_eq!(g.stop, StopReason::MaxTokens);
        assert_eq!(g.prompt_tokens, 1);
        let tokens: Vec<_> = events.iter().map(|e| e.0).collect();
        assert_eq!(tokens, vec![Some(1), Some(2), Some(3), Some(4)]);
        // The last token is sampled, not decoded.
        assert_eq!(s.tokens, vec![0, 1, 2, 3]);
    }

    #[test]
    fn decodes_the_prompt_once_then_one_token_at_a_time() {
        let mut s = FakeSession::new(64);
        run(&mut s, &FakeTokenizer::default(), &request(&[3, 0, 1], 3, &[])).0.unwrap();
        assert_eq!(
            s.calls,
            vec![
                (0, vec![3, 0, 1], Rows::Last, true),
                (3, vec![2], Rows::Last, true),
                (4, vec![3], Rows::Last, true),
            ]
        );
    }

    #[test]
    fn zero_max_tokens_only_appends_the_prompt() {
        let mut s = FakeSession::new(64);
        let (g, events) = run(&mut s, &FakeTokenizer::default(), &request(&[0, 1], 0, &[]));
        let g = g.unwrap();
        assert_eq!((g.tokens.len(), g.stop), (0, StopReason::MaxTokens));
        assert!(events.is_empty());
        assert_eq!(s.tokens, vec![0, 1]);
    }

    #[test]
    fn stops_at_the_end_token() {
        let mut s = FakeSession::new(64);
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[4], 100, &[]));
        let g = g.unwrap();
        // 4 → 5, 6, then 7 is the end token.
        assert_eq!((g.tokens, g.text.as_str(), g.stop), (vec![5, 6], "fg", StopReason::Eos));
        assert_eq!(s.tokens, vec![4, 5, 6]);
    }

    #[test]
    fn stops_at_a_stop_string_and_leaves_it_out() {
        let mut s = FakeSession::new(64);
        let (g, events) = run(&mut s, &FakeTokenizer::default(), &request(&[0], 100, &["de"]));
        let g = g.unwrap();
        assert_eq!(g.tokens, vec![1, 2, 3, 4]);
        assert_eq!(g.text, "bc");
        assert_eq!(g.stop, StopReason::StopString);
        assert_eq!(g.stop_string.as_deref(), Some("de"));
        let texts: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
        assert_eq!(texts, vec!["b", "c", "", ""]);
    }

    #[test]
    fn held_back_text_is_released_at_the_end() {
        let mut s = FakeSession::new(64);
        let (g, events) = run(&mut s, &FakeTokenizer::default(), &request(&[0], 3, &["dx"]));
        let g = g.unwrap();
        assert_eq!((g.text.as_str(), g.stop), ("bcd", StopReason::MaxTokens));
        assert_eq!(events.last(), Some(&(None, "d".to_string())));
    }

    #[test]
    fn characters_split_across_tokens() {
        let mut t = FakeTokenizer::default();
        let e = "é".as_bytes();
        t.pieces[1] = e[..1].to_vec();
        t.pieces[2] = e[1..].to_vec();
        let mut s = FakeSession::new(64);
        let (g, events) = run(&mut s, &t, &request(&[0], 3, &[]));
        assert_eq!(g.unwrap().text, "éd");
        let texts: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
        assert_eq!(texts, vec!["", "é", "d"]);
    }

    #[test]
    fn break_cancels() {
        let mut s = FakeSession::new(64);
        let mut seen = 0;
        let g = generate(&info(), &mut s, &FakeTokenizer::default(), &request(&[0], 100, &[]), &mut |_| {
            seen += 1;
            if seen == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap();
        assert_eq!((g.tokens, g.stop), (vec![1, 2], StopReason::Cancelled));
    }

    #[test]
    fn a_prompt_that_does_not_fit_is_an_error_before_any_decode() {
        let mut s = FakeSession::new(4);
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[0, 1, 2, 3], 10, &[]));
        assert_eq!(g, Err(Error::ContextOverflow { needed: 5, limit: 4, prompt: 4 }));
        assert!(s.calls.is_empty());

        let mut s = FakeSession::new(4);
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[], 10, &[]));
        assert!(matches!(g, Err(Error::InvalidArgument { .. })));

        let mut bad = request(&[0], 10, &[""]);
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &bad);
        assert!(matches!(g, Err(Error::InvalidArgument { .. })));
        bad.stop.stop.clear();
        bad.sampling.top_p = 0.0;
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &bad);
        assert!(matches!(g, Err(Error::InvalidArgument { .. })));
        assert!(s.calls.is_empty());
    }

    #[test]
    fn stops_when_the_context_is_full() {
        let mut s = FakeSession::new(6);
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[0, 0], 100, &[]));
        let g = g.unwrap();
        // The prompt takes 2 of 6: tokens 1..=4 are decoded, token 5 is sampled last.
        assert_eq!((g.tokens, g.stop), (vec![1, 2, 3, 4, 5], StopReason::ContextFull));
        assert_eq!(s.len(), 6);
    }

    #[test]
    fn a_continuing_chat_appends_the_prompt() {
        let mut s = FakeSession::new(8);
        s.tokens = vec![0, 1, 2, 3, 4];
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[5, 6, 0], 10, &[]));
        assert_eq!(g, Err(Error::ContextOverflow { needed: 9, limit: 8, prompt: 3 }));

        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[5, 0], 10, &[]));
        let g = g.unwrap();
        assert_eq!(g.tokens, vec![1, 2]);
        assert_eq!(g.stop, StopReason::ContextFull);
        assert_eq!(s.tokens, vec![0, 1, 2, 3, 4, 5, 0, 1]);
    }

    #[test]
    fn the_repetition_penalty_sees_the_prompt() {
        // After the prompt's last token 0 the argmax is 1 (logit 1.0 + bias 1.0 = 2.0), and
        // token 3 has 1.5. Token 1 is in the prompt: 2.0 / 2 = 1.0 < 1.5, so 3 comes first.
        let mut s = FakeSession::new(64);
        s.bias = vec![(1, 1.0), (3, 1.5)];
        let mut r = request(&[1, 0], 1, &[]);
        r.sampling.repetition_penalty = 2.0;
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &r);
        assert_eq!(g.unwrap().tokens, vec![3]);
        // Without the penalty, the argmax.
        let mut s = FakeSession::new(64);
        s.bias = vec![(1, 1.0), (3, 1.5)];
        let (g, _) = run(&mut s, &FakeTokenizer::default(), &request(&[1, 0], 1, &[]));
        assert_eq!(g.unwrap().tokens, vec![1]);
    }

    /// Drafts `right` correct continuations of the fake model, then `wrong` wrong ones.
    struct PatternDrafter {
        right: usize,
        wrong: usize,
        verdicts: Vec<(usize, usize)>,
        /// What `prefill` was called with, each time.
        prefills: Vec<Vec<Token>>,
    }

    impl Drafter for PatternDrafter {
        fn name(&self) -> &str {
            "pattern"
        }

        fn draft(
            &mut self,
            target: &mut dyn Session,
            context: &[Token],
            max: usize,
            out: &mut Draft,
        ) -> Result<()> {
            assert_eq!(target.len() + 1, context.len(), "the target holds all but the pending token");
            assert_eq!(target.tokens(), &context[..context.len() - 1]);
            out.clear();
            let mut t = *context.last().unwrap();
            for i in 0..(self.right + self.wrong).min(max) {
                t = if i < self.right { (t + 1) % V as Token } else { (t + 3) % V as Token };
                out.push(t).unwrap();
            }
            Ok(())
        }

        fn feedback(&mut self, drafted: &[Token], accepted: usize) {
            self.verdicts.push((drafted.len(), accepted));
        }

        fn prefill(&mut self, context: &[Token]) -> Result<()> {
            assert!(self.verdicts.is_empty(), "prefill comes before any draft");
            self.prefills.push(context.to_vec());
            Ok(())
        }
    }

    /// Plain and speculative generation of the same request on fresh sessions.
    fn plain_and_spec(
        prompt: &[Token],
        max_tokens: usize,
        stop: &[&str],
        n_ctx: usize,
        drafter: &mut PatternDrafter,
    ) -> ((Generation, Vec<Token>), (Generation, Vec<Token>)) {
        let t = FakeTokenizer::default();
        let r = request(prompt, max_tokens, stop);
        let mut plain = FakeSession::new(n_ctx);
        let g = generate(&info(), &mut plain, &t, &r, &mut |_| ControlFlow::Continue(())).unwrap();
        let mut spec = FakeSession::new(n_ctx);
        let s = generate_speculative(&info(), &mut spec, &t, &r, Some(drafter), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
        ((g, plain.tokens), (s, spec.tokens))
    }

    #[test]
    fn speculation_gives_plain_output_and_leaves_the_session_as_plain_does() {
        // Prompt 0 → 1 2 3 4 5 6 then the end token 7; with max_tokens, stop strings and a
        // short context each ending generation inside a draft.
        let cases: &[(&[Token], usize, &[&str], usize)] = &[
            (&[0], 100, &[], 64),
            (&[0], 3, &[], 64),
            (&[0], 4, &[], 64),
            (&[0], 100, &["de"], 64),
            (&[0, 0], 100, &[], 5),
            (&[5, 0], 2, &[], 64),
        ];
        for &(prompt, max_tokens, stop, n_ctx) in cases {
            for (right, wrong) in [(0, 1), (1, 0), (2, 1), (3, 0), (5, 2), (16, 0)] {
                let mut d = PatternDrafter { right, wrong, verdicts: Vec::new(), prefills: Vec::new() };
                let ((g, plain), (s, spec)) = plain_and_spec(prompt, max_tokens, stop, n_ctx, &mut d);
                let what =
                    format!("{prompt:?} max {max_tokens} stop {stop:?} ctx {n_ctx} draft {right}+{wrong}");
                assert_eq!((&s.tokens, &s.text, s.stop), (&g.tokens, &g.text, g.stop), "{what}");
                assert_eq!(spec, plain, "session after {what}");
                let accepted: usize = d.verdicts.iter().map(|v| v.1).sum();
                assert_eq!(s.spec.accepted, accepted, "{what}");
                assert!(d.verdicts.iter().all(|&(n, a)| a <= n && a <= right), "{what}: {:?}", d.verdicts);
                assert_eq!(d.prefills, [prompt.to_vec()], "{what}: one prefill, with the prompt");
            }
        }
    }

    /// Drafts a tree whose first branch is wrong and whose second goes right for three tokens,
    /// then branches again (wrong, right); a path of the right ones where trees are not allowed.
    #[derive(Default)]
    struct TreeDrafter {
        allowed: Option<bool>,
        verdicts: Vec<(Vec<Token>, usize)>,
    }

    impl Drafter for TreeDrafter {
        fn name(&self) -> &str {
            "tree"
        }

        fn draft(
            &mut self,
            _: &mut dyn Session,
            context: &[Token],
            max: usize,
            out: &mut Draft,
        ) -> Result<()> {
            let t = *context.last().unwrap();
            let next = |k: Token| (t + k) % V as Token;
            out.clear();
            if self.allowed == Some(true) {
                out.extend([next(3), next(1), next(2), next(5), next(3)]);
            } else {
                out.extend([next(1), next(2), next(3)]);
            }
            out.truncate(max);
            Ok(())
        }

        fn feedback(&mut self, drafted: &[Token], accepted: usize) {
            self.verdicts.push((drafted.to_vec(), accepted));
        }

        fn allow_trees(&mut self, allowed: bool) {
            self.allowed = Some(allowed);
        }

        fn tree(&self) -> Option<&[u8]> {
            (self.allowed == Some(true)).then_some(&[0, 0, 2, 2, 3][..])
        }
    }

    #[test]
    fn trees_of_drafts_give_plain_output_where_the_session_decodes_them() {
        let t = FakeTokenizer::default();
        for (trees, max_tokens) in [(true, 100), (false, 100), (true, 3), (true, 4)] {
            let r = request(&[0], max_tokens, &[]);
            let mut plain = FakeSession::new(64);
            let g = generate(&info(), &mut plain, &t, &r, &mut |_| ControlFlow::Continue(())).unwrap();
            let mut spec = if trees { FakeSession::with_trees(64) } else { FakeSession::new(64) };
            let mut d = TreeDrafter::default();
            let s = generate_speculative(&info(), &mut spec, &t, &r, Some(&mut d), &mut |_| {
                ControlFlow::Continue(())
            })
            .unwrap();
            let what = format!("trees {trees}, max {max_tokens}");
            assert_eq!((&s.tokens, s.stop), (&g.tokens, g.stop), "{what}");
            assert_eq!(spec.tokens, plain.tokens, "{what}: the session after");
            assert_eq!(d.allowed, Some(trees), "{what}");
            assert_eq!(s.spec.trees > 0, trees, "{what}: {:?}", s.spec);
            assert_eq!(spec.tree_calls.is_empty(), !trees, "{what}");
        }
        // Prompt 0, first token 1: the tree after 1 holds 2 (on the second branch), 3, 4; the
        // walk stops at a leaf, so nothing is counted rejected, and the pass yields 5.
        let mut spec = FakeSession::with_trees(64);
        let mut d = TreeDrafter::default();
        let r = request(&[0], 100, &[]);
        generate_speculative(&info(), &mut spec, &t, &r, Some(&mut d), &mut |_| ControlFlow::Continue(()))
            .unwrap();
        assert_eq!(spec.tree_calls[0], (vec![1, 4, 2, 3, 6, 4], vec![0, 0, 0, 2, 2, 3]));
        assert_eq!(d.verdicts[0], (vec![2, 3, 4], 3));
    }

    #[test]
    fn accepted_drafts_save_passes() {
        let mut d = PatternDrafter { right: 3, wrong: 0, verdicts: Vec::new(), prefills: Vec::new() };
        let ((g, _), (s, _)) = plain_and_spec(&[0], 100, &[], 64, &mut d);
        assert_eq!(g.tokens.len(), 6);
        // 1 is sampled after the prompt; one pass verifies 2 3 4 and yields 5; the next
        // verifies 6 7 0, where 7 is the end token: two passes instead of six.
        assert_eq!(s.spec.passes, 2);
        assert_eq!((s.spec.drafted, s.spec.accepted, s.spec.drafts), (6, 6, 2));
    }

    #[test]
    fn drafts_keep_to_the_passes_the_device_gives_exactly() {
        let t = FakeTokenizer::default();
        let r = request(&[0], 100, &[]);
        let run = |exact: Option<crate::ExactPasses>| {
            let info = ModelInfo { exact_passes: exact, ..info() };
            let mut d = PatternDrafter { right: 16, wrong: 0, verdicts: Vec::new(), prefills: Vec::new() };
            let mut session = FakeSession::new(64);
            let g = generate_speculative(&info, &mut session, &t, &r, Some(&mut d), &mut |_| {
                ControlFlow::Continue(())
            })
            .unwrap();
            (g, d.verdicts)
        };
        let (plain, _) = run(None);
        // Passes of up to 3 tokens: the next token and two drafted.
        let three = crate::ExactPasses { max_tokens: 3, block: None, why: String::new() };
        let (g, verdicts) = run(Some(three));
        assert_eq!(g.tokens, plain.tokens);
        assert!(verdicts.iter().all(|&(n, _)| n <= 2), "{verdicts:?}");
        assert!(!verdicts.is_empty());
        // Blocks of 4 positions: the first pass starts at position 1 (after the prompt) and
        // may hold 3 tokens; after it, at 4, four.
        let blocks = crate::ExactPasses { max_tokens: 16, block: Some(4), why: String::new() };
        assert_eq!((blocks.at(1), blocks.at(4), blocks.at(7)), (3, 4, 1));
        let (g, verdicts) = run(Some(blocks));
        assert_eq!(g.tokens, plain.tokens);
        assert_eq!(verdicts[..2], [(2, 2), (3, 3)], "{verdicts:?}");
        // Only single steps: nothing is drafted.
        let none = crate::ExactPasses { max_tokens: 1, block: None, why: String::new() };
        let (g, verdicts) = run(Some(none));
        assert_eq!((g.tokens, g.spec.drafted), (plain.tokens, 0));
        assert!(verdicts.is_empty(), "{verdicts:?}");
    }

    /// A grammar that allows `steps[i]` at the i-th generated token, then only the end token.
    struct Script {
        steps: Vec<Vec<Token>>,
        at: usize,
    }

    impl Script {
        fn new(steps: &[&[Token]]) -> Self {
            Script { steps: steps.iter().map(|s| s.to_vec()).collect(), at: 0 }
        }

        fn allowed(&self, i: usize) -> &[Token] {
            self.steps.get(i).map_or(&[7], |s| s)
        }
    }

    impl Constraint for Script {
        fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
            for (t, l) in logits.iter_mut().enumerate() {
                if !self.allowed(self.at).contains(&(t as Token)) {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }

        fn advance(&mut self, token: Token) -> Result<()> {
            assert!(self.allowed(self.at).contains(&token), "advanced with a forbidden token {token}");
            self.at += 1;
            Ok(())
        }

        fn allowed_prefix(&mut self, tokens: &[Token]) -> Result<usize> {
            Ok(tokens.iter().enumerate().take_while(|&(i, t)| self.allowed(self.at + i).contains(t)).count())
        }

        fn forced(&mut self, max: usize, out: &mut Draft) -> Result<()> {
            let steps = &self.steps[self.at.min(self.steps.len())..];
            for s in steps.iter().take_while(|s| s.len() == 1).take(max) {
                out.push(s[0]).ok();
            }
            Ok(())
        }
    }

    fn guided(
        session: &mut FakeSession,
        steps: &[&[Token]],
        drafter: Option<&mut dyn Drafter>,
        max_forced: usize,
    ) -> Generation {
        let mut script = Script::new(steps);
        let guide = Guide { drafter, constraint: Some(&mut script), max_forced, logprobs: Some(2) };
        let r = request(&[0], 100, &[]);
        generate_guided(&info(), session, &FakeTokenizer::default(), &r, guide, &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap()
    }

    const SCRIPT: &[&[Token]] = &[&[1, 2], &[3], &[4], &[2, 6], &[5], &[6], &[0, 1]];

    #[test]
    fn a_constraint_masks_every_step() {
        // The model's pick after t is t + 1; where the script forbids it, the lowest allowed id
        // (all others tie at 0). After the script only the end token is allowed.
        let mut s = FakeSession::new(64);
        let g = guided(&mut s, SCRIPT, None, 0);
        assert_eq!((g.tokens, g.stop), (vec![1, 3, 4, 2, 5, 6, 0], StopReason::Eos));
        assert_eq!(g.spec.passes, 7);
    }

    #[test]
    fn forced_tokens_are_free_drafts_and_change_nothing() {
        let mut plain = FakeSession::new(64);
        let want = guided(&mut plain, SCRIPT, None, 0);
        let mut spec = FakeSession::new(64);
        let got = guided(&mut spec, SCRIPT, None, 8);
        assert_eq!((&got.tokens, got.stop), (&want.tokens, want.stop));
        assert_eq!(spec.tokens, plain.tokens);
        // Log-probabilities come from the same rows, whichever pass computed them.
        assert_eq!(got.logprobs, want.logprobs);
        assert_eq!(got.logprobs.iter().map(|l| l.token).collect::<Vec<_>>(), got.tokens);
        assert_eq!(got.logprobs[0].top.len(), 2);
        // 1 is sampled; 3 4 are forced and drafted after it; 2 (a choice) comes from that pass.
        assert_eq!((got.spec.forced, got.spec.forced_accepted), (4, 4));
        assert_eq!((got.spec.drafted, got.spec.drafts), (0, 0));
        assert!(got.spec.passes < want.spec.passes, "{} vs {}", got.spec.passes, want.spec.passes);
    }

    #[test]
    fn drafted_tokens_the_constraint_forbids_are_cut_before_verification() {
        let mut plain = FakeSession::new(64);
        let want = guided(&mut plain, SCRIPT, None, 0);
        for (right, wrong) in [(0, 2), (2, 1), (4, 0), (16, 0)] {
            let mut d = PatternDrafter { right, wrong, verdicts: Vec::new(), prefills: Vec::new() };
            let mut spec = FakeSession::new(64);
            let got = guided(&mut spec, SCRIPT, Some(&mut d), 0);
            assert_eq!((&got.tokens, got.stop), (&want.tokens, want.stop), "draft {right}+{wrong}");
            assert_eq!(spec.tokens, plain.tokens, "draft {right}+{wrong}");
            // Every verified draft held only allowed tokens: the drafter saw them all accepted
            // up to where the model's pick differs from its own, never a forbidden one.
            for call in spec.calls.iter().skip(1) {
                let at = call.0 - 1; // the pending token's index among the generated ones
                for (i, t) in call.1.iter().enumerate().skip(1) {
                    assert!(
                        Script::new(SCRIPT).allowed(at + i).contains(t),
                        "draft {right}+{wrong}: {call:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn rates_are_zero_without_time() {
        let g = Generation {
            tokens: vec![1, 2, 3],
            text: String::new(),
            stop: StopReason::MaxTokens,
            stop_string: None,
            prompt_tokens: 10,
            cached_tokens: 0,
            prefill_seconds: 0.5,
            decode_seconds: 0.0,
            spec: SpecStats::default(),
            passes: PassStats::default(),
            logprobs: Vec::new(),
        };
        assert_eq!(g.prefill_tok_per_s(), 20.0);
        // Tokens a kept prefix held were not prefilled.
        assert_eq!(Generation { cached_tokens: 6, ..g.clone() }.prefill_tok_per_s(), 8.0);
        assert_eq!(g.decode_tok_per_s(), 0.0);
        assert_eq!(Generation { decode_seconds: 0.5, ..g }.decode_tok_per_s(), 4.0);
    }
}
