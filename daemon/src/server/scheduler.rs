//! The scheduler: both transports hand it a [`Job`] and get a [`Running`] generation back
//! (or an error before anything was generated, so that HTTP can still choose the status).
//!
//! Admission is two semaphores: `parallel + queue` places (past them, 429) and `parallel`
//! turns. A request with a turn gets its model (loaded on demand), is tokenized and planned
//! under what the budget has free; when the plan does not fit, idle models are unloaded
//! (least recently used first) and, while other sessions run, it waits for one to end;
//! when nothing else can free memory, it is refused with the numbers (503).
//!
//! Generation runs on a blocking thread. Text goes back through a channel; when the receiver
//! is gone (the client disconnected) or the request is cancelled, the next token ends the
//! generation, and the session's memory is returned as soon as it does.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pocket_core::memory::{Ledger, Plan, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{
    ChatMessage, GenerateRequest, KvType, Model, SamplingConfig, SessionConfig, StopConfig, StopReason,
    default_threads, generate_speculative,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use pocket_models::Format;

use super::config::Config;
use super::error::ServeError;
use super::metrics::Metrics;
use super::registry::{Engine, LoadedModel, Registry};
use crate::spec::{DEFAULT_MAX_DRAFT, SpecSetup, plan_session};

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Messages, rendered with the model's chat template (and the assistant's turn opened).
    Chat(Vec<ChatMessage>),
    /// Text given to the model as it is.
    Text(String),
}

/// A request's settings; `None` takes the daemon's configured default.
#[derive(Debug, Clone, Default, PartialEq)]
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
}

impl JobOptions {
    /// Settings from an OpenAI request's fields (with pocketd's `spec`, `draft_model`, `kv`).
    pub fn from_openai(o: &pocket_api::GenerationOptions) -> Result<JobOptions, ServeError> {
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
        let spec = o
            .spec
            .as_deref()
            .map(|s| s.parse::<SpecMode>())
            .transpose()
            .map_err(|e| param_error("spec", &e))?;
        let kv =
            o.kv.as_deref().map(|s| s.parse::<KvType>()).transpose().map_err(|e| param_error("kv", &e))?;
        Ok(JobOptions {
            max_tokens: o.max_tokens,
            sampling,
            stop: o.stop.clone().map(pocket_api::Stop::into_vec).unwrap_or_default(),
            spec,
            draft_model: o.draft_model.clone(),
            kv,
        })
    }
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
}

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The whole text.
    pub text: String,
    /// OpenAI's `finish_reason`: `stop` (end token or stop string), `length` or `cancelled`.
    pub finish_reason: &'static str,
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
        Err(ServeError::Internal("the generation ended without a result".into()))
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
    turns: Arc<Semaphore>,
    queued: AtomicUsize,
    sessions: Mutex<BTreeMap<u64, SessionEntry>>,
    next_id: AtomicU64,
    session_ended: Notify,
    stopping: AtomicBool,
    stopping_notify: Notify,
    /// Counters for `/metrics`.
    pub metrics: Metrics,
    started: Instant,
    threads: usize,
}

/// How long a request whose plan does not fit waits for running sessions to give memory
/// back before it is refused.
const MEMORY_WAIT: Duration = Duration::from_secs(30);

impl Scheduler {
    /// A scheduler for `config`: its budget's ledger is made now, with this process's own
    /// memory reserved first.
    pub fn new(config: Config) -> anyhow::Result<Arc<Scheduler>> {
        let (ledger, process) = crate::mem::budget_ledger(Some(config.budget()?))?;
        let registry = Registry::new(
            config.models_dir.clone(),
            ledger.clone(),
            Duration::from_secs(config.keep_alive_seconds),
        );
        let threads = if config.threads == 0 { default_threads() } else { config.threads };
        Ok(Arc::new(Scheduler {
            places: Arc::new(Semaphore::new(config.parallel + config.queue)),
            turns: Arc::new(Semaphore::new(config.parallel)),
            config,
            registry,
            ledger,
            _process: process,
            queued: AtomicUsize::new(0),
            sessions: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            session_ended: Notify::new(),
            stopping: AtomicBool::new(false),
            stopping_notify: Notify::new(),
            metrics: Metrics::default(),
            started: Instant::now(),
            threads,
        }))
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The daemon's budget.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
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
                bytes: m.bytes(),
                sessions: Registry::users(&m),
                idle_seconds: idle.as_secs_f64(),
                keep_alive_seconds: keep_alive,
            })
            .collect();
        let sessions = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, s)| pocket_api::SessionStatus {
                id: request_id(*id),
                model: s.model.clone(),
                generated_tokens: s.generated.load(Ordering::Relaxed),
                plan: serde_json::json!({
                    "plan": s.plan,
                    "used_bytes": s.ledger.used(),
                    "peak_bytes": s.ledger.peak(),
                }),
            })
            .collect();
        pocket_api::Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            memory: self.memory(),
            loaded,
            sessions,
            queued: self.queued(),
            queue_capacity: self.config.queue,
        }
    }

    /// The budget and its use.
    pub fn memory(&self) -> pocket_api::MemoryStatus {
        pocket_api::MemoryStatus {
            budget_bytes: self.ledger.budget(),
            used_bytes: self.ledger.used(),
            peak_bytes: self.ledger.peak(),
            resident_bytes: crate::mem::MemStats::read().rss_bytes,
        }
    }

    /// Start generating `job`. Returns once its session exists (or with the error that
    /// stopped it before then); text then arrives through [`Running::pieces`].
    pub async fn submit(self: &Arc<Self>, job: Job) -> Result<Running, ServeError> {
        let result = self.submit_inner(job).await;
        if let Err(e) = &result {
            self.metrics.failed(e);
        }
        result
    }

    async fn submit_inner(self: &Arc<Self>, job: Job) -> Result<Running, ServeError> {
        if self.is_stopping() {
            return Err(ServeError::ShuttingDown);
        }
        job.options.sampling.validate().map_err(|e| param_error("temperature", &e))?;
        StopConfig { max_tokens: 1, stop: job.options.stop.clone() }
            .validate()
            .map_err(|e| param_error("stop", &e))?;
        let model_name = job.model.clone().unwrap_or_else(|| self.config.default_model.clone());
        // Unknown names are refused before queueing.
        let found = self.registry.find(&model_name)?;
        let spec = spec_for(job.options.spec, self.config.spec, found.format == Format::Onnx)?;
        if spec == SpecMode::Draft && job.options.draft_model.is_none() {
            return Err(ServeError::invalid("draft_model", "spec = draft needs a draft_model"));
        }

        let place = self
            .places
            .clone()
            .try_acquire_owned()
            .map_err(|_| ServeError::QueueFull(self.config.parallel + self.config.queue))?;
        let queued_at = Instant::now();
        let turn = {
            let _waiting = Counted::new(&self.queued);
            let stopping = self.stopping_notify.notified();
            tokio::select! {
                t = self.turns.clone().acquire_owned() => t.map_err(|_| ServeError::ShuttingDown)?,
                _ = stopping => return Err(ServeError::ShuttingDown),
            }
        };
        let model = self.registry.load(found).await?;
        let draft = match (&job.options.draft_model, spec) {
            (Some(d), SpecMode::Draft | SpecMode::Auto) => Some(self.registry.get(d).await?),
            _ => None,
        };
        tracing::info!(client = %job.client, model = %model.name, %spec, "request");

        // Tokenize and plan; when the budget is full, make room or wait for it.
        let deadline = Instant::now() + MEMORY_WAIT;
        let prepared = loop {
            let (m, d, j, me) = (model.clone(), draft.clone(), job.clone(), self.clone());
            let result = tokio::task::spawn_blocking(move || me.prepare(&m, d.as_deref(), &j, spec))
                .await
                .map_err(|e| ServeError::Internal(format!("planning panicked: {e}")))?;
            match result {
                Ok(p) => break p,
                Err(e) if e.is_over_budget() => {
                    let keep: Vec<&str> =
                        [Some(model.name.as_str()), draft.as_ref().map(|d| d.name.as_str())]
                            .into_iter()
                            .flatten()
                            .collect();
                    if self.registry.evict_idle(&keep) {
                        continue;
                    }
                    let ended = self.session_ended.notified();
                    if self.active() == 0 || Instant::now() >= deadline {
                        return Err(e);
                    }
                    let _ = tokio::time::timeout_at(deadline.into(), ended).await;
                }
                Err(e) => return Err(e),
            }
        };

        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel();
        let (started_tx, started_rx) = oneshot::channel();
        let ctx = GenerationContext {
            id,
            model,
            draft,
            prepared,
            cancel: cancel.clone(),
            queued_seconds: queued_at.elapsed().as_secs_f64(),
            permits: (place, turn),
        };
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.generate(ctx, started_tx, tx));
        match started_rx.await {
            Ok(Ok(started)) => Ok(Running { started, pieces: rx, cancel: CancelOnDrop(cancel) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ServeError::Internal("the generation thread ended before starting".into())),
        }
    }

    /// Tokenize and plan (blocking).
    fn prepare(
        &self,
        model: &LoadedModel,
        draft: Option<&LoadedModel>,
        job: &Job,
        spec: SpecMode,
    ) -> Result<Prepared, ServeError> {
        let tokenizer = model.model().tokenizer();
        let text = match &job.input {
            Input::Chat(_) if model.ggml().is_none() => {
                return Err(ServeError::invalid(
                    "messages",
                    format!(
                        "{} is an encoder-decoder model with no chat template: it takes plain text; send \
                         the text to /v1/completions as `prompt`",
                        model.name
                    ),
                ));
            }
            Input::Chat(messages) => tokenizer
                .apply_chat_template(messages, true)
                .map_err(|e| ServeError::invalid("messages", e.to_string()))?,
            Input::Text(t) => t.clone(),
        };
        let tokens = tokenizer.encode(&text, true).map_err(|e| ServeError::bad_request(e.to_string()))?;
        if tokens.is_empty() {
            return Err(ServeError::invalid("prompt", "the prompt is empty"));
        }
        let n_ctx = self.config.ctx_size.min(model.model().info().n_ctx_train.max(16));
        if tokens.len() + 1 > n_ctx {
            return Err(ServeError::TooLarge(format!(
                "the prompt is {} tokens but the context holds {n_ctx} (with room for at least one generated \
                 token); shorten the prompt",
                tokens.len()
            )));
        }
        let max_tokens =
            job.options.max_tokens.unwrap_or(self.config.max_tokens).min(self.config.max_tokens) as usize;
        if max_tokens == 0 {
            return Err(ServeError::invalid("max_tokens", "max_tokens must be at least 1"));
        }
        let wanted = (tokens.len() + max_tokens).min(n_ctx);
        let mut config = SessionConfig {
            kv: job.options.kv.unwrap_or(self.config.kv),
            n_ctx,
            threads: self.threads,
            ..SessionConfig::default()
        };
        let plan =
            plan_session(model.model(), draft.and_then(|d| d.ggml()), &config, &self.ledger, wanted, spec)
                .map_err(|e| ServeError::from_engine(&e))?;
        plan.apply_to(&mut config);
        Ok(Prepared {
            tokens,
            config,
            max_tokens,
            stop: job.options.stop.clone(),
            sampling: job.options.sampling.clone(),
            plan,
        })
    }

    /// Run one generation (blocking thread).
    fn generate(
        self: Arc<Self>,
        ctx: GenerationContext,
        started: oneshot::Sender<Result<Started, ServeError>>,
        tx: mpsc::UnboundedSender<Piece>,
    ) {
        let GenerationContext { id, model, draft, prepared, cancel, queued_seconds, permits } = ctx;
        let ledger = self.ledger.sub();
        let generated = Arc::new(AtomicU64::new(0));
        let outcome = {
            let mut started = Some(started);
            let result = self.run_session(
                &model,
                draft.as_deref(),
                &prepared,
                &ledger,
                &cancel,
                &generated,
                &tx,
                &mut || {
                    self.sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(
                        id,
                        SessionEntry {
                            model: model.name.clone(),
                            generated: generated.clone(),
                            plan: prepared.plan.clone(),
                            ledger: ledger.clone(),
                            cancel: cancel.clone(),
                        },
                    );
                    if let Some(s) = started.take() {
                        let _ = s.send(Ok(Started {
                            id: request_id(id),
                            model: model.name.clone(),
                            prompt_tokens: prepared.tokens.len(),
                            plan: prepared.plan.clone(),
                            queued_seconds,
                        }));
                    }
                },
            );
            (result, started)
        };
        // The session and drafter are dropped by now: their memory is back in the budget.
        let (result, not_started) = outcome;
        let peak_bytes = ledger.peak();
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        self.registry.release(&model.name);
        if let Some(d) = &draft {
            self.registry.release(&d.name);
        }
        drop((model, draft, permits));
        match result {
            Ok(mut finished) => {
                finished.peak_bytes = peak_bytes;
                finished.timings.queued_ms = queued_seconds * 1e3;
                tracing::info!(
                    id = %request_id(id),
                    prompt_tokens = finished.usage.prompt_tokens,
                    generated = finished.usage.completion_tokens,
                    decode_tok_per_s = format!("{:.1}", finished.timings.decode_tok_per_s),
                    finish = finished.finish_reason,
                    peak_bytes,
                    "done"
                );
                self.metrics.finished(&finished);
                let _ = tx.send(Piece::Done(Box::new(finished)));
            }
            // Before the start, `submit` returns the error (and counts it).
            Err(e) => match not_started {
                Some(s) => {
                    let _ = s.send(Err(e));
                }
                None => {
                    tracing::warn!(id = %request_id(id), "failed: {e}");
                    self.metrics.failed(&e);
                    let _ = tx.send(Piece::Failed(e));
                }
            },
        }
        self.session_ended.notify_waiters();
    }

    #[allow(clippy::too_many_arguments)]
    fn run_session(
        &self,
        model: &LoadedModel,
        draft: Option<&LoadedModel>,
        p: &Prepared,
        ledger: &Ledger,
        cancel: &AtomicBool,
        generated: &AtomicU64,
        tx: &mpsc::UnboundedSender<Piece>,
        on_start: &mut dyn FnMut(),
    ) -> Result<Finished, ServeError> {
        let engine = |e: anyhow::Error| ServeError::from_engine(&e);
        let spec = p.plan.spec;
        let cost = model.cost_model(spec, &p.config, &p.tokens, ledger).map_err(engine)?;
        let target = match &model.engine {
            Engine::Ggml(m) => m,
            Engine::Tract(m) => {
                let max_draft = if p.plan.max_draft == 0 { DEFAULT_MAX_DRAFT } else { p.plan.max_draft };
                let mut drafter = crate::seq2seq::drafter(spec, &p.tokens, cost, max_draft)
                    .map_err(|e| ServeError::invalid("spec", e.to_string()))?;
                let mut session = m
                    .new_session(&p.config, ledger)
                    .map_err(|e| ServeError::from_engine(&anyhow::Error::new(e)))?;
                on_start();
                let stop = StopConfig { max_tokens: p.max_tokens, stop: p.stop.clone() };
                let generation = crate::seq2seq::generate(
                    m,
                    &mut session,
                    &p.tokens,
                    p.sampling.clone(),
                    stop,
                    drafter.as_mut(),
                    &mut |event| forward(event, generated, tx, cancel),
                )
                .map_err(|e| ServeError::from_engine(&anyhow::Error::new(e)))?;
                let name = drafter.as_ref().map(|d| d.describe());
                return Ok(finished(&generation, name));
            }
        };
        let setup = SpecSetup {
            model: target,
            session: &p.config,
            cost,
            skip_set: model.skip_set(),
            draft_model: draft.filter(|_| p.plan.draft_model).and_then(|d| d.ggml()),
            seed: p.sampling.seed,
            max_draft: if p.plan.max_draft == 0 { DEFAULT_MAX_DRAFT } else { p.plan.max_draft },
            ledger: ledger.clone(),
        };
        let mut drafter = setup.build(spec).map_err(engine)?;
        let mut session = target
            .new_session_in(&p.config, ledger)
            .map_err(|e| ServeError::from_engine(&anyhow::Error::new(e)))?;
        on_start();
        let request = GenerateRequest {
            prompt: p.tokens.clone(),
            sampling: p.sampling.clone(),
            stop: StopConfig { max_tokens: p.max_tokens, stop: p.stop.clone() },
        };
        let d = drafter.as_mut().map(|d| d.as_drafter());
        let generation = generate_speculative(
            target.info(),
            &mut session,
            target.tokenizer(),
            &request,
            d,
            &mut |event| forward(event, generated, tx, cancel),
        )
        .map_err(|e| ServeError::from_engine(&anyhow::Error::new(e)))?;
        if let Some(set) = drafter.as_ref().and_then(|d| d.found_skip_set()) {
            model.set_skip_set(set);
        }
        let drafter_name = drafter.as_mut().map(|d| d.as_drafter().describe());
        Ok(finished(&generation, drafter_name))
    }
}

/// The speculation mode a request runs in: the one it asks for, refused where the model's
/// kind has no such drafter; else the daemon's default, or plain decoding where the default
/// does not apply to this kind of model.
fn spec_for(asked: Option<SpecMode>, default: SpecMode, seq2seq: bool) -> Result<SpecMode, ServeError> {
    let fits = |mode: SpecMode| match mode {
        SpecMode::InputCopy => seq2seq,
        SpecMode::LayerSkip | SpecMode::Draft => !seq2seq,
        _ => true,
    };
    match asked {
        Some(mode) if fits(mode) => Ok(mode),
        Some(SpecMode::InputCopy) => Err(ServeError::invalid(
            "spec",
            "spec = inputcopy drafts from an encoder-decoder model's source text; for decoder-only models \
             use suffix, which also matches the prompt",
        )),
        Some(mode) => Err(ServeError::invalid(
            "spec",
            format!(
                "spec = {mode} is for decoder (GGUF) models; encoder-decoder models draft with inputcopy, suffix or auto"
            ),
        )),
        None if fits(default) => Ok(default),
        None => Ok(SpecMode::Off),
    }
}

/// Pass one generation event on: count the token, send the text; stop when the client is
/// gone or the request is cancelled.
fn forward(
    event: pocket_core::Event<'_>,
    generated: &AtomicU64,
    tx: &mpsc::UnboundedSender<Piece>,
    cancel: &AtomicBool,
) -> ControlFlow<()> {
    if event.token.is_some() {
        generated.fetch_add(1, Ordering::Relaxed);
    }
    if !event.text.is_empty() && tx.send(Piece::Text(event.text.to_owned())).is_err() {
        return ControlFlow::Break(()); // the client is gone
    }
    if cancel.load(Ordering::Relaxed) || tx.is_closed() {
        return ControlFlow::Break(());
    }
    ControlFlow::Continue(())
}

/// What a finished generation reports.
fn finished(generation: &pocket_core::Generation, drafter_name: Option<String>) -> Finished {
    let finish_reason = match generation.stop {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::Cancelled => "cancelled",
        _ => "stop",
    };
    let completion = generation.tokens.len() as u32;
    Finished {
        text: generation.text.clone(),
        finish_reason,
        usage: pocket_api::Usage {
            prompt_tokens: generation.prompt_tokens as u32,
            completion_tokens: completion,
            total_tokens: generation.prompt_tokens as u32 + completion,
        },
        timings: pocket_api::Timings {
            prefill_ms: generation.prefill_seconds * 1e3,
            prefill_tok_per_s: generation.prefill_tok_per_s(),
            decode_tok_per_s: generation.decode_tok_per_s(),
            drafted: generation.spec.drafted as u64,
            accepted: generation.spec.accepted as u64,
            drafter: drafter_name,
            queued_ms: 0.0,
        },
        peak_bytes: 0,
        decode_seconds: generation.decode_seconds,
    }
}

/// What [`Scheduler::prepare`] works out.
struct Prepared {
    tokens: Vec<pocket_core::Token>,
    config: SessionConfig,
    max_tokens: usize,
    stop: Vec<String>,
    sampling: SamplingConfig,
    plan: Plan,
}

struct GenerationContext {
    id: u64,
    model: Arc<LoadedModel>,
    draft: Option<Arc<LoadedModel>>,
    prepared: Prepared,
    cancel: Arc<AtomicBool>,
    queued_seconds: f64,
    /// Held until the generation ends.
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// The id a request is known by (`pocketd-7`).
pub fn request_id(id: u64) -> String {
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
