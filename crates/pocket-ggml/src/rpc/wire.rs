//! The few messages of ggml's RPC protocol our own code sends: the handshake, the device
//! count and each device's memory — enough to check a peer before ggml's client meets it.
//!
//! A request is `| command (1 byte) | size (u64) | payload |`, a reply `| size (u64) | payload |`,
//! integers in the machine's byte order (little-endian on every board pocketd runs on), as
//! `ggml-rpc.cpp` writes them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const CMD_GET_DEVICE_MEMORY: u8 = 11;
const CMD_HELLO: u8 = 14;
const CMD_DEVICE_COUNT: u8 = 15;
/// `RPC_CONN_CAPS_SIZE` (transport.h): transport capabilities after the version in HELLO;
/// all zero asks for plain TCP.
const CONN_CAPS: usize = 24;

/// An RPC protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Changes break the wire format: both sides must agree.
    pub major: u8,
    /// A server may be older than its client, not newer.
    pub minor: u8,
    /// Fixes; any pair talks.
    pub patch: u8,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for Version {
    type Err = Error;

    fn from_str(s: &str) -> Result<Version> {
        let bad = || Error::Rpc(format!("{s:?} is not a protocol version (MAJOR.MINOR.PATCH)"));
        let mut parts = s.split('.').map(|p| p.parse::<u8>().map_err(|_| bad()));
        let v = Version {
            major: parts.next().ok_or_else(bad)??,
            minor: parts.next().ok_or_else(bad)??,
            patch: parts.next().ok_or_else(bad)??,
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

impl Version {
    /// Whether a client speaking `self` can use a server speaking `server` (ggml's rule: the
    /// same major, a minor no newer than the client's).
    pub fn can_use(self, server: Version) -> bool {
        server.major == self.major && server.minor <= self.minor
    }
}

/// A device a peer offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerDevice {
    /// Bytes the peer would let us allocate now (its cap, less what others hold).
    pub free_bytes: u64,
    /// Bytes in all (capped).
    pub total_bytes: u64,
}

/// What [`probe`] found at a peer.
#[derive(Debug, Clone)]
pub struct Peer {
    /// `host:port` as given.
    pub endpoint: String,
    /// The address it resolved to.
    pub addr: SocketAddr,
    /// The protocol the server speaks.
    pub version: Version,
    /// Its devices.
    pub devices: Vec<PeerDevice>,
    /// The shortest of a few request–reply round trips.
    pub round_trip: Duration,
}

/// Connect to the RPC server at `endpoint` (`host:port`), check that it speaks a protocol this
/// build can use, and ask what its devices offer. Each step waits at most `timeout`: a server
/// serves one client at a time, so a busy one accepts the connection and says nothing.
pub fn probe(endpoint: &str, timeout: Duration) -> Result<Peer> {
    let ours: Version =
        super::protocol().ok_or_else(|| Error::Rpc("this build has no RPC backend".into()))?.parse()?;
    let addr = endpoint
        .to_socket_addrs()
        .map_err(|e| Error::Rpc(format!("peer {endpoint}: cannot resolve it ({e}); give host:port")))?
        .next()
        .ok_or_else(|| Error::Rpc(format!("peer {endpoint}: the name has no address")))?;
    let mut sock = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| Error::Rpc(format!("peer {endpoint} is down or unreachable: {e}")))?;
    let io = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            Error::Rpc(format!(
                "peer {endpoint} accepted the connection but did not answer within {timeout:?}: \
                 it is busy with another client (a server serves one at a time) or is not an RPC server"
            ))
        } else {
            Error::Rpc(format!(
                "peer {endpoint} closed the connection during the handshake ({e}): it speaks an RPC \
                 protocol older than 4.0 or is not an RPC server; this build speaks {ours}"
            ))
        }
    };
    sock.set_read_timeout(Some(timeout)).map_err(io)?;
    sock.set_write_timeout(Some(timeout)).map_err(io)?;
    sock.set_nodelay(true).map_err(io)?;

    let hello = request(&mut sock, CMD_HELLO, &[0u8; CONN_CAPS]).map_err(io)?;
    if hello.len() < 3 {
        return Err(Error::Rpc(format!("peer {endpoint} sent a handshake of {} bytes", hello.len())));
    }
    let version = Version { major: hello[0], minor: hello[1], patch: hello[2] };
    if !ours.can_use(version) {
        return Err(Error::Rpc(format!(
            "peer {endpoint} speaks RPC protocol {version}; this build speaks {ours} (the same major \
             version and a minor no newer are needed): run the same pocketd release on both"
        )));
    }
    let mut round_trip = Duration::MAX;
    let mut count = 0u32;
    for _ in 0..3 {
        let start = Instant::now();
        let reply = request(&mut sock, CMD_DEVICE_COUNT, &[]).map_err(io)?;
        round_trip = round_trip.min(start.elapsed());
        count = u32::from_ne_bytes(word(&reply, 0, endpoint)?);
    }
    let mut devices = Vec::new();
    for device in 0..count {
        let reply = request(&mut sock, CMD_GET_DEVICE_MEMORY, &device.to_ne_bytes()).map_err(io)?;
        devices.push(PeerDevice {
            free_bytes: u64::from_ne_bytes(word(&reply, 0, endpoint)?),
            total_bytes: u64::from_ne_bytes(word(&reply, 8, endpoint)?),
        });
    }
    Ok(Peer { endpoint: endpoint.to_owned(), addr, version, devices, round_trip })
}

/// Send one command and read its reply.
fn request(sock: &mut TcpStream, cmd: u8, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut msg = Vec::with_capacity(9 + payload.len());
    msg.push(cmd);
    msg.extend_from_slice(&(payload.len() as u64).to_ne_bytes());
    msg.extend_from_slice(payload);
    sock.write_all(&msg)?;
    let mut size = [0u8; 8];
    sock.read_exact(&mut size)?;
    let size = u64::from_ne_bytes(size);
    if size > 1 << 20 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("a reply of {size} bytes")));
    }
    let mut reply = vec![0u8; size as usize];
    sock.read_exact(&mut reply)?;
    Ok(reply)
}

fn word<const N: usize>(reply: &[u8], at: usize, endpoint: &str) -> Result<[u8; N]> {
    reply
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::Rpc(format!("peer {endpoint} sent a reply of {} bytes", reply.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_follow_ggmls_rule() {
        let ours: Version = "7.1.0".parse().unwrap();
        assert_eq!(ours.to_string(), "7.1.0");
        assert!(ours.can_use("7.0.3".parse().unwrap()));
        assert!(ours.can_use("7.1.9".parse().unwrap()));
        assert!(!ours.can_use("7.2.0".parse().unwrap()));
        assert!(!ours.can_use("6.1.0".parse().unwrap()));
        assert!(!ours.can_use("8.0.0".parse().unwrap()));
        assert!("7.1".parse::<Version>().is_err());
        assert!("7.1.0.0".parse::<Version>().is_err());
        assert!("7.x.0".parse::<Version>().is_err());
    }

    #[test]
    fn the_build_speaks_rpc() {
        let ours: Version =
            super::super::protocol().expect("GGML_RPC=ON in .cargo/config.toml").parse().unwrap();
        assert!(ours.major >= 7, "{ours}");
    }

    #[test]
    fn a_closed_port_is_named_as_down() {
        // Bind then drop: the port was free a moment ago and nothing listens on it now.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = probe(&format!("127.0.0.1:{port}"), Duration::from_secs(2)).unwrap_err().to_string();
        assert!(err.contains("is down or unreachable"), "{err}");
    }

    #[test]
    fn a_silent_server_is_named_as_busy_within_the_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let start = Instant::now();
        let err = probe(&endpoint, Duration::from_millis(300)).unwrap_err().to_string();
        assert!(err.contains("did not answer"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(listener);
    }
}
