//! Earlier answers drafted into later ones (the answer histories), through a real pocketd on
//! SmolLM2: drafted under their key only, greedy answers unchanged, shown in `/v1/status`,
//! cleared over HTTP and D-Bus, kept across a restart where the prompt cache has a directory,
//! and a cancelled answer never kept.

mod common;

use std::io::Read;
use std::time::Duration;

use common::{Daemon, Setup, raw_request};
use serde_json::{Value, json};

const SYSTEM: &str = "You control a smart home. Turn the user's command into one JSON object with the keys \
                      \"action\", \"device\" and \"room\". Answer with the JSON object only.";

/// A greedy chat request for `command` under `key`, with `spec`; the answer's tokens and the
/// tokens drafted from earlier answers.
fn ask(d: &Daemon, key: &str, spec: &str, command: &str) -> (Vec<u64>, u64) {
    let body = json!({
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": command}],
        "max_tokens": 48,
        "temperature": 0,
        "spec": spec,
        "prompt_cache_key": key,
        "return_tokens": true,
    });
    let (code, r) = d.post("/v1/chat/completions", &body);
    assert_eq!(code, 200, "{r}");
    let tokens = r["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    (tokens, r["timings"]["recalled"].as_u64().unwrap())
}

/// The histories `/v1/status` lists under `key`.
fn listed(status: &Value, key: &str) -> Vec<Value> {
    status["histories"]
        .as_array()
        .map_or(Vec::new(), |h| h.iter().filter(|h| h["key"] == key).cloned().collect())
}

#[test]
fn earlier_answers_are_drafted_under_their_key_only_and_forgotten_when_cleared() {
    let d = Daemon::start(Setup { dbus: true, ..Setup::default() });
    let (reference, recalled) = ask(&d, "app-a", "off", "Turn off the kitchen lights.");
    assert_eq!(recalled, 0);
    let status = d.get("/v1/status");
    let a = listed(&status, "app-a");
    assert_eq!(a.len(), 1, "{status}");
    assert_eq!(a[0]["answers"], 1);
    assert!(a[0]["bytes"].as_u64().unwrap() > 0 && a[0]["tokens"].as_u64().unwrap() > reference.len() as u64);

    // The same app asking again: its earlier answer is drafted, and the answer is the same.
    let (again, recalled) = ask(&d, "app-a", "suffix", "Turn off the kitchen lights.");
    assert_eq!(again, reference);
    assert!(recalled > 0, "nothing drafted from the earlier answer");
    // A similar command: whatever is drafted, the answer is plain decoding's.
    let (similar, _) = ask(&d, "app-a", "suffix", "Turn off the hallway lights.");
    let (plain, _) = ask(&d, "reference", "off", "Turn off the hallway lights.");
    assert_eq!(similar, plain);

    // Another app has none of app-a's answers to draft from.
    let (other, recalled) = ask(&d, "app-b", "suffix", "Turn off the kitchen lights.");
    assert_eq!((other, recalled), (reference.clone(), 0));

    // Cleared over HTTP: app-a's are gone, app-b's stay.
    let (code, body) = d.curl("POST", "/v1/cache/clear", Some(br#"{"prompt_cache_key": "app-a"}"#));
    assert_eq!(code, 200, "{body}");
    let cleared: Value = serde_json::from_str(&body).unwrap();
    assert!(cleared["histories"] == 1 && cleared["bytes"].as_u64().unwrap() > 0, "{cleared}");
    let status = d.get("/v1/status");
    assert!(listed(&status, "app-a").is_empty() && listed(&status, "app-b").len() == 1, "{status}");
    let (_, recalled) = ask(&d, "app-a", "suffix", "Turn off the kitchen lights.");
    assert_eq!(recalled, 0);
    // A body that is not the endpoint's is refused by name.
    let (code, body) = d.curl("POST", "/v1/cache/clear", Some(br#"{"key": "app-a"}"#));
    assert!(code == 400 && body.contains("key"), "{code} {body}");

    // Cleared over D-Bus: all of them.
    let out = d.busctl_call(&[], "ClearCache", "s", &[""]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("u "), "{out:?}");
    assert!(d.get("/v1/status")["histories"].as_array().is_none_or(Vec::is_empty));
}

#[test]
fn earlier_answers_are_kept_across_a_restart_beside_the_prompt_cache() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts");
    let setup = || Setup { extra: format!("prompt_cache_dir = {prompts:?}\n"), ..Setup::default() };
    let histories = prompts.join("histories");
    let files = || std::fs::read_dir(&histories).map_or(0, |d| d.count());
    let mut d = Daemon::start(setup());
    let (reference, _) = ask(&d, "app-a", "off", "Turn off the kitchen lights.");
    assert!(d.terminate().success());
    assert_eq!(files(), 1, "one history written to {}", histories.display());

    let d = Daemon::start(setup());
    let status = d.get("/v1/status");
    assert_eq!(listed(&status, "app-a").len(), 1, "{status}");
    let (again, recalled) = ask(&d, "app-a", "suffix", "Turn off the kitchen lights.");
    assert_eq!(again, reference);
    assert!(recalled > 0, "nothing drafted from the answer given before the restart:\n{}", d.log());
    // Clearing forgets it on disk too.
    let (code, body) = d.curl("POST", "/v1/cache/clear", Some(br#"{"prompt_cache_key": "app-a"}"#));
    assert_eq!(code, 200, "{body}");
    assert_eq!(files(), 0);
}

#[test]
fn a_cancelled_answer_is_not_kept() {
    let d = Daemon::start(Setup::default());
    let body = json!({
        "prompt": "Once upon a time",
        "max_tokens": 1000,
        "stream": true,
        "prompt_cache_key": "hung-up",
    });
    let mut s = raw_request(&d.socket, "/v1/completions", &body);
    d.wait_generating();
    let mut first = [0u8; 64];
    assert!(s.read(&mut first).unwrap() > 0);
    drop(s);
    let status = d.idle_status(Duration::from_secs(30));
    assert!(listed(&status, "hung-up").is_empty(), "{status}");
    // A finished one under the same key is.
    let (code, r) = d.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 8, "prompt_cache_key": "hung-up"}),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(listed(&d.get("/v1/status"), "hung-up").len(), 1);
}
