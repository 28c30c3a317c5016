//! Self-drafting with a subset of the target's own layers (Draft & Verify, 2023; SWIFT, 2024).
//!
//! Draft and verification share the weights and the KV cache, so this drafter costs no
//! memory. Drafted positions get KV only in the layers the draft ran; the verification pass
//! recomputes them with every layer. The skip set is searched during the first tokens of a
//! request ([`SkipSearch`]) unless one is given (found earlier for the same model file), and
//! drafting stops early when the draft's top-1 probability falls below a threshold τ that
//! follows the measured acceptance.

use serde::{Deserialize, Serialize};

use super::search::{SearchConfig, SkipSearch};
use super::{Draft, Drafter};
use crate::cost::CostModel;
use crate::{LayerPlan, Result, Rows, Session, Token, argmax};

/// A skip set found for a model, as cached between runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkipSet {
    /// The model's layer count.
    pub n_layers: usize,
    /// Layers skipped while drafting, ascending.
    pub skip: Vec<usize>,
    /// Agreement with the full model measured during the search.
    pub agreement: f64,
}

impl SkipSet {
    /// The drafting plan.
    pub fn plan(&self) -> Result<LayerPlan> {
        LayerPlan::skipping(self.n_layers, self.skip.iter().copied())
    }

    fn from_plan(plan: &LayerPlan, agreement: f64) -> Self {
        SkipSet {
            n_layers: plan.n_layers(),
            skip: (0..plan.n_layers()).filter(|&l| !plan.runs(l)).collect(),
            agreement,
        }
    }
}

/// How [`LayerSkipDrafter`] drafts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LayerSkipConfig {
    /// Longest draft.
    pub max_draft: usize,
    /// Initial confidence threshold τ: a draft ends before a token whose draft probability
    /// is below it.
    pub tau: f32,
    /// Acceptance rate τ steers towards: below it τ rises (shorter, surer drafts), above it τ
    /// falls.
    pub target_acceptance: f64,
    /// The skip-set search, when no set is given.
    pub search: SearchConfig,
}

impl Default for LayerSkipConfig {
    fn default() -> Self {
        LayerSkipConfig { max_draft: 8, tau: 0.5, target_acceptance: 0.8, search: SearchConfig::default() }
    }
}

/// The layer-skip drafter.
pub struct LayerSkipDrafter {
    config: LayerSkipConfig,
    n_layers: usize,
    search: Option<SkipSearch>,
    /// The drafting plan and its measured agreement.
    plan: Option<(LayerPlan, f64)>,
    tau: f32,
    /// Decayed sums of accepted and drafted tokens, for τ.
    accepted: f64,
    drafted: f64,
}

impl LayerSkipDrafter {
    /// A drafter for an `n_layers` target. With `known`, it drafts with that set from the
    /// first token; without, it searches first, valuing candidates with `cost`.
    pub fn new(
        n_layers: usize,
        config: LayerSkipConfig,
        known: Option<&SkipSet>,
        cost: CostModel,
    ) -> Result<Self> {
        let plan = match known {
            Some(set) if set.n_layers == n_layers => Some((set.plan()?, set.agreement)),
            Some(set) => {
                return Err(crate::Error::invalid(format!(
                    "the skip set is for a model of {} layers, this one has {n_layers}",
                    set.n_layers
                )));
            }
            None => None,
        };
        let search = match plan {
            Some(_) => None,
            None => Some(SkipSearch::new(n_layers, config.search.clone(), cost)?),
        };
        Ok(LayerSkipDrafter { tau: config.tau, config, n_layers, search, plan, accepted: 0.0, drafted: 0.0 })
    }

    /// The skip set drafted with (after the search, the best found); `None` while the search
    /// has not scored any candidate.
    pub fn skip_set(&self) -> Option<SkipSet> {
        self.plan.map(|(p, a)| SkipSet::from_plan(&p, a))
    }

    /// Whether the skip-set search is still running.
    pub fn searching(&self) -> bool {
        self.search.is_some()
    }

    /// Fraction of the layers a draft step runs (1 until a set is known).
    pub fn run_fraction(&self) -> f64 {
        self.plan.map_or(1.0, |(p, _)| p.count() as f64 / self.n_layers as f64)
    }

    /// The confidence threshold now.
    pub fn tau(&self) -> f32 {
        self.tau
    }

    /// Score one candidate over the last `window` verified tokens: a teacher-forced pass with
    /// `plan` over the tokens before the pending one, its argmax compared with what came
    /// next. `target` holds `context.len() - 1` tokens before and after; the scored positions
    /// are left with the candidate's partial KV, for the next full pass to recompute.
    fn score(target: &mut dyn Session, context: &[Token], plan: &LayerPlan, window: usize) -> Result<f64> {
        let held = context.len() - 1;
        let from = held - window;
        target.truncate(from)?;
        let logits = target.decode(&context[from..held], plan, Rows::Tail(window))?;
        let agree = (0..window).filter(|&i| argmax(logits.row(i)) == context[from + 1 + i]).count();
        Ok(agree as f64 / window as f64)
    }
}

/// The argmax of `logits` and its softmax probability.
fn top1(logits: &[f32]) -> (Token, f32) {
    let t = argmax(logits);
    let max = logits[t as usize];
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (t, if sum > 0.0 { 1.0 / sum } else { 0.0 })
}

/// Draft up to `max` tokens greedily with `plan`, starting from the pending token (the last
/// of `context`), stopping before a token whose probability is below `tau`.
pub(super) fn draft_greedy(
    session: &mut dyn Session,
    plan: &LayerPlan,
    pending: Token,
    max: usize,
    tau: f32,
    out: &mut Draft,
) -> Result<()> {
    let mut token = pending;
    while out.len() < max {
        let logits = session.decode(&[token], plan, Rows::Last)?;
        let (t, p) = top1(logits.last());
        if p < tau || out.push(t).is_err() {
            break;
        }
        token = t;
    }
    Ok(())
}

impl Drafter for LayerSkipDrafter {
    fn name(&self) -> &str {
        "layerskip"
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
        let held = context.len() - 1;
        let Some(&pending) = context.last() else { return Ok(()) };
        if let Some(search) = &mut self.search {
            let window = search.config().window;
            if held < window + 1 {
                // Too little verified text to score against yet: plain steps until there is.
                return Ok(());
            }
            let candidate = search.propose();
            let agreement = Self::score(target, context, &candidate, window)?;
            search.record(agreement);
            self.plan = search.best();
            if search.done() {
                self.search = None;
            }
            // Draft with the candidate just scored: its positions already have its KV, and
            // its acceptance is more evidence about it.
            return draft_greedy(target, &candidate, pending, max, 0.0, out);
        }
        let Some((plan, _)) = self.plan else { return Ok(()) };
        draft_greedy(target, &plan, pending, max, self.tau, out)
    }

    fn feedback(&mut self, drafted: &[Token], accepted: usize) {
        const DECAY: f64 = 0.9;
        self.accepted = self.accepted * DECAY + accepted as f64;
        self.drafted = self.drafted * DECAY + drafted.len() as f64;
        if self.search.is_some() || self.drafted <= 0.0 {
            return;
        }
        // Draft & Verify's adaptive threshold: surer drafts when too many are rejected.
        let step = 0.05;
        self.tau = if self.accepted / self.drafted < self.config.target_acceptance {
            (self.tau + step).min(0.95)
        } else {
            (self.tau - step).max(0.05)
        };
    }
}
