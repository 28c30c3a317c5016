//! A bounded soak: rounds of mixed clients — two models on two engines under a budget that
//! holds only one at a time, streaming and not, over HTTP and D-Bus, clients that hang up,
//! callers that leave, oversize, malformed and misdirected requests, connections that never
//! finish their head — and after each round, every request answered as it should be, and
//! the budget, the resident memory and the open file descriptors back where they were.

mod common;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Daemon, Setup, flan_t5, raw_request, used_without_parked};
use serde_json::{Value, json};

const ROUNDS: usize = 4;

/// The process's resident bytes and open file descriptors.
fn footprint(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    (rss_kib << 10, fds)
}

/// Bytes each model takes in the budget, and what the process alone holds, from a daemon
/// with room for both.
fn model_sizes() -> (u64, u64, u64) {
    let d = Daemon::start(Setup { flan: true, ..Setup::default().with_budget("2GiB") });
    let process = d.get("/v1/status")["memory"]["used_bytes"].as_u64().unwrap();
    let bytes = |name: &str| {
        let (code, r) = d.post(&format!("/v1/models/{name}/load"), &json!({}));
        assert_eq!(code, 200, "{r}");
        r["bytes"].as_u64().unwrap()
    };
    (process, bytes("smollm2"), bytes("flan-t5-small"))
}

/// One client of a round: what it did, and whether the answer was the one expected.
fn client(d: &Daemon, kind: usize) -> (&'static str, Result<(), String>) {
    let check = |what: &'static str, ok: bool, detail: String| (what, if ok { Ok(()) } else { Err(detail) });
    match kind {
        0 => {
            let body = json!({"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24, "stream": true});
            let (code, text) = d.curl("POST", "/v1/chat/completions", Some(body.to_string().as_bytes()));
            check("chat stream", code == 200 && text.contains("[DONE]"), format!("{code} {text}"))
        }
        1 => {
            let body = json!({"model": "flan-t5-small", "prompt": "Translate to German: good morning", "max_tokens": 12});
            let (code, r) = d.post("/v1/completions", &body);
            check(
                "flan completion",
                code == 200 && r["choices"][0]["text"].is_string(),
                format!("{code} {r}"),
            )
        }
        2 => {
            let mut s = raw_request(
                &d.socket,
                "/v1/completions",
                &json!({"prompt": "Once upon a time", "max_tokens": 400, "stream": true}),
            );
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let mut first = [0u8; 128];
            let n = s.read(&mut first).unwrap_or(0);
            drop(s); // hang up mid-stream
            check("hang-up", n > 0, "no first chunk".into())
        }
        3 => {
            let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(5 << 20));
            let (code, text) = d.curl("POST", "/v1/completions", Some(big.as_bytes()));
            check("oversize", code == 413, format!("{code} {text}"))
        }
        4 => {
            let (code, text) = d.curl("POST", "/v1/chat/completions", Some(b"{\"messages\": [{\"role\": "));
            check("malformed", code == 400, format!("{code} {text}"))
        }
        5 => {
            let (code, r) = d.post("/v1/completions", &json!({"model": "no-such-model", "prompt": "Hi"}));
            check("unknown model", code == 404, format!("{code} {r}"))
        }
        6 => {
            let body = json!({"model": "flan-t5-small", "messages": [{"role": "user", "content": "Hi"}]});
            let (code, r) = d.post("/v1/chat/completions", &body);
            check("chat on an encoder-decoder", code == 400, format!("{code} {r}"))
        }
        7 => {
            let o = d.busctl_generate(&[], "What is two plus two?", &[&["max_tokens", "u", "8"]]);
            check("dbus generate", o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
        }
        8 => {
            // Start returns at once; busctl then leaves the bus, which cancels the job.
            let o = d.dbus(&[
                "call",
                "org.pocketd.Pocketd1",
                "/org/pocketd/Pocketd1",
                "org.pocketd.Pocketd1",
                "Start",
                "ssa{sv}",
                "",
                "Once upon a time",
                "2",
                "max_tokens",
                "u",
                "400",
                "chat",
                "b",
                "false",
            ]);
            let out = String::from_utf8_lossy(&o.stdout);
            check("dbus start, caller leaves", o.status.success() && out.contains("/jobs/"), format!("{o:?}"))
        }
        _ => {
            let body = json!({"model": "flan-t5-small", "prompt": "Summarize: the cat sat on the mat.", "max_tokens": 12, "stream": true});
            let (code, text) = d.curl("POST", "/v1/completions", Some(body.to_string().as_bytes()));
            check("flan stream", code == 200 && text.contains("[DONE]"), format!("{code} {text}"))
        }
    }
}

/// After a round: nothing running, both models unloaded, only the status request's
/// connection open.
fn settle(d: &Daemon) -> Value {
    let start = Instant::now();
    loop {
        let st = d.get("/v1/status");
        let busy = !st["sessions"].as_array().unwrap().is_empty() || st["queued"] != 0;
        if !busy {
            for m in st["loaded"].as_array().unwrap() {
                let name = m["name"].as_str().unwrap();
                let _ = d.curl("POST", &format!("/v1/models/{name}/unload"), Some(b"{}"));
            }
        }
        let st = d.get("/v1/status");
        if !busy && st["loaded"].as_array().unwrap().is_empty() && st["connections"]["open"] == 1 {
            return st;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the daemon did not settle: {st}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn rounds_of_mixed_clients_lose_nothing_and_leave_memory_and_descriptors_flat() {
    let _ = flan_t5();
    let (process, smol, flan) = model_sizes();
    // Room for the process, both models and a SmolLM2 session (of a 1024-token context), not
    // for a flan-t5 session (~90 MiB) beside both: its requests unload SmolLM2.
    let budget = process + smol + flan + (48 << 20);
    eprintln!("process {process} B, smollm2 {smol} B, flan-t5-small {flan} B: budget {budget} B");
    let d = Daemon::start(Setup {
        dbus: true,
        flan: true,
        extra: format!(
            "memory_budget = \"{budget}\"\nctx_size = 1024\nheader_timeout_seconds = 1\nidle_timeout_seconds = 1\n"
        ),
        ..Setup::default()
    });
    let pid = d.child.as_ref().unwrap().id();
    let idle_used = used_without_parked(&settle(&d));
    let mut baseline = None;
    let mut rss = Vec::new();
    let started = Instant::now();
    for round in 0..=ROUNDS {
        // SmolLM2 loaded first, so that the round's flan-t5 requests always find it in the way:
        // left to the clients' order, flan-t5 could run first and SmolLM2 load beside it after.
        let (code, r) = d.post("/v1/models/smollm2/load", &json!({}));
        assert_eq!(code, 200, "round {round}: {r}");
        // Connections that never finish their head, held for the whole round.
        let mut half_open: Vec<UnixStream> = (0..8)
            .map(|_| {
                let mut s = UnixStream::connect(&d.socket).unwrap();
                std::io::Write::write_all(&mut s, b"POST /v1/comp").unwrap();
                s
            })
            .collect();
        let outcomes: Vec<(&str, Result<(), String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..10)
                .map(|kind| {
                    let d = &d;
                    scope.spawn(move || client(d, kind))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (what, r) in &outcomes {
            assert!(r.is_ok(), "round {round}, {what}: {r:?}\n{}", d.log());
        }
        for s in &mut half_open {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 64];
            assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "a half-open connection stayed open");
        }
        drop(half_open);
        let st = settle(&d);
        assert_eq!(used_without_parked(&st), idle_used, "round {round}: the budget is not back: {st}");
        // A connection the daemon has let go of closes when its task next runs: give the
        // count a moment to come down to the baseline.
        let (mut resident, mut fds) = footprint(pid);
        let waiting = Instant::now();
        while baseline.is_some_and(|b| fds != b) && waiting.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(100));
            (resident, fds) = footprint(pid);
        }
        if baseline.is_none() {
            std::thread::sleep(Duration::from_millis(500));
            (resident, fds) = footprint(pid);
        }
        eprintln!(
            "round {round}: {} requests answered, used {} B, resident {:.1} MiB, {fds} fds, {:?}",
            outcomes.len(),
            idle_used,
            resident as f64 / (1 << 20) as f64,
            started.elapsed()
        );
        rss.push(resident);
        // Round 0 warms up (thread pools, allocator arenas); later rounds must not grow.
        match baseline {
            None => baseline = Some(fds),
            Some(b) => assert_eq!(fds, b, "round {round}: open file descriptors {fds}, after round 0 {b}"),
        }
    }
    let models_swapped = d.log().matches("unloaded to make room").count();
    eprintln!("{models_swapped} models unloaded to make room");
    assert!(models_swapped >= ROUNDS, "the budget should force unloads: {models_swapped}");
    // Resident memory after the last round is within 16 MiB of after the first full round.
    let (first, last) = (rss[1], rss[ROUNDS]);
    assert!(
        last <= first + (16 << 20),
        "resident memory grew: {:?} MiB",
        rss.iter().map(|r| r >> 20).collect::<Vec<_>>()
    );
}
