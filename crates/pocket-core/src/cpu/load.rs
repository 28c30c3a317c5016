//! What the governor reads from the system: the cores the process may use, the time its
//! CPUs were busy (`/proc/stat`) and the process's own CPU time.

use std::time::{Duration, Instant};

/// Cores this process may run on now: its affinity mask, capped by its cgroup's `cpu.max`
/// quota (rounded down, at least 1) — what [`std::thread::available_parallelism`] reads.
pub(super) fn allowed_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The CPUs of this process's affinity mask (empty if it cannot be read).
pub(super) fn affinity() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

/// CPU time of every thread of this process so far.
pub(super) fn process_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// One reading: when, how long the CPUs were busy in all, and how long of it was ours.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(super) at: Instant,
    /// Busy time of the CPUs read, summed, since boot.
    busy: Duration,
    /// This process's CPU time since it started.
    own: Duration,
}

impl Sample {
    /// Read `/proc/stat`'s lines for `cpus` (all CPUs if empty) and the process's CPU time.
    pub(super) fn read(cpus: &[usize], at: Instant) -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let busy = busy_time(&stat, cpus, ticks_per_second())?;
        Some(Sample { at, busy, own: process_cpu_time() })
    }

    /// Cores other processes kept busy on average between `prev` and this reading (negative
    /// rounding clamped to 0); `None` if no time passed.
    pub(super) fn others_since(&self, prev: &Sample) -> Option<f64> {
        let wall = self.at.checked_duration_since(prev.at)?.as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        let busy = self.busy.saturating_sub(prev.busy).as_secs_f64();
        let own = self.own.saturating_sub(prev.own).as_secs_f64();
        Some(((busy - own) / wall).max(0.0))
    }
}

/// The kernel's unit of `/proc/stat` (`USER_HZ`).
fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// Busy time (user, nice, system, irq, softirq — guest time is inside user) of the `cpus` lines
/// of `stat`, or of its `cpu` total line when `cpus` is empty. Steal time, a virtual machine's
/// host running something else, is not counted: no program on the board took the core, and a
/// host that deschedules spinning virtual CPUs would make our own threads look like others'.
fn busy_time(stat: &str, cpus: &[usize], hz: u64) -> Option<Duration> {
    let mut ticks = 0u64;
    let mut found = false;
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(which) = name.strip_prefix("cpu") else { continue };
        let wanted = if cpus.is_empty() {
            which.is_empty()
        } else {
            which.parse::<usize>().is_ok_and(|c| cpus.contains(&c))
        };
        if !wanted {
            continue;
        }
        let v: Vec<u64> = fields.take(8).map(|f| f.parse().unwrap_or(0)).collect();
        let [user, nice, system, _idle, _iowait, irq, softirq, _steal] = v[..] else { continue };
        ticks += user + nice + system + irq + softirq;
        found = true;
    }
    found.then(|| Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / hz)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  300 10 100 5000 20 5 5 0 0 0
cpu0 200 10 50 2000 10 5 5 0 0 0
cpu1 100 0 50 3000 10 0 0 0 0 0
intr 12345
ctxt 999
";

    #[test]
    fn busy_time_sums_the_lines_of_the_cpus_asked_for() {
        assert_eq!(busy_time(STAT, &[0], 100), Some(Duration::from_millis(2700)));
        assert_eq!(busy_time(STAT, &[1], 100), Some(Duration::from_millis(1500)));
        assert_eq!(busy_time(STAT, &[0, 1], 100), Some(Duration::from_millis(4200)));
        // No affinity known: the total line.
        assert_eq!(busy_time(STAT, &[], 100), Some(Duration::from_millis(4200)));
        // CPUs with no line: nothing to say.
        assert_eq!(busy_time(STAT, &[7], 100), None);
        assert_eq!(busy_time("garbage", &[], 100), None);
    }

    #[test]
    fn others_load_is_busy_time_less_our_own_over_the_window() {
        let t0 = Instant::now();
        let prev = Sample { at: t0, busy: Duration::from_secs(10), own: Duration::from_secs(1) };
        // Over one second the CPUs were busy 1.5 s, 0.4 s of it ours: 1.1 cores of others.
        let now = Sample {
            at: t0 + Duration::from_secs(1),
            busy: Duration::from_millis(11_500),
            own: Duration::from_millis(1_400),
        };
        let others = now.others_since(&prev).unwrap();
        assert!((others - 1.1).abs() < 1e-9, "{others}");
        // Our time counted in ticks can exceed the ticks' busy time: never below 0.
        let ours = Sample { own: Duration::from_secs(5), ..now.clone() };
        assert_eq!(ours.others_since(&prev), Some(0.0));
    }

    #[test]
    fn this_machine_reads() {
        assert!(allowed_cores() >= 1);
        let cpus = affinity();
        assert!(!cpus.is_empty());
        assert!(Sample::read(&cpus, Instant::now()).is_some(), "/proc/stat has lines for {cpus:?}");
        let t = process_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu_time() > t);
    }
}
