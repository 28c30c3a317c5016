//! Accepting or rejecting a draft from the target's logits.
//!
//! Row `i` of the verification pass holds the target's logits after the pending token and
//! the first `i` drafted tokens, so it is what plain decoding would have seen at that point.

use crate::constraint::Masker;
use crate::sampling::{Distribution, Sampler};
use crate::{Logits, Result, Token};

/// The outcome of verifying a draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// How many drafted tokens, from the first, are accepted.
    pub accepted: usize,
    /// The target's own token after the accepted ones: a correction where a draft token was
    /// rejected, a bonus token when all were accepted.
    pub next: Token,
}

/// Greedy verification: accept drafted tokens while each is the token `sampler` picks from
/// its row, then take the sampler's pick from the first row that disagrees (or the row after
/// the last drafted token).
///
/// `sampler` must be deterministic (a greedy config, possibly with a repetition penalty),
/// which makes the result exactly what plain decoding would have produced. `history` (prompt
/// and output before the pending token's successor) is extended with each accepted token for
/// the penalty and restored before returning. `logits` needs `draft.len() + 1` rows.
///
/// Each row is masked by `masker`'s constraint as it stands after the tokens before it, and
/// the constraint is advanced past each accepted token (not past `next`): the picks are the
/// ones constrained plain decoding makes.
pub fn verify_greedy(
    sampler: &mut Sampler,
    logits: &Logits<'_>,
    draft: &[Token],
    history: &mut Vec<Token>,
    masker: &mut Masker<'_>,
) -> Result<Verdict> {
    let base = history.len();
    let mut accepted = 0;
    let next = loop {
        let pick = sampler.sample(masker.row(logits.row(accepted))?, history);
        match draft.get(accepted) {
            Some(&d) if d == pick => {
                history.push(d);
                masker.advance(d)?;
                accepted += 1;
            }
            _ => break pick,
        }
    };
    history.truncate(base);
    Ok(Verdict { accepted, next })
}

/// Greedy verification of a tree of drafts (SpecInfer; SuffixDecoding): `pass` holds the
/// pending token then the drafted ones, `parents[i]` the index in `pass` of token `i`'s
/// parent. From the pending token's row, follow the child whose token is the sampler's pick
/// while there is one, then take the pick of the row where the walk stopped: exactly what
/// plain decoding gives, as [`verify_greedy`] is along a path. `path` receives the indices
/// walked, from 0; the verdict counts the accepted tokens after the pending one.
pub fn verify_tree_greedy(
    sampler: &mut Sampler,
    logits: &Logits<'_>,
    pass: &[Token],
    parents: &[u8],
    history: &mut Vec<Token>,
    masker: &mut Masker<'_>,
    path: &mut super::Path,
) -> Result<Verdict> {
    let base = history.len();
    path.clear();
    path.push(0).ok();
    let mut node = 0;
    let next = loop {
        let pick = sampler.sample(masker.row(logits.row(node))?, history);
        let child = (node + 1..pass.len()).find(|&c| usize::from(parents[c]) == node && pass[c] == pick);
        match child {
            Some(c) => {
                history.push(pick);
                masker.advance(pick)?;
                path.push(c as u8).ok();
                node = c;
            }
            None => break pick,
        }
    };
    history.truncate(base);
    Ok(Verdict { accepted: path.len() - 1, next })
}

/// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept drafted token `d`
/// with probability min(1, p(d) / q(d)), where p is the target's distribution for its row and
/// q the draft's; at the first rejection draw from norm(max(0, p − q)); when all are accepted
/// draw the bonus token from the next row's p. The tokens this yields are distributed exactly
/// as sampling from the target one token at a time.
///
/// `q` holds one draft distribution per drafted token, or is empty for a deterministic
/// drafter (q one-hot on the drafted token: accept with probability p(d), and resample from p
/// with `d` removed). `p` and `residual` are scratch buffers. `history` and `masker` are as
/// for [`verify_greedy`]: p is the constrained distribution, so a draft token the grammar
/// forbids is never kept.
#[allow(clippy::too_many_arguments)]
pub fn verify_sampled(
    sampler: &mut Sampler,
    logits: &Logits<'_>,
    draft: &[Token],
    q: &[Distribution],
    history: &mut Vec<Token>,
    masker: &mut Masker<'_>,
    p: &mut Distribution,
    residual: &mut Distribution,
) -> Result<Verdict> {
    debug_assert!(q.is_empty() || q.len() == draft.len());
    let base = history.len();
    let mut accepted = 0;
    let next = loop {
        sampler.distribution(masker.row(logits.row(accepted))?, history, p);
        let Some(&d) = draft.get(accepted) else {
            break sampler.draw(p);
        };
        let q_i = q.get(accepted);
        let q_of = |t: Token| match q_i {
            Some(q) => q.prob(t),
            None => f32::from(t == d),
        };
        let (p_d, q_d) = (p.prob(d), q_of(d));
        // A drafter never proposes a token it gives no probability; if one does, p(d) > 0
        // still lets the target keep it (the ratio is infinite).
        let keep = p_d > 0.0 && (q_d <= 0.0 || sampler.uniform() < f64::from(p_d) / f64::from(q_d));
        if keep {
            history.push(d);
            masker.advance(d)?;
            accepted += 1;
            continue;
        }
        residual.clear();
        for &(t, p_t) in p.entries() {
            let w = p_t - q_of(t);
            if w > 0.0 {
                residual.push(t, w);
            }
        }
        // Rejection means p(d) < q(d), so some other token has p > q and the residual has
        // mass; rounding alone could empty it, and then p itself is the right fallback.
        break if residual.is_empty() { sampler.draw(p) } else { sampler.draw(residual) };
    };
    history.truncate(base);
    Ok(Verdict { accepted, next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingConfig;

    fn greedy() -> Sampler {
        Sampler::new(SamplingConfig::default()).unwrap()
    }

    /// Rows whose argmax are `picks`, over a vocabulary of 8.
    fn rows(picks: &[Token]) -> Vec<f32> {
        let mut v = vec![0.0; picks.len() * 8];
        for (i, &t) in picks.iter().enumerate() {
            v[i * 8 + t as usize] = 1.0;
        }
        v
    }

    #[test]
    fn greedy_accepts_the_agreeing_prefix_and_takes_the_correction() {
        let data = rows(&[1, 2, 5, 4]);
        let logits = Logits::new(&data, 8);
        let mut h = vec![0];
        assert_eq!(
            verify_greedy(&mut greedy(), &logits, &[1, 2, 3], &mut h, &mut Masker::none()).unwrap(),
            Verdict { accepted: 2, next: 5 }
        );
        assert_eq!(h, vec![0]);
        assert_eq!(
            verify_greedy(&mut greedy(), &logits, &[7, 2, 5], &mut h, &mut Masker::none()).unwrap(),
            Verdict { accepted: 0, next: 1 }
        );
    }

    #[test]
    fn greedy_all_accepted_gives_a_bonus_token() {
        let data = rows(&[1, 2, 5, 4]);
        let logits = Logits::new(&data, 8);
        let v = verify_greedy(&mut greedy(), &logits, &[1, 2, 5], &mut vec![0], &mut Masker::none()).unwrap();
        assert_eq!(v, Verdict { accepted: 3, next: 4 });
        // No draft: plain decoding.
        let v = verify_greedy(&mut greedy(), &logits, &[], &mut vec![0], &mut Masker::none()).unwrap();
        assert_eq!(v, Verdict { accepted: 0, next: 1 });
    }

    #[test]
    fn a_tree_is_walked_along_the_picks() {
        // Pass: pending 0, then 1 (after 0), 3 (after 0), 2 (after 1), 5 (after 1), 6 (after
        // 2). The picks after each row's token t are t + 1, so the walk takes 1 then 2 then 3,
        // which no child of 2 offers.
        let pass = [0, 1, 3, 2, 5, 6];
        let parents = [0, 0, 0, 1, 1, 3];
        let picks: Vec<Token> = pass.iter().map(|t| t + 1).collect();
        let data = rows(&picks);
        let logits = Logits::new(&data, 8);
        let mut path = crate::spec::Path::new();
        let mut h = vec![0];
        let v = verify_tree_greedy(
            &mut greedy(),
            &logits,
            &pass,
            &parents,
            &mut h,
            &mut Masker::none(),
            &mut path,
        )
        .unwrap();
        assert_eq!(v, Verdict { accepted: 2, next: 3 });
        assert_eq!(path[..], [0, 1, 3]);
        assert_eq!(h, vec![0]);
        // A pick no child offers: nothing accepted.
        let v = verify_tree_greedy(
            &mut greedy(),
            &logits,
            &[0, 4],
            &[0, 0],
            &mut h,
            &mut Masker::none(),
            &mut path,
        )
        .unwrap();
        assert_eq!((v, &path[..]), (Verdict { accepted: 0, next: 1 }, &[0u8][..]));
    }

    #[test]
    fn greedy_penalty_sees_accepted_draft_tokens() {
        // Row 1 prefers 2 (1.0) over 6 (0.8); with token 2 drafted before it and a penalty
        // of 2, 2 drops to 0.5, so plain decoding would pick 6 there.
        let mut data = rows(&[2, 2]);
        data[8 + 6] = 0.8;
        let logits = Logits::new(&data, 8);
        let config = SamplingConfig { repetition_penalty: 2.0, ..SamplingConfig::default() };
        let mut s = Sampler::new(config).unwrap();
        let v = verify_greedy(&mut s, &logits, &[2, 2], &mut vec![0], &mut Masker::none()).unwrap();
        assert_eq!(v, Verdict { accepted: 1, next: 6 });
    }

    /// Pearson's chi-square statistic of `counts` against `expected` probabilities.
    fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(expected)
            .map(|(&c, &e)| {
                let e = e * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// Sample the first token many times through one draft-and-verify step and compare the
    /// histogram with the target distribution p = softmax(logits).
    fn first_token_histogram(logits: &[f32], q: Option<&[f32]>, draws: usize) -> Vec<u64> {
        let v = logits.len();
        let config = SamplingConfig { temperature: 1.0, seed: 7, ..SamplingConfig::default() };
        let mut target = Sampler::new(config.clone()).unwrap();
        let mut drafter = Sampler::new(SamplingConfig { seed: 99, ..config }).unwrap();
        let (mut p, mut r) = (Distribution::new(), Distribution::new());
        let mut q_dist = Distribution::new();
        // Two rows: the draft token's row and the bonus row (uniform; only reached when the
        // draft is accepted, and then the first token is the draft token).
        let mut data = logits.to_vec();
        data.extend(std::iter::repeat_n(0.0, v));
        let rows = Logits::new(&data, v);
        let mut counts = vec![0u64; v];
        let mut history = Vec::new();
        for i in 0..draws {
            let (d, qs) = match q {
                Some(q) => {
                    q_dist.clear();
                    for (t, &w) in q.iter().enumerate() {
                        q_dist.push(t as Token, w);
                    }
                    q_dist.normalize();
                    (drafter.draw(&q_dist), std::slice::from_ref(&q_dist))
                }
                // A deterministic drafter that always guesses a fixed token per draw.
                None => ((i % v) as Token, &[][..]),
            };
            let verdict = verify_sampled(
                &mut target,
                &rows,
                &[d],
                qs,
                &mut history,
                &mut Masker::none(),
                &mut p,
                &mut r,
            )
            .unwrap();
            let first = if verdict.accepted == 1 { d } else { verdict.next };
            counts[first as usize] += 1;
        }
        counts
    }

    fn softmax(logits: &[f32]) -> Vec<f64> {
        let e: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    // With 5 categories (4 degrees of freedom) the chi-square 0.999 quantile is 18.47; the
    // seeds are fixed, so these tests are deterministic, and 200 000 draws make a biased
    // sampler fail by a wide margin (dropping the resample step gives statistics in the
    // thousands).
    const DRAWS: usize = 200_000;
    const CHI2_4DF_999: f64 = 18.47;

    #[test]
    fn speculative_sampling_reproduces_the_target_with_a_draft_distribution() {
        let logits = [1.0, 0.2, -0.5, 2.0, 0.0];
        let q = [0.1, 0.4, 0.3, 0.1, 0.1];
        let counts = first_token_histogram(&logits, Some(&q), DRAWS);
        let chi2 = chi_square(&counts, &softmax(&logits));
        assert!(chi2 < CHI2_4DF_999, "chi-square {chi2} for counts {counts:?}");
    }

    #[test]
    fn speculative_sampling_reproduces_the_target_with_a_deterministic_drafter() {
        let logits = [0.3, -1.0, 1.5, 0.7, 0.0];
        let counts = first_token_histogram(&logits, None, DRAWS);
        let chi2 = chi_square(&counts, &softmax(&logits));
        assert!(chi2 < CHI2_4DF_999, "chi-square {chi2} for counts {counts:?}");
    }

    #[test]
    fn skipping_the_resample_would_be_caught() {
        // The same statistic on a sampler that takes the draft whenever p(d) > 0 is far off:
        // the test above can fail.
        let logits = [0.3, -1.0, 1.5, 0.7, 0.0];
        let counts: Vec<u64> = (0..5).map(|_| (DRAWS / 5) as u64).collect();
        assert!(chi_square(&counts, &softmax(&logits)) > 1000.0);
    }
}
