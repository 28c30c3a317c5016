//! Property-based tests of what clients and operators hand the daemon: request bodies and
//! their mapping to a job's settings, D-Bus option dictionaries, and configuration files.
//! Each generates thousands of inputs — mostly well-formed in shape, with values of every
//! type and range — and checks that the answer is a job or an error that names what was
//! wrong, never a panic or an internal error. Bounded (a few thousand cases, well under a
//! second each) so CI stays fast; `fuzz/` has targets for open-ended runs.

use std::collections::HashMap;

use axum::body::Bytes;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::config::Config;
use super::error::ServeError;
use super::job::JobOptions;

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        prop_oneof![Just(f64::MAX), Just(-0.0), Just(1e-300)].prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("auto"),
            Just("off"),
            Just("suffix"),
            Just("q8_0"),
            Just("json_object"),
            Just("required")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Fields a request may have (and some it may not), each with any value.
const REQUEST_FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "n",
    "spec",
    "draft_model",
    "kv",
    "return_tokens",
    "prompt_cache_key",
    "user",
    "cache_prompt",
    "priority",
    "response_format",
    "grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stream_options",
    "colour",
];

fn message() -> impl Strategy<Value = Value> {
    (prop_oneof![Just("system"), Just("user"), Just("assistant"), Just("tool"), Just("robot")], ".{0,16}")
        .prop_map(|(role, content)| json!({"role": role, "content": content}))
}

/// A request body: some of the fields, `messages` usually well-formed.
fn request_body() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec((proptest::sample::select(REQUEST_FIELDS), json_value()), 0..8),
        proptest::collection::vec(message(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(fields, messages, well_formed)| {
            let mut body = Map::new();
            if well_formed {
                body.insert("messages".into(), Value::from(messages));
                body.insert("prompt".into(), Value::from("Once upon a time"));
            }
            for (k, v) in fields {
                body.insert(k.to_owned(), v);
            }
            Value::Object(body)
        })
}

/// What the request pipeline checks before queueing, as `submit` runs it.
fn map(options: &pocket_api::GenerationOptions, chat: bool) -> Result<(), ServeError> {
    let o = JobOptions::from_openai(options, chat)?;
    o.sampling.validate().map_err(|e| ServeError::bad_request(e.to_string()))?;
    pocket_core::StopConfig { max_tokens: 1, stop: o.stop.clone() }
        .validate()
        .map_err(|e| ServeError::bad_request(e.to_string()))?;
    Ok(())
}

fn is_clear(e: &ServeError) -> bool {
    e.http_status() == 400 && !e.to_string().is_empty()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    /// Chat and completion bodies: parsed and mapped, or refused with a 400 that says why.
    #[test]
    fn request_bodies_become_jobs_or_clear_400s(body in request_body()) {
        let bytes = Bytes::from(body.to_string());
        match super::body::parse::<pocket_api::ChatCompletionRequest>(Ok(bytes.clone())) {
            Ok(r) => if let Err(e) = map(&r.options, true) { prop_assert!(is_clear(&e), "{e:?}") },
            Err(e) => prop_assert!(is_clear(&e), "{e:?}"),
        }
        match super::body::parse::<pocket_api::CompletionRequest>(Ok(bytes)) {
            Ok(r) => if let Err(e) = map(&r.options, false) { prop_assert!(is_clear(&e), "{e:?}") },
            Err(e) => prop_assert!(is_clear(&e), "{e:?}"),
        }
    }

    /// Bytes that are not JSON at all (or not UTF-8).
    #[test]
    fn any_bytes_are_a_clear_400(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Err(e) = super::body::parse::<pocket_api::ChatCompletionRequest>(Ok(Bytes::from(bytes))) {
            prop_assert!(is_clear(&e), "{e:?}");
        }
    }

    /// D-Bus option dictionaries with values of every D-Bus type.
    #[test]
    fn dbus_options_become_jobs_or_clear_errors(
        options in proptest::collection::vec((proptest::sample::select(DBUS_OPTIONS), 0u8..9, any::<i64>(), ".{0,10}"), 0..6)
    ) {
        let mut dict: super::dbus::Options = HashMap::new();
        for (key, kind, n, s) in options {
            dict.insert(key.to_owned(), variant(kind, n, &s));
        }
        match super::dbus::job("", "Hello", &dict, "test".into()) {
            Ok(job) => if let Err(e) = job.options.sampling.validate() { prop_assert!(!e.to_string().is_empty()) },
            Err(e) => prop_assert!(is_clear(&e), "{e:?}"),
        }
    }

    /// Configuration files of known keys with values of any type: a configuration, or an
    /// error naming the file's problem; one that loads prints back as itself.
    #[test]
    fn configuration_files_load_or_say_why(entries in proptest::collection::vec((proptest::sample::select(CONFIG_KEYS), 0u8..6, any::<i64>(), ".{0,10}"), 0..6)) {
        let mut table = toml::Table::new();
        for (key, kind, n, s) in entries {
            table.insert(key.to_owned(), toml_value(kind, n, &s));
        }
        let text = toml::to_string(&table).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pocketd.toml");
        std::fs::write(&path, &text).unwrap();
        match Config::load(&path, true) {
            Ok(c) => {
                let back: Config = toml::from_str(&c.to_toml()).unwrap();
                prop_assert_eq!(back, c);
            }
            Err(e) => prop_assert!(format!("{e:#}").contains("pocketd.toml"), "{e:#}"),
        }
    }
}

#[test]
fn the_generators_reach_accepted_requests_too() {
    // Not only refusals: a plain body of the generated shape maps to a job.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "stop": ["\n"]});
    let r: pocket_api::ChatCompletionRequest = super::body::parse(Ok(Bytes::from(body.to_string()))).unwrap();
    map(&r.options, true).unwrap();
    let dict: super::dbus::Options = HashMap::from([("max_tokens".to_owned(), variant(0, 5, ""))]);
    super::dbus::job("", "Hello", &dict, "test".into()).unwrap();
}

const DBUS_OPTIONS: &[&str] = &[
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "json_schema",
    "json_object",
    "grammar",
    "tools",
    "tool_choice",
    "spec",
    "draft_model",
    "kv",
    "chat",
    "system",
    "history",
    "cache_key",
    "cache_prompt",
    "priority",
    "colour",
];

fn variant(kind: u8, n: i64, s: &str) -> zbus::OwnedVariant {
    use zbus::Variant;
    let v = match kind {
        0 => Variant::from(n as u32),
        1 => Variant::from(n),
        2 => Variant::from(n as f64 / 7.0),
        3 => Variant::from(n % 2 == 0),
        4 => Variant::from(s.to_owned()),
        5 => Variant::from(vec![s.to_owned(), "x".to_owned()]),
        6 => Variant::from(vec![("user".to_owned(), s.to_owned()), (s.to_owned(), "hi".to_owned())]),
        7 => Variant::from(n as u8),
        _ => Variant::Variant(Box::new(Variant::from(n as i32))),
    };
    zbus::OwnedVariant::try_from(v).unwrap()
}

const CONFIG_KEYS: &[&str] = &[
    "socket",
    "socket_mode",
    "socket_group",
    "tcp",
    "bus",
    "models_dir",
    "default_model",
    "memory_budget",
    "device",
    "device_memory_budget",
    "threads",
    "parallel",
    "queue",
    "keep_alive_seconds",
    "max_tokens",
    "ctx_size",
    "spec",
    "kv",
    "shutdown_seconds",
    "tune_when_idle",
    "prompt_cache",
    "prompt_cache_dir",
    "prompt_cache_disk",
    "max_connections",
    "max_connections_per_peer",
    "header_timeout_seconds",
    "idle_timeout_seconds",
    "dbus_jobs_per_caller",
    "stored_responses",
    "model_aliases",
    "colour",
];

fn toml_value(kind: u8, n: i64, s: &str) -> toml::Value {
    match kind {
        0 => toml::Value::Integer(n),
        1 => toml::Value::Integer(n.rem_euclid(5000)),
        2 => toml::Value::Float(n as f64 / 3.0),
        3 => toml::Value::Boolean(n % 2 == 0),
        4 => toml::Value::String(s.to_owned()),
        _ => toml::Value::String(
            [
                "0660",
                "auto",
                "1.5GiB",
                "session",
                "none",
                "127.0.0.1:8077",
                "0.0.0.0:1",
                "q8_0",
                "off",
                "/tmp/x",
            ][n.rem_euclid(10) as usize]
                .to_owned(),
        ),
    }
}
