//! `pocket run`: generate in this process, without a daemon.

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::Context;
use pocket_core::cost::CostModel;
use pocket_core::memory::{BudgetSpec, Plan};
use pocket_core::spec::{SpecMode, SpecStats};
use pocket_core::{
    ChatMessage, GenerateRequest, KvType, Model, SamplingConfig, SessionConfig, StopConfig, default_threads,
    generate_speculative,
};
use pocket_ggml::WeightFormat;
use serde::Serialize;

use super::common::{ModelArgs, WeightChoice};

mod seq2seq;
use crate::mem::{MemStats, PeakSampler, budget_ledger};
use crate::spec::{
    DEFAULT_MAX_DRAFT, SpecCache, SpecSetup, WeightsEstimate, plan_session, resolve_auto_weights,
};

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
    /// KV cache type: f16, q8_0 or q4_0.
    #[arg(long, default_value = "f16")]
    kv: KvType,
    /// Context size in tokens (capped at the model's training context).
    #[arg(long, default_value_t = 4096)]
    ctx_size: usize,
    /// CPU threads (default: all cores this process may use).
    #[arg(short = 't', long)]
    threads: Option<usize>,
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
    device: &'a str,
    /// The format the weight matrices were held in.
    weights: &'a str,
    /// For `--weights auto` while speculating: each format's estimate from its cost curve.
    #[serde(skip_serializing_if = "<[WeightsEstimate]>::is_empty")]
    weight_estimates: &'a [WeightsEstimate],
    kv: KvType,
    threads: usize,
    text: &'a str,
    stop: &'a str,
    prompt_tokens: usize,
    generated_tokens: usize,
    prefill_tok_per_s: f64,
    decode_tok_per_s: f64,
    kv_bytes: usize,
    kv_bytes_per_token: usize,
    peak_rss_bytes: u64,
    peak_anon_bytes: u64,
    peak_file_bytes: u64,
    /// The `--memory-budget` in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_budget_bytes: Option<u64>,
    /// What the session was given under the budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<Plan>,
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
    // Bad flags are reported before the model is loaded.
    args.sampling.config().validate()?;
    if args.spec.spec == SpecMode::Draft && args.spec.draft_model.is_none() {
        anyhow::bail!("--spec draft needs a draft model: add --draft-model NAME");
    }
    StopConfig { max_tokens: args.max_tokens, stop: args.stop.clone() }.validate()?;
    let prompt = if args.prompt == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the prompt from stdin")?
    } else {
        args.prompt.clone()
    };
    let (ledger, _process) = budget_ledger(args.memory_budget)?;
    let budgeted = args.memory_budget.is_some();
    let path = args.model.resolve()?;
    if crate::seq2seq::is_seq2seq(&path) {
        return seq2seq::run(&args, &path, &prompt, &ledger);
    }
    if args.spec.spec == SpecMode::InputCopy {
        anyhow::bail!(
            "--spec inputcopy drafts from an encoder-decoder model's source text; for decoder-only models use \
             suffix, which also matches the prompt"
        );
    }
    let weight_choice = match args.model.weights {
        // Trying another format would hold two copies of the weights at once.
        WeightChoice::Auto if budgeted => WeightChoice::Format(WeightFormat::AsStored),
        w => w,
    };
    let model = args.model.load_in(weight_choice.initial(), &ledger)?;
    let tokenizer = model.tokenizer();
    let text = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage { role: "system".into(), content: system.clone() });
        }
        messages.push(ChatMessage { role: "user".into(), content: prompt });
        tokenizer.apply_chat_template(&messages, true)?
    } else {
        prompt
    };
    let tokens = tokenizer.encode(&text, true)?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let mut config = SessionConfig { kv: args.kv, n_ctx: args.ctx_size, threads, ..SessionConfig::default() };
    // The draft model loads from the same directory onto the same device as the target.
    let mut draft_model = args
        .spec
        .draft_model
        .as_ref()
        .map(|name| {
            ModelArgs { model: name.clone(), ..args.model.clone() }.load_in(WeightFormat::AsStored, &ledger)
        })
        .transpose()?;
    let mut spec_mode = args.spec.spec;
    let mut max_draft = DEFAULT_MAX_DRAFT;
    let plan = if budgeted {
        let plan = plan_session(
            &model,
            draft_model.as_ref(),
            &config,
            &ledger,
            tokens.len() + args.max_tokens,
            spec_mode,
        )?;
        plan.apply_to(&mut config);
        spec_mode = plan.spec;
        max_draft = plan.max_draft.max(1);
        if !plan.draft_model {
            draft_model = None; // gives its weights back to the budget
        }
        Some(plan)
    } else {
        None
    };
    let (model, weight_estimates) = match weight_choice {
        WeightChoice::Auto => {
            let mut on_measure = || {
                eprintln!(
                    "--weights auto: measuring this device's cost curves for the stored and Q8_0 weights \
                     (once; cached)"
                )
            };
            let load = |w| args.model.load_as(w);
            resolve_auto_weights(model, spec_mode, &config, &tokens, &load, &mut on_measure)?
        }
        WeightChoice::Format(_) => (model, Vec::new()),
    };
    let tokenizer = model.tokenizer();
    let mut cache = SpecCache::open(model.path(), model.weight_format());
    let cost = match spec_mode {
        SpecMode::Off => CostModel::linear(1.0),
        _ => {
            // Measured over a longer context than a small plan may give the session (its own
            // session is dropped before generation starts).
            let measuring = SessionConfig {
                n_ctx: args.ctx_size.max(config.n_ctx),
                max_rows: pocket_core::DEFAULT_MAX_ROWS,
                ..config.clone()
            };
            CostModel::from_curve(&cache.cost_curve(&model, &measuring, &tokens, &ledger)?)
        }
    };
    let setup = SpecSetup {
        model: &model,
        session: &config,
        cost,
        skip_set: cache.skip_set().cloned(),
        draft_model: draft_model.as_ref(),
        seed: args.sampling.seed,
        max_draft,
        ledger: ledger.clone(),
    };
    let mut drafter = setup.build(spec_mode)?;
    let mut session = model.new_session_in(&config, &ledger)?;
    let request = GenerateRequest {
        prompt: tokens,
        sampling: args.sampling.config(),
        stop: StopConfig { max_tokens: args.max_tokens, stop: args.stop.clone() },
    };

    let mut peaks = PeakSampler::default();
    peaks.sample();
    let mut stdout = std::io::stdout().lock();
    let mut n = 0usize;
    let d = drafter.as_mut().map(|d| d.as_drafter());
    let generation =
        generate_speculative(model.info(), &mut session, tokenizer, &request, d, &mut |event| {
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
        })?;
    peaks.sample();
    if let Some(set) = drafter.as_ref().and_then(|d| d.found_skip_set())
        && cache.skip_set() != Some(&set)
    {
        tracing::info!(skip = ?set.skip, agreement = set.agreement, "found a layer-skip set");
        cache.set_skip_set(set);
    }
    let drafter_name = drafter.as_mut().map_or_else(|| "none".to_string(), |d| d.as_drafter().describe());

    if args.json {
        let report = Report {
            model: &model.info().name,
            device: model.device_name(),
            weights: model.weight_format().name(),
            weight_estimates: &weight_estimates,
            kv: config.kv,
            threads,
            text: &generation.text,
            stop: generation.stop.as_str(),
            prompt_tokens: generation.prompt_tokens,
            generated_tokens: generation.tokens.len(),
            prefill_tok_per_s: generation.prefill_tok_per_s(),
            decode_tok_per_s: generation.decode_tok_per_s(),
            kv_bytes: session.kv_bytes(),
            kv_bytes_per_token: model.kv_bytes_per_token(config.kv),
            peak_rss_bytes: MemStats::read().peak_rss_bytes,
            peak_anon_bytes: peaks.peak_anon_bytes,
            peak_file_bytes: peaks.peak_file_bytes,
            memory_budget_bytes: budgeted.then(|| ledger.budget()),
            plan,
            spec: SpecReport {
                mode: spec_mode,
                drafter: drafter_name,
                stats: generation.spec,
                acceptance: generation.spec.acceptance(),
                mean_accepted_len: generation.spec.mean_accepted_len(),
            },
        };
        serde_json::to_writer_pretty(&mut stdout, &report)?;
    }
    writeln!(stdout)?;
    Ok(())
}
