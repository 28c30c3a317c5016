//! The prompt cache end to end: a real pocketd continues a chat's parked prefix over HTTP and
//! D-Bus with exactly the tokens it gives without it, gives parked conversations up under a
//! budget that cannot hold them all, and keeps them on disk across a restart — skipping a
//! corrupted file with a warning.

use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::*;

const SYSTEM: &str = "You are a concise assistant.";
const TURNS: [&str; 3] = [
    "Name three rivers in Europe.",
    "Which of those is the longest?",
    "Write one sentence about its source.",
];

/// One chat request: the answer's text, token ids and the response's `timings` and `usage`
/// (read from the last chunk when streamed).
struct Answer {
    text: String,
    tokens: Vec<u64>,
    cached: u64,
    details: u64,
}

fn chat(d: &Daemon, messages: &[Value], extra: Value, stream: bool) -> Answer {
    let mut body = json!({"messages": messages, "max_tokens": 24, "return_tokens": true, "stream": stream});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    if !stream {
        let (code, r) = d.post("/v1/chat/completions", &body);
        assert_eq!(code, 200, "{r}");
        return Answer {
            text: r["choices"][0]["message"]["content"].as_str().unwrap().to_owned(),
            tokens: r["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect(),
            cached: r["timings"]["cached_tokens"].as_u64().unwrap(),
            details: r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        };
    }
    let (code, text) = d.curl("POST", "/v1/chat/completions", Some(body.to_string().as_bytes()));
    assert_eq!(code, 200, "{text}");
    let chunks: Vec<Value> =
        sse_data(&text).iter().filter(|c| *c != "[DONE]").map(|c| serde_json::from_str(c).unwrap()).collect();
    // The finish chunk, then the usage's own.
    let [.., last, usage] = &chunks[..] else { panic!("{text}") };
    Answer {
        text: chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect(),
        tokens: last["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect(),
        cached: last["timings"]["cached_tokens"].as_u64().unwrap(),
        details: usage["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    }
}

/// A conversation of `turns`, as a chat app sends it: each request holds the whole history.
/// Returns each turn's answer.
fn converse(d: &Daemon, turns: &[&str], extra: Value) -> Vec<Answer> {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    let mut answers = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        messages.push(json!({"role": "user", "content": turn}));
        let a = chat(d, &messages, extra.clone(), i % 2 == 1);
        messages.push(json!({"role": "assistant", "content": a.text}));
        answers.push(a);
    }
    answers
}

fn metric(d: &Daemon, name: &str) -> f64 {
    let (code, text) = d.curl("GET", "/metrics", None);
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn a_chat_continues_its_parked_prefix_with_the_tokens_it_gives_without() {
    let d = Daemon::start(Setup::default());
    let with = converse(&d, &TURNS, json!({"prompt_cache_key": "with"}));
    let without = converse(&d, &TURNS, json!({"cache_prompt": false}));
    for (i, (w, wo)) in with.iter().zip(&without).enumerate() {
        assert_eq!(w.tokens, wo.tokens, "turn {}: greedy tokens differ with the prompt cache", i + 1);
        assert_eq!(wo.cached, 0, "turn {}: cache_prompt = false reused tokens", i + 1);
        assert_eq!(w.cached, w.details, "timings and usage agree");
    }
    assert_eq!(with[0].cached, 0, "the first turn has nothing to continue");
    assert!(with[1].cached > 0 && with[2].cached > with[1].cached, "later turns reuse their history");

    // Another key does not see the conversation; a completion continues its own text.
    let other =
        chat(&d, &[json!({"role": "system", "content": SYSTEM})], json!({"prompt_cache_key": "x"}), false);
    assert_eq!(other.cached, 0);
    let (_, r) = d.post("/v1/completions", &json!({"prompt": "The river Danube", "max_tokens": 8}));
    let text = format!("The river Danube{}", r["choices"][0]["text"].as_str().unwrap());
    let (_, r) = d.post("/v1/completions", &json!({"prompt": format!("{text} and"), "max_tokens": 4}));
    assert!(r["timings"]["cached_tokens"].as_u64().unwrap() >= 4, "{r}");

    let status = d.get("/v1/status");
    let parked = status["parked"].as_array().unwrap();
    assert!(!parked.is_empty(), "{status}");
    let model = &status["loaded"][0]["name"];
    assert!(parked.iter().all(|p| &p["model"] == model && p["bytes"].as_u64().unwrap() > 0), "{status}");
    assert!(parked.iter().any(|p| p["key"] == "with"), "{status}");
    assert!(metric(&d, "pocketd_prompt_cache_hits_total") >= 3.0);
    assert!(metric(&d, "pocketd_prompt_cache_reused_tokens_total") > 0.0);
    assert!(metric(&d, "pocketd_prompt_cache_parked_bytes") > 0.0);
}

#[test]
fn dbus_callers_continue_a_conversation_sent_as_history() {
    let d = Daemon::start(Setup { dbus: true, ..Setup::default() });
    let generate = |prompt: &str, history: &[(&str, &str)]| {
        let n = history.len().to_string();
        let mut entries = vec!["history", "a(ss)", &n];
        entries.extend(history.iter().flat_map(|(role, content)| [*role, *content]));
        let o = d.busctl_generate(
            &["--json=short"],
            prompt,
            &[&["max_tokens", "u", "16"], &["cache_key", "s", "dbus-chat"], &entries],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let text = v["data"][0].as_str().unwrap().to_owned();
        (text, v["data"][1]["cached_tokens"]["data"].as_u64().unwrap())
    };
    let (first, cached) = generate(TURNS[0], &[]);
    assert_eq!(cached, 0);
    let (_, cached) = generate(TURNS[1], &[("user", TURNS[0]), ("assistant", &first)]);
    assert!(cached > 0, "the second turn continues the first");
    // A history of the wrong D-Bus type, or with a role that is not one, is refused naming the
    // option and its type; the daemon goes on answering.
    let call = |history: &[&str]| {
        let entry: Vec<&str> = ["history"].into_iter().chain(history.iter().copied()).collect();
        d.busctl_generate(&[], "Hi", &[&["max_tokens", "u", "4"], &entry])
    };
    for bad in [&["as", "1", "hello"][..], &["a(ss)", "1", "wizard", "hello"][..]] {
        let o = call(bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("history") && err.contains("a(ss)"), "{bad:?}: {err}");
    }
    let o = call(&["a(ss)", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// What one conversation costs the daemon: the budget used with the model loaded and idle,
/// the most one session held, and what a parked conversation holds.
fn costs() -> (u64, u64, u64) {
    let d = Daemon::start(Setup::default());
    converse(&d, &TURNS, json!({}));
    let s = d.idle_status(Duration::from_secs(30));
    let parked: u64 =
        s["parked"].as_array().unwrap().iter().map(|p| p["bytes"].as_u64().unwrap()).max().unwrap();
    let used = s["memory"]["used_bytes"].as_u64().unwrap();
    let session = metric(&d, "pocketd_session_peak_bytes") as u64;
    let all_parked = metric(&d, "pocketd_prompt_cache_parked_bytes") as u64;
    (used - all_parked, session, parked)
}

#[test]
fn parked_conversations_give_way_under_a_budget_that_cannot_hold_them_all() {
    let (idle, session, parked) = costs();
    // Room for the model, one running session and about three parked conversations.
    let budget = idle + session + session / 5 + 3 * parked;
    let d = Daemon::start(Setup::default().with_budget(&budget.to_string()));
    let mut histories: Vec<Vec<Value>> = (0..8)
        .map(|i| vec![json!({"role": "system", "content": format!("{SYSTEM} You are assistant {i}.")})])
        .collect();
    let mut reused = 0;
    for turn in TURNS {
        for h in histories.iter_mut() {
            h.push(json!({"role": "user", "content": turn}));
            let a = chat(&d, h, json!({}), false);
            reused += a.cached;
            h.push(json!({"role": "assistant", "content": a.text}));
            let s = d.idle_status(Duration::from_secs(30));
            let m = &s["memory"];
            assert!(m["peak_bytes"].as_u64() <= m["budget_bytes"].as_u64(), "{s}");
            assert!(m["resident_bytes"].as_u64() <= m["budget_bytes"].as_u64(), "{s}");
        }
    }
    assert!(
        metric(&d, "pocketd_prompt_cache_evictions_total") > 0.0,
        "eight conversations cannot all stay parked"
    );
    assert!(reused > 0, "the most recent conversations were still continued");
    let s = d.get("/v1/status");
    let parked_bytes: u64 =
        s["parked"].as_array().unwrap().iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert!(parked_bytes <= budget - idle, "{s}");
}

#[test]
fn parked_conversations_survive_a_restart_and_a_corrupt_file_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts");
    let setup = || Setup { extra: format!("prompt_cache_dir = {prompts:?}\n"), ..Setup::default() };
    let mut d = Daemon::start(setup());
    let answers = converse(&d, &TURNS[..2], json!({}));
    assert!(d.terminate().success());
    // The parked conversations' files (earlier answers are kept in a directory beside them).
    let parked = || {
        let files = std::fs::read_dir(&prompts).unwrap().flatten().map(|e| e.path());
        files.filter(|p| p.extension().is_some_and(|e| e == "pkv")).collect::<Vec<_>>()
    };
    assert!(!parked().is_empty(), "stopping wrote the parked conversation to {}", prompts.display());

    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for (turn, a) in TURNS.iter().zip(&answers) {
        messages.push(json!({"role": "user", "content": turn}));
        messages.push(json!({"role": "assistant", "content": a.text}));
    }
    messages.push(json!({"role": "user", "content": TURNS[2]}));

    let mut d = Daemon::start(setup());
    let after_restart = chat(&d, &messages, json!({}), false);
    assert!(after_restart.cached > 0, "the next turn continues from disk:\n{}", d.log());
    assert!(d.terminate().success());

    for f in parked() {
        let mut bytes = std::fs::read(&f).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x55;
        std::fs::write(&f, bytes).unwrap();
    }
    let d = Daemon::start(setup());
    let corrupted = chat(&d, &messages, json!({}), false);
    assert_eq!(corrupted.cached, 0, "a corrupt file is never loaded");
    assert_eq!(corrupted.tokens, after_restart.tokens);
    let log = d.log();
    assert!(log.contains("ignoring prompt cache file") && log.contains("checksum"), "{log}");
}

#[test]
fn an_encoder_decoder_reuses_the_encoded_source_of_a_repeated_text() {
    let d = Daemon::start(Setup { flan: true, ..Setup::default() });
    let body = json!({"model": "flan-t5-small", "prompt": "translate English to German: The house is small.", "max_tokens": 12, "return_tokens": true});
    let (code, first) = d.post("/v1/completions", &body);
    assert_eq!(code, 200, "{first}");
    assert_eq!(first["timings"]["cached_tokens"], 0);
    let (_, again) = d.post("/v1/completions", &body);
    assert_eq!(
        again["timings"]["cached_tokens"], again["usage"]["prompt_tokens"],
        "the whole source: {again}"
    );
    assert_eq!(again["tokens"], first["tokens"]);
    let other = json!({"model": "flan-t5-small", "prompt": "translate English to German: The house is big.", "max_tokens": 4});
    let (_, r) = d.post("/v1/completions", &other);
    assert_eq!(r["timings"]["cached_tokens"], 0, "another source shares no encoder output");
}
