//! The scheduler: both transports hand it a [`Job`] and get a [`Running`] generation back
//! (or an error before anything was generated, so that HTTP can still choose the status).
//!
//! Admission ([`super::admission`]) checks a job's settings, gives it a place and a turn
//! (by priority, then arrival) and plans it under the budget, waiting for memory while other
//! sessions run; requests with a turn generate at once, sharing each forward pass where the
//! model allows (its engine batches them).
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pocket_core::Threads;
use pocket_core::memory::format_size;
use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::SpecMode;
use pocket_runtime::histories::Limits as HistoryLimits;
use pocket_runtime::learn::TuneSettings;
use pocket_runtime::prompt_cache::DiskOptions;
use pocket_runtime::{DeviceChoice, DeviceMemory, Histories, PromptCache};
use tokio::sync::{Notify, mpsc, oneshot};

use super::admission::{self, Admission, parallel_from_curve};
use super::config::{Config, Parallel};
use super::error::ServeError;
use super::job::{Job, Running};
use super::learner::{Activity, IdleLearning, Learner};
use super::metrics::Metrics;
use super::registry::{Registry, ServedModel};
use super::stored::ResponseStore;
use super::worker::{GenerationContext, Worker, lock, session_statuses};

/// The scheduler, shared by the transports.
pub struct Scheduler {
    config: Config,
    /// Models available and loaded.
    pub registry: Arc<Registry>,
    ledger: Ledger,
    _process: Option<Reservation>,
    /// The device models run on, and its memory as found at start (none: the CPU).
    device: DeviceChoice,
    device_memory: Option<DeviceMemory>,
    /// Places, turns and the wait for memory.
    admission: Admission,
    next_id: AtomicU64,
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
    histories: Arc<Histories>,
    /// The Responses API's stored responses.
    pub responses: ResponseStore,
}

impl Scheduler {
    /// A scheduler for `config`: its budget's ledger is made now, with this process's own
    /// memory reserved first.
    pub fn new(config: Config) -> anyhow::Result<Arc<Scheduler>> {
        let (ledger, process) = pocket_runtime::process::budget_ledger(Some(config.memory_budget))?;
        let device: DeviceChoice = config.device.parse().unwrap_or_default();
        let (ledger, device_memory) =
            pocket_runtime::process::with_device_pool(ledger, &device, config.device_memory_budget)?;
        if let Some(m) = &device_memory {
            match ledger.device_pool() {
                Some((name, budget)) => tracing::info!(
                    "{name}'s memory is budgeted apart: {} of {} ({} free)",
                    format_size(budget),
                    format_size(m.total_bytes),
                    format_size(m.free_bytes)
                ),
                None => tracing::info!("{} computes in host memory: one budget covers both", m.name),
            }
        }
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
        // Earlier answers are kept on disk with the prompt cache's files, where those are.
        let mut histories = Histories::new(&ledger, HistoryLimits::default());
        if let Some(dir) = &config.prompt_cache_dir {
            histories = histories.with_dir(dir.join("histories"));
        }
        let histories = Arc::new(histories);
        let registry = Registry::new(
            config.models_dir.clone(),
            ledger.clone(),
            device.clone(),
            Duration::from_secs(config.keep_alive_seconds),
            prompt_cache.clone(),
        )
        .with_aliases(config.model_aliases.clone())
        .with_rpc(config.rpc.clone())
        .with_histories(histories.clone());
        let threads = config.threads;
        let worker = Arc::new(Worker {
            ledger: ledger.clone(),
            sessions: Arc::new(Mutex::new(BTreeMap::new())),
            registry: Arc::new(registry),
            metrics: Arc::new(Metrics::default()),
            session_ended: Arc::new(Notify::new()),
        });
        let responses = ResponseStore::new(&ledger, config.stored_responses);
        Ok(Arc::new(Scheduler {
            responses,
            admission: Admission::new(config.parallel, config.queue),
            config,
            registry: worker.registry.clone(),
            ledger,
            _process: process,
            device,
            device_memory,
            next_id: AtomicU64::new(1),
            metrics: worker.metrics.clone(),
            worker,
            started: Instant::now(),
            threads,
            activity: Arc::default(),
            learner: Arc::default(),
            prompt_cache,
            histories,
        }))
    }

    /// Earlier answers of every model and key, which later requests draft from.
    pub fn histories(&self) -> &Histories {
        &self.histories
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

    /// The model named `name`, or the configured default, loaded (for the endpoints that use
    /// a model's tokenizer without generating: call [`Registry::release`] after).
    pub async fn model_or_default(&self, name: Option<&str>) -> Result<Arc<ServedModel>, ServeError> {
        self.registry.get(name.unwrap_or(&self.config.default_model)).await
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
        if n != self.admission.parallel() {
            tracing::info!(parallel = n, model = %m.name, "requests that generate at once");
            self.admission.set_parallel(n);
        }
    }

    /// Requests that may generate at once now.
    pub fn parallel(&self) -> usize {
        self.admission.parallel()
    }

    /// Requests generating now.
    pub fn active(&self) -> usize {
        lock(&self.worker.sessions).len()
    }

    /// Requests waiting for a turn.
    pub fn queued(&self) -> usize {
        self.admission.queued()
    }

    /// Take no new requests from now on.
    pub fn stop_accepting(&self) {
        self.activity.stopping.store(true, Ordering::SeqCst);
        self.admission.stop();
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
            histories: self.registry.histories_status(),
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
            rpc: pocket_runtime::rpc::protocol().map(|p| pocket_api::RpcStatus {
                protocol: p.to_owned(),
                peers: pocket_runtime::rpc::links().iter().map(|l| peer_status(l)).collect(),
            }),
        }
    }

    /// The budget and its use.
    pub fn memory(&self) -> pocket_api::MemoryStatus {
        // Free memory is read now; the device was found at start, so this cannot fail.
        let device = self.device_memory.as_ref().map(|d| {
            let now = pocket_runtime::device_memory(&self.device).ok().flatten();
            let pool = self.ledger.device_pool();
            pocket_api::DeviceMemoryStatus {
                name: d.name.clone(),
                unified: pool.is_none(),
                budget_bytes: pool.map_or(self.ledger.budget(), |(_, b)| b),
                used_bytes: self.ledger.device_used(),
                peak_bytes: self.ledger.device_peak(),
                total_bytes: d.total_bytes,
                free_bytes: now.map_or(d.free_bytes, |m| m.free_bytes),
            }
        });
        pocket_api::MemoryStatus {
            budget_bytes: self.ledger.budget(),
            used_bytes: self.ledger.used(),
            peak_bytes: self.ledger.peak(),
            resident_bytes: pocket_runtime::process::MemStats::read().rss_bytes,
            device,
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
        let admitted = admission::check(&job, &self.config, &self.registry)?;
        if admitted.spec != SpecMode::Off {
            self.learner.want(&admitted.found.name, admitted.kv);
        }
        self.follow_parallel();
        let queued_at = Instant::now();
        let (place, turn) = self.admission.wait_for_turn(job.options.priority).await?;
        // Learning gives the machine back before this request loads or plans anything.
        self.learner.stopped().await;
        let request = admitted.request(&job, &self.config, self.threads);
        let (spec, model) = (admitted.spec, self.registry.load(admitted.found).await?);
        let draft = match (&job.options.draft_model, spec) {
            (Some(d), SpecMode::Draft | SpecMode::Auto) => Some(self.registry.get(d).await?),
            _ => None,
        };
        tracing::info!(id = %id, client = %job.client, model = %model.name, %spec, "request");
        let prepared = self.admission.prepare(&self.worker, &model, draft.as_ref(), &request, &id).await?;

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

/// The id a request is known by (`3fa2c9d1-7`): this daemon's start, then its count, so that
/// ids stay unique across restarts (clients and logs may keep them); HTTP answers prefix it
/// as OpenAI does (`chatcmpl-`, `cmpl-`).
fn request_id(id: u64) -> String {
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    // The standard library's hasher keys are random per process.
    let start = START.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new().build_hasher().finish() as u32
    });
    format!("{start:08x}-{id}")
}

/// What the status shows of the link to an RPC peer.
fn peer_status(link: &pocket_runtime::rpc::Link) -> pocket_api::RpcPeerStatus {
    let stats = link.stats();
    let us = |d: Option<std::time::Duration>| d.map(|d| d.as_micros() as u64);
    pocket_api::RpcPeerStatus {
        peer: link.peer().to_owned(),
        connected: link.connected(),
        lost: link.lost(),
        round_trip_min_us: us(stats.round_trip_min),
        round_trip_last_us: us(stats.round_trip_last),
        bytes_to_peer: stats.bytes_to_peer,
        bytes_from_peer: stats.bytes_from_peer,
    }
}
