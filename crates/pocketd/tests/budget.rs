//! `--memory-budget` end to end: each run is its own `pocket` process, so its peak resident
//! memory (VmHWM, reported as `peak_rss_bytes`) is that run's alone.

use std::process::{Command, Output};

fn pocket(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).output().expect("the pocket binary runs")
}

const MIB: u64 = 1 << 20;

/// `pocket run` under `budget` MiB: its JSON report, or its error message.
fn run(budget: u64, extra: &[&str]) -> Result<serde_json::Value, String> {
    let budget = format!("{budget}MiB");
    let mut args = vec!["run", "--memory-budget", &budget, "--json", "-t", "1", "--chat"];
    args.extend_from_slice(extra);
    args.push("Write a short poem about the sea.");
    let o = pocket(&args);
    if o.status.success() {
        Ok(serde_json::from_slice(&o.stdout).expect("one JSON object"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

#[test]
fn peak_memory_stays_under_every_budget_or_the_run_is_refused_cleanly() {
    for budget in [160, 200, 300] {
        for spec in ["off", "suffix", "auto", "layerskip"] {
            let r = run(budget, &["--spec", spec, "-n", "96"])
                .unwrap_or_else(|e| panic!("{budget} MiB, {spec}: {e}"));
            let peak = r["peak_rss_bytes"].as_u64().unwrap();
            assert!(peak <= budget * MIB, "{budget} MiB, {spec}: peak {} MiB", peak / MIB);
            assert_eq!(r["memory_budget_bytes"].as_u64(), Some(budget * MIB));
            let plan = &r["plan"];
            assert!(plan["bytes"].as_u64().unwrap() <= plan["available"].as_u64().unwrap(), "{plan}");
        }
    }
    // Too small for the weights: an error naming what was needed and free, not a crash.
    let e = run(100, &[]).expect_err("100 MiB cannot hold SmolLM2");
    assert!(e.contains("over the memory budget") && e.contains("weights") && e.contains("MiB"), "{e}");
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_long_request_degrades_in_the_designed_order_then_is_refused() {
    // 3500 tokens of f16 KV are 77 MiB. As the budget shrinks the plan gives up, in order,
    // the prompt's pass size, draft length, speculation, then KV precision (values before
    // keys: SmolLM2 keeps its tokens less well with 4-bit keys, so the ladder stops at q8_0
    // keys with q4_0 values); every run (which ends at the poem's first line) stays under its
    // budget.
    let rank = |p: &serde_json::Value| {
        let kv = ["f16", "q8_0", "q8_0/q4_0"].iter().position(|k| p["kv"] == *k).unwrap();
        let spec = usize::from(p["spec"] == "off");
        let (k, n_batch) = (p["max_draft"].as_u64().unwrap(), p["n_batch"].as_u64().unwrap());
        (kv, spec, u64::MAX - k, u64::MAX - n_batch)
    };
    let mut plans: Vec<serde_json::Value> = Vec::new();
    let mut refused = None;
    for budget in (150..=260).rev().step_by(5) {
        match run(budget, &["--spec", "suffix", "-n", "3500", "--stop", "\n"]) {
            Ok(r) => {
                assert!(refused.is_none(), "{budget} MiB fits but {refused:?} MiB did not");
                assert!(r["peak_rss_bytes"].as_u64().unwrap() <= budget * MIB, "{budget} MiB");
                plans.push(r["plan"].clone());
            }
            Err(e) => {
                assert!(e.contains("a session of") && e.contains("needs") && e.contains("free"), "{e}");
                refused.get_or_insert(budget);
            }
        }
    }
    for w in plans.windows(2) {
        assert!(rank(&w[0]) <= rank(&w[1]), "{} came after {}", w[1], w[0]);
    }
    let first = &plans[0];
    assert!(first["degraded"].as_array().unwrap().is_empty() && first["kv"] == "f16", "{first}");
    let gave_up = |what: &str, kv: Option<&str>| {
        plans.iter().any(|p| {
            p["degraded"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["gave_up"] == what && kv.is_none_or(|k| d["kv"] == k))
        })
    };
    assert!(gave_up("smaller_passes", None), "smaller prompt passes: {plans:?}");
    assert!(gave_up("lower_kv", Some("q8_0")) && gave_up("lower_kv", Some("q8_0/q4_0")), "{plans:?}");
    assert!(!gave_up("lower_kv", Some("q4_0")), "4-bit keys are never given unasked: {plans:?}");
    assert!(refused.is_some(), "150 MiB cannot hold 3500 tokens");
}

#[test]
fn a_budget_that_is_not_a_size_is_refused_naming_the_forms_allowed() {
    let o = pocket(&["run", "--memory-budget", "12parsecs", "hello"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("12parsecs") && e.contains("200MiB") && !e.contains("panicked"), "{e}");
}

#[test]
fn bench_plans_each_run_under_the_budget_and_compares_with_caches_held_whole() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    #[rustfmt::skip]
    let o = pocket(&[
        "bench", "--memory-budget", "200MiB", "--ctx-size", "2048", "--modes", "vanilla,suffix,naive:suffix",
        "--max-prompts", "2", "--max-tokens-cap", "24", "-t", "1", "--no-cost-curve",
        "--json", json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["settings"]["memory_budget_bytes"].as_u64(), Some(200 * MIB));
    let kv_per_token = r["runs"][0]["kv_bytes_per_token"].as_u64().unwrap();
    for run in r["runs"].as_array().unwrap() {
        let memory = run["generation_memory_bytes"].as_u64().unwrap();
        assert_eq!(run["identical_to_vanilla"], true, "{run}");
        if run["mode"] == "naive:suffix" {
            assert!(run["plan"].is_null(), "naive modes are not planned: {run}");
            assert!(memory >= 2048 * kv_per_token, "the whole context's KV: {run}");
        } else {
            let plan = &run["plan"];
            assert!(plan["bytes"].as_u64().unwrap() <= plan["available"].as_u64().unwrap(), "{run}");
            assert!(memory <= plan["bytes"].as_u64().unwrap(), "the plan bounds what the run held: {run}");
            assert!(run["peak_rss_bytes"].as_u64().unwrap() <= 200 * MIB, "{run}");
        }
    }
    let vs_naive = r["summary"]["suffix"]["memory_vs_naive"].as_f64().unwrap();
    assert!(vs_naive < 0.5, "growing the cache holds under half of the whole context's: {vs_naive}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("suffix vs naive:suffix"));
}

#[test]
fn a_bench_context_that_cannot_hold_the_workload_is_refused_with_the_numbers() {
    for (ctx, says) in [("16", "too small for this workload"), ("100000", "exceeds the model's")] {
        #[rustfmt::skip]
        let o = pocket(&["bench", "--ctx-size", ctx, "--max-prompts", "1", "--max-tokens-cap", "8", "--no-cost-curve"]);
        assert!(!o.status.success(), "--ctx-size {ctx}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(says) && e.contains(ctx) && !e.contains("panicked"), "{e}");
    }
}
