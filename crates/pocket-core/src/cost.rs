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
        CostCurveConfig { sizes: vec![1, 2, 4, 8, 16], context: 128, repetitions: 9, warmup: 2 }
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
/// Errors: an empty `filler` or `sizes`, a size of 0, zero repetitions, or a context that
/// cannot hold the largest pass are [`Error::InvalidArgument`]; engine errors pass through.
pub fn measure_cost_curve(
    session: &mut dyn Session,
    n_layers: usize,
    filler: &[Token],
    config: &CostCurveConfig,
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

    let result = time_sizes(session, &plan, base, config, &cycle);
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

/// The timed passes: `samples[i]` holds the seconds of each pass of `config.sizes[i]`.
fn time_sizes(
    session: &mut dyn Session,
    plan: &LayerPlan,
    base: usize,
    config: &CostCurveConfig,
    cycle: &dyn Fn(usize, usize) -> Vec<Token>,
) -> Result<Vec<Vec<f64>>> {
    let batches: Vec<Vec<Token>> = config.sizes.iter().map(|&n| cycle(base, n)).collect();
    let mut samples = vec![Vec::with_capacity(config.repetitions); config.sizes.len()];
    for round in 0..config.warmup + config.repetitions {
        for (i, batch) in batches.iter().enumerate() {
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
    use crate::{Logits, SessionConfig};

    const V: usize = 4;

    /// Records every decode; logits are zeros.
    struct Recorder {
        config: SessionConfig,
        tokens: Vec<Token>,
        logits: Vec<f32>,
        calls: Vec<(usize, usize, Rows)>,
    }

    impl Recorder {
        fn new(n_ctx: usize) -> Self {
            Recorder {
                config: SessionConfig { n_ctx, ..SessionConfig::default() },
                tokens: Vec::new(),
                logits: Vec::new(),
                calls: Vec::new(),
            }
        }
    }

    impl Session for Recorder {
        fn len(&self) -> usize {
            self.tokens.len()
        }

        fn config(&self) -> &SessionConfig {
            &self.config
        }

        fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> Result<Logits<'_>> {
            assert!(plan.is_full());
            self.calls.push((self.tokens.len(), tokens.len(), rows));
            self.tokens.extend_from_slice(tokens);
            self.logits = vec![0.0; rows.count(tokens.len())? * V];
            Ok(Logits::new(&self.logits, V))
        }

        fn truncate(&mut self, len: usize) -> Result<()> {
            self.tokens.truncate(len);
            Ok(())
        }

        fn memory(&self) -> u64 {
            0
        }
    }

    #[test]
    fn fills_the_context_times_every_size_and_restores_the_session() {
        let mut s = Recorder::new(64);
        s.tokens = vec![3, 3];
        let config = CostCurveConfig { sizes: vec![1, 2, 4], context: 10, repetitions: 3, warmup: 1 };
        let curve = measure_cost_curve(&mut s, 2, &[0, 1, 2], &config).unwrap();
        assert_eq!(curve.iter().map(|p| p.n).collect::<Vec<_>>(), vec![1, 2, 4]);
        assert_eq!(curve[0].relative, 1.0);
        assert!(curve.iter().all(|p| p.seconds >= 0.0));
        // The filler continues from the tokens held; the session is back as it was.
        assert_eq!(s.calls[0], (2, 8, Rows::None));
        assert_eq!(s.tokens, vec![3, 3]);
        // (warmup + repetitions) rounds of every size, each at the context position, all rows.
        let passes = &s.calls[1..];
        assert_eq!(passes.len(), 4 * 3);
        for (i, &(at, n, rows)) in passes.iter().enumerate() {
            assert_eq!(at, 10);
            assert_eq!(n, config.sizes[i % 3]);
            assert_eq!(rows, Rows::Tail(n));
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut s = Recorder::new(32);
        let ok = CostCurveConfig::default();
        assert!(measure_cost_curve(&mut s, 2, &[], &ok).is_err());
        // 128 + 16 tokens do not fit a context of 32.
        assert!(matches!(measure_cost_curve(&mut s, 2, &[1], &ok), Err(Error::ContextOverflow { .. })));
        let zero = CostCurveConfig { sizes: vec![1, 0], context: 4, ..ok.clone() };
        assert!(measure_cost_curve(&mut s, 2, &[1], &zero).is_err());
        let none = CostCurveConfig { repetitions: 0, context: 4, ..ok };
        assert!(measure_cost_curve(&mut s, 2, &[1], &none).is_err());
        assert!(s.calls.is_empty());
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
