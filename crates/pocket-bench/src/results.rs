//! The results document (`--json FILE`), in the shape `shared/bench/README.md` defines, so
//! that runs from different machines can be compared. Fields beyond the README's are
//! additions; none of the README's is renamed or dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::workload::Kind;

/// One benchmark: where it ran, on what, how, and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// The version of pocket that ran it.
    pub pocket_version: String,
    /// The machine.
    pub machine: Machine,
    /// The model.
    pub model: BenchModel,
    /// How it was run.
    pub settings: Settings,
    /// Our engine's verification cost curve t(n)/t(1), for the weight format of the first
    /// of our modes; empty when not measured.
    pub cost_curve: Vec<CostPoint>,
    /// The cost curve of every weight format the modes ran on (`stored`, `q8_0`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_curves_by_weights: BTreeMap<String, Vec<CostPoint>>,
    /// Every measured run, in the order they ran (modes alternating per prompt).
    pub runs: Vec<RunRecord>,
    /// Per mode (by name).
    pub summary: BTreeMap<String, ModeSummary>,
}

impl BenchResults {
    /// The modes in the order they first ran (the summary's order is alphabetical).
    pub fn modes(&self) -> Vec<&str> {
        let mut modes: Vec<&str> = Vec::new();
        for run in &self.runs {
            if !modes.contains(&run.mode.as_str()) {
                modes.push(&run.mode);
            }
        }
        modes
    }
}

/// The machine a benchmark ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name (from `/proc/cpuinfo`; under qemu-user, the host's).
    pub cpu: String,
    /// The architecture the binary was built for (`x86_64`, `aarch64`); results written
    /// before there was the field lack it.
    #[serde(default)]
    pub arch: Option<String>,
    /// Threads the engines were given.
    pub threads: usize,
    /// The ggml device the models ran on (`CPU`, `CUDA0`, ...).
    pub backend: String,
    /// Our own matrix kernels used beside ggml's (`q4_1-avx512`, ..., or `ggml`); results
    /// written before there were any lack the field.
    #[serde(default)]
    pub kernels: Option<String>,
}

/// The model benchmarked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchModel {
    /// Manifest name, or the file's stem for a model given by path.
    pub name: String,
    /// sha256 of the model file, hex.
    pub file_sha256: String,
    /// Bytes of the model file.
    pub weights_bytes: u64,
    /// The engine that ran our modes (`ggml`, `tract`); results written before there was the
    /// field lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// How the benchmark was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// KV cache type (`f16`, `q8_0`, `q4_0`).
    pub kv: String,
    /// The memory budget, when one was enforced.
    pub memory_budget_bytes: Option<u64>,
    /// Sampling seed (unused by greedy decoding, recorded for when sampling is benchmarked).
    pub seed: u64,
    /// Whether decoding was greedy.
    pub greedy: bool,
    /// Context length of every mode's session.
    pub n_ctx: usize,
    /// Most tokens per forward pass (prefill is split into passes of this size).
    pub n_batch: usize,
    /// The cap put on every prompt's `max_tokens`, if any.
    pub max_tokens_cap: Option<usize>,
    /// The workload file.
    pub workload: String,
    /// Context position the cost curve was measured at.
    pub cost_curve_context: usize,
    /// Timed repetitions per cost-curve point (the median is reported).
    pub cost_curve_repetitions: usize,
    /// Passes over the workload; each prompt runs once per mode in each.
    pub rounds: usize,
    /// How the measured runs started: `cold` (no warm-up run) or `warm`; results written
    /// before there was the field warmed up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<crate::Start>,
    /// pocketd's socket, when `socket:` modes ran through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// One point of the cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostPoint {
    /// Tokens in the decode call (logits for all of them).
    pub n: usize,
    /// Median seconds of one call.
    pub seconds: f64,
    /// `seconds` relative to n = 1.
    pub relative: f64,
}

impl From<pocket_core::cost::CostPoint> for CostPoint {
    fn from(p: pocket_core::cost::CostPoint) -> Self {
        CostPoint { n: p.n, seconds: p.seconds, relative: p.relative }
    }
}

/// One prompt run in one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The mode.
    pub mode: String,
    /// The prompt's id.
    pub prompt_id: String,
    /// Which pass over the workload this run belongs to (0-based; see `settings.rounds`).
    pub round: usize,
    /// The prompt's kind.
    pub kind: Kind,
    /// Tokens of the prompt (chat template applied).
    pub prompt_tokens: usize,
    /// Tokens generated (the end token not counted).
    pub generated_tokens: usize,
    /// Prompt tokens over the time until the first token was chosen.
    pub prefill_tok_per_s: f64,
    /// Tokens after the first over the time after the first; `null` when fewer than two
    /// tokens were generated (no decode phase to time).
    pub decode_tok_per_s: Option<f64>,
    /// Seconds of prefill.
    pub prefill_seconds: f64,
    /// Seconds of decoding after the first token.
    pub decode_seconds: f64,
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Mean accepted tokens per verification with a draft; `null` without drafts.
    pub mean_accepted_len: Option<f64>,
    /// What the drafter did (for `auto`, the share of steps of each choice); `null` without
    /// speculation.
    #[serde(default)]
    pub drafter: Option<String>,
    /// Peak resident memory of the process during this run.
    pub peak_rss_bytes: u64,
    /// What the run's generation state held at its peak, beside the weights. Our engine's
    /// modes: the peak of what its sessions and drafter reserved in the memory ledger during
    /// the run — compute buffers, KV cache, logits rows, a draft model's session — which the
    /// tests show predicts resident memory within 5%. `llama.cpp`: its KV cache, allocated for
    /// the whole context when its context was made, plus what the process's resident memory
    /// grew by during the run.
    pub generation_memory_bytes: u64,
    /// What the session was given under the memory budget; absent without one (and for
    /// `naive:` modes, which are not planned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<pocket_core::memory::Plan>,
    /// KV cache bytes per token held.
    pub kv_bytes_per_token: u64,
    /// sha256 of the generated token ids as little-endian u32s, hex.
    pub output_sha256: String,
    /// Whether the generated tokens equal `vanilla`'s for this prompt (true for `vanilla`
    /// itself); `null` when `vanilla` did not run.
    pub identical_to_vanilla: Option<bool>,
    /// Index of the first generated token that differs from `vanilla`'s (the shorter
    /// length when one output is a prefix of the other); `null` when identical or without
    /// `vanilla`.
    pub diverges_at: Option<usize>,
    /// CPU cores other processes kept busy during this run, on average (steal time of a
    /// virtual machine included); `null` where `/proc` does not say. Well above 0, the run
    /// competed for the CPU and its speed says little about the engine.
    pub other_cpu_cores: Option<f64>,
}

/// The summary of one mode over the whole workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeSummary {
    /// Runs summarised.
    pub runs: usize,
    /// Median decode tok/s over the runs that had a decode phase.
    pub decode_tok_per_s_median: Option<f64>,
    /// Median prefill tok/s.
    pub prefill_tok_per_s_median: Option<f64>,
    /// Median over prompts of this mode's decode tok/s over `vanilla`'s; `null` without
    /// `vanilla`.
    pub speedup_vs_vanilla: Option<f64>,
    /// For a mode on converted weights (`suffix@q8_0`): the same over plain decoding on
    /// those weights (`vanilla@q8_0`); `null` otherwise or without that mode.
    #[serde(default)]
    pub speedup_vs_same_weights: Option<f64>,
    /// Median over prompts of this mode's decode tok/s over `llama.cpp`'s; `null` without
    /// `llama.cpp`.
    pub decode_vs_llama_cpp: Option<f64>,
    /// Median over prompts of this mode's prefill tok/s over `llama.cpp`'s.
    pub prefill_vs_llama_cpp: Option<f64>,
    /// The same, per prompt kind.
    pub by_kind: BTreeMap<Kind, KindSummary>,
    /// Accepted over drafted tokens; `null` for modes that do not draft.
    pub acceptance: Option<f64>,
    /// Whether every run's output equals plain decoding's on the same weights (`vanilla`, or
    /// `vanilla@q8_0` for `suffix@q8_0` when it ran, else `vanilla`); `null` without either.
    pub all_identical: Option<bool>,
    /// The highest peak RSS of any run.
    pub peak_rss_bytes_max: u64,
    /// Median over runs of the generation memory.
    #[serde(default)]
    pub generation_memory_bytes_median: Option<u64>,
    /// For a mode run beside its `naive:` form (`draft:M` and `naive:draft:M`): the median
    /// over prompts of its decode tok/s over the naive form's; `null` otherwise.
    #[serde(default)]
    pub decode_vs_naive: Option<f64>,
    /// The same for generation memory: its bytes over the naive form's.
    #[serde(default)]
    pub memory_vs_naive: Option<f64>,
    /// Median over runs of the CPU cores other processes kept busy.
    pub other_cpu_cores_median: Option<f64>,
    /// For a mode run through pocketd beside the same mode in process (`socket:auto` and
    /// `auto`): the median over prompts of its decode tok/s over the in-process one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_vs_in_process: Option<f64>,
    /// The same for prefill tok/s (the time to the first token, seen by the client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_vs_in_process: Option<f64>,
    /// The same as a difference: the median over prompts of its time to the first token
    /// minus the in-process one's, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_gap_ms: Option<f64>,
}

/// The summary of one mode over the prompts of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    /// Runs summarised.
    pub runs: usize,
    /// Median decode tok/s.
    pub decode_tok_per_s_median: Option<f64>,
    /// Median prefill tok/s.
    pub prefill_tok_per_s_median: Option<f64>,
    /// Median over prompts of decode tok/s over `vanilla`'s.
    pub speedup_vs_vanilla: Option<f64>,
    /// The same over plain decoding on the same converted weights (see [`ModeSummary`]).
    #[serde(default)]
    pub speedup_vs_same_weights: Option<f64>,
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::Value;

    use super::*;
    use crate::summary::tests::run;
    use crate::summary::{compare_outputs, summarize};

    /// A small but complete document: two modes, two prompts of two kinds.
    pub(crate) fn sample() -> BenchResults {
        let mut runs = vec![
            run("llama.cpp", "e1", Kind::Edit, Some(130.0), 1500.0),
            run("vanilla", "e1", Kind::Edit, Some(125.0), 1400.0),
            run("llama.cpp", "q1", Kind::Qa, Some(120.0), 900.0),
            run("vanilla", "q1", Kind::Qa, Some(118.0), 950.0),
        ];
        compare_outputs(&mut runs, &vec![vec![1, 2]; 4]);
        let summary = summarize(&runs, &["llama.cpp".into(), "vanilla".into()]);
        BenchResults {
            pocket_version: "0.1.0".into(),
            machine: Machine {
                cpu: "AMD EPYC".into(),
                arch: Some("x86_64".into()),
                threads: 2,
                backend: "CPU".into(),
                kernels: Some("ggml".into()),
            },
            model: BenchModel {
                name: "smollm2-135m".into(),
                file_sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53".into(),
                weights_bytes: 98362432,
                engine: Some("ggml".into()),
            },
            settings: Settings {
                kv: "f16".into(),
                memory_budget_bytes: None,
                seed: 0,
                greedy: true,
                n_ctx: 768,
                n_batch: 256,
                max_tokens_cap: None,
                workload: "benches/workload.jsonl".into(),
                cost_curve_context: 128,
                cost_curve_repetitions: 9,
                rounds: 1,
                start: Some(crate::Start::Cold),
                socket: None,
            },
            cost_curve: [(1, 0.0071, 1.0), (2, 0.0093, 1.31), (4, 0.0140, 1.97)]
                .map(|(n, seconds, relative)| CostPoint { n, seconds, relative })
                .to_vec(),
            cost_curves_by_weights: BTreeMap::new(),
            runs,
            summary,
        }
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object().expect("an object").keys().map(String::as_str).collect()
    }

    /// Every field the README's example has must be there (more are allowed).
    fn has_all(v: &Value, want: &[&str]) {
        let got = keys(v);
        for k in want {
            assert!(got.contains(k), "field {k:?} missing; got {got:?}");
        }
    }

    #[test]
    fn json_has_the_readme_shape() {
        let v = serde_json::to_value(sample()).unwrap();
        has_all(&v, &["pocket_version", "machine", "model", "settings", "cost_curve", "runs", "summary"]);
        has_all(&v["machine"], &["cpu", "threads", "backend"]);
        has_all(&v["model"], &["name", "file_sha256", "weights_bytes"]);
        has_all(&v["settings"], &["kv", "memory_budget_bytes", "seed", "greedy"]);
        assert_eq!(v["settings"]["kv"], "f16");
        assert_eq!(v["settings"]["memory_budget_bytes"], Value::Null);
        for p in v["cost_curve"].as_array().unwrap() {
            has_all(p, &["n", "seconds", "relative"]);
        }
        let run = &v["runs"][0];
        has_all(
            run,
            &[
                "mode",
                "prompt_id",
                "kind",
                "prompt_tokens",
                "generated_tokens",
                "prefill_tok_per_s",
                "decode_tok_per_s",
                "drafted",
                "accepted",
                "mean_accepted_len",
                "peak_rss_bytes",
                "generation_memory_bytes",
                "kv_bytes_per_token",
                "output_sha256",
                "identical_to_vanilla",
            ],
        );
        assert_eq!(run["mode"], "llama.cpp");
        assert_eq!(run["kind"], "edit");
        assert_eq!(run["mean_accepted_len"], Value::Null);
        assert_eq!(run["identical_to_vanilla"], true);
        assert_eq!(keys(&v["summary"]), vec!["llama.cpp", "vanilla"]);
        let vanilla = &v["summary"]["vanilla"];
        has_all(
            vanilla,
            &[
                "decode_tok_per_s_median",
                "prefill_tok_per_s_median",
                "speedup_vs_vanilla",
                "by_kind",
                "acceptance",
                "all_identical",
                "peak_rss_bytes_max",
            ],
        );
        assert_eq!(vanilla["speedup_vs_vanilla"], 1.0);
        assert_eq!(vanilla["acceptance"], Value::Null);
        assert_eq!(vanilla["all_identical"], true);
        assert_eq!(keys(&vanilla["by_kind"]), vec!["edit", "qa"]);
        has_all(&vanilla["by_kind"]["edit"], &["speedup_vs_vanilla"]);
        assert_eq!(vanilla["by_kind"]["edit"]["speedup_vs_vanilla"], 1.0);
    }

    #[test]
    fn json_round_trips() {
        let r = sample();
        // Through a `Value`, floats are carried exactly.
        let back: BenchResults = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        // Through text, serde_json may move a float by one ulp; everything else is exact.
        let text = serde_json::to_string_pretty(&r).unwrap();
        let back: BenchResults = serde_json::from_str(&text).unwrap();
        assert_eq!((&back.machine, &back.model, &back.settings), (&r.machine, &r.model, &r.settings));
        assert_eq!(back.runs, r.runs);
    }

    #[test]
    fn results_written_before_the_kernels_field_still_load() {
        let mut v = serde_json::to_value(sample()).unwrap();
        v["machine"].as_object_mut().unwrap().remove("kernels");
        let back: BenchResults = serde_json::from_value(v).unwrap();
        assert_eq!(back.machine.kernels, None);
        assert_eq!(back.machine.backend, "CPU");
    }
}
