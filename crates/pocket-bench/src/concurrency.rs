//! Requests at once (`--concurrent N`): the workload's prompts in groups of N, each group run
//! in every mode alone, one request after another, and then all at once, as N apps asking
//! together would. What it shows per mode: the aggregate decode speed against one request
//! alone, each request's own speed and time to its first token, how evenly the requests were
//! served (the fastest over the slowest), and whether each request's tokens were exactly its
//! tokens alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::median::median;

/// What `--concurrent N` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConcurrencyResults {
    /// Requests at once (the last group may be smaller).
    pub requests: usize,
    /// Every request run together, in the order the groups ran.
    pub runs: Vec<ConcurrentRun>,
    /// Every group in every mode.
    pub groups: Vec<GroupRecord>,
    /// Per mode (by name), over its groups.
    pub summary: BTreeMap<String, ConcurrencySummary>,
}

/// One request of a group run together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConcurrentRun {
    /// The mode.
    pub mode: String,
    /// The group (0-based, in workload order).
    pub group: usize,
    /// The pass over the workload.
    pub round: usize,
    /// The prompt's id.
    pub prompt_id: String,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds from the group's start to this request's first token.
    pub first_token_seconds: f64,
    /// Tokens after the first over the time after the first (`null` under two tokens).
    pub decode_tok_per_s: Option<f64>,
    /// The same request's decode speed alone, in the same mode.
    pub alone_decode_tok_per_s: Option<f64>,
    /// Whether its tokens equal its tokens alone, in the same mode.
    pub identical_to_alone: bool,
}

/// One group in one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The mode.
    pub mode: String,
    /// The group.
    pub group: usize,
    /// The pass over the workload.
    pub round: usize,
    /// Requests in it.
    pub requests: usize,
    /// Seconds from the start until the last request ended.
    pub wall_seconds: f64,
    /// The requests' decode speeds summed: tokens per second served in all while they ran.
    pub aggregate_decode_tok_per_s: f64,
    /// The same requests' decode speeds alone, on average: one request alone.
    pub alone_decode_tok_per_s: f64,
    /// `aggregate` over `alone`.
    pub gain: f64,
    /// The fastest request's decode speed over the slowest's (1 is perfectly even).
    pub fairness: Option<f64>,
    /// Tokens generated in all over the wall time, prefill included.
    pub throughput_tok_per_s: f64,
}

/// One mode over its groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConcurrencySummary {
    /// Groups summarised.
    pub groups: usize,
    /// Median over the groups of [`GroupRecord::aggregate_decode_tok_per_s`].
    pub aggregate_decode_tok_per_s_median: Option<f64>,
    /// Median over the groups of [`GroupRecord::alone_decode_tok_per_s`].
    pub alone_decode_tok_per_s_median: Option<f64>,
    /// Median over the groups of [`GroupRecord::gain`].
    pub gain_median: Option<f64>,
    /// Median over the groups of [`GroupRecord::fairness`].
    pub fairness_median: Option<f64>,
    /// The least even group's fairness.
    pub fairness_max: Option<f64>,
    /// Median over the requests of their decode speeds together.
    pub per_request_decode_tok_per_s_median: Option<f64>,
    /// Median over the requests of the milliseconds to their first token.
    pub first_token_ms_median: Option<f64>,
    /// Whether every request's tokens equalled its tokens alone.
    pub all_identical_to_alone: bool,
    /// Median over groups of this mode's aggregate over `llama.cpp`'s for the same group;
    /// `null` without `llama.cpp`.
    pub aggregate_vs_llama_cpp: Option<f64>,
}

/// A group's record from its requests, `(decode tok/s together, alone)` each.
pub(crate) fn group_record(
    mode: &str,
    (group, round): (usize, usize),
    speeds: &[(Option<f64>, Option<f64>)],
    wall_seconds: f64,
    generated: usize,
) -> GroupRecord {
    let together: Vec<f64> = speeds.iter().filter_map(|s| s.0).collect();
    let alone: Vec<f64> = speeds.iter().filter_map(|s| s.1).collect();
    let aggregate: f64 = together.iter().sum();
    let alone_mean = if alone.is_empty() { 0.0 } else { alone.iter().sum::<f64>() / alone.len() as f64 };
    let (max, min) = together.iter().fold((f64::MIN, f64::MAX), |(a, b), &v| (a.max(v), b.min(v)));
    GroupRecord {
        mode: mode.to_owned(),
        group,
        round,
        requests: speeds.len(),
        wall_seconds,
        aggregate_decode_tok_per_s: aggregate,
        alone_decode_tok_per_s: alone_mean,
        gain: if alone_mean > 0.0 { aggregate / alone_mean } else { 0.0 },
        fairness: (together.len() >= 2 && min > 0.0).then(|| max / min),
        throughput_tok_per_s: if wall_seconds > 0.0 { generated as f64 / wall_seconds } else { 0.0 },
    }
}

/// Per mode, over its groups and requests.
pub(crate) fn summarize(
    runs: &[ConcurrentRun],
    groups: &[GroupRecord],
) -> BTreeMap<String, ConcurrencySummary> {
    let mut modes: Vec<&str> = groups.iter().map(|g| g.mode.as_str()).collect();
    modes.dedup();
    let llama: BTreeMap<(usize, usize), f64> = groups
        .iter()
        .filter(|g| g.mode == "llama.cpp")
        .map(|g| ((g.group, g.round), g.aggregate_decode_tok_per_s))
        .collect();
    let mut out = BTreeMap::new();
    for mode in modes {
        let gs: Vec<&GroupRecord> = groups.iter().filter(|g| g.mode == mode).collect();
        let rs: Vec<&ConcurrentRun> = runs.iter().filter(|r| r.mode == mode).collect();
        let vs_llama: Vec<f64> = gs
            .iter()
            .filter_map(|g| {
                llama.get(&(g.group, g.round)).filter(|&&l| l > 0.0).map(|l| g.aggregate_decode_tok_per_s / l)
            })
            .collect();
        out.insert(
            mode.to_owned(),
            ConcurrencySummary {
                groups: gs.len(),
                aggregate_decode_tok_per_s_median: median(gs.iter().map(|g| g.aggregate_decode_tok_per_s)),
                alone_decode_tok_per_s_median: median(gs.iter().map(|g| g.alone_decode_tok_per_s)),
                gain_median: median(gs.iter().map(|g| g.gain)),
                fairness_median: median(gs.iter().filter_map(|g| g.fairness)),
                fairness_max: gs.iter().filter_map(|g| g.fairness).reduce(f64::max),
                per_request_decode_tok_per_s_median: median(rs.iter().filter_map(|r| r.decode_tok_per_s)),
                first_token_ms_median: median(rs.iter().map(|r| r.first_token_seconds * 1e3)),
                all_identical_to_alone: rs.iter().all(|r| r.identical_to_alone),
                aggregate_vs_llama_cpp: (mode != "llama.cpp").then(|| median(vs_llama)).flatten(),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_sums_speeds_and_compares_them_with_one_request_alone() {
        let g =
            group_record("vanilla", (0, 0), &[(Some(20.0), Some(30.0)), (Some(10.0), Some(30.0))], 2.0, 100);
        assert_eq!(g.aggregate_decode_tok_per_s, 30.0);
        assert_eq!(g.alone_decode_tok_per_s, 30.0);
        assert_eq!(g.gain, 1.0);
        assert_eq!(g.fairness, Some(2.0));
        assert_eq!(g.throughput_tok_per_s, 50.0);
        // One request with a speed: nothing to be fair between.
        let g = group_record("vanilla", (1, 0), &[(Some(20.0), None), (None, Some(10.0))], 1.0, 1);
        assert_eq!((g.fairness, g.gain), (None, 2.0));
    }

    #[test]
    fn modes_are_compared_with_llama_cpp_group_by_group() {
        let run = |mode: &str, identical| ConcurrentRun {
            mode: mode.into(),
            group: 0,
            round: 0,
            prompt_id: "p".into(),
            generated_tokens: 10,
            first_token_seconds: 0.1,
            decode_tok_per_s: Some(10.0),
            alone_decode_tok_per_s: Some(12.0),
            identical_to_alone: identical,
        };
        let groups = [
            group_record("llama.cpp", (0, 0), &[(Some(10.0), Some(10.0)), (Some(10.0), Some(10.0))], 1.0, 20),
            group_record("vanilla", (0, 0), &[(Some(30.0), Some(20.0)), (Some(30.0), Some(20.0))], 1.0, 20),
        ];
        let s = summarize(&[run("llama.cpp", true), run("vanilla", false)], &groups);
        assert_eq!(s["vanilla"].aggregate_vs_llama_cpp, Some(3.0));
        assert_eq!(s["vanilla"].gain_median, Some(3.0));
        assert!(!s["vanilla"].all_identical_to_alone && s["llama.cpp"].all_identical_to_alone);
        assert_eq!(s["llama.cpp"].aggregate_vs_llama_cpp, None);
        assert_eq!(s["vanilla"].first_token_ms_median, Some(100.0));
    }
}
