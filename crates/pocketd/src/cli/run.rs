//! `pocket run`: generate in this process, without a daemon, through the same pipeline the
//! daemon's requests take.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::Context;
use pocket_core::memory::{BudgetSpec, Plan};
use pocket_core::spec::{SpecMode, SpecStats};
use pocket_core::{ChatMessage, KvType, SamplingConfig, SessionConfig, StopConfig, Threads, Token};
use pocket_runtime::WeightFormat;
use pocket_runtime::pipeline::{self, Input, OnEvent, Request};
use pocket_runtime::process::{MemStats, PeakSampler, budget_ledger, with_device_pool};
use pocket_runtime::weight_choice::{WeightsEstimate, auto_weights, candidates};
use pocket_runtime::{DEFAULT_MAX_DRAFT, Engine, LoadedModel, Settings};
use serde::Serialize;

use super::common::{ModelArgs, WeightChoice};

/// Flags of `pocket run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt (`-` reads it from standard input).
    prompt: String,
    /// Wrap the prompt in the model's chat template, as a user message.
    #[arg(long)]
    chat: bool,
    /// A system message to put before the prompt (with `--chat`).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 256)]
    max_tokens: usize,
    /// Stop when this text appears (not included in the output); may be repeated.
    #[arg(long)]
    stop: Vec<String>,
    /// KV cache type: f16, q8_0 or q4_0, or keys/values such as q8_0/q4_0.
    #[arg(long, default_value = "f16")]
    kv: KvType,
    /// Context size in tokens (capped at the model's training context).
    #[arg(long, default_value_t = 4096)]
    ctx_size: usize,
    /// CPU threads of each pass: `auto` (as many as other programs leave free, pass by pass)
    /// or a count.
    #[arg(short = 't', long, default_value = "auto")]
    threads: Threads,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Memory this process may use at most, its peak resident memory included: a size
    /// (`200MiB`, `1.5GiB`) or `auto` (the cgroup's limit or the memory available now, less a
    /// tenth). The session is planned to fit — the prompt in smaller passes, then shorter
    /// drafts, then no draft model, then no speculation, then a lower-bit KV cache — or
    /// refused with the bytes needed and free.
    /// With a budget, `--weights auto` keeps the stored weights.
    #[arg(long)]
    memory_budget: Option<BudgetSpec>,
    /// Print one JSON object with the text and statistics instead of streaming the text.
    #[arg(long)]
    json: bool,
}

/// Speculative decoding flags, shared with other subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: off, auto (choose per step from measured acceptance and this
    /// device's cost curve), suffix, inputcopy (encoder-decoder models), layerskip or draft
    /// (with --draft-model).
    #[arg(long, default_value = "off")]
    pub spec: SpecMode,
    /// The draft model for `--spec draft` (and for `auto` to consider): a manifest name, a
    /// file in the models directory or a path; it must share the target's vocabulary.
    #[arg(long)]
    pub draft_model: Option<String>,
}

/// Sampling flags, shared with other subcommands. Negative numbers are accepted by the parser
/// so that the sampler's own check can say which range is allowed.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Keep the most likely tokens whose probabilities add up to p (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Drop tokens less likely than min-p times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    min_p: f32,
    /// Penalise tokens seen in the last 64 tokens (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Seed of the sampler's random numbers.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    /// The sampler configuration these flags describe.
    pub fn config(&self) -> SamplingConfig {
        SamplingConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplingConfig::default()
        }
    }
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Report<'a> {
    model: &'a str,
    /// `ggml` or `tract`.
    engine: &'a str,
    device: &'a str,
    /// The format the weight matrices were held in.
    weights: &'a str,
    /// For `--weights auto` while speculating: each format's estimate from its cost curve.
    #[serde(skip_serializing_if = "<[WeightsEstimate]>::is_empty")]
    weight_estimates: &'a [WeightsEstimate],
    kv: KvType,
    /// The setting: `auto` or a count.
    threads: Threads,
    /// Threads per forward pass, on average.
    threads_used: f64,
    text: &'a str,
    /// The generated token ids.
    tokens: &'a [Token],
    stop: &'a str,
    prompt_tokens: usize,
    generated_tokens: usize,
    prefill_tok_per_s: f64,
    decode_tok_per_s: f64,
    /// KV cache bytes the session held at the end.
    kv_bytes: u64,
    kv_bytes_per_token: u64,
    /// Bytes the session held at the end (KV, compute and logits buffers).
    session_bytes: u64,
    peak_rss_bytes: u64,
    peak_anon_bytes: u64,
    peak_file_bytes: u64,
    /// The `--memory-budget` in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_budget_bytes: Option<u64>,
    /// What the session was given under the budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a Plan>,
    spec: SpecReport,
}

/// Speculation statistics in `--json`.
#[derive(Debug, Serialize)]
struct SpecReport {
    mode: SpecMode,
    drafter: String,
    #[serde(flatten)]
    stats: SpecStats,
    acceptance: Option<f64>,
    mean_accepted_len: Option<f64>,
}

/// Run `pocket run`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (spec, stop) = checked(&args)?;
    let prompt = if args.prompt == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the prompt from stdin")?
    } else {
        args.prompt.clone()
    };
    let (ledger, _process) = budget_ledger(args.memory_budget)?;
    // A discrete GPU's memory is budgeted apart from the host's (`auto`: what is free on it).
    let (ledger, _) = with_device_pool(ledger, &args.model.device, BudgetSpec::Auto)?;
    let (model, draft, weight_estimates) = open_models(&args, spec, &ledger)?;
    let request = request_of(&args, prompt, stop, spec);
    let prepared = pipeline::prepare(&model, draft.as_ref(), &request, &ledger)?;
    // A plan that gave the draft model up gives its weights back to the budget.
    let draft = draft.filter(|_| prepared.draft_model);
    if prepared.spec == SpecMode::Auto
        && model.knowledge().cost_curve(prepared.config.threads.max(), prepared.config.kv).is_none()
    {
        eprintln!(
            "note: auto decodes plainly until this device's verification cost curve is measured; `pocket tune -m \
             {}` measures it (once)",
            args.model.model
        );
    }

    let mut peaks = PeakSampler::default();
    peaks.sample();
    let mut stdout = std::io::stdout().lock();
    let mut n = 0usize;
    let outcome = {
        let mut sink = OnEvent::new(|event: pocket_core::Event<'_>| {
            n += 1;
            if n.is_multiple_of(16) {
                peaks.sample();
            }
            if !args.json && !event.text.is_empty() {
                // A closed stdout (`| head`) ends generation instead of failing it.
                if stdout.write_all(event.text.as_bytes()).and_then(|_| stdout.flush()).is_err() {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
        pipeline::run(&model, draft.as_ref(), &prepared, &ledger, &mut sink)?
    };
    peaks.sample();

    if args.json {
        let budget = args.memory_budget.is_some().then(|| ledger.budget());
        let run = Ran {
            model: &model,
            prepared: &prepared,
            outcome: &outcome,
            weight_estimates: &weight_estimates,
        };
        serde_json::to_writer_pretty(&mut stdout, &report(&args, &run, &peaks, budget)?)?;
    }
    writeln!(stdout)?;
    Ok(())
}

/// Bad flags, refused before the model is loaded: the speculation mode (and the stop
/// settings) to run with.
fn checked(args: &Args) -> anyhow::Result<(SpecMode, StopConfig)> {
    let spec = args.spec.spec;
    let stop = StopConfig { max_tokens: args.max_tokens, stop: args.stop.clone() };
    let sampling = args.sampling.config();
    let settings =
        Settings { spec, draft_model: args.spec.draft_model.is_some(), sampling: &sampling, stop: &stop };
    // What holds for every model first, so that a bad flag is named before a bad model.
    pocket_runtime::validate(&settings, None).map_err(flag_error)?;
    let engine = Engine::for_path(&args.model.resolve()?);
    pocket_runtime::validate(&settings, Some(engine)).map_err(flag_error)?;
    Ok((spec, stop))
}

/// A refused setting, with the flag that sets its field (`top_p` is `--top-p`).
fn flag_error(e: pocket_runtime::Error) -> anyhow::Error {
    match e.param() {
        Some("repetition_penalty") => anyhow::anyhow!("{e} (--repeat-penalty)"),
        Some(param) => anyhow::anyhow!("{e} (--{})", param.replace('_', "-")),
        None => e.into(),
    }
}

/// The model in the weight format asked for (with `--weights auto`, the one its measured cost
/// curves favour, and the estimates that chose it) and the draft model, if any.
fn open_models(
    args: &Args,
    spec: SpecMode,
    ledger: &pocket_core::memory::Ledger,
) -> anyhow::Result<(LoadedModel, Option<LoadedModel>, Vec<WeightsEstimate>)> {
    let weight_choice = match args.model.weights {
        // Trying another format would hold two copies of the weights at once.
        WeightChoice::Auto if args.memory_budget.is_some() => WeightChoice::Format(WeightFormat::AsStored),
        w => w,
    };
    let mut model = args.model.open(weight_choice.initial(), ledger)?;
    let mut weight_estimates = Vec::new();
    if weight_choice == WeightChoice::Auto {
        let (chosen, estimates) = auto_weights(&model, spec, args.threads.max(), args.kv);
        if spec != SpecMode::Off && estimates.is_empty() && candidates(&model).len() > 1 {
            eprintln!(
                "--weights auto: the cost curves of the stored and Q8_0 weights are not both measured on this \
                 device yet, so the weights stay as stored; `pocket tune -m {}` measures them (once)",
                args.model.model
            );
        }
        if chosen != model.weights() {
            drop(model); // its weights go back to the budget before the other format loads
            model = args.model.open(chosen, ledger)?;
        }
        weight_estimates = estimates;
    }
    // The draft model loads from the same directory onto the same device as the target.
    let draft = args
        .spec
        .draft_model
        .as_ref()
        .map(|name| {
            ModelArgs { model: name.clone(), ..args.model.clone() }.open(WeightFormat::AsStored, ledger)
        })
        .transpose()?;
    Ok((model, draft, weight_estimates))
}

/// The pipeline's request: the prompt (as a chat turn with `--chat`) and the flags.
fn request_of(args: &Args, prompt: String, stop: StopConfig, spec: SpecMode) -> Request {
    let input = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new(pocket_core::Role::System, system.clone()));
        }
        messages.push(ChatMessage::new(pocket_core::Role::User, prompt));
        Input::Chat(messages)
    } else {
        Input::Text(prompt)
    };
    Request {
        template_kwargs: Default::default(),
        input,
        sampling: args.sampling.config(),
        stop,
        spec,
        session: SessionConfig {
            kv: args.kv,
            n_ctx: args.ctx_size,
            threads: args.threads,
            ..SessionConfig::default()
        },
        max_draft: DEFAULT_MAX_DRAFT,
        planned: true,
        prompt_cache: false, // one request: nothing to continue
        cache_hint: None,
        grammar: None,
        logprobs: None,
        tools: Default::default(),
    }
}

/// What one run made, for its report.
struct Ran<'a> {
    model: &'a LoadedModel,
    prepared: &'a pipeline::Prepared,
    outcome: &'a pipeline::Outcome,
    weight_estimates: &'a [WeightsEstimate],
}

/// `--json`'s report of a run; `budget` when one was given.
fn report<'a>(
    args: &Args,
    run: &Ran<'a>,
    peaks: &PeakSampler,
    budget: Option<u64>,
) -> anyhow::Result<Report<'a>> {
    let Ran { model, prepared, outcome, weight_estimates } = *run;
    let g = &outcome.generation;
    Ok(Report {
        model: &model.model().info().name,
        engine: model.engine().name(),
        device: model.device(),
        weights: model.weights().name(),
        weight_estimates,
        kv: prepared.config.kv,
        threads: args.threads,
        threads_used: g.passes.mean(),
        text: &g.text,
        tokens: &g.tokens,
        stop: g.stop.as_str(),
        prompt_tokens: g.prompt_tokens,
        generated_tokens: g.tokens.len(),
        prefill_tok_per_s: g.prefill_tok_per_s(),
        decode_tok_per_s: g.decode_tok_per_s(),
        kv_bytes: outcome.kv_bytes,
        kv_bytes_per_token: model.kv_bytes_per_token(&prepared.config)?,
        session_bytes: outcome.session_bytes,
        peak_rss_bytes: MemStats::read().peak_rss_bytes,
        peak_anon_bytes: peaks.peak_anon_bytes,
        peak_file_bytes: peaks.peak_file_bytes,
        memory_budget_bytes: budget,
        plan: outcome.plan.as_ref().filter(|_| budget.is_some()),
        spec: SpecReport {
            mode: outcome.spec,
            drafter: outcome.drafter.as_ref().map_or_else(|| "none".into(), ToString::to_string),
            stats: g.spec,
            acceptance: g.spec.acceptance(),
            mean_accepted_len: g.spec.mean_accepted_len(),
        },
    })
}
