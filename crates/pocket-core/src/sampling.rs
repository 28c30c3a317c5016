//! Turning a row of logits into the next token.
//!
//! The pipeline follows llama.cpp's order: repetition penalty → (greedy: argmax) → top-k →
//! temperature → softmax → top-p → min-p → draw. Speculative sampling needs the processed
//! distribution itself (it accepts a draft token with probability min(1, p/q) and resamples
//! from norm(max(0, p − q))), so [`Sampler::distribution`] and [`Sampler::draw`] expose the
//! two halves of [`Sampler::sample`].

use std::cmp::Ordering;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{Error, Result, Token};

/// How the next token is chosen from the logits.
///
/// The default is greedy decoding (temperature 0) with every filter off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingConfig {
    /// Divides the logits before the softmax; 0 means greedy (always the argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Penalty for tokens seen in the last `repeat_last_n` tokens (positive logits are
    /// divided by it, negative ones multiplied); 1 = off.
    pub repetition_penalty: f32,
    /// How many of the most recent tokens (prompt included) the repetition penalty looks
    /// at; 0 = off.
    pub repeat_last_n: usize,
    /// Seed of the random generator: the same seed, logits and history give the same tokens.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingConfig {
    /// Check every value against its allowed range; the error names each bad value.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            problems.push(format!(
                "temperature must be a finite number >= 0 (0 = greedy), not {}",
                self.temperature
            ));
        }
        // Written so that NaN fails each check.
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            problems.push(format!("top_p must be in (0, 1] (1 = off), not {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            problems.push(format!("min_p must be in [0, 1) (0 = off), not {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            problems.push(format!(
                "repetition_penalty must be a finite number > 0 (1 = off), not {}",
                self.repetition_penalty
            ));
        }
        if problems.is_empty() { Ok(()) } else { Err(Error::invalid(problems.join("; "))) }
    }

    /// Whether sampling always picks the (penalised) argmax: temperature 0, or top-k 1.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    fn penalises(&self) -> bool {
        self.repetition_penalty != 1.0 && self.repeat_last_n > 0
    }
}

/// A probability distribution over tokens: `(token, probability)` pairs in no particular
/// order, tokens distinct.
///
/// [`Sampler::distribution`] fills one (its probabilities sum to 1, zero-probability tokens
/// left out). Speculative sampling also builds its own, e.g. the residual max(0, p − q),
/// with [`Distribution::push`]; [`Sampler::draw`] accepts unnormalised weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Distribution {
    entries: Vec<(Token, f32)>,
}

impl Distribution {
    /// An empty distribution.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `(token, probability)` pairs.
    pub fn entries(&self) -> &[(Token, f32)] {
        &self.entries
    }

    /// Number of tokens with an entry.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no token has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The probability of `token` (0 if it has no entry). A linear scan.
    pub fn prob(&self, token: Token) -> f32 {
        self.entries.iter().find(|e| e.0 == token).map_or(0.0, |e| e.1)
    }

    /// Remove every entry, keeping the buffer.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Add an entry; the caller keeps tokens distinct.
    pub fn push(&mut self, token: Token, weight: f32) {
        self.entries.push((token, weight));
    }

    /// Scale the weights so that they sum to 1 (nothing happens if they sum to 0).
    pub fn normalize(&mut self) {
        normalize(&mut self.entries);
    }
}

/// The token with the largest logit; the lowest id among equal ones. NaN logits are never
/// chosen; 0 for an empty slice.
pub fn argmax(logits: &[f32]) -> Token {
    best(logits.iter().enumerate().map(|(i, &l)| (i as Token, l)))
}

fn best(candidates: impl Iterator<Item = (Token, f32)>) -> Token {
    let mut best: Option<(Token, f32)> = None;
    for (t, l) in candidates {
        let better = match best {
            None => !l.is_nan(),
            Some((_, b)) => l > b,
        };
        if better {
            best = Some((t, l));
        }
    }
    best.map_or(0, |b| b.0)
}

/// Larger value first, then lower id: a total order, so that selection is deterministic
/// (values are never NaN here; see `Sampler::distribution`).
fn descending(a: &(Token, f32), b: &(Token, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn normalize(entries: &mut [(Token, f32)]) {
    let sum: f64 = entries.iter().map(|e| f64::from(e.1)).sum();
    if sum > 0.0 && sum.is_finite() {
        for e in entries {
            e.1 = (f64::from(e.1) / sum) as f32;
        }
    }
}

/// Top-p grows the sorted prefix in chunks: the kept set is usually small, so sorting the
/// whole vocabulary would be wasted.
const TOP_P_CHUNK: usize = 64;

/// Chooses tokens under a [`SamplingConfig`], with its own seeded random generator.
///
/// Its buffers are reused: after the first call with the largest vocabulary, sampling does
/// not allocate.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplingConfig,
    rng: ChaCha8Rng,
    dist: Distribution,
    seen: Vec<Token>,
}

impl Sampler {
    /// A sampler for `config`, which must be valid (see [`SamplingConfig::validate`]).
    pub fn new(config: SamplingConfig) -> Result<Self> {
        config.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            dist: Distribution::new(),
            seen: Vec::new(),
        })
    }

    /// The configuration this sampler follows.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// The next token after `history` (prompt and generated tokens so far), given the
    /// `logits` of the last position.
    pub fn sample(&mut self, logits: &[f32], history: &[Token]) -> Token {
        if self.config.is_greedy() && !self.config.penalises() {
            return argmax(logits);
        }
        let mut dist = std::mem::take(&mut self.dist);
        self.distribution(logits, history, &mut dist);
        // A greedy distribution is one token: drawing it would only spend randomness.
        let token =
            if self.config.is_greedy() { dist.entries.first().map_or(0, |e| e.0) } else { self.draw(&dist) };
        self.dist = dist;
        token
    }

    /// The distribution [`Sampler::sample`] draws from, written into `out`: every filter
    /// applied, probabilities summing to 1. For a greedy config, the argmax with
    /// probability 1.
    pub fn distribution(&mut self, logits: &[f32], history: &[Token], out: &mut Distribution) {
        let c = &self.config;
        let e = &mut out.entries;
        e.clear();
        // NaN would break the total order that selection relies on; an engine producing it
        // gets a token that is never chosen rather than a panic.
        e.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as Token, if l.is_nan() { f32::NEG_INFINITY } else { l })),
        );
        if c.penalises() {
            penalise(e, &mut self.seen, history, c.repeat_last_n, c.repetition_penalty);
        }
        if e.is_empty() {
            return;
        }
        if c.is_greedy() {
            let t = best(e.iter().copied());
            e.clear();
            e.push((t, 1.0));
            return;
        }

        // `e[..sorted]` holds the largest entries in descending order.
        let mut sorted = 0;
        if c.top_k > 0 && c.top_k < e.len() {
            e.select_nth_unstable_by(c.top_k - 1, descending);
            e.truncate(c.top_k);
            e.sort_unstable_by(descending);
            sorted = e.len();
        }
        for x in e.iter_mut() {
            x.1 /= c.temperature;
        }
        softmax(e);
        if c.top_p < 1.0 {
            top_p(e, &mut sorted, c.top_p);
        }
        if c.min_p > 0.0 {
            let max = if sorted > 0 { e[0].1 } else { e.iter().fold(0.0, |m, x| x.1.max(m)) };
            let threshold = c.min_p * max;
            e.retain(|x| x.1 >= threshold);
        }
        e.retain(|x| x.1 > 0.0);
        normalize(e);
    }

    /// A uniform number in [0, 1) from this sampler's generator (speculative sampling's
    /// acceptance test draws from the same stream as the tokens, so a seed fixes both).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Draw a token from `dist` with this sampler's generator. The weights need not be
    /// normalised; negative ones count as 0. An empty or all-zero distribution gives its
    /// first token (0 if it has none).
    pub fn draw(&mut self, dist: &Distribution) -> Token {
        let weight = |w: f32| f64::from(w.max(0.0));
        let total: f64 = dist.entries.iter().map(|e| weight(e.1)).sum();
        let Some(&(first, _)) = dist.entries.first() else {
            return 0;
        };
        if !(total > 0.0 && total.is_finite()) {
            return first;
        }
        let u = self.rng.random::<f64>() * total;
        let mut acc = 0.0;
        let mut last = first;
        for &(t, w) in &dist.entries {
            if w > 0.0 {
                acc += weight(w);
                last = t;
                if u < acc {
                    return t;
                }
            }
        }
        // Only reachable through rounding of `u` up to `total`.
        last
    }
}

/// CTRL-style repetition penalty over the distinct tokens in the last `n` of `history`.
/// `e` is in token order, so `e[t]` is token `t`.
fn penalise(e: &mut [(Token, f32)], seen: &mut Vec<Token>, history: &[Token], n: usize, p: f32) {
    seen.clear();
    seen.extend_from_slice(&history[history.len().saturating_sub(n)..]);
    seen.sort_unstable();
    seen.dedup();
    for &t in seen.iter() {
        if let Some(x) = e.get_mut(t as usize) {
            x.1 = if x.1 > 0.0 { x.1 / p } else { x.1 * p };
        }
    }
}

/// Logits to probabilities in place.
fn softmax(e: &mut [(Token, f32)]) {
    let max = e.iter().fold(f32::NEG_INFINITY, |m, x| x.1.max(m));
    // exp(l - max) is NaN when max is infinite: then the tokens at max share the mass
    // (every token when all are -inf).
    let infinite = max.is_infinite();
    for x in e.iter_mut() {
        x.1 = if infinite { if x.1 == max { 1.0 } else { 0.0 } } else { (x.1 - max).exp() };
    }
    normalize(e);
}

/// Keep the shortest prefix (in descending probability) whose mass reaches `p`.
fn top_p(e: &mut Vec<(Token, f32)>, sorted: &mut usize, p: f32) {
    let p = f64::from(p);
    let mut cum = 0.0;
    let mut i = 0;
    loop {
        while i < *sorted {
            cum += f64::from(e[i].1);
            i += 1;
            if cum >= p {
                e.truncate(i);
                *sorted = i;
                return;
            }
        }
        if *sorted == e.len() {
            return;
        }
        let rest = &mut e[*sorted..];
        let chunk = (*sorted).max(TOP_P_CHUNK).min(rest.len());
        if chunk < rest.len() {
            rest.select_nth_unstable_by(chunk - 1, descending);
        }
        rest[..chunk].sort_unstable_by(descending);
        *sorted += chunk;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(config: SamplingConfig) -> Sampler {
        Sampler::new(config).unwrap()
    }

    fn temp(t: f32) -> SamplingConfig {
        SamplingConfig { temperature: t, seed: 7, ..SamplingConfig::default() }
    }

    fn dist_of(s: &mut Sampler, logits: &[f32], history: &[Token]) -> Vec<(Token, f32)> {
        let mut d = Distribution::new();
        s.distribution(logits, history, &mut d);
        let mut v = d.entries().to_vec();
        v.sort_by_key(|e| e.0);
        v
    }

    fn assert_probs(got: &[(Token, f32)], want: &[(Token, f32)]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.0, w.0, "{got:?} vs {want:?}");
            assert!((g.1 - w.1).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn argmax_picks_lowest_id_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[0.1, 3.0, -2.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = sampler(SamplingConfig::default());
        let logits = [0.5, -1.0, 2.5, 2.5, 1.0];
        for _ in 0..10 {
            assert_eq!(s.sample(&logits, &[0, 1]), 2);
        }
        assert_eq!(dist_of(&mut s, &logits, &[]), vec![(2, 1.0)]);
    }

    fn golden(config: SamplingConfig, history: &[Token]) -> Vec<Token> {
        let logits = [1.0, 2.0, 0.5, 3.0, -1.0, 2.5];
        let mut s = sampler(config.clone());
        let got: Vec<Token> = (0..16).map(|_| s.sample(&logits, history)).collect();
        // The same seed replays the same sequence.
        let mut again = sampler(config);
        let replay: Vec<Token> = (0..16).map(|_| again.sample(&logits, history)).collect();
        assert_eq!(replay, got);
        got
    }

    // Pinned: a change here changes every seeded output users have seen.
    #[test]
    fn golden_tokens_for_a_fixed_seed() {
        let config = SamplingConfig { temperature: 0.8, seed: 42, ..SamplingConfig::default() };
        assert_eq!(golden(config, &[]), [3, 5, 3, 3, 3, 1, 3, 5, 5, 3, 3, 5, 5, 3, 5, 1]);
        let filtered = SamplingConfig {
            temperature: 1.3,
            top_k: 5,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.3,
            repeat_last_n: 8,
            seed: 1234,
        };
        // Penalised: 3 → 2.31, 5 → 1.92; top-k drops token 4; top-p and min-p keep the other
        // five (the four largest carry 0.92 < 0.95). Token 4 must never appear.
        assert_eq!(golden(filtered, &[3, 3, 5]), [1, 2, 5, 3, 3, 1, 5, 3, 2, 3, 5, 1, 3, 3, 3, 0]);
    }

    #[test]
    fn top_k_1_is_greedy() {
        let logits = [0.3, 1.7, -0.2, 1.6, 0.9];
        let config = SamplingConfig { temperature: 1.5, top_k: 1, ..temp(1.0) };
        for seed in 0..20 {
            let mut s = sampler(SamplingConfig { seed, ..config.clone() });
            assert_eq!(s.sample(&logits, &[]), argmax(&logits));
        }
        // Also through the filter itself, with a temperature that would otherwise sample.
        let mut s = sampler(SamplingConfig { top_k: 2, ..config });
        let d = dist_of(&mut s, &logits, &[]);
        assert_eq!(d.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn top_k_keeps_the_k_largest() {
        // Ties at the cut go to the lower id.
        let logits = [1.0, 4.0, 2.0, 4.0, 2.0, 0.0];
        let mut s = sampler(SamplingConfig { top_k: 3, ..temp(1.0) });
        let d = dist_of(&mut s, &logits, &[]);
        assert_eq!(d.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    }

    #[test]
    fn top_p_cuts_at_the_first_prefix_reaching_p() {
        // ln of 0.5, 0.25, 0.15, 0.1: softmax gives back exactly those probabilities.
        let logits = [0.5f32.ln(), 0.25f32.ln(), 0.15f32.ln(), 0.1f32.ln()];
        // Cumulative: 0.5, 0.75, 0.90, 1.0. p = 0.7 is first reached at 0.75: {0, 1},
        // renormalised to 0.5/0.75 and 0.25/0.75.
        let mut s = sampler(SamplingConfig { top_p: 0.7, ..temp(1.0) });
        assert_probs(&dist_of(&mut s, &logits, &[]), &[(0, 2.0 / 3.0), (1, 1.0 / 3.0)]);
        // p = 0.8 needs the third token: 0.5/0.9, 0.25/0.9, 0.15/0.9.
        let mut s = sampler(SamplingConfig { top_p: 0.8, ..temp(1.0) });
        assert_probs(&dist_of(&mut s, &logits, &[]), &[(0, 0.5 / 0.9), (1, 0.25 / 0.9), (2, 0.15 / 0.9)]);
        // p = 0.4 keeps the most likely token alone.
        let mut s = sampler(SamplingConfig { top_p: 0.4, ..temp(1.0) });
        assert_probs(&dist_of(&mut s, &logits, &[]), &[(0, 1.0)]);
    }

    #[test]
    fn top_p_over_a_large_vocabulary_grows_its_sorted_prefix() {
        // 1000 tokens with logits 0..1000 scaled so the top 200 carry most mass: the kept
        // set crosses several chunks. Check against a full sort.
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
        let mut s = sampler(SamplingConfig { top_p: 0.95, ..temp(1.0) });
        let got = dist_of(&mut s, &logits, &[]);

        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let mut probs: Vec<(Token, f64)> =
            logits.iter().enumerate().map(|(i, &l)| (i as Token, f64::from((l - max).exp()) / sum)).collect();
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut cum = 0.0;
        let keep = probs
            .iter()
            .position(|p| {
                cum += p.1;
                cum >= 0.95
            })
            .unwrap()
            + 1;
        assert!(keep > 2 * TOP_P_CHUNK, "the example should cross chunks, keeps {keep}");
        let mut want: Vec<Token> = probs[..keep].iter().map(|p| p.0).collect();
        want.sort();
        assert_eq!(got.iter().map(|e| e.0).collect::<Vec<_>>(), want);
    }

    #[test]
    fn min_p_cuts_relative_to_the_most_likely() {
        // Probabilities 0.5, 0.25, 0.15, 0.1. min_p = 0.29: threshold 0.29 * 0.5 = 0.145,
        // so 0.15 stays and 0.1 goes; renormalised over 0.9.
        let logits = [0.5f32.ln(), 0.25f32.ln(), 0.15f32.ln(), 0.1f32.ln()];
        let mut s = sampler(SamplingConfig { min_p: 0.29, ..temp(1.0) });
        assert_probs(&dist_of(&mut s, &logits, &[]), &[(0, 0.5 / 0.9), (1, 0.25 / 0.9), (2, 0.15 / 0.9)]);
        // min_p = 0.6: threshold 0.3, only 0.5 stays.
        let mut s = sampler(SamplingConfig { min_p: 0.6, ..temp(1.0) });
        assert_probs(&dist_of(&mut s, &logits, &[]), &[(0, 1.0)]);
    }

    #[test]
    fn temperature_applies_before_top_p() {
        // Logits 2, 1, 0 at temperature 0.5 become 4, 2, 0: probabilities
        // e^4, e^2, 1 over 54.598 + 7.389 + 1 = 62.987: 0.8668, 0.1173, 0.0159.
        // top_p 0.9 then needs tokens 0 and 1 (0.8668 < 0.9 <= 0.9841).
        let mut s = sampler(SamplingConfig { top_p: 0.9, ..temp(0.5) });
        let d = dist_of(&mut s, &[2.0, 1.0, 0.0], &[]);
        let z = 4f32.exp() + 2f32.exp();
        assert_probs(&d, &[(0, 4f32.exp() / z), (1, 2f32.exp() / z)]);
    }

    #[test]
    fn repetition_penalty_changes_the_argmax() {
        // Token 1 leads with 2.0; token 2 has 1.5. Token 1 was seen: 2.0 / 1.5 = 1.33 < 1.5,
        // so token 2 wins. Token 3 (-1.0, also seen) goes to -1.5, never above.
        let logits = [0.0, 2.0, 1.5, -1.0];
        let config = SamplingConfig { repetition_penalty: 1.5, ..SamplingConfig::default() };
        let mut s = sampler(config.clone());
        assert_eq!(s.sample(&logits, &[3, 1, 1]), 2);
        // Only the last `repeat_last_n` tokens count: token 1 is outside a window of 2.
        let mut s = sampler(SamplingConfig { repeat_last_n: 2, ..config.clone() });
        assert_eq!(s.sample(&logits, &[1, 3, 0]), 1);
        // Seen twice, penalised once: 2.0 / 1.5 / 1.5 = 0.89 would lose to token 0 too.
        let mut s = sampler(SamplingConfig { repetition_penalty: 1.5, ..temp(1.0) });
        let d = dist_of(&mut s, &logits, &[1, 1, 3]);
        let w = [0f32.exp(), (2.0f32 / 1.5).exp(), 1.5f32.exp(), (-1.5f32).exp()];
        let z: f32 = w.iter().sum();
        let want: Vec<(Token, f32)> = (0..4).map(|i| (i as Token, w[i] / z)).collect();
        assert_probs(&d, &want);
        // Out-of-vocabulary history is ignored, not a panic.
        let mut s = sampler(config);
        assert_eq!(s.sample(&logits, &[99, 1]), 2);
    }

    #[test]
    fn temperature_1_follows_the_softmax() {
        let logits = [1.0f32, 0.0, -0.5, 2.0];
        let max = 2.0f32;
        let w: Vec<f64> = logits.iter().map(|&l| f64::from((l - max).exp())).collect();
        let z: f64 = w.iter().sum();
        let mut s = sampler(temp(1.0));
        let n = 20_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[s.sample(&logits, &[]) as usize] += 1;
        }
        let chi2: f64 = (0..4)
            .map(|i| {
                let expected = n as f64 * w[i] / z;
                (counts[i] as f64 - expected).powi(2) / expected
            })
            .sum();
        // 3 degrees of freedom: P(chi2 > 20) is about 0.0002.
        assert!(chi2 < 20.0, "chi2 {chi2}, counts {counts:?}");
    }

    #[test]
    fn draw_takes_unnormalised_weights() {
        let mut s = sampler(temp(1.0));
        let mut d = Distribution::new();
        d.push(5, 0.0);
        d.push(9, 3.0);
        d.push(2, -1.0);
        for _ in 0..100 {
            assert_eq!(s.draw(&d), 9);
        }
        assert_eq!(s.draw(&Distribution::new()), 0);
        d.clear();
        d.push(4, 1.0);
        d.push(6, 3.0);
        d.normalize();
        assert_eq!(d.prob(6), 0.75);
        assert_eq!(d.prob(7), 0.0);
    }

    #[test]
    fn infinite_and_nan_logits_do_not_panic() {
        let mut s = sampler(SamplingConfig { top_k: 2, top_p: 0.5, ..temp(1.0) });
        assert_eq!(s.sample(&[f32::NAN, f32::INFINITY, 0.0], &[]), 1);
        let mut s = sampler(SamplingConfig { min_p: 0.1, ..temp(1.0) });
        let t = s.sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &[]);
        assert!(t < 2);
        assert_eq!(s.sample(&[], &[]), 0);
    }

    #[test]
    fn invalid_configs_are_errors_naming_the_range() {
        let bad = |c: SamplingConfig| match c.validate() {
            Err(Error::InvalidArgument(msg)) => msg,
            other => panic!("expected an error, got {other:?}"),
        };
        let d = SamplingConfig::default();
        assert!(bad(SamplingConfig { temperature: -0.1, ..d.clone() }).contains(">= 0"));
        assert!(bad(SamplingConfig { temperature: f32::NAN, ..d.clone() }).contains("finite"));
        assert!(bad(SamplingConfig { top_p: 0.0, ..d.clone() }).contains("(0, 1]"));
        assert!(bad(SamplingConfig { top_p: 1.5, ..d.clone() }).contains("(0, 1]"));
        assert!(bad(SamplingConfig { min_p: 1.0, ..d.clone() }).contains("[0, 1)"));
        assert!(bad(SamplingConfig { min_p: -0.5, ..d.clone() }).contains("[0, 1)"));
        assert!(bad(SamplingConfig { repetition_penalty: 0.0, ..d.clone() }).contains("> 0"));
        let both = bad(SamplingConfig { top_p: 2.0, min_p: 2.0, ..d.clone() });
        assert!(both.contains("top_p") && both.contains("min_p"), "{both}");
        assert!(Sampler::new(SamplingConfig { top_p: f32::NAN, ..d.clone() }).is_err());
        assert!(d.validate().is_ok() && d.is_greedy());
    }
}
