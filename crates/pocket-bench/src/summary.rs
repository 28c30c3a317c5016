//! Per-mode summaries of the runs: medians and per-prompt ratios.

use std::collections::{BTreeMap, HashMap};

use super::median::median;
use super::modes::{NAIVE_PREFIX, SOCKET_PREFIX};
use super::results::{KindSummary, ModeSummary, RunRecord};

/// Set every run's `identical_to_vanilla` and `diverges_at` by comparing its output (the
/// token ids in `outputs`, one per run) with `vanilla`'s for the same prompt and round; both
/// stay `None` where `vanilla` has no such run.
pub fn compare_outputs(runs: &mut [RunRecord], outputs: &[Vec<u32>]) {
    let vanilla: HashMap<(String, String, usize), usize> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.mode == "vanilla" || r.mode.starts_with("vanilla@"))
        .map(|(i, r)| ((r.mode.clone(), r.prompt_id.clone(), r.round), i))
        .collect();
    for i in 0..runs.len().min(outputs.len()) {
        let (id, round) = (runs[i].prompt_id.clone(), runs[i].round);
        // Plain decoding on the same weights, else on the weights as stored (where a
        // difference may then be the conversion's, which `diverges_at` locates). Plain
        // decoding on converted weights is compared with the stored weights': how often the
        // conversion changes a greedy output.
        let same = same_weights_vanilla(&runs[i].mode);
        let candidates = if runs[i].mode.starts_with("vanilla@") {
            ["vanilla", "vanilla"]
        } else {
            [same.as_str(), "vanilla"]
        };
        let reference = candidates.into_iter().find_map(|v| vanilla.get(&(v.to_owned(), id.clone(), round)));
        let Some(&v) = reference else {
            continue;
        };
        let diverges_at = diverges_at(&outputs[i], &outputs[v]);
        runs[i].identical_to_vanilla = Some(diverges_at.is_none());
        runs[i].diverges_at = diverges_at;
    }
}

/// Index of the first token where `own` differs from `reference` (the shorter length when
/// one is a prefix of the other); `None` when they are equal.
pub(crate) fn diverges_at(own: &[u32], reference: &[u32]) -> Option<usize> {
    (own != reference).then(|| {
        own.iter().zip(reference).position(|(a, b)| a != b).unwrap_or(own.len().min(reference.len()))
    })
}

/// The name of plain decoding on the weights `mode` runs on: `vanilla@q8_0` for
/// `suffix@q8_0`, `vanilla` for `suffix`.
fn same_weights_vanilla(mode: &str) -> String {
    match mode.rsplit_once('@') {
        Some((_, weights)) => format!("vanilla@{weights}"),
        None => "vanilla".to_owned(),
    }
}

/// The median over prompts (and rounds) of `value(run) / value(reference run)`, pairing
/// each of `runs` with the run of the same prompt and round in `reference`. Prompts where either value is missing or
/// the reference's is not positive are left out; `None` if none is left.
fn ratio_median(
    runs: &[&RunRecord],
    reference: &HashMap<(&str, usize), &RunRecord>,
    value: impl Fn(&RunRecord) -> Option<f64>,
) -> Option<f64> {
    median(runs.iter().filter_map(|r| {
        let base = value(reference.get(&(r.prompt_id.as_str(), r.round))?)?;
        (base > 0.0).then_some(value(r)? / base)
    }))
}

fn decode(r: &RunRecord) -> Option<f64> {
    r.decode_tok_per_s
}

fn prefill(r: &RunRecord) -> Option<f64> {
    Some(r.prefill_tok_per_s)
}

fn memory(r: &RunRecord) -> Option<f64> {
    Some(r.generation_memory_bytes as f64)
}

/// The median over prompts (and rounds) of `run's prefill seconds − the reference run's`, in
/// milliseconds; `None` without pairs.
fn first_token_gap_ms(runs: &[&RunRecord], reference: &HashMap<(&str, usize), &RunRecord>) -> Option<f64> {
    median(runs.iter().filter_map(|r| {
        let base = reference.get(&(r.prompt_id.as_str(), r.round))?;
        Some((r.prefill_seconds - base.prefill_seconds) * 1e3)
    }))
}

/// Summarise `runs` per mode, for each of `modes` (names; a mode without runs gets an empty
/// summary). Ratios are medians of per-prompt ratios, so one long prompt does not dominate
/// and each prompt is compared with itself under the other mode.
pub fn summarize(runs: &[RunRecord], modes: &[String]) -> BTreeMap<String, ModeSummary> {
    let of_mode = |mode: &str| -> HashMap<(&str, usize), &RunRecord> {
        runs.iter().filter(|r| r.mode == mode).map(|r| ((r.prompt_id.as_str(), r.round), r)).collect()
    };
    let vanilla = of_mode("vanilla");
    let llama = of_mode("llama.cpp");
    let vs = |own: &[&RunRecord],
              reference: &HashMap<(&str, usize), &RunRecord>,
              value: fn(&RunRecord) -> Option<f64>| {
        if reference.is_empty() { None } else { ratio_median(own, reference, value) }
    };

    let socket_vanilla = of_mode(&format!("{SOCKET_PREFIX}vanilla"));
    let mut summary = BTreeMap::new();
    for mode in modes {
        let own: Vec<&RunRecord> = runs.iter().filter(|r| r.mode == *mode).collect();
        // Through pocketd, a mode is compared with plain decoding through pocketd where that
        // ran, and with itself in this process.
        let through = mode.strip_prefix(SOCKET_PREFIX);
        let in_process = through.map(&of_mode).unwrap_or_default();
        let vanilla =
            if through.is_some() && !socket_vanilla.is_empty() { &socket_vanilla } else { &vanilla };
        let same_name = same_weights_vanilla(mode);
        let same = if same_name == "vanilla" { HashMap::new() } else { of_mode(&same_name) };
        let naive = if mode.starts_with(NAIVE_PREFIX) {
            HashMap::new()
        } else {
            of_mode(&format!("{NAIVE_PREFIX}{mode}"))
        };
        let mut kinds: BTreeMap<_, Vec<&RunRecord>> = BTreeMap::new();
        for r in &own {
            kinds.entry(r.kind).or_default().push(r);
        }
        let by_kind = kinds
            .into_iter()
            .map(|(kind, rs)| {
                let s = KindSummary {
                    runs: rs.len(),
                    decode_tok_per_s_median: median(rs.iter().filter_map(|r| decode(r))),
                    prefill_tok_per_s_median: median(rs.iter().filter_map(|r| prefill(r))),
                    speedup_vs_vanilla: vs(&rs, vanilla, decode),
                    speedup_vs_same_weights: vs(&rs, &same, decode),
                };
                (kind, s)
            })
            .collect();
        let drafted: u64 = own.iter().map(|r| r.drafted).sum();
        let accepted: u64 = own.iter().map(|r| r.accepted).sum();
        let identical: Vec<Option<bool>> = own.iter().map(|r| r.identical_to_vanilla).collect();
        let all_identical = if identical.is_empty() || identical.iter().any(Option::is_none) {
            None
        } else {
            Some(identical.iter().all(|i| *i == Some(true)))
        };
        summary.insert(
            mode.clone(),
            ModeSummary {
                runs: own.len(),
                decode_tok_per_s_median: median(own.iter().filter_map(|r| decode(r))),
                prefill_tok_per_s_median: median(own.iter().filter_map(|r| prefill(r))),
                speedup_vs_vanilla: vs(&own, vanilla, decode),
                speedup_vs_same_weights: vs(&own, &same, decode),
                decode_vs_llama_cpp: vs(&own, &llama, decode),
                prefill_vs_llama_cpp: vs(&own, &llama, prefill),
                by_kind,
                acceptance: (drafted > 0).then(|| accepted as f64 / drafted as f64),
                all_identical,
                peak_rss_bytes_max: own.iter().map(|r| r.peak_rss_bytes).max().unwrap_or(0),
                generation_memory_bytes_median: median(own.iter().filter_map(|r| memory(r)))
                    .map(|m| m as u64),
                decode_vs_naive: vs(&own, &naive, decode),
                memory_vs_naive: vs(&own, &naive, memory),
                other_cpu_cores_median: median(own.iter().filter_map(|r| r.other_cpu_cores)),
                decode_vs_in_process: vs(&own, &in_process, decode),
                prefill_vs_in_process: vs(&own, &in_process, prefill),
                first_token_gap_ms: first_token_gap_ms(&own, &in_process),
            },
        );
    }
    summary
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::workload::Kind;

    /// A run with the fields the summary reads; the rest zero.
    pub(crate) fn run(mode: &str, id: &str, kind: Kind, decode: Option<f64>, prefill: f64) -> RunRecord {
        RunRecord {
            mode: mode.into(),
            prompt_id: id.into(),
            round: 0,
            kind,
            prompt_tokens: 10,
            generated_tokens: 20,
            prefill_tok_per_s: prefill,
            decode_tok_per_s: decode,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
            drafted: 0,
            accepted: 0,
            mean_accepted_len: None,
            drafter: None,
            peak_rss_bytes: 100,
            generation_memory_bytes: 0,
            plan: None,
            kv_bytes_per_token: 0,
            output_sha256: format!("sha-{id}"),
            identical_to_vanilla: None,
            diverges_at: None,
            other_cpu_cores: Some(0.0),
            passes: None,
        }
    }

    #[test]
    fn a_mode_is_compared_with_its_naive_form() {
        let mut runs = Vec::new();
        for (id, budgeted, naive) in [("a", (95.0, 30), (100.0, 100)), ("b", (50.0, 20), (50.0, 80))] {
            let mut r = run("draft:m", id, Kind::Qa, Some(budgeted.0), 1.0);
            r.generation_memory_bytes = budgeted.1;
            let mut n = run("naive:draft:m", id, Kind::Qa, Some(naive.0), 1.0);
            n.generation_memory_bytes = naive.1;
            runs.extend([r, n]);
        }
        let s = summarize(&runs, &["draft:m".into(), "naive:draft:m".into()]);
        let d = &s["draft:m"];
        assert_eq!(d.decode_vs_naive, Some((0.95 + 1.0) / 2.0));
        assert_eq!(d.memory_vs_naive, Some((0.3 + 0.25) / 2.0));
        assert_eq!(d.generation_memory_bytes_median, Some(25));
        assert_eq!((s["naive:draft:m"].decode_vs_naive, s["naive:draft:m"].memory_vs_naive), (None, None));
    }

    #[test]
    fn rounds_pair_runs_of_the_same_round() {
        let mut runs = Vec::new();
        for (round, (l, v)) in [(100.0, 50.0), (10.0, 100.0), (100.0, 100.0)].into_iter().enumerate() {
            let mut a = run("llama.cpp", "a", Kind::Qa, Some(l), 1.0);
            let mut b = run("vanilla", "a", Kind::Qa, Some(v), 1.0);
            (a.round, b.round) = (round, round);
            runs.extend([a, b]);
        }
        // Outputs differ only in round 1.
        let mut outputs = vec![vec![1, 2]; 6];
        outputs[2] = vec![1, 3];
        compare_outputs(&mut runs, &outputs);
        let identical: Vec<_> = runs.iter().map(|r| r.identical_to_vanilla).collect();
        assert_eq!(identical, [true, true, false, true, true, true].map(Some));
        // vanilla / llama.cpp per round: 0.5, 10, 1 → 1.
        let s = summarize(&runs, &["llama.cpp".into(), "vanilla".into()]);
        assert_eq!(s["vanilla"].decode_vs_llama_cpp, Some(1.0));
        assert_eq!(s["vanilla"].runs, 3);
    }

    #[test]
    fn an_output_that_is_a_prefix_diverges_where_it_ends() {
        let mut runs =
            vec![run("vanilla", "a", Kind::Qa, None, 1.0), run("llama.cpp", "a", Kind::Qa, None, 1.0)];
        compare_outputs(&mut runs, &[vec![4, 5, 6], vec![4, 5]]);
        assert_eq!(runs[1].diverges_at, Some(2));
        assert_eq!(runs[1].identical_to_vanilla, Some(false));
    }

    #[test]
    fn speedups_are_medians_of_per_prompt_ratios() {
        use Kind::*;
        let mut runs = vec![
            // Alternating as the benchmark runs them.
            run("llama.cpp", "a", Edit, Some(100.0), 1000.0),
            run("vanilla", "a", Edit, Some(90.0), 800.0),
            run("llama.cpp", "b", Edit, Some(120.0), 1000.0),
            run("vanilla", "b", Edit, Some(120.0), 1100.0),
            run("llama.cpp", "c", Qa, Some(50.0), 500.0),
            run("vanilla", "c", Qa, Some(60.0), 400.0),
            // One token generated: no decode rate, left out of decode medians and ratios.
            run("llama.cpp", "d", Qa, None, 2000.0),
            run("vanilla", "d", Qa, None, 2000.0),
        ];
        runs[4].peak_rss_bytes = 300;
        // Prompt c: llama.cpp's output leaves vanilla's at token 2.
        let mut outputs = vec![vec![1, 2, 3]; runs.len()];
        outputs[4] = vec![1, 2, 9, 9];
        compare_outputs(&mut runs, &outputs);
        assert_eq!(runs[0].identical_to_vanilla, Some(true));
        assert_eq!(runs[0].diverges_at, None);
        assert_eq!(runs[4].identical_to_vanilla, Some(false));
        assert_eq!(runs[4].diverges_at, Some(2));
        assert_eq!(runs[5].identical_to_vanilla, Some(true));

        let modes = vec!["llama.cpp".to_string(), "vanilla".to_string()];
        let s = summarize(&runs, &modes);
        let v = &s["vanilla"];
        let l = &s["llama.cpp"];
        assert_eq!(v.runs, 4);
        // vanilla decode: 90, 120, 60 → median 90; llama.cpp: 100, 120, 50 → 100.
        assert_eq!(v.decode_tok_per_s_median, Some(90.0));
        assert_eq!(l.decode_tok_per_s_median, Some(100.0));
        // Prefill: 800, 1100, 400, 2000 → (800 + 1100) / 2.
        assert_eq!(v.prefill_tok_per_s_median, Some(950.0));
        // Per-prompt decode ratios vanilla / llama.cpp: 0.9, 1.0, 1.2 → 1.0. (The ratio of
        // the medians would be 0.9.)
        assert_eq!(v.decode_vs_llama_cpp, Some(1.0));
        // llama.cpp / vanilla: 100/90, 1.0, 50/60 → 1.0.
        assert_eq!(l.speedup_vs_vanilla, Some(1.0));
        assert_eq!(v.speedup_vs_vanilla, Some(1.0));
        // Prefill ratios: 0.8, 1.1, 0.8, 1.0 → 0.9.
        assert!((v.prefill_vs_llama_cpp.unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(l.decode_vs_llama_cpp, Some(1.0));
        // Per kind: edit prompts a and b.
        let edit = &l.by_kind[&Edit];
        assert_eq!(edit.runs, 2);
        assert_eq!(edit.decode_tok_per_s_median, Some(110.0));
        // 100/90 and 120/120 → (1.111… + 1) / 2.
        assert!((edit.speedup_vs_vanilla.unwrap() - (100.0 / 90.0 + 1.0) / 2.0).abs() < 1e-12);
        assert_eq!(l.by_kind[&Qa].speedup_vs_vanilla, Some(50.0 / 60.0));
        assert_eq!(l.all_identical, Some(false));
        assert_eq!(v.all_identical, Some(true));
        assert_eq!(l.peak_rss_bytes_max, 300);
        assert_eq!(v.acceptance, None);
    }

    #[test]
    fn without_vanilla_or_llama_cpp_the_ratios_are_null() {
        let mut runs = vec![run("llama.cpp", "a", Kind::Chat, Some(10.0), 100.0)];
        compare_outputs(&mut runs, &[vec![1]]);
        assert_eq!(runs[0].identical_to_vanilla, None);
        let s = summarize(&runs, &["llama.cpp".to_string()]);
        let l = &s["llama.cpp"];
        assert_eq!(l.speedup_vs_vanilla, None);
        assert_eq!(l.all_identical, None);
        assert_eq!(l.decode_vs_llama_cpp, Some(1.0));

        let mut drafted = run("suffix", "a", Kind::Chat, Some(20.0), 100.0);
        drafted.drafted = 8;
        drafted.accepted = 6;
        let s = summarize(&[drafted], &["suffix".to_string()]);
        assert_eq!(s["suffix"].acceptance, Some(0.75));
        assert_eq!(s["suffix"].decode_vs_llama_cpp, None);
    }

    #[test]
    fn converted_weights_are_compared_with_plain_decoding_on_the_same_weights() {
        let runs_of = |mode: &str, tok_s: f64| run(mode, "a", Kind::Edit, Some(tok_s), 1.0);
        let mut runs =
            vec![runs_of("vanilla", 100.0), runs_of("vanilla@q8_0", 90.0), runs_of("suffix@q8_0", 120.0)];
        // The conversion changed the output at token 1; speculation on it did not.
        let outputs = vec![vec![1, 2, 3], vec![1, 5, 6], vec![1, 5, 6]];
        compare_outputs(&mut runs, &outputs);
        assert_eq!(runs[1].identical_to_vanilla, Some(false));
        assert_eq!(runs[1].diverges_at, Some(1));
        assert_eq!(runs[2].identical_to_vanilla, Some(true));
        let modes: Vec<String> = runs.iter().map(|r| r.mode.clone()).collect();
        let s = summarize(&runs, &modes);
        assert_eq!(s["suffix@q8_0"].speedup_vs_vanilla, Some(1.2));
        assert!((s["suffix@q8_0"].speedup_vs_same_weights.unwrap() - 120.0 / 90.0).abs() < 1e-12);
        assert_eq!(s["suffix@q8_0"].all_identical, Some(true));
        assert_eq!(s["vanilla@q8_0"].all_identical, Some(false));
        assert_eq!(s["vanilla"].speedup_vs_same_weights, None);
    }
}
