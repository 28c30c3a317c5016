//! `pocket bench`: our engine against llama.cpp, each drafter against plain decoding, in this
//! process or through a running pocketd, on a workload; a workload's conversations replayed
//! turn by turn through pocketd, with its prompt cache and without; a table on stdout, results
//! as JSON and a chart.

use std::path::{Path, PathBuf};

use anyhow::Context;
use pocket_core::memory::BudgetSpec;
use pocket_core::{KvType, Threads};

use pocket_bench::{self as bench, BenchConfig, Progress, RunMode, Start, workload};
use pocket_runtime::Engine;

use super::common::ModelArgs;

/// Flags of `pocket bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Instead of running, print two results files (`--json`) side by side, e.g. one from a
    /// board and one from a workstation, and plot them (`--chart`, default: beside B as
    /// A-vs-B.svg).
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    compare: Option<Vec<PathBuf>>,
    #[command(flatten)]
    model: ModelArgs,
    /// The workload, JSON Lines (default: the built-in `crates/pocket-bench/workload.jsonl`, or
    /// `crates/pocket-bench/seq2seq.jsonl` for an encoder-decoder model). Lines of `"kind": "conversation"`
    /// (the format is in `crates/pocket-bench/README.md`) are replayed turn by turn through pocketd
    /// (`--socket`), with its prompt cache (`cache`) and without (`no-cache`); a workload of
    /// conversations only runs nothing in this process.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Modes to compare, comma-separated, run alternately per prompt (default:
    /// `llama.cpp,vanilla` for GGUF models, `vanilla,inputcopy,suffix,auto` for encoder-decoder
    /// ones). Our engine's modes may name the weight format of the model (`suffix@q8_0`); those
    /// that do not use `--weights`. `socket:MODE` runs a mode through pocketd (`--socket`).
    /// Conversations are replayed with the speculation of the mode given when only one is
    /// (`--modes auto`), and without speculation otherwise.
    #[arg(long)]
    modes: Option<String>,
    /// Run the modes through the pocketd listening here too: every one of our engine's modes
    /// gets a `socket:` twin, and the report shows the gap between the two (the scheduler, the
    /// plan and the transport). With `--modes` naming `socket:` modes, only those go through
    /// pocketd. The workload's conversations are replayed through it.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Start warm: each mode generates once, unrecorded, before the measured runs. By default
    /// the runs start cold, as a user's first request does (through pocketd, the model is
    /// loaded again first).
    #[arg(long)]
    warm: bool,
    /// CPU threads for every mode: a count, or `auto` (the default), where our engine follows
    /// the cores other programs leave free and llama.cpp takes every core this process may
    /// use, as each does by default.
    #[arg(short = 't', long, default_value = "auto")]
    threads: Threads,
    /// Write the results here as JSON (and the chart beside it, as .svg).
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// Write the chart here (default: beside the JSON, with the extension .svg).
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
    /// KV cache type for every mode: f16, q8_0 or q4_0, or keys/values such as q8_0/q4_0.
    #[arg(long, default_value = "f16")]
    kv: KvType,
    /// Run only the first N prompts (and replay only the first N conversations).
    #[arg(long, value_name = "N")]
    max_prompts: Option<usize>,
    /// Cap every prompt's (and conversation turn's) max_tokens at N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens_cap: Option<u64>,
    /// Passes over the workload (modes still alternate per prompt); more rounds, steadier
    /// medians on a busy machine.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Before each run, wait up to SECS seconds for other processes to leave the CPU idle
    /// (for shared machines; runs that compete for the cores measure the competition).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    wait_quiet: f64,
    /// Skip measuring the cost curve.
    #[arg(long)]
    no_cost_curve: bool,
    /// A memory budget (`200MiB`, `1.5GiB`, `auto`): the process and the models are paid for
    /// in it, and each run of our engine's modes is planned under it as `pocket run` plans
    /// (its plan is in the JSON), one session at a time. `naive:` modes are not held to it.
    #[arg(long, value_name = "SIZE")]
    memory_budget: Option<BudgetSpec>,
    /// The context every session may hold, in tokens (default: the longest prompt and its
    /// max_tokens, rounded up to 256). `naive:` modes hold all of it from the start, as a
    /// server started with `-c N` does.
    #[arg(short = 'c', long, value_name = "N")]
    ctx_size: Option<usize>,
    /// Requests at once: the prompts in groups of N, each group run in every mode alone, one
    /// request after another, and then all N at once (llama.cpp decoding them as N sequences
    /// of one context, as its server's `-np N`; our modes as N sessions; `socket:` modes as N
    /// clients): aggregate and per-request decode speed, time to first token, fastest over
    /// slowest, and whether each request's tokens are its tokens alone.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    concurrent: u64,
    /// N busy processes (shell loops, one core each) beside the measured runs, started after
    /// the cost curve and warm-up and stopped at the end: how the modes do on a board whose
    /// other programs want the cores.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=256))]
    load: u64,
    /// For an embedding model: the reference implementation's benchmark, a shell command run
    /// with `--bench --threads N --texts FILE` appended that prints one JSON line with
    /// `batch_1_per_s` and `batch_32_per_s` (sentence-transformers':
    /// `PYTHON crates/pocketd/tests/fixtures/embeddings/reference.py --model-dir DIR`), shown
    /// beside ours on the same texts.
    #[arg(long, value_name = "COMMAND")]
    reference: Option<String>,
}

/// Run `pocket bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(files) = &args.compare {
        return compare(&files[0], &files[1], args.chart.as_deref());
    }
    let dir = pocket_models::models_dir(args.model.models_dir.as_deref());
    let resolved = pocket_models::resolve(&args.model.model, &dir)?;
    let engine = Engine::for_path(&resolved.path);
    if engine == Engine::Embedding {
        return embeddings(&args, &resolved);
    }
    let (workload, workload_name) = workload_of(&args, engine)?;
    let config = config_of(&args, &resolved, engine, &workload, workload_name)?;
    announce(&config, &workload, &resolved.path);
    let results = bench::suite::run_workload(&config, &workload, &mut show_progress)
        .with_context(|| format!("benchmark of {}", resolved.path.display()))?;
    print!("{}", bench::report::table(&results));
    write_outputs(&args, &results)
}

/// The embedding benchmark: sentences per second at batch 1 and 32 (the texts of `--prompts`,
/// one per line, else the built-in sentences), peak memory, and the reference's figures on
/// the same texts where `--reference` names its command.
fn embeddings(args: &Args, resolved: &pocket_models::ResolvedModel) -> anyhow::Result<()> {
    let texts: Vec<String> = match &args.prompts {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?,
        None => bench::embeddings::DEFAULT_SENTENCES.to_owned(),
    }
    .lines()
    .filter(|l| !l.trim().is_empty())
    .map(str::to_owned)
    .collect();
    anyhow::ensure!(!texts.is_empty(), "no texts to embed");
    let ledger = pocket_core::memory::Ledger::unlimited();
    let model = args.model.open(pocket_runtime::WeightFormat::AsStored, &ledger)?;
    let threads = args.threads;
    eprintln!(
        "embedding {} texts with {} on {threads} threads, {} on {}",
        texts.len(),
        resolved.path.display(),
        model.kernels(),
        model.device()
    );
    let quiet = std::time::Duration::from_secs_f64(args.wait_quiet.clamp(0.0, 3600.0));
    let ours = bench::embeddings::run(&model, &texts, &[1, 32], 3, threads, quiet, || ledger.used())?;
    let reference = match &args.reference {
        Some(command) => Some(reference_figures(command, &texts, threads.max())?),
        None => None,
    };
    println!("{:<44} {:>14} {:>14} {:>12}", "implementation", "batch 1 /s", "batch 32 /s", "peak RSS");
    let at = |b: usize| ours.batches.iter().find(|f| f.batch == b).map_or(0.0, |f| f.per_second);
    println!(
        "{:<44} {:>14.1} {:>14.1} {:>9.0} MiB",
        format!("pocketd ({})", model.kernels()),
        at(1),
        at(32),
        ours.peak_rss_bytes as f64 / 1048576.0
    );
    if let Some(r) = &reference {
        let f = |k: &str| r.get(k).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN);
        let name = r.get("implementation").and_then(serde_json::Value::as_str).unwrap_or("reference");
        let name: String = name.chars().take(44).collect();
        println!(
            "{name:<44} {:>14.1} {:>14.1} {:>9.0} MiB",
            f("batch_1_per_s"),
            f("batch_32_per_s"),
            f("peak_rss_mib")
        );
    }
    println!(
        "{} texts ({} tokens) per run, best of 3; the model holds {:.1} MiB of the budget",
        ours.texts,
        ours.tokens,
        ours.ledger_bytes as f64 / 1048576.0
    );
    if let Some(path) = &args.json {
        let out = serde_json::json!({
            "ours": ours,
            "kernels": model.kernels(),
            "device": model.device(),
            "reference": reference,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Run the reference's benchmark command on `texts` and read its JSON line.
fn reference_figures(command: &str, texts: &[String], threads: usize) -> anyhow::Result<serde_json::Value> {
    let file = std::env::temp_dir().join(format!("pocket-bench-texts-{}.txt", std::process::id()));
    std::fs::write(&file, texts.join("\n")).with_context(|| format!("writing {}", file.display()))?;
    let full = format!("{command} --bench --threads {threads} --texts '{}'", file.display());
    eprintln!("reference: {full}");
    let out = std::process::Command::new("sh").args(["-c", &full]).output();
    let _ = std::fs::remove_file(&file);
    let out = out?;
    anyhow::ensure!(out.status.success(), "the reference failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("the reference printed no JSON")?;
    Ok(serde_json::from_str(line)?)
}

/// The workload: `--prompts`, else the built-in one for the model's kind, cut to
/// `--max-prompts`; and its name.
fn workload_of(args: &Args, engine: Engine) -> anyhow::Result<(workload::Workload, String)> {
    let (mut workload, name) = match (&args.prompts, engine) {
        (Some(path), _) => (workload::load_workload(path)?, path.display().to_string()),
        (None, Engine::Ggml | Engine::LlamaCpp | Engine::Embedding) => (
            workload::parse_workload(workload::DEFAULT_WORKLOAD)
                .context("the built-in workload is broken")?,
            workload::DEFAULT_WORKLOAD_NAME.to_owned(),
        ),
        (None, Engine::Tract) => (
            workload::parse_workload(workload::DEFAULT_SEQ2SEQ_WORKLOAD)
                .context("the built-in workload is broken")?,
            workload::DEFAULT_SEQ2SEQ_WORKLOAD_NAME.to_owned(),
        ),
    };
    if let Some(n) = args.max_prompts {
        anyhow::ensure!(n > 0, "--max-prompts must be at least 1");
        workload.prompts.truncate(n);
        workload.conversations.truncate(n);
        workload.agentic.truncate(n);
    }
    anyhow::ensure!(
        workload.conversations.is_empty() || args.socket.is_some(),
        "the workload's {} conversations are replayed through pocketd: give its socket (--socket PATH)",
        workload.conversations.len()
    );
    anyhow::ensure!(
        workload.agentic.is_empty() || args.socket.is_some(),
        "the workload's {} agentic requests are replayed through pocketd: give its socket (--socket PATH)",
        workload.agentic.len()
    );
    Ok((workload, name))
}

/// The modes to run: `--modes` (else the defaults for the model's kind), with a `socket:`
/// twin of each of ours when `--socket` names no such mode; and the mode conversations are
/// replayed in.
fn modes_of(args: &Args, engine: Engine, prompts: bool) -> anyhow::Result<(Vec<RunMode>, bench::Mode)> {
    let mode_list = args.modes.clone().unwrap_or_else(|| match engine {
        Engine::Ggml | Engine::LlamaCpp | Engine::Embedding => "llama.cpp,vanilla".to_owned(),
        Engine::Tract => "vanilla,inputcopy,suffix,auto".to_owned(),
    });
    // A benchmark compares formats explicitly (`suffix@q8_0`): `auto` is the stored format here.
    let mut modes = RunMode::parse_list_with(&mode_list, args.model.weights.initial())?;
    let conversation_mode = match modes.as_slice() {
        [one] if args.modes.is_some() => one.mode.clone(),
        _ => bench::Mode::Vanilla,
    };
    if args.socket.is_some() && prompts && !modes.iter().any(|m| m.socket) {
        // Every mode of ours on the weights as stored, beside itself through pocketd.
        let twins: Vec<RunMode> = modes
            .iter()
            .filter(|m| {
                m.mode != bench::Mode::LlamaCpp
                    && !m.naive
                    && m.weights == pocket_runtime::WeightFormat::AsStored
            })
            .map(|m| RunMode { socket: true, ..m.clone() })
            .collect();
        anyhow::ensure!(
            !twins.is_empty(),
            "--socket: none of the modes {mode_list} is one of our engine's on the stored weights"
        );
        modes.extend(twins);
    }
    Ok((modes, conversation_mode))
}

/// The benchmark's configuration from the command line.
fn config_of(
    args: &Args,
    resolved: &pocket_models::ResolvedModel,
    engine: Engine,
    workload: &workload::Workload,
    workload_name: String,
) -> anyhow::Result<BenchConfig> {
    let (modes, conversation_mode) = modes_of(args, engine, !workload.prompts.is_empty())?;
    let name = match &resolved.manifest {
        Some(m) => m.name.clone(),
        None => resolved
            .path
            .file_stem()
            .map_or_else(|| args.model.model.clone(), |s| s.to_string_lossy().into_owned()),
    };
    anyhow::ensure!(
        args.wait_quiet.is_finite() && (0.0..=3600.0).contains(&args.wait_quiet),
        "--wait-quiet must be between 0 and 3600 seconds, not {}",
        args.wait_quiet
    );
    let mut config = BenchConfig::new(resolved.path.clone(), name);
    config.workload = workload_name;
    config.models_dir = args.model.models_dir.clone();
    config.modes = modes;
    config.kv = args.kv;
    config.device = args.model.device.clone();
    config.split = args.model.split();
    config.max_tokens_cap = args.max_tokens_cap.map(|n| n as usize);
    config.rounds = args.rounds as usize;
    config.wait_quiet = std::time::Duration::from_secs_f64(args.wait_quiet);
    config.threads = args.threads;
    config.cost_curve = !args.no_cost_curve;
    config.memory_budget = args.memory_budget;
    config.n_ctx = args.ctx_size;
    config.start = if args.warm { Start::Warm } else { Start::Cold };
    config.socket = args.socket.clone();
    config.conversation_mode = conversation_mode;
    config.concurrent = args.concurrent as usize;
    config.load = args.load as usize;
    Ok(config)
}

/// Say what is about to run.
fn announce(config: &BenchConfig, workload: &workload::Workload, path: &std::path::Path) {
    let names: Vec<String> = config.modes.iter().map(RunMode::name).collect();
    if !workload.prompts.is_empty() {
        eprintln!(
            "benchmarking {} ({}) on {} prompts, modes {}, {} threads, {} start",
            config.model_name,
            path.display(),
            workload.prompts.len(),
            names.join(","),
            config.threads,
            config.start.name()
        );
    }
    if !workload.conversations.is_empty() {
        eprintln!(
            "replaying {} conversations of {} through pocketd, modes {}, spec {}, {} start",
            workload.conversations.len(),
            config.model_name,
            bench::conversation::MODES.join(","),
            config.conversation_mode.spec().map_or("-", |s| s.name()),
            config.start.name()
        );
    }
    if !workload.agentic.is_empty() {
        eprintln!(
            "replaying a stream of {} agentic requests to {} through pocketd, modes {}",
            workload.agentic.len(),
            config.model_name,
            bench::agentic::MODES.join(","),
        );
    }
}

/// The results as JSON (`--json`) and the chart (`--chart`, else beside the JSON).
fn write_outputs(args: &Args, results: &bench::BenchResults) -> anyhow::Result<()> {
    // Conversations alone have no runs of modes to chart.
    let chartable = !results.runs.is_empty();
    if !chartable && args.chart.is_some() {
        eprintln!("no chart: the chart shows runs of prompts, and this workload had none");
    }
    let chart = args
        .chart
        .clone()
        .or_else(|| args.json.as_ref().map(|j| j.with_extension("svg")))
        .filter(|_| chartable);
    if let Some(path) = &args.json {
        write_json(results, path)?;
        eprintln!("results: {}", path.display());
    }
    if let Some(path) = &chart {
        bench::chart::write_svg(results, path)?;
        eprintln!("chart: {}", path.display());
    }
    Ok(())
}

/// `pocket bench --compare A B`.
fn compare(a: &Path, b: &Path, chart: Option<&Path>) -> anyhow::Result<()> {
    let comparison = bench::compare::compare(bench::compare::Side::load(a)?, bench::compare::Side::load(b)?);
    print!("{}", bench::compare::table(&comparison));
    let chart = match chart {
        Some(path) => path.to_path_buf(),
        None => {
            let [side_a, side_b] = &comparison.sides;
            b.with_file_name(format!("{}-vs-{}.svg", side_a.label, side_b.label))
        }
    };
    bench::chart::write_compare_svg(&comparison, &chart)?;
    eprintln!("chart: {}", chart.display());
    Ok(())
}

fn show_progress(p: Progress<'_>) {
    match p {
        Progress::Loaded { device } => eprintln!("loaded on {device}"),
        Progress::CostCurve => eprintln!("cost curve measured"),
        Progress::Learned { weights, measured_curve, found_skip_set } => eprintln!(
            "weights {weights}: {}{}",
            if measured_curve {
                "this device's cost curve measured and remembered"
            } else {
                "cost curve known"
            },
            if found_skip_set { "; a layer-skip set found and remembered" } else { "" }
        ),
        Progress::DaemonReloaded { seconds } => {
            eprintln!("pocketd loaded the model again for a cold start ({seconds:.2} s)")
        }
        Progress::WarmedUp { runs } => eprintln!("{runs} runs"),
        Progress::Turn { index, of, record: t } => eprintln!(
            "[{index}/{of}] {:<8} {:<24} turn {:>2} {:>5} prompt tok {:>5} cached {:>8.1} ms TTFT, {:>4} generated \
             {:>6} tok/s decode",
            t.mode,
            t.conversation_id,
            t.turn,
            t.prompt_tokens,
            t.cached_tokens,
            t.ttft_ms,
            t.generated_tokens,
            t.decode_tok_per_s.map_or_else(|| "-".into(), |d| format!("{d:.1}")),
        ),
        Progress::Together { record: g } => eprintln!(
            "together: {:<10} group {:>2}, {} requests: {:>6.1} tok/s in all ({:.2}x one alone), fastest/slowest {}",
            g.mode,
            g.group,
            g.requests,
            g.aggregate_decode_tok_per_s,
            g.gain,
            g.fairness.map_or_else(|| "-".into(), |f| format!("{f:.2}")),
        ),
        Progress::Run { index, of, record: r } => eprintln!(
            "[{index}/{of}] {:<10} {:<28} {:>4} prompt tok {:>7.1} tok/s prefill, {:>4} generated {:>6} tok/s decode{}",
            r.mode,
            r.prompt_id,
            r.prompt_tokens,
            r.prefill_tok_per_s,
            r.generated_tokens,
            r.decode_tok_per_s.map_or_else(|| "-".into(), |d| format!("{d:.1}")),
            match r.other_cpu_cores {
                Some(c) if c > 0.25 => format!("  (others busy: {c:.2} cores)"),
                _ => String::new(),
            },
        ),
        _ => {}
    }
}

fn write_json(results: &bench::BenchResults, path: &Path) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(results)?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}
