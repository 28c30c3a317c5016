//! The open HTTP connections: who holds how many, the timeouts that close the slow and the
//! idle, and the caps past which a new connection is turned away.
//!
//! A connection is in one of three phases: *reading a head* (accepted, or bytes of a request
//! arrived, but no whole request yet), *busy* (a request is being answered — a generation may
//! stream for minutes, so no timeout applies) or *idle* (kept alive between requests). A
//! connection reading its head for longer than `header_timeout` or idle for longer than
//! `idle_timeout` is closed by [`Connections::sweep`].
//!
//! Caps, the way nginx drains keep-alive connections when it runs out: when a peer (a uid on
//! the Unix socket) is at its own cap, or all peers together at the overall cap, a new
//! connection first closes the oldest connection that is not busy — the same peer's, or the
//! biggest peer's — and is refused with a fast 503 only if every candidate is answering a
//! request. So a client that opens connections it never uses loses its own oldest ones, and
//! another peer always gets in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Who a connection belongs to, for the per-peer cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A process of this user, on the Unix socket.
    Uid(u32),
    /// Anyone on the loopback TCP listener (it carries no credentials).
    Tcp,
    /// A Unix peer whose credentials could not be read.
    Unknown,
}

/// The caps and timeouts, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all peers together.
    pub max: usize,
    /// Connections open at once from one peer.
    pub per_peer: usize,
    /// How long a request's head (and then its body) may take to arrive.
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
}

/// What one connection is doing, updated by its reader and its requests.
#[derive(Debug)]
pub struct Activity {
    clock: Instant,
    /// Requests being answered.
    busy: AtomicUsize,
    /// Not busy, and bytes of a request head have arrived (or nothing has, since the accept).
    reading: AtomicBool,
    /// Milliseconds on `clock` when the present phase began.
    since_ms: AtomicU64,
}

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Reading,
    Busy,
    Idle,
}

impl Activity {
    fn new(clock: Instant) -> Activity {
        let a = Activity {
            clock,
            busy: AtomicUsize::new(0),
            reading: AtomicBool::new(true),
            since_ms: AtomicU64::new(0),
        };
        a.since_ms.store(a.now_ms(), Ordering::Relaxed);
        a
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// Bytes came in: between requests, that begins the next request's head.
    pub fn read_some(&self) {
        if self.busy.load(Ordering::Relaxed) == 0 && !self.reading.swap(true, Ordering::Relaxed) {
            self.since_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// A request's head was read; the connection is busy until the guard is dropped (when
    /// the response body has been sent, or the request was abandoned).
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.reading.store(false, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    fn phase(&self) -> (Phase, u64) {
        let since = self.since_ms.load(Ordering::Relaxed);
        if self.busy.load(Ordering::Relaxed) > 0 {
            (Phase::Busy, since)
        } else if self.reading.load(Ordering::Relaxed) {
            (Phase::Reading, since)
        } else {
            (Phase::Idle, since)
        }
    }
}

/// A request being answered on a connection.
#[derive(Debug)]
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.since_ms.store(self.0.now_ms(), Ordering::Relaxed);
        }
    }
}

struct Open {
    peer: PeerKey,
    activity: Arc<Activity>,
    close: Arc<Notify>,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Open>,
    per_peer: HashMap<PeerKey, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Open> {
        let open = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&open.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&open.peer);
            }
        }
        Some(open)
    }

    /// Take connection `id` off and tell its task to close it now; whether it was on.
    fn close(&mut self, id: u64) -> bool {
        self.remove(id).map(|o| o.close.notify_one()).is_some()
    }

    /// The connection of `peer` (any peer's, when `None`) that has waited longest without
    /// a request in progress.
    fn oldest_unbusy(&self, peer: Option<PeerKey>) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, o)| peer.is_none_or(|p| o.peer == p))
            .filter_map(|(id, o)| match o.activity.phase() {
                (Phase::Busy, _) => None,
                (_, since) => Some((since, *id)),
            })
            .min()
            .map(|(_, id)| id)
    }

    fn biggest_peer(&self) -> Option<PeerKey> {
        self.per_peer.iter().max_by_key(|(_, n)| **n).map(|(p, _)| *p)
    }
}

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The peer holds its cap of connections, each answering a request.
    PeerCap(usize),
    /// All peers together hold the cap, each connection answering a request.
    Cap(usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::PeerCap(n) => write!(
                f,
                "this client already has {n} connections open, each with a request in progress \
                 (max_connections_per_peer); retry when one has finished"
            ),
            Refusal::Cap(n) => write!(
                f,
                "pocketd has {n} connections open, each with a request in progress (max_connections); \
                 retry later"
            ),
        }
    }
}

/// Counters since start, for `/v1/status` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Open now.
    pub open: usize,
    /// Accepted since start.
    pub accepted: u64,
    /// Turned away with a 503.
    pub refused: u64,
    /// Closed to make room for a newer connection.
    pub evicted: u64,
    /// Closed by the head or idle timeout.
    pub timed_out: u64,
}

/// The open connections of every listener.
pub struct Connections {
    limits: Limits,
    clock: Instant,
    table: Mutex<Table>,
    accepted: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    timed_out: AtomicU64,
}

/// An admitted connection; dropping it takes it off the table.
pub struct Admitted {
    id: u64,
    connections: Arc<Connections>,
    /// What the connection is doing.
    pub activity: Arc<Activity>,
    /// Notified when the connection must close now (evicted or timed out).
    pub close: Arc<Notify>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.lock().remove(self.id);
    }
}

impl Connections {
    /// An empty table under `limits`.
    pub fn new(limits: Limits) -> Arc<Connections> {
        Arc::new(Connections {
            limits,
            clock: Instant::now(),
            table: Mutex::default(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caps and timeouts.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Take a new connection from `peer`, closing an older one that is not busy if a cap is
    /// reached; refused if every candidate is busy.
    pub fn admit(self: &Arc<Self>, peer: PeerKey) -> Result<Admitted, Refusal> {
        let mut table = self.lock();
        let mine = table.per_peer.get(&peer).copied().unwrap_or(0);
        let make_room = if mine >= self.limits.per_peer {
            Some(table.oldest_unbusy(Some(peer)).ok_or(Refusal::PeerCap(self.limits.per_peer)))
        } else if table.open.len() >= self.limits.max {
            let victim = table
                .biggest_peer()
                .and_then(|p| table.oldest_unbusy(Some(p)))
                .or_else(|| table.oldest_unbusy(None));
            Some(victim.ok_or(Refusal::Cap(self.limits.max)))
        } else {
            None
        };
        match make_room {
            Some(Err(refusal)) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(refusal);
            }
            Some(Ok(victim)) => {
                self.evicted.fetch_add(u64::from(table.close(victim)), Ordering::Relaxed);
            }
            None => {}
        }
        let id = table.next;
        table.next += 1;
        let activity = Arc::new(Activity::new(self.clock));
        let close = Arc::new(Notify::new());
        table.open.insert(id, Open { peer, activity: activity.clone(), close: close.clone() });
        *table.per_peer.entry(peer).or_default() += 1;
        self.accepted.fetch_add(1, Ordering::Relaxed);
        Ok(Admitted { id, connections: self.clone(), activity, close })
    }

    /// Close the connection that has waited longest without a request (to free a file
    /// descriptor when `accept` ran out); whether there was one.
    pub fn evict_oldest(&self) -> bool {
        let mut table = self.lock();
        let Some(victim) = table.oldest_unbusy(None) else { return false };
        if table.close(victim) {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Close the connections past their head or idle timeout; how many.
    pub fn sweep(&self) -> usize {
        let now = self.clock.elapsed().as_millis() as u64;
        let head = self.limits.header_timeout.as_millis() as u64;
        let idle = self.limits.idle_timeout.as_millis() as u64;
        let mut table = self.lock();
        let expired: Vec<u64> = table
            .open
            .iter()
            .filter(|(_, o)| match o.activity.phase() {
                (Phase::Busy, _) => false,
                (Phase::Reading, since) => now.saturating_sub(since) >= head,
                (Phase::Idle, since) => now.saturating_sub(since) >= idle,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            table.close(*id);
        }
        self.timed_out.fetch_add(expired.len() as u64, Ordering::Relaxed);
        expired.len()
    }

    /// Close every connection not answering a request (at shutdown).
    pub fn close_unbusy(&self) {
        let mut table = self.lock();
        let ids: Vec<u64> = table
            .open
            .iter()
            .filter(|(_, o)| o.activity.phase().0 != Phase::Busy)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            table.close(id);
        }
    }

    /// Counters now.
    pub fn counts(&self) -> Counts {
        Counts {
            open: self.lock().open.len(),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
        }
    }
}

/// Raise this process's soft limit on open files to its hard limit (systemd gives services
/// 1024 soft unless the unit says otherwise); returns the soft limit now in force.
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (limit.current, limit.maximum) else {
        return u64::MAX; // unlimited
    };
    let target = hard.unwrap_or(u64::MAX);
    if target <= soft {
        return soft;
    }
    let raised = rustix::process::Rlimit { current: Some(target), maximum: hard };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::debug!(from = soft, to = target, "raised the open files limit");
            target
        }
        Err(e) => {
            tracing::warn!("cannot raise the open files limit from {soft} to {target}: {e}");
            soft
        }
    }
}

/// File descriptors kept for everything but client connections: D-Bus, model and cache
/// files, the journal, the listeners.
pub const RESERVED_FDS: u64 = 128;

/// `configured` connections, lowered to stay under the open files limit `fd_limit`.
pub fn cap_under_fd_limit(configured: usize, fd_limit: u64) -> usize {
    let room = fd_limit.saturating_sub(RESERVED_FDS).max(1);
    configured.min(usize::try_from(room).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per_peer: usize) -> Limits {
        Limits {
            max,
            per_peer,
            header_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(400),
        }
    }

    #[test]
    fn a_peer_at_its_cap_loses_its_oldest_unbusy_connection_and_is_refused_when_all_are_busy() {
        let c = Connections::new(limits(10, 2));
        let a = c.admit(PeerKey::Uid(1)).unwrap();
        let b = c.admit(PeerKey::Uid(1)).unwrap();
        let _busy_b = b.activity.begin_request();
        // The third evicts the first (the only one not busy).
        let third = c.admit(PeerKey::Uid(1)).unwrap();
        assert_eq!(c.counts().evicted, 1);
        assert_eq!(c.counts().open, 2);
        drop(a); // its task ends after the eviction: nothing more to remove
        assert_eq!(c.counts().open, 2);
        let _busy_third = third.activity.begin_request();
        assert_eq!(c.admit(PeerKey::Uid(1)).err(), Some(Refusal::PeerCap(2)));
        // Another peer is not affected.
        assert!(c.admit(PeerKey::Uid(2)).is_ok());
        assert_eq!(c.counts().refused, 1);
    }

    #[test]
    fn at_the_overall_cap_the_biggest_peer_gives_way() {
        let c = Connections::new(limits(3, 3));
        let hog: Vec<_> = (0..3).map(|_| c.admit(PeerKey::Uid(1)).unwrap()).collect();
        let other = c.admit(PeerKey::Uid(2)).unwrap();
        assert_eq!(c.counts().open, 3);
        assert_eq!(c.counts().evicted, 1);
        let _busy = other.activity.begin_request();
        // Uid 1 now holds two; a newcomer from uid 3 takes another of uid 1's.
        let _third = c.admit(PeerKey::Uid(3)).unwrap();
        assert_eq!(c.counts().evicted, 2);
        drop(hog);
        assert_eq!(c.counts().open, 2);
    }

    #[test]
    fn heads_and_idle_connections_time_out_but_busy_ones_do_not() {
        let c = Connections::new(limits(10, 10));
        let slow = c.admit(PeerKey::Uid(1)).unwrap();
        let working = c.admit(PeerKey::Uid(1)).unwrap();
        let request = working.activity.begin_request();
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.sweep(), 1, "the head that never came is past its 200 ms");
        let _ = slow;
        drop(request); // answered: now idle, with 400 ms to send another request
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.sweep(), 0);
        working.activity.read_some(); // the next head starts: 200 ms from now
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(c.sweep(), 1);
        assert_eq!(c.counts().timed_out, 2);
        assert_eq!(c.counts().open, 0);
    }

    #[test]
    fn the_cap_stays_under_the_open_files_limit() {
        assert_eq!(cap_under_fd_limit(512, 1024), 512);
        assert_eq!(cap_under_fd_limit(512, 256), 128);
        assert_eq!(cap_under_fd_limit(512, 10), 1);
        assert!(raise_open_files_limit() >= 64);
    }
}
