//! End to end: the real `pocket` binary on the real default model (SmolLM2-135M, pulled by
//! `scripts/test` before the tests run), as a user runs it.

use std::process::{Command, Output};

fn pocket(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).output().expect("the pocket binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails with the instruction to pull rather than with an obscure error.
fn require_default_model() {
    let o = pocket(&["pull", "--list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listing = stdout(&o);
    let line = listing.lines().find(|l| l.contains("smollm2-135m")).expect("the default model is listed");
    assert!(line.split_whitespace().any(|w| w == "pulled"), "run: pocket pull smollm2-135m\n{listing}");
}

#[test]
fn run_with_the_chat_template_answers_the_question() {
    require_default_model();
    let o = pocket(&[
        "run",
        "--chat",
        "What is the capital of France? Answer in one word.",
        "-n",
        "24",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
}

#[test]
fn run_json_reports_tokens_speed_and_memory_split() {
    require_default_model();
    let o = pocket(&["run", "Once upon a time", "-n", "20", "-t", "1", "--kv", "q8_0", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("one JSON object");
    assert_eq!(r["generated_tokens"], 20);
    assert_eq!(r["kv"], "q8_0");
    assert_eq!(r["stop"], "max_tokens");
    assert!(r["prompt_tokens"].as_u64().unwrap() > 0);
    for key in ["prefill_tok_per_s", "decode_tok_per_s"] {
        assert!(r[key].as_f64().unwrap() > 0.0, "{key}: {r}");
    }
    // Weights are file-backed (mapped), the KV cache and buffers anonymous.
    assert!(r["peak_file_bytes"].as_u64().unwrap() > 50 << 20, "{r}");
    assert!(r["peak_anon_bytes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["peak_rss_bytes"].as_u64().unwrap() >= r["peak_file_bytes"].as_u64().unwrap(), "{r}");
}

#[test]
fn parity_ends_with_the_summary_line_and_agrees_with_llama_cpp() {
    require_default_model();
    let o = pocket(&["parity", "-n", "16", "--only", "-t", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let last = out.lines().last().unwrap_or_default();
    assert_eq!(last, "parity: top1 16/16 max_abs_diff 0", "{out}");
}

/// `pocket bench` on the first 2 prompts, 16 tokens each, one thread, no cost curve, with
/// `extra` flags; the results go to `json`.
fn small_bench(json: &std::path::Path, extra: &[&str]) -> Output {
    let mut args =
        vec!["bench", "--max-prompts", "2", "--max-tokens-cap", "16", "--threads", "1", "--no-cost-curve"];
    args.extend_from_slice(extra);
    args.extend(["--json", json.to_str().unwrap()]);
    pocket(&args)
}

#[test]
fn bench_alternates_modes_and_writes_json_and_chart() {
    require_default_model();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = small_bench(&json, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let runs = r["runs"].as_array().unwrap();
    let modes: Vec<&str> = runs.iter().map(|run| run["mode"].as_str().unwrap()).collect();
    assert_eq!(modes.len(), 4);
    assert_ne!(modes[0], modes[1], "modes alternate per prompt: {modes:?}");
    // Every run is compared with plain decoding. llama.cpp's greedy output may part from ours
    // at a near tie (our attention kernel rounds differently from ggml's; the parity tests
    // bound that), so only vanilla's own runs must match.
    assert!(runs.iter().all(|run| run["identical_to_vanilla"].is_boolean()), "{r}");
    assert!(
        runs.iter().filter(|run| run["mode"] == "vanilla").all(|run| run["identical_to_vanilla"] == true),
        "{r}"
    );
    assert!(dir.path().join("r.svg").exists());
    assert!(stdout(&o).contains("vanilla"));

    // A second results file, with another KV type, side by side with the first.
    let other = dir.path().join("q8.json");
    let o = small_bench(&other, &["--modes", "vanilla", "--kv", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = pocket(&["bench", "--compare", json.to_str().unwrap(), other.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(table.contains("A = r: smollm2-135m on CPU"), "{table}");
    assert!(table.contains("B = q8: smollm2-135m on CPU"), "{table}");
    assert!(table.contains("differs besides the machine (A / B): kv: f16 / q8_0"), "{table}");
    let vanilla = table.lines().find(|l| l.starts_with("vanilla ")).expect("a vanilla row");
    assert!(vanilla.contains("/2 "), "both prompts paired: {vanilla}");
    assert!(table.lines().any(|l| l.starts_with("llama.cpp ")), "a mode only A ran has a row: {table}");
    let svg = std::fs::read_to_string(dir.path().join("r-vs-q8.svg")).expect("the chart beside B");
    assert!(svg.contains("A: r") && svg.contains("B: q8"));

    let prompts = dir.path().join("prompts.json");
    std::fs::write(&prompts, r#"{"id": "p", "prompt": "hi"}"#).unwrap();
    let o = pocket(&["bench", "--compare", json.to_str().unwrap(), prompts.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("prompts.json: not a results document of `pocket bench --json`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_model_is_an_error_listing_the_known_ones() {
    let o = pocket(&["run", "-m", "no-such-model", "hello"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("no-such-model") && err.contains("smollm2-135m"), "{err}");
}

#[test]
fn a_file_that_is_not_gguf_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.gguf");
    std::fs::write(&path, "hello\n").unwrap();
    let o = pocket(&["run", "-m", path.to_str().unwrap(), "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a GGUF model"), "{}", stderr(&o));
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error_with_the_numbers() {
    require_default_model();
    let o = pocket(&["run", "--ctx-size", "8", "one two three four five six seven eight nine ten eleven"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("context overflow") && err.contains("holds 8"), "{err}");
}

#[test]
fn bad_sampling_flags_are_refused_before_loading_with_the_allowed_range() {
    let o = pocket(&["run", "-m", "no-such-model", "--temperature", "-1", "hi"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("temperature must be") && !err.contains("no-such-model"), "{err}");
}

#[test]
fn an_unknown_kv_type_names_the_allowed_ones() {
    let o = pocket(&["run", "--kv", "q9", "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("f16, q8_0 or q4_0"), "{}", stderr(&o));
}

#[test]
fn an_unknown_spec_mode_names_the_allowed_ones() {
    let o = pocket(&["run", "--spec", "eagle", "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("off, auto, suffix, inputcopy, layerskip or draft"), "{}", stderr(&o));
}

#[test]
fn spec_draft_without_a_draft_model_is_refused_before_loading() {
    let o = pocket(&["run", "-m", "no-such-model", "--spec", "draft", "hi"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("--draft-model") && !err.contains("no-such-model"), "{err}");
}

/// `pocket run` with a speculation cache in a temporary directory.
fn pocket_cached(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(args)
        .env("POCKET_CACHE_DIR", cache)
        .output()
        .expect("the pocket binary runs")
}

#[test]
fn a_draft_model_with_another_vocabulary_is_an_error_naming_both() {
    require_default_model();
    let cache = tempfile::tempdir().unwrap();
    let o = pocket_cached(
        cache.path(),
        &["run", "--spec", "draft", "--draft-model", "qwen2.5-coder-0.5b", "-t", "1", "-n", "4", "hi"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("vocabulary") && err.contains("151936"), "{err}");
}

#[test]
fn run_with_suffix_speculation_gives_the_plain_text_and_reports_drafts() {
    require_default_model();
    let cache = tempfile::tempdir().unwrap();
    let prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog";
    let run = |spec: &str| {
        let o = pocket_cached(
            cache.path(),
            &[
                "run",
                "--chat",
                prompt,
                "-n",
                "48",
                "-t",
                "1",
                "--spec",
                spec,
                "--weights",
                "stored",
                "--json",
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("one JSON object")
    };
    let (plain, spec) = (run("off"), run("suffix"));
    assert_eq!(spec["text"], plain["text"]);
    assert_eq!(spec["spec"]["mode"], "suffix");
    assert_eq!(plain["spec"]["drafted"], 0);
    assert!(spec["spec"]["passes"].as_u64().unwrap() > 0, "{spec}");
    assert!(
        spec["spec"]["drafted"].as_u64().unwrap() > 0,
        "suffix drafts before anything is measured: {spec}"
    );
    // A request learns nothing about the device: that is `pocket tune`'s (or the idle
    // daemon's) work, which the next runs then use.
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
    let o = pocket_cached(cache.path(), &["tune", "-t", "1", "--weights", "stored"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("cost curve t(n)/t(1) (measured now)"), "{}", stdout(&o));
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1);
    let o = pocket_cached(cache.path(), &["tune", "-t", "1", "--weights", "stored"]);
    assert!(stdout(&o).contains("(known)"), "tuning again measures nothing: {}", stdout(&o));
    let tuned = run("suffix");
    assert_eq!(tuned["text"], plain["text"]);
}

#[test]
fn auto_weights_choose_from_tuned_curves_and_speculation_on_the_chosen_one_is_lossless() {
    require_default_model();
    let cache = tempfile::tempdir().unwrap();
    let prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--chat", prompt, "-n", "48", "-t", "1", "--json"];
        args.extend_from_slice(extra);
        let o = pocket_cached(cache.path(), &args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).expect("one JSON object")
    };
    // Before the curves are measured, auto keeps the weights as stored and says how to
    // measure them; the request does not measure them itself.
    let o = pocket_cached(cache.path(), &["run", prompt, "-n", "4", "-t", "1", "--spec", "suffix"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("pocket tune"), "{}", stderr(&o));
    let untuned = run(&["--spec", "suffix"]);
    assert_eq!(untuned["weights"], "stored");
    assert!(untuned.get("weight_estimates").is_none(), "{untuned}");
    // `pocket tune` measures both formats' curves.
    let o = pocket_cached(cache.path(), &["tune", "-t", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("weights stored") && stdout(&o).contains("weights q8_0"), "{}", stdout(&o));
    assert!(stdout(&o).contains("--weights auto would choose"), "{}", stdout(&o));
    let spec = run(&["--spec", "suffix"]);
    let estimates = spec["weight_estimates"].as_array().expect("estimates for --weights auto");
    let formats: Vec<&str> = estimates.iter().map(|e| e["weights"].as_str().unwrap()).collect();
    assert_eq!(formats, ["stored", "q8_0"], "{spec}");
    assert!(estimates.iter().all(|e| e["step_seconds"].as_f64().unwrap() > 0.0), "{spec}");
    let chosen = spec["weights"].as_str().unwrap();
    assert!(formats.contains(&chosen), "{spec}");
    // Both curves are known: a run says nothing of tuning.
    let o = pocket_cached(cache.path(), &["run", prompt, "-n", "4", "-t", "1", "--spec", "suffix"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("pocket tune"), "{}", stderr(&o));
    // Plain decoding on the chosen format gives the same text; without speculation, auto
    // keeps the stored weights and measures nothing.
    let plain = run(&["--spec", "off", "--weights", chosen]);
    assert_eq!(spec["text"], plain["text"]);
    assert_eq!(plain["weights"], chosen);
    let default = run(&["--spec", "off"]);
    assert_eq!(default["weights"], "stored");
    assert!(default.get("weight_estimates").is_none(), "{default}");
    // Explicit Q8_0 speculation equals plain Q8_0 decoding too.
    let wide = run(&["--spec", "suffix", "--weights", "q8_0"]);
    let wide_plain = run(&["--spec", "off", "--weights", "q8_0"]);
    assert_eq!(wide["text"], wide_plain["text"]);
    assert_eq!(wide["weights"], "q8_0");
}

#[test]
fn an_unknown_weight_format_names_the_allowed_ones() {
    let o = pocket(&["run", "--weights", "q3", "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("stored, q8_0, or auto"), "{}", stderr(&o));
}
