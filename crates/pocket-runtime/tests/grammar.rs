//! Structured output on a real model (SmolLM2): JSON schemas and grammars enforced token by
//! token, identical with and without speculation, refused clearly when they cannot compile.

mod common;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{ChatMessage, Role, SessionConfig};
use pocket_runtime::ErrorKind;
use pocket_runtime::grammar::Grammar;
use pocket_runtime::pipeline::{self, Input, Request};
use serde_json::{Value, json};

use common::{run, smollm2};

fn request(text: &str, grammar: Grammar, spec: SpecMode) -> Request {
    let mut r = Request::new(Input::Chat(vec![ChatMessage::new(Role::User, text)]));
    r.spec = spec;
    r.grammar = Some(grammar);
    r.stop.max_tokens = 200;
    r.prompt_cache = false;
    r.session =
        SessionConfig { threads: pocket_core::Threads::Fixed(2), n_ctx: 1024, ..SessionConfig::default() };
    r
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "languages": {"type": "array", "items": {"enum": ["rust", "python", "c"]}, "maxItems": 3}
        },
        "required": ["name", "age", "languages"],
        "additionalProperties": false
    })
}

#[test]
fn a_schema_is_enforced_and_speculation_gives_the_same_tokens_faster() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let grammar = Grammar::JsonSchema { schema: person(), strict: true };
    let ask = "Describe a programmer named Ada as JSON.";
    let plain = run(&model, &request(ask, grammar.clone(), SpecMode::Off));
    let value: Value = serde_json::from_str(&plain.generation.text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", plain.generation.text));
    let age = value["age"].as_i64().unwrap();
    assert!((0..=150).contains(&age), "{value}");
    assert!(value["name"].is_string() && value["languages"].is_array(), "{value}");
    assert_eq!(plain.generation.spec.forced, 0, "plain decoding drafts nothing");
    assert!(plain.grammar_seconds > 0.0);

    for spec in [SpecMode::Suffix, SpecMode::Auto] {
        let fast = run(&model, &request(ask, grammar.clone(), spec));
        assert_eq!(fast.generation.tokens, plain.generation.tokens, "{spec}");
        let s = fast.generation.spec;
        assert!(s.forced_accepted > 0, "{spec}: the schema's keys are forced: {s:?}");
        assert!(s.passes < plain.generation.spec.passes, "{spec}: {s:?}");
    }
}

#[test]
fn json_object_parses_and_a_lark_grammar_is_followed() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let out = run(&model, &request("Give me a JSON object about cats.", Grammar::JsonObject, SpecMode::Auto));
    let value: Value = serde_json::from_str(&out.generation.text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.generation.text));
    assert!(value.is_object());

    let lark = Grammar::Lark(r##"start: "The answer is " ("yes" | "no") ".""##.into());
    let out = run(&model, &request("Is the sky blue?", lark, SpecMode::Off));
    assert!(
        ["The answer is yes.", "The answer is no."].contains(&out.generation.text.as_str()),
        "{}",
        out.generation.text
    );
}

#[test]
fn grammars_that_cannot_compile_are_refused_naming_the_field() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let ledger = Ledger::unlimited();
    let refuse =
        |g: Grammar| pipeline::prepare(&model, None, &request("hi", g, SpecMode::Off), &ledger).unwrap_err();
    let e = refuse(Grammar::Lark("start: (".into()));
    assert_eq!((e.kind(), e.param()), (ErrorKind::Invalid, Some("grammar")), "{e}");
    let e = refuse(Grammar::JsonSchema { schema: json!("a string"), strict: true });
    assert_eq!(e.param(), Some("response_format"), "{e}");
    // Too large to compile within the bound: refused before trying.
    let big: serde_json::Map<String, Value> =
        (0..20_000).map(|i| (format!("field_{i}"), json!({"type": "string"}))).collect();
    let e =
        refuse(Grammar::JsonSchema { schema: json!({"type": "object", "properties": big}), strict: true });
    assert!(e.to_string().contains("at most"), "{e}");
}

#[test]
fn a_required_tool_call_comes_back_in_openais_shape_with_valid_arguments() {
    use pocket_runtime::tools::{ToolChoice, Tools};
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": false}}});
    let mut r =
        Request::new(Input::Chat(vec![ChatMessage::new(Role::User, "What is the weather in Paris?")]));
    r.tools = Tools { tools: vec![weather], choice: ToolChoice::Required, parallel: false };
    r.stop.max_tokens = 120;
    r.spec = SpecMode::Auto;
    r.session =
        SessionConfig { threads: pocket_core::Threads::Fixed(2), n_ctx: 1024, ..SessionConfig::default() };
    let out = run(&model, &r);
    assert_eq!(out.tool_calls.len(), 1, "{}", out.generation.text);
    let call = &out.tool_calls[0];
    assert_eq!(call.function.name, "get_weather");
    let args: Value = serde_json::from_str(&call.function.arguments).unwrap();
    assert!(
        args["city"].is_string() && ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{args}"
    );
    assert_eq!(out.content, "");
}

#[test]
fn a_json_answer_cut_by_max_tokens_is_closed_in_time_and_parses() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let grammar = Grammar::JsonSchema { schema: person(), strict: true };
    let ask = "Describe a programmer named Ada as JSON.";
    let whole = run(&model, &request(ask, grammar.clone(), SpecMode::Off)).generation.tokens.len();
    let mut cut = 0;
    for max_tokens in whole.saturating_sub(6)..whole {
        for spec in [SpecMode::Off, SpecMode::Auto] {
            let mut r = request(ask, grammar.clone(), spec);
            r.stop.max_tokens = max_tokens;
            let out = run(&model, &r).generation;
            let text = &out.text;
            serde_json::from_str::<Value>(text)
                .unwrap_or_else(|e| panic!("cut at {max_tokens} ({spec}): not JSON ({e}): {text}"));
            assert!(out.tokens.len() <= max_tokens);
            cut += usize::from(out.stop == pocket_core::StopReason::MaxTokens);
        }
    }
    assert!(cut > 0, "no answer was cut");
}
