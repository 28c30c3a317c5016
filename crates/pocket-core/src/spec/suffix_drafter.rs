//! Suffix-match drafting (prompt lookup; SAM decoding, 2024): find the longest suffix of the
//! sequence that occurred before and draft what followed it.
//!
//! The draft length is chosen per step: the longer the match, the likelier its continuation
//! is right, so acceptance is estimated per match-length bucket from this request's own
//! verdicts and the device's cost model says how many tokens that acceptance pays for. A
//! step whose best draft would not beat plain decoding drafts nothing.
//!
//! Where the output copies earlier text with edits (a renamed variable, added type hints),
//! every edit breaks the match; an [`EditTracker`] keeps the output's place in the text
//! across them and learns the substitutions it makes, and drafts from it when it knows more
//! than the match does. Its drafts have acceptance estimates of their own.
//!
//! For an encoder-decoder model the decoder's context does not hold the source text, so the
//! drafter can be seeded with it ([`SuffixDrafter::with_source`]): the automaton then holds
//! the source followed by the context, and a suffix of the output that occurred in the
//! source drafts what followed it there.
//!
//! Given a [`History`] of earlier answers ([`SuffixDrafter::with_history`]), it also drafts
//! what most often followed the request's latest tokens in them, each token weighed by how
//! often it did (SuffixDecoding's frequency scoring) and by the acceptance such drafts met;
//! the three candidates compete on the speed-up they are expected to give.

use std::sync::Arc;

use super::acceptance::AcceptanceEstimate;
use super::edit_tracker::EditTracker;
use super::history::History;
use super::suffix::{Cursor, SuffixAutomaton};
use super::{Draft, Drafter, MAX_DRAFT};
use crate::cost::CostModel;
use crate::{Result, Session, Token};

/// Upper bounds of the match-length buckets acceptance is tracked in.
const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, usize::MAX];
/// Acceptance assumed per bucket before any verdict: short matches are often chance.
const PRIORS: [f64; 6] = [0.2, 0.35, 0.5, 0.65, 0.75, 0.85];
/// Acceptance assumed per bucket of the edit tracker's run (the tokens it has followed)
/// before any verdict. Higher than a match's: a run starts where the output met text it was
/// already copying, not anywhere a token repeats.
const TRACKED_PRIORS: [f64; 6] = [0.4, 0.5, 0.6, 0.7, 0.8, 0.85];
/// Acceptance assumed per bucket of the match in earlier answers before any verdict, for a
/// continuation that always followed (a branch scales it by its share). A match there
/// includes the prompt's tail at an answer's start, so short ones are weak.
const RECALLED_PRIORS: [f64; 6] = [0.1, 0.25, 0.45, 0.6, 0.75, 0.85];
/// Weight of the prior, in drafted tokens.
const PRIOR_WEIGHT: f64 = 4.0;

fn bucket(match_len: usize) -> usize {
    BUCKETS.iter().position(|&b| match_len <= b).unwrap_or(BUCKETS.len() - 1)
}

/// What drafting from a [`History`] has learned: the acceptance its drafts met, by the length
/// of the match they were drafted from. Kept with the history, so that each request starts
/// where the last one left off.
#[derive(Debug, Clone, Copy)]
pub struct Recall([AcceptanceEstimate; 6]);

impl Default for Recall {
    fn default() -> Self {
        Recall(RECALLED_PRIORS.map(|p| AcceptanceEstimate::prior(p, PRIOR_WEIGHT)))
    }
}

impl Recall {
    /// What it has counted, for writing it out: per match-length bucket, the (decayed)
    /// accepted and rejected drafted tokens.
    pub fn counts(&self) -> [[f64; 2]; 6] {
        self.0.map(|e| e.counts())
    }

    /// The recall that [`Recall::counts`] gave `counts`; the default where they are not
    /// counts (negative or not finite).
    pub fn from_counts(counts: [[f64; 2]; 6]) -> Recall {
        if counts.iter().flatten().all(|c| c.is_finite() && *c >= 0.0) {
            Recall(counts.map(|[a, r]| AcceptanceEstimate::from_counts(a, r)))
        } else {
            Recall::default()
        }
    }
}

/// Where a draft comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// What followed the longest match.
    Match,
    /// What the edit tracker predicts.
    Tracker,
    /// What followed in earlier answers.
    History,
}

/// The suffix drafter.
pub struct SuffixDrafter {
    /// Holds `source` then the context.
    sam: SuffixAutomaton,
    /// A fixed prefix of the automaton (empty for decoder-only models).
    source: Vec<Token>,
    max_draft: usize,
    cost: CostModel,
    acceptance: [AcceptanceEstimate; 6],
    tracker: EditTracker,
    tracked_acceptance: [AcceptanceEstimate; 6],
    /// The tracker's prediction for the step planned last.
    predicted: Draft,
    /// Where the last draft came from and the bucket of its match or run, for its verdict.
    last: (Origin, usize),
    /// Earlier answers, and where the context stands in them.
    history: Option<Arc<History>>,
    cursor: Cursor,
    recalled_acceptance: [AcceptanceEstimate; 6],
    /// The continuation from the history for the step planned last, and each token's share.
    recalled: Draft,
    recalled_share: [f64; MAX_DRAFT],
    /// Drafts taken from the history, and their tokens.
    recalled_drafts: usize,
    recalled_tokens: usize,
    /// Whether drafts from the history may branch ([`Drafter::allow_trees`]).
    trees: bool,
    /// For a tree from the history planned last: each token's parent in the pass.
    recalled_parents: [u8; MAX_DRAFT],
    /// Whether the last draft branched (its parents are `recalled_parents[..its length]`).
    branched: Option<usize>,
}

impl SuffixDrafter {
    /// A drafter of at most `max_draft` tokens, sizing its drafts with `cost`.
    pub fn with_cost(max_draft: usize, cost: CostModel) -> Self {
        SuffixDrafter {
            sam: SuffixAutomaton::new(),
            source: Vec::new(),
            max_draft,
            cost,
            acceptance: PRIORS.map(|p| AcceptanceEstimate::prior(p, PRIOR_WEIGHT)),
            tracker: EditTracker::default(),
            tracked_acceptance: TRACKED_PRIORS.map(|p| AcceptanceEstimate::prior(p, PRIOR_WEIGHT)),
            predicted: Draft::new(),
            last: (Origin::Match, 0),
            history: None,
            cursor: Cursor::default(),
            recalled_acceptance: Recall::default().0,
            recalled: Draft::new(),
            recalled_share: [0.0; MAX_DRAFT],
            recalled_drafts: 0,
            recalled_tokens: 0,
            trees: false,
            recalled_parents: [0; MAX_DRAFT],
            branched: None,
        }
    }

    /// This drafter, also drafting from `history`, earlier answers of the same model (and
    /// app), starting from the acceptance `learned` by earlier requests' drafts from it.
    pub fn with_history(self, history: Arc<History>, learned: &Recall) -> Self {
        SuffixDrafter { history: Some(history), recalled_acceptance: learned.0, ..self }
    }

    /// The acceptance drafts from the history have met, for the next request to start from.
    pub fn learned(&self) -> Recall {
        Recall(self.recalled_acceptance)
    }

    /// Drafts taken from the history, and the tokens they held.
    pub fn recalled(&self) -> (usize, usize) {
        (self.recalled_drafts, self.recalled_tokens)
    }

    /// As [`SuffixDrafter::with_cost`], also matching against `source`, an encoder-decoder
    /// model's input, which the context passed to [`Drafter::draft`] does not contain. A match
    /// in the source drafts no further than the source's end: the context that follows it in
    /// the automaton is not what followed the match.
    pub fn with_source(source: &[Token], max_draft: usize, cost: CostModel) -> Self {
        SuffixDrafter { source: source.to_vec(), ..Self::with_cost(max_draft, cost) }
    }

    /// Bring the automaton up to `source ++ context`: append what is new, or rebuild when
    /// `context` is not a continuation of what it holds after the source (a new request on a
    /// reused drafter); then the edit tracker, which takes a new context's tokens as the
    /// prompt, all but the pending one.
    fn sync(&mut self, context: &[Token]) {
        let src = self.source.len();
        let held = self.sam.tokens().get(src..);
        match held.filter(|h| context.starts_with(h)).map(<[Token]>::len) {
            Some(n) => {
                self.sam.extend(&context[n..]);
                self.walk(&context[n..]);
            }
            None => {
                self.cursor = Cursor::default();
                self.walk(context);
                self.sam.clear();
                self.sam.extend(&self.source);
                self.sam.extend(context);
                self.tracker.reset(src + context.len().saturating_sub(1));
            }
        }
        self.tracker.update(self.sam.tokens(), src, self.sam.longest_match());
    }

    /// Moves the history's cursor on by `tokens`.
    fn walk(&mut self, tokens: &[Token]) {
        if let Some(h) = &self.history {
            for &t in tokens {
                h.walk(&mut self.cursor, t);
            }
        }
    }

    /// For the sequence `context`: how many tokens to draft (at most `max`) and the speed-up
    /// expected from it; `(0, 1.0)` when there is no match or no draft would pay. Of the
    /// match's continuation and the edit tracker's prediction, the one expected to pay more.
    pub fn plan_step(&mut self, context: &[Token], max: usize) -> (usize, f64) {
        self.sync(context);
        let max = max.min(self.max_draft);
        let src = self.source.len();
        let mut best = (0, 1.0);
        if let Some(m) = self.sam.longest_match() {
            let available = if m.end <= src { src } else { self.sam.len() } - m.end;
            let b = bucket(m.len);
            best = self.cost.best_k(self.acceptance[b].alpha(), 0.0, max.min(available));
            self.last = (Origin::Match, b);
        }
        self.predicted.clear();
        if let Some(run) = self.tracker.run() {
            let room = max.min(self.predicted.capacity());
            let n = self.tracker.predict(self.sam.tokens(), src, room, &mut self.predicted);
            let b = bucket(run);
            let (k, gain) = self.cost.best_k(self.tracked_acceptance[b].alpha(), 0.0, n);
            if k > 0 && gain > best.1 {
                best = (k, gain);
                self.last = (Origin::Tracker, b);
            }
        }
        self.recalled.clear();
        if let Some(h) = self.history.as_ref().filter(|_| !self.cursor.is_empty()) {
            let room = max.min(self.recalled.capacity());
            let b = bucket(self.cursor.len());
            let alpha = self.recalled_acceptance[b].alpha();
            let (k, gain) = if self.trees {
                // Scored as a path is: a token's reach is alpha times its share, times its
                // parent's.
                let mut tokens = [0; MAX_DRAFT];
                let reach = &mut self.recalled_share;
                let n = h.tree(self.cursor, alpha, &mut tokens[..room], &mut self.recalled_parents, reach);
                self.recalled.extend_from_slice(&tokens[..n]).ok();
                self.cost.best_tree(&reach[..n])
            } else {
                let n = h.continuation(self.cursor, room, &mut self.recalled, &mut self.recalled_share);
                let mut p = [0.0; MAX_DRAFT];
                for (p, share) in p.iter_mut().zip(&self.recalled_share[..n]) {
                    *p = alpha * share;
                }
                self.cost.best_path(&p[..n])
            };
            if k > 0 && gain > best.1 {
                best = (k, gain);
                self.last = (Origin::History, b);
            }
        }
        best
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &str {
        "suffix"
    }

    fn draft(
        &mut self,
        _target: &mut dyn Session,
        context: &[Token],
        max: usize,
        out: &mut Draft,
    ) -> Result<()> {
        out.clear();
        self.branched = None;
        let (k, _) = self.plan_step(context, max);
        let k = k.min(out.capacity());
        if k > 0 {
            match self.last.0 {
                Origin::Match => {
                    self.sam.draft(k, out);
                }
                // k is within the prediction, which fits in a draft.
                Origin::Tracker => {
                    out.extend_from_slice(&self.predicted[..k]).ok();
                }
                // Likewise within the continuation.
                Origin::History => {
                    out.extend_from_slice(&self.recalled[..k]).ok();
                    self.recalled_drafts += 1;
                    self.recalled_tokens += k;
                    // A tree whose every token follows the one before it is a path.
                    let path = (0..k).all(|i| usize::from(self.recalled_parents[i]) == i);
                    if self.trees && !path {
                        self.branched = Some(k);
                    }
                }
            }
        }
        Ok(())
    }

    fn allow_trees(&mut self, allowed: bool) {
        self.trees = allowed;
    }

    fn tree(&self) -> Option<&[u8]> {
        self.branched.map(|k| &self.recalled_parents[..k])
    }

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        let (origin, b) = self.last;
        let estimate = match origin {
            Origin::Match => &mut self.acceptance[b],
            Origin::Tracker => &mut self.tracked_acceptance[b],
            Origin::History => &mut self.recalled_acceptance[b],
        };
        estimate.update(drafted.len(), accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_the_continuation_of_a_long_match_and_nothing_for_a_short_one() {
        let mut d = SuffixDrafter::with_cost(8, CostModel::linear(0.1));
        // "1 2 3 4 5 6 7 8 9" then its start again: a match of 5 continues with 6 7 8 9.
        let mut ctx: Vec<Token> = (1..=9).collect();
        ctx.extend(1..=5);
        let (k, gain) = d.plan_step(&ctx, 8);
        assert!(k >= 1 && gain > 1.0, "{k} {gain}");
        // Steep costs: a 1-token match does not pay.
        let mut steep = SuffixDrafter::with_cost(8, CostModel::linear(0.9));
        assert_eq!(steep.plan_step(&[1, 2, 3, 1], 8), (0, 1.0));
        // Nothing repeated: no match.
        assert_eq!(d.plan_step(&[10, 11, 12], 8), (0, 1.0));
    }

    #[test]
    fn rejections_shorten_drafts() {
        let mut d = SuffixDrafter::with_cost(8, CostModel::linear(0.2));
        let mut ctx: Vec<Token> = (1..=12).collect();
        ctx.extend(1..=9);
        let (k0, _) = d.plan_step(&ctx, 8);
        for _ in 0..20 {
            d.plan_step(&ctx, 8);
            d.feedback(&[0; 3], 0);
        }
        let (k1, _) = d.plan_step(&ctx, 8);
        assert!(k1 < k0, "{k0} -> {k1}");
    }

    /// Draft for `context` with no session involved (the drafter never touches it).
    fn draft(d: &mut SuffixDrafter, context: &[Token], max: usize) -> Vec<Token> {
        let mut out = Draft::new();
        d.draft(&mut crate::testing::FakeSession::new(0), context, max, &mut out).unwrap();
        out.to_vec()
    }

    /// Generate `truth` after `prompt` the way the loop does, with `d` drafting: each step
    /// keeps the agreeing prefix of the draft and then the true next token. Returns each
    /// step's draft and how many of its tokens were kept.
    fn simulate(d: &mut SuffixDrafter, prompt: &[Token], truth: &[Token]) -> Vec<(Vec<Token>, usize)> {
        let mut context = [prompt, &truth[..1]].concat();
        let mut steps = Vec::new();
        while context.len() - prompt.len() < truth.len() {
            let done = context.len() - prompt.len();
            let drafted = draft(d, &context, truth.len() - done - 1);
            let kept = drafted.iter().zip(&truth[done..]).take_while(|(a, b)| a == b).count();
            d.feedback(&drafted, kept);
            context.extend_from_slice(&truth[done..done + kept + 1]);
            steps.push((drafted, kept));
        }
        steps
    }

    #[test]
    fn a_renamed_variable_is_drafted_renamed_after_its_first_occurrences() {
        // A prompt holding a function in which variable 7 occurs eight times, each time
        // between other tokens; the output is the function with 7 renamed to 99.
        let mut code: Vec<Token> = Vec::new();
        for line in 0..8 {
            code.extend([100 + line * 10, 101 + line * 10, 7, 102 + line * 10, 103 + line * 10]);
        }
        let prompt = [&[1, 2, 3][..], &code, &[4, 5]].concat();
        let renamed: Vec<Token> = code.iter().map(|&t| if t == 7 { 99 } else { t }).collect();
        let flat = || SuffixDrafter::with_cost(16, CostModel::linear(0.05));
        let steps = simulate(&mut flat(), &prompt, &renamed);
        let rejected: Vec<usize> =
            steps.iter().enumerate().filter(|(_, (d, kept))| *kept < d.len()).map(|(i, _)| i).collect();
        // The first two occurrences are drafted as 7 (the rename is not confirmed before the
        // second); every later one is drafted as 99 and kept, so the rest of the copy takes
        // full drafts.
        assert_eq!(rejected.len(), 2, "{steps:?}");
        let after = &steps[rejected[1] + 1..];
        assert!(after.iter().all(|(d, kept)| *kept == d.len()), "{steps:?}");
        assert!(after.iter().filter(|(d, _)| d.contains(&99)).count() >= 3, "{steps:?}");
        assert!(steps.len() <= 12, "{} steps: {steps:?}", steps.len());
    }

    #[test]
    fn a_source_is_matched_as_a_fixed_prefix() {
        // The output (after the decoder start 0) has begun copying the source.
        let source: Vec<Token> = (100..120).collect();
        let mut d = SuffixDrafter::with_source(&source, 4, CostModel::linear(0.0));
        assert_eq!(draft(&mut d, &[0, 100, 101, 102], 4), [103, 104, 105, 106]);
        // Continuing the same context appends to the automaton; the source stays in front.
        assert_eq!(draft(&mut d, &[0, 100, 101, 102, 103, 104, 105, 106, 107], 4), [108, 109, 110, 111]);
        assert_eq!(d.sam.tokens().len(), source.len() + 9);
        // A context that does not continue the last one rebuilds over the source.
        assert_eq!(draft(&mut d, &[0, 110, 111], 4), [112, 113, 114, 115]);
        assert_eq!(d.sam.tokens(), [&source[..], &[0, 110, 111]].concat());
        // A draft from a source match stops at the source's end, not running on into the
        // context after it.
        assert_eq!(draft(&mut d, &[0, 117, 118], 4), [119]);
        assert_eq!(draft(&mut d, &[0, 118, 119], 4), Vec::<Token>::new());
        // The output still matches itself, as without a source.
        assert_eq!(draft(&mut d, &[0, 7, 8, 9, 5, 7, 8], 4), [9, 5, 7, 8]);
        // Without the source nothing of it is known.
        let mut plain = SuffixDrafter::with_cost(4, CostModel::linear(0.0));
        assert_eq!(draft(&mut plain, &[0, 100, 101, 102], 4), Vec::<Token>::new());
    }

    #[test]
    fn where_earlier_answers_part_the_draft_branches_if_trees_are_allowed() {
        // After "… 50" earlier answers went 200 201 then 202 203 204 (twice) or 210 211 212.
        let mut history = History::new();
        for answer in [&[200, 201, 202, 203, 204][..], &[200, 201, 210, 211, 212], &[200, 201, 202, 203, 204]]
        {
            history.push(&[1, 2, 50], answer);
        }
        let history = Arc::new(history);
        let mut d =
            SuffixDrafter::with_cost(8, CostModel::linear(0.0)).with_history(history, &Recall::default());
        let context = [7, 2, 50, 200];
        // Paths unless allowed: the likelier continuation only.
        assert_eq!(draft(&mut d, &context, 8), [201, 202, 203, 204]);
        assert_eq!(d.tree(), None);
        d.allow_trees(true);
        let tokens = draft(&mut d, &context, 8);
        // 210's branch (1 of 3) comes in once the likelier one's reach, alpha times more at
        // each token, falls below it.
        assert_eq!(tokens, [201, 202, 210, 203, 211, 204, 212]);
        assert_eq!(d.tree(), Some(&[0, 1, 1, 2, 3, 4, 5][..]));
        // A draft with nothing to branch on is a path again.
        assert_eq!(draft(&mut d, &[7, 2, 50, 200, 201, 202], 8), [203, 204]);
        assert_eq!(d.tree(), None);
    }

    #[test]
    fn an_answer_given_before_is_drafted_from_the_history_and_its_acceptance_learned() {
        // Two earlier answers to questions ending in "… 5 6 ASSISTANT(50)".
        let answer: Vec<Token> = (200..230).collect();
        let mut history = History::new();
        history.push(&[1, 2, 5, 6, 50], &answer);
        history.push(&[3, 4, 5, 6, 50], &answer);
        let history = Arc::new(history);
        let prompt = [9, 9, 5, 6, 50];
        let cost = || CostModel::linear(0.1);
        let mut first =
            SuffixDrafter::with_cost(16, cost()).with_history(history.clone(), &Recall::default());
        let steps = simulate(&mut first, &prompt, &answer);
        // The first draft comes right after the first token, from the history, and the
        // accepted drafts grow: the answer takes a few passes, not 30.
        assert!(steps[0].0.len() >= 2 && steps[0].1 == steps[0].0.len(), "{steps:?}");
        assert!(steps.len() <= 6, "{} steps: {steps:?}", steps.len());
        // The next request starts from what this one learned, and drafts longer at once.
        let mut next = SuffixDrafter::with_cost(16, cost()).with_history(history.clone(), &first.learned());
        let again = simulate(&mut next, &prompt, &answer);
        assert!(again[0].0.len() > steps[0].0.len() && again.len() < steps.len(), "{again:?}");
        // Without the history, nothing of it is known.
        let plain = simulate(&mut SuffixDrafter::with_cost(16, cost()), &prompt, &answer);
        assert_eq!(plain.len(), answer.len() - 1);
        assert!(plain.iter().all(|(d, _)| d.is_empty()));
        // An answer that departs from the history: drafts rejected there shrink, and the
        // tokens still come out as they are (the simulation keeps only what agrees).
        let other: Vec<Token> = (200..210).chain(300..320).collect();
        let mut d = SuffixDrafter::with_cost(16, cost()).with_history(history, &Recall::default());
        let steps = simulate(&mut d, &prompt, &other);
        assert!(steps.iter().any(|(d, kept)| *kept < d.len()), "{steps:?}");
        assert!(d.recalled().0 >= 1);
    }
}
