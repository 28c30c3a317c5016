//! The daemon under careless and hostile clients on its socket: a flood of half-open
//! connections under a small open files limit, connections that never finish their head or
//! body, idle keep-alive connections, and a peer whose every connection is busy.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Daemon, Setup, raw_request};
use serde_json::{Value, json};

/// Raise this test's own open files limit so it can be the careless client.
fn allow_open_files(n: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let l = getrlimit(Resource::Nofile);
    if l.current.is_some_and(|c| c < n) {
        let hard = l.maximum;
        assert!(hard.is_none_or(|h| h >= n), "this test needs {n} open files; the hard limit is {hard:?}");
        setrlimit(Resource::Nofile, Rlimit { current: Some(n), maximum: hard }).unwrap();
    }
}

/// Whether the daemon closed `s`: a read gives end of file (or a reset) within `within`.
fn closed_by_daemon(s: &mut UnixStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a response (a 503, say) before the close
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

fn connections(d: &Daemon) -> Value {
    d.get("/v1/status")["connections"].clone()
}

#[test]
fn eleven_hundred_half_open_connections_under_a_1024_file_limit_do_not_keep_another_client_out() {
    let d = Daemon::start(Setup {
        open_files: Some(1024),
        extra: "header_timeout_seconds = 2\n".into(),
        ..Setup::default()
    });
    let c = connections(&d);
    // The cap stays under the limit the daemon runs with (1024 soft and hard here).
    assert!(c["max"].as_u64().unwrap() <= 1024 - 128, "{c}");
    // Load the model first: what is timed below is being let in and answered, not loading.
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(code, 200);

    allow_open_files(4096);
    let mut careless: Vec<UnixStream> = (0..1100)
        .map(|_| {
            let mut s = UnixStream::connect(&d.socket).unwrap();
            s.write_all(b"POST /v1/chat/compl").unwrap();
            s
        })
        .collect();

    let start = Instant::now();
    let (code, r) = d.post("/v1/completions", &json!({"prompt": "The sky is", "max_tokens": 4}));
    let answered = start.elapsed();
    assert_eq!(code, 200, "{r}");
    eprintln!("another client, after 1100 half-open connections: answered in {answered:?}");
    assert!(answered < Duration::from_secs(3), "{answered:?}");

    let c = connections(&d);
    assert!(c["open"].as_u64().unwrap() <= c["max_per_peer"].as_u64().unwrap() + 1, "{c}");
    assert!(c["evicted"].as_u64().unwrap() >= 1100 - c["max_per_peer"].as_u64().unwrap(), "{c}");
    // The ones still held are closed by the head timeout (2 s here).
    let closing = Instant::now();
    for s in &mut careless {
        assert!(closed_by_daemon(s, Duration::from_secs(5)), "a half-open connection stayed open");
    }
    eprintln!("all 1100 closed {:?} after the request", closing.elapsed() + answered);
    let c = connections(&d);
    assert!(c["timed_out"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["open"].as_u64().unwrap() <= 1, "{c}");
    let metrics = d.curl("GET", "/metrics", None).1;
    assert!(metrics.contains("pocketd_connections_total{outcome=\"evicted\"}"), "{metrics}");
}

#[test]
fn a_head_or_body_that_never_arrives_and_an_idle_keep_alive_are_closed_by_their_timeouts() {
    let d = Daemon::start(Setup {
        extra: "header_timeout_seconds = 1\nidle_timeout_seconds = 2\n".into(),
        ..Setup::default()
    });
    // A head that stops half way.
    let mut head = UnixStream::connect(&d.socket).unwrap();
    head.write_all(b"GET /v1/status HTTP/1.1\r\nHost: local").unwrap();
    // A body promised and not sent: a 400 that says so, then the close.
    let mut body = UnixStream::connect(&d.socket).unwrap();
    body.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro",
    )
    .unwrap();
    // A connection that is answered and then kept alive, unused.
    let mut idle = UnixStream::connect(&d.socket).unwrap();
    idle.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut first = [0u8; 4096];
    let n = idle.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
    let answered = Instant::now();

    // Idle for 2 s, not the head's 1 s.
    assert!(!closed_by_daemon(&mut idle, Duration::from_millis(1500)), "closed before its idle timeout");
    assert!(closed_by_daemon(&mut idle, Duration::from_secs(3)), "the idle connection stayed open");
    let idle_for = answered.elapsed();
    assert!(idle_for >= Duration::from_secs(2), "{idle_for:?}");
    // By now the head and the body are past their 1 s.
    assert!(closed_by_daemon(&mut head, Duration::from_secs(1)), "the half head stayed open");
    body.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut text = String::new();
    let _ = body.read_to_string(&mut text);
    assert!(text.starts_with("HTTP/1.1 400") && text.contains("did not arrive within"), "{text}");
    let c = connections(&d);
    assert!(c["timed_out"].as_u64().unwrap() >= 2, "{c}");
}

#[test]
fn a_peer_whose_every_connection_is_busy_gets_a_fast_503_and_loses_nothing() {
    let d = Daemon::start(Setup {
        extra: "max_connections_per_peer = 2\nparallel = 2\n".into(),
        ..Setup::default()
    });
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(code, 200);
    // Two long streams keep both of this uid's connections busy.
    let mut streams: Vec<UnixStream> = (0..2)
        .map(|_| {
            let mut s = raw_request(
                &d.socket,
                "/v1/completions",
                &json!({"prompt": "Once upon a time", "max_tokens": 1000, "stream": true}),
            );
            let mut first = [0u8; 64];
            assert!(s.read(&mut first).unwrap() > 0);
            s
        })
        .collect();
    let start = Instant::now();
    let (code, body) = d.curl("GET", "/v1/status", None);
    eprintln!("refused in {:?}", start.elapsed());
    assert_eq!(code, 503, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "too_many_connections", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("max_connections_per_peer"), "{e}");
    // The streams go on.
    for s in &mut streams {
        let mut more = [0u8; 256];
        assert!(s.read(&mut more).unwrap() > 0);
    }
    drop(streams);
    let st = d.idle_status(Duration::from_secs(5));
    assert_eq!(st["connections"]["refused"], 1, "{st}");
}
