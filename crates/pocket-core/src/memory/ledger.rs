//! The ledger: every allocation is reserved against the budget before it is made, and the
//! reservation is given back when what it paid for is dropped.
//!
//! Memory is in one of two places: host memory (what the budget is for) and a device's own
//! memory (a discrete GPU's). A ledger with a device pool ([`Ledger::with_device_pool`]) keeps
//! the two apart, each with its own budget; without one — a CPU, or a GPU that shares the
//! host's memory, like Jetson's — what is placed on the device is host memory too, and is
//! paid for from the one budget (still counted apart, so that the status can say how much of
//! it is on the device).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result};

/// Where reserved bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Place {
    /// The host's memory.
    #[default]
    Host,
    /// The device's: its own pool where the ledger has one, else host memory.
    Device,
}

#[derive(Debug)]
struct State {
    budget: u64,
    used: u64,
    peak: u64,
    /// Bytes reserved on the device, and their peak: inside `used` without a device pool.
    device_used: u64,
    device_peak: u64,
    /// The device's own memory, apart from the host's: its name and budget.
    device_pool: Option<(String, u64)>,
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
        let state = State { budget, used: 0, peak: 0, device_used: 0, device_peak: 0, device_pool: None };
        Ledger { state: Arc::new(Mutex::new(state)), parent: None }
    }

    /// This ledger with a device pool of `budget` bytes, the memory of the device `name`
    /// (`CUDA0`), apart from the host's: what is reserved on the device is paid for there.
    /// Made before anything is reserved.
    pub fn with_device_pool(self, name: &str, budget: u64) -> Ledger {
        {
            let mut s = self.lock();
            debug_assert_eq!(s.device_used, 0, "a device pool is set up before anything is reserved");
            s.device_pool = Some((name.to_owned(), budget));
        }
        self
    }

    /// A ledger of its own for one part of what this one pays for: what is reserved in it is
    /// also reserved here (and refused when this one has no room), and its `used` and `peak`
    /// count only that part (on the host and the device together).
    pub fn sub(&self) -> Ledger {
        Ledger { parent: Some(Arc::new(self.clone())), ..Ledger::unlimited() }
    }

    /// Start counting the peak again from what is reserved now.
    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.used;
        s.device_peak = s.device_used;
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

    /// The budget in bytes (of host memory, and of the device's where it has no pool of its
    /// own).
    pub fn budget(&self) -> u64 {
        self.lock().budget
    }

    /// Bytes reserved now (in host memory, and on the device where it has no pool of its own).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Bytes that may still be reserved (in host memory).
    pub fn available(&self) -> u64 {
        self.available_in(Place::Host)
    }

    /// Bytes that may still be reserved in `place`.
    pub fn available_in(&self, place: Place) -> u64 {
        let own = {
            let s = self.lock();
            match (&s.device_pool, place) {
                (Some((_, budget)), Place::Device) => budget.saturating_sub(s.device_used),
                _ => s.budget.saturating_sub(s.used),
            }
        };
        self.parent.as_ref().map_or(own, |p| own.min(p.available_in(place)))
    }

    /// The most bytes reserved at once since the ledger was made (or [`Ledger::reset_peak`]).
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// Bytes reserved on the device now (part of [`Ledger::used`] where the device has no
    /// pool of its own).
    pub fn device_used(&self) -> u64 {
        self.lock().device_used
    }

    /// The most bytes reserved on the device at once.
    pub fn device_peak(&self) -> u64 {
        self.lock().device_peak
    }

    /// The device pool's name and budget, where the device's memory is apart from the host's
    /// (none: one pool).
    pub fn device_pool(&self) -> Option<(String, u64)> {
        self.lock().device_pool.clone()
    }

    /// Reserve `bytes` of host memory for `what` (a short description for the error: "KV
    /// cache of smollm2-135m"), or fail with [`Error::OverBudget`] naming what was needed and
    /// what was free, reserving nothing.
    pub fn reserve(&self, bytes: u64, what: &str) -> Result<Reservation> {
        self.reserve_in(Place::Host, bytes, what)
    }

    /// Reserve `bytes` in `place` for `what`, as [`Ledger::reserve`] does.
    pub fn reserve_in(&self, place: Place, bytes: u64, what: &str) -> Result<Reservation> {
        self.take(place, bytes, what)?;
        Ok(Reservation { ledger: self.clone(), place, bytes, what: what.to_owned() })
    }

    fn take(&self, place: Place, bytes: u64, what: &str) -> Result<()> {
        if let Some(parent) = &self.parent {
            parent.take(place, bytes, what)?;
        }
        let taken = self.take_own(place, bytes, what);
        if taken.is_err()
            && let Some(parent) = &self.parent
        {
            parent.give_back(place, bytes);
        }
        taken
    }

    fn take_own(&self, place: Place, bytes: u64, what: &str) -> Result<()> {
        let mut s = self.lock();
        if let (Some((name, budget)), Place::Device) = (&s.device_pool, place) {
            let available = budget.saturating_sub(s.device_used);
            if bytes > available {
                return Err(Error::OverBudget {
                    what: format!("{what} (in {name}'s memory)"),
                    needed: bytes,
                    available,
                    budget: *budget,
                });
            }
        } else {
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
        }
        if place == Place::Device {
            s.device_used += bytes;
            s.device_peak = s.device_peak.max(s.device_used);
        }
        Ok(())
    }

    fn give_back(&self, place: Place, bytes: u64) {
        {
            let mut s = self.lock();
            if place == Place::Device {
                s.device_used = s.device_used.saturating_sub(bytes);
            }
            if place == Place::Host || s.device_pool.is_none() {
                s.used = s.used.saturating_sub(bytes);
            }
        }
        if let Some(parent) = &self.parent {
            parent.give_back(place, bytes);
        }
    }
}

/// Bytes reserved in a [`Ledger`] for one thing, in one place; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    ledger: Ledger,
    place: Place,
    bytes: u64,
    what: String,
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Where they are.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Change the reservation to `bytes`: shrinking always succeeds; growing reserves the
    /// difference or fails with [`Error::OverBudget`], leaving the reservation as it was.
    pub fn resize(&mut self, bytes: u64) -> Result<()> {
        if bytes > self.bytes {
            self.ledger.take(self.place, bytes - self.bytes, &self.what)?;
        } else {
            self.ledger.give_back(self.place, self.bytes - bytes);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// Move the reservation to `place` (what it pays for is made there instead), or fail with
    /// [`Error::OverBudget`] leaving it where it was.
    pub fn move_to(&mut self, place: Place) -> Result<()> {
        if place != self.place {
            self.ledger.take(place, self.bytes, &self.what)?;
            self.ledger.give_back(self.place, self.bytes);
            self.place = place;
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.give_back(self.place, self.bytes);
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

    #[test]
    fn a_device_pool_pays_for_the_device_apart_from_the_host() {
        let ledger = Ledger::new(100).with_device_pool("CUDA0", 1000);
        let host = ledger.reserve(60, "embedding").unwrap();
        let mut weights = ledger.reserve_in(Place::Device, 900, "weights").unwrap();
        assert_eq!((ledger.used(), ledger.device_used()), (60, 900));
        assert_eq!((ledger.available(), ledger.available_in(Place::Device)), (40, 100));
        let e = ledger.reserve_in(Place::Device, 101, "KV cache").unwrap_err();
        let Error::OverBudget { what, needed: 101, available: 100, budget: 1000 } = &e else { panic!("{e}") };
        assert!(what.contains("CUDA0"), "the refusal names the device: {what}");
        // A session's sub-ledger counts both places as its own and draws on each pool.
        let session = ledger.sub();
        let kv = session.reserve_in(Place::Device, 100, "KV cache").unwrap();
        let logits = session.reserve(40, "logits").unwrap();
        assert_eq!((session.used(), session.device_used()), (140, 100));
        assert_eq!((ledger.used(), ledger.device_used(), ledger.peak()), (100, 1000, 100));
        assert!(session.reserve(1, "more").is_err() && session.reserve_in(Place::Device, 1, "more").is_err());
        drop((kv, logits));
        // Moving a reservation takes the new place first; it stays where it was if refused.
        let e = weights.move_to(Place::Host).unwrap_err();
        assert!(matches!(e, Error::OverBudget { needed: 900, available: 40, .. }), "{e}");
        assert_eq!((weights.place(), ledger.device_used()), (Place::Device, 900));
        weights.resize(30).unwrap();
        weights.move_to(Place::Host).unwrap();
        assert_eq!((ledger.used(), ledger.device_used(), ledger.device_peak()), (90, 0, 1000));
        drop((host, weights));
        assert_eq!((ledger.used(), ledger.device_used()), (0, 0));
    }

    #[test]
    fn without_a_device_pool_the_device_is_paid_for_from_the_one_budget() {
        // A CPU, or unified memory (Jetson): the device's bytes are host memory.
        let ledger = Ledger::new(100);
        let weights = ledger.reserve_in(Place::Device, 70, "weights").unwrap();
        assert_eq!((ledger.used(), ledger.device_used(), ledger.available_in(Place::Device)), (70, 70, 30));
        let e = ledger.reserve(31, "KV cache").unwrap_err();
        assert!(matches!(e, Error::OverBudget { needed: 31, available: 30, budget: 100, .. }), "{e}");
        assert_eq!(ledger.device_pool(), None);
        drop(weights);
        assert_eq!((ledger.used(), ledger.device_used()), (0, 0));
    }
}
