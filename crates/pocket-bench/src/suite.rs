//! Running a benchmark: open the model, measure the cost curve, learn what the modes need,
//! then every prompt in every mode, alternating.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pocket_core::cost::CostCurveConfig;
use pocket_core::memory::BudgetSpec;
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{ModelKind, SamplingConfig, SessionConfig, StopConfig, Token};
use pocket_runtime::WeightFormat;
use pocket_runtime::learn::{self, SkipSearch, TuneSettings};
use pocket_runtime::pipeline::{self, Input};
use pocket_runtime::process::{CpuTimes, MemStats, budget_ledger, reset_peak, with_device_pool};
use pocket_runtime::{LoadedModel, OpenOptions};

use super::concurrency::{self, ConcurrencyResults, ConcurrentRun};
use super::config::{BenchConfig, DAEMON_SETTLE_MAX, Progress, Start};
use super::machine::{Load, cpu_name, model_bytes, settle, sha256_model, sha256_tokens, wait_for_quiet};
use super::modes::{self, Mode, PromptRun, RunMode, RunOutput, Runner, RunnerContext};
use super::results::{BenchModel, BenchResults, Machine, PassProfile, RunRecord, Settings};
use super::summary::{compare_outputs, summarize};
use super::workload::{Prompt, PromptInput, Workload};
use super::{Error, conversation};

/// The context length is rounded up to a multiple of this, for both engines alike.
const CTX_ROUND: usize = 256;

/// Longest wait for the previous run's threads to go idle before the next run starts.
const SETTLE_MAX: Duration = Duration::from_secs(2);

/// Most tokens a warm-up run generates.
const WARMUP_TOKENS: usize = 16;

/// Our engine's model in one weight format.
struct Target {
    weights: WeightFormat,
    model: Arc<LoadedModel>,
    /// This run's cost curve (empty when not measured).
    curve: Vec<pocket_core::cost::CostPoint>,
}

/// A prompt ready to run: its token ids and effective `max_tokens`.
struct Prepared<'p> {
    prompt: &'p Prompt,
    tokens: Vec<Token>,
    max_tokens: usize,
}

impl Prepared<'_> {
    fn run(&self, max_tokens: usize) -> PromptRun<'_> {
        PromptRun { input: &self.prompt.input, tokens: &self.tokens, max_tokens }
    }
}

/// Run the benchmark of `config` on a whole workload: its prompts in every mode, as [`run`]
/// does, then its conversations replayed through pocketd ([`conversation::replay`]). A
/// workload of conversations only runs nothing in this process — the model is not opened
/// here and no cost curve is measured — so its results record the model file, this machine
/// (`backend: pocketd`) and the conversations.
pub fn run_workload(
    config: &BenchConfig,
    workload: &Workload,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BenchResults, Error> {
    let conversations = &workload.conversations;
    if workload.prompts.is_empty() && conversations.is_empty() && workload.agentic.is_empty() {
        return Err(Error::Invalid("the workload has no prompts, conversations or agentic requests".into()));
    }
    if !workload.agentic.is_empty() && config.socket.is_none() {
        return Err(Error::Invalid(format!(
            "the workload's {} agentic requests are replayed through pocketd: give its socket (--socket PATH)",
            workload.agentic.len()
        )));
    }
    if !conversations.is_empty() {
        // Before the prompts run, not after.
        if config.socket.is_none() {
            return Err(Error::Invalid(format!(
                "the workload's {} conversations are replayed through pocketd: give its socket (--socket PATH)",
                conversations.len()
            )));
        }
        conversation::check(config)?;
    }
    let mut results = if workload.prompts.is_empty() {
        daemon_only(config)?
    } else {
        run(config, &workload.prompts, progress)?
    };
    if !conversations.is_empty() {
        let replayed = conversation::replay(config, conversations, progress)?;
        if workload.prompts.is_empty() {
            results.machine.threads = replayed.daemon_threads.unwrap_or(config.threads.max());
        }
        results.settings.socket = config.socket.as_ref().map(|s| s.display().to_string());
        results.conversations = Some(replayed);
    }
    if !workload.agentic.is_empty() {
        results.settings.socket = config.socket.as_ref().map(|s| s.display().to_string());
        results.agentic = Some(crate::agentic::replay(config, &workload.agentic)?);
    }
    Ok(results)
}

/// The results document of a benchmark that runs nothing in this process: the model file and
/// the machine, no runs yet.
fn daemon_only(config: &BenchConfig) -> Result<BenchResults, Error> {
    let file_sha256 = file_sha256(config)?;
    Ok(BenchResults {
        pocket_version: env!("CARGO_PKG_VERSION").to_owned(),
        // The device is pocketd's own choice, which it does not report.
        machine: machine(config, "pocketd", None),
        model: BenchModel {
            name: config.model_name.clone(),
            file_sha256,
            weights_bytes: model_bytes(&config.model_path),
            engine: None,
        },
        settings: Settings {
            kv: config.kv.name().to_owned(),
            memory_budget_bytes: None,
            seed: 0,
            greedy: true,
            // pocketd sizes each request's context itself.
            n_ctx: 0,
            n_batch: config.n_batch,
            max_tokens_cap: config.max_tokens_cap,
            workload: config.workload.clone(),
            cost_curve_context: 0,
            cost_curve_repetitions: 0,
            rounds: config.rounds,
            start: Some(config.start),
            socket: None,
            load: config.load,
            concurrent: config.concurrent,
        },
        cost_curve: Vec::new(),
        cost_curves_by_weights: BTreeMap::new(),
        runs: Vec::new(),
        summary: BTreeMap::new(),
        concurrency: None,
        conversations: None,
        agentic: None,
    })
}

/// Run the benchmark of `config` on `prompts`.
pub fn run(
    config: &BenchConfig,
    prompts: &[Prompt],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<BenchResults, Error> {
    let through_daemon = config.modes.iter().any(|m| m.socket);
    check_config(config, prompts, through_daemon)?;
    let file_sha256 = file_sha256(config)?;
    // Held until the runs end: the process's own memory, reserved first under a budget.
    let (ledger, _process) = budget_ledger(config.memory_budget)?;
    let (ledger, _) = with_device_pool(ledger, &config.device, BudgetSpec::Auto)?;
    let budgeted = config.memory_budget.is_some();
    let mut models = open_targets(config, &ledger)?;
    let main = models[0].model.clone();
    progress(Progress::Loaded { device: main.device() });

    let prepared = prepare(&main, prompts, config.max_tokens_cap)?;
    let session = session_config(config, &main, &prepared)?;
    let curve_config = main.model().cost_curve_config();
    measure_and_tune(config, &mut models, &session, &ledger, progress)?;
    let draft_models = open_draft_models(config, &ledger)?;
    if let Some(socket) = config.socket.as_deref().filter(|_| through_daemon) {
        check_pocketd(config, socket, progress)?;
    }
    let mut runners = open_runners(config, &models, &session, &ledger, budgeted, &draft_models)?;
    let (cost_curve, cost_curves_by_weights) = report_curves(&models);

    if config.start == Start::Warm {
        warm_up(&mut runners, &prepared)?;
    }

    let total = config.rounds * prepared.len() * runners.len();
    progress(Progress::WarmedUp { runs: total });
    let (runs, concurrency) = measure_runs(config, &prepared, &mut runners, total, progress)?;

    let mode_names: Vec<String> = runners.iter().map(|r| r.name().to_owned()).collect();
    let summary = summarize(&runs, &mode_names);
    Ok(BenchResults {
        pocket_version: env!("CARGO_PKG_VERSION").to_owned(),
        machine: Machine {
            placement: main.model().info().placement.clone(),
            ..machine(config, main.device(), Some(main.kernels()))
        },
        model: BenchModel {
            name: config.model_name.clone(),
            file_sha256,
            weights_bytes: main.model().info().weights_bytes,
            engine: Some(main.engine().name().to_owned()),
        },
        settings: settings(
            config,
            &session,
            budgeted.then(|| ledger.budget()),
            &curve_config,
            through_daemon,
        ),
        cost_curve,
        cost_curves_by_weights,
        runs,
        summary,
        concurrency,
        conversations: None,
        agentic: None,
    })
}

/// The model file's sha256: the one the caller gave (pocket pull's verified hash), else read.
fn file_sha256(config: &BenchConfig) -> Result<String, Error> {
    match &config.file_sha256 {
        Some(sha) => Ok(sha.clone()),
        None => sha256_model(&config.model_path),
    }
}

/// This machine as the results record it, running on `backend` with `kernels`.
fn machine(config: &BenchConfig, backend: &str, kernels: Option<&str>) -> Machine {
    Machine {
        cpu: cpu_name(),
        arch: Some(std::env::consts::ARCH.to_owned()),
        threads: config.threads.max(),
        backend: backend.to_owned(),
        kernels: kernels.map(str::to_owned),
        placement: Vec::new(),
    }
}

/// The errors in `config` and `prompts` that need nothing opened to find.
fn check_config(config: &BenchConfig, prompts: &[Prompt], through_daemon: bool) -> Result<(), Error> {
    if config.modes.is_empty() {
        return Err(Error::Invalid(format!("no modes to run; known modes: {}", Mode::KNOWN.join(", "))));
    }
    if prompts.is_empty() {
        return Err(Error::Invalid("the workload has no prompts".into()));
    }
    if config.max_tokens_cap == Some(0) {
        return Err(Error::Invalid("the max-tokens cap must be at least 1".into()));
    }
    if config.rounds == 0 {
        return Err(Error::Invalid("rounds must be at least 1".into()));
    }
    if through_daemon && config.socket.is_none() {
        return Err(Error::Invalid(
            "`socket:` modes run through pocketd: give its socket (--socket PATH)".into(),
        ));
    }
    // Each mode's request as every entry point checks it: a drafter the model's engine lacks
    // is refused here, before anything is loaded, in the words the daemon and `pocket run` use.
    let engine = pocket_runtime::Engine::for_path(&config.model_path);
    let (sampling, stop) = (SamplingConfig::default(), StopConfig { max_tokens: 1, stop: Vec::new() });
    for m in &config.modes {
        if let Some(spec) = m.mode.spec() {
            let draft_model = matches!(m.mode, Mode::Draft(_));
            let settings = pocket_runtime::Settings { spec, draft_model, sampling: &sampling, stop: &stop };
            pocket_runtime::validate(&settings, Some(engine))
                .map_err(|e| Error::Invalid(format!("mode {}: {e}", m.mode)))?;
        }
    }
    Ok(())
}

/// Our engine's model in every weight format a mode asks for; the first mode's is the main
/// one (prompts are tokenized and the session sized with it, and its curve is `cost_curve`).
fn open_targets(config: &BenchConfig, ledger: &Ledger) -> Result<Vec<Target>, Error> {
    let mut models: Vec<Target> = Vec::new();
    for m in &config.modes {
        if !models.iter().any(|t| t.weights == m.weights) {
            let options = OpenOptions {
                device: config.device.clone(),
                weights: m.weights,
                ledger: Some(ledger.clone()),
                split: config.split.clone(),
                ..OpenOptions::default()
            };
            let model = Arc::new(LoadedModel::open(&config.model_path, &options)?);
            models.push(Target { weights: m.weights, model, curve: Vec::new() });
        }
    }
    Ok(models)
}

/// For each weight format: its cost curve, when the report asks for one, and what its
/// speculative modes need, both as `pocket tune` would find them.
fn measure_and_tune(
    config: &BenchConfig,
    models: &mut [Target],
    session: &SessionConfig,
    ledger: &Ledger,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(), Error> {
    for t in models {
        // The report's curve, measured now; it is also what the modes draft with when nothing
        // was measured before (it is measured the way `pocket tune` measures it).
        if config.cost_curve {
            if !config.wait_quiet.is_zero() {
                wait_for_quiet(config.wait_quiet);
            }
            t.curve = learn::measure_curve(&t.model, session.threads.max(), session.kv, ledger, &|| false)?;
            let knowledge = t.model.knowledge();
            if knowledge.cost_curve(session.threads.max(), session.kv).is_none() {
                knowledge.remember_cost_curve(session.threads.max(), session.kv, t.curve.clone());
            }
        }
        // What the speculative modes need, learned as `pocket tune` learns it: a `layerskip`
        // mode needs a skip set whatever the curve says.
        let modes: Vec<&RunMode> =
            config.modes.iter().filter(|m| m.weights == t.weights && !m.socket).collect();
        if !modes.iter().any(|m| m.mode.spec().is_some_and(|s| s != SpecMode::Off)) {
            continue;
        }
        let mut settings = TuneSettings::new(session.threads.max(), session.kv);
        if modes.iter().any(|m| m.mode == Mode::LayerSkip) {
            settings.skip_search = SkipSearch::Always;
        }
        let tuned = learn::tune(&t.model, &settings, ledger, &|| false, &mut |_| {})?;
        progress(Progress::Learned {
            weights: t.weights.name(),
            measured_curve: tuned.measured_curve,
            found_skip_set: tuned.found_skip_set,
        });
    }
    if config.cost_curve {
        progress(Progress::CostCurve);
    }
    Ok(())
}

/// The draft models the `draft:` modes of this process name, each opened once.
fn open_draft_models(
    config: &BenchConfig,
    ledger: &Ledger,
) -> Result<Vec<(String, Arc<LoadedModel>)>, Error> {
    let mut draft_models = Vec::new();
    for m in &config.modes {
        if let Mode::Draft(name) = &m.mode
            && !m.socket
            && !draft_models.iter().any(|(n, _)| n == name)
        {
            let dir = pocket_models::models_dir(config.models_dir.as_deref());
            let path = pocket_models::resolve(name, &dir).map_err(|e| Error::Invalid(e.to_string()))?.path;
            let options = OpenOptions {
                device: config.device.clone(),
                ledger: Some(ledger.clone()),
                ..OpenOptions::default()
            };
            draft_models.push((name.clone(), Arc::new(LoadedModel::open(&path, &options)?)));
        }
    }
    Ok(draft_models)
}

/// Check that pocketd at `socket` serves the model as the `socket:` modes need it, and report
/// it if it loaded the model again.
fn check_pocketd(
    config: &BenchConfig,
    socket: &Path,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(), Error> {
    let daemon =
        modes::SocketRunner::check_daemon(socket, &config.model_name, Some(config.threads), config.start)?;
    if let Some(seconds) = daemon.reloaded {
        progress(Progress::DaemonReloaded { seconds });
    }
    Ok(())
}

/// A runner for every mode, in the order of the modes.
fn open_runners(
    config: &BenchConfig,
    models: &[Target],
    session: &SessionConfig,
    ledger: &Ledger,
    budgeted: bool,
    draft_models: &[(String, Arc<LoadedModel>)],
) -> Result<Vec<Box<dyn Runner>>, Error> {
    let mut runners = Vec::with_capacity(config.modes.len());
    for m in &config.modes {
        let t = models.iter().find(|t| t.weights == m.weights).expect("every mode's weights were loaded");
        let cx = RunnerContext {
            ledger,
            budgeted,
            model: &t.model,
            model_name: &config.model_name,
            session,
            draft_models,
            socket: config.socket.as_deref(),
        };
        runners.push(modes::open(m, cx)?);
    }
    Ok(runners)
}

/// The results' cost curves: the main model's, and every one measured by weight format.
fn report_curves(
    models: &[Target],
) -> (Vec<super::results::CostPoint>, BTreeMap<String, Vec<super::results::CostPoint>>) {
    let cost_curve: Vec<super::results::CostPoint> =
        models[0].curve.iter().copied().map(Into::into).collect();
    let cost_curves_by_weights: BTreeMap<String, Vec<super::results::CostPoint>> = models
        .iter()
        .filter(|t| !t.curve.is_empty())
        .map(|t| (t.weights.name().to_owned(), t.curve.iter().copied().map(Into::into).collect()))
        .collect();
    (cost_curve, cost_curves_by_weights)
}

/// `--start warm`: one short, unrecorded run of the shortest prompt in every runner.
fn warm_up(runners: &mut [Box<dyn Runner>], prepared: &[Prepared<'_>]) -> Result<(), Error> {
    let short = prepared.iter().min_by_key(|p| p.tokens.len()).expect("prompts");
    for r in runners {
        run_one(r.as_mut(), short, short.max_tokens.min(WARMUP_TOKENS))?;
    }
    Ok(())
}

/// The measured runs, every prompt in every runner, round after round (alone, or also in
/// groups under `--concurrent`), beside `--load`'s busy processes; their outputs compared.
fn measure_runs(
    config: &BenchConfig,
    prepared: &[Prepared<'_>],
    runners: &mut [Box<dyn Runner>],
    total: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(Vec<RunRecord>, Option<ConcurrencyResults>), Error> {
    let (load, quiet) = Load::beside(config)?;
    let mut runs = Vec::with_capacity(total);
    let mut outputs = Vec::with_capacity(total);
    let mut concurrency = None;
    if config.concurrent > 1 {
        let measured = Measured { runs: &mut runs, outputs: &mut outputs, total, quiet };
        concurrency =
            Some(run_concurrently(config.concurrent, config.rounds, prepared, runners, measured, progress)?);
    } else {
        for round in 0..config.rounds {
            for p in prepared {
                for r in runners.iter_mut() {
                    let (rec, tokens) = measure_alone(r.as_mut(), p, round, quiet)?;
                    runs.push(rec);
                    outputs.push(tokens);
                    progress(Progress::Run {
                        index: runs.len(),
                        of: total,
                        record: runs.last().expect("just pushed"),
                    });
                }
            }
        }
    }
    drop(load);
    compare_outputs(&mut runs, &outputs);
    Ok((runs, concurrency))
}

/// The settings the runs were made with, as the results record them.
fn settings(
    config: &BenchConfig,
    session: &SessionConfig,
    memory_budget_bytes: Option<u64>,
    curve_config: &CostCurveConfig,
    through_daemon: bool,
) -> Settings {
    Settings {
        kv: config.kv.name().to_owned(),
        memory_budget_bytes,
        seed: 0,
        greedy: true,
        n_ctx: session.n_ctx,
        n_batch: session.n_batch,
        max_tokens_cap: config.max_tokens_cap,
        workload: config.workload.clone(),
        cost_curve_context: if config.cost_curve { curve_config.context } else { 0 },
        cost_curve_repetitions: if config.cost_curve { curve_config.repetitions } else { 0 },
        rounds: config.rounds,
        start: Some(config.start),
        socket: config.socket.as_ref().filter(|_| through_daemon).map(|s| s.display().to_string()),
        load: config.load,
        concurrent: config.concurrent,
    }
}

/// Render and tokenize every prompt with the pipeline (so every mode in this process gets the
/// same ids, the ones pocketd would make of the same input) and apply the cap.
fn prepare<'p>(
    model: &LoadedModel,
    prompts: &'p [Prompt],
    cap: Option<usize>,
) -> Result<Vec<Prepared<'p>>, Error> {
    prompts
        .iter()
        .map(|prompt| {
            let fail = |error: Error| Error::Prompt {
                id: prompt.id.clone(),
                mode: "tokenizer".into(),
                error: Box::new(error),
            };
            let input = match &prompt.input {
                // A base model (no chat template, as gemma3-270m) is given the messages' text
                // as a plain prompt, as `pocket run "…"` would be: every mode of this process
                // gets these same tokens.
                PromptInput::Messages(m) if !has_chat_template(model) => {
                    Input::Text(m.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n\n"))
                }
                PromptInput::Messages(m) => Input::Chat(m.clone()),
                PromptInput::Text(t) => Input::Text(t.clone()),
            };
            let tokens = pipeline::render(model, &input, &Default::default(), &Default::default())
                .map_err(|e| fail(e.into()))?;
            if tokens.is_empty() {
                return Err(fail(Error::Invalid("the prompt has no tokens".into())));
            }
            Ok(Prepared {
                prompt,
                tokens,
                max_tokens: cap.map_or(prompt.max_tokens, |c| prompt.max_tokens.min(c)),
            })
        })
        .collect()
}

/// Whether a decoder model can render chat messages (an encoder-decoder's refusal is its own
/// error, kept).
fn has_chat_template(model: &LoadedModel) -> bool {
    let probe = [pocket_core::ChatMessage::new(pocket_core::Role::User, "hi")];
    model.model().info().kind != pocket_core::ModelKind::Decoder
        || model.model().tokenizer().apply_chat_template(&probe, true).is_ok()
}

/// One session configuration for every mode: a context that holds the longest prompt plus
/// its generation (and the cost curve's passes), rounded up, within what the model allows.
fn session_config(
    config: &BenchConfig,
    model: &LoadedModel,
    prepared: &[Prepared<'_>],
) -> Result<SessionConfig, Error> {
    let info = model.model().info();
    let limit = info.n_ctx_train;
    let mut needed = 1;
    for p in prepared {
        // An encoder-decoder's context holds the source; its decoder the start and the answer.
        let n = match info.kind {
            ModelKind::Decoder => p.tokens.len() + p.max_tokens + 1,
            ModelKind::EncoderDecoder => p.tokens.len().max(p.max_tokens + 2),
            // Refused when its sessions are made, saying what the model is for.
            _ => p.tokens.len(),
        };
        if n > limit {
            return Err(Error::Prompt {
                id: p.prompt.id.clone(),
                mode: "tokenizer".into(),
                error: Box::new(Error::Invalid(format!(
                    "{} prompt tokens + {} max_tokens exceed the model's context of {limit}",
                    p.tokens.len(),
                    p.max_tokens
                ))),
            });
        }
        needed = needed.max(n);
    }
    if config.cost_curve {
        let cc = model.model().cost_curve_config();
        needed = needed.max(cc.context + cc.sizes.iter().copied().max().unwrap_or(1));
    }
    let n_ctx = match config.n_ctx {
        Some(n) if n < needed => {
            return Err(Error::Invalid(format!(
                "a context of {n} tokens is too small for this workload: it needs {needed} (the longest \
                 prompt and its max_tokens, and the cost curve's passes)"
            )));
        }
        Some(n) if n > limit => {
            return Err(Error::Invalid(format!("a context of {n} tokens exceeds the model's {limit}")));
        }
        Some(n) => n,
        None => needed.next_multiple_of(CTX_ROUND).min(limit),
    };
    Ok(SessionConfig {
        kv: config.kv,
        n_ctx,
        n_batch: config.n_batch.max(1),
        threads: config.threads,
        ..SessionConfig::default()
    })
}

/// Where measured runs go, and how long to wait for a quiet machine before each.
struct Measured<'a> {
    runs: &'a mut Vec<RunRecord>,
    outputs: &'a mut Vec<Vec<Token>>,
    total: usize,
    quiet: Duration,
}

/// One measured run of `p` in `r`: the machine settled (and quiet, up to `quiet`), the
/// process's peak memory and other processes' CPU time around it.
fn measure_alone(
    r: &mut dyn Runner,
    p: &Prepared<'_>,
    round: usize,
    quiet: Duration,
) -> Result<(RunRecord, Vec<Token>), Error> {
    let settled = settle(SETTLE_MAX);
    let quiet = if quiet.is_zero() { Duration::ZERO } else { wait_for_quiet(quiet) };
    tracing::debug!(?settled, ?quiet, "waited for idle threads and a quiet machine");
    reset_peak();
    let before = MemStats::read().rss_bytes;
    let cpu_before = CpuTimes::read();
    let out = run_one(r, p, p.max_tokens)?;
    let cpu_after = CpuTimes::read();
    let mem = MemStats::read();
    let peak = mem.peak_rss_bytes.max(mem.rss_bytes);
    let mut rec = record(r, p, &out, peak);
    if r.remote() {
        // pocketd's memory and CPU are its own: this process's say nothing of it, and its
        // threads are the "others" here. Let them go idle before the next.
        rec.peak_rss_bytes = 0;
        settle_daemon();
    } else {
        if !r.accounts_memory() {
            rec.generation_memory_bytes += peak.saturating_sub(before);
        }
        rec.other_cpu_cores = cpu_after.zip(cpu_before).and_then(|(a, b)| a.other_cores_since(&b));
    }
    rec.round = round;
    Ok((rec, out.tokens))
}

/// Let pocketd's threads go idle after a run through it.
fn settle_daemon() {
    wait_for_quiet(DAEMON_SETTLE_MAX);
}

/// `--concurrent n`: the prompts in groups of `n`, each group in every runner alone, request
/// by request (the ordinary runs, into `measured`), then all at once.
fn run_concurrently(
    n: usize,
    rounds: usize,
    prepared: &[Prepared<'_>],
    runners: &mut [Box<dyn Runner>],
    measured: Measured<'_>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConcurrencyResults, Error> {
    let Measured { runs, outputs, total, quiet } = measured;
    let (mut together, mut groups) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for (g, group) in prepared.chunks(n).enumerate() {
            for r in runners.iter_mut() {
                let mut alone = Vec::with_capacity(group.len());
                for p in group {
                    let (rec, tokens) = measure_alone(r.as_mut(), p, round, quiet)?;
                    alone.push((rec.decode_tok_per_s, tokens.clone()));
                    runs.push(rec);
                    outputs.push(tokens);
                    progress(Progress::Run {
                        index: runs.len(),
                        of: total,
                        record: runs.last().expect("just pushed"),
                    });
                }
                if group.len() < 2 {
                    continue;
                }
                settle(SETTLE_MAX);
                if !quiet.is_zero() {
                    wait_for_quiet(quiet);
                }
                let prompts: Vec<PromptRun<'_>> = group.iter().map(|p| p.run(p.max_tokens)).collect();
                let start = std::time::Instant::now();
                let outs = r.run_concurrent(&prompts)?;
                let wall = start.elapsed().as_secs_f64();
                if r.remote() {
                    settle_daemon();
                }
                let mut speeds = Vec::with_capacity(group.len());
                for ((p, out), (alone_speed, alone_tokens)) in group.iter().zip(&outs).zip(&alone) {
                    let rec = record(r.as_ref(), p, out, 0);
                    speeds.push((rec.decode_tok_per_s, *alone_speed));
                    together.push(ConcurrentRun {
                        mode: r.name().to_owned(),
                        group: g,
                        round,
                        prompt_id: p.prompt.id.clone(),
                        generated_tokens: out.tokens.len(),
                        first_token_seconds: out.prefill_seconds,
                        decode_tok_per_s: rec.decode_tok_per_s,
                        alone_decode_tok_per_s: *alone_speed,
                        identical_to_alone: out.tokens == *alone_tokens,
                    });
                }
                let generated = outs.iter().map(|o| o.tokens.len()).sum();
                let record = concurrency::group_record(r.name(), (g, round), &speeds, wall, generated);
                progress(Progress::Together { record: &record });
                groups.push(record);
            }
        }
    }
    let summary = concurrency::summarize(&together, &groups);
    Ok(ConcurrencyResults { requests: n, runs: together, groups, summary })
}

fn run_one(runner: &mut dyn Runner, p: &Prepared<'_>, max_tokens: usize) -> Result<RunOutput, Error> {
    runner.run(&p.run(max_tokens)).map_err(|e| Error::Prompt {
        id: p.prompt.id.clone(),
        mode: runner.name().to_owned(),
        error: Box::new(e),
    })
}

fn record(runner: &dyn Runner, p: &Prepared<'_>, out: &RunOutput, peak: u64) -> RunRecord {
    let rate = |tokens: usize, seconds: f64| if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 };
    let generated = out.tokens.len();
    RunRecord {
        mode: runner.name().to_owned(),
        prompt_id: p.prompt.id.clone(),
        round: 0,
        kind: p.prompt.kind,
        prompt_tokens: p.tokens.len(),
        generated_tokens: generated,
        prefill_tok_per_s: rate(p.tokens.len(), out.prefill_seconds),
        decode_tok_per_s: (generated >= 2 && out.decode_seconds > 0.0)
            .then(|| rate(generated - 1, out.decode_seconds)),
        prefill_seconds: out.prefill_seconds,
        decode_seconds: out.decode_seconds,
        drafted: out.drafted,
        accepted: out.accepted,
        mean_accepted_len: (out.draft_steps > 0).then(|| out.accepted as f64 / out.draft_steps as f64),
        drafter: out.drafter.clone(),
        peak_rss_bytes: peak,
        generation_memory_bytes: out.generation_memory_bytes,
        plan: out.plan.clone(),
        kv_bytes_per_token: runner.kv_bytes_per_token(),
        output_sha256: sha256_tokens(&out.tokens),
        identical_to_vanilla: None,
        diverges_at: None,
        other_cpu_cores: None,
        passes: out.passes.and_then(|p| PassProfile::of(p, out.prefill_seconds + out.decode_seconds)),
    }
}
