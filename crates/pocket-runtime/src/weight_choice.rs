//! `--weights auto`: whether speculation should run on the model's matrices as stored or
//! widened to Q8_0, from the cost curves measured for both on this device.
//!
//! Widened weights make plain steps slower where decoding is bound by memory bandwidth (on
//! this project's CPU, SmolLM2 took 7.3 ms in Q8_0 against 7.1 in Q4_1, and the 1.5B 50 ms
//! against 37) but verification passes cheaper (8 tokens of SmolLM2 for 3.0 steps against
//! 4.1); where no drafts are made the stored format is faster, so it must win by the
//! plain-step ratio to be chosen. The choice is made from what is known only — `pocket tune`
//! measures both curves — so a request never pays for measuring them.

use pocket_core::KvType;
use pocket_core::cost::{CostModel, CostPoint};
use pocket_core::spec::SpecMode;
use pocket_ggml::WeightFormat;
use serde::Serialize;

use crate::{Engine, LoadedModel};

/// Acceptance assumed when comparing weight formats: drafts are only made where a drafter
/// expects them to be accepted, and this is about what the suffix drafter's accepted drafts
/// reach on the sample workload (85–95%), rounded down.
pub const REFERENCE_ACCEPTANCE: f64 = 0.8;

/// How a weight format would serve speculation on this device, from its cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WeightsEstimate {
    /// The format.
    #[serde(serialize_with = "format_name")]
    pub weights: WeightFormat,
    /// Seconds of a plain decode step.
    pub step_seconds: f64,
    /// Tokens per second while drafting at [`REFERENCE_ACCEPTANCE`] with the best draft length
    /// of its curve.
    pub drafting_tok_per_s: f64,
}

fn format_name<S: serde::Serializer>(w: &WeightFormat, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(w.name())
}

impl WeightsEstimate {
    /// The estimate from a measured curve (`None` if it has no `n = 1` point).
    pub fn from_curve(weights: WeightFormat, curve: &[CostPoint]) -> Option<Self> {
        let step_seconds = curve.iter().find(|p| p.n == 1).map(|p| p.seconds).filter(|s| *s > 0.0)?;
        let cost = CostModel::from_curve(curve);
        let (_, speedup) = cost.best_k(REFERENCE_ACCEPTANCE, 0.0, pocket_core::spec::MAX_DRAFT);
        Some(WeightsEstimate { weights, step_seconds, drafting_tok_per_s: speedup / step_seconds })
    }
}

/// The weight format speculation should run on: the one whose measured curve serves drafted
/// steps fastest, as long as that beats the stored format by more than its slower plain
/// steps lose.
pub fn choose_weights(estimates: &[WeightsEstimate]) -> WeightFormat {
    let stored = estimates.iter().find(|e| e.weights == WeightFormat::AsStored);
    let Some(stored) = stored else { return WeightFormat::AsStored };
    estimates
        .iter()
        .filter(|e| e.weights != WeightFormat::AsStored)
        .filter(|e| {
            let plain_loss = e.step_seconds / stored.step_seconds;
            e.drafting_tok_per_s > stored.drafting_tok_per_s * plain_loss.max(1.0)
        })
        .max_by(|a, b| a.drafting_tok_per_s.total_cmp(&b.drafting_tok_per_s))
        .map_or(WeightFormat::AsStored, |e| e.weights)
}

/// The formats worth measuring for `model` as loaded (as stored): the stored one, and Q8_0
/// where ggml runs it on the CPU.
pub fn candidates(model: &LoadedModel) -> Vec<WeightFormat> {
    let mut formats = vec![WeightFormat::AsStored];
    if model.engine() == Engine::Ggml && !model.on_gpu() {
        formats.push(WeightFormat::Q8_0);
    }
    formats
}

/// What `--weights auto` chooses for `model` (loaded as stored) speculating with `spec` in
/// sessions of `threads` threads and a `kv` cache: the format, and the estimates it was chosen
/// from — empty when there was nothing to choose (plain decoding, a GPU, another engine) or
/// the curves are not both measured yet, which keeps the stored format.
pub fn auto_weights(
    model: &LoadedModel,
    spec: SpecMode,
    threads: usize,
    kv: KvType,
) -> (WeightFormat, Vec<WeightsEstimate>) {
    let formats = candidates(model);
    if spec == SpecMode::Off || formats.len() < 2 {
        return (WeightFormat::AsStored, Vec::new());
    }
    let mut estimates = Vec::new();
    for w in formats {
        let curve = model.knowledge().for_weights(w.name()).cost_curve(threads, kv);
        match curve.and_then(|c| WeightsEstimate::from_curve(w, &c)) {
            Some(e) => estimates.push(e),
            None => return (WeightFormat::AsStored, Vec::new()),
        }
    }
    (choose_weights(&estimates), estimates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(weights: WeightFormat, step_ms: f64, relative: &[(usize, f64)]) -> WeightsEstimate {
        let curve: Vec<CostPoint> = relative
            .iter()
            .map(|&(n, r)| CostPoint { n, seconds: step_ms * 1e-3 * r, relative: r })
            .collect();
        WeightsEstimate::from_curve(weights, &curve).unwrap()
    }

    #[test]
    fn widened_weights_are_chosen_only_when_their_flatter_curve_outweighs_slower_steps() {
        // This project's CPU: Q4_1 steep, Q8_0 flat from 4 to 8 rows, steps 8% slower.
        let stored = estimate(WeightFormat::AsStored, 6.5, &[(1, 1.0), (2, 2.1), (4, 2.9), (8, 4.4)]);
        let wide = estimate(WeightFormat::Q8_0, 7.1, &[(1, 1.0), (2, 2.6), (4, 3.1), (8, 3.3)]);
        assert_eq!(choose_weights(&[stored, wide]), WeightFormat::Q8_0);
        // A GPU: both flat, the stored format's steps faster.
        let stored = estimate(WeightFormat::AsStored, 2.0, &[(1, 1.0), (8, 1.1)]);
        let wide = estimate(WeightFormat::Q8_0, 2.4, &[(1, 1.0), (8, 1.05)]);
        assert_eq!(choose_weights(&[stored, wide]), WeightFormat::AsStored);
        // Nothing to compare with: stored.
        assert_eq!(choose_weights(&[wide]), WeightFormat::AsStored);
        assert_eq!(choose_weights(&[]), WeightFormat::AsStored);
    }
}
