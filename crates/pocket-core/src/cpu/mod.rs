//! How many CPU threads a forward pass runs on.
//!
//! The threads of a pass meet at a barrier after every node of its graph, and ggml's pool
//! spins there. When one of them is descheduled because another program wants its core, the
//! others spin through the scheduler's slice, node after node: two programs that each take
//! every core slow each other down by far more than half (measured: to 0.002–0.28× of their
//! speed alone). So with [`Threads::Auto`] the count follows the cores that are free:
//!
//! - the cores the process may use at all: its affinity and its cgroup's `cpu.max` quota
//!   (what `taskset`, systemd's `AllowedCPUs=` and `CPUQuota=` set), read again every second;
//! - the load other processes put on those cores, from `/proc/stat` less this process's own
//!   CPU time, every [`LOAD_WINDOW`];
//! - each pass's own efficiency: the CPU time the process got during the pass against the
//!   time its threads had. Spinning counts as CPU time, so a low figure means a thread waited
//!   off its core — a straggler — and the count drops at once, without waiting for the
//!   load window.
//!
//! The count comes down as soon as a signal says so and goes up one thread at a time, after
//! a hold that doubles each time a raise had to be taken back. What a pass computes never
//! depends on the count: every kernel computes each output element on one thread.
//! [`Threads::Fixed`] is honoured exactly.

mod build;
mod load;

pub use build::check_build;

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How many CPU threads a session's passes run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Threads {
    /// As many as the cores other programs leave free, pass by pass (see the [module](self)).
    #[default]
    Auto,
    /// Exactly this many (at least 1).
    Fixed(usize),
}

impl Threads {
    /// The most threads a pass may use: the count itself, or for [`Threads::Auto`] the cores
    /// this process may run on now. A session's thread pool is this large.
    pub fn max(self) -> usize {
        match self {
            Threads::Auto => load::allowed_cores(),
            Threads::Fixed(n) => n.max(1),
        }
    }

    /// Whether the count follows the free cores.
    pub fn is_auto(self) -> bool {
        self == Threads::Auto
    }
}

impl fmt::Display for Threads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threads::Auto => f.write_str("auto"),
            Threads::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for Threads {
    type Err = Error;

    /// `auto`, or a count of at least 1. `0` is read as `auto`: it meant "every core" before
    /// the count followed the free cores.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Threads::Auto);
        }
        match s.parse::<usize>() {
            Ok(0) => Ok(Threads::Auto),
            Ok(n) => Ok(Threads::Fixed(n)),
            Err(_) => Err(Error::invalid_field(
                "threads",
                format!(
                    "threads {s:?} is neither \"auto\" nor a count: use \"auto\" (follow the free cores) or a number such as 2"
                ),
            )),
        }
    }
}

impl Serialize for Threads {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Threads::Auto => serializer.serialize_str("auto"),
            Threads::Fixed(n) => serializer.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Threads {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Count(n) => Threads::from_str(&n.to_string()),
            Raw::Text(s) => Threads::from_str(&s),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// Between two readings of `/proc/stat`: the load signal's resolution (the kernel counts in
/// ticks of 10 ms, so a shorter window is mostly rounding).
pub const LOAD_WINDOW: Duration = Duration::from_millis(200);

/// Between two readings of the cores the process may use (affinity, cgroup quota), which an
/// operator can change while it runs (`systemctl set-property … CPUQuota=`).
const ALLOWED_REFRESH: Duration = Duration::from_secs(1);

/// A pass whose threads got less than this share of their time on a core waited for a
/// descheduled thread. Spinning counts as CPU time, so an idle machine gives about 1 — less in
/// a virtual machine, whose host deschedules a spinning virtual CPU (decode passes of a 2-core
/// VM: 0.79–1.02, median 0.93). Two threads sharing two cores with a third busy one get about
/// 0.67; with two others, 0.5.
const LOW_EFFICIENCY: f64 = 0.72;

/// Consecutive low-efficiency passes that lower the count: one or two can be a timer, an
/// interrupt, a hypervisor's hiccup.
const LOW_EFFICIENCY_PASSES: u32 = 3;

/// Passes shorter than this say too little about efficiency (the clock's and the kernel's
/// own noise are a large part of them).
const MIN_TIMED_PASS: Duration = Duration::from_micros(500);

/// Lower the count when fewer cores are free than it minus this many.
const LOWER_BELOW: f64 = 0.5;

/// Raise the count by one only when at least it plus this many cores are free: another
/// program's occasional work does not bring back a thread that would then preempt it.
const RAISE_ABOVE: f64 = 0.7;

/// The first hold after the count was lowered for straggling; each raise that has to be taken
/// back doubles it, up to [`MAX_HOLD`], and a raise that holds for [`MAX_HOLD`] resets it.
const FIRST_HOLD: Duration = Duration::from_secs(1);
const MAX_HOLD: Duration = Duration::from_secs(16);

/// The thread counts of one process's passes (see the [module](self)): one per process,
/// [`governor`].
pub struct Governor {
    state: Mutex<State>,
}

/// What the governor knows, and decides from (no I/O: testable with made-up readings).
#[derive(Debug)]
struct State {
    /// Cores the process may use (affinity, quota); `None` until first read.
    allowed: Option<usize>,
    allowed_at: Option<Instant>,
    /// The CPUs of the affinity mask, whose lines of `/proc/stat` are summed.
    cpus: Vec<usize>,
    /// The last reading of the load.
    sample: Option<load::Sample>,
    /// Other processes' load on our CPUs, in cores (smoothed over two windows).
    others: f64,
    /// Threads an adaptive pass runs on now (before sharing between passes at once).
    limit: usize,
    /// Adaptive passes computing now.
    computing: usize,
    /// Consecutive passes whose threads waited off their cores.
    low_passes: u32,
    /// No raising before this.
    hold_until: Option<Instant>,
    /// The next hold after a lowering for straggling.
    hold: Duration,
    /// When the count was last raised (a lowering soon after doubles the hold).
    raised_at: Option<Instant>,
    /// Threads the last adaptive pass ran on.
    last: usize,
}

/// One pass, between [`Governor::begin`] and [`Governor::end`].
#[derive(Debug)]
pub struct Pass {
    threads: usize,
    adaptive: bool,
    /// The only adaptive pass computing when it began: its CPU time is its own.
    timed: Option<(Instant, Duration)>,
}

impl Pass {
    /// Threads this pass runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }
}

/// What [`Governor::status`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuStatus {
    /// Threads a pass with [`Threads::Auto`] runs on now.
    pub threads: usize,
    /// Cores this process may use (affinity and cgroup quota).
    pub allowed: usize,
    /// Other processes' load on those cores, in cores.
    pub others_load: f64,
}

/// The process's governor.
pub fn governor() -> &'static Governor {
    static GOVERNOR: OnceLock<Governor> = OnceLock::new();
    GOVERNOR.get_or_init(Governor::new)
}

impl Default for Governor {
    fn default() -> Self {
        Self::new()
    }
}

impl Governor {
    /// A governor that has read nothing yet.
    pub fn new() -> Self {
        Governor { state: Mutex::new(State::new()) }
    }

    /// Start a pass whose session asked for `threads`, on a pool of `pool` threads: how many
    /// it runs on. Every `begin` needs its [`Governor::end`].
    pub fn begin(&self, threads: Threads, pool: usize) -> Pass {
        let pool = pool.max(1);
        let Threads::Auto = threads else {
            return Pass { threads: threads.max().min(pool), adaptive: false, timed: None };
        };
        let now = Instant::now();
        let mut s = self.lock();
        s.refresh(now);
        let share = (s.limit / (s.computing + 1)).max(1);
        let n = share.min(pool);
        s.computing += 1;
        s.last = n;
        // Only a pass computing alone owns the process's CPU time; and one thread cannot
        // straggle behind another.
        let timed = (s.computing == 1 && n > 1).then(|| (now, load::process_cpu_time()));
        Pass { threads: n, adaptive: true, timed }
    }

    /// End a pass begun with [`Governor::begin`].
    pub fn end(&self, pass: Pass) {
        if !pass.adaptive {
            return;
        }
        let finished =
            pass.timed.map(|(start, cpu0)| (start.elapsed(), load::process_cpu_time().saturating_sub(cpu0)));
        let mut s = self.lock();
        s.computing = s.computing.saturating_sub(1);
        if let Some((wall, cpu)) = finished
            && s.computing == 0
        {
            s.observe_pass(pass.threads, wall, cpu, Instant::now());
        }
    }

    /// The count an adaptive pass would run on now, and what it follows.
    pub fn status(&self) -> CpuStatus {
        let mut s = self.lock();
        s.refresh(Instant::now());
        CpuStatus { threads: s.limit.max(1), allowed: s.allowed.unwrap_or(1), others_load: s.others }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent between statements: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn new() -> Self {
        State {
            allowed: None,
            allowed_at: None,
            cpus: Vec::new(),
            sample: None,
            others: 0.0,
            limit: 1,
            computing: 0,
            low_passes: 0,
            hold_until: None,
            hold: FIRST_HOLD,
            raised_at: None,
            last: 0,
        }
    }

    /// Read what is due: the cores allowed every [`ALLOWED_REFRESH`], the load every
    /// [`LOAD_WINDOW`].
    fn refresh(&mut self, now: Instant) {
        if self.allowed_at.is_none_or(|t| now.duration_since(t) >= ALLOWED_REFRESH) {
            let (allowed, cpus) = (load::allowed_cores(), load::affinity());
            self.observe_allowed(allowed, now);
            self.cpus = cpus;
        }
        if self.sample.as_ref().is_none_or(|s| now.duration_since(s.at) >= LOAD_WINDOW)
            && let Some(sample) = load::Sample::read(&self.cpus, now)
        {
            if let Some(others) = self.sample.as_ref().and_then(|prev| sample.others_since(prev)) {
                self.observe_load(others, now);
            }
            self.sample = Some(sample);
        }
    }

    /// The cores the process may use are `allowed` now.
    fn observe_allowed(&mut self, allowed: usize, now: Instant) {
        let allowed = allowed.max(1);
        if self.allowed.is_some_and(|a| a != allowed) {
            tracing::debug!(allowed, "cores allowed changed");
        }
        let first = self.allowed.is_none();
        self.allowed = Some(allowed);
        self.allowed_at = Some(now);
        if first {
            self.limit = allowed;
        }
        self.limit = self.limit.min(allowed);
    }

    /// Other processes kept `others` cores busy over the last window.
    fn observe_load(&mut self, others: f64, now: Instant) {
        let allowed = self.allowed.unwrap_or(1);
        // Half the new window, half the old: one window's rounding does not move the count.
        self.others = 0.5 * self.others + 0.5 * others.clamp(0.0, allowed as f64);
        let free = allowed as f64 - self.others;
        if self.limit > 1 && free < self.limit as f64 - LOWER_BELOW {
            self.limit = (free.round() as usize).clamp(1, allowed);
            self.hold_until = Some(now + 2 * LOAD_WINDOW);
            tracing::debug!(
                others = others,
                smoothed = self.others,
                threads = self.limit,
                "fewer threads: others' load"
            );
        } else if self.limit < allowed
            && free >= self.limit as f64 + RAISE_ABOVE
            && self.hold_until.is_none_or(|t| now >= t)
        {
            self.limit += 1;
            self.raised_at = Some(now);
            self.hold_until = Some(now + 2 * LOAD_WINDOW);
            tracing::debug!(others = self.others, threads = self.limit, "more threads: cores free");
        }
        if self.raised_at.is_some_and(|t| now.duration_since(t) >= MAX_HOLD) {
            self.hold = FIRST_HOLD;
            self.raised_at = None;
        }
    }

    /// A pass alone on `threads` threads took `wall` and the process `cpu` of CPU time.
    fn observe_pass(&mut self, threads: usize, wall: Duration, cpu: Duration, now: Instant) {
        if wall < MIN_TIMED_PASS || threads < 2 {
            return;
        }
        let efficiency = cpu.as_secs_f64() / (threads as f64 * wall.as_secs_f64());
        tracing::trace!(efficiency, wall_us = wall.as_micros() as u64, threads, "pass");
        if efficiency >= LOW_EFFICIENCY {
            self.low_passes = 0;
            return;
        }
        self.low_passes += 1;
        if self.low_passes < LOW_EFFICIENCY_PASSES || self.limit < 2 {
            return;
        }
        self.low_passes = 0;
        // A raise taken back soon: wait longer before the next.
        if self.raised_at.is_some_and(|t| now.duration_since(t) < MAX_HOLD) {
            self.hold = (self.hold * 2).min(MAX_HOLD);
        }
        self.limit = (threads - 1).min(self.limit - 1).max(1);
        self.hold_until = Some(now + self.hold);
        tracing::debug!(
            efficiency,
            threads = self.limit,
            hold_ms = self.hold.as_millis() as u64,
            "fewer threads: a straggling pass"
        );
    }
}

#[cfg(test)]
mod tests;
