//! A fail-soft relay between ggml's RPC client and a peer.
//!
//! ggml's client aborts the process when its server is unreachable, closes the connection,
//! answers with the wrong size or speaks another protocol, and waits forever on a silent one.
//! A [`Link`] stands between them: it listens on loopback, ggml's client is given
//! [`Link::local_endpoint`] instead of the peer, and each connection ggml opens is relayed
//! frame by frame over a fresh connection to the peer (requests streamed in chunks, replies read
//! whole, within a timeout and at exactly the size ggml expects, before ggml sees them). When the
//! peer fails, the link records why ([`Link::lost`]) and answers every further request on that
//! connection itself with a well-formed reply of the size ggml expects, so ggml never aborts; the
//! engine turns the garbage result of that computation into an error. The loss lasts until ggml
//! closes the connection (when its last buffer for the endpoint is freed); the next connection
//! tries the peer afresh.
//!
//! Protocol 7.0.0 (`ggml-rpc.cpp`): a request is `| command u8 | size u64 | payload |`, a reply
//! `| size u64 | payload |`, little-endian; which commands have a reply, and of what size, is
//! [`reply_size`].

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::Version;
use crate::error::{Error, Result};

/// `enum rpc_cmd`, as far as the link treats a command specially.
const ALLOC_BUFFER: u8 = 0;
const GET_ALIGNMENT: u8 = 1;
const GET_MAX_SIZE: u8 = 2;
const BUFFER_GET_BASE: u8 = 3;
const SET_TENSOR_HASH: u8 = 7;
const GET_TENSOR: u8 = 8;
const COPY_TENSOR: u8 = 9;
const GET_DEVICE_MEMORY: u8 = 11;
const GET_ALLOC_SIZE: u8 = 13;
const HELLO: u8 = 14;
const DEVICE_COUNT: u8 = 15;
/// Commands 0..=17 travel; 18 (`RPC_CMD_NONE`) is the client's internal marker, never sent.
const COMMANDS: u8 = 18;
/// `RPC_CONN_CAPS_SIZE`: transport capabilities in HELLO; all zero is plain TCP.
const CONN_CAPS: usize = 24;
/// `sizeof(rpc_tensor)` (packed): id u64 @0, type u32 @8, buffer u64 @12, ne[4] u32 @20,
/// nb[4] u32 @36, op u32 @52, op_params[16] i32 @56, flags i32 @120, src[10] u64 @124,
/// view_src u64 @204, view_offs u64 @212, data u64 @220, name[64] @228, use_count i32 @292.
const RPC_TENSOR: usize = 296;
/// `rpc_msg_get_alloc_size_req` is `device u32 | tensor | srcs[10]`: the tensor's ne[3] and nb[3].
const ALLOC_SIZE_NE3: usize = 4 + 20 + 12;
const ALLOC_SIZE_NB3: usize = 4 + 36 + 12;
/// How much of a request is kept for fabricating its reply (GET_ALLOC_SIZE's is the largest
/// that matters, 4 + 11 * 296 bytes), and the chunk large payloads are streamed in.
const KEEP: usize = 4096;
const CHUNK: usize = 1 << 20;

/// Timeouts of a [`Link`].
#[derive(Debug, Clone, Copy)]
pub struct LinkOptions {
    /// How long connecting to the peer may take.
    pub connect_timeout: Duration,
    /// How long the peer may take to answer (or to accept a write). A graph's computation has
    /// no reply: the next request with one (reading the result) waits for it, so this bounds
    /// a whole computation too.
    pub reply_timeout: Duration,
}

impl Default for LinkOptions {
    fn default() -> LinkOptions {
        LinkOptions { connect_timeout: Duration::from_secs(3), reply_timeout: Duration::from_secs(30) }
    }
}

/// What a [`Link`] has carried so far, all connections together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Requests ggml sent to the link.
    pub requests: u64,
    /// Bytes written to the peer.
    pub bytes_to_peer: u64,
    /// Bytes read from the peer.
    pub bytes_from_peer: u64,
    /// The shortest round trip (request sent to reply header read) of a small reply.
    pub round_trip_min: Option<Duration>,
    /// The latest such round trip.
    pub round_trip_last: Option<Duration>,
}

/// A relay from a loopback port to an RPC peer that never lets ggml's client abort (see the
/// module's comment). Dropping it stops serving: drop it only once ggml holds no buffer or
/// backend of [`local_endpoint`](Link::local_endpoint), or ggml's next request aborts.
pub struct Link {
    local: String,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    peer: String,
    options: LinkOptions,
    ours: Version,
    stop: AtomicBool,
    generation: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lost: Option<String>,
    /// The peer's device count when last asked; told to ggml when the peer cannot be.
    device_count: Option<u32>,
    stats: LinkStats,
    /// The sockets of the connection being served, shut down by [`Link`]'s drop.
    open: Vec<TcpStream>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Keep `sock` to shut it down on drop; false when the link is stopping.
    fn register(&self, sock: &TcpStream) -> bool {
        let mut state = self.state();
        // `stop` is set before drop takes the lock: a socket registered after it is seen here.
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        sock.try_clone().map(|s| state.open.push(s)).is_ok()
    }
}

impl Link {
    /// Listen on a free loopback port and relay what ggml sends there to `peer` (`host:port`).
    pub fn start(peer: &str, options: LinkOptions) -> Result<Link> {
        let ours: Version =
            super::protocol().ok_or_else(|| Error::Rpc("this build has no RPC backend".into()))?.parse()?;
        let io = |e: io::Error| Error::Rpc(format!("link to {peer}: cannot listen on loopback: {e}"));
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
        // Polled, so that drop can stop the thread.
        listener.set_nonblocking(true).map_err(io)?;
        let local = listener.local_addr().map_err(io)?.to_string();
        let shared = Arc::new(Shared {
            peer: peer.to_owned(),
            options,
            ours,
            stop: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("rpc-link".into())
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(|e| Error::Rpc(format!("link to {peer}: cannot start its thread: {e}")))?
        };
        Ok(Link { local, shared, accept: Some(accept) })
    }

    /// `127.0.0.1:PORT`: the endpoint to give ggml's client.
    pub fn local_endpoint(&self) -> &str {
        &self.local
    }

    /// The peer relayed to, as given.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// Why the current (or last) connection lost the peer; none while it is healthy.
    pub fn lost(&self) -> Option<String> {
        self.shared.state().lost.clone()
    }

    /// Whether ggml holds a connection through the link now (something of ours has buffers
    /// on the peer), over which the peer is reached, since a server serves one client at a time.
    pub fn connected(&self) -> bool {
        !self.shared.state().open.is_empty()
    }

    /// Connections from ggml accepted so far.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::SeqCst)
    }

    /// What the link has carried so far.
    pub fn stats(&self) -> LinkStats {
        self.shared.state().stats.clone()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for sock in self.shared.state().open.drain(..) {
            let _ = sock.shutdown(Shutdown::Both);
        }
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            // ggml keeps one connection per endpoint: serve them one after the other.
            Ok((ggml, _)) => Relay::open(shared, ggml).map_or((), Relay::serve),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                tracing::warn!(peer = %shared.peer, "link cannot accept a connection: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// One connection from ggml and, while the peer is healthy, its connection to the peer.
struct Relay<'a> {
    shared: &'a Shared,
    ggml: TcpStream,
    peer: Option<TcpStream>,
    buf: Vec<u8>,
}

impl<'a> Relay<'a> {
    fn open(shared: &'a Shared, ggml: TcpStream) -> Option<Relay<'a>> {
        let generation = shared.generation.fetch_add(1, Ordering::SeqCst) + 1;
        shared.state().lost = None;
        // The listener polls; the connection blocks (ggml may stay quiet for hours).
        if ggml.set_nonblocking(false).and_then(|()| ggml.set_nodelay(true)).is_err()
            || !shared.register(&ggml)
        {
            return None;
        }
        let mut relay = Relay { shared, ggml, peer: None, buf: Vec::with_capacity(9 + CHUNK) };
        match relay.connect() {
            Ok(peer) if shared.register(&peer) => {
                tracing::info!(peer = %shared.peer, generation, "link connected to the RPC peer");
                relay.peer = Some(peer);
            }
            Ok(_) => return None,
            Err(e) => relay.lose(format!("peer {} is down or unreachable: {e}", shared.peer)),
        }
        Some(relay)
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let LinkOptions { connect_timeout, reply_timeout } = self.shared.options;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the name has no address");
        for addr in self.shared.peer.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, connect_timeout) {
                Ok(sock) => {
                    sock.set_nodelay(true)?;
                    sock.set_read_timeout(Some(reply_timeout))?;
                    sock.set_write_timeout(Some(reply_timeout))?;
                    return Ok(sock);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Relay requests until ggml closes the connection (or the link stops).
    fn serve(mut self) {
        let mut head = [0u8; 9];
        while self.ggml.read_exact(&mut head).is_ok() {
            let (cmd, size) = (head[0], u64::from_le_bytes(head[1..].try_into().unwrap_or_default()));
            self.shared.state().stats.requests += 1;
            if cmd >= COMMANDS {
                tracing::warn!(peer = %self.shared.peer, "link dropped an unknown RPC command {cmd}");
            }
            let Ok(request) = self.forward(cmd, size) else { break };
            let Some(want) = reply_size(cmd, size, &request) else { continue };
            let reply = self.peer_reply(cmd, want).unwrap_or_else(|| self.fabricate(cmd, want, &request));
            let frame = [&(reply.len() as u64).to_le_bytes()[..], &reply].concat();
            if self.ggml.write_all(&frame).is_err() {
                break;
            }
        }
        if let Some(peer) = self.peer.take() {
            let _ = peer.shutdown(Shutdown::Both);
        }
        self.shared.state().open.clear();
    }

    /// Read a request's payload from ggml, streaming it to the peer while it is healthy; the
    /// first [`KEEP`] bytes are returned. An error is ggml's side failing.
    fn forward(&mut self, cmd: u8, size: u64) -> io::Result<Vec<u8>> {
        let mut kept = Vec::new();
        let mut left = size;
        let mut header = Some([&[cmd][..], &size.to_le_bytes()].concat());
        while left > 0 || header.is_some() {
            let n = left.min(CHUNK as u64) as usize;
            self.buf.clear();
            self.buf.extend(header.take().unwrap_or_default());
            let at = self.buf.len();
            self.buf.resize(at + n, 0);
            self.ggml.read_exact(&mut self.buf[at..])?;
            kept.extend_from_slice(&self.buf[at..at + n.min(KEEP.saturating_sub(kept.len()))]);
            if cmd == HELLO {
                // Plain TCP to the peer: ask it for no transport upgrade the link cannot relay.
                self.buf[at..].fill(0);
            }
            left -= n as u64;
            if cmd >= COMMANDS {
                continue;
            }
            if let Some(peer) = &mut self.peer {
                match peer.write_all(&self.buf) {
                    Ok(()) => self.shared.state().stats.bytes_to_peer += self.buf.len() as u64,
                    Err(e) => {
                        self.lose(failure(&self.shared.peer, cmd, &e, self.shared.options.reply_timeout))
                    }
                }
            }
        }
        Ok(kept)
    }

    /// The peer's reply of `want` bytes to `cmd`, read whole; none when the peer is lost.
    fn peer_reply(&mut self, cmd: u8, want: usize) -> Option<Vec<u8>> {
        let shared = self.shared;
        let peer = &shared.peer;
        let mut reply = match read_reply(self.peer.as_mut()?, want) {
            Ok((reply, round_trip)) => {
                let mut state = shared.state();
                state.stats.bytes_from_peer += 8 + want as u64;
                if cmd != GET_TENSOR {
                    let stats = &mut state.stats;
                    stats.round_trip_last = Some(round_trip);
                    stats.round_trip_min =
                        Some(stats.round_trip_min.map_or(round_trip, |m| m.min(round_trip)));
                }
                reply
            }
            Err(Ok(size)) => {
                self.lose(format!("peer {peer} answered {} with {size} bytes, not {want}", name(cmd)));
                return None;
            }
            Err(Err(e)) => {
                self.lose(failure(peer, cmd, &e, shared.options.reply_timeout));
                return None;
            }
        };
        match cmd {
            HELLO => {
                let version = Version { major: reply[0], minor: reply[1], patch: reply[2] };
                if !shared.ours.can_use(version) {
                    let ours = shared.ours;
                    self.lose(format!("peer {peer} speaks RPC protocol {version}; this build speaks {ours}"));
                    return None;
                }
                reply[4..].fill(0); // ggml talks plain TCP to the link, whatever the peer offers
            }
            DEVICE_COUNT => shared.state().device_count = reply[..4].try_into().ok().map(u32::from_le_bytes),
            _ => {}
        }
        Some(reply)
    }

    /// A well-formed reply to `cmd` for a lost peer: ggml goes on, and its result is discarded.
    fn fabricate(&self, cmd: u8, want: usize, request: &[u8]) -> Vec<u8> {
        let word = |at: usize| {
            request.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        };
        let mut reply = vec![0u8; want];
        let fill = |reply: &mut Vec<u8>, bytes: &[u8]| reply[..bytes.len()].copy_from_slice(bytes);
        match cmd {
            // ALLOC_BUFFER: pointer 0, which ggml reports as a failed allocation.
            GET_ALIGNMENT => fill(&mut reply, &64u64.to_le_bytes()),
            GET_MAX_SIZE => fill(&mut reply, &u64::MAX.to_le_bytes()),
            // Never dereferenced by ggml, only offset from; it must not be null.
            BUFFER_GET_BASE => fill(&mut reply, &0x1000u64.to_le_bytes()),
            // "The peer has it": ggml then sends no data for it.
            SET_TENSOR_HASH => reply[0] = 1,
            GET_ALLOC_SIZE => {
                let bytes = u64::from(word(ALLOC_SIZE_NE3)) * u64::from(word(ALLOC_SIZE_NB3));
                fill(&mut reply, &bytes.to_le_bytes());
            }
            HELLO => {
                fill(&mut reply, &[self.shared.ours.major, self.shared.ours.minor, self.shared.ours.patch])
            }
            DEVICE_COUNT => fill(&mut reply, &self.shared.state().device_count.unwrap_or(1).to_le_bytes()),
            // ALLOC_BUFFER, GET_TENSOR, COPY_TENSOR (failed), GET_DEVICE_MEMORY: zeros.
            _ => {}
        }
        reply
    }

    /// Mark this connection's peer lost (once) and close it.
    fn lose(&mut self, reason: String) {
        if let Some(peer) = self.peer.take() {
            let _ = peer.shutdown(Shutdown::Both);
        }
        let mut state = self.shared.state();
        if state.lost.is_none() {
            if !self.shared.stop.load(Ordering::SeqCst) {
                tracing::warn!(peer = %self.shared.peer, "RPC link lost: {reason}; answering ggml locally");
            }
            state.lost = Some(reason);
        }
    }
}

/// Read a reply of `want` bytes and the time its header took; a reply of another size is
/// `Err(Ok(size))`, left unread.
fn read_reply(
    peer: &mut TcpStream,
    want: usize,
) -> std::result::Result<(Vec<u8>, Duration), io::Result<u64>> {
    let sent = Instant::now();
    let mut size = [0u8; 8];
    peer.read_exact(&mut size).map_err(Err)?;
    let round_trip = sent.elapsed();
    let size = u64::from_le_bytes(size);
    if size != want as u64 {
        return Err(Ok(size));
    }
    let mut reply = vec![0u8; want];
    peer.read_exact(&mut reply).map_err(Err)?;
    Ok((reply, round_trip))
}

/// The size of ggml's expected reply to `cmd` (`rpc_serve_client`), none for a command without.
/// GET_TENSOR's request is `rpc_tensor | offset u64 | size u64`: the reply is `size` bytes.
fn reply_size(cmd: u8, size: u64, request: &[u8]) -> Option<usize> {
    match cmd {
        ALLOC_BUFFER | GET_DEVICE_MEMORY => Some(16),
        GET_ALIGNMENT | GET_MAX_SIZE | BUFFER_GET_BASE | GET_ALLOC_SIZE => Some(8),
        SET_TENSOR_HASH | COPY_TENSOR => Some(1),
        GET_TENSOR if size == RPC_TENSOR as u64 + 16 => {
            Some(u64::from_le_bytes(request[RPC_TENSOR + 8..].try_into().ok()?) as usize)
        }
        GET_TENSOR => Some(0),
        HELLO => Some(4 + CONN_CAPS),
        DEVICE_COUNT => Some(4),
        _ => None,
    }
}

/// A human reason for an I/O failure with the peer during `cmd`.
fn failure(peer: &str, cmd: u8, e: &io::Error, reply_timeout: Duration) -> String {
    let cmd = name(cmd);
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("peer {peer} timed out: no reply to {cmd} within {reply_timeout:?}")
        }
        io::ErrorKind::UnexpectedEof => format!("peer {peer} closed the connection during {cmd}"),
        _ => format!("peer {peer} failed during {cmd}: {e}"),
    }
}

fn name(cmd: u8) -> String {
    const NAMES: [&str; COMMANDS as usize] = [
        "ALLOC_BUFFER",
        "GET_ALIGNMENT",
        "GET_MAX_SIZE",
        "BUFFER_GET_BASE",
        "FREE_BUFFER",
        "BUFFER_CLEAR",
        "SET_TENSOR",
        "SET_TENSOR_HASH",
        "GET_TENSOR",
        "COPY_TENSOR",
        "GRAPH_COMPUTE",
        "GET_DEVICE_MEMORY",
        "INIT_TENSOR",
        "GET_ALLOC_SIZE",
        "HELLO",
        "DEVICE_COUNT",
        "GRAPH_RECOMPUTE",
        "MEMSET_TENSOR",
    ];
    NAMES.get(usize::from(cmd)).map_or_else(|| format!("command {cmd}"), |n| (*n).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::rpc::tests::{Client, ONE_CLIENT, server};

    const _: fn() = || {
        fn shared_between_threads<T: Send + Sync>() {}
        shared_between_threads::<Link>();
    };

    #[test]
    fn relays_a_healthy_server() {
        let _one = ONE_CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let link = Link::start(server(), LinkOptions::default()).unwrap();
        let client = Client::new(link.local_endpoint());
        assert_eq!(client.memory(), (64 << 20, 64 << 20));
        let buffer = client.alloc(4 << 20).expect("4 of 64 MiB refused through the link");
        assert!(client.memory().0 <= 60 << 20);
        // Past one chunk: SET_TENSOR streamed, GET_TENSOR's reply read whole.
        let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8 + 1).collect();
        assert!(buffer.round_trip(&data) == data, "the data came back changed");
        drop(buffer);
        assert_eq!(link.lost(), None);
        let stats = link.stats();
        assert!(stats.requests >= 8, "{stats:?}");
        assert!(stats.bytes_to_peer > 3 << 20 && stats.bytes_from_peer > 3 << 20, "{stats:?}");
        assert!(stats.round_trip_min.is_some() && stats.round_trip_min <= stats.round_trip_last, "{stats:?}");
        assert!(link.generation() >= 2);
    }

    #[test]
    fn a_peer_that_closes_mid_connection_is_answered_locally() {
        let peer = fake_peer([7, 0, 0], Then::Close);
        let link = Link::start(&peer, LinkOptions::default()).unwrap();
        let client = Client::new(link.local_endpoint());
        assert_eq!(link.lost(), None, "HELLO and DEVICE_COUNT were answered");
        assert_eq!(client.memory(), (0, 0));
        let lost = link.lost().expect("the peer closed the connection");
        assert!(
            lost.contains(&peer) && lost.contains("closed the connection during GET_DEVICE_MEMORY"),
            "{lost}"
        );
        assert!(client.alloc(1 << 20).is_none(), "an allocation on a dead peer succeeded");
        assert!(link.lost().unwrap().contains("during ALLOC_BUFFER"), "{:?}", link.lost());
    }

    #[test]
    fn a_silent_peer_times_out() {
        let peer = fake_peer([7, 0, 0], Then::Silence);
        let options = LinkOptions { reply_timeout: Duration::from_millis(500), ..LinkOptions::default() };
        let link = Link::start(&peer, options).unwrap();
        let client = Client::new(link.local_endpoint());
        let start = Instant::now();
        assert_eq!(client.memory(), (0, 0));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        let lost = link.lost().expect("the peer said nothing");
        assert!(lost.contains(&peer) && lost.contains("timed out"), "{lost}");
    }

    #[test]
    fn a_peer_of_another_version_is_refused_without_an_abort() {
        let peer = fake_peer([6, 0, 0], Then::Close);
        let link = Link::start(&peer, LinkOptions::default()).unwrap();
        let client = Client::new(link.local_endpoint());
        let lost = link.lost().expect("6.0.0 accepted");
        assert!(lost.contains(&peer) && lost.contains("speaks RPC protocol 6.0.0"), "{lost}");
        assert_eq!(client.memory(), (0, 0));
    }

    #[test]
    fn a_new_connection_tries_the_peer_afresh() {
        let _one = ONE_CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let cable = Cable::to(server());
        cable.cut();
        let link = Link::start(&cable.addr, LinkOptions::default()).unwrap();
        let client = Client::new(link.local_endpoint());
        assert_eq!(client.memory(), (0, 0));
        assert!(link.lost().unwrap().contains("during HELLO"), "{:?}", link.lost());

        cable.mend();
        assert_eq!(client.memory(), (64 << 20, 64 << 20));
        assert_eq!(link.lost(), None);
        let buffer = client.alloc(1 << 20).unwrap();
        assert_eq!(buffer.round_trip(&[7; 4096]), [7; 4096]);
        // The peer dies while ggml holds a buffer: reads come back as zeros, and the loss is
        // kept until ggml lets the connection go with its last buffer.
        cable.cut();
        assert_eq!(buffer.round_trip(&[7; 4096]), [0; 4096]);
        assert!(link.lost().is_some());
        let generation = link.generation();
        drop(buffer);
        cable.mend();
        assert_eq!(client.memory(), (64 << 20, 64 << 20), "the server kept the dead connection's buffer");
        assert_eq!(link.lost(), None);
        assert!(link.generation() > generation);
    }

    #[test]
    fn answers_a_raw_client_locally_when_the_peer_is_down_and_drops_promptly() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let link = Link::start(&format!("127.0.0.1:{port}"), LinkOptions::default()).unwrap();
        let mut sock = TcpStream::connect(link.local_endpoint()).unwrap();
        let ours = link.shared.ours;
        let hello = [&[ours.major, ours.minor, ours.patch, 0][..], &[0; CONN_CAPS]].concat();
        assert_eq!(request(&mut sock, HELLO, &[1; CONN_CAPS]), hello);
        assert_eq!(request(&mut sock, DEVICE_COUNT, &[]), 1u32.to_le_bytes());
        sock.write_all(&[99, 5, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap(); // unknown: dropped
        assert_eq!(request(&mut sock, GET_ALIGNMENT, &[0; 4]), 64u64.to_le_bytes());
        let mut get_tensor = vec![0u8; RPC_TENSOR + 16];
        get_tensor[RPC_TENSOR + 8..].copy_from_slice(&100u64.to_le_bytes());
        assert_eq!(request(&mut sock, GET_TENSOR, &get_tensor), [0; 100]);
        let mut alloc_size = vec![0u8; 4 + 11 * RPC_TENSOR];
        alloc_size[ALLOC_SIZE_NE3..ALLOC_SIZE_NE3 + 4].copy_from_slice(&3u32.to_le_bytes());
        alloc_size[ALLOC_SIZE_NB3..ALLOC_SIZE_NB3 + 4].copy_from_slice(&96u32.to_le_bytes());
        assert_eq!(request(&mut sock, GET_ALLOC_SIZE, &alloc_size), 288u64.to_le_bytes());
        let lost = link.lost().unwrap();
        assert!(lost.contains(&format!("127.0.0.1:{port} is down or unreachable")), "{lost}");
        assert_eq!((link.generation(), link.stats().requests), (1, 6));
        let start = Instant::now();
        drop(link);
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    }

    fn request(sock: &mut TcpStream, cmd: u8, payload: &[u8]) -> Vec<u8> {
        sock.write_all(&[&[cmd][..], &(payload.len() as u64).to_le_bytes(), payload].concat()).unwrap();
        let mut size = [0u8; 8];
        sock.read_exact(&mut size).unwrap();
        let mut reply = vec![0u8; u64::from_le_bytes(size) as usize];
        sock.read_exact(&mut reply).unwrap();
        reply
    }

    #[derive(Clone, Copy)]
    enum Then {
        Close,
        Silence,
    }

    /// A peer that answers HELLO with `version` and DEVICE_COUNT with 1 on every connection,
    /// and closes it, or goes silent, at any other command.
    fn fake_peer(version: [u8; 3], then: Then) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut sock in listener.incoming().flatten() {
                std::thread::spawn(move || -> io::Result<()> {
                    loop {
                        let mut head = [0u8; 9];
                        sock.read_exact(&mut head)?;
                        let mut payload =
                            vec![0u8; u64::from_le_bytes(head[1..].try_into().unwrap()) as usize];
                        sock.read_exact(&mut payload)?;
                        let reply = match (head[0], then) {
                            (HELLO, _) => [&version[..], &[0; 1 + CONN_CAPS]].concat(),
                            (DEVICE_COUNT, _) => 1u32.to_le_bytes().to_vec(),
                            (_, Then::Close) => return Ok(()),
                            // Until the link gives up and closes the connection.
                            (_, Then::Silence) => return io::copy(&mut sock, &mut io::sink()).map(drop),
                        };
                        sock.write_all(&[&(reply.len() as u64).to_le_bytes()[..], &reply].concat())?;
                    }
                });
            }
        });
        addr
    }

    /// A connection to `server` that can be cut (its connections shut, new ones closed at
    /// once) and mended.
    struct Cable {
        addr: String,
        down: Arc<AtomicBool>,
        live: Arc<Mutex<Vec<TcpStream>>>,
    }

    impl Cable {
        fn to(server: &'static str) -> Cable {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let cable = Cable { addr, down: Arc::default(), live: Arc::default() };
            let (down, live) = (Arc::clone(&cable.down), Arc::clone(&cable.live));
            std::thread::spawn(move || {
                for near in listener.incoming().flatten() {
                    if down.load(Ordering::SeqCst) {
                        continue; // dropped: closed at once
                    }
                    let far = TcpStream::connect(server).unwrap();
                    live.lock().unwrap().extend([near.try_clone().unwrap(), far.try_clone().unwrap()]);
                    pipe(near.try_clone().unwrap(), far.try_clone().unwrap());
                    pipe(far, near);
                }
            });
            cable
        }

        fn cut(&self) {
            self.down.store(true, Ordering::SeqCst);
            for sock in self.live.lock().unwrap().drain(..) {
                let _ = sock.shutdown(Shutdown::Both);
            }
        }

        fn mend(&self) {
            self.down.store(false, Ordering::SeqCst);
        }
    }

    fn pipe(mut from: TcpStream, mut to: TcpStream) {
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
}
