//! What a benchmark is asked to do ([`BenchConfig`], how its runs [`Start`]) and what it
//! reports while it runs ([`Progress`]): what the suite and the conversations' replay both take.

use std::path::PathBuf;
use std::time::Duration;

use pocket_core::memory::BudgetSpec;
use pocket_core::{KvType, SessionConfig, Threads};
use pocket_runtime::DeviceChoice;
use serde::{Deserialize, Serialize};

use super::concurrency;
use super::modes::{Mode, RunMode};
use super::results::{RunRecord, TurnRecord};

/// Longest wait, after a run through pocketd, for the daemon's threads to go idle.
pub(crate) const DAEMON_SETTLE_MAX: Duration = Duration::from_millis(500);

/// How the measured runs start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// The first measured run of each mode is its first generation since the model was
    /// opened (through pocketd: since the model was loaded again), as a user's first request
    /// is.
    #[default]
    Cold,
    /// Each mode first generates from one short prompt, unrecorded, so that the measured runs
    /// find caches, thread pools and buffers warm.
    Warm,
}

impl Start {
    /// The name in results and reports.
    pub fn name(self) -> &'static str {
        match self {
            Start::Cold => "cold",
            Start::Warm => "warm",
        }
    }
}

/// What to benchmark and how.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The model file (or an ONNX model's directory).
    pub model_path: PathBuf,
    /// The model's name in the results (and the name pocketd serves it under).
    pub model_name: String,
    /// Where draft models (`draft:MODEL`) are looked up; `None` is the default directory.
    pub models_dir: Option<PathBuf>,
    /// The file's sha256 if already known (a verified pull); hashed otherwise.
    pub file_sha256: Option<String>,
    /// The workload's name in the results (its path).
    pub workload: String,
    /// Modes, in the order they run for each prompt.
    pub modes: Vec<RunMode>,
    /// CPU threads: a count for every engine, or [`Threads::Auto`], where our engine follows
    /// the free cores and llama.cpp takes every core allowed, as each does by default.
    pub threads: Threads,
    /// KV cache type for every engine.
    pub kv: KvType,
    /// The device our engine runs on (llama.cpp runs on the GPU when ours does).
    pub device: DeviceChoice,
    /// Layers on RPC peers (none: every layer here). llama.cpp gets the same peers and as many
    /// of its last layers on them as our engine put there.
    pub split: Option<pocket_runtime::rpc::SplitOptions>,
    /// Most tokens per forward pass, for every engine.
    pub n_batch: usize,
    /// Cap on every prompt's `max_tokens`.
    pub max_tokens_cap: Option<usize>,
    /// Whether to measure the cost curve for the report (as the model says it is measured).
    pub cost_curve: bool,
    /// How the measured runs start.
    pub start: Start,
    /// Passes over the workload (at least 1): more rounds, medians less moved by a busy
    /// moment of the machine.
    pub rounds: usize,
    /// Before each run, wait up to this long for other processes to leave the CPU idle
    /// (zero: do not wait).
    pub wait_quiet: Duration,
    /// The memory budget: the models are paid for in it and each run of our engine's modes
    /// (but `naive:` ones) is planned under it; `None`: no budget.
    pub memory_budget: Option<BudgetSpec>,
    /// The context every session may hold; `None`: the longest prompt and its generation,
    /// rounded up. `naive:` modes hold all of it from the start.
    pub n_ctx: Option<usize>,
    /// pocketd's socket, for `socket:` modes and for replaying conversations.
    pub socket: Option<PathBuf>,
    /// The speculation conversations are replayed with (`vanilla`: none, `spec: off`); one of
    /// our engine's modes.
    pub conversation_mode: Mode,
    /// Requests at once (`--concurrent N`): the prompts in groups of this many, each group run
    /// alone request by request and then all at once in every mode ([`crate::concurrency`]);
    /// 1: every prompt alone.
    pub concurrent: usize,
    /// Busy processes started beside the measured runs and stopped after them (`--load N`):
    /// the runs then share the cores, as on a board that runs other programs.
    pub load: usize,
}

impl BenchConfig {
    /// Defaults: modes `llama.cpp` and `vanilla`, every core, f16 KV, the default device, a
    /// cost curve, a cold start.
    pub fn new(model_path: PathBuf, model_name: String) -> Self {
        BenchConfig {
            model_path,
            model_name,
            models_dir: None,
            file_sha256: None,
            workload: String::new(),
            modes: vec![Mode::LlamaCpp.into(), Mode::Vanilla.into()],
            threads: Threads::Auto,
            kv: KvType::F16,
            device: DeviceChoice::default(),
            split: None,
            n_batch: SessionConfig::default().n_batch,
            max_tokens_cap: None,
            cost_curve: true,
            start: Start::Cold,
            rounds: 1,
            wait_quiet: Duration::ZERO,
            memory_budget: None,
            n_ctx: None,
            socket: None,
            conversation_mode: Mode::Vanilla,
            concurrent: 1,
            load: 0,
        }
    }
}

/// How far a benchmark has got, for a progress display.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// The model is open (our engine); the other modes open next.
    Loaded {
        /// The device it runs on.
        device: &'a str,
    },
    /// The cost curve is measured.
    CostCurve,
    /// What the modes need is known (learned now or before), for one weight format.
    Learned {
        /// The weight format.
        weights: &'a str,
        /// Whether the cost curve was measured now.
        measured_curve: bool,
        /// Whether a skip set was found now.
        found_skip_set: bool,
    },
    /// The model was loaded again in pocketd, for a cold start through it.
    DaemonReloaded {
        /// Seconds the load took.
        seconds: f64,
    },
    /// Warm-up is done (or skipped, for a cold start); measured runs start.
    WarmedUp {
        /// Measured runs to come.
        runs: usize,
    },
    /// A measured run finished.
    Run {
        /// 1-based index of the run.
        index: usize,
        /// Runs in all.
        of: usize,
        /// Its record.
        record: &'a RunRecord,
    },
    /// A group of requests run at once finished (`--concurrent`).
    Together {
        /// Its record.
        record: &'a concurrency::GroupRecord,
    },
    /// A turn of a replayed conversation finished.
    Turn {
        /// 1-based index of the turn among all turns of all modes.
        index: usize,
        /// Turns in all.
        of: usize,
        /// Its record.
        record: &'a TurnRecord,
    },
}
