//! Earlier answers of every model and app, which the suffix drafter drafts from
//! ([`pocket_core::spec::History`]): answers to similar requests repeat across requests far
//! more than within one.
//!
//! A model's answers are kept apart by the client's hint (`prompt_cache_key`, else `user`):
//! a request with a hint drafts only from answers given under that hint, one without from
//! the answers given without one. A draft is only a guess that verification checks, but the
//! answers are data and stay with their owners.
//!
//! Each history is bounded in tokens ([`Limits::tokens`]); all of them together in bytes
//! ([`Limits::bytes`]), paid for in the budget in a ledger of their own drawn from it, and
//! they are the first thing given up when a request or a model needs the memory
//! ([`Histories::shrink`]): the oldest answers of the least recently used history first.
//! Answers enter when their request ends, never a cancelled one's. Given a directory
//! ([`Histories::with_dir`], beside the prompt cache's files) each history is also written
//! there by a thread of its own, checksummed, and read back when the daemon starts (`disk`).

mod disk;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use pocket_core::Token;
use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::{History, Recall};
use serde::{Deserialize, Serialize};

/// How much the histories may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tokens one history holds at most (prompt tails and separators included); past it the
    /// oldest answers go.
    pub tokens: usize,
    /// Bytes all histories hold at most together, whatever the budget leaves free.
    pub bytes: u64,
}

impl Default for Limits {
    /// 16,384 tokens a history (some hundred answers; about 3 MiB), 32 MiB in all.
    fn default() -> Self {
        Limits { tokens: 16_384, bytes: 32 << 20 }
    }
}

/// One history, as `/v1/status` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryInfo {
    /// The model file's fingerprint (its first 12 hex digits).
    pub model: String,
    /// The client's hint its answers were given under.
    pub hint: Option<String>,
    /// Answers held.
    pub answers: usize,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes held in the budget.
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    model: String,
    hint: Option<String>,
}

struct Slot {
    history: Arc<History>,
    learned: Recall,
    reservation: Option<Reservation>,
    last_used: u64,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<Key, Slot>,
    clock: u64,
}

/// The histories of every model and app, under one budget.
pub struct Histories {
    ledger: Ledger,
    limits: Limits,
    inner: Mutex<Inner>,
    /// Where they are written, if anywhere.
    disk: Option<disk::HistoryDir>,
}

impl std::fmt::Debug for Histories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histories").field("limits", &self.limits).field("bytes", &self.bytes()).finish()
    }
}

/// Bytes the histories in `slots` hold.
fn held(slots: &HashMap<Key, Slot>) -> u64 {
    slots.values().map(|s| s.history.bytes()).sum()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Whole-value updates only: a panic elsewhere cannot leave a slot half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Histories {
    /// Histories paid for in `budget` (in a ledger of their own drawn from it).
    pub fn new(budget: &Ledger, limits: Limits) -> Histories {
        Histories { ledger: budget.sub(), limits, inner: Mutex::new(Inner::default()), disk: None }
    }

    /// These histories, also written to `dir` (made if missing) as answers are added, and
    /// holding what was written there before: the most recently written first, each within
    /// the limits, as many as the budget has room for.
    pub fn with_dir(mut self, dir: PathBuf) -> Histories {
        self.disk = disk::HistoryDir::open(dir);
        let loaded = self.disk.as_ref().map(disk::HistoryDir::read_all).unwrap_or_default();
        let mut inner = lock(&self.inner);
        let (mut histories, mut answers) = (0, 0);
        for l in loaded {
            let mut history = l.history;
            history.keep_newest(self.limits.tokens);
            let bytes = history.bytes();
            if history.answers() == 0 || held(&inner.slots) + bytes > self.limits.bytes {
                continue;
            }
            let Ok(reservation) = self.ledger.reserve(bytes, "earlier answers for drafting") else {
                continue;
            };
            inner.clock += 1;
            answers += history.answers();
            histories += 1;
            let slot = Slot {
                history: Arc::new(history),
                learned: l.learned,
                reservation: Some(reservation),
                last_used: inner.clock,
            };
            inner.slots.insert(Key { model: l.model, hint: l.hint }, slot);
        }
        if histories > 0 {
            tracing::info!(histories, answers, "earlier answers read back for drafting");
        }
        drop(inner);
        self
    }

    /// The history of `model`'s answers under `hint`, and what drafting from it learned;
    /// `None` while it holds no answer.
    pub fn get(&self, model: &str, hint: Option<&str>) -> Option<(Arc<History>, Recall)> {
        let mut inner = lock(&self.inner);
        inner.clock += 1;
        let clock = inner.clock;
        let key = Key { model: model.to_owned(), hint: hint.map(str::to_owned) };
        let slot = inner.slots.get_mut(&key)?;
        slot.last_used = clock;
        Some((slot.history.clone(), slot.learned))
    }

    /// Adds `output`, the answer to `prompt`, to `model`'s history under `hint`, with what
    /// the request's drafts from it `learned`. The oldest answers go past the token limit,
    /// and the least recently used histories' past the byte limit or where the budget has
    /// no room; an answer that does not fit at all is not kept.
    pub fn add(
        &self,
        model: &str,
        hint: Option<&str>,
        prompt: &[Token],
        output: &[Token],
        learned: Option<Recall>,
    ) {
        if output.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        inner.clock += 1;
        let clock = inner.clock;
        let key = Key { model: model.to_owned(), hint: hint.map(str::to_owned) };
        let mut slot = inner.slots.remove(&key).unwrap_or_else(|| Slot {
            history: Arc::new(History::new()),
            learned: Recall::default(),
            reservation: None,
            last_used: clock,
        });
        // A request drafting from it holds the old one; it is copied then.
        let history = Arc::make_mut(&mut slot.history);
        history.push(prompt, output);
        history.keep_newest(self.limits.tokens);
        if let Some(learned) = learned {
            slot.learned = learned;
        }
        slot.last_used = clock;
        // Room for it: first the others, least recently used first, then its own oldest.
        let bytes = slot.history.bytes();
        while held(&inner.slots) + bytes > self.limits.bytes && Self::shrink_lru(&mut inner.slots) {}
        slot.reservation = None;
        loop {
            if slot.history.bytes() <= self.limits.bytes {
                let bytes = slot.history.bytes();
                match self.ledger.reserve(bytes, "earlier answers for drafting") {
                    Ok(r) => {
                        slot.reservation = Some(r);
                        break;
                    }
                    Err(_) if Self::shrink_lru(&mut inner.slots) => continue,
                    Err(_) => {}
                }
            }
            let history = Arc::make_mut(&mut slot.history);
            if history.answers() <= 1 || !history.keep_newest(history.tokens() / 2) {
                return; // nothing of it fits
            }
        }
        // Handed to the writer under the lock, so that a clear after this add finds it.
        if let Some(disk) = &self.disk {
            disk.write(model, hint, &slot.history, slot.learned);
        }
        inner.slots.insert(key, slot);
    }

    /// Halves the least recently used history (drops it when it holds one answer); whether
    /// anything was freed.
    fn shrink_lru(slots: &mut HashMap<Key, Slot>) -> bool {
        let Some(key) = slots.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| k.clone()) else {
            return false;
        };
        let slot = slots.get_mut(&key).expect("the key was just found");
        let history = Arc::make_mut(&mut slot.history);
        if history.answers() <= 1 || !history.keep_newest(history.tokens() / 2) {
            slots.remove(&key);
            return true;
        }
        let bytes = slot.history.bytes();
        if let Some(r) = &mut slot.reservation {
            // Smaller than it was: giving back cannot fail.
            let _ = r.resize(bytes);
        }
        true
    }

    /// Gives up memory for a request or a model, the first thing the budget's ladder gives
    /// up: halves the least recently used history; whether anything was freed.
    pub fn shrink(&self) -> bool {
        Self::shrink_lru(&mut lock(&self.inner).slots)
    }

    /// Forgets the answers given under `hint` (every model's), or all of them, also on disk;
    /// how many histories were dropped from memory.
    pub fn clear(&self, hint: Option<&str>) -> usize {
        let mut inner = lock(&self.inner);
        let before = inner.slots.len();
        match hint {
            Some(h) => inner.slots.retain(|k, _| k.hint.as_deref() != Some(h)),
            None => inner.slots.clear(),
        }
        if let Some(disk) = &self.disk {
            disk.remove(hint);
        }
        before - inner.slots.len()
    }

    /// Every history, most recently used first.
    pub fn list(&self) -> Vec<HistoryInfo> {
        let inner = lock(&self.inner);
        let mut slots: Vec<(&Key, &Slot)> = inner.slots.iter().collect();
        slots.sort_by_key(|(_, s)| std::cmp::Reverse(s.last_used));
        slots
            .into_iter()
            .map(|(k, s)| HistoryInfo {
                model: k.model.chars().take(12).collect(),
                hint: k.hint.clone(),
                answers: s.history.answers(),
                tokens: s.history.tokens(),
                bytes: s.reservation.as_ref().map_or(0, Reservation::bytes),
            })
            .collect()
    }

    /// Waits until every history is written to the directory (where there is one): for
    /// the daemon stopping.
    pub fn flush(&self) {
        if let Some(disk) = &self.disk {
            disk.flush();
        }
    }

    /// Bytes held in the budget.
    pub fn bytes(&self) -> u64 {
        self.ledger.used()
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(seed: u32, n: u32) -> Vec<Token> {
        (0..n).map(|i| seed * 1000 + i).collect()
    }

    #[test]
    fn answers_are_kept_apart_by_model_and_hint() {
        let h = Histories::new(&Ledger::unlimited(), Limits::default());
        assert!(h.get("m", None).is_none());
        h.add("m", Some("app-a"), &[1, 2], &answer(1, 10), None);
        h.add("m", None, &[1, 2], &answer(2, 10), None);
        h.add("other", Some("app-a"), &[1, 2], &answer(3, 10), None);
        let (a, _) = h.get("m", Some("app-a")).unwrap();
        assert_eq!(a.answers(), 1);
        assert!(h.get("m", Some("app-b")).is_none());
        assert_eq!(h.get("m", None).unwrap().0.answers(), 1);
        assert_eq!(h.list().len(), 3);
        assert_eq!(h.bytes(), h.list().iter().map(|i| i.bytes).sum::<u64>());
        // Clearing one hint leaves the rest.
        assert_eq!(h.clear(Some("app-a")), 2);
        assert_eq!(h.list().len(), 1);
        assert_eq!(h.clear(None), 1);
        assert_eq!(h.bytes(), 0);
        // An empty answer is not kept.
        h.add("m", None, &[1], &[], None);
        assert!(h.list().is_empty());
    }

    #[test]
    fn a_history_stays_within_its_tokens_and_all_within_their_bytes() {
        let limits = Limits { tokens: 500, bytes: 200_000 };
        let h = Histories::new(&Ledger::unlimited(), limits);
        for i in 0..1000 {
            h.add("m", Some(&format!("app-{}", i % 7)), &[1, 2, 3], &answer(i, 40), None);
            let list = h.list();
            assert!(list.iter().all(|s| s.tokens <= limits.tokens), "{list:?}");
            assert!(h.bytes() <= limits.bytes, "{} after {i}", h.bytes());
        }
        assert!(!h.list().is_empty());
    }

    #[test]
    fn histories_written_to_a_directory_are_read_back_and_cleared_there() {
        let dir = tempfile::tempdir().unwrap();
        let learned = Recall::from_counts([[3.0, 1.0]; 6]);
        {
            let h = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
            h.add("m", Some("app-a"), &[1, 2], &answer(1, 10), Some(learned));
            h.add("m", Some("app-a"), &[1, 2], &answer(2, 10), None);
            h.add("m", None, &[1, 2], &answer(3, 10), None);
            h.add("other", Some("app-b"), &[1, 2], &answer(4, 10), None);
        }
        let budget = Ledger::new(1 << 30);
        let h = Histories::new(&budget, Limits::default()).with_dir(dir.path().into());
        let (a, recall) = h.get("m", Some("app-a")).expect("read back");
        assert_eq!(a.answers(), 2);
        assert_eq!(recall.counts(), learned.counts());
        assert_eq!((h.list().len(), budget.used()), (3, h.bytes()));
        assert!(h.bytes() > 0);
        // A damaged file is skipped; the others still read.
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 3);
        let mut bytes = std::fs::read(&files[0]).unwrap();
        let at = bytes.len() - 100;
        bytes[at] ^= 0x01;
        std::fs::write(&files[0], bytes).unwrap();
        let again = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
        assert_eq!(again.list().len(), 2);
        // Clearing a hint deletes its file, whether or not the history is in memory.
        again.clear(Some("app-b"));
        h.clear(Some("app-a"));
        let left = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
        assert!(left.list().iter().all(|i| i.hint.is_none()), "{:?}", left.list());
        left.clear(None);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // A budget with no room reads nothing back, and loses nothing.
        h.add("m", None, &[1, 2], &answer(5, 10), None);
        h.flush();
        let none = Histories::new(&Ledger::new(100), Limits::default()).with_dir(dir.path().into());
        assert!(none.list().is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn the_latest_version_is_written_and_a_clear_leaves_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let files = || std::fs::read_dir(dir.path()).unwrap().count();
        let h = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
        // A burst of answers: the writer may skip versions, never the last.
        for i in 0..50 {
            h.add("m", Some("app"), &[1, 2], &answer(i, 30), None);
        }
        h.flush();
        let again = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
        assert_eq!(again.get("m", Some("app")).unwrap().0.answers(), 50);
        assert_eq!(files(), 1);
        // Cleared while its versions wait to be written: none of them is.
        for i in 0..50 {
            h.add("m", Some("app"), &[1, 2], &answer(i, 30), None);
            h.add("m", Some("other"), &[1, 2], &answer(i, 30), None);
        }
        h.clear(Some("app"));
        h.flush();
        let left = Histories::new(&Ledger::unlimited(), Limits::default()).with_dir(dir.path().into());
        assert_eq!(left.list().len(), 1, "{:?}", left.list());
        assert_eq!(left.list()[0].hint.as_deref(), Some("other"));
        assert_eq!(files(), 1);
        // Dropped with answers waiting: they are written first.
        h.add("m", None, &[1, 2], &answer(99, 30), None);
        drop(h);
        assert_eq!(files(), 2);
    }

    #[test]
    fn the_budget_bounds_them_and_shrinking_gives_memory_back() {
        let budget = Ledger::new(150_000);
        let h = Histories::new(&budget, Limits::default());
        for i in 0..200 {
            h.add("m", None, &[1], &answer(i, 50), None);
            assert!(budget.used() <= 150_000);
        }
        let held = budget.used();
        assert!(held > 0);
        assert!(h.shrink());
        assert!(budget.used() < held);
        while h.shrink() {}
        assert_eq!(budget.used(), 0);
        // A request drafting from a history keeps its copy while an answer is added.
        h.add("m", None, &[1], &answer(1, 20), None);
        let (held, _) = h.get("m", None).unwrap();
        h.add("m", None, &[1], &answer(2, 20), None);
        assert_eq!((held.answers(), h.get("m", None).unwrap().0.answers()), (1, 2));
    }
}
