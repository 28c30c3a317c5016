//! Input-guided drafting for encoder-decoder models (Aggressive Decoding, Ge et al. 2022):
//! where the output mostly copies the source (grammar correction, editing, text with names
//! and numbers kept), the source tokens after the point the output has reached are a good
//! draft.
//!
//! Each step aligns the end of the output to the source: the longest suffix of the context
//! (up to [`InputCopyDrafter::MAX_ALIGN`] tokens) that occurs in the source, ties going to
//! the occurrence nearest at or after the previous alignment, so that a repeated word does
//! not send the draft back to an earlier copy of it. Nothing is repaired after a rejected
//! draft: the next step simply aligns again, which is how an inserted, deleted or substituted
//! token is stepped over. Draft lengths come from the device's cost model and the acceptance
//! measured per match-length bucket, as for the suffix drafter.

use super::acceptance::AcceptanceEstimate;
use super::{Draft, Drafter};
use crate::cost::CostModel;
use crate::{Result, Session, Token};

/// Upper bounds of the match-length buckets acceptance is tracked in (the last one holds
/// every match up to `MAX_ALIGN`).
const BUCKETS: [usize; 4] = [1, 2, 4, usize::MAX];
/// Acceptance assumed per bucket before any verdict. Higher than the suffix drafter's: a
/// model asked to copy-edit its input follows the input far more often than text repeats
/// itself, but a single shared token is still often chance.
const PRIORS: [f64; 4] = [0.3, 0.5, 0.7, 0.85];
/// Weight of the prior, in drafted tokens.
const PRIOR_WEIGHT: f64 = 4.0;

fn bucket(match_len: usize) -> usize {
    BUCKETS.iter().position(|&b| match_len <= b).unwrap_or(BUCKETS.len() - 1)
}

/// Where the end of the context sits in the source: its last `len` tokens are
/// `source[end - len..end]`, so `source[end..]` is what to draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Alignment {
    len: usize,
    end: usize,
}

impl Alignment {
    /// Longer matches win; of equal ones, the one nearest at or after `cursor`, then the
    /// nearest before it.
    fn better_than(self, other: Alignment, cursor: usize) -> bool {
        let rank = |a: Alignment| (a.end < cursor, a.end.abs_diff(cursor));
        self.len > other.len || (self.len == other.len && rank(self) < rank(other))
    }
}

/// How many trailing tokens `a` and `b` share, at most `cap`.
fn common_suffix(a: &[Token], b: &[Token], cap: usize) -> usize {
    a.iter().rev().zip(b.iter().rev()).take(cap).take_while(|(x, y)| x == y).count()
}

/// The best alignment of the end of `context` in `source` (see [`Alignment::better_than`]);
/// `None` when not even its last token occurs there. A linear scan: sources are short, and
/// it allocates nothing.
fn align(source: &[Token], context: &[Token], cursor: usize) -> Option<Alignment> {
    let mut best: Option<Alignment> = None;
    for end in 1..=source.len() {
        let len = common_suffix(&source[..end], context, InputCopyDrafter::MAX_ALIGN);
        let candidate = Alignment { len, end };
        if len > 0 && best.is_none_or(|b| candidate.better_than(b, cursor)) {
            best = Some(candidate);
        }
    }
    best
}

/// Drafts the source tokens that follow the output's aligned position in the source.
#[derive(Debug, Clone)]
pub struct InputCopyDrafter {
    source: Vec<Token>,
    max_draft: usize,
    cost: CostModel,
    acceptance: [AcceptanceEstimate; BUCKETS.len()],
    /// The bucket of the last draft's match, for its verdict.
    last_bucket: usize,
    /// End of the last alignment in `source`, where ties are broken towards. Kept at the
    /// alignment itself (not past it) so that planning the same context twice, as the auto
    /// drafter does, aligns it the same way both times.
    cursor: usize,
}

impl InputCopyDrafter {
    /// The longest suffix of the context matched against the source. Beyond a few tokens a
    /// longer match says little more about where the output is, and the cap bounds the scan.
    pub const MAX_ALIGN: usize = 8;

    /// A drafter copying from `source` (the encoder's input tokens), of at most `max_draft`
    /// tokens, sizing its drafts with `cost`.
    pub fn new(source: &[Token], max_draft: usize, cost: CostModel) -> Self {
        InputCopyDrafter {
            source: source.to_vec(),
            max_draft,
            cost,
            acceptance: PRIORS.map(|p| AcceptanceEstimate::prior(p, PRIOR_WEIGHT)),
            last_bucket: 0,
            cursor: 0,
        }
    }

    /// The source tokens drafted from.
    pub fn source(&self) -> &[Token] {
        &self.source
    }

    /// Align `context` and size the draft: where in the source it starts, how many tokens
    /// (at most `max`), and the speed-up expected; `None` when nothing aligns.
    fn plan(&mut self, context: &[Token], max: usize) -> Option<(usize, usize, f64)> {
        let a = align(&self.source, context, self.cursor)?;
        self.cursor = a.end;
        self.last_bucket = bucket(a.len);
        let room = max.min(self.max_draft).min(self.source.len() - a.end);
        let (k, gain) = self.cost.best_k(self.acceptance[self.last_bucket].alpha(), 0.0, room);
        Some((a.end, k, gain))
    }

    /// For the sequence `context`: how many tokens to draft (at most `max`) and the speed-up
    /// expected from it; `(0, 1.0)` when nothing aligns, the source is used up there, or no
    /// draft would pay.
    pub fn plan_step(&mut self, context: &[Token], max: usize) -> (usize, f64) {
        self.plan(context, max).map_or((0, 1.0), |(_, k, gain)| (k, gain))
    }
}

impl Drafter for InputCopyDrafter {
    fn name(&self) -> &str {
        "inputcopy"
    }

    /// A new generation starts at the top of the source.
    fn prefill(&mut self, _context: &[Token]) -> Result<()> {
        self.cursor = 0;
        Ok(())
    }

    fn draft(
        &mut self,
        _target: &mut dyn Session,
        context: &[Token],
        max: usize,
        out: &mut Draft,
    ) -> Result<()> {
        out.clear();
        if let Some((start, k, _)) = self.plan(context, max.min(out.capacity())) {
            // k is within the source and the buffer's capacity, so this cannot fail.
            out.extend_from_slice(&self.source[start..start + k]).ok();
        }
        Ok(())
    }

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        self.acceptance[self.last_bucket].update(drafted.len(), accepted);
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::*;
    use crate::spec::MAX_DRAFT;
    use crate::testing::{FakeSession, V};
    use crate::{
        ChatMessage, GenerateRequest, ModelInfo, ModelKind, SamplingConfig, StopConfig, Tokenizer, generate,
        generate_speculative,
    };

    /// Draft for `context` with no session involved (the drafter never touches it).
    fn draft(d: &mut InputCopyDrafter, context: &[Token], max: usize) -> Vec<Token> {
        let mut out = Draft::new();
        d.draft(&mut FakeSession::new(0), context, max, &mut out).unwrap();
        out.to_vec()
    }

    /// One simulated step: the draft, how many of its tokens were accepted, and the most
    /// the loop allowed.
    type Step = (Vec<Token>, usize, usize);

    /// Generate `truth` after `start` the way the loop does, with `d` drafting: each step
    /// keeps the agreeing prefix of the draft and then the true next token, and no step runs
    /// past the end of `truth`.
    fn simulate(d: &mut InputCopyDrafter, start: Token, truth: &[Token]) -> Vec<Step> {
        let mut context = vec![start, truth[0]];
        let mut steps = Vec::new();
        d.prefill(&context[..1]).unwrap();
        while context.len() - 1 < truth.len() {
            let done = context.len() - 1;
            let max = d.max_draft.min(truth.len() - done - 1);
            let drafted = draft(d, &context, max);
            let accepted = drafted.iter().zip(&truth[done..]).take_while(|(a, b)| a == b).count();
            d.feedback(&drafted, accepted);
            context.extend_from_slice(&truth[done..done + accepted + 1]);
            steps.push((drafted, accepted, max));
        }
        steps
    }

    fn flat() -> CostModel {
        CostModel::linear(0.0)
    }

    #[test]
    fn copies_an_identical_output_in_full_drafts() {
        let source: Vec<Token> = (100..140).collect();
        let mut d = InputCopyDrafter::new(&source, MAX_DRAFT, flat());
        let steps = simulate(&mut d, 0, &source);
        // Every step drafts all it may and all of it is accepted.
        assert!(steps.iter().all(|(d, accepted, max)| d.len() == *max && accepted == max), "{steps:?}");
        assert_eq!(steps[0].0, (101..117).collect::<Vec<_>>());
        assert_eq!(steps.len(), 3, "{steps:?}");
    }

    #[test]
    fn realigns_after_an_inserted_a_deleted_and_a_substituted_token() {
        let source: Vec<Token> = (100..140).collect();
        // (what, the output, steps that fall short of a full accepted draft)
        let cases: [(&str, Vec<Token>, usize); 3] = [
            // The draft after 109 is rejected, and the inserted 7 aligns nowhere.
            ("inserted", [&source[..10], &[7], &source[10..]].concat(), 2),
            // The draft after 109 is rejected at 110; 111 realigns at once.
            ("deleted", [&source[..10], &source[11..]].concat(), 1),
            ("substituted", [&source[..10], &[7], &source[11..]].concat(), 2),
        ];
        for (what, truth, short) in cases {
            let mut d = InputCopyDrafter::new(&source, 8, flat());
            let steps = simulate(&mut d, 0, &truth);
            let rejected = steps.iter().filter(|(d, accepted, _)| *accepted < d.len()).count();
            assert_eq!(rejected, 1, "{what}: {steps:?}");
            let fell_short = steps.iter().filter(|(_, accepted, max)| accepted < max).count();
            assert_eq!(fell_short, short, "{what}: {steps:?}");
        }
        // Directly: after "... 109 7" (7 is nowhere in the source) nothing aligns; once "110"
        // follows, the copy resumes after it.
        let mut d = InputCopyDrafter::new(&source, 4, flat());
        assert_eq!(draft(&mut d, &[0, 108, 109, 7], 4), Vec::<Token>::new());
        assert_eq!(draft(&mut d, &[0, 108, 109, 7, 110], 4), [111, 112, 113, 114]);
        // A deletion: "108 110" jumps ahead.
        assert_eq!(draft(&mut d, &[0, 108, 110], 4), [111, 112, 113, 114]);
    }

    #[test]
    fn a_repeated_word_does_not_send_the_alignment_back() {
        // "the" (50) occurs at 3 and at 7.
        let source: Vec<Token> = vec![10, 11, 12, 50, 13, 14, 15, 50, 16, 17, 18];
        let mut d = InputCopyDrafter::new(&source, 8, flat());
        d.prefill(&[0]).unwrap();
        assert_eq!(draft(&mut d, &[0, 10, 11, 12, 50, 13, 14], 8), [15, 50, 16, 17, 18]);
        // 15 became 99: nothing aligns.
        assert_eq!(draft(&mut d, &[0, 10, 11, 12, 50, 13, 14, 99], 8), Vec::<Token>::new());
        // "50" alone matches both copies; the one ahead of the last alignment is taken.
        assert_eq!(draft(&mut d, &[0, 10, 11, 12, 50, 13, 14, 99, 50], 8), [16, 17, 18]);
        // A fresh generation starts over from the top: the first copy is nearest.
        d.prefill(&[0]).unwrap();
        assert_eq!(draft(&mut d, &[0, 50], 8), [13, 14, 15, 50, 16, 17, 18]);
        // A longer match wins over nearness.
        assert_eq!(draft(&mut d, &[0, 15, 50], 8), [16, 17, 18]);
        assert_eq!(draft(&mut d, &[0, 12, 50], 8), [13, 14, 15, 50, 16, 17, 18]);
    }

    #[test]
    fn nothing_is_drafted_when_nothing_matches_or_the_source_is_used_up() {
        let mut d = InputCopyDrafter::new(&[10, 11, 12], 8, flat());
        assert_eq!(d.plan_step(&[0, 20, 21], 8), (0, 1.0));
        assert_eq!(draft(&mut d, &[0, 20, 21], 8), Vec::<Token>::new());
        assert_eq!(draft(&mut d, &[0, 10, 11, 12], 8), Vec::<Token>::new());
        assert_eq!(draft(&mut d, &[0, 10], 0), Vec::<Token>::new());
        let mut empty = InputCopyDrafter::new(&[], 8, flat());
        assert_eq!(draft(&mut empty, &[0, 10], 8), Vec::<Token>::new());
        // Steep costs: a one-token match does not pay.
        let mut steep = InputCopyDrafter::new(&[10, 11, 12], 8, CostModel::linear(0.9));
        assert_eq!(steep.plan_step(&[0, 10], 8), (0, 1.0));
    }

    #[test]
    fn rejections_shorten_drafts() {
        let source: Vec<Token> = (100..140).collect();
        let context = [0, 100, 101, 102, 103, 104];
        let mut d = InputCopyDrafter::new(&source, 16, CostModel::linear(0.2));
        let (k0, gain0) = d.plan_step(&context, 16);
        assert!(k0 >= 2 && gain0 > 1.0, "{k0} {gain0}");
        for _ in 0..20 {
            let drafted = draft(&mut d, &context, 16);
            d.feedback(&drafted, 0);
        }
        let (k1, _) = d.plan_step(&context, 16);
        assert!(k1 < k0, "{k0} -> {k1}");
    }

    #[test]
    fn never_proposes_more_than_asked_or_than_max_draft() {
        let source: Vec<Token> = (100..200).collect();
        for max in 0..=MAX_DRAFT + 2 {
            let mut d = InputCopyDrafter::new(&source, MAX_DRAFT, flat());
            let out = draft(&mut d, &[0, 100, 101], max);
            assert_eq!(out, (102..102 + max.min(MAX_DRAFT) as Token).collect::<Vec<_>>(), "max {max}");
        }
        let mut d = InputCopyDrafter::new(&source, 3, flat());
        assert_eq!(draft(&mut d, &[0, 100, 101], 16), [102, 103, 104]);
        assert_eq!(d.plan_step(&[0, 100, 101], 16).0, 3);
    }

    /// Token t is the letter 'a' + t; token 7 is the end token.
    struct Letters;

    impl Tokenizer for Letters {
        fn encode(&self, _text: &str, _add_special: bool) -> Result<Vec<Token>> {
            unimplemented!("not needed by generate")
        }

        fn piece(&self, token: Token) -> Vec<u8> {
            vec![b'a' + token as u8]
        }

        fn is_end(&self, token: Token) -> bool {
            token == 7
        }

        fn apply_chat_template(&self, _messages: &[ChatMessage], _add_assistant: bool) -> Result<String> {
            unimplemented!("not needed by generate")
        }
    }

    #[test]
    fn greedy_output_is_plain_decodings() {
        let info = ModelInfo {
            name: "fake".into(),
            architecture: "fake".into(),
            kind: ModelKind::EncoderDecoder,
            n_layers: 4,
            n_embd: 16,
            n_vocab: V,
            n_ctx_train: 64,
            weights_bytes: 0,
            exact_passes: None,
            placement: Vec::new(),
        };
        // From the decoder start 0 the fake model says 1 2 3 4 5 6, then the end token 7.
        let sources: [&[Token]; 5] = [
            &[1, 2, 3, 4, 5, 6, 7],
            &[1, 2, 3, 4, 5, 6],
            &[1, 2, 4, 5, 6, 7],
            &[1, 2, 0, 3, 4, 5],
            &[3, 3, 3],
        ];
        for source in sources {
            for max_tokens in [2, 3, 100] {
                let request = GenerateRequest {
                    prompt: vec![0],
                    sampling: SamplingConfig::default(),
                    stop: StopConfig { max_tokens, stop: Vec::new() },
                };
                let mut plain = FakeSession::new(64);
                let g = generate(&info, &mut plain, &Letters, &request, &mut |_| ControlFlow::Continue(()))
                    .unwrap();
                let mut d = InputCopyDrafter::new(source, MAX_DRAFT, flat());
                let mut spec = FakeSession::new(64);
                let s = generate_speculative(&info, &mut spec, &Letters, &request, Some(&mut d), &mut |_| {
                    ControlFlow::Continue(())
                })
                .unwrap();
                let what = format!("source {source:?} max {max_tokens}");
                assert_eq!((&s.tokens, &s.text, s.stop), (&g.tokens, &g.text, g.stop), "{what}");
                assert_eq!(spec.tokens, plain.tokens, "{what}");
                if source.starts_with(&[1, 2, 3, 4, 5, 6]) && max_tokens == 100 {
                    // The first token comes from the prompt's pass; one more pass verifies the
                    // rest of the copy.
                    assert_eq!(s.spec.passes, 1, "{what}: {:?}", s.spec);
                }
            }
        }
    }
}
