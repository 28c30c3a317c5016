//! The benchmark: our engine against llama.cpp, each drafter against plain decoding, in
//! this process or through a running pocketd, on a workload.
//!
//! Every mode of our engine runs through the one request pipeline ([`pocket_runtime`]) that
//! `pocket run` and the daemon use, so the benchmark measures what a user gets: the same
//! rendering, plan, drafter choice and knowledge of the device. [`suite::run`] opens the model
//! once per weight format, measures the verification cost curve for the report, learns what
//! the modes need (cost curves, a skip set) the way `pocket tune` does, then runs every prompt
//! of a [`workload`] in every [`RunMode`], alternating per prompt (A B A B …) so a drifting
//! machine affects all modes alike. Runs start cold — no unrecorded warm-up run before the
//! first measured one — unless [`BenchConfig::start`] says [`Start::Warm`]. `socket:` modes
//! send the same prompts to a running pocketd over HTTP, so that the scheduler, the plan and
//! the transport are in the figures, and the report shows the gap to the same mode in
//! process. Each run is timed the same way in every mode (prefill: prompt tokens over the time
//! to the first token; decode: tokens after the first over the time after the first) and
//! measured for memory. A workload's conversations are replayed turn by turn through pocketd,
//! with its prompt cache and without ([`conversation`]; [`suite::run_workload`] runs both
//! kinds). The [`results`] document follows this crate's `README.md`; [`report`] prints it
//! as a table and [`chart`] draws it.
//!
//! ```no_run
//! use pocket_bench::{self as bench, BenchConfig, Mode};
//!
//! let prompts = bench::workload::load("crates/pocket-bench/workload.jsonl".as_ref())?;
//! let mut config = BenchConfig::new("model.gguf".into(), "smollm2-135m".into());
//! config.modes = vec![Mode::LlamaCpp.into(), Mode::Vanilla.into()];
//! let results = bench::suite::run(&config, &prompts, &mut |_| {})?;
//! print!("{}", bench::report::table(&results));
//! # Ok::<(), bench::Error>(())
//! ```
#![deny(missing_docs)]

use std::path::PathBuf;

pub mod agentic;
pub mod chart;
pub mod compare;
pub mod concurrency;
mod config;
pub mod conversation;
pub mod copying_bound;
pub mod embeddings;
mod machine;
mod median;
pub mod modes;
pub mod report;
pub mod results;
#[cfg(test)]
mod results_sample;
pub mod suite;
pub mod summary;
pub mod workload;

pub use config::{BenchConfig, Progress, Start};
pub use modes::{Mode, RunMode, RunOutput, Runner};
pub use results::BenchResults;
pub use workload::{Conversation, Kind, Prompt, PromptInput, Workload, WorkloadError};

/// What can go wrong running a benchmark.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read or written.
    #[error("cannot {action} {path}: {error}")]
    Io {
        /// What was being done (`read the workload`, ...).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why. (Not a `source`: the message already says it, and anyhow's chain would
        /// repeat it.)
        error: std::io::Error,
    },
    /// A workload line is not a valid prompt.
    #[error("{path}: {error}")]
    Workload {
        /// The workload file.
        path: PathBuf,
        /// The line and what is wrong with it.
        error: WorkloadError,
    },
    /// A mode name that is not known.
    #[error("unknown mode {0:?}; known modes: {known}", known = Mode::KNOWN.join(", "))]
    UnknownMode(String),
    /// A setting or argument is invalid.
    #[error("{0}")]
    Invalid(String),
    /// A prompt could not be prepared or run.
    #[error("prompt {id:?} in mode {mode}: {error}")]
    Prompt {
        /// The prompt's id.
        id: String,
        /// The mode (`tokenizer` while preparing prompts).
        mode: String,
        /// What went wrong.
        error: Box<Error>,
    },
    /// Opening, planning or running a model failed.
    #[error(transparent)]
    Runtime(#[from] pocket_runtime::Error),
    /// Talking to pocketd failed (`socket:` modes).
    #[error("through pocketd: {0}")]
    Daemon(#[from] pocket_api::client::ClientError),
    /// The chart could not be drawn.
    #[error("cannot draw the chart {path}: {message}")]
    Chart {
        /// The chart file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The results could not be encoded.
    #[error("cannot encode the results: {0}")]
    Json(#[from] serde_json::Error),
}

/// The `main` of a `cargo bench` target built without libtest's harness: `--list` (which
/// `cargo bench` passes to harnesses) names the bench `name` without running it; otherwise
/// `run` runs, and an error is printed with its causes.
pub fn cargo_bench_main<E: std::fmt::Display>(
    name: &str,
    run: impl FnOnce() -> Result<(), E>,
) -> std::process::ExitCode {
    if std::env::args().any(|a| a == "--list") {
        println!("{name}: bench");
        return std::process::ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

impl From<pocket_core::Error> for Error {
    fn from(e: pocket_core::Error) -> Self {
        Error::Runtime(e.into())
    }
}
