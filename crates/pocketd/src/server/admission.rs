//! Admission: what a request must pass before it generates.
//!
//! First its settings ([`check`]): out of range, an unknown model, a speculation mode its
//! engine does not offer are refused before it queues. Then a place (`parallel + queue` of
//! them; past them, 429) and a turn (`parallel` of them, by priority, then arrival:
//! [`super::turns`]). Then memory ([`Admission::prepare`]): the request pipeline plans it under
//! what the budget has free; when the plan does not fit, parked conversations and idle models
//! are unloaded (least recently used first) and, while other sessions run, it waits for one to
//! end; when nothing else can free memory, it is refused with the numbers (503).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pocket_core::spec::SpecMode;
use pocket_core::{KvType, SessionConfig, StopConfig, Threads};
use pocket_runtime::Settings;
use pocket_runtime::pipeline::{self, Prepared, Request};
use pocket_runtime::{DEFAULT_MAX_DRAFT, Engine};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::config::{Config, Parallel};
use super::error::ServeError;
use super::job::Job;
use super::registry::{Available, Registry, ServedModel};
use super::turns::{Turn, Turns};
use super::worker::Worker;

/// How long a request whose plan does not fit waits for running sessions to give memory
/// back before it is refused.
const MEMORY_WAIT: Duration = Duration::from_secs(30);

/// While it waits, how often it looks again.
const MEMORY_RECHECK: Duration = Duration::from_millis(200);

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

/// The places, the turns and the requests waiting for either or for memory.
pub(super) struct Admission {
    places: Arc<Semaphore>,
    /// Places in all: `parallel`'s most plus the queue.
    place_count: usize,
    turns: Arc<Turns>,
    queued: AtomicUsize,
    /// Requests with a turn waiting for other requests to give memory back.
    waiting_for_memory: AtomicUsize,
    stopping: Notify,
}

impl Admission {
    /// Admission for `parallel` requests generating at once and `queue` more waiting.
    pub(super) fn new(parallel: Parallel, queue: usize) -> Admission {
        let place_count = parallel.most() + queue;
        Admission {
            places: Arc::new(Semaphore::new(place_count)),
            place_count,
            turns: Turns::new(match parallel {
                Parallel::Auto => Parallel::UNMEASURED,
                Parallel::Fixed(n) => n,
            }),
            queued: AtomicUsize::new(0),
            waiting_for_memory: AtomicUsize::new(0),
            stopping: Notify::new(),
        }
    }

    /// Requests that may generate at once now.
    pub(super) fn parallel(&self) -> usize {
        self.turns.capacity()
    }

    /// Make `n` requests generate at once from now on.
    pub(super) fn set_parallel(&self, n: usize) {
        self.turns.set_capacity(n);
    }

    /// Requests waiting for a turn.
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Wake every request waiting for a turn: the daemon stops.
    pub(super) fn stop(&self) {
        self.stopping.notify_waiters();
    }

    /// A place, at once or never (429), then a turn by `priority`, however long it takes,
    /// unless the daemon stops first.
    pub(super) async fn wait_for_turn(
        &self,
        priority: i32,
    ) -> Result<(OwnedSemaphorePermit, Turn), ServeError> {
        let place =
            self.places.clone().try_acquire_owned().map_err(|_| ServeError::QueueFull(self.place_count))?;
        let _waiting = Counted::new(&self.queued);
        let stopping = self.stopping.notified();
        tokio::select! {
            turn = self.turns.acquire(priority) => Ok((place, turn)),
            _ = stopping => Err(ServeError::ShuttingDown),
        }
    }

    /// Tokenize and plan `request`; when the budget is full, make room (parked
    /// conversations, then idle models) or wait for a running request to give memory back,
    /// for at most [`MEMORY_WAIT`].
    pub(super) async fn prepare(
        &self,
        worker: &Worker,
        model: &Arc<ServedModel>,
        draft: Option<&Arc<ServedModel>>,
        request: &Request,
        id: &str,
    ) -> Result<Prepared, ServeError> {
        let deadline = Instant::now() + MEMORY_WAIT;
        loop {
            let (m, d, r, ledger) = (model.clone(), draft.cloned(), request.clone(), worker.ledger.clone());
            let result = tokio::task::spawn_blocking(move || {
                pipeline::prepare(&m.model, d.as_ref().map(|d| &d.model), &r, &ledger)
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
            if worker.registry.evict_parked() || worker.registry.evict_idle(&keep) {
                continue;
            }
            // Memory comes back when another request with a turn ends — unless every other
            // one is itself waiting for memory.
            let ended = worker.session_ended.notified();
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
pub(super) struct Admitted {
    pub(super) found: Available,
    pub(super) spec: SpecMode,
    pub(super) max_tokens: usize,
    pub(super) kv: KvType,
}

/// What is refused before a request queues: an unknown model, and the settings
/// [`pocket_runtime::validate`] refuses (out of range, a speculation mode the model's engine
/// does not offer).
pub(super) fn check(job: &Job, config: &Config, registry: &Registry) -> Result<Admitted, ServeError> {
    let model_name = job.model.clone().unwrap_or_else(|| config.default_model.clone());
    let found = registry.find(&model_name)?;
    let engine = registry.engine(&found.path);
    let spec = spec_for(job.options.spec, config.spec, engine);
    let max_tokens = job.options.max_tokens.unwrap_or(config.max_tokens).min(config.max_tokens) as usize;
    let settings = Settings {
        spec,
        draft_model: job.options.draft_model.is_some(),
        sampling: &job.options.sampling,
        stop: &StopConfig { max_tokens, stop: job.options.stop.clone() },
    };
    pocket_runtime::validate(&settings, Some(engine)).map_err(|e| ServeError::from_runtime(e, None))?;
    let kv = job.options.kv.unwrap_or(config.kv);
    Ok(Admitted { found, spec, max_tokens, kv })
}

impl Admitted {
    /// The pipeline's request for `job`, with the daemon's settings where it has none.
    pub(super) fn request(&self, job: &Job, config: &Config, threads: Threads) -> Request {
        Request {
            input: job.input.clone(),
            sampling: job.options.sampling.clone(),
            stop: StopConfig { max_tokens: self.max_tokens, stop: job.options.stop.clone() },
            spec: self.spec,
            session: SessionConfig {
                kv: self.kv,
                n_ctx: config.ctx_size,
                threads,
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
            template_kwargs: job.options.template_kwargs.clone(),
        }
    }
}

/// The speculation mode a request runs in: the one it asks for (which [`check`] refuses
/// where the model's engine offers no such drafter); else the daemon's default, or plain
/// decoding where the default does not apply to this kind of model.
fn spec_for(asked: Option<SpecMode>, default: SpecMode, engine: Engine) -> SpecMode {
    match asked {
        Some(mode) => mode,
        None if engine.drafters().contains(&default) => default,
        None => SpecMode::Off,
    }
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

    #[tokio::test]
    async fn past_the_places_a_request_is_refused_and_a_waiting_one_is_counted_until_it_gets_a_turn() {
        // One generating, one queued: the third is refused with the number of places.
        let admission = Arc::new(Admission::new(Parallel::Fixed(1), 1));
        let first = admission.wait_for_turn(0).await.unwrap();
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.wait_for_turn(0).await.map(|_| ()) }
        });
        while admission.queued() == 0 {
            tokio::task::yield_now().await;
        }
        match admission.wait_for_turn(0).await {
            Err(ServeError::QueueFull(2)) => {}
            other => panic!("expected QueueFull(2), got {:?}", other.map(|_| ())),
        }
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(admission.queued(), 0);
    }

    #[tokio::test]
    async fn a_request_waiting_for_a_turn_is_let_go_when_the_daemon_stops() {
        let admission = Arc::new(Admission::new(Parallel::Fixed(1), 4));
        let _held = admission.wait_for_turn(0).await.unwrap();
        let waiter = tokio::spawn({
            let admission = admission.clone();
            async move { admission.wait_for_turn(0).await.map(|_| ()) }
        });
        while admission.queued() == 0 {
            tokio::task::yield_now().await;
        }
        admission.stop();
        assert!(matches!(waiter.await.unwrap(), Err(ServeError::ShuttingDown)));
        assert_eq!(admission.queued(), 0);
    }

    #[test]
    fn a_default_speculation_mode_the_engine_lacks_falls_back_to_plain_decoding() {
        let onnx = Engine::Tract;
        assert_eq!(spec_for(None, SpecMode::LayerSkip, onnx), SpecMode::Off);
        assert_eq!(spec_for(None, SpecMode::Auto, Engine::Ggml), SpecMode::Auto);
        // One asked for is kept, for the shared check to refuse by name.
        assert_eq!(spec_for(Some(SpecMode::LayerSkip), SpecMode::Auto, onnx), SpecMode::LayerSkip);
    }
}
