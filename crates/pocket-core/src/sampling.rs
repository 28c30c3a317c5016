//! Turning a row of logits into the next token.
//!
//! The pipeline follows llama.cpp's sampler chain: logit bias → repetition penalty →
//! presence/frequency penalty → (greedy: argmax) → top-k → temperature → softmax → top-p →
//! min-p → draw. The first three adjust logits one token at a time, so a greedy config with
//! any of them picks the adjusted argmax. Speculative sampling needs the processed
//! distribution itself (it accepts a draft token with probability min(1, p/q) and resamples
//! from norm(max(0, p − q))), so [`Sampler::distribution`] and [`Sampler::draw`] expose the
//! two halves of [`Sampler::sample`].
//!
//! [`token_logprob`] reports OpenAI's `logprobs`/`top_logprobs` for a chosen token, from the
//! model's own logits (before any of the above).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

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
    /// How many of the most recent tokens (prompt included) the repetition, presence and
    /// frequency penalties look at; 0 turns all three off.
    pub repeat_last_n: usize,
    /// OpenAI's presence penalty, in [-2, 2]: subtracted once from the logit of every token
    /// that occurs in the last `repeat_last_n` tokens of the history; 0 = off.
    ///
    /// The window is the repetition penalty's and includes the prompt, as in llama.cpp's
    /// sampler (OpenAI counts the generated text only).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: subtracted from a token's logit once per
    /// occurrence in the same window as `presence_penalty`; 0 = off.
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: `(token, bias)` pairs, each bias in [-100, 100], added to the
    /// token's logit before anything else (-100 effectively bans a token, +100 effectively
    /// forces it). A token listed twice gets both biases. Ids outside the vocabulary are
    /// ignored when sampling: the vocabulary size is not known here, so checking ids is the
    /// API layer's job.
    pub logit_bias: Vec<(Token, f32)>,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingConfig {
    /// Check every value against its allowed range; the error names each bad value, and its
    /// `param` the first bad field.
    pub fn validate(&self) -> Result<()> {
        let mut problems: Vec<(&'static str, String)> = Vec::new();
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            problems.push((
                "temperature",
                format!("temperature must be a finite number >= 0 (0 = greedy), not {}", self.temperature),
            ));
        }
        // Written so that NaN fails each check.
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            problems.push(("top_p", format!("top_p must be in (0, 1] (1 = off), not {}", self.top_p)));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            problems.push(("min_p", format!("min_p must be in [0, 1) (0 = off), not {}", self.min_p)));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            problems.push((
                "repetition_penalty",
                format!(
                    "repetition_penalty must be a finite number > 0 (1 = off), not {}",
                    self.repetition_penalty
                ),
            ));
        }
        // `contains` is false for NaN and the infinities.
        for (name, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                problems.push((
                    name,
                    format!("{name} must be a finite number in [-2, 2] (0 = off), not {value}"),
                ));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                problems.push((
                    "logit_bias",
                    format!(
                        "logit_bias for token {token} must be a finite number in [-100, 100], not {bias}"
                    ),
                ));
            }
        }
        match problems.first() {
            None => Ok(()),
            Some(&(param, _)) => {
                let message = problems.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; ");
                Err(Error::invalid_field(param, message))
            }
        }
    }

    /// Whether sampling always picks the argmax of the adjusted logits (see
    /// [`SamplingConfig::adjusts_logits`]): temperature 0, or top-k 1.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the logits are changed before any filter: a logit bias, or a repetition,
    /// presence or frequency penalty. When not, a greedy config picks the plain
    /// [`argmax`] of the logits.
    pub fn adjusts_logits(&self) -> bool {
        self.penalises() || self.logit_bias.iter().any(|&(_, bias)| bias != 0.0)
    }

    /// Whether any of the penalties that count recent tokens is on.
    fn penalises(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repetition_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
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
/// Its buffers are reused: after the first call with the largest vocabulary and the longest
/// penalty window, sampling does not allocate.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplingConfig,
    rng: ChaCha8Rng,
    dist: Distribution,
    /// The penalty window, sorted so that equal tokens form runs (one run per distinct
    /// token, its length the count).
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
        // The fast path: no copy of the logits, so only when nothing adjusts them.
        if self.config.is_greedy() && !self.config.adjusts_logits() {
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

    /// The distribution [`Sampler::sample`] draws from, written into `out`: logit bias and
    /// penalties applied (with `history` as for [`Sampler::sample`]), then every filter,
    /// probabilities summing to 1. For a greedy config, the argmax of the adjusted logits
    /// with probability 1.
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
        // `e` is in token order here, so `e[t]` is token `t`. Biases and penalties are finite
        // and the logits are not NaN, so no NaN can appear (inf - inf needs two infinities).
        for &(t, bias) in &c.logit_bias {
            if let Some(x) = e.get_mut(t as usize) {
                x.1 += bias;
            }
        }
        if c.penalises() {
            penalise(e, &mut self.seen, history, c);
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

/// The penalties over the last `repeat_last_n` tokens of `history`, per distinct token `t`
/// seen `count` times there, as llama.cpp applies them: the CTRL-style repetition penalty
/// (once, whatever the count), then
/// `logit -= presence_penalty * (count > 0) + frequency_penalty * count`.
/// `e` is in token order, so `e[t]` is token `t`; tokens outside it are ignored.
fn penalise(e: &mut [(Token, f32)], seen: &mut Vec<Token>, history: &[Token], c: &SamplingConfig) {
    seen.clear();
    seen.extend_from_slice(&history[history.len().saturating_sub(c.repeat_last_n)..]);
    // Sorting makes each distinct token one run whose length is its count: counting without
    // a vocabulary-sized table or a map.
    seen.sort_unstable();
    let p = c.repetition_penalty;
    for run in seen.chunk_by(|a, b| a == b) {
        if let Some(x) = e.get_mut(run[0] as usize) {
            // Dividing or multiplying by 1 and subtracting 0 are exact, so penalties that are
            // off leave the logit as it was.
            x.1 = if x.1 > 0.0 { x.1 / p } else { x.1 * p };
            x.1 -= c.presence_penalty + c.frequency_penalty * run.len() as f32;
        }
    }
}

/// The log-probability of a chosen token and the most likely alternatives (OpenAI's
/// `logprobs` and `top_logprobs`); see [`token_logprob`].
///
/// Log-probabilities are natural logarithms, at most 0. A token the model gives no
/// probability has `f32::NEG_INFINITY`. OpenAI never sends that, and serde_json writes a
/// non-finite float as `null`, so the API layer should write it as a large negative number
/// such as -9999 instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The chosen token.
    pub token: Token,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (ties: lower id
    /// first). The chosen token is among them when it ranks high enough.
    pub top: Vec<(Token, f32)>,
}

/// The log-softmax of the raw `logits` at `token`, and the `top_n` most likely tokens with
/// theirs, most likely first (ties: lower id first; fewer than `top_n` when the vocabulary is
/// smaller).
///
/// This is the model's own distribution, before logit bias, penalties, temperature or any
/// filter: what OpenAI and vLLM report by default. NaN logits count as -inf. A token whose
/// logit is -inf, or which is outside `logits`, gets `f32::NEG_INFINITY`; so does every
/// token when no logit is above -inf. Logits of +inf share all the probability.
///
/// OpenAI allows `top_n` up to 20; larger values work too. The cost is two passes over the
/// logits and a heap of `top_n` entries: no copy or sort of the vocabulary, so only the
/// returned `top` is allocated.
pub fn token_logprob(logits: &[f32], token: Token, top_n: usize) -> TokenLogprob {
    let ls = LogSoftmax::new(logits);
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| ls.at(l));
    let top_n = top_n.min(logits.len());
    let mut top = Vec::new();
    if top_n > 0 {
        // A max-heap of the `top_n` best so far whose top is the worst of them: each further
        // logit costs one comparison unless it displaces that one.
        let mut heap = BinaryHeap::with_capacity(top_n);
        for (i, &l) in logits.iter().enumerate() {
            let c = Candidate(i as Token, finite_or_below(l));
            if heap.len() < top_n {
                heap.push(c);
            } else if let Some(mut worst) = heap.peek_mut()
                && c < *worst
            {
                *worst = c;
            }
        }
        // Ascending in `Candidate`'s order: most likely first.
        top = heap.into_sorted_vec().into_iter().map(|c| (c.0, ls.at(c.1))).collect();
    }
    TokenLogprob { token, logprob, top }
}

/// NaN as -inf: a NaN logit is a token the model gives no probability.
fn finite_or_below(l: f32) -> f32 {
    if l.is_nan() { f32::NEG_INFINITY } else { l }
}

/// A `(token, logit)` entry of the top, ordered more likely first, then lower id first (the
/// order of the result), so that the greatest is the first to drop. Logits are never NaN
/// here; -0 and 0 are equal, as they are as logits.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate(Token, f32);

impl Eq for Candidate {}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        other.1.partial_cmp(&self.1).unwrap_or(Ordering::Equal).then(self.0.cmp(&other.0))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The log-softmax of a row of logits, computed stably: log p(l) = (l − max) − ln Σ exp(lᵢ −
/// max), in f64 so that a vocabulary of 150k small terms sums without losing precision.
struct LogSoftmax {
    max: f32,
    /// ln Σ exp(lᵢ − max) when `max` is finite.
    log_z: f64,
    /// How many logits equal `max`: they share the mass when it is +inf.
    at_max: usize,
}

impl LogSoftmax {
    fn new(logits: &[f32]) -> Self {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| finite_or_below(l).max(m));
        let at_max = logits.iter().filter(|&&l| l == max).count();
        let log_z = if max.is_finite() {
            let max = f64::from(max);
            // NaN and -inf logits contribute exp(-inf) = 0.
            logits.iter().map(|&l| (f64::from(finite_or_below(l)) - max).exp()).sum::<f64>().ln()
        } else {
            0.0
        };
        LogSoftmax { max, log_z, at_max }
    }

    /// The log-probability of a token with logit `l` (NaN counts as -inf).
    fn at(&self, l: f32) -> f32 {
        let l = finite_or_below(l);
        if l == f32::NEG_INFINITY {
            f32::NEG_INFINITY
        } else if self.max == f32::INFINITY {
            // exp(l − max) is NaN for l = +inf; the limit gives the +inf logits equal shares.
            if l == f32::INFINITY { -(self.at_max as f64).ln() as f32 } else { f32::NEG_INFINITY }
        } else {
            (f64::from(l) - f64::from(self.max) - self.log_z) as f32
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
            ..SamplingConfig::default()
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
            Err(Error::InvalidArgument { message: msg, .. }) => msg,
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
        // The error's field is the first bad one, named by the data rather than the text.
        let first = SamplingConfig { top_p: 2.0, min_p: 2.0, ..d.clone() }.validate().unwrap_err();
        assert!(matches!(first, Error::InvalidArgument { param: Some("top_p"), .. }), "{first:?}");
        assert!(Sampler::new(SamplingConfig { top_p: f32::NAN, ..d.clone() }).is_err());
        assert!(d.validate().is_ok() && d.is_greedy() && !d.adjusts_logits());
    }

    #[test]
    fn invalid_penalties_and_biases_are_errors_naming_the_field_and_range() {
        let bad = |c: SamplingConfig| match c.validate() {
            Err(Error::InvalidArgument { message: msg, .. }) => msg,
            other => panic!("expected an error, got {other:?}"),
        };
        let d = SamplingConfig::default();
        for v in [2.5, -2.01, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let msg = bad(SamplingConfig { presence_penalty: v, ..d.clone() });
            assert!(msg.contains("presence_penalty") && msg.contains("[-2, 2]"), "{msg}");
            assert!(!msg.contains("frequency_penalty"), "{msg}");
            let msg = bad(SamplingConfig { frequency_penalty: v, ..d.clone() });
            assert!(msg.contains("frequency_penalty") && msg.contains("[-2, 2]"), "{msg}");
            assert!(!msg.contains("presence_penalty"), "{msg}");
        }
        for v in [100.5, -101.0, f32::NAN, f32::INFINITY] {
            let msg = bad(SamplingConfig { logit_bias: vec![(3, 1.0), (17, v)], ..d.clone() });
            assert!(msg.contains("logit_bias for token 17") && msg.contains("[-100, 100]"), "{msg}");
            assert!(!msg.contains("token 3 "), "{msg}");
        }
        // Every bad value is named.
        let all = bad(SamplingConfig {
            presence_penalty: 3.0,
            frequency_penalty: -3.0,
            logit_bias: vec![(1, 200.0), (2, -200.0)],
            ..d.clone()
        });
        for name in ["presence_penalty", "frequency_penalty", "token 1", "token 2"] {
            assert!(all.contains(name), "{all}");
        }
        // The ends of the ranges are allowed, and an id no vocabulary has cannot be judged here.
        let edges = SamplingConfig {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(0, -100.0), (Token::MAX, 100.0)],
            ..d
        };
        assert!(edges.validate().is_ok());
        assert!(Sampler::new(SamplingConfig { frequency_penalty: f32::NAN, ..edges }).is_err());
    }

    #[test]
    fn new_fields_default_to_off_in_json() {
        let c: SamplingConfig = serde_json::from_str(r#"{"temperature": 0.5}"#).unwrap();
        assert_eq!(c, SamplingConfig { temperature: 0.5, ..SamplingConfig::default() });
        assert!(!c.adjusts_logits());
        // `logit_bias` is a list of `[token, bias]` pairs.
        let c: SamplingConfig =
            serde_json::from_str(r#"{"presence_penalty": 0.5, "logit_bias": [[3, -100], [7, 2.5]]}"#)
                .unwrap();
        assert_eq!(c.logit_bias, vec![(3, -100.0), (7, 2.5)]);
        assert_eq!(c.presence_penalty, 0.5);
        assert!(c.validate().is_ok() && c.adjusts_logits());
    }

    #[test]
    fn greedy_without_adjustments_takes_the_fast_path() {
        let d = SamplingConfig::default();
        assert!(!d.adjusts_logits());
        // Penalties whose window is empty, and zero biases, adjust nothing.
        let off = SamplingConfig {
            repeat_last_n: 0,
            repetition_penalty: 1.5,
            presence_penalty: 1.0,
            frequency_penalty: 1.0,
            logit_bias: vec![(2, 0.0)],
            ..d.clone()
        };
        assert!(!off.adjusts_logits());
        let logits = [0.5, -1.0, 2.5, 2.5, 1.0];
        let mut s = sampler(off);
        assert_eq!(s.sample(&logits, &[2, 2, 3]), 2);
        assert_eq!(dist_of(&mut s, &logits, &[2, 2, 3]), vec![(2, 1.0)]);
        for c in [
            SamplingConfig { presence_penalty: 0.1, ..d.clone() },
            SamplingConfig { frequency_penalty: -0.1, ..d.clone() },
            SamplingConfig { repetition_penalty: 1.1, ..d.clone() },
            SamplingConfig { logit_bias: vec![(9, 1.0)], ..d.clone() },
        ] {
            assert!(c.adjusts_logits(), "{c:?}");
        }
    }

    #[test]
    fn presence_and_frequency_penalties_change_the_argmax() {
        // Token 0 is never seen, 1 once, 2 three times (counts 0, 1, 3).
        let history = [2, 1, 2, 2];
        let greedy = |presence_penalty, frequency_penalty, logits: &[f32]| {
            let c = SamplingConfig { presence_penalty, frequency_penalty, ..SamplingConfig::default() };
            let mut s = sampler(c);
            let t = s.sample(logits, &history);
            // `distribution` agrees with `sample`.
            assert_eq!(dist_of(&mut s, logits, &history), vec![(t, 1.0)]);
            t
        };
        // Presence: 1 and 2 both lose 1.5 whatever their count: 0 (3.0) beats 2 (4.0 - 1.5)
        // and 1 (3.5 - 1.5).
        let logits = [3.0, 3.5, 4.0];
        assert_eq!(greedy(0.0, 0.0, &logits), 2);
        assert_eq!(greedy(1.5, 0.0, &logits), 0);
        // A smaller presence penalty leaves 2 ahead: 4.0 - 0.4 > 3.5 - 0.4 > 3.0.
        assert_eq!(greedy(0.4, 0.0, &logits), 2);
        // Frequency: 0.3 per occurrence: 2 → 4.0 - 0.9 = 3.1, 1 → 3.5 - 0.3 = 3.2, so 1 wins.
        assert_eq!(greedy(0.0, 0.3, &logits), 1);
        // Both: 2 → 4.0 - 0.2 - 0.6 = 3.2, 1 → 3.5 - 0.2 - 0.2 = 3.1, 0 stays 3.0.
        assert_eq!(greedy(0.2, 0.2, &logits), 2);
        // Negative penalties favour seen tokens: 0 leads by 1, and 2 gains 0.5 * 3.
        assert_eq!(greedy(0.0, -0.5, &[5.0, 3.0, 4.0]), 2);
        assert_eq!(greedy(-2.0, 0.0, &[5.0, 3.0, 4.0]), 2);

        // The exact logits, through the temperature-1 distribution.
        let c = SamplingConfig { presence_penalty: 0.5, frequency_penalty: 0.25, ..temp(1.0) };
        let mut s = sampler(c);
        let d = dist_of(&mut s, &logits, &history);
        let w = [3.0f32.exp(), (3.5f32 - 0.5 - 0.25).exp(), (4.0f32 - 0.5 - 0.75).exp()];
        let z: f32 = w.iter().sum();
        assert_probs(&d, &[(0, w[0] / z), (1, w[1] / z), (2, w[2] / z)]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_the_window_prompt_included() {
        // The history given to the sampler is the prompt followed by the output: a token
        // only in the prompt counts.
        let logits = [1.0, 2.0, 1.8];
        let c = SamplingConfig { frequency_penalty: 0.5, ..SamplingConfig::default() };
        let mut s = sampler(c.clone());
        assert_eq!(s.sample(&logits, &[]), 1);
        assert_eq!(s.sample(&logits, &[1]), 2);
        // Only the last `repeat_last_n` count: with a window of 2, token 1 is seen once, not
        // three times (2.0 - 0.5 = 1.5 vs 1.8 - 0.5 = 1.3).
        let history = [1, 1, 2, 1];
        let mut s = sampler(SamplingConfig { repeat_last_n: 2, ..c.clone() });
        assert_eq!(s.sample(&logits, &history), 1);
        let mut s = sampler(c.clone());
        assert_eq!(s.sample(&logits, &history), 2);
        // Out-of-vocabulary history is ignored, not a panic.
        let mut s = sampler(c);
        assert_eq!(s.sample(&logits, &[99, 99, 99]), 1);
    }

    #[test]
    fn penalties_follow_the_repetition_penalty() {
        // llama.cpp's order: token 1 (2.0, seen twice) → 2.0 / 2 = 1.0 → 1.0 - 0.3 - 2 * 0.1.
        let c = SamplingConfig {
            repetition_penalty: 2.0,
            presence_penalty: 0.3,
            frequency_penalty: 0.1,
            ..temp(1.0)
        };
        let mut s = sampler(c);
        let d = dist_of(&mut s, &[0.0, 2.0], &[1, 1]);
        let w = [1.0f32, (1.0f32 - 0.3 - 0.2).exp()];
        let z: f32 = w.iter().sum();
        assert_probs(&d, &[(0, w[0] / z), (1, w[1] / z)]);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let logits = [0.5, 3.0, 2.0, -1.0];
        let bias = |logit_bias: Vec<(Token, f32)>, base: SamplingConfig| {
            sampler(SamplingConfig { logit_bias, ..base })
        };
        let greedy = SamplingConfig::default;
        // -100 bans the argmax: 2 takes over, in `sample` and in `distribution`.
        let mut s = bias(vec![(1, -100.0)], greedy());
        assert_eq!(s.sample(&logits, &[]), 2);
        assert_eq!(dist_of(&mut s, &logits, &[]), vec![(2, 1.0)]);
        // +100 forces the least likely token.
        let mut s = bias(vec![(3, 100.0)], greedy());
        assert_eq!(s.sample(&logits, &[]), 3);
        assert_eq!(dist_of(&mut s, &logits, &[]), vec![(3, 1.0)]);
        // Sampled: a banned token keeps no probability worth the name and is never drawn; a
        // forced one is always drawn.
        let mut s = bias(vec![(1, -100.0)], temp(1.0));
        let d = dist_of(&mut s, &logits, &[]);
        assert!(Distribution { entries: d }.prob(1) < 1e-40);
        assert!((0..200).all(|_| s.sample(&logits, &[]) != 1));
        let mut s = bias(vec![(3, 100.0)], temp(1.0));
        assert!(dist_of(&mut s, &logits, &[]).iter().all(|e| e.0 == 3 || e.1 < 1e-40));
        assert!((0..200).all(|_| s.sample(&logits, &[]) == 3));
        // Small biases add to the logit: 2.0 + 1.5 beats 3.0 - 0.25; the exact softmax too.
        let mut s = bias(vec![(2, 1.5), (1, -0.25)], greedy());
        assert_eq!(s.sample(&logits, &[]), 2);
        let mut s = bias(vec![(2, 1.5), (1, -0.25)], temp(1.0));
        let w = [0.5f32.exp(), 2.75f32.exp(), 3.5f32.exp(), (-1.0f32).exp()];
        let z: f32 = w.iter().sum();
        let want: Vec<(Token, f32)> = (0..4).map(|i| (i as Token, w[i] / z)).collect();
        assert_probs(&dist_of(&mut s, &logits, &[]), &want);
        // A token listed twice gets both biases; ids outside the vocabulary are ignored.
        let mut s = bias(vec![(2, 0.6), (2, 0.6), (4, 100.0), (Token::MAX, 100.0)], greedy());
        assert_eq!(s.sample(&logits, &[]), 2);
    }

    #[test]
    fn logit_bias_comes_before_the_penalties() {
        // Token 1 biased from 1.0 to 3.0, then divided by the repetition penalty: 1.5 < 2.0.
        // Penalising first would give 1.0 / 2 + 2.0 = 2.5 > 2.0.
        let c = SamplingConfig {
            repetition_penalty: 2.0,
            logit_bias: vec![(1, 2.0)],
            ..SamplingConfig::default()
        };
        let mut s = sampler(c);
        assert_eq!(s.sample(&[2.0, 1.0], &[1]), 0);
    }

    #[test]
    fn greedy_with_adjustments_follows_the_history() {
        // Greedy verification replays `sample` with the history growing token by token: with
        // a frequency penalty and a ban, each pick must follow from the tokens before it.
        let c = SamplingConfig {
            frequency_penalty: 1.0,
            logit_bias: vec![(0, -100.0)],
            ..SamplingConfig::default()
        };
        let mut s = sampler(c);
        let logits = [9.0, 2.0, 1.5, 1.2];
        let mut history = vec![];
        let got: Vec<Token> = (0..4)
            .map(|_| {
                let t = s.sample(&logits, &history);
                history.push(t);
                t
            })
            .collect();
        // 0 is banned; 1 (2.0) wins, then counts: 1.0 < 1.5, so 2; 2 drops to 0.5 and 1.2
        // wins; with 1, 2 and 3 seen once each, 1 (1.0) leads 3 (0.2) and 2 (0.5) again.
        assert_eq!(got, [1, 2, 3, 1]);
    }

    #[test]
    fn seeded_sampling_with_adjustments_is_deterministic() {
        let config = SamplingConfig {
            temperature: 0.9,
            top_p: 0.95,
            presence_penalty: 0.4,
            frequency_penalty: 0.3,
            logit_bias: vec![(4, 1.0), (0, -100.0)],
            seed: 99,
            ..SamplingConfig::default()
        };
        let got = golden(config.clone(), &[3, 3, 5, 1]);
        // Token 0 is banned.
        assert!(!got.contains(&0), "{got:?}");
        // Another seed gives another sequence (the stream is really random).
        assert_ne!(golden(SamplingConfig { seed: 100, ..config }, &[3, 3, 5, 1]), got);
    }

    fn close(got: f32, want: f64) -> bool {
        (f64::from(got) - want).abs() < 1e-6
    }

    #[test]
    fn token_logprob_matches_the_log_softmax() {
        // Probabilities 1/6, 2/6, 3/6.
        let logits = [0.0, 2f32.ln(), 3f32.ln()];
        let lp = token_logprob(&logits, 1, 3);
        assert_eq!(lp.token, 1);
        assert!(close(lp.logprob, (2.0f64 / 6.0).ln()), "{lp:?}");
        assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 1, 0]);
        for (&(t, l), want) in lp.top.iter().zip([0.5f64, 2.0 / 6.0, 1.0 / 6.0]) {
            assert!(close(l, want.ln()), "token {t}: {l}");
        }
        // Shifting every logit changes nothing; large logits do not overflow.
        let shifted: Vec<f32> = logits.iter().map(|l| l + 1000.0).collect();
        let far = token_logprob(&shifted, 0, 1);
        assert!((far.logprob - (1.0f32 / 6.0).ln()).abs() < 1e-3, "{far:?}");
        assert_eq!(far.top.len(), 1);
        assert_eq!(far.top[0].0, 2);
        // No alternatives asked for.
        let none = token_logprob(&logits, 2, 0);
        assert!(none.top.is_empty() && close(none.logprob, 0.5f64.ln()));
    }

    #[test]
    fn token_logprob_top_is_ordered_with_ties_to_the_lower_id() {
        let logits = [1.0, 3.0, 2.0, 3.0, -0.0, 0.0, 2.0];
        let lp = token_logprob(&logits, 4, 4);
        assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 2, 6]);
        assert_eq!(lp.top[0].1, lp.top[1].1);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
        // -0 and 0 tie, so the lower id comes first.
        let lp = token_logprob(&logits, 4, 7);
        assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 2, 6, 0, 4, 5]);
        assert_eq!(lp.logprob, lp.top[5].1);
        // More alternatives than tokens: every token once.
        let lp = token_logprob(&logits, 0, 20);
        assert_eq!(lp.top.len(), logits.len());
        let sum: f64 = lp.top.iter().map(|e| f64::from(e.1).exp()).sum();
        assert!((sum - 1.0).abs() < 1e-6, "{sum}");
        // Against a full sort over a larger, scrambled vocabulary (with many ties).
        let big: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 613) as f32 / 50.0).collect();
        let mut want: Vec<(Token, f32)> = big.iter().enumerate().map(|(i, &l)| (i as Token, l)).collect();
        want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let lp = token_logprob(&big, 17, 20);
        assert_eq!(
            lp.top.iter().map(|e| e.0).collect::<Vec<_>>(),
            want[..20].iter().map(|e| e.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn token_logprob_handles_nan_and_infinities() {
        // NaN counts as -inf: the others share the mass as if it were absent.
        let logits = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.0];
        let lp = token_logprob(&logits, 1, 4);
        assert!(close(lp.logprob, 0.5f64.ln()), "{lp:?}");
        assert_eq!(token_logprob(&logits, 0, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(token_logprob(&logits, 2, 0).logprob, f32::NEG_INFINITY);
        // The impossible tokens come last, lower id first.
        assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 3, 0, 2]);
        assert_eq!(lp.top[2].1, f32::NEG_INFINITY);
        assert_eq!(lp.top[3].1, f32::NEG_INFINITY);
        // +inf logits share all the mass.
        let lp = token_logprob(&[f32::INFINITY, 5.0, f32::INFINITY], 2, 3);
        assert!(close(lp.logprob, 0.5f64.ln()), "{lp:?}");
        assert_eq!(lp.top[2], (1, f32::NEG_INFINITY));
        // No finite logit at all, an empty row, a token outside the row: no probability.
        let lp = token_logprob(&[f32::NEG_INFINITY, f32::NAN], 0, 2);
        assert_eq!(lp.logprob, f32::NEG_INFINITY);
        assert!(lp.top.iter().all(|e| e.1 == f32::NEG_INFINITY));
        let lp = token_logprob(&[], 0, 5);
        assert_eq!((lp.logprob, lp.top.len()), (f32::NEG_INFINITY, 0));
        assert_eq!(token_logprob(&[1.0, 2.0], 2, 1).logprob, f32::NEG_INFINITY);
    }

    #[test]
    fn token_logprob_over_a_large_vocabulary_is_accurate() {
        // A vocabulary of Qwen's size: 150k equal logits each have log-probability
        // -ln(150000); the top is the first 20 ids.
        let n = 150_000;
        let logits = vec![0.25f32; n];
        let lp = token_logprob(&logits, 1234, 20);
        assert!(close(lp.logprob, -(n as f64).ln()), "{}", lp.logprob);
        assert_eq!(lp.top.iter().map(|e| e.0).collect::<Vec<_>>(), (0..20).collect::<Vec<Token>>());
    }
}
