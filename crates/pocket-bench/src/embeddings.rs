//! The embedding benchmark: sentences per second at each batch size, through the same
//! [`embed`](pocket_runtime::embed::embed) that the daemon's `/v1/embeddings` calls, and
//! beside it, where one is given, the reference implementation's figures on the same texts
//! (a command that prints them as one JSON line; sentence-transformers' is
//! `crates/pocketd/tests/fixtures/embeddings/reference.py`).

use std::time::{Duration, Instant};

use pocket_core::Threads;
use pocket_runtime::LoadedModel;
use pocket_runtime::embed::{EmbedInput, embed};
use pocket_runtime::process::{MemStats, reset_peak};
use serde::{Deserialize, Serialize};

/// The built-in texts: everyday sentences of the kind local apps index (notes, mail, home).
pub const DEFAULT_SENTENCES: &str = include_str!("../sentences.txt");

/// At least this many texts per measured run (the texts repeated), so a run lasts long enough
/// to time.
const MIN_TEXTS: usize = 256;

/// One batch size's figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchFigure {
    /// Texts per call.
    pub batch: usize,
    /// Texts embedded per second, the best of the runs.
    pub per_second: f64,
}

/// What [`run`] measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedBench {
    /// Texts per run (the given ones, repeated).
    pub texts: usize,
    /// Their tokens, in all.
    pub tokens: usize,
    /// One per batch size asked for.
    pub batches: Vec<BatchFigure>,
    /// The process's peak resident memory over the measured runs (the model included).
    pub peak_rss_bytes: u64,
    /// The model's bytes in the memory budget's ledger (weights and pass buffers).
    pub ledger_bytes: u64,
    /// How long it waited for a quiet machine before the runs.
    pub waited_quiet: Duration,
}

/// Embed `texts` (repeated to at least 256) in calls of each of `batches` texts, `runs`
/// times after a warm-up, on up to `threads`, after waiting up to `quiet` for the machine to
/// go idle; the best run of each counts. `ledger_bytes` is read after the runs.
pub fn run(
    model: &LoadedModel,
    texts: &[String],
    batches: &[usize],
    runs: usize,
    threads: Threads,
    quiet: Duration,
    ledger_bytes: impl Fn() -> u64,
) -> pocket_runtime::Result<EmbedBench> {
    let all: Vec<String> = texts.iter().cycle().take(MIN_TEXTS.max(texts.len())).cloned().collect();
    // Warm-up: the pass context is made and the weights paged in.
    embed(model, &EmbedInput::Texts(texts.iter().take(32).cloned().collect()), true, None, threads)?;
    let waited_quiet = if quiet.is_zero() { Duration::ZERO } else { crate::machine::wait_for_quiet(quiet) };
    reset_peak();
    let mut tokens = 0;
    let mut figures = Vec::new();
    for &batch in batches {
        let mut best = 0f64;
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            tokens = 0;
            for chunk in all.chunks(batch.max(1)) {
                tokens +=
                    embed(model, &EmbedInput::Texts(chunk.to_vec()), true, None, threads)?.prompt_tokens;
            }
            best = best.max(all.len() as f64 / start.elapsed().as_secs_f64());
        }
        figures.push(BatchFigure { batch, per_second: best });
    }
    let mem = MemStats::read();
    Ok(EmbedBench {
        texts: all.len(),
        tokens,
        batches: figures,
        peak_rss_bytes: mem.peak_rss_bytes.max(mem.rss_bytes),
        ledger_bytes: ledger_bytes(),
        waited_quiet,
    })
}
