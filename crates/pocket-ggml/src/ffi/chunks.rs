//! A custom op's work handed out in chunks, pass by pass.
//!
//! ggml calls a custom op on every thread of the pass with `(ith, nth)`; splitting the work
//! into `nth` fixed shares makes every thread wait at the node's barrier for the slowest — a
//! thread descheduled for a moment holds its whole share. Here each thread takes the next
//! chunk until none is left, so the others take a late thread's share. What each output
//! element is does not depend on who computes it.
//!
//! A chunk counter cannot be reset between passes without a barrier of its own, so it is
//! tagged with the pass: the graph counts its passes ([`PassCount`]), and the first thread of
//! a new pass to claim a chunk starts the count again.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Chunks per thread: more let the others take more of a late thread's work, at the cost of
/// what each chunk prepares again (a matrix product's activations, an attention's scratch).
const CHUNKS_PER_THREAD: usize = 2;

/// The size of the chunks `total` items are cut into for `nth` threads (at least 1).
pub(crate) fn chunk_size(total: usize, nth: usize) -> usize {
    total.div_ceil(nth.max(1) * CHUNKS_PER_THREAD).max(1)
}

/// A graph's pass number, bumped before each computation.
#[derive(Default)]
pub(crate) struct PassCount(AtomicU32);

impl PassCount {
    /// A new pass starts (before the threads are woken for it).
    pub(crate) fn next(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// The chunks of one node of one graph, and a word of the op's own (its parameters).
pub(crate) struct Chunks {
    pass: *const PassCount,
    /// The pass (high 32 bits) and the next chunk in it (low 32 bits).
    next: AtomicU64,
    /// The op's parameter, as it would have passed it as user data.
    pub(crate) data: u64,
}

// SAFETY: `pass` points at the graph's count, which lives as long as the graph and so as
// long as this (both owned by the graph's context); it is only read, atomically.
unsafe impl Send for Chunks {}
// SAFETY: as above; `next` is atomic.
unsafe impl Sync for Chunks {}

impl Chunks {
    /// Chunks counted in passes of `pass`.
    pub(crate) fn new(pass: &PassCount, data: u64) -> Self {
        Chunks { pass, next: AtomicU64::new(0), data }
    }

    /// The next chunk of this node in the current pass: 0, 1, 2, … in the order threads ask.
    pub(crate) fn claim(&self) -> usize {
        // SAFETY: see the type's Send/Sync.
        let pass = u64::from(unsafe { (*self.pass).0.load(Ordering::Acquire) });
        let mut cur = self.next.load(Ordering::Acquire);
        loop {
            let (new, got) =
                if cur >> 32 == pass { (cur + 1, cur & 0xffff_ffff) } else { ((pass << 32) | 1, 0) };
            match self.next.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return got as usize,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The ranges of `0..total`, `chunk` items each (the last one shorter), that this thread
    /// claims one after another until none is left.
    pub(crate) fn ranges(&self, total: usize, chunk: usize) -> impl Iterator<Item = Range<usize>> + '_ {
        let chunk = chunk.max(1);
        std::iter::from_fn(move || {
            let start = self.claim() * chunk;
            (start < total).then(|| start..(start + chunk).min(total))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_claimed_once_per_pass_by_however_many_threads() {
        let pass = PassCount::default();
        let chunks = Chunks::new(&pass, 7);
        for _ in 0..3 {
            pass.next();
            let claimed = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        loop {
                            let c = chunks.claim();
                            if c >= 100 {
                                break;
                            }
                            claimed.lock().unwrap().push(c);
                        }
                    });
                }
            });
            let mut claimed = claimed.into_inner().unwrap();
            claimed.sort();
            assert_eq!(claimed, (0..100).collect::<Vec<_>>());
        }
        assert_eq!(chunks.data, 7);
    }
}
