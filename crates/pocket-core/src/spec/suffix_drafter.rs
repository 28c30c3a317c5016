//! Suffix-match drafting (prompt lookup; SAM decoding, 2024): find the longest suffix of the
//! sequence that occurred before and draft what followed it.
//!
//! The draft length is chosen per step: the longer the match, the likelier its continuation
//! is right, so acceptance is estimated per match-length bucket from this request's own
//! verdicts and the device's cost model says how many tokens that acceptance pays for. A
//! step whose best draft would not beat plain decoding drafts nothing.
//!
//! For an encoder-decoder model the decoder's context does not hold the source text, so the
//! drafter can be seeded with it ([`SuffixDrafter::with_source`]): the automaton then holds
//! the source followed by the context, and a suffix of the output that occurred in the
//! source drafts what followed it there.

use super::acceptance::AcceptanceEstimate;
use super::suffix::SuffixAutomaton;
use super::{Draft, Drafter};
use crate::cost::CostModel;
use crate::{Result, Session, Token};

/// Upper bounds of the match-length buckets acceptance is tracked in.
const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, usize::MAX];
/// Acceptance assumed per bucket before any verdict: short matches are often chance.
const PRIORS: [f64; 6] = [0.2, 0.35, 0.5, 0.65, 0.75, 0.85];
/// Weight of the prior, in drafted tokens.
const PRIOR_WEIGHT: f64 = 4.0;

fn bucket(match_len: usize) -> usize {
    BUCKETS.iter().position(|&b| match_len <= b).unwrap_or(BUCKETS.len() - 1)
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
    /// The bucket of the last draft's match, for its verdict.
    last_bucket: usize,
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
            last_bucket: 0,
        }
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
    /// reused drafter).
    fn sync(&mut self, context: &[Token]) {
        let src = self.source.len();
        let held = self.sam.tokens().get(src..);
        match held.filter(|h| context.starts_with(h)).map(<[Token]>::len) {
            Some(n) => self.sam.extend(&context[n..]),
            None => {
                self.sam.clear();
                self.sam.extend(&self.source);
                self.sam.extend(context);
            }
        }
    }

    /// For the sequence `context`: how many tokens to draft (at most `max`) and the speed-up
    /// expected from it; `(0, 1.0)` when there is no match or no draft would pay.
    pub fn plan_step(&mut self, context: &[Token], max: usize) -> (usize, f64) {
        self.sync(context);
        let Some(m) = self.sam.longest_match() else { return (0, 1.0) };
        let src = self.source.len();
        let available = if m.end <= src { src } else { self.sam.len() } - m.end;
        let b = bucket(m.len);
        let (k, gain) =
            self.cost.best_k(self.acceptance[b].alpha(), 0.0, max.min(self.max_draft).min(available));
        self.last_bucket = b;
        (k, gain)
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
        let (k, _) = self.plan_step(context, max);
        if k > 0 {
            self.sam.draft(k.min(out.capacity()), out);
        }
        Ok(())
    }

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        self.acceptance[self.last_bucket].update(drafted.len(), accepted);
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
}
