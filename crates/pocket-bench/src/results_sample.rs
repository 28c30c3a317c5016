//! A sample results document for tests (two modes, two prompts; with replayed conversations),
//! and the tests of the results format itself. Kept apart from `results.rs` so that the
//! format's file imports nothing that imports it back (the sample is built with the summary
//! code, which reads the format).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::results::*;
use crate::summary::tests::run;
use crate::summary::{compare_outputs, summarize};
use crate::workload::Kind;

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
            placement: Vec::new(),
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
            workload: "crates/pocket-bench/workload.jsonl".into(),
            cost_curve_context: 128,
            cost_curve_repetitions: 9,
            rounds: 1,
            start: Some(crate::Start::Cold),
            socket: None,
            load: 0,
            concurrent: 1,
        },
        cost_curve: [(1, 0.0071, 1.0), (2, 0.0093, 1.31), (4, 0.0140, 1.97)]
            .map(|(n, seconds, relative)| CostPoint { n, seconds, relative })
            .to_vec(),
        cost_curves_by_weights: BTreeMap::new(),
        runs,
        summary,
        concurrency: None,
        conversations: None,
        agentic: None,
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

/// [`sample`] with replayed conversations.
pub(crate) fn sample_with_conversations() -> BenchResults {
    use crate::conversation::summary::{compare_turns, summarize, tests::sample_turns};
    let mut turns = sample_turns();
    let outputs = vec![vec![7, 8]; turns.len()];
    compare_turns(&mut turns, &outputs, "no-cache");
    let modes = vec!["no-cache".to_string(), "cache".to_string()];
    let (by_conversation, summary) = summarize(&turns, &modes);
    BenchResults {
        conversations: Some(ConversationResults {
            modes,
            spec: "off".into(),
            draft_model: None,
            daemon_threads: Some(2),
            turns,
            by_conversation,
            summary,
        }),
        agentic: None,
        ..sample()
    }
}

#[test]
fn conversations_round_trip_and_older_results_without_them_load() {
    let r = sample_with_conversations();
    let v = serde_json::to_value(&r).unwrap();
    let c = &v["conversations"];
    has_all(c, &["modes", "spec", "turns", "by_conversation", "summary"]);
    has_all(
        &c["turns"][0],
        &[
            "mode",
            "conversation_id",
            "turn",
            "prompt_tokens",
            "cached_tokens",
            "ttft_ms",
            "prefill_ms",
            "decode_tok_per_s",
            "generated_tokens",
            "identical_to_vanilla",
        ],
    );
    has_all(
        &c["summary"]["cache"],
        &["reused_share", "ttft_last_over_first_median", "ttft_last_over_second_median"],
    );
    let back: BenchResults = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);

    // Written before conversations were replayed: no such field, and none written back.
    let mut v = serde_json::to_value(sample()).unwrap();
    assert!(v.get("conversations").is_none());
    v.as_object_mut().unwrap().remove("conversations");
    let back: BenchResults = serde_json::from_value(v).unwrap();
    assert_eq!(back.conversations, None);
}

#[test]
fn results_written_before_the_kernels_field_still_load() {
    let mut v = serde_json::to_value(sample()).unwrap();
    v["machine"].as_object_mut().unwrap().remove("kernels");
    let back: BenchResults = serde_json::from_value(v).unwrap();
    assert_eq!(back.machine.kernels, None);
    assert_eq!(back.machine.backend, "CPU");
}
