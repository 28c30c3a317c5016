//! pocketd end to end, on real parts: the real binary on a temporary socket, a private
//! dbus-daemon, the default model (SmolLM2-135M, pulled by `scripts/test`), and the clients
//! another app would use — curl, dbus-send, busctl, a zbus proxy, a raw socket that hangs up.

use std::io::{Read, Write};

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::*;

#[test]
fn chat_and_completions_answer_over_the_socket_streamed_and_not() {
    let d = Daemon::start(Setup::default());
    let (code, r) = d.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}], "max_tokens": 24}),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], "smollm2.gguf", "a bare file is served under its file name");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert!(r["choices"][0]["message"]["content"].as_str().unwrap().contains("Paris"), "{r}");
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let id = r["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-") && id.len() > "chatcmpl-".len() + 8, "OpenAI's prefix, unique: {id}");

    // The same request streamed gives the same text (greedy), in OpenAI's chunks.
    let body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                      "max_tokens": 24, "stream": true, "stream_options": {"include_usage": true}});
    let (code, text) = d.curl("POST", "/v1/chat/completions", Some(body.to_string().as_bytes()));
    assert_eq!(code, 200, "{text}");
    let events = sse_data(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{text}");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let stream_id = chunks[0]["id"].as_str().unwrap();
    assert!(stream_id.starts_with("chatcmpl-") && stream_id != id, "{stream_id} after {id}");
    assert!(chunks.iter().all(|c| c["id"] == stream_id), "one id for the whole stream");
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, r["choices"][0]["message"]["content"].as_str().unwrap());
    // The finish chunk, then (include_usage) the usage in a chunk of its own, as OpenAI's.
    let [.., finish, last] = &chunks[..] else { panic!("{text}") };
    assert!(finish["choices"][0]["finish_reason"].is_string(), "{finish}");
    assert!(
        finish["choices"][0]["delta"].get("content").is_none(),
        "no content on the finish chunk: {finish}"
    );
    assert!(finish.get("usage").is_none() && last["choices"] == json!([]), "{finish}\n{last}");
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c.get("usage").is_none()), "{text}");
    // The streamed request repeats the first one's prompt, so it prefills only the last token
    // (its logits are needed); everything else in the usage is the same.
    let mut usage = last["usage"].clone();
    let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1, "{usage}");
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{r}");
    usage["prompt_tokens_details"]["cached_tokens"] = json!(0);
    assert_eq!(usage, r["usage"]);

    // Text completion, raw prompt, streamed and not, with a stop string.
    let (code, c) =
        d.post("/v1/completions", &json!({"prompt": "The capital of France is", "max_tokens": 8}));
    assert_eq!(code, 200, "{c}");
    assert_eq!(c["object"], "text_completion");
    assert!(c["id"].as_str().unwrap().starts_with("cmpl-"), "{c}");
    let (code, text) = d.curl(
        "POST",
        "/v1/completions",
        Some(
            json!({"prompt": "The capital of France is", "max_tokens": 8, "stream": true})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!(code, 200);
    let streamed: String = sse_data(&text)
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, c["choices"][0]["text"].as_str().unwrap());

    // Models, status, metrics.
    let models = d.get("/v1/models");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "smollm2.gguf");
    assert_eq!(d.get("/v1/models/smollm2.gguf"), models["data"][0], "one model as the list has it");
    let (code, body) = d.curl("GET", "/v1/models/no-such-model", None);
    assert!(code == 404 && body.contains("model_not_found"), "{code} {body}");
    let status = d.get("/v1/status");
    assert_eq!(status["loaded"][0]["name"], "smollm2.gguf");
    assert!(
        status["memory"]["used_bytes"].as_u64().unwrap()
            <= status["memory"]["budget_bytes"].as_u64().unwrap()
    );
    let (code, metrics) = d.curl("GET", "/metrics", None);
    assert_eq!(code, 200);
    assert!(metrics.contains("pocketd_requests_total{outcome=\"ok\"} 4"), "{metrics}");
    assert!(metrics.contains("# TYPE pocketd_generated_tokens_total counter"));

    // OpenAI's other prompt forms: a list of prompts (a choice each, in order, the usage
    // summed), token ids.
    let (code, two) = d.post(
        "/v1/completions",
        &json!({"prompt": ["The capital of France is", "The capital of Italy is"], "max_tokens": 8}),
    );
    assert_eq!(code, 200, "{two}");
    assert_eq!((&two["choices"][0]["index"], &two["choices"][1]["index"]), (&json!(0), &json!(1)), "{two}");
    assert_eq!(two["choices"][0]["text"], c["choices"][0]["text"], "greedy: the first prompt's answer alone");
    assert!(two["choices"][1]["text"].as_str().unwrap().contains("Rome"), "{two}");
    let tokens = |r: &Value| r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(tokens(&two) > tokens(&c), "{two}");
    for prompt in [json!([504, 3575, 282]), json!([[504, 3575], [282]])] {
        let (code, r) = d.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 4}));
        assert_eq!(code, 200, "{prompt}: {r}");
        assert_eq!(r["choices"].as_array().unwrap().len(), prompt[0].as_array().map_or(1, |_| 2), "{r}");
    }
    for (prompt, stream, needle) in [
        (json!([1, 2, 1_000_000]), false, "token 1000000"),
        (json!([]), false, "empty list"),
        (json!(["a", "b"]), true, "2 prompts in one stream"),
    ] {
        let body = json!({"prompt": prompt, "max_tokens": 4, "stream": stream});
        let (code, r) = d.post("/v1/completions", &body);
        assert_eq!((code, &r["error"]["param"]), (400, &json!("prompt")), "{body}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(needle), "{r}");
    }
}

#[test]
fn bad_requests_get_openai_shaped_errors_with_the_right_status() {
    let d = Daemon::start(Setup { extra: "ctx_size = 128\n".into(), ..Setup::default() });
    let check = |code: u16, body: &str, status: u16, kind: &str, needle: &str| {
        assert_eq!(code, status, "{body}");
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{v}");
    };
    let (code, body) = d.curl("POST", "/v1/chat/completions", Some(b"{\"messages\": [}"));
    check(code, &body, 400, "invalid_request_error", "not valid");
    let (code, body) = d.curl("POST", "/v1/completions", Some(b"{\"prompt\": \"caf\xff\xfe\"}"));
    check(code, &body, 400, "invalid_request_error", "UTF-8");
    let (code, body) = d.curl(
        "POST",
        "/v1/chat/completions",
        Some(br#"{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}"#),
    );
    check(code, &body, 404, "not_found_error", "smollm2.gguf");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&v["error"]["code"], &v["error"]["param"]),
        (&json!("model_not_found"), &json!("model")),
        "{v}"
    );
    let (code, body) =
        d.curl("POST", "/v1/completions", Some(br#"{"model": "../../etc/passwd", "prompt": "hi"}"#));
    check(code, &body, 400, "invalid_request_error", "paths are not accepted");
    let long = "word ".repeat(400);
    let (code, body) =
        d.curl("POST", "/v1/completions", Some(json!({"prompt": long}).to_string().as_bytes()));
    check(code, &body, 400, "invalid_request_error", "context holds 128");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let (code, body) = d.curl("POST", "/v1/completions", Some(br#"{"prompt": "hi", "temperature": -1}"#));
    check(code, &body, 400, "invalid_request_error", "temperature");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((&v["error"]["code"], &v["error"]["param"]), (&json!("invalid_value"), &json!("temperature")));
    let (code, body) = d.curl("POST", "/v1/completions", Some(br#"{"prompt": "hi", "top_p": 7}"#));
    check(code, &body, 400, "invalid_request_error", "top_p");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"]["param"], "top_p", "{body}");
    let (code, body) = d.curl("POST", "/v1/completions", Some(br#"{"prompt": "hi", "spec": "warp"}"#));
    check(code, &body, 400, "invalid_request_error", "speculation mode");
    let (code, body) = d.curl("POST", "/v1/completions", Some(br#"{"prompt": "hi", "max_tokens": 0}"#));
    check(code, &body, 400, "invalid_request_error", "max_tokens");
    let (code, body) = d.curl("POST", "/v1/chat/completions", Some(br#"{"messages": []}"#));
    check(code, &body, 400, "invalid_request_error", "messages is empty");
    for n in [0, 17] {
        let body = json!({"prompt": "hi", "n": n}).to_string();
        let (code, body) = d.curl("POST", "/v1/completions", Some(body.as_bytes()));
        check(code, &body, 400, "invalid_request_error", "from 1 to 16");
    }
    let big = vec![b'a'; 5 << 20];
    let (code, body) = d.curl("POST", "/v1/completions", Some(&big));
    check(code, &body, 413, "invalid_request_error", "larger than");
    // response_format keys that are not OpenAI's are refused, not dropped (a schema beside
    // json_object would go unenforced).
    for (format, key) in [
        (json!({"type": "json_object", "schema": {"type": "object"}}), "schema"),
        (json!({"type": "text", "foo": 1}), "foo"),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "response_format": format});
        let (code, body) = d.curl("POST", "/v1/chat/completions", Some(body.to_string().as_bytes()));
        check(code, &body, 400, "invalid_request_error", key);
    }
    let (code, body) = d.curl("GET", "/health", None);
    assert_eq!((code, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (code, body) = d.curl("GET", "/v2/nothing", None);
    check(code, &body, 404, "not_found_error", "no such endpoint");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((&v["error"]["code"], &v["error"]["param"]), (&json!("unknown_url"), &Value::Null), "{v}");
    // The daemon is still serving after all that.
    let (code, r) = d.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2}));
    assert_eq!(code, 200, "{r}");
}

#[test]
fn a_budget_that_cannot_hold_the_model_is_a_503_with_the_numbers() {
    // Room for the process, not for the weights.
    let d = Daemon::start(Setup::default().with_budget("80MiB"));
    let (code, r) = d.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2}));
    assert_eq!(code, 503, "{r}");
    assert_eq!(r["error"]["code"], "over_memory_budget");
    let m = r["error"]["message"].as_str().unwrap();
    assert!(m.contains("MiB") && m.contains("budget"), "{m}");
}

#[test]
fn an_encoder_decoder_model_answers_completions_and_refuses_chat() {
    let d = Daemon::start(Setup { flan: true, ..Setup::default() });
    let prompt = "translate English to German: The house is wonderful.";
    let mut texts = Vec::new();
    for spec in ["off", "inputcopy", "suffix", "auto"] {
        let (code, r) = d.post(
            "/v1/completions",
            &json!({"model": "flan-t5-small", "prompt": prompt, "max_tokens": 32, "spec": spec}),
        );
        assert_eq!(code, 200, "{spec}: {r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert_eq!(r["usage"]["prompt_tokens"], 11, "the source's tokens: {r}");
        texts.push(r["choices"][0]["text"].as_str().unwrap().to_owned());
    }
    assert_eq!(texts[0], "Das Haus ist wunderbar.");
    assert!(texts.iter().all(|t| *t == texts[0]), "greedy text changed with drafting: {texts:?}");
    let (code, r) = d.post(
        "/v1/chat/completions",
        &json!({"model": "flan-t5-small", "messages": [{"role": "user", "content": prompt}]}),
    );
    assert_eq!(code, 400, "{r}");
    let m = r["error"]["message"].as_str().unwrap();
    assert!(m.contains("no chat template") && m.contains("completion prompt"), "{m}");
    let (code, r) =
        d.post("/v1/completions", &json!({"model": "flan-t5-small", "prompt": prompt, "spec": "layerskip"}));
    assert_eq!(code, 400, "{r}");
    // The decoder model is still served beside it; input copying is for encoder-decoders.
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2}));
    assert_eq!(code, 200);
    let (code, r) =
        d.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 2, "spec": "inputcopy"}));
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("use suffix"), "{r}");
}

#[test]
fn a_client_that_hangs_up_cancels_its_generation_and_the_memory_comes_back() {
    let d = Daemon::start(Setup::default());
    // Load the model, and see what the budget holds with no session.
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(code, 200);
    let baseline = used_without_parked(&d.idle_status(Duration::from_secs(5)));
    for stream in [true, false] {
        let mut s = raw_request(
            &d.socket,
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 1000, "stream": stream}),
        );
        // Wait until it is generating, then hang up.
        let st = d.wait_generating();
        assert!(used_without_parked(&st) > baseline, "the session holds memory: {st}");
        if stream {
            let mut first = [0u8; 64];
            assert!(s.read(&mut first).unwrap() > 0);
        }
        drop(s);
        // 1000 tokens would take several seconds; the hang-up ends it at the next token.
        let st = d.idle_status(Duration::from_secs(3));
        // What the session held is back, or parked for the next request with this prefix.
        assert_eq!(used_without_parked(&st), baseline, "stream={stream}: {st}");
        let generated = d.curl("GET", "/metrics", None).1;
        assert!(generated.contains("pocketd_requests_total"), "{generated}");
    }
}

#[test]
fn thirty_two_concurrent_clients_are_all_answered_or_refused_none_lost_or_hung() {
    let d = Daemon::start(Setup { extra: "parallel = 2\nqueue = 6\n".into(), ..Setup::default() });
    let start = Instant::now();
    let results: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let d = &d;
                scope.spawn(move || {
                    let body = json!({"messages": [{"role": "user", "content": format!("Count to {i}.")}], "max_tokens": 12});
                    d.curl("POST", "/v1/chat/completions", Some(body.to_string().as_bytes()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let answered = results.iter().filter(|(c, _)| *c == 200).count();
    let refused = results.iter().filter(|(c, _)| *c == 429 || *c == 503).count();
    let other: Vec<_> = results.iter().filter(|(c, _)| ![200, 429, 503].contains(c)).collect();
    eprintln!(
        "32 clients: {answered} answered, {refused} refused, {} other, in {:?}",
        other.len(),
        start.elapsed()
    );
    assert!(other.is_empty(), "lost or hung: {other:?}");
    assert_eq!(answered + refused, 32);
    assert!(answered >= 8, "2 running + 6 queued places: at least 8 answered, got {answered}");
    for (code, body) in &results {
        let v: Value = serde_json::from_str(body).unwrap();
        match code {
            200 => assert!(!v["choices"][0]["message"]["content"].as_str().unwrap().is_empty()),
            _ => assert_eq!(v["error"]["type"], "rate_limit_error", "{v}"),
        }
    }
    let st = d.idle_status(Duration::from_secs(5));
    assert_eq!(st["queued"], 0);
}

#[test]
fn sigterm_mid_generation_ends_the_stream_and_exits_cleanly() {
    let mut d = Daemon::start(Setup { extra: "shutdown_seconds = 1\n".into(), ..Setup::default() });
    let mut s = raw_request(
        &d.socket,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true}),
    );
    let mut first = [0u8; 256];
    assert!(s.read(&mut first).unwrap() > 0);
    let start = Instant::now();
    let status = d.terminate();
    assert!(status.success(), "pocketd exited with {status}:\n{}", d.log());
    assert!(start.elapsed() < Duration::from_secs(8), "took {:?}", start.elapsed());
    // The stream was ended (cancelled at the deadline), not cut mid-event.
    let mut rest = String::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read_to_string(&mut rest);
    assert!(rest.contains("\"finish_reason\":\"cancelled\"") && rest.contains("[DONE]"), "{rest}");
    assert!(!d.socket.exists(), "the socket file is removed at exit");
    let log = d.log();
    assert!(log.contains("SIGTERM") && log.contains("stopped"), "{log}");
}

#[test]
fn models_load_and_unload_on_request_and_idle_ones_make_room() {
    let qwen = root().join("models/store/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(qwen.is_file(), "run: pocket pull qwen2.5-coder-0.5b (missing {})", qwen.display());
    // Room for the process and either model, not both.
    let d = Daemon::start(Setup::default().with_budget("560MiB"));
    std::os::unix::fs::symlink(&qwen, d.dir.path().join("models/qwen.gguf")).unwrap();
    let (code, r) = d.post("/v1/models/qwen/load", &json!({}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["model"], "qwen.gguf");
    assert!(r["loaded"].as_bool().unwrap() && r["bytes"].as_u64().unwrap() > 300 << 20, "{r}");
    // The default model does not fit beside it: the idle qwen is unloaded to make room.
    let (code, r) = d.post("/v1/completions", &json!({"prompt": "Hello", "max_tokens": 4}));
    assert_eq!(code, 200, "{r}");
    let st = d.get("/v1/status");
    let loaded: Vec<&str> =
        st["loaded"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(loaded, ["smollm2.gguf"], "{st}");
    assert!(d.log().contains("unloaded to make room"), "{}", d.log());
    let (code, r) = d.post("/v1/models/smollm2.gguf/unload", &json!({}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["loaded"], false);
    assert!(d.get("/v1/status")["loaded"].as_array().unwrap().is_empty());
    let (code, r) = d.post("/v1/models/nothing/load", &json!({}));
    assert_eq!(code, 404, "{r}");
}

/// A GGUF of an architecture our graph does not build is served through llama.cpp's graph:
/// listed and reported with that engine, answering plain and suffix-speculating requests with
/// the same greedy tokens, and refusing layer skipping with what it offers instead.
#[test]
fn models_our_graph_does_not_build_are_served_by_llama_cpp() {
    let d = Daemon::start(Setup::default());
    std::os::unix::fs::symlink(olmo2(), d.dir.path().join("models/olmo2.gguf")).unwrap();
    let models = d.get("/v1/models");
    let engine_of = |id: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("{models}"))["engine"]
            .clone()
    };
    assert_eq!(engine_of("olmo2.gguf"), "llama.cpp", "{models}");
    assert_eq!(engine_of("smollm2.gguf"), "ggml", "{models}");
    let ask = |spec: &str| {
        let body = json!({"model": "olmo2", "prompt": "one two three one two three one two", "max_tokens": 24,
                          "temperature": 0, "spec": spec, "return_tokens": true});
        d.post("/v1/completions", &body)
    };
    let (code, plain) = ask("off");
    assert_eq!(code, 200, "{plain}");
    let (code, suffix) = ask("suffix");
    assert_eq!(code, 200, "{suffix}");
    assert_eq!(plain["tokens"], suffix["tokens"], "{plain}\n{suffix}");
    assert_eq!(plain["choices"][0]["text"], suffix["choices"][0]["text"]);
    let (code, r) = ask("layerskip");
    assert_eq!(code, 400, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("suffix"), "{r}");
    let status = d.get("/v1/status");
    let loaded = status["loaded"].as_array().unwrap();
    let olmo = loaded.iter().find(|m| m["name"] == "olmo2.gguf").unwrap_or_else(|| panic!("{status}"));
    assert_eq!(olmo["engine"], "llama.cpp", "{status}");
}

#[test]
fn idle_models_are_unloaded_after_their_keep_alive() {
    let d = Daemon::start(Setup { extra: "keep_alive_seconds = 1\n".into(), ..Setup::default() });
    let (code, _) = d.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}));
    assert_eq!(code, 200);
    let start = Instant::now();
    while !d.get("/v1/status")["loaded"].as_array().unwrap().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "still loaded");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dbus_generate_start_cancel_properties_and_named_errors() {
    let d = Daemon::start(Setup { dbus: true, ..Setup::default() });
    // As a shell script would call it: busctl and dbus-send.
    let o = d.busctl_generate(
        &[],
        "What is the capital of France? Answer in one word.",
        &[&["max_tokens", "u", "24"]],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Paris") && out.contains("completion_tokens"), "{out}");
    let o = d.dbus_send(&["org.pocketd.Pocketd1.ListModels"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("smollm2.gguf"), "{o:?}");
    // A wrong signature is refused by the bus binding, naming what was expected.
    let o = d.dbus_send(&["org.pocketd.Pocketd1.Generate", "string:", "int32:5"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && e.contains("org.freedesktop.DBus.Error.InvalidArgs") && e.contains("ssa{sv}"),
        "{e}"
    );
    let o = d.dbus_send(&["org.pocketd.Pocketd1.LoadModel", "string:nope"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("org.pocketd.Error.UnknownModel"), "{o:?}");
    let o = d.busctl_generate(&[], "hi", &[&["temperature", "s", "hot"]]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be a double"), "{o:?}");
    let o = d.busctl_generate(&[], "hi", &[&["colour", "s", "blue"]]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("unknown option") && e.contains("max_tokens"), "{e}");
    let o = d.dbus_send(&["org.pocketd.Pocketd1.Cancel", "objpath:/org/pocketd/Pocketd1/jobs/999"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("org.pocketd.Error.InvalidArgument") && e.contains("no running job"), "{e}");
    let o = d.dbus(&[
        "get-property",
        "org.pocketd.Pocketd1",
        "/org/pocketd/Pocketd1",
        "org.pocketd.Pocketd1",
        "BudgetBytes",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("t {}", 1u64 << 30));

    // As a Rust app would: a zbus proxy, a job's signals, cancel, and the properties.
    let address = d.bus.as_ref().unwrap().address.clone();
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async move {
        zbus_client(&address).await;
    });
}

#[zbus::proxy(
    interface = "org.pocketd.Pocketd1",
    default_service = "org.pocketd.Pocketd1",
    default_path = "/org/pocketd/Pocketd1"
)]
trait Pocketd1 {
    fn generate(
        &self,
        model: &str,
        prompt: &str,
        options: std::collections::HashMap<&str, zbus::Variant<'_>>,
    ) -> zbus::Result<(String, std::collections::HashMap<String, zbus::OwnedVariant>)>;
    fn start(
        &self,
        model: &str,
        prompt: &str,
        options: std::collections::HashMap<&str, zbus::Variant<'_>>,
    ) -> zbus::Result<zbus::OwnedObjectPath>;
    fn cancel(&self, job: &zbus::ObjectPath<'_>) -> zbus::Result<()>;
    #[zbus(property)]
    fn loaded_models(&self) -> zbus::Result<Vec<String>>;
    #[zbus(property)]
    fn used_bytes(&self) -> zbus::Result<u64>;
}

#[zbus::proxy(interface = "org.pocketd.Pocketd1.Job", default_service = "org.pocketd.Pocketd1")]
trait Job {
    #[zbus(signal)]
    fn token(&self, text: &str) -> zbus::Result<()>;
    #[zbus(signal)]
    fn finished(
        &self,
        text: &str,
        stats: std::collections::HashMap<String, zbus::OwnedVariant>,
    ) -> zbus::Result<()>;
    #[zbus(signal)]
    fn failed(&self, error: &str, message: &str) -> zbus::Result<()>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn text(&self) -> zbus::Result<String>;
}

async fn zbus_client(address: &str) {
    use futures_util::StreamExt;
    let connection = zbus::connection::Builder::address(address).build().await.unwrap();
    let p = Pocketd1Proxy::new(&connection).await.unwrap();
    let options = |n: u32| std::collections::HashMap::from([("max_tokens", zbus::Variant::from(n))]);
    let (text, stats) = p
        .generate("smollm2", "What is the capital of France? Answer in one word.", options(24))
        .await
        .unwrap();
    assert!(text.contains("Paris"), "{text}");
    assert!(stats.contains_key("decode_tok_per_s"));
    assert_eq!(p.loaded_models().await.unwrap(), ["smollm2.gguf"]);

    // A job: subscribe to the jobs' signals first, then start, then collect its tokens.
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface("org.pocketd.Pocketd1.Job")
        .path_namespace("/org/pocketd/Pocketd1/jobs")
        .build()
        .unwrap();
    let mut signals = zbus::MessageStream::for_match_rule(rule, &connection, None).await.unwrap();
    let job = p.start("", "What is the capital of France? Answer in one word.", options(24)).await.unwrap();
    let mut streamed = String::new();
    let finished_text = loop {
        let m =
            tokio::time::timeout(Duration::from_secs(60), signals.next()).await.unwrap().unwrap().unwrap();
        let header = m.header();
        assert_eq!(header.path().unwrap().as_str(), job.as_str());
        match header.member().unwrap().as_str() {
            "Token" => streamed.push_str(&m.body().deserialize::<String>().unwrap()),
            "Finished" => {
                let (t, _stats): (String, std::collections::HashMap<String, zbus::OwnedVariant>) =
                    m.body().deserialize().unwrap();
                break t;
            }
            other => panic!("unexpected {other}"),
        }
    };
    assert_eq!(streamed, finished_text);
    assert_eq!(streamed, text, "greedy: the job's text is Generate's");
    let jp = JobProxy::builder(&connection).path(job.clone()).build().await.unwrap();
    assert_eq!(jp.state().await.unwrap(), "finished");
    assert_eq!(jp.text().await.unwrap(), text);

    // Cancel a long job: Failed with org.pocketd.Error.Cancelled, and the memory comes back.
    let job = p.start("", "Once upon a time", options(2000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.cancel(&job.as_ref()).await.unwrap();
    loop {
        let m =
            tokio::time::timeout(Duration::from_secs(30), signals.next()).await.unwrap().unwrap().unwrap();
        if m.header().path().unwrap().as_str() != job.as_str() {
            continue;
        }
        if m.header().member().unwrap().as_str() == "Failed" {
            let (name, _msg): (String, String) = m.body().deserialize().unwrap();
            assert_eq!(name, "org.pocketd.Error.Cancelled");
            break;
        }
    }
    let err = p.generate("no-such-model", "hi", options(1)).await.unwrap_err();
    assert!(err.to_string().contains("org.pocketd.Error.UnknownModel"), "{err}");
}

#[test]
fn socket_activation_serves_the_inherited_socket() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    std::os::unix::fs::symlink(smollm2(), models.join("smollm2.gguf")).unwrap();
    let socket = dir.path().join("activated.sock");
    // The config names another path: the inherited socket wins.
    let config = dir.path().join("pocketd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodels_dir = {models:?}\ndefault_model = \"smollm2\"\nbus = \"none\"\nthreads = 1\n",
            dir.path().join("unused.sock")
        ),
    )
    .unwrap();
    let mut child = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .arg(env!("CARGO_BIN_EXE_pocketd"))
        .arg("--config")
        .arg(&config)
        .env("POCKET_CACHE_DIR", dir.path().join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("systemd-socket-activate runs (Debian package systemd)");
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first connection starts pocketd, which then answers on the socket it was handed.
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "60", "--unix-socket"])
        .arg(&socket)
        .args([
            "http://localhost/v1/completions",
            "-d",
            r#"{"prompt": "The capital of France is", "max_tokens": 4}"#,
        ])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&o.stdout);
    assert!(body.contains("text_completion"), "{body} {}", String::from_utf8_lossy(&o.stderr));
    assert!(!dir.path().join("unused.sock").exists(), "the configured path was not bound");
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("from systemd"), "{log}");
}

#[test]
fn the_pocket_client_asks_lists_and_reports_status() {
    let d = Daemon::start(Setup::default());
    let pocket = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pocket")).args(args).arg("--socket").arg(&d.socket).output().unwrap()
    };
    let o = pocket(&["ask", "What is the capital of France? Answer in one word.", "-n", "24", "--stats"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Paris"));
    let stats: Value = serde_json::from_slice(&o.stderr).unwrap();
    assert!(stats["ttft_ms"].as_f64().unwrap() > 0.0, "{stats}");
    let o = pocket(&["models"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("smollm2.gguf"), "{o:?}");
    let o = pocket(&["status"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("memory:"), "{o:?}");
    // chat: one turn per line of input, the conversation carried over.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(["chat", "-n", "16", "--socket"])
        .arg(&d.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France? Answer in one word.\nAnd of Italy?\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.is_empty()).count(), 2, "{o:?}");
    // No daemon there: a clear error.
    let o = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(["status", "--socket", "/nonexistent.sock"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot connect to pocketd"), "{o:?}");
}

#[test]
fn the_openai_python_client_talks_over_the_socket() {
    let python = std::env::var("POCKET_TEST_PYTHON").unwrap_or_else(|_| {
        let venv = root().join("target/pyenv/bin/python");
        venv.to_string_lossy().into_owned()
    });
    let has_openai =
        Command::new(&python).args(["-c", "import openai, httpx"]).status().is_ok_and(|s| s.success());
    assert!(has_openai, "the openai client is needed: scripts/test installs it into target/pyenv ({python})");
    let d = Daemon::start(Setup::default());
    let o = Command::new(&python)
        .arg(root().join("examples/openai_client.py"))
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("Paris"), "{out}");
    assert!(out.contains("streamed:"), "{out}");
    // include_usage: the client finds the usage on the stream's last chunk, and one id.
    let usage = out.lines().find_map(|l| l.strip_prefix("streamed usage: ")).unwrap_or_default();
    assert!(usage.ends_with("generated tokens") && !usage.starts_with('0'), "{out}");
    let id = out.lines().find_map(|l| l.strip_prefix("stream id: ")).unwrap_or_default();
    assert!(id.starts_with("chatcmpl-") && !id.contains(','), "{out}");
}

#[test]
fn openais_edges_hold_for_the_openai_python_client() {
    let d = Daemon::start(Setup {
        extra: "[model_aliases]\n\"gpt-4o-mini\" = \"smollm2\"\n".into(),
        ..Setup::default()
    });
    python_checks(&d, "openai_edges.py", &["--alias", "gpt-4o-mini"]);
}

#[test]
fn the_anthropic_python_client_speaks_the_messages_api() {
    let d = Daemon::start(Setup::default());
    python_checks(&d, "anthropic_messages.py", &[]);
}

#[test]
fn the_openai_python_client_speaks_the_responses_api() {
    let d = Daemon::start(Setup::default());
    python_checks(&d, "responses_api.py", &[]);
}

/// `pocket` with its speculation cache in `cache`.
fn pocket(cache: &Path, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_pocket"))
        .args(args)
        .env("POCKET_CACHE_DIR", cache)
        .env("POCKET_MODELS_DIR", root().join("models/store"))
        .output()
        .expect("the pocket binary runs");
    assert!(o.status.success(), "pocket {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// `pocket bench` of `workload` on the daemon's model through its socket, results in `results`.
fn bench_through(d: &Daemon, cache: &Path, workload: &Path, results: &Path) -> Output {
    let served = d.dir.path().join("models/smollm2.gguf");
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let args = [
        "bench".to_owned(),
        "-m".to_owned(),
        path(&served),
        "--socket".to_owned(),
        path(&d.socket),
        "--prompts".to_owned(),
        path(workload),
        "--json".to_owned(),
        path(results),
    ];
    pocket(cache, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// sha256 of token ids as little-endian u32s, hex (as the benchmark's results write it).
fn sha256_tokens(tokens: &[u64]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for t in tokens {
        h.update((*t as u32).to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn pocket_run_the_daemon_and_pocket_bench_choose_the_same_drafter_and_give_the_same_tokens() {
    // What `auto` knows about this device (what `pocket tune`, or an idle daemon, learns),
    // shared by all three through one cache directory.
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2();
    let model = model.to_str().unwrap();
    pocket(cache.path(), &["tune", "-m", model, "-t", "1", "--weights", "stored"]);
    let prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog";

    // `pocket run`.
    let o = pocket(
        cache.path(),
        &[
            "run",
            "-m",
            model,
            "--chat",
            prompt,
            "-n",
            "48",
            "-t",
            "1",
            "--spec",
            "auto",
            "--weights",
            "stored",
            "--json",
        ],
    );
    let run: Value = serde_json::from_slice(&o.stdout).unwrap();
    let run_tokens: Vec<u64> =
        run["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let drafter = run["spec"]["drafter"].as_str().unwrap().to_owned();
    assert!(
        drafter.starts_with("auto (") && drafter.contains("suffix"),
        "auto drafts here once tuned: {drafter}"
    );

    // The daemon, asked over its socket with its default speculation.
    let d = Daemon::start(Setup {
        spec: Some("auto"),
        cache: Some(cache.path().to_path_buf()),
        ..Setup::default()
    });
    let (code, r) = d.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "return_tokens": true}),
    );
    assert_eq!(code, 200, "{r}");
    let daemon_tokens: Vec<u64> =
        r["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(daemon_tokens, run_tokens, "the daemon's tokens");
    assert_eq!(r["timings"]["drafter"], drafter.as_str(), "the daemon's drafter");
    assert_eq!(r["choices"][0]["message"]["content"], run["text"]);

    // `pocket bench`, in process and through the same daemon (its model as the daemon serves it).
    let work = tempfile::tempdir().unwrap();
    let prompts = work.path().join("prompts.jsonl");
    let line = json!({"id": "repeat", "kind": "edit", "messages": [{"role": "user", "content": prompt}], "max_tokens": 48});
    std::fs::write(&prompts, format!("{line}\n")).unwrap();
    let served = d.dir.path().join("models/smollm2.gguf");
    let results = work.path().join("bench.json");
    pocket(
        cache.path(),
        &[
            "bench",
            "-m",
            served.to_str().unwrap(),
            "--modes",
            "vanilla,auto",
            "--socket",
            d.socket.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "-t",
            "1",
            "--no-cost-curve",
            "--json",
            results.to_str().unwrap(),
        ],
    );
    let bench: Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    assert_eq!(bench["settings"]["start"], "cold");
    let runs = bench["runs"].as_array().unwrap();
    let modes: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["vanilla", "auto", "socket:vanilla", "socket:auto"]);
    let sha = sha256_tokens(&run_tokens);
    for r in runs {
        assert_eq!(r["output_sha256"], sha.as_str(), "{} gives pocket run's tokens", r["mode"]);
        assert_eq!(r["identical_to_vanilla"], true, "{}", r["mode"]);
        if r["mode"].as_str().unwrap().ends_with("auto") {
            assert_eq!(r["drafter"], drafter.as_str(), "{}'s drafter", r["mode"]);
        }
    }
    assert!(bench["summary"]["socket:auto"]["decode_vs_in_process"].as_f64().is_some(), "{bench}");
}

#[test]
fn the_daemon_learns_while_idle_gives_way_to_requests_and_auto_uses_what_it_learned() {
    let d = Daemon::start(Setup {
        spec: Some("auto"),
        extra: "tune_when_idle = true\n".into(),
        ..Setup::default()
    });
    let ask = || {
        let (code, r) = d.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Repeat: the quick brown fox jumps over the lazy dog"}],
                    "max_tokens": 24, "return_tokens": true}),
        );
        assert_eq!(code, 200, "{r}");
        r
    };
    // Nothing is known on a fresh daemon: auto decodes plainly, with no drafter at all.
    let first = ask();
    assert_eq!(first["timings"]["drafter"], "auto (plain: not measured on this device yet)");
    assert!(
        d.get("/v1/status")["loaded"][0].get("cost_curve").is_none(),
        "no curve is listed before one is measured"
    );
    // Idle, it learns; a request that comes meanwhile stops the learning and is answered.
    let start = Instant::now();
    let mut interrupted = false;
    loop {
        let s = d.get("/v1/status");
        if s["loaded"][0]["tuned"] == true {
            break;
        }
        if s["learning"].is_string() && !interrupted {
            let during = ask();
            assert_eq!(during["tokens"], first["tokens"], "greedy tokens are the same whatever is known");
            interrupted = true;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "nothing learned within 3 minutes: {s}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(interrupted, "the learner was never seen at work:\n{}", d.log());
    assert!(d.log().contains("learned while idle"), "{}", d.log());
    // The status lists the curve learned, a pass of one token first.
    let status = d.get("/v1/status");
    let curve =
        status["loaded"][0]["cost_curve"].as_array().unwrap_or_else(|| panic!("no cost curve: {status}"));
    assert!(curve.len() >= 2 && curve[0]["n"] == 1 && curve[0]["relative"] == 1.0, "{status}");
    assert!(curve.iter().all(|p| p["seconds"].as_f64().is_some_and(|s| s > 0.0)), "{status}");
    // What was learned is used: auto now decides per step from this device's cost curve.
    let after = ask();
    let drafter = after["timings"]["drafter"].as_str().unwrap();
    assert!(drafter.starts_with("auto (") && !drafter.contains("not measured"), "{drafter}");
    assert_eq!(after["tokens"], first["tokens"]);
    // And it was remembered where the daemon keeps its cache.
    assert_eq!(std::fs::read_dir(d.dir.path().join("cache")).unwrap().count(), 1);
}

#[test]
fn pocket_bench_replays_a_conversation_with_and_without_the_prompt_cache() {
    let d = Daemon::start(Setup::default());
    let (cache, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let workload = work.path().join("conversations.jsonl");
    let line = json!({"id": "two-turns", "kind": "conversation", "system": "You are brief.",
                      "turns": ["Name a colour.", "Name another one."], "max_tokens": 8});
    std::fs::write(&workload, format!("{line}\n")).unwrap();
    let results = work.path().join("bench.json");
    let o = bench_through(&d, cache.path(), &workload, &results);
    assert!(String::from_utf8_lossy(&o.stdout).contains("conversations replayed"), "{o:?}");
    let bench: Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    let c = &bench["conversations"];
    assert_eq!(c["modes"], json!(["no-cache", "cache"]));
    let turns = c["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 4, "{c}");
    let turn = |mode: &str, n: u64| turns.iter().find(|t| t["mode"] == mode && t["turn"] == n).unwrap();
    for mode in ["no-cache", "cache"] {
        assert_eq!(turn(mode, 1)["cached_tokens"], 0, "{mode} starts cold: {c}");
    }
    assert!(turn("cache", 2)["cached_tokens"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(turn("no-cache", 2)["cached_tokens"], 0, "{c}");
    assert_eq!(turn("cache", 2)["prompt_tokens"], turn("no-cache", 2)["prompt_tokens"]);
    assert_eq!(turn("cache", 2)["output_sha256"], turn("no-cache", 2)["output_sha256"]);
    assert!(turns.iter().all(|t| t["identical_to_vanilla"] == true), "{c}");
    assert!(bench["runs"].as_array().unwrap().is_empty(), "nothing ran in process");
}

#[test]
fn pocket_bench_replays_an_agentic_stream_and_bounds_what_copying_could_reach() {
    let d = Daemon::start(Setup::default());
    let (cache, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let workload = work.path().join("agentic.jsonl");
    let lines: String =
        [("a", "Say hello."), ("b", "Count to three."), ("a", "Say hello again."), ("b", "Count to four.")]
            .iter()
            .enumerate()
            .map(|(i, (app, ask))| {
                let line = json!({"id": format!("r{i}"), "kind": "agentic", "app": app,
                              "messages": [{"role": "user", "content": ask}], "max_tokens": 12});
                format!("{line}\n")
            })
            .collect();
    std::fs::write(&workload, lines).unwrap();
    let results = work.path().join("bench.json");
    let o = bench_through(&d, cache.path(), &workload, &results);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("agentic stream of 4 requests") && stdout.contains("no drafter copying"),
        "{o:?}"
    );
    let bench: Value = serde_json::from_slice(&std::fs::read(&results).unwrap()).unwrap();
    let a = &bench["agentic"];
    assert_eq!(a["requests"].as_array().unwrap().len(), 12, "{a}");
    assert!(a["requests"].as_array().unwrap().iter().all(|r| r["identical_to_off"] == true), "{a}");
    // The bound covers every `off` answer's tokens after its first; a fresh daemon has no
    // cost curve to list, so only the flat figures are there, and copying never loses.
    let bound = &a["bound"];
    let generated: u64 = a["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mode"] == "off")
        .map(|r| r["generated_tokens"].as_u64().unwrap().saturating_sub(1))
        .sum();
    assert_eq!(bound["all"]["tokens"], generated, "{bound}");
    assert_eq!(bound["context"], 2);
    assert!(
        bound["cost"].as_array().unwrap().is_empty() && bound["all"]["after_context"].is_null(),
        "{bound}"
    );
    let flat = |k: &str| bound["all"][k].as_f64().unwrap();
    assert!(
        flat("flat_anywhere") >= flat("flat_after_context") && flat("flat_after_context") >= 1.0,
        "{bound}"
    );
}
