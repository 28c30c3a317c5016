//! How fast could any drafter that copies earlier text make a stream on this device?
//!
//! A drafter that copies (pocketd's suffix drafter with its earlier answers, SuffixDecoding,
//! vLLM's `suffix`) can only draft a run of tokens it has seen: in the app's earlier answers,
//! the request's prompt or the answer so far. At every position of every answer this finds the
//! longest run of the answer's next tokens held there, and lets an oracle that knows the answer
//! draft exactly that run, sizing each pass by dynamic programming to a cost curve. No copying
//! drafter does better, so what it reaches bounds them all:
//!
//! ```text
//! speed-up bound = tokens / (sum over passes of the cost of the pass's width)
//! ```
//!
//! Runs are looked for anywhere, and after the same few tokens of context as the answer has
//! there (nearer to what a suffix drafter matches on). Each is priced by the device's cost curve
//! and by a flat one (a pass of up to [`FLAT_WIDTH`] tokens costs one step, about what a GPU
//! gives). The same bound without the earlier answers (after context, in the prompt and the
//! answer so far only) says how much of it the earlier answers could add at most: what the
//! `default` mode may gain over `no-history`.

use serde::{Deserialize, Serialize};

/// Tokens of context a run must follow to count as found "after context".
pub const CONTEXT: usize = 2;

/// The widest pass of the flat curve.
pub const FLAT_WIDTH: usize = 16;

/// The longest runs at every position of one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    /// Per position `t`: the longest run of `answer[t..]` seen before `t`, anywhere.
    pub anywhere: Vec<usize>,
    /// The same, only runs that follow the [`CONTEXT`] tokens the answer has before `t`.
    pub after_context: Vec<usize>,
    /// The same as `after_context`, only runs in the prompt and the answer so far: what a
    /// drafter without earlier answers could see.
    pub own_text: Vec<usize>,
}

/// The longest runs of `answer` a copying drafter could have seen: at each position `t`, in the
/// `earlier` answers and in `prompt` followed by `answer[..t]`.
pub fn longest_runs(answer: &[u32], prompt: &[u32], earlier: &[Vec<u32>]) -> Runs {
    let mut runs = Runs::default();
    let mut known: Vec<u32> = prompt.to_vec();
    for t in 0..answer.len() {
        let next = &answer[t..];
        let context = known.len().checked_sub(CONTEXT).map(|from| &known[from..]);
        let (mut anywhere, mut after, mut own) = (0, 0, 0);
        for (i, seq) in earlier.iter().map(Vec::as_slice).chain([known.as_slice()]).enumerate() {
            // The last sequence is the request's own text: its runs count for `own` too.
            let is_own = i == earlier.len();
            for s in 0..seq.len() {
                let n = seq[s..].iter().zip(next).take_while(|(a, b)| a == b).count();
                anywhere = anywhere.max(n);
                let longer = if is_own { n > own } else { n > after };
                if longer && context.is_some_and(|c| s >= CONTEXT && seq[s - CONTEXT..s] == *c) {
                    after = after.max(n);
                    if is_own {
                        own = n;
                    }
                }
            }
        }
        runs.anywhere.push(anywhere);
        runs.after_context.push(after);
        runs.own_text.push(own);
        known.push(answer[t]);
    }
    runs
}

/// The fewest decode steps in which an oracle produces `runs.len()` tokens when it may draft up
/// to `runs[t]` tokens at position `t` (all of them accepted) and a pass of `w` tokens costs
/// `cost[w - 1]` steps (`cost[0]` is the plain step, 1).
pub fn schedule_steps(runs: &[usize], cost: &[f64]) -> f64 {
    let n = runs.len();
    let mut best = vec![0.0; n + 1];
    for t in (0..n).rev() {
        best[t] = (0..=runs[t].min(cost.len().saturating_sub(1)))
            .map(|d| cost[d] + best[(t + d + 1).min(n)])
            .fold(f64::INFINITY, f64::min);
    }
    best[0]
}

/// The bound over a part of a stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoundPart {
    /// Tokens in the part's answers.
    pub tokens: usize,
    /// The mean run after context, over the part's positions.
    pub mean_run: f64,
    /// The bound with the device's cost curve, runs found anywhere (`null` where the curve is
    /// not known).
    pub anywhere: Option<f64>,
    /// The bound with the device's cost curve, runs found after context.
    pub after_context: Option<f64>,
    /// The bound with a flat cost curve, runs found anywhere.
    pub flat_anywhere: f64,
    /// The bound with a flat cost curve, runs found after context.
    pub flat_after_context: f64,
    /// The bound with the device's cost curve, runs found after context in the prompt and the
    /// answer so far only (without the earlier answers).
    #[serde(default)]
    pub own_text: Option<f64>,
}

impl BoundPart {
    /// The bound over answers with `runs`, with the cost curve `cost` where there is one.
    ///
    /// Over each answer's tokens after its first, as the bench's decode figures count them:
    /// the first comes from the prompt's pass, and the first decode pass may draft from the
    /// second on.
    pub fn of(runs: &[&Runs], cost: Option<&[f64]>) -> BoundPart {
        fn decoded(v: &[usize]) -> &[usize] {
            v.get(1..).unwrap_or_default()
        }
        fn anywhere(r: &Runs) -> &[usize] {
            decoded(&r.anywhere)
        }
        fn after(r: &Runs) -> &[usize] {
            decoded(&r.after_context)
        }
        fn own(r: &Runs) -> &[usize] {
            decoded(&r.own_text)
        }
        let tokens: usize = runs.iter().map(|r| anywhere(r).len()).sum();
        let speedup = |pick: fn(&Runs) -> &[usize], curve: &[f64]| {
            let steps: f64 = runs.iter().map(|r| schedule_steps(pick(r), curve)).sum();
            if steps > 0.0 { tokens as f64 / steps } else { 0.0 }
        };
        let flat = [1.0; FLAT_WIDTH];
        let after_sum: usize = runs.iter().flat_map(|r| after(r)).sum();
        BoundPart {
            tokens,
            mean_run: if tokens > 0 { after_sum as f64 / tokens as f64 } else { 0.0 },
            anywhere: cost.map(|c| speedup(anywhere, c)),
            after_context: cost.map(|c| speedup(after, c)),
            flat_anywhere: speedup(anywhere, &flat),
            flat_after_context: speedup(after, &flat),
            own_text: cost.map(|c| speedup(own, c)),
        }
    }
}

/// The bound over a stream: its first half, its second half and all of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyingBound {
    /// Tokens of context a run must follow for `after_context` ([`CONTEXT`]).
    pub context: usize,
    /// The device's cost curve the bound was priced with: steps for passes of 1, 2, ...
    /// tokens (empty where pocketd did not know it).
    pub cost: Vec<f64>,
    /// The first half of the stream.
    pub first_half: BoundPart,
    /// The second half.
    pub second_half: BoundPart,
    /// All of it.
    pub all: BoundPart,
}

impl CopyingBound {
    /// The bound over a stream whose answers have `runs`, in order, priced with `cost`.
    pub fn of(runs: &[Runs], cost: Vec<f64>) -> CopyingBound {
        let half = runs.len() / 2;
        let curve = (!cost.is_empty()).then_some(cost.as_slice());
        let part = |r: &[Runs]| BoundPart::of(&r.iter().collect::<Vec<_>>(), curve);
        CopyingBound {
            context: CONTEXT,
            first_half: part(&runs[..half]),
            second_half: part(&runs[half..]),
            all: part(runs),
            cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_found_in_earlier_answers_and_in_the_text_so_far_with_and_without_context() {
        // The answer copies an earlier answer's 10 11 12 after other context (5 6, where the
        // earlier answer had 1 2), then the prompt's 3 4 20 21, whose 20 21 follows 3 4 as it
        // did there.
        let earlier = vec![vec![1, 2, 10, 11, 12, 13]];
        let prompt = [7, 3, 4, 20, 21, 22];
        let answer = [5, 6, 10, 11, 12, 3, 4, 20, 21, 8];
        let runs = longest_runs(&answer, &prompt, &earlier);
        assert_eq!(runs.anywhere, [0, 0, 3, 2, 1, 4, 3, 2, 1, 0]);
        assert_eq!(runs.after_context, [0, 0, 0, 0, 1, 0, 0, 2, 1, 0]);
        // Without the earlier answer: only the prompt's 20 21 after 3 4 (12 after 11 was there).
        assert_eq!(runs.own_text, [0, 0, 0, 0, 0, 0, 0, 2, 1, 0]);
    }

    #[test]
    fn passes_are_sized_to_the_cost_curve() {
        // 8 tokens, each position able to draft the rest of the answer.
        let runs: Vec<usize> = (0..8).rev().collect();
        // A flat curve: one pass of 8.
        assert_eq!(schedule_steps(&runs, &[1.0; 16]), 1.0);
        // Passes cost their width: drafting never pays, 8 steps.
        let linear: Vec<f64> = (1..=16).map(f64::from).collect();
        assert_eq!(schedule_steps(&runs, &linear), 8.0);
        // A pass of 2 costs 1.2, of more 5: passes of 2 tokens, 4.8 steps.
        let curve = [1.0, 1.2, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0];
        assert!((schedule_steps(&runs, &curve) - 4.8).abs() < 1e-12);
        // Nothing to copy: one step a token, whatever the curve.
        assert_eq!(schedule_steps(&[0; 5], &[1.0; 16]), 5.0);
    }

    #[test]
    fn the_bound_is_taken_per_half_over_the_tokens_after_the_first() {
        // Each answer's first token (the prompt pass's) is left out: its run is never used.
        let copy = Runs {
            anywhere: vec![9, 3, 2, 1, 0],
            after_context: vec![9, 1, 0, 1, 0],
            own_text: vec![9, 0, 0, 1, 0],
        };
        let none = Runs { anywhere: vec![0; 5], after_context: vec![0; 5], own_text: vec![0; 5] };
        let b = CopyingBound::of(&[none.clone(), copy.clone()], vec![1.0, 1.5]);
        assert_eq!(b.first_half.flat_anywhere, 1.0);
        // Anywhere, flat: one pass of 4. After context: passes of 2, 2 (runs 1 at 0 and 2).
        assert_eq!(b.second_half.flat_anywhere, 4.0);
        assert_eq!(b.second_half.flat_after_context, 2.0);
        // A pass of 2 at 1.5 steps: 4 tokens in 3 steps either way.
        assert_eq!(b.second_half.after_context, Some(4.0 / 3.0));
        // Without the earlier answers: one pass of 2 (at 2), 4 tokens in 3.5 steps.
        assert_eq!(b.second_half.own_text, Some(4.0 / 3.5));
        assert_eq!(b.second_half.mean_run, 0.5);
        assert_eq!(b.all.tokens, 8);
        // Without a curve, only the flat figures.
        assert_eq!(CopyingBound::of(&[copy], Vec::new()).all.anywhere, None);
    }
}
