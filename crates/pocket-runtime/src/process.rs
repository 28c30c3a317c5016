//! This process's memory, from `/proc/self/status`: what `pocket run --json` and the
//! benchmark report, and the ledger of a memory budget with the process's own memory paid
//! for first.

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
}
