//! Generating with an encoder-decoder model: encode the source once, then decode from the
//! decoder-start token with the same loop, sampling and speculation decoder models use.
//!
//! Drafting for these models reads the source: `inputcopy` copies it from the aligned
//! position (Aggressive Decoding), `suffix` matches the output against source and output,
//! and `auto` chooses between them and plain decoding per step. Layer skipping and draft
//! models are ggml features and are refused here.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use pocket_core::cost::{CostCurveConfig, CostModel, measure_cost_curve};
use pocket_core::memory::Ledger;
use pocket_core::spec::{AutoConfig, AutoDrafter, Drafter, InputCopyDrafter, SpecMode, SuffixDrafter};
use pocket_core::{
    Event, GenerateRequest, Generation, Model, SamplingConfig, Session, SessionConfig, StopConfig, Token,
    generate_speculative,
};
use pocket_tract::TractModel;

/// Whether `path` holds an encoder-decoder model for the tract engine (a directory of ONNX
/// graphs) rather than a GGUF file.
pub fn is_seq2seq(path: &Path) -> bool {
    path.is_dir() || path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Load the model at `path` (a directory, or one of its `.onnx` files), paid for in `ledger`.
pub fn load(path: &Path, ledger: &Ledger) -> anyhow::Result<TractModel> {
    let dir = if path.is_dir() { path } else { path.parent().unwrap_or(path) };
    TractModel::load_in(dir, ledger).with_context(|| format!("loading {}", dir.display()))
}

/// How the cost curve is measured for these models: a few sizes at a short context, since
/// a decoder call of a model without a cache recomputes its whole prefix and a long context
/// would make measuring slow.
fn curve_config() -> CostCurveConfig {
    CostCurveConfig { sizes: vec![1, 2, 4, 8, 16], context: 16, repetitions: 3, warmup: 1 }
}

/// The device's cost of verifying drafts with `model`, measured now on a session of
/// `config` over `source` (a second or so for flan-t5-small on two cores).
pub fn measure_cost(
    model: &TractModel,
    config: &SessionConfig,
    source: &[Token],
    ledger: &Ledger,
) -> anyhow::Result<CostModel> {
    let curve_config = curve_config();
    let largest = curve_config.sizes.iter().copied().max().unwrap_or(1);
    let n_ctx = config.n_ctx.max(curve_config.context + largest).max(source.len());
    let measuring = SessionConfig { n_ctx, max_rows: largest.max(config.max_rows), ..config.clone() };
    let mut session = model.new_session(&measuring, ledger)?;
    session.encode(source)?;
    // Decoder tokens from the source's own ids: any valid ids do for timing.
    let curve = measure_cost_curve(&mut session, model.info().n_layers, source, &curve_config)?;
    Ok(CostModel::from_curve(&curve))
}

/// The drafter `mode` asks for over `source`; `None` for plain decoding.
pub fn drafter(
    mode: SpecMode,
    source: &[Token],
    cost: CostModel,
    max_draft: usize,
) -> anyhow::Result<Option<Box<dyn Drafter>>> {
    Ok(match mode {
        SpecMode::Off => None,
        SpecMode::InputCopy => Some(Box::new(InputCopyDrafter::new(source, max_draft, cost))),
        SpecMode::Suffix => Some(Box::new(SuffixDrafter::with_source(source, max_draft, cost))),
        SpecMode::Auto => {
            let config = AutoConfig { max_draft, ..AutoConfig::new(cost) };
            Some(Box::new(AutoDrafter::for_seq2seq(config, source)))
        }
        SpecMode::LayerSkip | SpecMode::Draft => anyhow::bail!(
            "--spec {mode} is not available for encoder-decoder models; use inputcopy, suffix or auto"
        ),
    })
}

/// Encode `source` into `session` and generate from the decoder-start token.
///
/// The [`Generation`] counts the source as the prompt: `prompt_tokens` is its length and
/// `prefill_seconds` covers encoding it and the first decoder call.
pub fn generate(
    model: &TractModel,
    session: &mut dyn Session,
    source: &[Token],
    sampling: SamplingConfig,
    stop: StopConfig,
    drafter: Option<&mut Box<dyn Drafter>>,
    on_event: &mut dyn FnMut(Event<'_>) -> ControlFlow<()>,
) -> pocket_core::Result<Generation> {
    let drafter = drafter.map(|d| -> &mut dyn Drafter { d.as_mut() });
    let start = Instant::now();
    session.encode(source)?;
    let encode_seconds = start.elapsed().as_secs_f64();
    let request = GenerateRequest { prompt: vec![model.decoder_start()], sampling, stop };
    let mut generation =
        generate_speculative(model.info(), session, model.tokenizer(), &request, drafter, on_event)?;
    generation.prompt_tokens = source.len();
    generation.prefill_seconds += encode_seconds;
    Ok(generation)
}
