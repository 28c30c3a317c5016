//! A model that thinks (Qwen3's shape: `<think>`, `</think>` as tokens of their own, a chat
//! template with `enable_thinking`): its thinking comes apart from its answer in every API —
//! `reasoning_content` in chat completions (and `delta.reasoning_content` in their stream), a
//! `reasoning` item in the Responses API, a `thinking` block in Anthropic's Messages API,
//! `reasoning` in D-Bus's stats —
//! thinking is turned off by `enable_thinking`, `reasoning_effort: "none"`,
//! `reasoning.effort` and Anthropic's `thinking: disabled`, and a JSON format or a tool call
//! constrains the answer, not the thinking.
//!
//! The model is synthetic (random weights, written by `make_gguf.py` with Qwen2.5's real
//! tokenizer, `<think>`/`</think>` in the slots Qwen3 gives them, and a Qwen3-style template
//! from `fixtures/`), so what it thinks is steered by `logit_bias`: `<think>` alone gives
//! thinking that never ends; `<think>` below `</think>` gives a block opened and closed at
//! once, after which only the grammar decides.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

mod common;
use common::*;

const THINK: &str = "151667";
const END_THINK: &str = "151668";

/// A synthetic thinking model with the template `fixtures/{template}.jinja`, written on
/// first use into `target/synthetic/`.
fn thinking_model(template: &str) -> PathBuf {
    let dir = root().join("target/synthetic");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("qwen3-{template}-f16.gguf"));
    if !path.exists() {
        let python = root().join("target/pyenv/bin/python");
        assert!(python.exists(), "the tests need the test venv: run scripts/test");
        let out = Command::new(python)
            .arg(root().join("crates/pocket-ggml/tests/synthetic/make_gguf.py"))
            .args(["--arch", "qwen3", "--weights", "f16", "--out"])
            .arg(&path)
            .arg("--tokenizer-from")
            .arg(root().join("models/store/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
            .arg("--chat-template")
            .arg(root().join(format!("crates/pocketd/tests/fixtures/{template}.jinja")))
            .args([
                "--user-token",
                &format!("{THINK}=<think>"),
                "--user-token",
                &format!("{END_THINK}=</think>"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "make_gguf.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    path
}

fn daemon() -> Daemon {
    Daemon::start(Setup {
        dbus: true,
        models: vec![
            ("thinker.gguf".into(), thinking_model("qwen3-style")),
            ("opener.gguf".into(), thinking_model("opens-thinking")),
        ],
        ..Setup::default()
    })
}

fn chat(d: &Daemon, extra: Value) -> Value {
    let mut body =
        json!({"model": "thinker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (code, r) = d.post("/v1/chat/completions", &body);
    assert_eq!(code, 200, "{r}");
    r
}

fn prompt_tokens(r: &Value) -> u64 {
    r["usage"]["prompt_tokens"].as_u64().unwrap()
}

#[test]
fn thinking_is_turned_off_by_each_apis_switch() {
    let d = daemon();
    let on = prompt_tokens(&chat(&d, json!({})));
    let off = prompt_tokens(&chat(&d, json!({"chat_template_kwargs": {"enable_thinking": false}})));
    // The template writes `<think>\n\n</think>\n\n` after the assistant's turn opens.
    assert!(off > on, "enable_thinking = false renders the empty block: {off} against {on}");
    assert_eq!(prompt_tokens(&chat(&d, json!({"reasoning_effort": "none"}))), off);
    assert_eq!(prompt_tokens(&chat(&d, json!({"reasoning_effort": "high"}))), on);
    let input = json!([{"role": "user", "content": "hi"}]);
    let (code, r) = d.post(
        "/v1/responses",
        &json!({"model": "thinker", "input": input, "max_output_tokens": 4, "reasoning": {"effort": "none"}}),
    );
    assert_eq!((code, r["usage"]["input_tokens"].as_u64()), (200, Some(off)), "{r}");
    let (code, r) = d.post(
        "/v1/messages",
        &json!({"model": "thinker", "messages": input, "max_tokens": 4, "thinking": {"type": "disabled"}}),
    );
    let u = &r["usage"];
    assert_eq!(code, 200, "{r}");
    assert_eq!(u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(), off);
    let (code, r) = d.post(
        "/v1/messages/count_tokens",
        &json!({"model": "thinker", "messages": input, "thinking": {"type": "disabled"}}),
    );
    assert_eq!(
        (code, r["input_tokens"].as_u64()),
        (200, Some(off)),
        "count_tokens renders as the request would: {r}"
    );
    let (code, r) = d.post(
        "/v1/chat/completions",
        &json!({"model": "thinker", "messages": input, "reasoning_effort": "lots"}),
    );
    assert_eq!((code, r["error"]["param"].as_str()), (400, Some("reasoning_effort")), "{r}");
    let (code, r) =
        d.post("/v1/responses", &json!({"model": "thinker", "input": "hi", "reasoning": {"effort": "lots"}}));
    assert_eq!((code, r["error"]["param"].as_str()), (400, Some("reasoning")), "{r}");
    // With thinking off, `<think>` is text like any other: nothing is taken for thinking.
    let r = chat(&d, json!({"reasoning_effort": "none", "logit_bias": {THINK: 100}}));
    assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{r}");
}

#[test]
fn thinking_comes_apart_from_the_answer_in_every_api() {
    let d = daemon();
    // `<think>` again and again: one opens the block, the rest is thinking that never ends.
    let bias = json!({THINK: 100});
    let r = chat(&d, json!({"logit_bias": bias}));
    let message = &r["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "<think><think><think>", "{r}");
    assert_eq!(message["content"], "", "{r}");
    // All of it was thinking, `<think>` included.
    let usage = &r["usage"];
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], usage["completion_tokens"], "{r}");

    let (code, body) = d.curl(
        "POST",
        "/v1/chat/completions",
        Some(
            json!({"model": "thinker", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "logit_bias": bias, "stream": true})
            .to_string()
            .as_bytes(),
        ),
    );
    assert_eq!(code, 200);
    let chunks: Vec<Value> =
        sse_data(&body).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let thinking: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str()).collect();
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!((thinking.as_str(), content.as_str()), ("<think><think><think>", ""), "{body}");

    // A template that opens the block: the output starts inside the thinking (which, from
    // random weights, never ends) in every API.
    let input = json!([{"role": "user", "content": "hi"}]);
    let r = chat(&d, json!({"model": "opener"}));
    let message = &r["choices"][0]["message"];
    assert!(message["reasoning_content"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
    assert_eq!(message["content"], "", "{r}");
    let (code, r) =
        d.post("/v1/responses", &json!({"model": "opener", "input": input, "max_output_tokens": 4}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        (r["output"][0]["type"].as_str(), r["output"][1]["type"].as_str()),
        (Some("reasoning"), Some("message"))
    );
    assert_eq!(r["output"][0]["content"][0]["text"], message["reasoning_content"], "{r}");
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 4, "{r}");
    let (code, body) = d.curl(
        "POST",
        "/v1/responses",
        Some(
            json!({"model": "opener", "input": input, "max_output_tokens": 4, "stream": true})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!(code, 200);
    let events: Vec<Value> = sse_data(&body).iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let thinking: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(thinking, r["output"][0]["content"][0]["text"].as_str().unwrap(), "{body}");
    let last = events.last().unwrap();
    let without_ids = |output: &Value| {
        let mut output = output.clone();
        output
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .for_each(|item| drop(item.as_object_mut().unwrap().remove("id")));
        output
    };
    assert_eq!(
        without_ids(&last["response"]["output"]),
        without_ids(&r["output"]),
        "the same output streamed"
    );
    let (code, r) = d.post("/v1/messages", &json!({"model": "opener", "messages": input, "max_tokens": 4}));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["content"][0]["type"], "thinking", "{r}");
    assert_eq!(r["content"][0]["thinking"], message["reasoning_content"], "{r}");
    let (code, body) = d.curl(
        "POST",
        "/v1/messages",
        Some(
            json!({"model": "opener", "messages": input, "max_tokens": 4, "stream": true})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!(code, 200);
    let streamed: String = sse_data(&body)
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .filter_map(|e| e["delta"]["thinking"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, r["content"][0]["thinking"].as_str().unwrap(), "{body}");

    // D-Bus: the thinking and the answer apart in the stats.
    let o = d.busctl_generate_on(
        "opener",
        &["--json=short"],
        "hi",
        &[&["chat", "b", "true"], &["max_tokens", "u", "4"]],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reply: Value = serde_json::from_slice(&o.stdout).unwrap();
    let stats = &reply["data"][1];
    assert_eq!(stats["reasoning"]["data"], message["reasoning_content"], "{reply}");
    assert_eq!(stats["content"]["data"], "", "{reply}");
}

#[test]
fn a_format_or_a_tool_call_constrains_the_answer_not_the_thinking() {
    let d = daemon();
    // `<think>` below `</think>`: the block opens (the format allows `<think>` first), closes
    // at once, and then only the format decides.
    let bias = json!({THINK: 50, END_THINK: 100});
    let r =
        chat(&d, json!({"logit_bias": bias, "max_tokens": 16, "response_format": {"type": "json_object"}}));
    let message = &r["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "", "{r}");
    // `<think>` and `</think>` are the thinking's tokens; the JSON closed within the rest.
    assert_eq!(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 2, "{r}");
    let answer: Value =
        serde_json::from_str(message["content"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert!(answer.is_object(), "{r}");

    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let r =
        chat(&d, json!({"logit_bias": bias, "max_tokens": 40, "tools": tools, "tool_choice": "required"}));
    let message = &r["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "", "{r}");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather", "{r}");
}
