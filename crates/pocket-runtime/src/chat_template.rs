//! A model's own chat template (GGUF `tokenizer.chat_template`), rendered the way Hugging Face
//! transformers' `apply_chat_template` renders it, so the prompt is byte for byte the one the
//! model was trained on: jinja2 with `trim_blocks`, `lstrip_blocks` and loop controls, HF's
//! `tojson`, `raise_exception` and `strftime_now`, Python's string and dict methods.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind, ValueOrKwargs, from_args};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Output, State};
use pocket_core::{ChatMessage, ToolCall};

/// The name the one template is stored under in its environment.
const NAME: &str = "chat_template";

/// A model's chat template, compiled once per model.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    renders_tools: bool,
    thinks: bool,
}

/// Why a template could not be compiled or rendered: the message says what (a
/// `raise_exception` from the template is passed on verbatim).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template is not valid Jinja.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception`; the message is the template's own, e.g.
    /// "Conversation roles must alternate user/assistant/user/assistant/...".
    #[error("{0}")]
    Raised(String),
    /// Rendering failed otherwise (a missing element, a type error, an unknown filter).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

impl ChatTemplate {
    /// Compile `source`; `bos_token`/`eos_token` are the model's special token texts (e.g.
    /// "<|im_start|>", "<|endoftext|>"), passed to the template as `bos_token`/`eos_token`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // transformers' jinja2 environment; jinja2's defaults already match minijinja's for
        // undefined values (lenient) and the template's trailing newline (dropped).
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
        env.set_syntax(syntax.map_err(|e| TemplateError::Syntax(e.to_string()))?);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", |format: &str| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            format_time(i64::try_from(now).unwrap_or(0), format)
        });
        env.add_template_owned(NAME, source.to_owned()).map_err(|e| TemplateError::Syntax(e.to_string()))?;
        let template = env.get_template(NAME).map_err(|e| TemplateError::Syntax(e.to_string()))?;
        let renders_tools = template.undeclared_variables(false).contains("tools");
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            renders_tools,
            thinks: crate::reasoning::template_thinks(source),
        })
    }

    /// Render `messages` (and `tools`, OpenAI tool definitions as JSON values:
    /// `{"type":"function","function":{"name","description","parameters"}}`), ending with the
    /// assistant's turn opened when `add_generation_prompt`. `extra` are more variables for
    /// the template (`chat_template_kwargs`: `enable_thinking`, …); they cannot replace the
    /// ones above.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        // transformers passes `tools=None` without tools: defined, none, and falsy.
        let tools = if tools.is_empty() { Value::from(()) } else { tools.iter().map(json_value).collect() };
        let own = [
            ("messages", messages.iter().map(message_value).collect()),
            ("tools", tools),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ];
        let extra = extra
            .iter()
            .filter(|(k, _)| !own.iter().any(|(name, _)| name == k))
            .map(|(k, v)| (k.as_str(), json_value(v)));
        let context = Value::from_pairs(own.iter().cloned().chain(extra).collect::<Vec<_>>());
        let template = self.env.get_template(NAME).map_err(render_error)?;
        template.render(context).map_err(render_error)
    }

    /// Whether the template itself renders tool definitions (it reads the `tools` variable),
    /// so a caller knows whether it must describe tools in a system message instead.
    pub fn renders_tools(&self) -> bool {
        self.renders_tools
    }

    /// Whether the model thinks before it answers (the template speaks of its tags): see
    /// [`crate::reasoning`].
    pub fn thinks(&self) -> bool {
        self.thinks
    }
}

/// A message as OpenAI-compatible servers hand it to templates: keys that are absent are left
/// out, so `message.tool_calls` is undefined rather than an empty list.
fn message_value(message: &ChatMessage) -> Value {
    let mut fields =
        vec![("role", Value::from(message.role.as_str())), ("content", Value::from(&message.content))];
    if !message.tool_calls.is_empty() {
        fields.push(("tool_calls", message.tool_calls.iter().map(tool_call_value).collect()));
    }
    if let Some(id) = &message.tool_call_id {
        fields.push(("tool_call_id", Value::from(id)));
    }
    if let Some(name) = &message.name {
        fields.push(("name", Value::from(name)));
    }
    Value::from_pairs(fields)
}

/// Arguments arrive as JSON text but templates treat them as a mapping (`arguments | tojson`,
/// `arguments.items()`), so an object is parsed; anything else stays the text it was.
fn tool_call_value(call: &ToolCall) -> Value {
    let arguments = match serde_json::from_str::<serde_json::Value>(&call.function.arguments) {
        Ok(parsed @ serde_json::Value::Object(_)) => json_value(&parsed),
        _ => Value::from(&call.function.arguments),
    };
    let function = Value::from_pairs([("name", Value::from(&call.function.name)), ("arguments", arguments)]);
    Value::from_pairs([
        ("id", Value::from(&call.id)),
        ("type", Value::from(&call.kind)),
        ("function", function),
    ])
}

/// A JSON value as a template value. Objects keep the order the client sent their keys in, as
/// Python dicts do, because serde_json and minijinja are both built with `preserve_order`.
fn json_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            (None, None) => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::from(s),
        serde_json::Value::Array(items) => items.iter().map(json_value).collect(),
        serde_json::Value::Object(map) => {
            Value::from_pairs(map.iter().map(|(k, v)| (k.as_str(), json_value(v))))
        }
    }
}

/// Marks an error as the template's own `raise_exception`, whose message is passed on as is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn render_error(error: Error) -> TemplateError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(e) = cause {
        if let Some(Raised(message)) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised(message.clone());
        }
        cause = e.source();
    }
    TemplateError::Render(error.to_string())
}

/// `{{ x }}` of a float prints Python's `str(x)` (`1e-07`, `nan`); minijinja already prints
/// `None`, `True` and `False` as Python does, but floats the way Rust does (`0.0000001`).
fn python_formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    if value.kind() != ValueKind::Number || value.is_integer() {
        return minijinja::escape_formatter(out, state, value);
    }
    Ok(out.write_str(&py_float(f64::try_from(value.clone())?, false))?)
}

/// Python's `repr` of a float (`json.dumps`' spelling of NaN and infinities when `json`): the
/// shortest digits that round-trip, positional for exponents -4..16, else `1e-07`, `1.5e+16`.
fn py_float(x: f64, json: bool) -> String {
    let [nan, inf, minus_inf] = if json { ["NaN", "Infinity", "-Infinity"] } else { ["nan", "inf", "-inf"] };
    if x.is_nan() {
        return nan.to_owned();
    } else if x.is_infinite() {
        return if x > 0.0 { inf } else { minus_inf }.to_owned();
    }
    // `{:e}` gives the same shortest round-trip digits, e.g. "1.5e-7"; only the layout differs.
    let scientific = format!("{:e}", x.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let (digits, exponent) = (mantissa.replace('.', ""), exponent.parse::<i32>().unwrap_or(0));
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{exp_sign}{:02}", exponent.unsigned_abs());
    }
    if exponent < 0 {
        return format!("{sign}0.{}{digits}", "0".repeat(exponent.unsigned_abs() as usize - 1));
    }
    let int_len = exponent as usize + 1;
    match digits.get(int_len..) {
        Some(fraction) if !fraction.is_empty() => format!("{sign}{}.{fraction}", &digits[..int_len]),
        _ => format!("{sign}{digits:0<int_len$}.0"),
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, options positional in that order or by name. Unlike minijinja's own
/// `tojson` it escapes no HTML and keeps non-ASCII text.
fn tojson(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let (positional, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    let option = |index: usize, name: &str| match positional.get(index) {
        Some(v) => Ok(Some(v.clone()).filter(|v| !v.is_none())),
        None => kwargs.get::<Option<Value>>(name).map(|v| v.filter(|v| !v.is_none())),
    };
    let indent = match option(1, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.to_string()),
        // Capped: a template is not to make the daemon allocate without bound.
        Some(v) => Some(" ".repeat(i64::try_from(v)?.clamp(0, 64) as usize)),
    };
    let (item_separator, key_separator) = match option(2, "separators")? {
        Some(v) => (v.get_item_by_index(0)?.to_string(), v.get_item_by_index(1)?.to_string()),
        None => (if indent.is_some() { "," } else { ", " }.to_owned(), ": ".to_owned()),
    };
    let mut json = Json {
        out: String::new(),
        ensure_ascii: option(0, "ensure_ascii")?.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: option(3, "sort_keys")?.is_some_and(|v| v.is_true()),
    };
    kwargs.assert_all_used()?;
    json.value(value, 0)?;
    Ok(Value::from(json.out))
}

/// A JSON text being written the way Python's `json.dumps` writes it.
struct Json {
    out: String,
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

impl Json {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        // Python stops at its recursion limit too; a template must not overflow our stack.
        if depth > 500 {
            return Err(Error::new(ErrorKind::InvalidOperation, "value nested too deep for tojson"));
        }
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => self.out.push_str(&value.to_string()),
            ValueKind::Number => self.out.push_str(&py_float(f64::try_from(value.clone())?, true)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items = value.try_iter()?.map(|item| (None, item)).collect();
                self.container(['[', ']'], items, depth)?;
            }
            ValueKind::Map => {
                let mut items = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    // Python writes a key that is not a string as its JSON text: 1, true, null.
                    let key = match key.as_str() {
                        Some(key) => key.to_owned(),
                        None => {
                            let start = self.out.len();
                            self.value(&key, depth)?;
                            self.out.split_off(start)
                        }
                    };
                    items.push((Some(key), item));
                }
                if self.sort_keys {
                    items.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(['{', '}'], items, depth)?;
            }
            kind => {
                let message = format!("a value of type {kind} is not JSON serializable");
                return Err(Error::new(ErrorKind::InvalidOperation, message));
            }
        }
        Ok(())
    }

    fn container(
        &mut self,
        [open, close]: [char; 2],
        items: Vec<(Option<String>, Value)>,
        depth: usize,
    ) -> Result<(), Error> {
        self.out.push(open);
        for (i, (key, item)) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(&self.item_separator);
            }
            self.newline(depth + 1);
            if let Some(key) = key {
                self.string(key);
                self.out.push_str(&self.key_separator);
            }
            self.value(item, depth + 1)?;
        }
        if !items.is_empty() {
            self.newline(depth);
        }
        self.out.push(close);
        Ok(())
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            (0..depth).for_each(|_| self.out.push_str(indent));
        }
    }

    /// Control characters as `\n`-style or `\u00XX` escapes and, with `ensure_ascii`,
    /// everything past `~` as `\uXXXX` (UTF-16 units).
    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if c < ' ' || (self.ensure_ascii && c > '~') => {
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        let _ = write!(self.out, "\\u{unit:04x}"); // writing to a String cannot fail
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

#[rustfmt::skip]
const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// `strftime` of `secs` since the Unix epoch as UTC (transformers formats local time; UTC
/// needs no time-zone database) for what templates put in system prompts: %Y %y %m %d %e %B
/// %b %H %I %M %S %p %A %a %%, `-` dropping zero padding (%-d); others are written as they are.
fn format_time(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let (hour, minute, second) =
        (secs.rem_euclid(86_400) / 3600, secs.rem_euclid(3600) / 60, secs.rem_euclid(60));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let (era, day_of_era) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let weekday = WEEKDAYS[(days + 4).rem_euclid(7) as usize]; // 1970-01-01 was a Thursday
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut directive = chars.next();
        let unpadded = directive == Some('-');
        if unpadded {
            directive = chars.next();
        }
        let num = |n: i64| if unpadded { n.to_string() } else { format!("{n:02}") };
        let text = match directive {
            Some('Y') => year.to_string(),
            Some('y') => num(year.rem_euclid(100)),
            Some('m') => num(month),
            Some('d') => num(day),
            Some('e') if unpadded => day.to_string(),
            Some('e') => format!("{day:>2}"),
            Some('H') => num(hour),
            Some('I') => num((hour + 11) % 12 + 1),
            Some('M') => num(minute),
            Some('S') => num(second),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.to_owned(),
            Some('B') => month_name.to_owned(),
            Some('b') => month_name[..3].to_owned(),
            Some('A') => weekday.to_owned(),
            Some('a') => weekday[..3].to_owned(),
            Some('%') => "%".to_owned(),
            Some(other) => format!("%{}{other}", if unpadded { "-" } else { "" }),
            None => "%".to_owned(),
        };
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use pocket_core::{ChatMessage, Role};

    use super::*;

    /// One conversation of `cases.json`.
    #[derive(serde::Deserialize)]
    struct Case {
        name: String,
        add_generation_prompt: bool,
        messages: Vec<ChatMessage>,
        #[serde(default)]
        tools: Vec<serde_json::Value>,
        /// `chat_template_kwargs`.
        #[serde(default)]
        kwargs: serde_json::Map<String, serde_json::Value>,
    }

    fn fixture_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
    }

    fn read(name: &str) -> String {
        let path = fixture_dir().join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Every case of `cases.json` renders to exactly what `render_reference.py` (jinja2 set up
    /// like transformers) wrote, or fails where it raised.
    fn renders_like_transformers(name: &str, bos: &str, eos: &str) {
        let template = ChatTemplate::new(&read(&format!("{name}.jinja")), bos, eos).unwrap();
        let cases: Vec<Case> = serde_json::from_str(&read("cases.json")).unwrap();
        let expected: Vec<serde_json::Value> =
            serde_json::from_str(&read(&format!("{name}.expected.json"))).unwrap();
        assert_eq!(cases.len(), expected.len(), "{name}: rerun render_reference.py");
        for (case, expected) in cases.iter().zip(expected) {
            let got = template.render(&case.messages, &case.tools, case.add_generation_prompt, &case.kwargs);
            match (got, expected.as_str()) {
                // A difference in key order means serde_json lost its `preserve_order` feature.
                (Ok(got), Some(expected)) => assert_eq!(got, expected, "{name}, case {}", case.name),
                (Err(_), None) => assert!(expected.get("error").is_some(), "{name}, case {}", case.name),
                (got, _) => panic!("{name}, case {}: got {got:?}, Python gave {expected}", case.name),
            }
        }
    }

    #[test]
    fn smollm2_renders_like_transformers() {
        renders_like_transformers("smollm2", "<|im_start|>", "<|im_end|>");
    }

    #[test]
    fn qwen25_coder_renders_like_transformers() {
        renders_like_transformers("qwen2.5-coder", "<|endoftext|>", "<|im_end|>");
    }

    #[test]
    fn a_template_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<ChatTemplate>();
    }

    #[test]
    fn renders_tools_only_where_the_template_reads_tools() {
        assert!(ChatTemplate::new(&read("qwen2.5-coder.jinja"), "", "").unwrap().renders_tools());
        assert!(!ChatTemplate::new(&read("smollm2.jinja"), "", "").unwrap().renders_tools());
    }

    fn render_str(source: &str, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        ChatTemplate::new(source, "<s>", "</s>")?.render(messages, &[], false, &Default::default())
    }

    #[test]
    fn raise_exception_passes_the_message_on_verbatim() {
        let source = "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
            {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
            {% endif %}{% endfor %}";
        let turns = [ChatMessage::new(Role::User, "a"), ChatMessage::new(Role::User, "b")];
        let err = render_str(source, &turns).unwrap_err();
        assert!(matches!(err, TemplateError::Raised(_)));
        assert_eq!(err.to_string(), "Conversation roles must alternate user/assistant/user/assistant/...");
        assert_eq!(render_str("{{ raise_exception('x') }}", &[]).unwrap_err().to_string(), "x");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        // The right-hand sides are what Python's json.dumps wrote for the same values.
        for (expr, python) in [
            (r#"{"a": [1, "é<"], "b": none} | tojson"#, r#"{"a": [1, "é<"], "b": null}"#),
            (
                r#"{"z": 1.5e20, "a": {"k": []}} | tojson(indent=2)"#,
                "{\n  \"z\": 1.5e+20,\n  \"a\": {\n    \"k\": []\n  }\n}",
            ),
            (r#"{"z": true, "a": "\x01\n"} | tojson(sort_keys=true)"#, r#"{"a": "\u0001\n", "z": true}"#),
            (r#"{"z": 1, 2: none, false: 0.5} | tojson"#, r#"{"z": 1, "2": null, "false": 0.5}"#),
            (
                r#"["é", 0.0001, 1e16, -0.0] | tojson(true, separators=(",", ":"))"#,
                r#"["\u00e9",0.0001,1e+16,-0.0]"#,
            ),
        ] {
            assert_eq!(render_str(&format!("{{{{ {expr} }}}}"), &[]).unwrap(), python, "{expr}");
        }
        assert!(render_str("{{ x | tojson }}", &[]).is_err(), "undefined is not JSON, as in Python");
    }

    #[test]
    fn python_methods_and_printing() {
        let source = "{{ '  a b '.strip().split(' ') | join('|') }} {{ 'Hi'.upper() }} \
            {{ {'k': 1}.get('x', 'dflt') }} {{ none }} {{ true }} {{ 1e-7 }} {{ 'x'.startswith('x') }}";
        assert_eq!(render_str(source, &[]).unwrap(), "a|b HI dflt None True 1e-07 True");
    }

    #[test]
    fn loop_controls_work() {
        let source = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
            {% if loop.index > 3 %}{% break %}{% endif %}{{ m.content }};{% endfor %}";
        let mut turns = ["a", "b", "c", "d"].map(|t| ChatMessage::new(Role::User, t)).to_vec();
        turns.insert(0, ChatMessage::new(Role::System, "s"));
        assert_eq!(render_str(source, &turns).unwrap(), "a;b;");
    }

    #[test]
    fn syntax_error_is_an_error_from_new() {
        let err = ChatTemplate::new("{% for m in %}{{ m }}", "", "").unwrap_err();
        assert!(matches!(err, TemplateError::Syntax(_)), "{err:?}");
    }

    #[test]
    fn strftime_formats_a_known_instant() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let fmt = "%Y-%m-%d %H:%M:%S|%A %a|%B %b|%-d %e|%I%p %y %% %Q";
        assert_eq!(
            format_time(1_709_211_909, fmt),
            "2024-02-29 13:05:09|Thursday Thu|February Feb|29 29|01PM 24 % %Q"
        );
        assert_eq!(format_time(-1, "%Y-%m-%d %H:%M:%S %A"), "1969-12-31 23:59:59 Wednesday");
        assert_eq!(render_str("{{ strftime_now('%Y') | length }}", &[]).unwrap(), "4");
    }
}
