//! `pocket run` on an encoder-decoder model (tract): the prompt is the source text.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::Path;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{Model, SessionConfig, StopConfig, default_threads};
use serde::Serialize;

use super::{Args, SpecReport};
use crate::mem::{MemStats, PeakSampler};
use crate::spec::{DEFAULT_MAX_DRAFT, plan_session};

/// What `--json` prints for an encoder-decoder model.
#[derive(Debug, Serialize)]
struct Report<'a> {
    model: &'a str,
    engine: &'static str,
    /// Whether the model keeps a KV cache (a with-past decoder) or recomputes the prefix.
    kv_cache: bool,
    kv: pocket_core::KvType,
    threads: usize,
    text: &'a str,
    stop: &'a str,
    prompt_tokens: usize,
    generated_tokens: usize,
    prefill_tok_per_s: f64,
    decode_tok_per_s: f64,
    kv_bytes: u64,
    cross_kv_bytes: u64,
    peak_rss_bytes: u64,
    peak_anon_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_budget_bytes: Option<u64>,
    spec: SpecReport,
}

/// Run `pocket run` with the model at `path`.
pub(super) fn run(args: &Args, path: &Path, prompt: &str, ledger: &Ledger) -> anyhow::Result<()> {
    if args.chat {
        anyhow::bail!(
            "{} is an encoder-decoder model without a chat template; give the text without --chat",
            args.model.model
        );
    }
    if args.spec.draft_model.is_some() {
        anyhow::bail!(
            "--draft-model is for decoder (GGUF) models; encoder-decoder models draft with inputcopy or suffix"
        );
    }
    let model = crate::seq2seq::load(path, ledger)?;
    let source = model.tokenizer().encode(prompt, true)?;
    let threads = args.threads.unwrap_or_else(default_threads);
    // The decoder needs room for the start token and the answer; the source for itself.
    let n_ctx = args.ctx_size.min(model.info().n_ctx_train.max(source.len()).max(args.max_tokens + 1));
    let mut config = SessionConfig { kv: args.kv, n_ctx, threads, ..SessionConfig::default() };
    let mut spec_mode = args.spec.spec;
    let budgeted = args.memory_budget.is_some();
    if budgeted {
        let plan = plan_session(&model, None, &config, ledger, n_ctx, spec_mode)?;
        plan.apply_to(&mut config);
        spec_mode = plan.spec;
    }
    let cost = match spec_mode {
        SpecMode::Off => pocket_core::cost::CostModel::linear(1.0),
        _ => crate::seq2seq::measure_cost(&model, &config, &source, ledger)?,
    };
    let mut drafter = crate::seq2seq::drafter(spec_mode, &source, cost, DEFAULT_MAX_DRAFT)?;
    let mut session = model.new_session(&config, ledger)?;
    let mut peaks = PeakSampler::default();
    peaks.sample();
    let mut stdout = std::io::stdout().lock();
    let stop = StopConfig { max_tokens: args.max_tokens, stop: args.stop.clone() };
    let generation = crate::seq2seq::generate(
        &model,
        &mut session,
        &source,
        args.sampling.config(),
        stop,
        drafter.as_mut(),
        &mut |event| {
            if !args.json && !event.text.is_empty() {
                // A closed stdout (`| head`) ends generation instead of failing it.
                if stdout.write_all(event.text.as_bytes()).and_then(|_| stdout.flush()).is_err() {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        },
    )?;
    peaks.sample();
    if args.json {
        let report = Report {
            model: &model.info().name,
            engine: "tract",
            kv_cache: model.has_kv_cache(),
            kv: config.kv,
            threads,
            text: &generation.text,
            stop: generation.stop.as_str(),
            prompt_tokens: generation.prompt_tokens,
            generated_tokens: generation.tokens.len(),
            prefill_tok_per_s: generation.prefill_tok_per_s(),
            decode_tok_per_s: generation.decode_tok_per_s(),
            kv_bytes: session.kv_bytes(),
            cross_kv_bytes: session.cross_kv_bytes(),
            peak_rss_bytes: MemStats::read().peak_rss_bytes,
            peak_anon_bytes: peaks.peak_anon_bytes,
            memory_budget_bytes: budgeted.then(|| ledger.budget()),
            spec: SpecReport {
                mode: spec_mode,
                drafter: drafter.as_ref().map_or_else(|| "none".to_string(), |d| d.describe()),
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
