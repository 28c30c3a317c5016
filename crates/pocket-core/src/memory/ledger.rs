//! The ledger: every allocation is reserved against the budget before it is made, and the
//! reservation is given back when what it paid for is dropped.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result};

#[derive(Debug)]
struct State {
    budget: u64,
    used: u64,
    peak: u64,
}

/// A memory budget and what is reserved against it. Cheap to clone; clones share the same
/// budget (one per process: the daemon's models and sessions all draw from it).
///
/// A [`Ledger::sub`] ledger counts what one part (a session) reserves while every
/// reservation also draws on the ledger it was made from.
#[derive(Debug, Clone)]
pub struct Ledger {
    state: Arc<Mutex<State>>,
    parent: Option<Arc<Ledger>>,
}

impl Ledger {
    /// A ledger with `budget` bytes.
    pub fn new(budget: u64) -> Ledger {
        Ledger { state: Arc::new(Mutex::new(State { budget, used: 0, peak: 0 })), parent: None }
    }

    /// A ledger of its own for one part of what this one pays for: what is reserved in it is
    /// also reserved here (and refused when this one has no room), and its `used` and `peak`
    /// count only that part.
    pub fn sub(&self) -> Ledger {
        Ledger { parent: Some(Arc::new(self.clone())), ..Ledger::unlimited() }
    }

    /// Start counting the peak again from what is reserved now.
    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.used;
    }

    /// A ledger that refuses nothing (it still counts).
    pub fn unlimited() -> Ledger {
        Ledger::new(u64::MAX)
    }

    // A panic while the lock was held cannot leave the counters half-updated (each update is
    // one assignment), so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.lock().budget
    }

    /// Bytes reserved now.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Bytes that may still be reserved.
    pub fn available(&self) -> u64 {
        let own = {
            let s = self.lock();
            s.budget.saturating_sub(s.used)
        };
        self.parent.as_ref().map_or(own, |p| own.min(p.available()))
    }

    /// The most bytes reserved at once since the ledger was made (or [`Ledger::reset_peak`]).
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Reserve `bytes` for `what` (a short description for the error: "KV cache of
    /// smollm2-135m"), or fail with [`Error::OverBudget`] naming what was needed and what was
    /// free, reserving nothing.
    pub fn reserve(&self, bytes: u64, what: &str) -> Result<Reservation> {
        self.take(bytes, what)?;
        Ok(Reservation { ledger: self.clone(), bytes, what: what.to_owned() })
    }

    fn take(&self, bytes: u64, what: &str) -> Result<()> {
        if let Some(parent) = &self.parent {
            parent.take(bytes, what)?;
        }
        let taken = self.take_own(bytes, what);
        if taken.is_err()
            && let Some(parent) = &self.parent
        {
            parent.give_back(bytes);
        }
        taken
    }

    fn take_own(&self, bytes: u64, what: &str) -> Result<()> {
        let mut s = self.lock();
        let available = s.budget.saturating_sub(s.used);
        if bytes > available {
            return Err(Error::OverBudget {
                what: what.to_owned(),
                needed: bytes,
                available,
                budget: s.budget,
            });
        }
        s.used += bytes;
        s.peak = s.peak.max(s.used);
        Ok(())
    }

    fn give_back(&self, bytes: u64) {
        {
            let mut s = self.lock();
            s.used = s.used.saturating_sub(bytes);
        }
        if let Some(parent) = &self.parent {
            parent.give_back(bytes);
        }
    }
}

/// Bytes reserved in a [`Ledger`] for one thing; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    ledger: Ledger,
    bytes: u64,
    what: String,
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Change the reservation to `bytes`: shrinking always succeeds; growing reserves the
    /// difference or fails with [`Error::OverBudget`], leaving the reservation as it was.
    pub fn resize(&mut self, bytes: u64) -> Result<()> {
        if bytes > self.bytes {
            self.ledger.take(bytes - self.bytes, &self.what)?;
        } else {
            self.ledger.give_back(self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_until_dropped_and_refuse_past_the_budget() {
        let ledger = Ledger::new(1000);
        let a = ledger.reserve(600, "weights").unwrap();
        assert_eq!((ledger.used(), ledger.available()), (600, 400));
        let e = ledger.reserve(500, "KV cache").unwrap_err();
        assert_eq!(
            e,
            Error::OverBudget { what: "KV cache".into(), needed: 500, available: 400, budget: 1000 }
        );
        let msg = e.to_string();
        assert!(msg.contains("KV cache") && msg.contains("500 B") && msg.contains("400 B"), "{msg}");
        assert_eq!(ledger.used(), 600, "a refused reservation takes nothing");
        let b = ledger.reserve(400, "KV cache").unwrap();
        assert_eq!(ledger.available(), 0);
        drop(a);
        assert_eq!(ledger.used(), 400);
        drop(b);
        assert_eq!((ledger.used(), ledger.peak()), (0, 1000));
    }

    #[test]
    fn a_reservation_grows_within_the_budget_and_shrinks_freely() {
        let ledger = Ledger::new(100);
        let other = ledger.reserve(30, "other").unwrap();
        let mut kv = ledger.reserve(10, "KV").unwrap();
        kv.resize(70).unwrap();
        assert_eq!(ledger.used(), 100);
        let e = kv.resize(71).unwrap_err();
        assert!(matches!(e, Error::OverBudget { needed: 1, available: 0, .. }), "{e}");
        assert_eq!(kv.bytes(), 70, "a refused growth leaves the reservation as it was");
        kv.resize(20).unwrap();
        assert_eq!(ledger.used(), 50);
        drop(other);
        drop(kv);
        assert_eq!(ledger.used(), 0);
    }

    #[test]
    fn a_sub_ledger_counts_its_part_and_draws_on_the_whole() {
        let process = Ledger::new(100);
        let _weights = process.reserve(50, "weights").unwrap();
        let session = process.sub();
        assert_eq!(session.available(), 50);
        let mut kv = session.reserve(30, "KV").unwrap();
        assert_eq!((session.used(), process.used()), (30, 80));
        let e = session.reserve(25, "logits").unwrap_err();
        assert!(matches!(e, Error::OverBudget { needed: 25, available: 20, budget: 100, .. }), "{e}");
        assert_eq!((session.used(), process.used()), (30, 80), "a refusal takes nothing anywhere");
        kv.resize(10).unwrap();
        session.reset_peak();
        let logits = session.reserve(15, "logits").unwrap();
        drop(logits);
        assert_eq!((session.peak(), session.used(), process.used()), (25, 10, 60));
        drop(kv);
        assert_eq!((session.used(), process.used()), (0, 50));
    }

    #[test]
    fn clones_share_one_budget_across_threads() {
        let ledger = Ledger::new(1_000_000);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let l = ledger.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        let r = l.reserve(100, "t").unwrap();
                        drop(r);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(ledger.used(), 0);
        assert!(ledger.peak() <= 400);
    }
}
