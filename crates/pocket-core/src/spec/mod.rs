//! Speculative decoding: draft several tokens cheaply, verify them in one full-plan pass.
//!
//! The loop lives in [`crate::generate`]: each step a [`Drafter`] proposes up to K tokens
//! after the pending one, the target model decodes the pending token and the draft in one
//! pass with logits for every row, [`verify`] accepts the longest agreeing prefix plus the
//! target's own next token (greedy) or accepts by rejection sampling, and the session is
//! truncated back to what was accepted. Greedy output is token-for-token what plain decoding
//! gives; sampled output has exactly the target distribution.
//!
//! Drafters:
//! - [`SuffixDrafter`]: longest-suffix match over prompt and output (a suffix automaton);
//!   free, and strong wherever the output copies its input (edits, summaries, code). For an
//!   encoder-decoder model it is seeded with the source text, which the decoder's context
//!   does not hold ([`SuffixDrafter::with_source`]).
//!   Given a [`History`] of the app's earlier answers, it also drafts what followed in
//!   them (SuffixDecoding), which is where answers to similar requests repeat.
//! - [`InputCopyDrafter`]: for encoder-decoder models, the source text copied from where the
//!   output aligns to it (Aggressive Decoding); free, and strong where the output is mostly
//!   its input (grammar correction, editing).
//! - [`LayerSkipDrafter`]: the target model itself with some layers skipped, the skip set
//!   searched on the fly (SWIFT) and drafts cut short when unsure (Draft & Verify).
//! - [`DraftModelDrafter`]: a second, smaller model with the same vocabulary.
//! - [`AutoDrafter`]: picks among them per step from measured acceptance and the device's
//!   cost curve, and drafts nothing when nothing is expected to pay
//!   ([`AutoDrafter::for_seq2seq`]: among suffix and input copy, both over the source).
//!
//! For an encoder-decoder model the context drafters see is the decoder's: its start token,
//! the output so far and the pending token, never the source; drafters that need the source
//! are given it when they are made.

mod acceptance;
mod auto;
mod draft_model;
mod edit_tracker;
mod history;
mod input_copy;
mod layerskip;
mod report;
mod search;
mod suffix;
mod suffix_drafter;
mod verify;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use auto::{AutoConfig, AutoDrafter, Choice};
pub use draft_model::{DraftModelDrafter, check_same_vocabulary};
pub use history::{History, PROMPT_TAIL};
pub use input_copy::InputCopyDrafter;
pub use layerskip::{LayerSkipConfig, LayerSkipDrafter, SkipSet};
pub use report::DrafterReport;
pub use search::{SearchConfig, SkipSearch};
pub use suffix::{Cursor, Match, SuffixAutomaton};
pub use suffix_drafter::{Recall, SuffixDrafter};
pub use verify::{Verdict, verify_greedy, verify_sampled, verify_tree_greedy};

use crate::{Result, Session, Token};

/// The longest draft any drafter proposes. Draft buffers have this fixed capacity, so the
/// loop never allocates for them.
pub const MAX_DRAFT: usize = 16;

/// A draft: up to [`MAX_DRAFT`] tokens proposed to follow the pending token.
pub type Draft = heapless::Vec<Token, MAX_DRAFT>;

/// A verification pass's batch: the pending token and the draft.
pub type Batch = heapless::Vec<Token, { MAX_DRAFT + 1 }>;

/// Indices into a verification pass: a tree's parents, or the path a verifier walked.
pub type Path = heapless::Vec<u8, { MAX_DRAFT + 1 }>;

/// Proposes tokens for the target model to verify.
///
/// Drafters are deterministic: a drafted token stands for a one-hot draft distribution, so
/// speculative sampling accepts it with probability p(token) under the target.
pub trait Drafter: Send {
    /// A short name for reports (`suffix`, `inputcopy`, `layerskip`, `draft`, `auto`).
    fn name(&self) -> &str;

    /// Propose up to `max` tokens to follow `context`, written into `out` (cleared first).
    ///
    /// `context` is the whole sequence so far: every token `target` holds, then the pending
    /// token, which the target has sampled but not decoded. A drafter may decode into `target`
    /// (layer-skip drafting shares its weights and KV cache), but must leave the first
    /// `context.len() - 1` positions as they were; the loop truncates anything after them
    /// before verifying. Proposing nothing is always allowed: the step is plain decoding.
    fn draft(
        &mut self,
        target: &mut dyn Session,
        context: &[Token],
        max: usize,
        out: &mut Draft,
    ) -> Result<()>;

    /// The verifier's verdict on the last draft: `accepted` of `drafted` tokens were kept.
    /// After a tree, `drafted` is the path the verifier walked: the accepted tokens, then
    /// the first of the rejected ones where the tree went on.
    fn feedback(&mut self, drafted: &[Token], accepted: usize);

    /// Whether drafts may branch from here on ([`Drafter::tree`]): the loop says so before a
    /// request's first draft, where its session decodes trees and nothing but the target's
    /// greedy pick is asked of a row. By default drafts stay paths.
    fn allow_trees(&mut self, allowed: bool) {
        let _ = allowed;
    }

    /// Where the last draft branched: the parent of each of its tokens, as an index into the
    /// verification pass (0 the pending token, `j + 1` the draft's token `j`). `None`: the
    /// draft is a path, each token after the one before it.
    fn tree(&self) -> Option<&[u8]> {
        None
    }

    /// Called once the target has decoded the prompt, before its first token is sampled,
    /// with every token the target holds: a drafter with state of its own (a draft model's
    /// KV cache) catches up here, so that work counts as prefill rather than as the first
    /// draft. By default nothing.
    fn prefill(&mut self, context: &[Token]) -> Result<()> {
        let _ = context;
        Ok(())
    }

    /// What the drafter did (by default: it was itself throughout); its `Display` is the
    /// line reports show.
    fn report(&self) -> DrafterReport {
        DrafterReport::Single(self.name().to_string())
    }
}

/// Which drafter a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecMode {
    /// Plain decoding.
    #[default]
    Off,
    /// Choose per step from measured acceptance and the device's cost curve.
    Auto,
    /// Suffix-automaton matching over prompt and output.
    Suffix,
    /// Copying from an encoder-decoder model's source text at the aligned position.
    InputCopy,
    /// Self-drafting with a subset of the model's layers.
    LayerSkip,
    /// A second, smaller model.
    Draft,
}

impl SpecMode {
    /// Every mode, in the order the CLI lists them.
    pub const ALL: [SpecMode; 6] = [
        SpecMode::Off,
        SpecMode::Auto,
        SpecMode::Suffix,
        SpecMode::InputCopy,
        SpecMode::LayerSkip,
        SpecMode::Draft,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SpecMode::Off => "off",
            SpecMode::Auto => "auto",
            SpecMode::Suffix => "suffix",
            SpecMode::InputCopy => "inputcopy",
            SpecMode::LayerSkip => "layerskip",
            SpecMode::Draft => "draft",
        }
    }
}

impl fmt::Display for SpecMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SpecMode {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self> {
        SpecMode::ALL.into_iter().find(|m| m.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            crate::Error::invalid_field(
                "spec",
                format!(
                    "unknown speculation mode {s:?}; use off, auto, suffix, inputcopy, layerskip or draft"
                ),
            )
        })
    }
}

/// What speculation did during one request.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SpecStats {
    /// Tokens proposed by the drafter.
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// Verification passes that carried a draft.
    pub drafts: usize,
    /// Passes of the target model after the prompt (with or without a draft).
    pub passes: usize,
    /// Seconds spent drafting.
    pub draft_seconds: f64,
    /// Seconds spent in the target's passes after the prompt (verification).
    pub verify_seconds: f64,
    /// Tokens a constraint forced and the loop drafted for free (not counted in `drafted`).
    #[serde(default)]
    pub forced: usize,
    /// Forced tokens the target accepted.
    #[serde(default)]
    pub forced_accepted: usize,
    /// Seconds spent on the constraint: masks, advancing it, checking drafts, forced tokens.
    #[serde(default)]
    pub constraint_seconds: f64,
    /// Drafts that branched (verified as trees). `drafted` counts a tree's tokens along the
    /// path verification walked (the accepted ones and the first rejected), so acceptance
    /// reads as for paths; `tree_tokens` counts all that its passes verified.
    #[serde(default)]
    pub trees: usize,
    /// Tokens of the drafts that branched.
    #[serde(default)]
    pub tree_tokens: usize,
}

impl SpecStats {
    /// Accepted over drafted tokens; `None` when nothing was drafted.
    pub fn acceptance(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// Mean number of drafted tokens accepted per draft (the target's own token not
    /// counted); `None` when nothing was drafted.
    pub fn mean_accepted_len(&self) -> Option<f64> {
        (self.drafts > 0).then(|| self.accepted as f64 / self.drafts as f64)
    }
}

/// Expected tokens one verification pass yields when each of `k` drafted tokens is accepted
/// independently with probability `alpha`: the accepted prefix plus the target's own token,
/// (1 − α^(k+1)) / (1 − α).
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    let alpha = alpha.clamp(0.0, 1.0);
    if alpha >= 1.0 { (k + 1) as f64 } else { (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in SpecMode::ALL {
            assert_eq!(m.name().parse::<SpecMode>().unwrap(), m);
        }
        assert_eq!("LayerSkip".parse::<SpecMode>().unwrap(), SpecMode::LayerSkip);
        assert_eq!("InputCopy".parse::<SpecMode>().unwrap(), SpecMode::InputCopy);
        let e = "eagle".parse::<SpecMode>().unwrap_err().to_string();
        assert!(e.contains("suffix, inputcopy, layerskip"), "{e}");
        assert!("eagle".parse::<SpecMode>().is_err());
    }

    #[test]
    fn expected_tokens_bounds() {
        assert_eq!(expected_tokens(0.0, 8), 1.0);
        assert_eq!(expected_tokens(1.0, 8), 9.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn stats_rates() {
        let s = SpecStats { drafted: 10, accepted: 6, drafts: 3, ..SpecStats::default() };
        assert_eq!(s.acceptance(), Some(0.6));
        assert_eq!(s.mean_accepted_len(), Some(2.0));
        assert_eq!(SpecStats::default().acceptance(), None);
    }
}
