//! Models beyond one board: ggml's RPC backend, which lends a machine's device to peers.
//!
//! - [`serve`] runs ggml's RPC server over this machine's CPU or GPU, with the memory peers
//!   may take capped ([`ServeOptions::memory`]); `pocket rpc-serve` is its command, and
//!   [`serve_on_loopback`] runs one in process (tests, benchmarks).
//! - [`SplitOptions`] (in [`LoadOptions::split`](crate::LoadOptions::split)) puts a model's
//!   last layers on peers: their weights, KV cache and ops live there.
//! - [`probe`] asks a server, in our own code, which protocol it speaks and what its devices
//!   offer, with timeouts: ggml's client aborts the process when a server is down or speaks
//!   another version, so nothing hands it a peer before the probe passed.
//! - [`Link`] stands between ggml's client and a peer for as long as a model uses it: it relays
//!   every request, and when the peer dies, stalls or turns out to speak another version it
//!   answers ggml itself with well-formed replies (so ggml never aborts) and records why
//!   ([`Link::lost`]), for the engine to turn that computation into an error.
//!
//! RPC has no authentication and no encryption: a server is reachable by whoever reaches its
//! port (docs/rpc.md says how to keep it on loopback, a WireGuard link or an SSH tunnel).

mod link;
mod wire;

use std::sync::{Arc, Mutex};

pub use crate::ffi::rpc::{ServeOptions, lent, protocol, serve, serve_device};
pub use crate::split::{RemoteLayers, SplitOptions};
pub use link::{Link, LinkOptions, LinkStats};
pub use wire::{Peer, PeerDevice, Version, probe};

/// The port ggml's `rpc-server` listens on by default, and ours.
pub const DEFAULT_PORT: u16 = 50052;

/// Lend this process's CPU (`memory` bytes to peers, computing on `threads` threads) on a free
/// loopback port, from a thread of its own, for as long as the process lives; returns its
/// `host:port` once it answers. For tests and benchmarks that need a peer in process (a process
/// lends one device: a second call fails).
pub fn serve_on_loopback(memory: u64, threads: usize) -> crate::Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| crate::Error::Rpc(format!("no free loopback port: {e}")))?
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let options = ServeOptions {
        endpoint: endpoint.clone(),
        device: crate::DeviceChoice::Cpu,
        memory,
        threads,
        cache_dir: None,
    };
    let server = std::thread::Builder::new()
        .name("rpc-serve".into())
        .spawn(move || serve(&options))
        .map_err(|e| crate::Error::Rpc(format!("cannot start the server's thread: {e}")))?;
    let mut last = None;
    for _ in 0..100 {
        if server.is_finished() {
            let why = server.join().ok().and_then(|r| r.err());
            return Err(why.unwrap_or_else(|| crate::Error::Rpc(format!("the server on {endpoint} stopped"))));
        }
        match probe(&endpoint, std::time::Duration::from_secs(1)) {
            Ok(_) => return Ok(endpoint),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Err(last.unwrap_or_else(|| crate::Error::Rpc(format!("the server on {endpoint} did not come up"))))
}

/// The link to `peer` (`host:port`): one per peer for the life of the process, so that a model
/// loaded again after its peer came back reaches it through the same endpoint (ggml keeps what
/// it learns about an endpoint, and a link must outlive every buffer ggml holds through it).
pub(crate) fn link_to(peer: &str) -> crate::Result<Arc<Link>> {
    let mut links = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(link) = links.iter().find(|l| l.peer() == peer) {
        return Ok(Arc::clone(link));
    }
    let link = Arc::new(Link::start(peer, LinkOptions::default())?);
    links.push(Arc::clone(&link));
    Ok(link)
}

/// The link to `peer`, if ggml holds a healthy connection through it now: the peer is then
/// known to be up and to speak our protocol, and cannot be probed (it serves that connection).
pub(crate) fn live_link(peer: &str) -> Option<Arc<Link>> {
    let links = LINKS.lock().unwrap_or_else(|e| e.into_inner());
    links.iter().find(|l| l.peer() == peer && l.connected() && l.lost().is_none()).cloned()
}

/// The links to peers this process has made (one per peer, kept for the process): what a
/// status shows of each, live.
pub fn links() -> Vec<Arc<Link>> {
    LINKS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static LINKS: Mutex<Vec<Arc<Link>>> = Mutex::new(Vec::new());
