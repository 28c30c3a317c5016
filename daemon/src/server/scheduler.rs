//! The scheduler: both transports hand it a [`Job`] and get a [`Running`] generation back
//! (or an error before anything was generated, so that HTTP can still choose the status).
//!
//! Admission is a semaphore of `parallel + queue` places (past them, 429) and `parallel`
//! turns, handed out by priority, then arrival ([`super::turns`]). Requests with a turn
//! generate at once, sharing each forward pass where the model allows (its engine batches
//! them). A request with a turn gets its model (loaded on demand) and is prepared by the
//! request pipeline ([`pocket_runtime::pipeline`]): rendered, tokenized and planned under what
//! the budget has free; when the plan does not fit, idle models are unloaded (least recently
//! used first) and, while other sessions run, it waits for one to end; when nothing else can
//! free memory, it is refused with the numbers (503).
//!
//! Generation runs on a blocking thread, through the same pipeline. Text goes back through a
//! channel; when the receiver is gone (the client disconnected) or the request is cancelled,
//! the next token ends the generation, and the session's memory is returned as soon as it does.
//!
//! While no request is in flight, the daemon learns what speculation needs about its loaded
//! models (see [`super::learner`]); a request that arrives stops that first, so it never pays
//! for it.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pocket_api::{FinishReason, LogprobsOption, ResponseFormat};
use pocket_core::memory::{Ledger, Plan, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{
    KvType, SamplingConfig, SessionConfig, StopConfig, StopReason, Threads, Tokenizer, ToolCall,
};
use pocket_runtime::grammar::Grammar;
use pocket_runtime::learn::{self, TuneSettings};
use pocket_runtime::pipeline::{self, Prepared, Request, Sink};
use pocket_runtime::prompt_cache::DiskOptions;
use pocket_runtime::tools::{ToolChoice, Tools};
use pocket_runtime::{DEFAULT_MAX_DRAFT, Engine, PromptCache};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::config::{Config, Parallel};
use super::error::ServeError;
use super::learner::Learner;
use super::metrics::Metrics;
use super::registry::{Registry, ServedModel};
use super::turns::{Turn, Turns};

/// What to generate from: chat messages or text (what the pipeline takes).
pub use pocket_runtime::pipeline::Input;

/// A request's settings; `None` takes the daemon's configured default.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Most tokens to generate (capped at the configured `max_tokens`).
    pub max_tokens: Option<u32>,
    /// How tokens are chosen (greedy by default).
    pub sampling: SamplingConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Speculation.
    pub spec: Option<SpecMode>,
    /// The draft model for `draft` (and for `auto` to consider).
    pub draft_model: Option<String>,
    /// KV cache type.
    pub kv: Option<KvType>,
    /// Return the generated token ids with the result.
    pub return_tokens: bool,
    /// Which parked conversations the prompt cache may continue (`prompt_cache_key`, else
    /// `user`): only those parked under the same key.
    pub cache_key: Option<String>,
    /// Use the prompt cache (continue a parked conversation, park this one); `false` is as
    /// if there were none.
    pub cache_prompt: bool,
    /// What the answer must be (a JSON schema, any JSON object, a Lark grammar).
    pub grammar: Option<Grammar>,
    /// The tools the model may call.
    pub tools: Tools,
    /// Return each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// Lower is sooner: the queue's order, and the order rows go into a full shared pass.
    pub priority: i32,
}

/// The priorities a request may ask for (vLLM's `priority`: lower is sooner, 0 by default).
pub const PRIORITIES: std::ops::RangeInclusive<i32> = -100..=100;

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            max_tokens: None,
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            spec: None,
            draft_model: None,
            kv: None,
            return_tokens: false,
            cache_key: None,
            cache_prompt: true,
            grammar: None,
            tools: Tools::default(),
            logprobs: None,
            priority: 0,
        }
    }
}

impl JobOptions {
    /// Settings from an OpenAI request's fields (with pocketd's `spec`, `draft_model`, `kv`,
    /// `grammar`). `chat` tells which endpoint: `logprobs` is a boolean there and a count for
    /// text completions. Fields pocketd does not read are refused, each by name.
    pub fn from_openai(o: &pocket_api::GenerationOptions, chat: bool) -> Result<JobOptions, ServeError> {
        if let Some((field, _)) =
            o.unsupported.iter().find(|(k, _)| !pocket_api::IGNORED_FIELDS.contains(&k.as_str()))
        {
            return Err(unsupported(field));
        }
        if let Some(n) = o.n
            && n != 1
        {
            return Err(ServeError::invalid(
                "n",
                format!("n = {n}: pocketd generates one choice per request"),
            ));
        }
        let mut sampling = SamplingConfig::default();
        if let Some(t) = o.temperature {
            sampling.temperature = t;
        }
        if let Some(p) = o.top_p {
            sampling.top_p = p;
        }
        if let Some(k) = o.top_k {
            sampling.top_k = k as usize;
        }
        if let Some(s) = o.seed {
            sampling.seed = s;
        }
        if let Some(p) = o.presence_penalty {
            sampling.presence_penalty = p;
        }
        if let Some(p) = o.frequency_penalty {
            sampling.frequency_penalty = p;
        }
        if let Some(p) = o.repetition_penalty {
            sampling.repetition_penalty = p;
        }
        if let Some(bias) = &o.logit_bias {
            sampling.logit_bias = bias
                .iter()
                .map(|(t, b)| {
                    t.parse::<u32>().map(|t| (t, *b)).map_err(|_| {
                        ServeError::invalid(
                            "logit_bias",
                            format!("logit_bias keys are token ids; {t:?} is not one"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        let spec = o
            .spec
            .as_deref()
            .map(|s| s.parse::<SpecMode>())
            .transpose()
            .map_err(|e| param_error("spec", &e))?;
        let kv =
            o.kv.as_deref().map(|s| s.parse::<KvType>()).transpose().map_err(|e| param_error("kv", &e))?;
        let grammar = match (&o.response_format, &o.grammar) {
            (Some(f), Some(_)) if *f != ResponseFormat::Text => {
                return Err(ServeError::invalid(
                    "grammar",
                    "send either response_format or grammar, not both",
                ));
            }
            (_, Some(lark)) => Some(Grammar::Lark(lark.clone())),
            (Some(ResponseFormat::JsonObject), None) => Some(Grammar::JsonObject),
            (Some(ResponseFormat::JsonSchema { json_schema }), None) => Some(Grammar::JsonSchema {
                schema: json_schema.schema.clone(),
                strict: json_schema.strict.unwrap_or(false),
            }),
            (Some(ResponseFormat::Text) | None, None) => None,
        };
        let choice = match &o.tool_choice {
            None => ToolChoice::Auto,
            Some(c) => tool_choice(c)?,
        };
        let tools = Tools {
            tools: o.tools.clone().unwrap_or_default(),
            choice,
            parallel: o.parallel_tool_calls.unwrap_or(true),
        };
        let logprobs = match (o.logprobs, chat) {
            (None | Some(LogprobsOption::Enabled(false)), _) => None,
            (Some(LogprobsOption::Enabled(true)), _) => Some(o.top_logprobs.unwrap_or(0)),
            (Some(LogprobsOption::Count(n)), false) => Some(n),
            (Some(LogprobsOption::Count(_)), true) => {
                return Err(ServeError::invalid(
                    "logprobs",
                    "in chat completions logprobs is true or false; top_logprobs says how many alternatives",
                ));
            }
        };
        if let Some(n) = logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            let field = if chat { "top_logprobs" } else { "logprobs" };
            return Err(ServeError::invalid(
                field,
                format!("{field} = {n}: at most {MAX_TOP_LOGPROBS} alternatives"),
            ));
        }
        if o.top_logprobs.is_some() && logprobs.is_none() {
            return Err(ServeError::invalid("top_logprobs", "top_logprobs needs logprobs = true"));
        }
        let priority = o.priority.unwrap_or(0);
        check_priority(priority)?;
        Ok(JobOptions {
            max_tokens: o.max_tokens,
            sampling,
            stop: o.stop.clone().map(pocket_api::Stop::into_vec).unwrap_or_default(),
            spec,
            draft_model: o.draft_model.clone(),
            kv,
            return_tokens: o.return_tokens,
            cache_key: o.prompt_cache_key.clone().or_else(|| o.user.clone()),
            cache_prompt: o.cache_prompt.unwrap_or(true),
            grammar,
            tools,
            logprobs: logprobs.map(|n| n as usize),
            priority,
        })
    }
}

/// A priority in [`PRIORITIES`], or the 400 that says so.
pub fn check_priority(priority: i32) -> Result<(), ServeError> {
    if PRIORITIES.contains(&priority) {
        return Ok(());
    }
    Err(ServeError::invalid(
        "priority",
        format!(
            "priority = {priority}: from {} to {}, lower is served sooner (0 by default)",
            PRIORITIES.start(),
            PRIORITIES.end()
        ),
    ))
}

/// Sessions at once, for `parallel = "auto"`, from a model's cost curve (a pass of `n` rows
/// against one): the count whose shared pass gives the most tokens per second in all while it
/// costs at most twice a pass of one (each request keeps at least half its speed alone), from 2
/// to [`Parallel::MAX_AUTO`].
pub fn parallel_from_curve(curve: &[pocket_core::cost::CostPoint]) -> usize {
    curve
        .iter()
        .filter(|p| (2..=Parallel::MAX_AUTO).contains(&p.n) && p.relative > 0.0 && p.relative <= 2.0)
        .max_by(|a, b| (a.n as f64 / a.relative).total_cmp(&(b.n as f64 / b.relative)))
        .map_or(2, |p| p.n)
}

/// The most alternatives `top_logprobs` (or a completion's `logprobs`) may ask for, as OpenAI.
const MAX_TOP_LOGPROBS: u32 = 20;

/// OpenAI's `tool_choice`: a string, or `{"type": "function", "function": {"name": …}}`.
pub fn tool_choice(v: &serde_json::Value) -> Result<ToolChoice, ServeError> {
    let named = v.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str());
    match (v.as_str(), named) {
        (Some("none"), _) => Ok(ToolChoice::None),
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("required"), _) => Ok(ToolChoice::Required),
        (None, Some(name)) => Ok(ToolChoice::Function(name.to_owned())),
        _ => Err(ServeError::invalid(
            "tool_choice",
            "tool_choice is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
        )),
    }
}

/// The 400 for a request field pocketd does not support, saying what to use instead where
/// something else does the job.
fn unsupported(field: &str) -> ServeError {
    let why = match field {
        "functions" | "function_call" => {
            "the deprecated functions API is not supported; send tools and tool_choice"
        }
        "echo" | "best_of" | "suffix" => "pocketd's completions do not support it",
        "audio" | "modalities" => "pocketd generates text only",
        "prediction" => {
            "predicted outputs are not supported; speculation (spec) drafts from the prompt already"
        }
        _ => "pocketd does not support this field",
    };
    ServeError::invalid(field, format!("{field}: {why}"))
}

fn param_error(param: &str, e: &pocket_core::Error) -> ServeError {
    let text = e.to_string();
    ServeError::invalid(param, text.strip_prefix("invalid argument: ").unwrap_or(&text))
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The model (`None`: the configured default).
    pub model: Option<String>,
    /// What to generate from.
    pub input: Input,
    /// Its settings.
    pub options: JobOptions,
    /// Who asked (for the logs): `"http uid=1000 pid=42"`, `"dbus :1.7"`.
    pub client: String,
}

/// What a request was given, once its session exists.
#[derive(Debug, Clone)]
pub struct Started {
    /// The request's id.
    pub id: String,
    /// The model's name.
    pub model: String,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// What the planner gave it.
    pub plan: Plan,
    /// Seconds it waited for a turn (and for memory).
    pub queued_seconds: f64,
    /// Whether the answer may call tools (a stream then holds back text that may be a call).
    pub tools: bool,
}

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The whole text.
    pub text: String,
    /// The text without its tool calls (the whole text when it calls none).
    pub content: String,
    /// The tools the answer calls.
    pub tool_calls: Vec<ToolCall>,
    /// Each token's log-probability, when asked for.
    pub logprobs: Option<Vec<pocket_api::TokenLogprob>>,
    /// The generated token ids, when the request asked for them.
    pub tokens: Option<Vec<u32>>,
    /// OpenAI's `finish_reason`.
    pub finish_reason: FinishReason,
    /// Usage.
    pub usage: pocket_api::Usage,
    /// Speed and speculation.
    pub timings: pocket_api::Timings,
    /// The most this session held in the budget.
    pub peak_bytes: u64,
    /// Seconds of decoding after the first token.
    pub decode_seconds: f64,
}

/// What a running generation sends.
#[derive(Debug)]
pub enum Piece {
    /// Text made final.
    Text(String),
    /// The end.
    Done(Box<Finished>),
    /// A failure after the start.
    Failed(ServeError),
}

/// A generation in progress. Dropping it cancels the generation.
pub struct Running {
    /// What it was given.
    pub started: Started,
    /// Its text, then [`Piece::Done`] or [`Piece::Failed`].
    pub pieces: mpsc::UnboundedReceiver<Piece>,
    cancel: CancelOnDrop,
}

impl Running {
    /// A handle that cancels this generation, usable after `self` is moved.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.0.clone())
    }

    /// Wait for the end, collecting the text.
    pub async fn collect(mut self) -> Result<Finished, ServeError> {
        while let Some(piece) = self.pieces.recv().await {
            match piece {
                Piece::Text(_) => {}
                Piece::Done(f) => return Ok(*f),
                Piece::Failed(e) => return Err(e),
            }
        }
        Err(ServeError::internal(Some(&self.started.id), "the generation ended without a result"))
    }
}

/// Cancels a generation.
#[derive(Debug, Clone)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Ask the generation to stop at its next token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A canceller of nothing (for tests of what holds cancellers).
    #[cfg(test)]
    pub(crate) fn new() -> Canceller {
        Canceller(Arc::default())
    }
}

struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A session shown in `/v1/status`.
struct SessionEntry {
    model: String,
    generated: Arc<AtomicU64>,
    plan: Plan,
    ledger: Ledger,
    cancel: Arc<AtomicBool>,
}

/// The scheduler, shared by the transports.
pub struct Scheduler {
    config: Config,
    /// Models available and loaded.
    pub registry: Registry,
    ledger: Ledger,
    _process: Option<Reservation>,
    places: Arc<Semaphore>,
    turns: Arc<Turns>,
    queued: AtomicUsize,
    /// Requests with a turn waiting for other requests to give memory back.
    waiting_for_memory: AtomicUsize,
    sessions: Mutex<BTreeMap<String, SessionEntry>>,
    next_id: AtomicU64,
    session_ended: Notify,
    stopping: AtomicBool,
    stopping_notify: Notify,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    started: Instant,
    threads: Threads,
    /// Requests between their arrival and their end: while any is, nothing is learned.
    pub(super) in_flight: AtomicUsize,
    /// When the last request ended (or the daemon started).
    pub(super) last_activity: Mutex<Instant>,
    /// Woken when a request ends.
    pub(super) request_ended: Notify,
    /// What learns about the loaded models while the daemon is idle.
    pub(super) learner: Learner,
    prompt_cache: Option<Arc<PromptCache>>,
}

/// How long a request whose plan does not fit waits for running sessions to give memory
/// back before it is refused.
const MEMORY_WAIT: Duration = Duration::from_secs(30);

/// While it waits, how often it looks again.
const MEMORY_RECHECK: Duration = Duration::from_millis(200);

impl Scheduler {
    /// A scheduler for `config`: its budget's ledger is made now, with this process's own
    /// memory reserved first.
    pub fn new(config: Config) -> anyhow::Result<Arc<Scheduler>> {
        let (ledger, process) = pocket_runtime::process::budget_ledger(Some(config.memory_budget))?;
        let prompt_cache = if config.prompt_cache {
            let disk = match &config.prompt_cache_dir {
                Some(dir) => {
                    Some(DiskOptions { dir: dir.clone(), max_bytes: config.prompt_cache_disk_bytes()? })
                }
                None => None,
            };
            Some(Arc::new(PromptCache::new(&ledger, disk)))
        } else {
            None
        };
        let registry = Registry::new(
            config.models_dir.clone(),
            ledger.clone(),
            Duration::from_secs(config.keep_alive_seconds),
            prompt_cache.clone(),
        );
        let threads = config.threads;
        Ok(Arc::new(Scheduler {
            places: Arc::new(Semaphore::new(config.parallel.most() + config.queue)),
            turns: Turns::new(match config.parallel {
                Parallel::Auto => Parallel::UNMEASURED,
                Parallel::Fixed(n) => n,
            }),
            config,
            registry,
            ledger,
            _process: process,
            queued: AtomicUsize::new(0),
            waiting_for_memory: AtomicUsize::new(0),
            sessions: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            session_ended: Notify::new(),
            stopping: AtomicBool::new(false),
            stopping_notify: Notify::new(),
            metrics: Metrics::default(),
            started: Instant::now(),
            threads,
            in_flight: AtomicUsize::new(0),
            last_activity: Mutex::new(Instant::now()),
            request_ended: Notify::new(),
            learner: Learner::default(),
            prompt_cache,
        }))
    }

    /// Where finished conversations are parked (none when `prompt_cache` is off).
    pub fn prompt_cache(&self) -> Option<&PromptCache> {
        self.prompt_cache.as_deref()
    }

    /// Write parked conversations to the prompt cache directory (at shutdown).
    pub fn flush_prompt_cache(&self) {
        if let Some(cache) = &self.prompt_cache {
            cache.flush();
        }
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// CPU threads of each pass: a count, or `auto`.
    pub fn threads(&self) -> Threads {
        self.threads
    }

    /// The CPU threads passes run on now, and what the count follows.
    pub fn cpu(&self) -> pocket_api::CpuStatus {
        let now = pocket_core::cpu::governor().status();
        let threads = match self.threads {
            Threads::Auto => now.threads,
            Threads::Fixed(n) => n,
        };
        pocket_api::CpuStatus {
            threads_setting: self.threads.to_string(),
            threads,
            max_threads: self.threads.max(),
            allowed_cores: now.allowed,
            others_load: now.others_load,
        }
    }

    /// The daemon's budget.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// With `parallel = "auto"`: make the turns what the default model's measured cost curve
    /// says ([`parallel_from_curve`]), when it is loaded; [`Parallel::UNMEASURED`] until its
    /// curve is measured, and 2 where its sessions cannot share passes (they then split the
    /// cores, and two at once only lets a short request start beside a long one).
    fn follow_parallel(&self) {
        if self.config.parallel != Parallel::Auto {
            return;
        }
        let loaded = self.registry.loaded();
        let Some((m, _)) = loaded.iter().find(|(m, _)| m.name == self.config.default_model) else { return };
        let n = match m.model.model().shared_passes() {
            None => 2,
            Some(_) => m
                .model
                .knowledge()
                .cost_curve(self.threads.max(), self.config.kv)
                .map_or(Parallel::UNMEASURED, |c| parallel_from_curve(&c)),
        };
        if n != self.turns.capacity() {
            tracing::info!(parallel = n, model = %m.name, "requests that generate at once");
            self.turns.set_capacity(n);
        }
    }

    /// Requests that may generate at once now.
    pub fn parallel(&self) -> usize {
        self.turns.capacity()
    }

    /// Requests generating now.
    pub fn active(&self) -> usize {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Requests waiting for a turn.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Take no new requests from now on.
    pub fn stop_accepting(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stopping_notify.notify_waiters();
        self.request_ended.notify_waiters();
    }

    /// Whether [`Scheduler::stop_accepting`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Cancel every running generation.
    pub fn cancel_all(&self) {
        for s in self.sessions.lock().unwrap_or_else(|e| e.into_inner()).values() {
            s.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Wait until no session runs, or `deadline` passes; returns whether none runs.
    pub async fn drained(&self, deadline: Instant) -> bool {
        loop {
            let ended = self.session_ended.notified();
            if self.active() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline.into(), ended).await.is_err() {
                return self.active() == 0;
            }
        }
    }

    /// Memory, models and sessions now.
    pub fn status(&self) -> pocket_api::Status {
        let keep_alive = Some(self.registry.keep_alive().as_secs_f64());
        let loaded = self
            .registry
            .loaded()
            .into_iter()
            .map(|(m, idle)| pocket_api::LoadedModel {
                name: m.name.clone(),
                engine: Some(m.model.engine().name().to_owned()),
                bytes: m.bytes(),
                sessions: Registry::users(&m),
                idle_seconds: idle.as_secs_f64(),
                keep_alive_seconds: keep_alive,
                tuned: Some(!learn::needs_tuning(
                    &m.model,
                    &TuneSettings::new(self.threads.max(), self.config.kv),
                )),
                shared_passes: m.model.model().shared_passes(),
            })
            .collect();
        let sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, s)| pocket_api::SessionStatus {
                id: id.clone(),
                model: s.model.clone(),
                generated_tokens: s.generated.load(Ordering::Relaxed),
                plan: serde_json::json!({
                    "plan": s.plan,
                    "used_bytes": s.ledger.used(),
                    "peak_bytes": s.ledger.peak(),
                }),
            })
            .collect();
        let loaded_models = self.registry.loaded();
        let model_name = |fingerprint: &str| {
            loaded_models
                .iter()
                .find(|(m, _)| {
                    m.model.model().cache_key().is_some_and(|k| k.fingerprint.starts_with(fingerprint))
                })
                .map_or_else(|| fingerprint.to_owned(), |(m, _)| m.name.clone())
        };
        let parked = self
            .prompt_cache()
            .map(|c| c.parked())
            .unwrap_or_default()
            .into_iter()
            .map(|p| pocket_api::ParkedPrefix {
                model: model_name(&p.model),
                tokens: p.tokens,
                bytes: p.bytes,
                kv: p.kv.name().to_owned(),
                key: p.hint,
                idle_seconds: p.idle_seconds,
            })
            .collect();
        pocket_api::Status {
            parked,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            memory: self.memory(),
            loaded,
            sessions,
            queued: self.queued(),
            queue_capacity: self.config.queue,
            parallel: Some(self.parallel()),
            threads: Some(self.cpu().threads),
            cpu: Some(self.cpu()),
            learning: self.learner.doing(),
            connections: None,
        }
    }

    /// The budget and its use.
    pub fn memory(&self) -> pocket_api::MemoryStatus {
        pocket_api::MemoryStatus {
            budget_bytes: self.ledger.budget(),
            used_bytes: self.ledger.used(),
            peak_bytes: self.ledger.peak(),
            resident_bytes: pocket_runtime::process::MemStats::read().rss_bytes,
        }
    }

    /// Start generating `job`. Returns once its session exists (or with the error that
    /// stopped it before then); text then arrives through [`Running::pieces`].
    pub async fn submit(self: &Arc<Self>, job: Job) -> Result<Running, ServeError> {
        let id = request_id(self.next_id.fetch_add(1, Ordering::Relaxed));
        let arrival = InFlight::new(self.clone());
        let result = self.submit_inner(job, id, arrival).await;
        if let Err(e) = &result {
            self.metrics.failed(e);
        }
        result
    }

    async fn submit_inner(
        self: &Arc<Self>,
        job: Job,
        id: String,
        arrival: InFlight,
    ) -> Result<Running, ServeError> {
        if self.is_stopping() {
            return Err(ServeError::ShuttingDown);
        }
        job.options
            .sampling
            .validate()
            .map_err(|e| param_error(pipeline::sampling_field(&e.to_string()), &e))?;
        StopConfig { max_tokens: 1, stop: job.options.stop.clone() }
            .validate()
            .map_err(|e| param_error("stop", &e))?;
        let model_name = job.model.clone().unwrap_or_else(|| self.config.default_model.clone());
        // Unknown names, and modes the model's engine does not offer, are refused before queueing.
        let found = self.registry.find(&model_name)?;
        let spec = spec_for(job.options.spec, self.config.spec, Engine::for_path(&found.path))?;
        if spec == SpecMode::Draft && job.options.draft_model.is_none() {
            return Err(ServeError::invalid("draft_model", "spec = draft needs a draft_model"));
        }
        let max_tokens =
            job.options.max_tokens.unwrap_or(self.config.max_tokens).min(self.config.max_tokens) as usize;
        if max_tokens == 0 {
            return Err(ServeError::invalid("max_tokens", "max_tokens must be at least 1"));
        }
        let kv = job.options.kv.unwrap_or(self.config.kv);
        if spec != SpecMode::Off {
            self.learner.want(&found.name, kv);
        }

        let place = self
            .places
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServeError::QueueFull(self.config.parallel.most() + self.config.queue))?;
        let queued_at = Instant::now();
        self.follow_parallel();
        let turn = {
            let _waiting = Counted::new(&self.queued);
            let stopping = self.stopping_notify.notified();
            tokio::select! {
                t = self.turns.acquire(job.options.priority) => t,
                _ = stopping => return Err(ServeError::ShuttingDown),
            }
        };
        // Learning gives the machine back before this request loads or plans anything.
        self.learner.stopped().await;
        let model = self.registry.load(found).await?;
        let draft = match (&job.options.draft_model, spec) {
            (Some(d), SpecMode::Draft | SpecMode::Auto) => Some(self.registry.get(d).await?),
            _ => None,
        };
        tracing::info!(id = %id, client = %job.client, model = %model.name, %spec, "request");

        let request = Request {
            input: job.input.clone(),
            sampling: job.options.sampling.clone(),
            stop: StopConfig { max_tokens, stop: job.options.stop.clone() },
            spec,
            session: SessionConfig {
                kv,
                n_ctx: self.config.ctx_size,
                threads: self.threads,
                priority: job.options.priority,
                ..SessionConfig::default()
            },
            max_draft: DEFAULT_MAX_DRAFT,
            planned: true,
            prompt_cache: job.options.cache_prompt,
            cache_hint: job.options.cache_key.clone(),
            grammar: job.options.grammar.clone(),
            logprobs: job.options.logprobs,
            tools: job.options.tools.clone(),
        };
        // Tokenize and plan; when the budget is full, make room or wait for it.
        let deadline = Instant::now() + MEMORY_WAIT;
        let prepared = loop {
            let (m, d, r, me) = (model.clone(), draft.clone(), request.clone(), self.clone());
            let result = tokio::task::spawn_blocking(move || {
                pipeline::prepare(&m.model, d.as_ref().map(|d| &d.model), &r, &me.ledger)
            })
            .await
            .map_err(|e| ServeError::internal(Some(&id), format!("planning panicked: {e}")))?
            .map_err(|e| ServeError::from_runtime(e, Some(&id)));
            match result {
                Ok(p) => break p,
                Err(e) if e.is_over_budget() => {
                    let keep: Vec<&str> =
                        [Some(model.name.as_str()), draft.as_ref().map(|d| d.name.as_str())]
                            .into_iter()
                            .flatten()
                            .collect();
                    if self.registry.evict_parked() || self.registry.evict_idle(&keep) {
                        continue;
                    }
                    // Memory comes back when another request with a turn ends — unless every
                    // other one is itself waiting for memory.
                    let ended = self.session_ended.notified();
                    let waiting = self.waiting_for_memory.load(Ordering::SeqCst);
                    let others = self.turns.held().saturating_sub(1 + waiting);
                    if others == 0 || Instant::now() >= deadline {
                        return Err(e);
                    }
                    let _waiting = Counted::new(&self.waiting_for_memory);
                    // Requests that end before they start do not say so: look again soon.
                    let _ = tokio::time::timeout(
                        MEMORY_RECHECK.min(deadline.saturating_duration_since(Instant::now())),
                        ended,
                    )
                    .await;
                }
                Err(e) => return Err(e),
            }
        };

        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel();
        let (started_tx, started_rx) = oneshot::channel();
        let ctx = GenerationContext {
            id: id.clone(),
            model,
            draft,
            prepared,
            return_tokens: job.options.return_tokens,
            cancel: cancel.clone(),
            queued_seconds: queued_at.elapsed().as_secs_f64(),
            permits: (place, turn),
            _arrival: arrival,
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.generate(ctx, started_tx, tx));
        match started_rx.await {
            Ok(Ok(started)) => Ok(Running { started, pieces: rx, cancel: CancelOnDrop(cancel) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ServeError::internal(Some(&id), "the generation thread ended before starting")),
        }
    }

    /// Run one generation (blocking thread).
    fn generate(
        self: Arc<Self>,
        ctx: GenerationContext,
        started: oneshot::Sender<Result<Started, ServeError>>,
        tx: mpsc::UnboundedSender<Piece>,
    ) {
        let GenerationContext {
            id,
            model,
            draft,
            prepared,
            return_tokens,
            cancel,
            queued_seconds,
            permits,
            _arrival,
        } = ctx;
        let ledger = self.ledger.sub();
        let generated = Arc::new(AtomicU64::new(0));
        let mut sink = Forward {
            scheduler: &self,
            id: &id,
            model: &model,
            prepared: &prepared,
            ledger: &ledger,
            cancel: &cancel,
            generated: &generated,
            tx: &tx,
            queued_seconds,
            started: Some(started),
        };
        let result =
            pipeline::run(&model.model, draft.as_ref().map(|d| &d.model), &prepared, &ledger, &mut sink);
        let not_started = sink.started.take();
        // The session and drafter are dropped by now: their memory is back in the budget.
        let peak_bytes = ledger.peak();
        lock(&self.sessions).remove(&id);
        self.registry.release(&model.name);
        if let Some(d) = &draft {
            self.registry.release(&d.name);
        }
        // Token texts (for log-probabilities) need the tokenizer, before the model is released.
        let result = result.map(|outcome| finished(&outcome, return_tokens, model.model.model().tokenizer()));
        drop((model, draft, permits));
        match result {
            Ok(mut finished) => {
                finished.peak_bytes = peak_bytes;
                finished.timings.peak_bytes = peak_bytes;
                finished.timings.queued_ms = queued_seconds * 1e3;
                tracing::info!(
                    id = %id,
                    prompt_tokens = finished.usage.prompt_tokens,
                    generated = finished.usage.completion_tokens,
                    decode_tok_per_s = format!("{:.1}", finished.timings.decode_tok_per_s),
                    drafter = finished.timings.drafter.as_deref().unwrap_or("none"),
                    finish = finished.finish_reason.as_str(),
                    peak_bytes,
                    "done"
                );
                self.metrics.finished(&finished);
                let _ = tx.send(Piece::Done(Box::new(finished)));
            }
            Err(e) => {
                let e = ServeError::from_runtime(e, Some(&id));
                match not_started {
                    // Before the start, `submit` returns the error (and counts it).
                    Some(s) => {
                        let _ = s.send(Err(e));
                    }
                    None => {
                        tracing::warn!(id = %id, "failed: {e}");
                        self.metrics.failed(&e);
                        let _ = tx.send(Piece::Failed(e));
                    }
                }
            }
        }
        self.session_ended.notify_waiters();
        self.registry.changed();
    }
}

/// A request between its arrival and its end; while any is, the learner stays away.
struct InFlight(Arc<Scheduler>);

impl InFlight {
    fn new(scheduler: Arc<Scheduler>) -> Self {
        scheduler.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(scheduler)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *lock(&self.0.last_activity) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.request_ended.notify_waiters();
        self.0.registry.changed();
    }
}

/// Where a running generation reports: the session table once it starts, the request's
/// channel for every token.
struct Forward<'a> {
    scheduler: &'a Scheduler,
    id: &'a str,
    model: &'a ServedModel,
    prepared: &'a Prepared,
    ledger: &'a Ledger,
    cancel: &'a Arc<AtomicBool>,
    generated: &'a Arc<AtomicU64>,
    tx: &'a mpsc::UnboundedSender<Piece>,
    queued_seconds: f64,
    started: Option<oneshot::Sender<Result<Started, ServeError>>>,
}

impl Sink for Forward<'_> {
    fn started(&mut self) {
        lock(&self.scheduler.sessions).insert(
            self.id.to_owned(),
            SessionEntry {
                model: self.model.name.clone(),
                generated: self.generated.clone(),
                plan: self.prepared.plan.clone().unwrap_or_else(|| unplanned(self.prepared)),
                ledger: self.ledger.clone(),
                cancel: self.cancel.clone(),
            },
        );
        self.scheduler.registry.changed();
        if let Some(s) = self.started.take() {
            let _ = s.send(Ok(Started {
                id: self.id.to_owned(),
                model: self.model.name.clone(),
                prompt_tokens: self.prepared.tokens.len(),
                plan: self.prepared.plan.clone().unwrap_or_else(|| unplanned(self.prepared)),
                queued_seconds: self.queued_seconds,
                tools: !self.prepared.tool_names.is_empty(),
            }));
        }
    }

    /// Pass one generation event on: count the token, send the text; stop when the client is
    /// gone or the request is cancelled.
    fn event(&mut self, event: pocket_core::Event<'_>) -> ControlFlow<()> {
        if event.token.is_some() {
            self.generated.fetch_add(1, Ordering::Relaxed);
        }
        if !event.text.is_empty() && self.tx.send(Piece::Text(event.text.to_owned())).is_err() {
            return ControlFlow::Break(()); // the client is gone
        }
        if self.cancel.load(Ordering::Relaxed) || self.tx.is_closed() {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }
}

/// The plan of a request that was not planned (the daemon plans every one; for the type).
fn unplanned(p: &Prepared) -> Plan {
    Plan {
        kv: p.config.kv,
        n_ctx: p.config.n_ctx,
        n_batch: p.config.n_batch,
        max_rows: p.config.max_rows,
        spec: p.spec,
        draft_model: p.draft_model,
        max_draft: p.max_draft,
        bytes: 0,
        available: 0,
        degraded: Vec::new(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain inserts, removals and reads: a panic elsewhere cannot leave them half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The speculation mode a request runs in: the one it asks for, refused where the model's
/// engine offers no such drafter; else the daemon's default, or plain decoding where the
/// default does not apply to this kind of model.
fn spec_for(asked: Option<SpecMode>, default: SpecMode, engine: Engine) -> Result<SpecMode, ServeError> {
    let offered = |mode: SpecMode| engine.drafters().contains(&mode);
    match asked {
        Some(mode) if offered(mode) => Ok(mode),
        Some(mode) => {
            Err(ServeError::invalid("spec", pocket_runtime::drafters::not_offered_by(mode, engine)))
        }
        None if offered(default) => Ok(default),
        None => Ok(SpecMode::Off),
    }
}

/// What a finished generation reports.
fn finished(outcome: &pocket_runtime::Outcome, return_tokens: bool, tokenizer: &dyn Tokenizer) -> Finished {
    let generation = &outcome.generation;
    let finish_reason = match generation.stop {
        StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
        StopReason::Cancelled => FinishReason::Cancelled,
        StopReason::Eos | StopReason::StopString if !outcome.tool_calls.is_empty() => FinishReason::ToolCalls,
        StopReason::Eos | StopReason::StopString => FinishReason::Stop,
    };
    let completion = generation.tokens.len() as u32;
    let wire = |token: u32, logprob: f32| {
        let bytes = tokenizer.piece(token);
        // OpenAI never sends -inf; JSON cannot carry it.
        let logprob = if logprob.is_finite() { logprob } else { -9999.0 };
        (String::from_utf8_lossy(&bytes).into_owned(), logprob, bytes)
    };
    let logprobs = (!generation.logprobs.is_empty()).then(|| {
        generation
            .logprobs
            .iter()
            .map(|lp| {
                let (token, logprob, bytes) = wire(lp.token, lp.logprob);
                let top_logprobs = lp
                    .top
                    .iter()
                    .map(|&(t, l)| {
                        let (token, logprob, bytes) = wire(t, l);
                        pocket_api::TopLogprob { token, logprob, bytes }
                    })
                    .collect();
                pocket_api::TokenLogprob { token, logprob, bytes, top_logprobs }
            })
            .collect()
    });
    Finished {
        text: generation.text.clone(),
        content: outcome.content.clone(),
        tool_calls: outcome.tool_calls.clone(),
        logprobs,
        tokens: return_tokens.then(|| generation.tokens.clone()),
        finish_reason,
        usage: pocket_api::Usage {
            prompt_tokens: generation.prompt_tokens as u32,
            completion_tokens: completion,
            total_tokens: generation.prompt_tokens as u32 + completion,
            prompt_tokens_details: Some(pocket_api::PromptTokensDetails {
                cached_tokens: generation.cached_tokens as u32,
            }),
        },
        timings: pocket_api::Timings {
            prefill_ms: generation.prefill_seconds * 1e3,
            prefill_tok_per_s: generation.prefill_tok_per_s(),
            cached_tokens: generation.cached_tokens as u64,
            decode_tok_per_s: generation.decode_tok_per_s(),
            drafted: generation.spec.drafted as u64,
            accepted: generation.spec.accepted as u64,
            drafter: outcome.drafter.clone(),
            queued_ms: 0.0,
            peak_bytes: 0,
            grammar_ms: outcome.grammar_seconds * 1e3,
            constraint_ms: generation.spec.constraint_seconds * 1e3,
            forced: generation.spec.forced as u64,
            forced_accepted: generation.spec.forced_accepted as u64,
            threads: generation.threads.mean(),
        },
        peak_bytes: 0,
        decode_seconds: generation.decode_seconds,
    }
}

struct GenerationContext {
    id: String,
    model: Arc<ServedModel>,
    draft: Option<Arc<ServedModel>>,
    prepared: Prepared,
    return_tokens: bool,
    cancel: Arc<AtomicBool>,
    queued_seconds: f64,
    /// Held until the generation ends.
    permits: (OwnedSemaphorePermit, Turn),
    /// Held until the generation ends: the learner stays away meanwhile.
    _arrival: InFlight,
}

/// The id a request is known by (`pocketd-7`).
fn request_id(id: u64) -> String {
    format!("pocketd-{id}")
}

/// Counts itself in a counter while alive.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(c: &'a AtomicUsize) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Counted(c)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use pocket_core::cost::CostPoint;

    use super::*;

    fn curve(points: &[(usize, f64)]) -> Vec<CostPoint> {
        points.iter().map(|&(n, relative)| CostPoint { n, seconds: relative / 100.0, relative }).collect()
    }

    #[test]
    fn parallel_follows_the_cost_curve() {
        // Qwen2.5-Coder-0.5B on a 2-core CPU: 6 rows cost 1.75 passes of one, 7 more than two.
        let qwen =
            curve(&[(1, 1.0), (2, 1.12), (3, 1.38), (4, 1.36), (5, 1.6), (6, 1.75), (7, 2.01), (8, 2.42)]);
        assert_eq!(parallel_from_curve(&qwen), 6);
        // A GPU's flat curve: as many as a shared pass carries.
        let flat = curve(&[(1, 1.0), (2, 1.01), (4, 1.03), (8, 1.1), (16, 1.4)]);
        assert_eq!(parallel_from_curve(&flat), Parallel::MAX_AUTO);
        // Nothing to share: two, so that a short request can start beside a long one.
        let steep = curve(&[(1, 1.0), (2, 2.0), (4, 4.0)]);
        assert_eq!(parallel_from_curve(&steep), 2);
        assert_eq!(parallel_from_curve(&[]), 2);
    }

    #[test]
    fn priorities_are_checked() {
        assert!(check_priority(0).is_ok() && check_priority(-100).is_ok() && check_priority(100).is_ok());
        let e = check_priority(101).unwrap_err().to_string();
        assert!(e.contains("priority = 101") && e.contains("lower is served sooner"), "{e}");
    }
}
