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
//! Generation runs on a blocking thread, through the same pipeline ([`super::worker`]). Text
//! goes back through a channel; when the receiver is gone (the client disconnected) or the
//! request is cancelled, the next token ends the generation, and the session's memory is
//! returned as soon as it does. What a job is and what comes back is in [`super::job`]; how an
//! OpenAI request becomes one, in [`super::openai`].
//!
//! While no request is in flight, the daemon learns what speculation needs about its loaded
//! models (see [`super::learner`]); a request that arrives stops that first, so it never pays
//! for it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{KvType, SessionConfig, StopConfig, Threads};
use pocket_runtime::learn::TuneSettings;
use pocket_runtime::pipeline::{self, Prepared, Request};
use pocket_runtime::prompt_cache::DiskOptions;
use pocket_runtime::{DEFAULT_MAX_DRAFT, Engine, PromptCache};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};

use super::config::{Config, Parallel};
use super::error::{ServeError, param_error};
use super::job::{Job, Running};
use super::learner::{Activity, IdleLearning, Learner};
use super::metrics::Metrics;
use super::registry::{Available, Registry, ServedModel};
use super::turns::Turns;
use super::worker::{GenerationContext, Worker, lock, session_statuses};

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

/// The scheduler, shared by the transports.
pub struct Scheduler {
    config: Config,
    /// Models available and loaded.
    pub registry: Arc<Registry>,
    ledger: Ledger,
    _process: Option<Reservation>,
    places: Arc<Semaphore>,
    turns: Arc<Turns>,
    queued: AtomicUsize,
    /// Requests with a turn waiting for other requests to give memory back.
    waiting_for_memory: AtomicUsize,
    next_id: AtomicU64,
    stopping_notify: Notify,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// What runs each generation; it holds the session table and the notice of a session's end.
    worker: Arc<Worker>,
    started: Instant,
    threads: Threads,
    /// Requests in flight and stopping, which learning while idle gives way to.
    activity: Arc<Activity>,
    /// What learns about the loaded models while the daemon is idle.
    learner: Arc<Learner>,
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
        let worker = Arc::new(Worker {
            ledger: ledger.clone(),
            sessions: Arc::new(Mutex::new(BTreeMap::new())),
            registry: Arc::new(registry),
            metrics: Arc::new(Metrics::default()),
            session_ended: Arc::new(Notify::new()),
        });
        Ok(Arc::new(Scheduler {
            places: Arc::new(Semaphore::new(config.parallel.most() + config.queue)),
            turns: Turns::new(match config.parallel {
                Parallel::Auto => Parallel::UNMEASURED,
                Parallel::Fixed(n) => n,
            }),
            config,
            registry: worker.registry.clone(),
            ledger,
            _process: process,
            queued: AtomicUsize::new(0),
            waiting_for_memory: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            stopping_notify: Notify::new(),
            metrics: worker.metrics.clone(),
            worker,
            started: Instant::now(),
            threads,
            activity: Arc::default(),
            learner: Arc::default(),
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

    /// Learn what speculation needs about the loaded models while no request is in flight,
    /// until the daemon stops (returns at once when `tune_when_idle` is off): see
    /// [`IdleLearning::run`].
    pub async fn learn_while_idle(self: Arc<Self>) {
        if !self.config.tune_when_idle {
            return;
        }
        let learning = IdleLearning {
            learner: self.learner.clone(),
            activity: self.activity.clone(),
            registry: self.registry.clone(),
            ledger: self.ledger.clone(),
            spec: self.config.spec,
            kv: self.config.kv,
            threads: self.threads.max(),
        };
        learning.run().await;
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
        lock(&self.worker.sessions).len()
    }

    /// Requests waiting for a turn.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Take no new requests from now on.
    pub fn stop_accepting(&self) {
        self.activity.stopping.store(true, Ordering::SeqCst);
        self.stopping_notify.notify_waiters();
        self.activity.ended.notify_waiters();
    }

    /// Whether [`Scheduler::stop_accepting`] was called.
    pub fn is_stopping(&self) -> bool {
        self.activity.is_stopping()
    }

    /// Cancel every running generation.
    pub fn cancel_all(&self) {
        for s in lock(&self.worker.sessions).values() {
            s.cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Wait until no session runs, or `deadline` passes; returns whether none runs.
    pub async fn drained(&self, deadline: Instant) -> bool {
        loop {
            let ended = self.worker.session_ended.notified();
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
        let settings = TuneSettings::new(self.threads.max(), self.config.kv);
        pocket_api::Status {
            parked: self.prompt_cache().map(|c| self.registry.parked_status(c)).unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            memory: self.memory(),
            loaded: self.registry.loaded_status(&settings),
            sessions: session_statuses(&self.worker.sessions),
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
        let Admitted { found, spec, max_tokens, kv } = self.check(&job)?;
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
        let request = self.request(&job, spec, max_tokens, kv);
        let prepared = self.prepare(&model, draft.as_ref(), &request, &id).await?;

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
            arrival,
        };
        let worker = self.worker.clone();
        tokio::task::spawn_blocking(move || worker.generate(ctx, started_tx, tx));
        match started_rx.await {
            Ok(Ok(started)) => Ok(Running::new(started, rx, cancel)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ServeError::internal(Some(&id), "the generation thread ended before starting")),
        }
    }

    /// What is refused before a request queues: settings out of range, an unknown model, a
    /// speculation mode its engine does not offer.
    fn check(&self, job: &Job) -> Result<Admitted, ServeError> {
        job.options
            .sampling
            .validate()
            .map_err(|e| param_error(pipeline::sampling_field(&e.to_string()), &e))?;
        StopConfig { max_tokens: 1, stop: job.options.stop.clone() }
            .validate()
            .map_err(|e| param_error("stop", &e))?;
        let model_name = job.model.clone().unwrap_or_else(|| self.config.default_model.clone());
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
        Ok(Admitted { found, spec, max_tokens, kv })
    }

    /// The pipeline's request for `job`, with the daemon's settings where it has none.
    fn request(&self, job: &Job, spec: SpecMode, max_tokens: usize, kv: KvType) -> Request {
        Request {
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
        }
    }

    /// Tokenize and plan `request`; when the budget is full, make room (parked
    /// conversations, then idle models) or wait for a running request to give memory back,
    /// for at most [`MEMORY_WAIT`].
    async fn prepare(
        self: &Arc<Self>,
        model: &Arc<ServedModel>,
        draft: Option<&Arc<ServedModel>>,
        request: &Request,
        id: &str,
    ) -> Result<Prepared, ServeError> {
        let deadline = Instant::now() + MEMORY_WAIT;
        loop {
            let (m, d, r, me) = (model.clone(), draft.cloned(), request.clone(), self.clone());
            let result = tokio::task::spawn_blocking(move || {
                pipeline::prepare(&m.model, d.as_ref().map(|d| &d.model), &r, &me.ledger)
            })
            .await
            .map_err(|e| ServeError::internal(Some(id), format!("planning panicked: {e}")))?
            .map_err(|e| ServeError::from_runtime(e, Some(id)));
            let e = match result {
                Err(e) if e.is_over_budget() => e,
                other => return other,
            };
            let keep: Vec<&str> =
                [Some(model.name.as_str()), draft.map(|d| d.name.as_str())].into_iter().flatten().collect();
            if self.registry.evict_parked() || self.registry.evict_idle(&keep) {
                continue;
            }
            // Memory comes back when another request with a turn ends — unless every other
            // one is itself waiting for memory.
            let ended = self.worker.session_ended.notified();
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
    }
}

/// What admission settled for a request before it queues.
struct Admitted {
    found: Available,
    spec: SpecMode,
    max_tokens: usize,
    kv: KvType,
}

/// A request between its arrival and its end; while any is, the learner stays away.
struct InFlight(Arc<Scheduler>);

impl InFlight {
    fn new(scheduler: Arc<Scheduler>) -> Self {
        scheduler.activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(scheduler)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0.activity;
        *lock(&activity.last) = Instant::now();
        activity.in_flight.fetch_sub(1, Ordering::SeqCst);
        activity.ended.notify_waiters();
        self.0.registry.changed();
    }
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
}
