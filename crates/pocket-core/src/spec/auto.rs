//! Choosing the drafter and the draft length per step, from measured acceptance and the
//! device's cost curve.
//!
//! Each step every available drafter is valued by the speed-up [`CostModel::speedup`]
//! predicts from its acceptance so far and its drafting cost; the best drafts if it beats
//! plain decoding by `min_gain`, and otherwise the step is plain decoding. The suffix and
//! input-copy drafters are valued by the length of their current match (they know it before
//! drafting, for free); the layer-skip drafter is only considered where the cost curve lets a
//! good skip set pay at all, which on a small CPU it does not.
//!
//! For an encoder-decoder model ([`AutoDrafter::for_seq2seq`]) the choice is among the suffix
//! drafter seeded with the source text, input copying from it, and plain decoding.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::acceptance::AcceptanceEstimate;
use super::input_copy::InputCopyDrafter;
use super::suffix_drafter::SuffixDrafter;
use super::{Draft, DraftModelDrafter, Drafter, DrafterReport, LayerSkipDrafter, MAX_DRAFT};
use crate::cost::CostModel;
use crate::{Result, Session, Token};

/// What [`AutoDrafter`] did in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Choice {
    /// Drafted nothing.
    Plain,
    /// Drafted with the suffix automaton.
    Suffix,
    /// Drafted by copying from the source text.
    InputCopy,
    /// Drafted with skipped layers.
    LayerSkip,
    /// Drafted with the draft model.
    Draft,
}

impl Choice {
    const ALL: [Choice; 5] =
        [Choice::Plain, Choice::Suffix, Choice::InputCopy, Choice::LayerSkip, Choice::Draft];

    fn name(self) -> &'static str {
        match self {
            Choice::Plain => "plain",
            Choice::Suffix => "suffix",
            Choice::InputCopy => "inputcopy",
            Choice::LayerSkip => "layerskip",
            Choice::Draft => "draft",
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How [`AutoDrafter`] chooses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AutoConfig {
    /// The device's cost curve for the target.
    pub cost: CostModel,
    /// Longest draft.
    pub max_draft: usize,
    /// Expected speed-up a drafter must promise before it is used.
    pub min_gain: f64,
    /// Expected speed-up a drafter that runs a model (layer skipping, a draft model) must
    /// promise. Higher than `min_gain`: its agreement was measured on few tokens, and each of
    /// its drafted tokens costs a pass that is paid even when the draft is cut short or
    /// rejected, so a gain within the cost curve's noise is a loss in practice.
    pub min_model_gain: f64,
    /// Cost of one draft-model step in target steps (its weights over the target's is a good
    /// first guess for memory-bound decoding).
    pub draft_model_cost: f64,
}

impl AutoConfig {
    /// Defaults for a device with cost model `cost`.
    pub fn new(cost: CostModel) -> Self {
        AutoConfig { cost, max_draft: MAX_DRAFT, min_gain: 1.02, min_model_gain: 1.1, draft_model_cost: 0.3 }
    }

    /// Whether a drafter that runs a model and is expected to give `gain` is worth using.
    pub fn model_drafting_pays(&self, gain: f64) -> bool {
        gain > self.min_model_gain
    }
}

/// Picks a drafter per step, or none.
pub struct AutoDrafter {
    config: AutoConfig,
    suffix: SuffixDrafter,
    input_copy: Option<InputCopyDrafter>,
    layerskip: Option<LayerSkipDrafter>,
    draft_model: Option<DraftModelDrafter>,
    layerskip_acceptance: AcceptanceEstimate,
    draft_acceptance: AcceptanceEstimate,
    last: Choice,
    /// The length the last draft was planned at (a model drafter may stop short of it).
    last_k: usize,
    counts: [usize; Choice::ALL.len()],
}

impl AutoDrafter {
    /// An auto drafter over the suffix drafter and, where given, a layer-skip drafter and a
    /// draft model.
    ///
    /// Auto uses only what is known to pay: the layer-skip drafter is kept only when it drafts
    /// with a skip set found earlier (auto never searches one inside a request) whose measured
    /// agreement, at its share of the layers, beats plain decoding on this cost curve.
    pub fn new(
        config: AutoConfig,
        layerskip: Option<LayerSkipDrafter>,
        draft_model: Option<DraftModelDrafter>,
    ) -> Self {
        let layerskip = layerskip.filter(|ls| Self::layerskip_pays(&config, ls));
        let layerskip_acceptance = AcceptanceEstimate::prior(
            layerskip.as_ref().and_then(|l| l.skip_set()).map_or(0.8, |s| s.agreement),
            4.0,
        );
        AutoDrafter {
            suffix: SuffixDrafter::with_cost(config.max_draft, config.cost.clone()),
            config,
            input_copy: None,
            layerskip,
            draft_model,
            layerskip_acceptance,
            draft_acceptance: AcceptanceEstimate::prior(0.7, 4.0),
            last: Choice::Plain,
            last_k: 0,
            counts: [0; Choice::ALL.len()],
        }
    }

    /// Whether `ls` drafts with a known skip set that is expected to beat plain decoding.
    fn layerskip_pays(config: &AutoConfig, ls: &LayerSkipDrafter) -> bool {
        match ls.skip_set() {
            Some(set) if !ls.searching() => config.model_drafting_pays(
                config.cost.best_k(set.agreement, ls.run_fraction(), config.max_draft).1,
            ),
            _ => false,
        }
    }

    /// An auto drafter for an encoder-decoder model whose encoder read `source`: the suffix
    /// drafter matches the source as well as the output, input copying drafts from the source
    /// at the aligned position, and there is no layer-skip drafter or draft model.
    pub fn for_seq2seq(config: AutoConfig, source: &[Token]) -> Self {
        let suffix = SuffixDrafter::with_source(source, config.max_draft, config.cost.clone());
        let input_copy = InputCopyDrafter::new(source, config.max_draft, config.cost.clone());
        AutoDrafter { suffix, ..Self::new(config, None, None) }.with_input_copy(input_copy)
    }

    /// This drafter, also choosing input copying with `input_copy` where it pays.
    pub fn with_input_copy(self, input_copy: InputCopyDrafter) -> Self {
        AutoDrafter { input_copy: Some(input_copy), ..self }
    }

    /// This drafter, its suffix drafter also drafting from `history` (earlier answers),
    /// starting from what earlier requests `learned` about such drafts.
    pub fn with_history(self, history: std::sync::Arc<super::History>, learned: &super::Recall) -> Self {
        AutoDrafter { suffix: self.suffix.with_history(history, learned), ..self }
    }

    /// What drafting from the history learned in this request.
    pub fn learned(&self) -> super::Recall {
        self.suffix.learned()
    }

    /// Drafts the suffix drafter took from earlier answers, and the tokens they held.
    pub fn recalled(&self) -> (usize, usize) {
        self.suffix.recalled()
    }

    /// Steps in which each choice was made.
    pub fn choices(&self) -> impl Iterator<Item = (Choice, usize)> + '_ {
        Choice::ALL.into_iter().zip(self.counts)
    }

    /// The layer-skip drafter, if auto kept one (for its skip set).
    pub fn layerskip(&self) -> Option<&LayerSkipDrafter> {
        self.layerskip.as_ref()
    }
}

impl Drafter for AutoDrafter {
    fn name(&self) -> &str {
        "auto"
    }

    fn prefill(&mut self, context: &[Token]) -> Result<()> {
        if let Some(ic) = &mut self.input_copy {
            ic.prefill(context)?;
        }
        match &mut self.draft_model {
            Some(d) => d.prefill(context),
            None => Ok(()),
        }
    }

    fn draft(
        &mut self,
        target: &mut dyn Session,
        context: &[Token],
        max: usize,
        out: &mut Draft,
    ) -> Result<()> {
        out.clear();
        let max = max.min(self.config.max_draft);
        let mut best = (Choice::Plain, 0, self.config.min_gain);
        let (k, gain) = self.suffix.plan_step(context, max);
        if k > 0 && gain > best.2 {
            best = (Choice::Suffix, k, gain);
        }
        if let Some(ic) = &mut self.input_copy {
            let (k, gain) = ic.plan_step(context, max);
            if k > 0 && gain > best.2 {
                best = (Choice::InputCopy, k, gain);
            }
        }
        if let Some(ls) = &self.layerskip {
            let (k, gain) =
                self.config.cost.best_k(self.layerskip_acceptance.alpha(), ls.run_fraction(), max);
            if k > 0 && gain > best.2 && self.config.model_drafting_pays(gain) {
                best = (Choice::LayerSkip, k, gain);
            }
        }
        if self.draft_model.is_some() {
            let alpha = self.draft_acceptance.alpha();
            let (k, gain) = self.config.cost.best_k(alpha, self.config.draft_model_cost, max);
            if k > 0 && gain > best.2 && self.config.model_drafting_pays(gain) {
                best = (Choice::Draft, k, gain);
            }
        }
        let (choice, k, _) = best;
        self.last = choice;
        self.last_k = k;
        self.counts[Choice::ALL.iter().position(|&c| c == choice).unwrap_or(0)] += 1;
        match choice {
            Choice::Plain => Ok(()),
            Choice::Suffix => self.suffix.draft(target, context, k, out),
            Choice::InputCopy => match &mut self.input_copy {
                Some(ic) => ic.draft(target, context, k, out),
                None => Ok(()),
            },
            Choice::LayerSkip => match &mut self.layerskip {
                Some(ls) => ls.draft(target, context, k, out),
                None => Ok(()),
            },
            Choice::Draft => match &mut self.draft_model {
                Some(d) => d.draft(target, context, k, out),
                None => Ok(()),
            },
        }
    }

    fn allow_trees(&mut self, allowed: bool) {
        self.suffix.allow_trees(allowed);
    }

    fn tree(&self) -> Option<&[u8]> {
        if self.last == Choice::Suffix { self.suffix.tree() } else { None }
    }

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        // A model drafter that stopped short of the planned length (layer skipping below its
        // confidence threshold) paid for the pass that found the token it did not trust: that
        // counts as a rejected token, or auto would keep choosing a drafter that drafts
        // nothing.
        let model_drafted = drafted.len() + usize::from(drafted.len() < self.last_k);
        match self.last {
            Choice::Plain => {}
            Choice::Suffix => self.suffix.feedback(drafted, accepted),
            Choice::InputCopy => {
                if let Some(ic) = &mut self.input_copy {
                    ic.feedback(drafted, accepted);
                }
            }
            Choice::LayerSkip => {
                self.layerskip_acceptance.update(model_drafted, accepted);
                if let Some(ls) = &mut self.layerskip {
                    ls.feedback(drafted, accepted);
                }
            }
            Choice::Draft => self.draft_acceptance.update(model_drafted, accepted),
        }
    }

    fn report(&self) -> DrafterReport {
        let total = self.counts.iter().sum::<usize>().max(1) as f64;
        DrafterReport::Auto(
            self.choices().filter(|&(_, n)| n > 0).map(|(c, n)| (c, n as f64 / total)).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeSession;

    /// Draft for `context` (the suffix and input-copy drafters never touch the session); the
    /// draft and what was chosen.
    fn step(auto: &mut AutoDrafter, context: &[Token]) -> (Vec<Token>, Choice) {
        let mut out = Draft::new();
        auto.draft(&mut FakeSession::new(0), context, MAX_DRAFT, &mut out).unwrap();
        (out.to_vec(), auto.last)
    }

    fn seq2seq(source: &[Token]) -> AutoDrafter {
        let mut auto = AutoDrafter::for_seq2seq(AutoConfig::new(CostModel::linear(0.1)), source);
        auto.prefill(&[0]).unwrap();
        auto
    }

    #[test]
    fn an_output_copying_its_source_is_drafted_by_input_copy() {
        let source: Vec<Token> = (100..140).collect();
        let mut auto = seq2seq(&source);
        assert!(auto.layerskip().is_none() && auto.draft_model.is_none());
        // Both the source-seeded suffix drafter and input copy match "100 101 102 103"; input
        // copy expects more of such a match to be accepted, so it drafts further and wins.
        let (draft, choice) = step(&mut auto, &[0, 100, 101, 102, 103]);
        assert_eq!(choice, Choice::InputCopy);
        assert!(draft.len() >= 3 && draft[..] == source[4..4 + draft.len()], "{draft:?}");
        assert_eq!(auto.report().share(Choice::InputCopy), 1.0, "{}", auto.report());
        // A decoder-only auto drafter knows no source: nothing repeats, nothing is drafted.
        let mut plain = AutoDrafter::new(AutoConfig::new(CostModel::linear(0.1)), None, None);
        assert_eq!(step(&mut plain, &[0, 100, 101, 102, 103]), (Vec::new(), Choice::Plain));
    }

    #[test]
    fn layer_skipping_is_kept_only_with_a_known_skip_set_that_pays_on_the_curve() {
        use crate::spec::{LayerSkipConfig, SkipSet};
        let layerskip = |cost: &CostModel, known: Option<&SkipSet>| {
            LayerSkipDrafter::new(24, LayerSkipConfig::default(), known, cost.clone()).unwrap()
        };
        let half = SkipSet { n_layers: 24, skip: (6..18).collect(), agreement: 0.95 };
        let flat = CostModel::linear(0.05);
        // No skip set known: auto does not search for one.
        let auto = AutoDrafter::new(AutoConfig::new(flat.clone()), Some(layerskip(&flat, None)), None);
        assert!(auto.layerskip().is_none());
        // A good set on a flat curve pays.
        let auto = AutoDrafter::new(AutoConfig::new(flat.clone()), Some(layerskip(&flat, Some(&half))), None);
        assert!(auto.layerskip().is_some());
        // The same set on a curve where every drafted token costs a step does not.
        let steep = CostModel::linear(1.0);
        let auto =
            AutoDrafter::new(AutoConfig::new(steep.clone()), Some(layerskip(&steep, Some(&half))), None);
        assert!(auto.layerskip().is_none());
        // Nor does a set that agrees too rarely.
        let poor = SkipSet { agreement: 0.3, ..half.clone() };
        let auto = AutoDrafter::new(AutoConfig::new(flat.clone()), Some(layerskip(&flat, Some(&poor))), None);
        assert!(auto.layerskip().is_none());
        // Nor one whose expected gain is within the curve's noise: 1.03x here, which would
        // beat plain decoding on paper.
        let shallow = CostModel::linear(0.4);
        let config = AutoConfig::new(shallow.clone());
        let (_, gain) = shallow.best_k(half.agreement, 0.5, MAX_DRAFT);
        assert!(gain > config.min_gain && !config.model_drafting_pays(gain), "{gain}");
        let auto = AutoDrafter::new(config, Some(layerskip(&shallow, Some(&half))), None);
        assert!(auto.layerskip().is_none());
    }

    #[test]
    fn a_model_drafter_that_stops_short_is_charged_for_the_token_it_did_not_draft() {
        let mut auto = AutoDrafter::new(AutoConfig::new(CostModel::linear(0.05)), None, None);
        auto.last = Choice::LayerSkip;
        /// Planned length, the draft, tokens kept, and the update the estimate should get.
        type Case<'a> = (usize, &'a [Token], usize, (usize, usize));
        let cases: [Case; 4] = [
            (4, &[], 0, (1, 0)),        // nothing drafted: one rejection
            (4, &[1, 2], 2, (3, 2)),    // two kept, then the stop: two and a rejection
            (2, &[1, 2], 2, (2, 2)),    // drafted all planned and all kept
            (3, &[1, 2, 3], 1, (3, 1)), // a rejection by the verifier only
        ];
        for (planned, drafted, accepted, (n, kept)) in cases {
            let mut expected = auto.layerskip_acceptance;
            expected.update(n, kept);
            auto.last_k = planned;
            auto.feedback(drafted, accepted);
            assert_eq!(
                auto.layerskip_acceptance.alpha(),
                expected.alpha(),
                "{planned} {drafted:?} {accepted}"
            );
        }
    }

    #[test]
    fn the_suffix_drafter_takes_what_repeats_in_the_output_only() {
        let mut auto = seq2seq(&(100..140).collect::<Vec<_>>());
        // "7 8 9" is not in the source but occurred earlier in the output.
        let (draft, choice) = step(&mut auto, &[0, 7, 8, 9, 5, 6, 7, 8, 9]);
        assert_eq!(choice, Choice::Suffix);
        assert_eq!(draft[..], [5, 6, 7, 8, 9][..draft.len()]);
    }

    #[test]
    fn rejected_copies_fall_back_to_other_choices_then_to_plain_decoding() {
        let source: Vec<Token> = (100..140).collect();
        let mut auto = seq2seq(&source);
        let context = [0, 100, 101, 102, 103];
        let mut seen = Vec::new();
        for _ in 0..60 {
            let (draft, choice) = step(&mut auto, &context);
            seen.push(choice);
            if !draft.is_empty() {
                auto.feedback(&draft, 0);
            }
        }
        assert_eq!(seen.first(), Some(&Choice::InputCopy));
        assert!(seen.contains(&Choice::Suffix), "{seen:?}");
        assert_eq!(seen.last(), Some(&Choice::Plain), "{seen:?}");
        let counts: Vec<(Choice, usize)> = auto.choices().filter(|c| c.1 > 0).collect();
        assert_eq!(
            counts.iter().map(|c| c.0).collect::<Vec<_>>(),
            [Choice::Plain, Choice::Suffix, Choice::InputCopy]
        );
        assert_eq!(counts.iter().map(|c| c.1).sum::<usize>(), 60);
    }
}
