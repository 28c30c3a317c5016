//! The prompt cache: finished sessions are parked, not dropped, and the next request for the
//! same model adopts the one with the longest common token prefix, so a chat that sends its
//! whole history every turn prefills only what is new.
//!
//! A parked session is its state copied out of the engine ([`pocket_core::Session::save`]: the
//! KV cache of its tokens, without the compute buffers a live session holds) and its tokens.
//! It is paid for in the budget like anything else, in a ledger of its own drawn from the
//! budget, and it is the first thing given up when a request, a model or another parked
//! session needs the memory: least recently used first. A request reads the state into a new
//! session of its own plan ([`pocket_core::Session::restore`]), so two requests may adopt the
//! same prefix at once, and the parked one stays for the next.
//!
//! Parked state is only ever restored under the key it was saved under: the model's
//! [`CacheKey`] (its files, device, kernels and weight format), the threads and the KV type.
//! With a directory ([`DiskOptions`]) it outlives the model: when a model unloads (or the
//! daemon stops) its parked prefixes are written there, checksummed, and read back when a
//! request's prefix matches one ([`disk`]).

mod disk;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::{CacheKey, KvType, SavedState, Session, Token};
use serde::{Deserialize, Serialize};

use disk::Disk;
pub use disk::DiskOptions;

/// What parked state is kept under: only a session with the same key may restore it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrefixKey {
    /// The model: its files, device, kernels and weight format.
    pub model: CacheKey,
    /// CPU threads of the passes that computed it (ggml may split work by threads).
    pub threads: usize,
    /// Its KV type.
    pub kv: KvType,
    /// The state is an encoder's output for a whole source: only the same source may use it
    /// (a decoder's state serves any prompt it is a prefix of).
    #[serde(default)]
    pub whole: bool,
}

impl PrefixKey {
    /// How many of `tokens` a state saved for `saved` gives a request: the common prefix,
    /// leaving the last token to decode (whose logits the request needs); a whole source's
    /// state gives all or nothing.
    fn usable(&self, saved: &[Token], tokens: &[Token]) -> usize {
        if self.whole {
            return if saved == tokens { tokens.len() } else { 0 };
        }
        common_prefix(saved, tokens).min(tokens.len().saturating_sub(1))
    }
}

/// A parked session's state, with its bytes reserved in the budget for as long as it lives
/// (while a request restores from it, even if it was evicted meanwhile).
#[derive(Debug)]
pub struct Parked {
    /// The state.
    pub saved: SavedState,
    _reservation: Reservation,
}

/// A request's match: the parked state and how many of the request's first tokens it holds.
#[derive(Debug, Clone)]
pub struct Adoption {
    /// The parked state to restore from.
    pub parked: Arc<Parked>,
    /// Tokens it gives the request (at least 1, fewer than the request's prompt).
    pub len: usize,
}

/// One parked prefix, as `/v1/status` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParkedInfo {
    /// The model file's fingerprint (its first 12 hex digits).
    pub model: String,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes held in the budget.
    pub bytes: u64,
    /// Its KV type.
    pub kv: KvType,
    /// The client's hint it was parked under (`prompt_cache_key` or `user`).
    pub hint: Option<String>,
    /// Seconds since it was parked or last adopted.
    pub idle_seconds: f64,
}

/// Counters since the cache was made, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Requests that adopted a parked prefix.
    pub hits: u64,
    /// Requests that found none.
    pub misses: u64,
    /// Prompt tokens not prefilled because a parked prefix held them.
    pub reused_tokens: u64,
    /// Parked prefixes given up for memory (or past the entry limit).
    pub evictions: u64,
    /// Sessions parked.
    pub parked: u64,
    /// Prefixes written to disk.
    pub written: u64,
    /// Prefixes read back from disk.
    pub read: u64,
    /// Files on disk that were ignored (corrupt, foreign or stale) or failed to write.
    pub disk_errors: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    reused_tokens: AtomicU64,
    evictions: AtomicU64,
    parked: AtomicU64,
}

struct Entry {
    key: PrefixKey,
    hint: Option<String>,
    parked: Arc<Parked>,
    last_used: Instant,
}

/// Parked sessions of every model, under one budget.
pub struct PromptCache {
    ledger: Ledger,
    max_entries: usize,
    entries: Mutex<Vec<Entry>>,
    disk: Option<Disk>,
    counters: Counters,
}

impl std::fmt::Debug for PromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptCache")
            .field("parked", &lock(&self.entries).len())
            .field("bytes", &self.bytes())
            .field("disk", &self.disk.as_ref().map(|d| d.dir().to_path_buf()))
            .finish()
    }
}

/// Parked prefixes kept in memory at most, whatever the budget leaves free.
pub const DEFAULT_MAX_ENTRIES: usize = 32;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain pushes and removals: a panic elsewhere cannot leave the list half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[Token], b: &[Token]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCache {
    /// A cache whose parked state is paid for in `budget` (in a ledger of its own drawn from
    /// it), written to and read from `disk` where given.
    pub fn new(budget: &Ledger, disk: Option<DiskOptions>) -> PromptCache {
        PromptCache {
            ledger: budget.sub(),
            max_entries: DEFAULT_MAX_ENTRIES,
            entries: Mutex::new(Vec::new()),
            disk: disk.map(Disk::open),
            counters: Counters::default(),
        }
    }

    /// The parked prefix sharing the longest prefix with `tokens` under `key` (only those
    /// parked with the same `hint` when one is given), in memory or on disk; `None` when none
    /// shares a token. The match leaves at least the last token to decode, whose logits the
    /// request needs.
    pub fn adopt(&self, key: &PrefixKey, tokens: &[Token], hint: Option<&str>) -> Option<Adoption> {
        let eligible = |k: &PrefixKey, h: Option<&str>| k == key && (hint.is_none() || h == hint);
        let in_memory = {
            let mut entries = lock(&self.entries);
            let best = entries
                .iter_mut()
                .filter(|e| eligible(&e.key, e.hint.as_deref()))
                .map(|e| (key.usable(&e.parked.saved.tokens, tokens), e))
                .filter(|(n, _)| *n > 0)
                .max_by_key(|(n, e)| (*n, e.last_used));
            best.map(|(len, e)| {
                e.last_used = Instant::now();
                Adoption { parked: e.parked.clone(), len }
            })
        };
        let from_disk = self.disk.as_ref().and_then(|disk| {
            let better_than = in_memory.as_ref().map_or(0, |a| a.len);
            let (file, len) = disk.best(&eligible, &|saved| key.usable(saved, tokens), better_than)?;
            let parked = self.read_back(disk, &file)?;
            Some(Adoption { parked, len })
        });
        from_disk.or(in_memory)
    }

    /// Count a request that used the cache: `reused` of its prompt tokens came from a parked
    /// prefix (0: a miss). Counted when the session is restored, not when a plan is tried.
    pub fn record(&self, reused: usize) {
        let c = &self.counters;
        if reused > 0 {
            c.hits.fetch_add(1, Ordering::Relaxed);
            c.reused_tokens.fetch_add(reused as u64, Ordering::Relaxed);
        } else {
            c.misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Read a file back from disk into memory (paying for it first), as a parked entry.
    fn read_back(&self, disk: &Disk, file: &disk::FileEntry) -> Option<Arc<Parked>> {
        let bytes = file.bytes;
        let reservation = self.reserve(bytes, "a prefix read back from disk", None)?;
        let saved = disk.read(file)?;
        let parked = Arc::new(Parked { saved, _reservation: reservation });
        self.insert(file.key.clone(), file.hint.clone(), parked.clone());
        Some(parked)
    }

    /// Reserve `bytes`, giving up parked prefixes (least recently used first, never `keep`)
    /// until they fit; `None` when they cannot.
    fn reserve(&self, bytes: u64, what: &str, keep: Option<&Arc<Parked>>) -> Option<Reservation> {
        // What giving up every parked prefix would leave free: past it, give none up.
        if bytes > self.ledger.available().saturating_add(self.ledger.used()) {
            return None;
        }
        loop {
            match self.ledger.reserve(bytes, what) {
                Ok(r) => return Some(r),
                Err(_) if self.evict_lru(keep) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Park `saved` (a finished session's state) under `key`: paid for in the budget, making
    /// room by giving up older parked prefixes, and not parked when it still does not fit.
    /// Parked prefixes it extends are dropped: it holds everything they did.
    pub fn park(&self, key: PrefixKey, saved: SavedState, hint: Option<String>) {
        self.supersede(&key, hint.as_deref(), &saved.tokens);
        let Some(reservation) = self.reserve(saved.bytes(), "a parked prefix", None) else {
            tracing::debug!(tokens = saved.tokens.len(), bytes = saved.bytes(), "not parked: no room");
            return;
        };
        self.counters.parked.fetch_add(1, Ordering::Relaxed);
        self.insert(key, hint, Arc::new(Parked { saved, _reservation: reservation }));
    }

    /// [`PromptCache::park`] the state of `session`, paying for the copy before it is made.
    pub fn park_session(
        &self,
        key: PrefixKey,
        hint: Option<String>,
        session: &dyn Session,
    ) -> pocket_core::Result<()> {
        if session.is_empty() {
            return Ok(());
        }
        self.supersede(&key, hint.as_deref(), session.tokens());
        // At most what the cache holds for its tokens, and the tokens.
        let most = session.kv_bytes() + (session.len() * size_of::<Token>()) as u64;
        let Some(mut reservation) = self.reserve(most, "a parked prefix", None) else {
            tracing::debug!(tokens = session.len(), bytes = most, "not parked: no room");
            return Ok(());
        };
        let Some(saved) = session.save()? else { return Ok(()) };
        if saved.tokens.is_empty() {
            return Ok(());
        }
        reservation.resize(saved.bytes())?;
        self.counters.parked.fetch_add(1, Ordering::Relaxed);
        self.insert(key, hint, Arc::new(Parked { saved, _reservation: reservation }));
        Ok(())
    }

    /// Drop the parked prefixes under `key` and `hint` that `tokens` extend: a session holding
    /// `tokens` holds everything they do.
    fn supersede(&self, key: &PrefixKey, hint: Option<&str>, tokens: &[Token]) {
        lock(&self.entries).retain(|e| {
            let saved = &e.parked.saved.tokens;
            let superseded = &e.key == key
                && e.hint.as_deref() == hint
                && if key.whole { saved == tokens } else { tokens.starts_with(saved) };
            !superseded
        });
    }

    fn insert(&self, key: PrefixKey, hint: Option<String>, parked: Arc<Parked>) {
        let mut entries = lock(&self.entries);
        entries.push(Entry { key, hint, parked, last_used: Instant::now() });
        while entries.len() > self.max_entries {
            let oldest = entries.iter().enumerate().min_by_key(|(_, e)| e.last_used).map(|(i, _)| i);
            if let Some(i) = oldest {
                entries.remove(i);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Give up the least recently used parked prefix that no request is restoring from (and
    /// that is not `keep`), returning its memory to the budget. Returns whether one was.
    pub fn evict_lru(&self, keep: Option<&Arc<Parked>>) -> bool {
        let mut entries = lock(&self.entries);
        let victim = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| Arc::strong_count(&e.parked) == 1)
            .filter(|(_, e)| keep.is_none_or(|k| !Arc::ptr_eq(k, &e.parked)))
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i);
        let Some(i) = victim else { return false };
        let gone = entries.remove(i);
        drop(entries);
        self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            tokens = gone.parked.saved.tokens.len(),
            bytes = gone.parked.saved.bytes(),
            "parked prefix evicted"
        );
        true
    }

    /// The model of `key` is unloading: write its parked prefixes to disk (where there is a
    /// directory) and give their memory back.
    pub fn unload(&self, model: &CacheKey) {
        let gone: Vec<Entry> = {
            let mut entries = lock(&self.entries);
            let (gone, kept) = std::mem::take(&mut *entries).into_iter().partition(|e| &e.key.model == model);
            *entries = kept;
            gone
        };
        self.write(&gone);
    }

    /// Write every parked prefix to disk (where there is a directory), keeping them parked: at
    /// shutdown.
    pub fn flush(&self) {
        let all: Vec<(PrefixKey, Option<String>, Arc<Parked>)> =
            lock(&self.entries).iter().map(|e| (e.key.clone(), e.hint.clone(), e.parked.clone())).collect();
        if let Some(disk) = &self.disk {
            for (key, hint, parked) in &all {
                disk.write(key, hint.as_deref(), &parked.saved);
            }
        }
    }

    fn write(&self, entries: &[Entry]) {
        if let Some(disk) = &self.disk {
            for e in entries {
                disk.write(&e.key, e.hint.as_deref(), &e.parked.saved);
            }
        }
    }

    /// The parked prefixes, most recently used first.
    pub fn parked(&self) -> Vec<ParkedInfo> {
        let entries = lock(&self.entries);
        let mut out: Vec<_> = entries
            .iter()
            .map(|e| ParkedInfo {
                model: e.key.model.fingerprint.chars().take(12).collect(),
                tokens: e.parked.saved.tokens.len(),
                bytes: e.parked.saved.bytes(),
                kv: e.key.kv,
                hint: e.hint.clone(),
                idle_seconds: e.last_used.elapsed().as_secs_f64(),
            })
            .collect();
        out.sort_by(|a, b| a.idle_seconds.total_cmp(&b.idle_seconds));
        out
    }

    /// Bytes the parked prefixes hold in the budget.
    pub fn bytes(&self) -> u64 {
        self.ledger.used()
    }

    /// Counters since the cache was made.
    pub fn stats(&self) -> CacheStats {
        let c = &self.counters;
        let (written, read, disk_errors) = self.disk.as_ref().map_or((0, 0, 0), Disk::counts);
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            reused_tokens: c.reused_tokens.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            parked: c.parked.load(Ordering::Relaxed),
            written,
            read,
            disk_errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of one made-up model, two threads and `kv`, for the tests here and in `disk`.
    pub(super) fn key(kv: KvType) -> PrefixKey {
        PrefixKey {
            model: CacheKey {
                fingerprint: "f00d".into(),
                device: "CPU".into(),
                kernels: "ggml".into(),
                weights: "stored".into(),
            },
            threads: 2,
            kv,
            whole: false,
        }
    }

    fn saved(tokens: &[Token], bytes: usize) -> SavedState {
        SavedState { tokens: tokens.to_vec(), kv: KvType::F16, data: vec![7; bytes] }
    }

    #[test]
    fn the_longest_common_prefix_is_adopted_leaving_a_token_to_decode() {
        let cache = PromptCache::new(&Ledger::unlimited(), None);
        let k = key(KvType::F16);
        cache.park(k.clone(), saved(&[1, 2, 3], 10), None);
        cache.park(k.clone(), saved(&[1, 2, 9, 9, 9], 10), None);
        cache.record(4);
        cache.record(0);
        let a = cache.adopt(&k, &[1, 2, 9, 9, 4], None).unwrap();
        assert_eq!((a.len, a.parked.saved.tokens.len()), (4, 5));
        // The whole prompt matches: the last token is left to decode.
        let a = cache.adopt(&k, &[1, 2, 3], None).unwrap();
        assert_eq!(a.len, 2);
        assert!(cache.adopt(&k, &[5, 6], None).is_none());
        assert!(cache.adopt(&key(KvType::Q8_0), &[1, 2, 3, 4], None).is_none(), "another KV type");
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.reused_tokens), (1, 1, 4));
    }

    #[test]
    fn a_hint_narrows_the_match_and_a_longer_session_supersedes_its_prefix() {
        let cache = PromptCache::new(&Ledger::unlimited(), None);
        let k = key(KvType::F16);
        cache.park(k.clone(), saved(&[1, 2, 3], 10), Some("alice".into()));
        assert!(cache.adopt(&k, &[1, 2, 3, 4], Some("bob")).is_none());
        assert_eq!(cache.adopt(&k, &[1, 2, 3, 4], Some("alice")).unwrap().len, 3);
        assert_eq!(cache.adopt(&k, &[1, 2, 3, 4], None).unwrap().len, 3);
        cache.park(k.clone(), saved(&[1, 2, 3, 4, 5], 10), Some("alice".into()));
        assert_eq!(cache.parked().len(), 1, "the longer one holds everything the shorter did");
    }

    #[test]
    fn parked_state_is_paid_for_and_given_up_least_recently_used_first() {
        let budget = Ledger::new(1000);
        let cache = PromptCache::new(&budget, None);
        let k = key(KvType::F16);
        cache.park(k.clone(), saved(&[1, 1], 392), None); // 400 bytes with its tokens
        cache.park(k.clone(), saved(&[2, 2], 392), None);
        assert_eq!(budget.used(), 800);
        // Using the first makes the second the least recently used.
        assert!(cache.adopt(&k, &[1, 1, 5], None).is_some());
        cache.park(k.clone(), saved(&[3, 3], 392), None);
        assert_eq!(budget.used(), 800);
        assert!(cache.adopt(&k, &[2, 2, 5], None).is_none(), "the second was given up");
        assert_eq!(cache.stats().evictions, 1);
        // Held by a request, a prefix is not given up: its memory would not come back.
        let held = cache.adopt(&k, &[1, 1, 5], None).unwrap();
        assert!(cache.evict_lru(None));
        assert!(!cache.evict_lru(None));
        assert_eq!(budget.used(), 400);
        drop(held);
        // Too large for the whole budget: not parked, nothing else lost.
        cache.park(k.clone(), saved(&[4], 5000), None);
        assert_eq!(cache.parked().len(), 1);
        cache.unload(&k.model);
        assert_eq!((cache.parked().len(), budget.used()), (0, 0));
    }
}
