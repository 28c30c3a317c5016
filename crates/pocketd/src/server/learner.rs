//! Learning what speculation needs about the loaded models — their cost curves, skip sets —
//! while the daemon is idle ([`pocket_runtime::learn`]): after a moment without requests, and
//! once other processes leave the CPU idle too (or have kept it busy for half a minute). A request that arrives stops it within a
//! forward pass (it waits for that, so it never shares the machine with the learner); what
//! was learned is used by the next requests, and what was interrupted resumes later.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pocket_core::KvType;
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_runtime::learn::{self, TuneSettings};
use tokio::sync::Notify;

use super::registry::{Registry, ServedModel};

/// How long the daemon must have been without requests before it starts learning: a burst of
/// requests from one client comes with gaps far shorter than this.
const IDLE_GRACE: Duration = Duration::from_millis(1500);

/// Cores other processes may keep busy for the machine still to count as idle.
const OTHERS_BUSY: f64 = 0.5;

/// The longest the learner waits for other processes to leave the CPU idle: on a board that
/// always runs something, `auto` would otherwise never learn what it needs.
const OTHERS_WAIT_MAX: Duration = Duration::from_secs(30);

/// How long something that could not be learned is left alone.
const LEARN_RETRY: Duration = Duration::from_secs(600);

/// The learner's state, held by the scheduler.
#[derive(Default)]
pub struct Learner {
    /// Whether it is running now; requests wait for it to stop first.
    running: AtomicBool,
    /// Woken when it stops.
    stopped: Notify,
    /// What it is doing, for `/v1/status`.
    doing: Mutex<Option<String>>,
    /// The KV types requests asked to speculate with, per model: what is learned for them.
    wanted: Mutex<HashSet<(String, KvType)>>,
    /// What could not be learned, and when it failed (not retried for a while).
    failed: Mutex<HashMap<(String, KvType), Instant>>,
}

/// The requests the learner keeps out of the way of, as the scheduler records them.
#[derive(Debug)]
pub struct Activity {
    /// Requests between their arrival and their end: while any is, nothing is learned.
    pub in_flight: AtomicUsize,
    /// When the last request ended (or the daemon started).
    pub last: Mutex<Instant>,
    /// Woken when a request ends, and when the daemon starts stopping.
    pub ended: Notify,
    /// The daemon takes no new requests.
    pub stopping: AtomicBool,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
            ended: Notify::new(),
            stopping: AtomicBool::new(false),
        }
    }
}

impl Activity {
    /// Whether the daemon is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Whether a request is in flight or the daemon is stopping: learning gives way.
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0 || self.is_stopping()
    }
}

/// What learning while idle works with: the learner's state, the requests it gives way to,
/// the models (and what it learns for them) and the budget it learns under.
pub struct IdleLearning {
    /// The learner's state.
    pub learner: Arc<Learner>,
    /// The requests it gives way to.
    pub activity: Arc<Activity>,
    /// The models: it learns about the loaded ones.
    pub registry: Arc<Registry>,
    /// The daemon's budget: what it learns with is paid for there.
    pub ledger: Ledger,
    /// The daemon's default speculation mode.
    pub spec: SpecMode,
    /// The daemon's default KV type.
    pub kv: KvType,
    /// The most threads a pass runs on.
    pub threads: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain inserts and reads: a panic elsewhere cannot leave them half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Learner {
    /// Wait until the learner is not running (it stops within a pass once a request is in
    /// flight).
    pub async fn stopped(&self) {
        loop {
            let stopped = self.stopped.notified();
            if !self.running.load(Ordering::SeqCst) {
                return;
            }
            stopped.await;
        }
    }

    /// A request asked `model` to speculate with a `kv` cache: learn for that too.
    pub fn want(&self, model: &str, kv: KvType) {
        lock(&self.wanted).insert((model.to_owned(), kv));
    }

    /// What it is learning now, if anything.
    pub fn doing(&self) -> Option<String> {
        lock(&self.doing).clone()
    }

    fn stop(&self) {
        self.running.store(false, Ordering::SeqCst);
        self.stopped.notify_waiters();
    }
}

impl IdleLearning {
    /// Learn what speculation needs about the loaded models while no request is in flight
    /// (after [`IDLE_GRACE`] of quiet), stopping within a forward pass when one arrives. Runs
    /// until the daemon stops.
    pub async fn run(self) {
        let learner = &self.learner;
        let activity = &self.activity;
        let mut others_since: Option<Instant> = None;
        loop {
            if activity.is_stopping() {
                return;
            }
            let woken = activity.ended.notified();
            let loaded = self.registry.loaded_notify.notified();
            let quiet_for = lock(&activity.last).elapsed();
            if activity.in_flight.load(Ordering::SeqCst) > 0 {
                woken.await;
                continue;
            }
            if quiet_for < IDLE_GRACE {
                tokio::time::sleep(IDLE_GRACE - quiet_for).await;
                continue;
            }
            let Some((model, settings)) = self.next_to_learn() else {
                // Nothing to learn until a request asks for speculation or a model loads.
                tokio::select! {
                    _ = woken => {}
                    _ = loaded => {}
                }
                continue;
            };
            if others_busy().await {
                // Other processes keep the cores busy: learning would compete with them, for a
                // while.
                let since = *others_since.get_or_insert_with(Instant::now);
                if since.elapsed() < OTHERS_WAIT_MAX {
                    tokio::time::sleep(IDLE_GRACE).await;
                    continue;
                }
                tracing::info!(
                    "other processes have kept the CPU busy for {OTHERS_WAIT_MAX:?}: learning all the same"
                );
            }
            others_since = None;
            // Announce, then look again: a request that arrived meanwhile either sees the
            // learner running and waits for it (it stops at its first pass), or is seen here.
            learner.running.store(true, Ordering::SeqCst);
            if activity.busy() {
                learner.stop();
                continue;
            }
            let what = format!("{} ({} KV)", model.name, settings.kv);
            *lock(&learner.doing) = Some(what.clone());
            let (me, watched) = (learner.clone(), activity.clone());
            let ledger = self.ledger.sub();
            let started = Instant::now();
            let result = tokio::task::spawn_blocking(move || {
                let cancelled = || watched.busy();
                let result = learn::tune(&model.model, &settings, &ledger, &cancelled, &mut |p| {
                    let doing = match p {
                        learn::Progress::MeasuringCurve => "cost curve",
                        learn::Progress::MeasuringKvAgreement => "KV agreement",
                        learn::Progress::Searching => "skip set",
                        _ => return,
                    };
                    *lock(&me.doing) = Some(format!("{} ({} KV): {doing}", model.name, settings.kv));
                });
                (model.name.clone(), settings.kv, result)
            })
            .await;
            *lock(&learner.doing) = None;
            learner.stop();
            match result {
                Ok((_, _, Ok(tuned))) => tracing::info!(
                    what = %what,
                    seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
                    curve = tuned.measured_curve,
                    skip_set = tuned.found_skip_set,
                    cancelled = tuned.cancelled,
                    "learned while idle"
                ),
                Ok((name, kv, Err(e))) => {
                    tracing::warn!(what = %what, "could not learn about the model (retried in {LEARN_RETRY:?}): {e}");
                    lock(&learner.failed).insert((name, kv), Instant::now());
                }
                Err(e) => tracing::warn!(what = %what, "learning panicked: {e}"),
            }
        }
    }

    /// A loaded model and the settings there is something to learn for: the daemon's KV type
    /// when it speculates by default, and every KV type requests asked to speculate with.
    fn next_to_learn(&self) -> Option<(Arc<ServedModel>, TuneSettings)> {
        let wanted = lock(&self.learner.wanted).clone();
        let failed = lock(&self.learner.failed).clone();
        for (model, _) in self.registry.loaded() {
            let mut kvs: Vec<KvType> =
                wanted.iter().filter(|(name, _)| *name == model.name).map(|(_, kv)| *kv).collect();
            if self.spec != SpecMode::Off {
                kvs.push(self.kv);
            }
            kvs.sort_by_key(|kv| kv.name());
            kvs.dedup();
            for kv in kvs {
                if failed.get(&(model.name.clone(), kv)).is_some_and(|t| t.elapsed() < LEARN_RETRY) {
                    continue;
                }
                let settings = TuneSettings::new(self.threads, kv);
                if learn::needs_tuning(&model.model, &settings) {
                    return Some((model, settings));
                }
            }
        }
        None
    }
}

/// Whether other processes kept more than [`OTHERS_BUSY`] cores busy over the last quarter
/// second (false where `/proc` does not say).
async fn others_busy() -> bool {
    let Some(before) = pocket_runtime::process::CpuTimes::read() else { return false };
    tokio::time::sleep(Duration::from_millis(250)).await;
    let after = pocket_runtime::process::CpuTimes::read();
    after.and_then(|a| a.other_cores_since(&before)).is_some_and(|cores| cores > OTHERS_BUSY)
}
