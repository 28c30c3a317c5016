//! Models beyond one board: ggml's RPC backend, which lends a machine's device to peers.
//!
//! - [`serve`] runs ggml's RPC server over this machine's CPU or GPU, with the memory peers
//!   may take capped ([`ServeOptions::memory`]); `pocket rpc-serve` is its command.
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

static LINKS: Mutex<Vec<Arc<Link>>> = Mutex::new(Vec::new());
