//! The benchmark: our engine against llama.cpp (and, later, each drafter) on a workload.
//!
//! [`suite::run`] loads the model once per mode, measures our engine's verification cost
//! curve, then runs every prompt of a [`workload`] in every [`RunMode`] (a [`Mode`] on a
//! weight format), alternating per prompt (A B A B …) so a drifting machine affects all
//! modes alike. Each run is timed the
//! same way in every mode (prefill: prompt tokens over the time to the first token; decode:
//! tokens after the first over the time after the first) and measured for memory. The
//! [`results`] document follows `shared/bench/README.md`; [`report`] prints it as a table
//! and [`chart`] draws it.
//!
//! ```no_run
//! use pocketd::bench::{self, BenchConfig, Mode};
//!
//! let prompts = bench::workload::load("benches/workload.jsonl".as_ref())?;
//! let mut config = BenchConfig::new("model.gguf".into(), "smollm2-135m".into());
//! config.modes = vec![Mode::LlamaCpp.into(), Mode::Vanilla.into()];
//! let results = bench::suite::run(&config, &prompts, &mut |_| {})?;
//! print!("{}", bench::report::table(&results));
//! # Ok::<(), bench::Error>(())
//! ```

use std::path::PathBuf;

pub mod chart;
pub mod compare;
mod machine;
pub mod modes;
pub mod report;
pub mod results;
pub mod suite;
pub mod summary;
pub mod workload;

pub use modes::{Mode, RunMode, RunOutput, Runner};
pub use results::BenchResults;
pub use suite::{BenchConfig, Progress};
pub use workload::{Kind, Prompt, PromptInput, WorkloadError};

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
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] pocket_core::Error),
    /// Loading or running a model on ggml failed.
    #[error(transparent)]
    Ggml(#[from] pocket_ggml::Error),
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
pub fn cargo_bench_main(name: &str, run: impl FnOnce() -> anyhow::Result<()>) -> std::process::ExitCode {
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
