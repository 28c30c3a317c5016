//! This process's memory, from `/proc/self/status`: what `pocket run --json` and the
//! benchmark report, and the ledger of a memory budget with the process's own memory paid
//! for first; and how busy the rest of the machine keeps the CPU (`/proc/stat`), for learning
//! only when it is otherwise idle and for benchmarks to say when they competed.

use pocket_core::memory::{BudgetSpec, Ledger, MemoryLimits, Reservation};
use serde::Serialize;

/// Resident memory of this process now, and its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemStats {
    /// Resident set now (VmRSS).
    pub rss_bytes: u64,
    /// Peak resident set since start or the last [`reset_peak`] (VmHWM).
    pub peak_rss_bytes: u64,
    /// Resident anonymous memory now (RssAnon): heap, KV cache, repacked weights.
    pub anon_bytes: u64,
    /// Resident file-backed memory now (RssFile): mapped weights in the page cache.
    pub file_bytes: u64,
}

impl MemStats {
    /// Read the current figures; zeros where the kernel does not report them.
    pub fn read() -> MemStats {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| pocket_core::memory::proc_field(&status, name).unwrap_or(0);
        MemStats {
            rss_bytes: field("VmRSS"),
            peak_rss_bytes: field("VmHWM"),
            anon_bytes: field("RssAnon"),
            file_bytes: field("RssFile"),
        }
    }
}

/// Reset the kernel's peak-RSS counter (VmHWM) to the current RSS, so a peak can be measured
/// for one phase (Linux ≥ 4.0). Returns false where that is not possible.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Tracks the peak of anonymous and file-backed memory separately by sampling, since the
/// kernel keeps only the peak of their sum.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PeakSampler {
    /// Highest anonymous resident memory seen.
    pub peak_anon_bytes: u64,
    /// Highest file-backed resident memory seen.
    pub peak_file_bytes: u64,
}

impl PeakSampler {
    /// Take a sample now.
    pub fn sample(&mut self) -> MemStats {
        let m = MemStats::read();
        self.peak_anon_bytes = self.peak_anon_bytes.max(m.anon_bytes);
        self.peak_file_bytes = self.peak_file_bytes.max(m.file_bytes);
        m
    }
}

/// What the process holds that no ledger entry pays for, beyond its resident memory at the
/// start: the tokenizers' tables, ggml's thread pools and small allocations, the page ends of
/// the KV cache, the allocator's slack. Measured on SmolLM2 and Qwen2.5 (see the budget
/// tests); generous rather than tight.
pub const PROCESS_MARGIN: u64 = 32 << 20;

/// Give the heap's free pages back to the system after a model is unloaded, so that resident
/// memory follows the budget down (see [`pocket_ggml::release_free_heap`]).
pub fn release_free_heap() {
    pocket_ggml::release_free_heap();
}

/// The ledger for `--memory-budget`, with the process's own memory (resident now, plus
/// [`PROCESS_MARGIN`]) reserved first; keep the reservation for as long as the ledger is
/// used. Without a budget, an unlimited ledger.
pub fn budget_ledger(spec: Option<BudgetSpec>) -> crate::Result<(Ledger, Option<Reservation>)> {
    let Some(spec) = spec else { return Ok((Ledger::unlimited(), None)) };
    let budget = spec.resolve(&MemoryLimits::read());
    let ledger = Ledger::new(budget);
    let own = MemStats::read().rss_bytes + PROCESS_MARGIN;
    let reservation = ledger.reserve(own, "the process itself (code, libraries, tokenizer, thread pools)")?;
    Ok((ledger, Some(reservation)))
}

/// `ledger` with the memory of the device `choice` selects as a pool of its own, where that
/// device has memory of its own (a discrete GPU): `spec` of it, where `auto` is what is free on
/// the device now less a tenth of its total (the backend's own scratch — cuBLAS's workspaces,
/// the CUDA pool's dequantized matrices — is in no buffer the ledger sees). On the CPU, and on
/// a GPU that shares the host's memory (Jetson's), `ledger` as it is: one budget for both.
/// Also the device's memory as its backend reports it (none on the CPU).
pub fn with_device_pool(
    ledger: Ledger,
    choice: &crate::DeviceChoice,
    spec: BudgetSpec,
) -> crate::Result<(Ledger, Option<crate::DeviceMemory>)> {
    let Some(memory) = pocket_ggml::device_memory(choice).map_err(crate::Error::Ggml)? else {
        return Ok((ledger, None));
    };
    if memory.unified {
        return Ok((ledger, Some(memory)));
    }
    let budget = match spec {
        BudgetSpec::Auto => memory.free_bytes.saturating_sub(memory.total_bytes / 10),
        BudgetSpec::Bytes(b) if b <= memory.total_bytes => b,
        BudgetSpec::Bytes(b) => {
            return Err(crate::Error::invalid(
                "device_memory_budget",
                format!(
                    "a device memory budget of {} is more than {} has ({}): give at most that, or auto",
                    pocket_core::memory::format_size(b),
                    memory.name,
                    pocket_core::memory::format_size(memory.total_bytes)
                ),
            ));
        }
    };
    Ok((ledger.with_device_pool(&memory.name, budget), Some(memory)))
}

/// CPU time counters, to tell how much of the machine other processes took during a run: on
/// a shared machine (or a board running other services) a benchmark competing for its
/// cores measures the competition, and with spinning thread pools not proportionally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks of every CPU, busy or idle (`/proc/stat`, user to steal).
    total: u64,
    /// Ticks of every CPU busy, for anyone (steal included: another VM had the core).
    busy: u64,
    /// Ticks this process ran (user + system).
    own: u64,
    /// CPUs counted in `total`.
    cpus: u64,
}

impl CpuTimes {
    /// Read the counters now; `None` where `/proc` does not have them.
    pub fn read() -> Option<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(&stat, &own)
    }

    fn parse(stat: &str, own: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line.split_whitespace().skip(1).map_while(|v| v.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        let total = (0..8).map(at).sum();
        let busy = total - at(3) - at(4);
        let cpus = stat.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count() as u64;
        // Fields after the command name (which may contain spaces, hence the last ')'):
        // state is field 3, utime and stime are fields 14 and 15.
        let rest = &own[own.rfind(')')? + 1..];
        let v: Vec<&str> = rest.split_whitespace().collect();
        let own = v.get(11)?.parse::<u64>().ok()? + v.get(12)?.parse::<u64>().ok()?;
        Some(CpuTimes { total, busy, own, cpus: cpus.max(1) })
    }

    /// Cores that other processes kept busy on average since `before`.
    pub fn other_cores_since(&self, before: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(before.total)?;
        if total == 0 {
            return None;
        }
        let busy = self.busy.saturating_sub(before.busy);
        let own = self.own.saturating_sub(before.own);
        Some(busy.saturating_sub(own) as f64 / total as f64 * self.cpus as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nonzero_figures_on_linux() {
        let m = MemStats::read();
        assert!(m.rss_bytes > 0 && m.peak_rss_bytes >= m.rss_bytes);
        assert!(m.anon_bytes > 0);
    }

    #[test]
    fn resident_memory_grows_with_a_touched_allocation() {
        // RSS rather than the peak: other tests in this process may reset the peak meanwhile.
        let before = MemStats::read().rss_bytes;
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let during = MemStats::read();
        assert!(during.rss_bytes >= before + (60 << 20), "{before} -> {}", during.rss_bytes);
        assert!(during.anon_bytes >= 60 << 20);
        drop(v);
    }

    #[test]
    fn other_processes_cpu_share_from_proc_counters() {
        let stat = |user: u64, idle: u64, steal: u64| {
            format!("cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 1 0 0 1\ncpu1 1 0 0 1\nintr 5\n")
        };
        let own = |ticks: u64| format!("42 (my (odd) name) R 1 2 3 4 5 6 7 8 9 10 {ticks} 0 0 0");
        let a = CpuTimes::parse(&stat(100, 100, 0), &own(50)).unwrap();
        assert_eq!(a, CpuTimes { total: 200, busy: 100, own: 50, cpus: 2 });
        // 100 ticks over 2 CPUs: we ran 40, others 30 (10 of them stolen), 30 idle.
        let b = CpuTimes::parse(&stat(160, 130, 10), &own(90)).unwrap();
        assert_eq!(b.other_cores_since(&a), Some(0.6));
        assert_eq!(a.other_cores_since(&a), None);
        assert!(CpuTimes::read().is_some());
    }
}
