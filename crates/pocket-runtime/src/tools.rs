//! Tool calls: the request's OpenAI `tools` and `tool_choice`, turned into what the model is
//! told, what its output may be, and OpenAI's `tool_calls` read back from that output.
//!
//! One wire format for every model: a call is `<tool_call>\n{"name": …, "arguments": {…}}\n
//! </tool_call>`, the format Qwen2.5's template teaches (and Hermes-style models use). A model
//! whose template renders `tools` itself is told by its template; for one whose template does
//! not, the tools and the format are described in the system message. Either way the call's
//! JSON is enforced by a grammar, so `arguments` always matches the tool's parameters.

use pocket_core::{FunctionCall, ToolCall};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::closing::Markup;
use crate::grammar::Grammar;
use crate::json_close::close_json;
use crate::{Error, Result};

/// The most calls one answer may make (parallel calls allowed): a small model that repeats
/// itself stops here.
pub const MAX_CALLS: usize = 8;

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model answers in text; the tools are not offered.
    None,
    /// The model chooses between text and calls (the default when tools are given).
    #[default]
    Auto,
    /// The model calls at least one tool.
    Required,
    /// The model calls this function.
    Function(String),
}

/// The tools a request offers and how they may be used.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tools {
    /// OpenAI tool definitions: `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`.
    pub tools: Vec<Value>,
    /// Whether and which tool must be called.
    pub choice: ToolChoice,
    /// Several calls in one answer (OpenAI's `parallel_tool_calls`, default true).
    pub parallel: bool,
}

impl Tools {
    /// Check the definitions and the choice; the error names `tools` or `tool_choice` and
    /// says what is expected.
    pub fn validate(&self) -> Result<()> {
        let mut names = Vec::new();
        for (i, tool) in self.tools.iter().enumerate() {
            if tool.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
                return Err(Error::invalid("tools", format!("tools[{i}].type must be \"function\"")));
            }
            let name = function(tool).and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                return Err(Error::invalid("tools", format!("tools[{i}].function.name is missing")));
            };
            if names.contains(&name) {
                return Err(Error::invalid("tools", format!("two tools are named {name:?}")));
            }
            if let Some(p) = function(tool).and_then(|f| f.get("parameters"))
                && !p.is_object()
            {
                return Err(Error::invalid(
                    "tools",
                    format!("tools[{i}].function.parameters must be a JSON schema object"),
                ));
            }
            names.push(name);
        }
        match &self.choice {
            ToolChoice::Function(name) if !names.contains(&name.as_str()) => Err(Error::invalid(
                "tool_choice",
                format!("tool_choice names {name:?}, which is not one of the tools ({})", names.join(", ")),
            )),
            ToolChoice::Required | ToolChoice::Function(_) if self.tools.is_empty() => {
                Err(Error::invalid("tool_choice", "tool_choice asks for a tool call but no tools are given"))
            }
            _ => Ok(()),
        }
    }

    /// Whether the model is offered the tools at all. With `tool_choice: "none"` it is not:
    /// the prompt is rendered as without tools (a small model shown tools it may not call
    /// tends to write calls as text), though the history may still hold earlier calls.
    pub fn offered(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The schema of one call's JSON: `{"name": …, "arguments": …}` of each function the
    /// answer may call.
    pub fn call_schema(&self) -> Option<Value> {
        if !self.offered() {
            return None;
        }
        let variants: Vec<Value> = self
            .tools
            .iter()
            .filter_map(function)
            .filter(|f| match &self.choice {
                ToolChoice::Function(name) => f.get("name").and_then(Value::as_str) == Some(name),
                _ => true,
            })
            .map(|f| {
                let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
                json!({
                    "type": "object",
                    "properties": {"name": {"const": f.get("name")}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        Some(json!({"anyOf": variants}))
    }

    /// The grammar the answer must follow: text or calls (`auto`), calls only (`required`),
    /// calls of one function (a named choice).
    pub fn grammar(&self) -> Option<Grammar> {
        let mut body = self.call_schema()?;
        body["x-guidance"] = json!({
            "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": true
        });
        let more =
            if self.parallel { format!("(\"\\n\" call){{0,{}}}", MAX_CALLS - 1) } else { String::new() };
        // Text must not start with '<' or '{', so that an answer starting a call — tagged, or
        // the bare JSON object some models write instead — is held to the grammar.
        let start =
            if self.choice == ToolChoice::Auto { "start: TEXT | calls | body" } else { "start: calls" };
        Some(Grammar::Lark(format!(
            "{start}\ncalls: call {more}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {body}\n\
             TEXT: /[^<{{](.|\\n)*/\n"
        )))
    }

    /// What a system message says for a model whose template does not render tools itself.
    pub fn system_prompt(&self) -> String {
        let mut s = String::from(
            "You can call functions to help answer. These are the functions, as JSON signatures, \
             between <tools> and </tools>:\n<tools>",
        );
        for tool in &self.tools {
            s.push('\n');
            s.push_str(&tool.to_string());
        }
        s.push_str(
            "\n</tools>\nTo call a function, answer with its name and arguments as a JSON object \
             between <tool_call> and </tool_call>:\n<tool_call>\n{\"name\": <function-name>, \
             \"arguments\": <args-json-object>}\n</tool_call>",
        );
        s
    }
}

/// Whether an answer that may call tools and starts with `start` is text, not a call: the
/// [`Tools::grammar`] lets text start with anything but `<` or `{`, and a call with nothing
/// else, so the first character decides (a stream holds the answer back until it does) —
/// except for a Markdown block of JSON, which small models write their call as, unheld by the
/// grammar: held to the end, it is a call when it is one ([`parse_calls`]).
pub fn starts_as_text(start: &str) -> bool {
    let fenced = FENCES.iter().any(|f| f.starts_with(start) || start.starts_with(f));
    !start.is_empty() && !start.starts_with(['<', '{']) && !fenced
}

/// How a Markdown block of JSON opens.
const FENCES: [&str; 2] = ["```json\n{", "```\n{"];

/// The call an answer that is one Markdown block of JSON writes (cut before the block's end, it
/// is closed as a cut call is).
fn fenced_call(text: &str) -> Option<FunctionCall> {
    let body = text.trim().strip_prefix("```")?;
    let body = body.strip_prefix("json").unwrap_or(body).strip_prefix('\n')?;
    match body.trim_end().strip_suffix("```") {
        Some(whole) => read_call(whole),
        None => close_json(body.trim()).and_then(|json| read_call(&json)),
    }
}

/// What opens a call in the answer (the grammar's `"<tool_call>\n"`).
pub const CALL_OPEN: &str = "<tool_call>\n";
/// What closes a call.
pub const CALL_CLOSE: &str = "\n</tool_call>";
/// What opens a call after another.
pub const CALL_AGAIN: &str = "\n<tool_call>\n";

/// How closing ([`crate::closing`]) reads an answer of calls: each call's JSON between
/// [`CALL_OPEN`] and [`CALL_CLOSE`], the function's name the model's to choose; `text`: the
/// answer may be text instead; `more`: another call may follow one.
pub(crate) fn call_markup(text: bool, more: bool) -> Markup {
    Markup {
        open: CALL_OPEN,
        close: CALL_CLOSE,
        again: more.then_some(CALL_AGAIN),
        text,
        chosen: Some("name"),
    }
}

fn function(tool: &Value) -> Option<&Value> {
    tool.get("function")
}

/// The text of an answer without its tool calls, and the calls in OpenAI's shape: calls
/// between `<tool_call>` tags, or an answer that is one bare JSON call of a function in
/// `names` (or one in a Markdown block, as small models write them). Calls whose JSON does not parse are left in the text; a last call cut off before
/// its closing tag is closed ([`close_json`]), or dropped when its name was cut. `seed` makes
/// the call ids unique.
pub fn parse_calls(text: &str, names: &[String], seed: &str) -> (String, Vec<ToolCall>) {
    if let Some(call) = read_call(text).or_else(|| fenced_call(text)).filter(|c| names.contains(&c.name)) {
        let call = ToolCall { id: call_id(seed, 0), kind: "function".into(), function: call };
        return (String::new(), vec![call]);
    }
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else {
            // A call cut off (by `max_tokens`) is a call all the same, its JSON closed, when
            // its name was written; the markup is never left in the text.
            // (Cut in its closing tag, the JSON is whole.)
            let body = after.trim();
            let tag = (1..CLOSE.len()).rev().find(|&n| body.ends_with(&CLOSE[..n])).unwrap_or(0);
            let cut = close_json(body[..body.len() - tag].trim_end())
                .and_then(|json| read_call(&json))
                .filter(|c| names.contains(&c.name));
            if let Some(call) = cut {
                calls.push(ToolCall {
                    id: call_id(seed, calls.len()),
                    kind: "function".into(),
                    function: call,
                });
            }
            content.push_str(&rest[..start]);
            rest = "";
            break;
        };
        let Some(call) = read_call(&after[..end]) else {
            content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]);
            rest = &after[end + CLOSE.len()..];
            continue;
        };
        content.push_str(&rest[..start]);
        calls.push(ToolCall { id: call_id(seed, calls.len()), kind: "function".into(), function: call });
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(rest);
    let content = if calls.is_empty() { content } else { content.trim().to_owned() };
    (content, calls)
}

impl Tools {
    /// The names of the functions offered.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().filter_map(function).filter_map(|f| f.get("name")?.as_str()).collect()
    }
}

fn read_call(body: &str) -> Option<FunctionCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = match value.get("arguments") {
        // Arguments cut before they began (closed as `null`) are none.
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    };
    Some(FunctionCall { name, arguments })
}

fn call_id(seed: &str, index: usize) -> String {
    let digest = Sha256::digest(format!("{seed}/{index}").as_bytes());
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    format!("call_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn calls_are_read_back_in_openais_shape() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        let (content, calls) = parse_calls(text, &["get_weather".to_owned()], "pocketd-1");
        assert_eq!(content, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.name, "get_weather");
        assert_eq!(calls[1].function.arguments, r#"{"city":"Rome"}"#);
        assert_ne!(calls[0].id, calls[1].id);
        assert!(calls[0].id.starts_with("call_"));
        // Text without calls, and a call that is not JSON, stay text.
        assert_eq!(
            parse_calls("Hello.", &["get_weather".to_owned()], "x"),
            ("Hello.".to_owned(), Vec::new())
        );
        let broken = "<tool_call>not json</tool_call>";
        assert_eq!(parse_calls(broken, &["get_weather".to_owned()], "x"), (broken.to_owned(), Vec::new()));
        // A bare JSON call of an offered function is a call; of another, text.
        let bare = r#"{"name": "get_weather", "arguments": {"city": "Oslo"}}"#;
        assert_eq!(parse_calls(bare, &["get_weather".to_owned()], "x").1.len(), 1);
        assert_eq!(parse_calls(bare, &["other".to_owned()], "x").1.len(), 0);
    }

    #[test]
    fn a_call_cut_by_max_tokens_is_still_a_call_and_never_markup_in_the_text() {
        let names = ["get_weather".to_owned()];
        let cut = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
        let (content, calls) = parse_calls(cut, &names, "x");
        assert_eq!(content, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.arguments, r#"{"city":"Os"}"#);
        // After a whole call, the cut second one is a call too.
        let two =
            format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {{}}}}\n</tool_call>\n{cut}");
        assert_eq!(parse_calls(&two, &names, "x").1.len(), 2);
        // Cut in its closing tag, or with its arguments not begun.
        let tag = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}\n</tool_c";
        assert_eq!(parse_calls(tag, &names, "x").1[0].function.arguments, r#"{"city":""}"#);
        let bare = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":";
        assert_eq!(parse_calls(bare, &names, "x").1[0].function.arguments, "{}");
        // Cut before the name is whole: no call, and no markup left.
        for early in ["<tool_call>", "<tool_call>\n{\"na", "<tool_call>\n{\"name\": \"get_wea"] {
            assert_eq!(parse_calls(early, &names, "x"), (String::new(), Vec::new()), "{early:?}");
        }
        assert_eq!(parse_calls("Let me check. <tool_call>\n{", &names, "x").0, "Let me check. ");
    }

    #[test]
    fn a_call_written_as_a_markdown_block_of_json_is_a_call() {
        let names = ["get_weather".to_owned()];
        let block = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Oslo\"}\n}\n```";
        let (content, calls) = parse_calls(block, &names, "x");
        assert_eq!((content.as_str(), calls[0].function.arguments.as_str()), ("", r#"{"city":"Oslo"}"#));
        let cut = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"cit";
        assert_eq!(parse_calls(cut, &names, "x").1[0].function.arguments, r#"{"cit":null}"#);
        // Another function's, or other JSON, stays text; a stream holds a block until it ends.
        let other = block.replace("get_weather", "send_mail");
        assert_eq!(parse_calls(&other, &names, "x"), (other.clone(), Vec::new()));
        assert!(!starts_as_text("``") && !starts_as_text("```json\n{\"a\"") && !starts_as_text("```\n"));
        assert!(starts_as_text("```python\n") && starts_as_text("`x`") && starts_as_text("Sure"));
    }

    #[test]
    fn bad_tools_and_choices_are_refused_naming_the_field() {
        let t = |tools: Vec<Value>, choice| Tools { tools, choice, parallel: true }.validate();
        assert!(t(vec![weather()], ToolChoice::Auto).is_ok());
        let e = t(vec![weather()], ToolChoice::Function("nope".into())).unwrap_err();
        assert_eq!(e.param(), Some("tool_choice"));
        let e = t(vec![json!({"type": "function", "function": {}})], ToolChoice::Auto).unwrap_err();
        assert_eq!(e.param(), Some("tools"));
        let e = t(vec![weather(), weather()], ToolChoice::Auto).unwrap_err();
        assert!(e.to_string().contains("two tools"), "{e}");
        assert!(t(Vec::new(), ToolChoice::Required).is_err());
    }

    #[test]
    fn the_grammar_follows_the_choice() {
        let tools = |choice| Tools { tools: vec![weather()], choice, parallel: false };
        assert_eq!(tools(ToolChoice::None).grammar(), None);
        let Some(Grammar::Lark(auto)) = tools(ToolChoice::Auto).grammar() else { panic!() };
        assert!(auto.starts_with("start: TEXT | calls | body"), "{auto}");
        let Some(Grammar::Lark(required)) = tools(ToolChoice::Required).grammar() else { panic!() };
        assert!(required.starts_with("start: calls\ncalls: call \n"), "{required}");
    }
}
