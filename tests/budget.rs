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
fn a_long_request_degrades_the_kv_cache_then_is_refused() {
    // 3500 tokens of f16 KV are 77 MiB; the plan gives up precision as the budget shrinks, and
    // the run (which ends at the poem's first line) stays under it.
    let mut kv_types = Vec::new();
    for budget in [260, 200, 175] {
        let r = run(budget, &["--spec", "suffix", "-n", "3500", "--stop", "\n"])
            .unwrap_or_else(|e| panic!("{budget} MiB: {e}"));
        assert!(r["peak_rss_bytes"].as_u64().unwrap() <= budget * MIB);
        kv_types.push(r["plan"]["kv"].as_str().unwrap().to_owned());
        let degraded = r["plan"]["degraded"].as_array().unwrap();
        assert_eq!(degraded.is_empty(), kv_types.last().unwrap() == "f16", "{degraded:?}");
    }
    assert_eq!(kv_types, ["f16", "q8_0", "q4_0"]);
    let e = run(150, &["--spec", "suffix", "-n", "3500", "--stop", "\n"])
        .expect_err("150 MiB cannot hold 3500 tokens");
    assert!(e.contains("a session of") && e.contains("needs") && e.contains("free"), "{e}");
}

#[test]
fn a_budget_that_is_not_a_size_is_refused_naming_the_forms_allowed() {
    let o = pocket(&["run", "--memory-budget", "12parsecs", "hello"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("12parsecs") && e.contains("200MiB") && !e.contains("panicked"), "{e}");
}
