//! Choosing the drafter and the draft length per step, from measured acceptance and the
//! device's cost curve.
//!
//! Each step every available drafter is valued by the speed-up [`CostModel::speedup`]
//! predicts from its acceptance so far and its drafting cost; the best drafts if it beats
//! plain decoding by `min_gain`, and otherwise the step is plain decoding. The suffix drafter
//! is valued by the length of its current match (it knows it before drafting, for free);
//! the layer-skip drafter is only considered where the cost curve lets a good skip set pay
//! at all, which on a small CPU it does not.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::acceptance::AcceptanceEstimate;
use super::suffix_drafter::SuffixDrafter;
use super::{Draft, DraftModelDrafter, Drafter, LayerSkipDrafter, MAX_DRAFT};
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
    /// Drafted (or searched) with skipped layers.
    LayerSkip,
    /// Drafted with the draft model.
    Draft,
}

impl Choice {
    const ALL: [Choice; 4] = [Choice::Plain, Choice::Suffix, Choice::LayerSkip, Choice::Draft];

    fn name(self) -> &'static str {
        match self {
            Choice::Plain => "plain",
            Choice::Suffix => "suffix",
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
    /// Cost of one draft-model step in target steps (its weights over the target's is a good
    /// first guess for memory-bound decoding).
    pub draft_model_cost: f64,
}

impl AutoConfig {
    /// Defaults for a device with cost model `cost`.
    pub fn new(cost: CostModel) -> Self {
        AutoConfig { cost, max_draft: MAX_DRAFT, min_gain: 1.02, draft_model_cost: 0.3 }
    }
}

/// Picks a drafter per step, or none.
pub struct AutoDrafter {
    config: AutoConfig,
    suffix: SuffixDrafter,
    layerskip: Option<LayerSkipDrafter>,
    draft_model: Option<DraftModelDrafter>,
    layerskip_acceptance: AcceptanceEstimate,
    draft_acceptance: AcceptanceEstimate,
    last: Choice,
    counts: [usize; 4],
}

impl AutoDrafter {
    /// An auto drafter over the suffix drafter and, where given, a layer-skip drafter and a
    /// draft model. The layer-skip drafter is dropped when even a skip set that runs half the
    /// layers at 0.93 agreement could not pay on this cost curve.
    pub fn new(
        config: AutoConfig,
        layerskip: Option<LayerSkipDrafter>,
        draft_model: Option<DraftModelDrafter>,
    ) -> Self {
        let pays = config.cost.best_k(0.93, 0.5, config.max_draft).1 > config.min_gain;
        let layerskip = layerskip.filter(|_| pays);
        let layerskip_acceptance = AcceptanceEstimate::prior(
            layerskip.as_ref().and_then(|l| l.skip_set()).map_or(0.8, |s| s.agreement),
            4.0,
        );
        AutoDrafter {
            suffix: SuffixDrafter::with_cost(config.max_draft, config.cost.clone()),
            config,
            layerskip,
            draft_model,
            layerskip_acceptance,
            draft_acceptance: AcceptanceEstimate::prior(0.7, 4.0),
            last: Choice::Plain,
            counts: [0; 4],
        }
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
        if let Some(ls) = &self.layerskip {
            if ls.searching() {
                // The search is exploration: it runs when nothing cheaper pays right now.
                if best.0 == Choice::Plain {
                    best = (Choice::LayerSkip, max, f64::INFINITY);
                }
            } else {
                let (k, gain) =
                    self.config.cost.best_k(self.layerskip_acceptance.alpha(), ls.run_fraction(), max);
                if k > 0 && gain > best.2 {
                    best = (Choice::LayerSkip, k, gain);
                }
            }
        }
        if self.draft_model.is_some() {
            let alpha = self.draft_acceptance.alpha();
            let (k, gain) = self.config.cost.best_k(alpha, self.config.draft_model_cost, max);
            if k > 0 && gain > best.2 {
                best = (Choice::Draft, k, gain);
            }
        }
        let (choice, k, _) = best;
        self.last = choice;
        self.counts[Choice::ALL.iter().position(|&c| c == choice).unwrap_or(0)] += 1;
        match choice {
            Choice::Plain => Ok(()),
            Choice::Suffix => self.suffix.draft(target, context, k, out),
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

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        match self.last {
            Choice::Plain => {}
            Choice::Suffix => self.suffix.feedback(drafted, accepted),
            Choice::LayerSkip => {
                self.layerskip_acceptance.update(drafted.len(), accepted);
                if let Some(ls) = &mut self.layerskip {
                    ls.feedback(drafted, accepted);
                }
            }
            Choice::Draft => self.draft_acceptance.update(drafted.len(), accepted),
        }
    }

    fn describe(&self) -> String {
        let total: usize = self.counts.iter().sum();
        let parts: Vec<String> = self
            .choices()
            .filter(|&(_, n)| n > 0)
            .map(|(c, n)| format!("{c} {:.0}%", 100.0 * n as f64 / total.max(1) as f64))
            .collect();
        format!("auto ({})", parts.join(", "))
    }
}
