//! Several requests at once through a real pocketd: they share each forward pass, every one
//! gets exactly the tokens it gets alone, the queue serves priorities first, and what the
//! daemon runs on (threads, passes shared) is in its status and metrics.

mod common;

use std::time::{Duration, Instant};

use common::{Daemon, Setup};
use serde_json::{Value, json};

const PROMPTS: [&str; 4] = [
    "Write a haiku about autumn leaves.",
    "What is the boiling point of water at sea level? Answer briefly.",
    "Give three tips for writing clear emails.",
    "Explain what a compiler does in two sentences.",
];

/// A greedy chat request: its tokens and its timings.
fn ask(d: &Daemon, prompt: &str, max_tokens: u32, priority: Option<i32>) -> (Vec<u64>, Value) {
    let mut body = json!({
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "return_tokens": true,
        "cache_prompt": false,
    });
    if let Some(p) = priority {
        body["priority"] = json!(p);
    }
    let (code, r) = d.post("/v1/chat/completions", &body);
    assert_eq!(code, 200, "{r}\n{}", d.log());
    let tokens = r["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap()).collect();
    (tokens, r["timings"].clone())
}

#[test]
fn requests_at_once_share_passes_and_each_gets_its_tokens_alone() {
    let d = Daemon::start(Setup { extra: "parallel = 4\n".into(), ..Setup::default() });
    let alone: Vec<_> = PROMPTS.iter().map(|p| ask(&d, p, 32, None).0).collect();
    let together: Vec<(Vec<u64>, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let d = &d;
                scope.spawn(move || ask(d, p, 32, None))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, (t, timings))) in alone.iter().zip(&together).enumerate() {
        assert_eq!(t, a, "request {i}: tokens together differ from alone");
        // The test daemon runs on one thread.
        assert_eq!(timings["threads"].as_f64(), Some(1.0), "{timings}");
    }
    let status = d.get("/v1/status");
    let model = &status["loaded"][0];
    let name = model["name"].as_str().unwrap();
    let shared = model["shared_passes"]["shared"].as_u64().expect("shared passes in the status");
    assert!(shared > 0, "no pass was shared: {status}");
    assert_eq!(status["parallel"], 4, "{status}");
    assert_eq!(status["cpu"]["threads_setting"], "1", "{status}");
    assert_eq!(status["cpu"]["threads"], 1, "{status}");
    let (code, metrics) = d.curl("GET", "/metrics", None);
    assert_eq!(code, 200);
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
            .to_owned()
    };
    let passes = line(&format!("pocketd_passes_total{{model=\"{name}\",kind=\"shared\"}}"));
    assert!(passes.ends_with(&format!(" {shared}")), "{passes} vs {shared}");
    assert_eq!(line("pocketd_threads "), "pocketd_threads 1");
    assert_eq!(line("pocketd_parallel "), "pocketd_parallel 4");
}

/// With one turn taken by a long request, a request that arrives later with a lower priority
/// number is served before one that waited longer with a higher one.
#[test]
fn the_queue_serves_the_lower_priority_number_first() {
    let d = Daemon::start(Setup { extra: "parallel = 1\n".into(), ..Setup::default() });
    let finished = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let d = &d;
        let finished = &finished;
        scope.spawn(move || {
            ask(d, "Write a very long story about a dragon, at least a thousand words.", 200, None)
        });
        d.wait_generating();
        scope.spawn(move || {
            ask(d, PROMPTS[0], 4, Some(10));
            finished.lock().unwrap().push("later");
        });
        // The first is queued before the second asks, and both wait while the long one runs.
        let queued = |n: u64| {
            let start = Instant::now();
            while d.get("/v1/status")["queued"].as_u64() != Some(n) {
                assert!(start.elapsed() < Duration::from_secs(10), "never {n} queued");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        queued(1);
        scope.spawn(move || {
            ask(d, PROMPTS[1], 4, Some(-10));
            finished.lock().unwrap().push("sooner");
        });
        queued(2);
    });
    assert_eq!(*finished.lock().unwrap(), ["sooner", "later"]);
}

#[test]
fn a_priority_out_of_range_is_refused_by_name() {
    let d = Daemon::start(Setup::default());
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "priority": 500});
    let (code, r) = d.post("/v1/chat/completions", &body);
    assert_eq!(code, 400, "{r}");
    assert_eq!(r["error"]["param"], "priority", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("lower is served sooner"), "{r}");
}
