//! The device cost curve: how long one verification pass of `n` tokens takes relative to
//! plain decoding of one.
//!
//! Whether speculation pays depends on this curve: on a GPU a pass of 8 tokens costs about
//! as much as one, on a small CPU several times more. Speculative decoding picks drafters
//! and draft lengths from it, and the benchmark reports it, so both measure it here, with
//! nothing but the [`Session`] trait.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::{Error, LayerPlan, Result, Rows, Session, Token};

/// How [`measure_cost_curve`] measures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CostCurveConfig {
    /// The pass sizes `n` to time; `1` should be among them (it is the reference).
    pub sizes: Vec<usize>,
    /// The context length the passes start at: attention cost grows with it, so the curve
    /// is measured where generation typically runs, not at an empty cache.
    pub context: usize,
    /// Timed passes per size; the median is reported.
    pub repetitions: usize,
    /// Untimed rounds over all sizes first (caches, thread pools, graph allocation).
    pub warmup: usize,
}

impl Default for CostCurveConfig {
    fn default() -> Self {
        // Every size a default draft (up to 8 tokens) verifies, then coarser: ggml's tiled
        // matrix kernels work in blocks of rows, so the curve is not smooth (on this
        // project's CPU, 8 rows of Q8_0 weights cost less than 6).
        CostCurveConfig {
            sizes: vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16],
            context: 128,
            repetitions: 9,
            warmup: 2,
        }
    }
}

/// One point of the cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostPoint {
    /// Tokens in the pass (logits for all of them).
    pub n: usize,
    /// Median seconds of one pass.
    pub seconds: f64,
    /// `seconds` over the median of the smallest size measured (`n = 1` normally).
    pub relative: f64,
}

/// Measure the time of one full-plan [`Session::decode`] of `n` tokens with logits for all
/// `n` rows (`Rows::Tail(n)`: what verifying `n − 1` drafted tokens costs), for each size in
/// `config.sizes`, at a context of `config.context` tokens.
///
/// If the session holds fewer than `config.context` tokens, it is filled from `filler`
/// (repeated as needed); the passes also take their tokens from `filler`. After every pass
/// the session is truncated back, and at the end it holds what it held before. Sizes are
/// interleaved within each repetition so that a drifting machine affects all of them alike.
///
/// `cancelled` is asked before every pass: measuring runs while the machine is otherwise
/// idle, and gives way the moment it is not ([`Error::Cancelled`], the session restored).
///
/// Errors: an empty `filler` or `sizes`, a size of 0, zero repetitions, or a context that
/// cannot hold the largest pass are [`Error::InvalidArgument`]; engine errors pass through.
pub fn measure_cost_curve(
    session: &mut dyn Session,
    n_layers: usize,
    filler: &[Token],
    config: &CostCurveConfig,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<CostPoint>> {
    if filler.is_empty() {
        return Err(Error::invalid("the cost curve needs at least one filler token"));
    }
    if config.sizes.is_empty() || config.sizes.contains(&0) {
        return Err(Error::invalid(format!(
            "cost curve sizes must be a non-empty list of sizes >= 1, not {:?}",
            config.sizes
        )));
    }
    if config.repetitions == 0 {
        return Err(Error::invalid("the cost curve needs at least one repetition"));
    }
    let largest = config.sizes.iter().copied().max().unwrap_or(1);
    let n_ctx = session.config().n_ctx;
    let base = session.len().max(config.context);
    if base + largest > n_ctx {
        return Err(Error::ContextOverflow { needed: base + largest, limit: n_ctx, prompt: base });
    }
    let plan = LayerPlan::full(n_layers)?;
    let held = session.len();
    let cycle = |from: usize, n: usize| -> Vec<Token> {
        (from..from + n).map(|i| filler[i % filler.len()]).collect()
    };
    if held < base {
        session.decode(&cycle(held, base - held), &plan, Rows::None)?;
    }

    let result = time_sizes(session, &plan, base, config, &cycle, cancelled);
    // Leave the session as it was, whatever happened.
    let restored = session.truncate(held);
    let samples = result?;
    restored?;

    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let reference = config.sizes.iter().zip(&medians).min_by_key(|(n, _)| **n).map_or(0.0, |(_, s)| *s);
    Ok(config
        .sizes
        .iter()
        .zip(medians)
        .map(|(&n, seconds)| CostPoint {
            n,
            seconds,
            relative: if reference > 0.0 { seconds / reference } else { 0.0 },
        })
        .collect())
}

/// What a verification pass of `n` tokens costs relative to a plain decode step, from a
/// measured cost curve, and the speed-up a drafter can expect from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// `relative[n - 1]`: cost of a pass of `n` tokens, for n = 1..=MAX_DRAFT + 1.
    relative: Vec<f64>,
}

impl CostModel {
    /// The model of a measured curve: linear between measured sizes, extended along the
    /// last measured segment beyond them. A curve with fewer than two usable points is
    /// read as "every token costs a full step" (no speculation can pay), the safe reading.
    ///
    /// A larger pass may cost less than a smaller one (tiled kernels fill their tiles); the
    /// model keeps that, so a drafter can choose the cheaper, longer draft.
    pub fn from_curve(points: &[CostPoint]) -> Self {
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.n >= 1 && p.relative.is_finite() && p.relative > 0.0)
            .map(|p| (p.n as f64, p.relative))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts.dedup_by(|a, b| a.0 == b.0);
        let sizes = 1..=crate::spec::MAX_DRAFT + 1;
        if pts.len() < 2 {
            return CostModel { relative: sizes.map(|n| n as f64).collect() };
        }
        let at = |x: f64| {
            let i = pts.windows(2).position(|w| x <= w[1].0).unwrap_or(pts.len() - 2);
            let ((x0, y0), (x1, y1)) = (pts[i], pts[i + 1]);
            y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        };
        // Relative to n = 1; no pass is cheaper than a plain step.
        let one = at(1.0).max(f64::MIN_POSITIVE);
        let mut relative: Vec<f64> = sizes.map(|n| (at(n as f64) / one).max(1.0)).collect();
        relative[0] = 1.0;
        CostModel { relative }
    }

    /// A model where a pass of `n` costs `1 + slope·(n − 1)` steps (a GPU is near 0, a
    /// small CPU near 0.5); for tests and for devices not yet measured.
    pub fn linear(slope: f64) -> Self {
        CostModel { relative: (0..=crate::spec::MAX_DRAFT).map(|i| 1.0 + slope * i as f64).collect() }
    }

    /// Cost of a pass of `n` tokens in plain decode steps (`n` is clamped to the modelled
    /// range).
    pub fn pass(&self, n: usize) -> f64 {
        self.relative[n.clamp(1, self.relative.len()) - 1]
    }

    /// Expected decode speed relative to plain decoding when drafting `k` tokens, each
    /// accepted with probability `alpha`, at `draft_cost` steps per drafted token: tokens
    /// per pass over the cost of drafting and verifying.
    pub fn speedup(&self, alpha: f64, k: usize, draft_cost: f64) -> f64 {
        crate::spec::expected_tokens(alpha, k) / (self.pass(k + 1) + k as f64 * draft_cost.max(0.0))
    }

    /// The draft length up to `max_k` with the best [`CostModel::speedup`], and that
    /// speed-up; `(0, 1.0)` when no length beats plain decoding.
    pub fn best_k(&self, alpha: f64, draft_cost: f64, max_k: usize) -> (usize, f64) {
        (1..=max_k.min(crate::spec::MAX_DRAFT))
            .map(|k| (k, self.speedup(alpha, k, draft_cost)))
            .fold((0, 1.0), |best, c| if c.1 > best.1 { c } else { best })
    }

    /// For a draft whose i-th token is accepted (given all before it were) with probability
    /// `p[i]`: the length up to `p.len()` with the best expected speed-up (tokens per pass,
    /// the pending one and the target's own next token included, over the pass's cost), and
    /// that speed-up; `(0, 1.0)` when no length beats plain decoding.
    pub fn best_path(&self, p: &[f64]) -> (usize, f64) {
        let mut reach = [0.0; crate::spec::MAX_DRAFT];
        let mut r = 1.0;
        for (reach, &pi) in reach.iter_mut().zip(p) {
            r *= pi.clamp(0.0, 1.0);
            *reach = r;
        }
        self.best_tree(&reach[..p.len().min(crate::spec::MAX_DRAFT)])
    }

    /// For a draft of tokens each on the accepted path with probability `reach[i]` (a path's
    /// or a tree's, parents before children): the number of its first tokens with the best
    /// expected speed-up (tokens per pass: the target's own token, plus each drafted token's
    /// reach, over the pass's cost), and that speed-up; `(0, 1.0)` when none beats plain
    /// decoding.
    pub fn best_tree(&self, reach: &[f64]) -> (usize, f64) {
        let mut expected = 1.0;
        let mut best = (0, 1.0);
        for (i, &r) in reach.iter().take(crate::spec::MAX_DRAFT).enumerate() {
            expected += r.clamp(0.0, 1.0);
            let gain = expected / self.pass(i + 2);
            if gain > best.1 {
                best = (i + 1, gain);
            }
        }
        best
    }
}

/// The timed passes: `samples[i]` holds the seconds of each pass of `config.sizes[i]`.
fn time_sizes(
    session: &mut dyn Session,
    plan: &LayerPlan,
    base: usize,
    config: &CostCurveConfig,
    cycle: &dyn Fn(usize, usize) -> Vec<Token>,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Vec<f64>>> {
    let batches: Vec<Vec<Token>> = config.sizes.iter().map(|&n| cycle(base, n)).collect();
    let mut samples = vec![Vec::with_capacity(config.repetitions); config.sizes.len()];
    for round in 0..config.warmup + config.repetitions {
        for (i, batch) in batches.iter().enumerate() {
            if cancelled() {
                return Err(Error::Cancelled);
            }
            let start = Instant::now();
            session.decode(batch, plan, Rows::Tail(batch.len()))?;
            let seconds = start.elapsed().as_secs_f64();
            session.truncate(base)?;
            if round >= config.warmup {
                samples[i].push(seconds);
            }
        }
    }
    Ok(samples)
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeSession;

    #[test]
    fn cost_model_interpolates_and_picks_draft_lengths() {
        let pt = |n, relative| CostPoint { n, seconds: 0.0, relative };
        let m = CostModel::from_curve(&[pt(1, 1.0), pt(2, 2.0), pt(4, 2.5), pt(8, 4.0)]);
        assert_eq!(m.pass(1), 1.0);
        assert_eq!(m.pass(3), 2.25);
        assert_eq!(m.pass(12), 5.5);
        // A flat curve pays for long drafts; a steep one only with high acceptance.
        let flat = CostModel::linear(0.0);
        assert_eq!(flat.best_k(0.8, 0.0, 16).0, 16);
        let steep = CostModel::linear(1.0);
        assert_eq!(steep.best_k(0.9, 0.0, 16), (0, 1.0));
        let (k, gain) = m.best_k(0.95, 0.0, 16);
        assert!(k > 2 && gain > 1.3, "{k} {gain}");
        assert!(CostModel::from_curve(&[]).best_k(0.99, 0.0, 16).0 == 0);
        // A path of equal probabilities is sized as best_k sizes it; a sure prefix then a
        // doubtful branch stops at the branch on a steep curve.
        for (curve, alpha) in [(&flat, 0.8), (&steep, 0.9), (&CostModel::linear(0.3), 0.85)] {
            let (k, gain) = curve.best_k(alpha, 0.0, 16);
            let (pk, pgain) = curve.best_path(&[alpha; 16]);
            assert_eq!(k, pk);
            assert!((gain - pgain).abs() < 1e-9);
        }
        let mid = CostModel::linear(0.3);
        assert_eq!(mid.best_path(&[1.0, 1.0, 1.0, 0.1, 1.0]).0, 3);
        assert_eq!(mid.best_path(&[]), (0, 1.0));
    }

    #[test]
    fn fills_the_context_times_every_size_and_restores_the_session() {
        let mut s = FakeSession::new(64);
        s.tokens = vec![3, 3];
        let config = CostCurveConfig { sizes: vec![1, 2, 4], context: 10, repetitions: 3, warmup: 1 };
        let curve = measure_cost_curve(&mut s, 2, &[0, 1, 2], &config, &|| false).unwrap();
        assert_eq!(curve.iter().map(|p| p.n).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(curve[0].relative, 1.0);
        assert!(curve.iter().all(|p| p.seconds >= 0.0));
        // Every pass runs the full model.
        assert!(s.calls.iter().all(|c| c.3));
        // The filler continues from the tokens held; the session is back as it was.
        assert_eq!((s.calls[0].0, s.calls[0].1.len(), s.calls[0].2), (2, 8, Rows::None));
        assert_eq!(s.tokens, vec![3, 3]);
        // (warmup + repetitions) rounds of every size, each at the context position, all rows.
        let passes = &s.calls[1..];
        assert_eq!(passes.len(), 4 * 3);
        for (i, (at, tokens, rows, _)) in passes.iter().enumerate() {
            let (at, n, rows) = (*at, tokens.len(), *rows);
            assert_eq!(at, 10);
            assert_eq!(n, config.sizes[i % 3]);
            assert_eq!(rows, Rows::Tail(n));
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let never = || false;
        let mut s = FakeSession::new(32);
        let ok = CostCurveConfig::default();
        assert!(measure_cost_curve(&mut s, 2, &[], &ok, &never).is_err());
        // 128 + 16 tokens do not fit a context of 32.
        assert!(matches!(
            measure_cost_curve(&mut s, 2, &[1], &ok, &never),
            Err(Error::ContextOverflow { .. })
        ));
        let zero = CostCurveConfig { sizes: vec![1, 0], context: 4, ..ok.clone() };
        assert!(measure_cost_curve(&mut s, 2, &[1], &zero, &never).is_err());
        let none = CostCurveConfig { repetitions: 0, context: 4, ..ok };
        assert!(measure_cost_curve(&mut s, 2, &[1], &none, &never).is_err());
        assert!(s.calls.is_empty());
    }

    #[test]
    fn a_cancelled_measurement_stops_before_its_next_pass_and_restores_the_session() {
        let mut s = FakeSession::new(64);
        s.tokens = vec![3];
        let config = CostCurveConfig { sizes: vec![1, 2], context: 8, repetitions: 3, warmup: 0 };
        let passes = std::cell::Cell::new(0);
        let result = measure_cost_curve(&mut s, 2, &[0, 1], &config, &|| {
            passes.set(passes.get() + 1);
            passes.get() > 3
        });
        assert_eq!(result, Err(Error::Cancelled));
        // The fill, then three timed passes before the fourth was refused.
        assert_eq!(s.calls.len(), 1 + 3);
        assert_eq!(s.tokens, vec![3]);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
