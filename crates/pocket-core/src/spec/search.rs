//! Searching for the layers a model can skip while drafting (after SWIFT, 2024).
//!
//! A candidate skip set is scored by its *agreement*: over the last few verified tokens,
//! how often the model with those layers skipped predicts the same next token as the full
//! model (one parallel pass, teacher-forced). Candidates come from random sets, mutations of
//! the best set so far, and, every few trials, a Bayesian proposal: a Gaussian process over
//! skip sets (kernel on Hamming distance) predicts agreement, and the candidate with the
//! highest upper confidence bound among a pool is tried. The number of skipped layers rises
//! while candidates reach the target agreement and falls after repeated misses. The search
//! is pure: it proposes plans and is told their agreement, so it is seeded and reproducible.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::cost::CostModel;
use crate::{LayerPlan, Result};

/// How [`SkipSearch`] searches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SearchConfig {
    /// Seed of the random proposals.
    pub seed: u64,
    /// Candidates tried before the search ends with the best one found.
    pub max_trials: usize,
    /// Agreement at which a skip set counts as good (SWIFT stops near 0.93).
    pub target_agreement: f64,
    /// Verified tokens each candidate is scored over.
    pub window: usize,
    /// Every this many trials, the candidate is a Bayesian proposal.
    pub bayes_every: usize,
    /// Fewest and most layers a candidate skips, as fractions of the model's layers.
    pub min_skip: f64,
    /// See `min_skip`.
    pub max_skip: f64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            seed: 0,
            max_trials: 32,
            target_agreement: 0.93,
            window: 32,
            bayes_every: 3,
            min_skip: 0.1,
            max_skip: 0.6,
        }
    }
}

/// One scored candidate.
#[derive(Debug, Clone, PartialEq)]
struct Trial {
    skip: Vec<bool>,
    agreement: f64,
    value: f64,
}

/// The on-the-fly skip-set search: [`SkipSearch::propose`], score, [`SkipSearch::record`],
/// until [`SkipSearch::done`].
#[derive(Debug, Clone)]
pub struct SkipSearch {
    config: SearchConfig,
    cost: CostModel,
    n_layers: usize,
    rng: ChaCha8Rng,
    trials: Vec<Trial>,
    /// How many layers the next random candidates skip.
    size: usize,
    misses: usize,
    pending: Option<Vec<bool>>,
}

/// Layers that are never skipped: the first and the last carry the embedding in and the
/// prediction out, and skipping them wrecks agreement in every model we tried.
fn skippable(n_layers: usize) -> std::ops::Range<usize> {
    1..n_layers.saturating_sub(1).max(1)
}

impl SkipSearch {
    /// A search over an `n_layers` model; `cost` values candidates by the speed-up their
    /// agreement and size would give on this device.
    pub fn new(n_layers: usize, config: SearchConfig, cost: CostModel) -> Result<Self> {
        LayerPlan::full(n_layers)?;
        let slots = skippable(n_layers).len();
        let lo = ((n_layers as f64 * config.min_skip).round() as usize).clamp(1, slots.max(1));
        Ok(SkipSearch {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            size: lo.max(((n_layers as f64) * 0.25).round() as usize).min(slots.max(1)),
            config,
            cost,
            n_layers,
            trials: Vec::new(),
            misses: 0,
            pending: None,
        })
    }

    /// The configuration searched with.
    pub fn config(&self) -> &SearchConfig {
        &self.config
    }

    /// Candidates scored so far.
    pub fn trials(&self) -> usize {
        self.trials.len()
    }

    /// Whether the search is over: the trial budget is spent, or a set skipping the most
    /// layers allowed reached the target agreement.
    pub fn done(&self) -> bool {
        self.trials.len() >= self.config.max_trials
            || self.best_trial().is_some_and(|t| {
                t.agreement >= self.config.target_agreement && count(&t.skip) >= self.max_size()
            })
    }

    /// The next candidate to score.
    pub fn propose(&mut self) -> LayerPlan {
        let n = self.trials.len();
        let skip = if n > 0 && self.config.bayes_every > 0 && (n + 1).is_multiple_of(self.config.bayes_every)
        {
            self.bayesian()
        } else if self.rng.random_bool(0.5) && self.best_trial().is_some() {
            self.mutate()
        } else {
            self.random(self.size)
        };
        let plan = to_plan(self.n_layers, &skip);
        self.pending = Some(skip);
        plan
    }

    /// The agreement the last proposed candidate scored.
    pub fn record(&mut self, agreement: f64) {
        let Some(skip) = self.pending.take() else { return };
        let run_fraction = 1.0 - count(&skip) as f64 / self.n_layers as f64;
        let value = self.cost.best_k(agreement, run_fraction, crate::spec::MAX_DRAFT).1;
        let good = agreement >= self.config.target_agreement;
        let size = count(&skip);
        self.trials.push(Trial { skip, agreement, value });
        if good && size >= self.size {
            self.size = (self.size + 1).min(self.max_size());
            self.misses = 0;
        } else if !good {
            self.misses += 1;
            if self.misses >= 3 {
                self.size = self.size.saturating_sub(1).max(self.min_size());
                self.misses = 0;
            }
        }
    }

    /// The best skip set so far (by expected speed-up, then agreement) and its agreement.
    pub fn best(&self) -> Option<(LayerPlan, f64)> {
        self.best_trial().map(|t| (to_plan(self.n_layers, &t.skip), t.agreement))
    }

    fn best_trial(&self) -> Option<&Trial> {
        self.trials
            .iter()
            .max_by(|a, b| a.value.total_cmp(&b.value).then(a.agreement.total_cmp(&b.agreement)))
    }

    fn min_size(&self) -> usize {
        ((self.n_layers as f64 * self.config.min_skip).round() as usize).clamp(1, self.max_size())
    }

    fn max_size(&self) -> usize {
        let slots = skippable(self.n_layers).len();
        ((self.n_layers as f64 * self.config.max_skip).round() as usize).clamp(1, slots.max(1))
    }

    fn random(&mut self, size: usize) -> Vec<bool> {
        let mut layers: Vec<usize> = skippable(self.n_layers).collect();
        layers.shuffle(&mut self.rng);
        let mut skip = vec![false; self.n_layers];
        for &l in layers.iter().take(size) {
            skip[l] = true;
        }
        skip
    }

    /// The best set with one skipped layer swapped for a run one, or one more layer skipped
    /// when the best already reaches the target.
    fn mutate(&mut self) -> Vec<bool> {
        let best = self.best_trial().cloned();
        let Some(best) = best else { return self.random(self.size) };
        let mut skip = best.skip;
        let (skipped, run): (Vec<usize>, Vec<usize>) = skippable(self.n_layers).partition(|&l| skip[l]);
        if run.is_empty() {
            return skip;
        }
        let add = run[self.rng.random_range(0..run.len())];
        skip[add] = true;
        let grow = best.agreement >= self.config.target_agreement && skipped.len() < self.max_size();
        if !grow && !skipped.is_empty() {
            skip[skipped[self.rng.random_range(0..skipped.len())]] = false;
        }
        skip
    }

    /// The pool candidate with the highest upper confidence bound of predicted value.
    fn bayesian(&mut self) -> Vec<bool> {
        let pool: Vec<Vec<bool>> =
            (0..64).map(|i| if i % 2 == 0 { self.random(self.size) } else { self.mutate() }).collect();
        let gp = Gp::fit(&self.trials, self.n_layers);
        pool.into_iter()
            .filter(|c| !self.trials.iter().any(|t| &t.skip == c))
            .map(|c| {
                let (mean, var) = gp.predict(&c);
                let run_fraction = 1.0 - count(&c) as f64 / self.n_layers as f64;
                let optimistic = (mean + var.sqrt()).clamp(0.0, 1.0);
                (self.cost.best_k(optimistic, run_fraction, crate::spec::MAX_DRAFT).1 + optimistic * 1e-3, c)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c)
            .unwrap_or_else(|| self.random(self.size))
    }
}

fn count(skip: &[bool]) -> usize {
    skip.iter().filter(|&&s| s).count()
}

fn to_plan(n_layers: usize, skip: &[bool]) -> LayerPlan {
    // Every index is below n_layers, which LayerPlan::new accepted in SkipSearch::new.
    LayerPlan::skipping(n_layers, (0..n_layers).filter(|&l| skip[l]))
        .unwrap_or_else(|_| LayerPlan::full(n_layers).expect("checked in SkipSearch::new"))
}

/// A Gaussian process over skip sets predicting agreement: kernel exp(−hamming / ℓ), noise
/// for the finite scoring window, prior mean at the trials' mean.
struct Gp {
    xs: Vec<Vec<bool>>,
    alpha: Vec<f64>,
    chol: Vec<Vec<f64>>,
    mean: f64,
    scale: f64,
}

impl Gp {
    const NOISE: f64 = 0.01;
    const SIGNAL: f64 = 0.05;

    fn kernel(&self, a: &[bool], b: &[bool]) -> f64 {
        let d = a.iter().zip(b).filter(|(x, y)| x != y).count() as f64;
        Self::SIGNAL * (-d / self.scale).exp()
    }

    fn fit(trials: &[Trial], n_layers: usize) -> Gp {
        let n = trials.len();
        let mean = if n == 0 { 0.5 } else { trials.iter().map(|t| t.agreement).sum::<f64>() / n as f64 };
        let mut gp = Gp {
            xs: trials.iter().map(|t| t.skip.clone()).collect(),
            alpha: Vec::new(),
            chol: Vec::new(),
            mean,
            scale: (n_layers as f64 / 4.0).max(1.0),
        };
        let k: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| gp.kernel(&gp.xs[i], &gp.xs[j]) + if i == j { Self::NOISE } else { 0.0 })
                    .collect()
            })
            .collect();
        gp.chol = cholesky(&k);
        let y: Vec<f64> = trials.iter().map(|t| t.agreement - mean).collect();
        gp.alpha = solve_upper(&gp.chol, &solve_lower(&gp.chol, &y));
        gp
    }

    fn predict(&self, x: &[bool]) -> (f64, f64) {
        let ks: Vec<f64> = self.xs.iter().map(|xi| self.kernel(x, xi)).collect();
        let mean = self.mean + ks.iter().zip(&self.alpha).map(|(a, b)| a * b).sum::<f64>();
        let v = solve_lower(&self.chol, &ks);
        let var = (Self::SIGNAL - v.iter().map(|x| x * x).sum::<f64>()).max(1e-9);
        (mean, var)
    }
}

/// Lower Cholesky factor of a symmetric positive definite matrix (the noise term keeps the
/// kernel matrix positive definite).
fn cholesky(a: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = a.len();
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            l[i][j] = if i == j { (a[i][i] - s).max(1e-12).sqrt() } else { (a[i][j] - s) / l[j][j] };
        }
    }
    l
}

fn solve_lower(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; b.len()];
    for i in 0..b.len() {
        x[i] = (b[i] - (0..i).map(|k| l[i][k] * x[k]).sum::<f64>()) / l[i][i];
    }
    x
}

fn solve_upper(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let n = b.len();
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = (b[i] - (i + 1..n).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic model: each layer has an importance; agreement falls with the importance
    /// skipped. Layers 10.. are cheap to skip.
    fn agreement(plan: &LayerPlan) -> f64 {
        let lost: f64 =
            (0..plan.n_layers()).filter(|&l| !plan.runs(l)).map(|l| if l >= 10 { 0.01 } else { 0.08 }).sum();
        (1.0 - lost).max(0.0)
    }

    fn run(seed: u64) -> (Vec<usize>, f64, usize) {
        let config = SearchConfig { seed, ..SearchConfig::default() };
        let mut s = SkipSearch::new(20, config, CostModel::linear(0.05)).unwrap();
        while !s.done() {
            let plan = s.propose();
            s.record(agreement(&plan));
        }
        let (plan, a) = s.best().unwrap();
        ((0..20).filter(|&l| !plan.runs(l)).collect(), a, s.trials())
    }

    #[test]
    fn reproducible_with_a_seed() {
        assert_eq!(run(5), run(5));
    }

    #[test]
    fn finds_the_cheap_layers() {
        let (skip, a, trials) = run(1);
        assert!(a >= 0.9, "agreement {a} for {skip:?}");
        assert!(skip.len() >= 5, "skipped only {skip:?} in {trials} trials");
        assert!(!skip.contains(&0) && !skip.contains(&19));
        // Most of what it skips is in the cheap half.
        assert!(skip.iter().filter(|&&l| l >= 10).count() * 2 > skip.len(), "{skip:?}");
    }

    #[test]
    fn gp_interpolates_seen_points() {
        let trials: Vec<Trial> =
            [(vec![true, false, false, false], 0.9), (vec![false, false, true, true], 0.3)]
                .into_iter()
                .map(|(skip, agreement)| Trial { skip, agreement, value: 0.0 })
                .collect();
        let gp = Gp::fit(&trials, 4);
        let (m0, v0) = gp.predict(&trials[0].skip);
        let (m1, _) = gp.predict(&trials[1].skip);
        assert!(m0 > m1, "{m0} {m1}");
        let (_, far) = gp.predict(&[false, true, false, false]);
        assert!(far > v0);
    }
}
