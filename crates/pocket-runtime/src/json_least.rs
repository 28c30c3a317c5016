//! The least ending of a cut JSON value that its schema accepts: what closing an answer
//! before `max_tokens` forces. An open string is closed (padded to its `minLength`, or
//! finished as the `enum` value it began), a key given the least value its schema allows,
//! required members still missing written with their least values, arrays filled to their
//! `minItems`, brackets closed — written the way the grammar writes JSON (`", "`, `": "`, and
//! members in the schema's order, as llguidance generates them).
//!
//! "Least" is in characters, which is close enough to tokens for closing (the grammar checks
//! the ending before it is forced). A string's `pattern` is followed by searching its DFA for
//! the shortest way to a match; what cannot be told from the schema alone — a `format`
//! string begun, `not`, `minProperties` — gives no ending, and closing walks the grammar
//! itself instead.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use regex_automata::dfa::Automaton;
use regex_automata::dfa::dense::DFA;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use serde_json::{Map, Value};

use crate::json_close::{Member, Object, Open, Scan, Str, word_ending};

/// How deep `$ref`s and nested schemas are followed for a least value: a recursive schema's
/// least value is found within this, or not at all.
const MAX_DEPTH: usize = 16;

/// The always-true schema (`{}`), for what a schema leaves open.
static ANY: Value = Value::Bool(true);

/// The longest string a `pattern` is searched for: past it, a pattern gives no ending.
const MAX_PATTERN_TEXT: usize = 64;

/// The bytes a pattern's least string is made of, in the order they are tried: what needs no
/// escaping in JSON, letters and digits first.
const PATTERN_BYTES: &[u8] =
    b"aAz0123456789bcdefghijklmnopqrstuvwxyBCDEFGHIJKLMNOPQRSTUVWXYZ -_.:/@+,;!#$%&'()*<=>?[]^`{|}~";

/// Values of the `format`s llguidance enforces, for a string of that format not yet begun.
const FORMATS: [(&str, &str); 7] = [
    ("date", "2000-01-01"),
    ("time", "00:00:00Z"),
    ("date-time", "2000-01-01T00:00:00Z"),
    ("uuid", "00000000-0000-0000-0000-000000000000"),
    ("email", "a@a.aa"),
    ("ipv4", "0.0.0.0"),
    ("hostname", "a"),
];

/// A JSON schema, as closing reads it.
#[derive(Debug, Clone)]
pub struct SchemaEnding {
    root: Value,
    /// Each `pattern`'s DFA, built on first use (`None`: one that does not build).
    patterns: Arc<Mutex<HashMap<String, Option<Arc<PatternDfa>>>>>,
}

/// A pattern's DFA (dense, its states in a vector of their own).
type PatternDfa = DFA<Vec<u32>>;

impl SchemaEnding {
    /// The endings of values valid against `schema` (`true` for any JSON value).
    pub fn new(schema: Value) -> SchemaEnding {
        SchemaEnding { root: schema, patterns: Arc::default() }
    }

    /// The shortest text that, after `written`, makes a whole match of `pattern` (as
    /// llguidance reads patterns: the whole string, `^`/`$` or not); `None` for text that
    /// cannot become one, or a pattern that does not build.
    fn pattern_rest(&self, pattern: &str, written: &[u8]) -> Option<String> {
        let dfa = {
            let mut patterns = self.patterns.lock().ok()?;
            patterns.entry(pattern.to_owned()).or_insert_with(|| build_dfa(pattern).map(Arc::new)).clone()?
        };
        let mut state = dfa.start_state(&start::Config::new().anchored(Anchored::Yes)).ok()?;
        for &b in written {
            state = dfa.next_state(state, b);
        }
        // Breadth first: the first state that matches at the end is the fewest bytes away.
        let mut seen: HashMap<StateID, (StateID, u8)> = HashMap::new();
        let mut queue = VecDeque::from([(state, 0)]);
        while let Some((s, depth)) = queue.pop_front() {
            if dfa.is_dead_state(s) {
                continue;
            }
            if dfa.is_match_state(dfa.next_eoi_state(s)) {
                let mut rest = Vec::new();
                let mut at = s;
                while at != state {
                    let (from, b) = seen[&at];
                    rest.push(b);
                    at = from;
                }
                rest.reverse();
                return String::from_utf8(rest).ok();
            }
            if depth + written.len() >= MAX_PATTERN_TEXT {
                continue;
            }
            for &b in PATTERN_BYTES {
                let next = dfa.next_state(s, b);
                if next != state && !seen.contains_key(&next) {
                    seen.insert(next, (s, b));
                    queue.push_back((next, depth + 1));
                }
            }
        }
        None
    }

    /// What to append to `partial`, the start of a JSON value, to make it a whole value that
    /// the schema accepts; `None` when the schema alone cannot tell (see the module's
    /// documentation) or `partial` is not the start of a JSON value.
    pub fn ending(&self, partial: &str) -> Option<String> {
        self.ending_of(&Scan::of(partial.as_bytes())?)
    }

    /// [`SchemaEnding::ending`] of a value read as `scan`.
    pub(crate) fn ending_of(&self, scan: &Scan) -> Option<String> {
        if scan.open.is_empty() && scan.string.is_none() && scan.word.is_empty() {
            return if scan.done { Some(String::new()) } else { self.least(&self.root, 0) };
        }
        // The schema of each open container, and of the value being written in the innermost.
        let mut containers = Vec::with_capacity(scan.open.len());
        let mut schema = &self.root;
        for open in &scan.open {
            let container = self.branch(schema, open)?;
            containers.push(container);
            schema = self.child(container, open);
        }
        let mut scan = scan.clone();
        let mut out = String::new();
        if let Some(s) = scan.string.take() {
            if s.key {
                let (Some(Open::Object(o)), Some(&container)) = (scan.open.last(), containers.last()) else {
                    return None;
                };
                let key = self.key_starting(container, o, &s.text)?;
                out.push_str(std::str::from_utf8(&key[s.text.len()..]).ok()?);
                out.push('"');
                scan.value_ended(true, Some(key));
            } else {
                out.push_str(&self.string_rest(schema, &s)?);
                scan.value_ended(false, None);
            }
        }
        if !scan.word.is_empty() {
            let word = std::mem::take(&mut scan.word);
            out.push_str(&self.word_rest(schema, &word)?);
            scan.value_ended(false, None);
        }
        let mut last = out.bytes().last().or(scan.last);
        while let Some(open) = scan.open.pop() {
            let container = containers.pop()?;
            match open {
                Open::Object(o) => self.close_object(container, o, last, &mut out)?,
                Open::Array { items, read } => self.close_array(container, items, read, last, &mut out)?,
            }
            last = out.bytes().last();
            scan.value_ended(false, None);
        }
        Some(out)
    }

    /// The rest of an object: the value of a key read, a member after a comma, the required
    /// members missing, the `}`.
    fn close_object(&self, schema: &Value, mut o: Object, last: Option<u8>, out: &mut String) -> Option<()> {
        let member = |out: &mut String, key: &[u8]| -> Option<()> {
            let value = self.least(property(schema, key), 0)?;
            out.push('"');
            out.push_str(std::str::from_utf8(key).ok()?);
            out.push_str("\": ");
            out.push_str(&value);
            Some(())
        };
        match o.member {
            Member::Colon | Member::Value => {
                if o.member == Member::Colon {
                    out.push(':');
                }
                if o.member == Member::Colon || last == Some(b':') {
                    out.push(' ');
                }
                out.push_str(&self.least(property(schema, &o.key), 0)?);
                o.members.push((std::mem::take(&mut o.key), None));
            }
            // After a comma a member must come: the next one required, else the shortest that
            // may come next.
            Member::Key if !o.members.is_empty() => {
                if last == Some(b',') {
                    out.push(' ');
                }
                let next = next_keys(schema, &o);
                let declared = next
                    .iter()
                    .find(|k| required(schema).any(|r| r.as_bytes() == **k))
                    .or_else(|| next.iter().min_by_key(|k| k.len()));
                // Where any key may come, the least is the empty one.
                let key = match declared {
                    Some(key) => key.to_vec(),
                    None if open_keys(schema) => Vec::new(),
                    None => return None,
                };
                member(out, &key)?;
                o.members.push((key, None));
            }
            Member::Key | Member::Next => {}
        }
        for key in missing_required(schema, &o) {
            if !o.members.is_empty() {
                out.push_str(", ");
            }
            member(out, key.as_bytes())?;
            o.members.push((key.as_bytes().to_vec(), None));
        }
        out.push('}');
        Some(())
    }

    /// The rest of an array: an item after a comma, items up to `minItems`, the `]`.
    fn close_array(
        &self,
        schema: &Value,
        mut items: usize,
        read: bool,
        last: Option<u8>,
        out: &mut String,
    ) -> Option<()> {
        let min_items = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
        if !read && items > 0 {
            if last == Some(b',') {
                out.push(' ');
            }
            out.push_str(&self.least(item(schema, items), 0)?);
            items += 1;
        }
        while items < min_items {
            if items > 0 {
                out.push_str(", ");
            }
            out.push_str(&self.least(item(schema, items), 0)?);
            items += 1;
        }
        out.push(']');
        Some(())
    }

    /// The key, starting with `prefix`, that the shortest ending writes next in `o`.
    fn key_starting(&self, schema: &Value, o: &Object, prefix: &[u8]) -> Option<Vec<u8>> {
        if let Some(key) =
            next_keys(schema, o).into_iter().filter(|k| k.starts_with(prefix)).min_by_key(|k| k.len())
        {
            return Some(key.to_vec());
        }
        // A key of its own, where the schema lets any key in.
        open_keys(schema).then(|| prefix.to_vec())
    }

    /// What finishes a string value cut after `s`.
    fn string_rest(&self, schema: &Value, s: &Str) -> Option<String> {
        // An escape cut short cannot be finished by appending alone.
        let text = std::str::from_utf8(&s.text).ok()?;
        if s.escaped || text.rfind("\\u").is_some_and(|at| text.len() - at < 6) {
            return None;
        }
        let schema = self.resolve(schema, 0)?;
        let written = format!("\"{text}");
        if let Some(choices) = choices(schema) {
            return choices
                .iter()
                .filter_map(|c| serde_json::to_string(c).ok())
                .filter_map(|c| c.strip_prefix(&written).map(str::to_owned))
                .min_by_key(String::len);
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            // The pattern reads the string's characters; escapes would have to be decoded.
            if text.contains('\\') {
                return None;
            }
            return Some(self.pattern_rest(pattern, text.as_bytes())? + "\"");
        }
        if schema.get("format").is_some() {
            return None;
        }
        let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
        let chars = text.chars().count();
        Some(format!("{}\"", "a".repeat(min.saturating_sub(chars))))
    }

    /// What finishes a number or literal cut as `word`.
    fn word_rest(&self, schema: &Value, word: &str) -> Option<String> {
        let schema = self.resolve(schema, 0)?;
        if let Some(choices) = choices(schema) {
            return choices
                .iter()
                .filter_map(|c| serde_json::to_string(c).ok())
                .filter_map(|c| c.strip_prefix(word).map(str::to_owned))
                .min_by_key(String::len);
        }
        word_ending(word).map(str::to_owned)
    }

    /// `schema` with its `$ref`s followed (`None` for one that does not resolve, or too deep).
    fn resolve<'s>(&'s self, mut schema: &'s Value, depth: usize) -> Option<&'s Value> {
        for _ in depth..MAX_DEPTH {
            match schema.get("$ref").and_then(Value::as_str) {
                Some(reference) => schema = self.root.pointer(reference.strip_prefix('#')?)?,
                None => return Some(schema),
            }
        }
        None
    }

    /// The branch of `schema` (of `anyOf`/`oneOf`, or itself) that the container `open`
    /// follows: the first whose kind is the container's and which allows the members read.
    fn branch<'s>(&'s self, schema: &'s Value, open: &Open) -> Option<&'s Value> {
        let schema = self.resolve(schema, 0)?;
        let Some(branches) = alternatives(schema) else { return Some(schema) };
        branches.iter().filter_map(|b| self.resolve(b, 0)).find(|b| self.follows(b, open))
    }

    /// Whether the container `open` can be a value of `schema` so far.
    fn follows(&self, schema: &Value, open: &Open) -> bool {
        if let Some(branches) = alternatives(schema) {
            return branches.iter().filter_map(|b| self.resolve(b, 0)).any(|b| self.follows(b, open));
        }
        let kind = if matches!(open, Open::Object(_)) { "object" } else { "array" };
        if !types(schema).is_empty() && !types(schema).contains(&kind) {
            return false;
        }
        let Open::Object(o) = open else { return true };
        o.members.iter().all(|(key, text)| {
            let closed = !open_keys(schema);
            let declared = schema.get("properties").and_then(|p| p.get(std::str::from_utf8(key).ok()?));
            match (declared, text) {
                (None, _) => !closed,
                (Some(p), Some(text)) => {
                    let (Some(p), Ok(value)) = (self.resolve(p, 0), serde_json::from_slice::<Value>(text))
                    else {
                        return true;
                    };
                    choices(p).is_none_or(|c| c.contains(&value))
                }
                (Some(_), None) => true,
            }
        })
    }

    /// The schema of the value written next inside the container `open` of schema `schema`.
    fn child<'s>(&'s self, schema: &'s Value, open: &Open) -> &'s Value {
        match open {
            Open::Object(o) => property(schema, &o.key),
            Open::Array { items, read } => item(schema, if *read { items - 1 } else { *items }),
        }
    }

    /// The least value `schema` accepts, as JSON text; `None` when it cannot tell.
    fn least(&self, schema: &Value, depth: usize) -> Option<String> {
        if depth > MAX_DEPTH {
            return None;
        }
        let schema = self.resolve(schema, depth)?;
        let map = match schema {
            Value::Bool(true) => return Some("null".into()),
            Value::Object(map) => map,
            _ => return None,
        };
        if map.contains_key("not") || map.contains_key("allOf") {
            return None;
        }
        if let Some(choices) = choices(schema) {
            return choices.iter().filter_map(|c| serde_json::to_string(c).ok()).min_by_key(String::len);
        }
        if let Some(branches) = alternatives(schema) {
            return branches.iter().filter_map(|b| self.least(b, depth + 1)).min_by_key(String::len);
        }
        let mut kinds = types(schema);
        if kinds.is_empty() {
            kinds = match () {
                _ if ["properties", "required", "additionalProperties"]
                    .iter()
                    .any(|k| map.contains_key(*k)) =>
                {
                    vec!["object"]
                }
                _ if ["items", "prefixItems", "minItems"].iter().any(|k| map.contains_key(*k)) => {
                    vec!["array"]
                }
                _ if ["minLength", "maxLength", "pattern", "format"].iter().any(|k| map.contains_key(*k)) => {
                    vec!["string"]
                }
                // Any value: `null` is valid whatever else the schema says of numbers.
                _ => return Some("null".into()),
            };
        }
        kinds.into_iter().filter_map(|kind| self.least_of(kind, map, depth)).min_by_key(String::len)
    }

    /// The least value of one type.
    fn least_of(&self, kind: &str, map: &Map<String, Value>, depth: usize) -> Option<String> {
        let schema = Value::Object(map.clone());
        match kind {
            "null" => Some("null".into()),
            "boolean" => Some("true".into()),
            "integer" | "number" => least_number(map, kind == "integer"),
            "string" => {
                if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
                    return Some(format!("\"{}\"", self.pattern_rest(pattern, b"")?));
                }
                if let Some(format) = map.get("format").and_then(Value::as_str) {
                    let (_, value) = FORMATS.iter().find(|(f, _)| *f == format)?;
                    return Some(format!("\"{value}\""));
                }
                let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
                Some(format!("\"{}\"", "a".repeat(min)))
            }
            "array" => {
                let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
                let items: Option<Vec<String>> =
                    (0..min).map(|i| self.least(item(&schema, i), depth + 1)).collect();
                Some(format!("[{}]", items?.join(", ")))
            }
            "object" => {
                let members: Option<Vec<String>> = required(&schema)
                    .map(|key| {
                        let value = self.least(property(&schema, key.as_bytes()), depth + 1)?;
                        Some(format!("{}: {value}", serde_json::to_string(key).ok()?))
                    })
                    .collect();
                Some(format!("{{{}}}", members?.join(", ")))
            }
            _ => None,
        }
    }
}

/// The DFA of `pattern` matched from the start of a string, anchors or not.
fn build_dfa(pattern: &str) -> Option<PatternDfa> {
    let bare = pattern.strip_prefix('^').unwrap_or(pattern);
    let bare = bare.strip_suffix('$').filter(|b| !b.ends_with('\\')).unwrap_or(bare);
    DFA::builder()
        .configure(
            DFA::config()
                .start_kind(regex_automata::dfa::StartKind::Anchored)
                .match_kind(MatchKind::All)
                .dfa_size_limit(Some(1 << 20))
                .determinize_size_limit(Some(1 << 20)),
        )
        .build(&format!("(?:{bare})$"))
        .ok()
}

/// The values `schema` allows, when it lists them (`const`, `enum`).
fn choices(schema: &Value) -> Option<Vec<Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    schema.get("enum").and_then(Value::as_array).cloned()
}

/// `schema`'s branches, when it is a choice of schemas.
fn alternatives(schema: &Value) -> Option<&Vec<Value>> {
    schema.get("anyOf").or_else(|| schema.get("oneOf")).and_then(Value::as_array)
}

/// The types `schema` names (none when it names none).
fn types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Whether an object of `schema` may hold keys it does not declare.
fn open_keys(schema: &Value) -> bool {
    schema.get("additionalProperties") != Some(&Value::Bool(false))
}

/// The schema of an object's member `key`.
fn property<'s>(schema: &'s Value, key: &[u8]) -> &'s Value {
    let declared = std::str::from_utf8(key).ok().and_then(|k| schema.get("properties")?.get(k));
    declared.or_else(|| schema.get("additionalProperties").filter(|a| a.is_object())).unwrap_or(&ANY)
}

/// The schema of an array's item `at`.
fn item(schema: &Value, at: usize) -> &Value {
    let prefix = schema.get("prefixItems").and_then(|p| p.get(at));
    prefix.or_else(|| schema.get("items").filter(|i| !i.is_array())).unwrap_or(&ANY)
}

/// An object schema's required keys, in the order of its properties (the order llguidance
/// writes them in), then those it does not declare.
fn required(schema: &Value) -> impl Iterator<Item = &str> {
    let listed: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let declared: Vec<&str> = schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|p| p.keys())
        .map(String::as_str)
        .collect();
    let mut keys: Vec<&str> = declared.iter().copied().filter(|k| listed.contains(k)).collect();
    keys.extend(listed.into_iter().filter(|k| !declared.contains(k)));
    keys.into_iter()
}

/// The required keys of `o` not read yet.
fn missing_required<'s>(schema: &'s Value, o: &Object) -> Vec<&'s str> {
    required(schema).filter(|k| !o.has(k.as_bytes())).collect()
}

/// The declared keys that may come next in `o`: those after the last one read, in order, up
/// to the first required one missing (which cannot be skipped).
fn next_keys<'s>(schema: &'s Value, o: &Object) -> Vec<&'s [u8]> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Vec::new() };
    let keys: Vec<&str> = properties.keys().map(String::as_str).collect();
    let after = o.members.iter().filter_map(|(k, _)| keys.iter().position(|p| p.as_bytes() == k)).max();
    let required: Vec<&str> = required(schema).collect();
    let mut next = Vec::new();
    for key in keys.into_iter().skip(after.map_or(0, |a| a + 1)) {
        if o.has(key.as_bytes()) {
            continue;
        }
        next.push(key.as_bytes());
        if required.contains(&key) {
            break;
        }
    }
    next
}

/// The least number a schema's bounds allow: 0 when they do, else the bound nearest it.
fn least_number(map: &Map<String, Value>, integer: bool) -> Option<String> {
    let bound = |name: &str| map.get(name).and_then(Value::as_f64);
    // Draft 4 writes exclusive bounds as booleans beside `minimum`/`maximum`.
    let draft4 = |name: &str| map.get(name).and_then(Value::as_bool).unwrap_or(false);
    let (mut low, mut low_open) = (bound("minimum"), draft4("exclusiveMinimum"));
    if let Some(e) = bound("exclusiveMinimum") {
        (low, low_open) = (Some(e), true);
    }
    let (mut high, mut high_open) = (bound("maximum"), draft4("exclusiveMaximum"));
    if let Some(e) = bound("exclusiveMaximum") {
        (high, high_open) = (Some(e), true);
    }
    let fits = |x: f64| {
        low.is_none_or(|l| if low_open { x > l } else { x >= l })
            && high.is_none_or(|h| if high_open { x < h } else { x <= h })
            && map.get("multipleOf").and_then(Value::as_f64).is_none_or(|m| (x / m).fract() == 0.0)
    };
    let step = |x: f64, up: bool| {
        let whole = if up { x.floor() + 1.0 } else { x.ceil() - 1.0 };
        if integer || whole.abs() < 1e15 { whole } else { x }
    };
    let mut candidates = vec![0.0];
    if let Some(l) = low {
        candidates.extend([l, l.ceil(), step(l, true)]);
    }
    if let Some(h) = high {
        candidates.extend([h, h.floor(), step(h, false)]);
    }
    if let (Some(l), Some(h)) = (low, high) {
        candidates.push((l + h) / 2.0);
    }
    let x = candidates.into_iter().find(|&x| fits(x) && (!integer || x.fract() == 0.0))?;
    Some(if x.fract() == 0.0 && x.abs() < 1e15 { format!("{}", x as i64) } else { format!("{x}") })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// `partial` with its ending against `schema`, checked to be whole JSON.
    fn closed(schema: Value, partial: &str) -> String {
        let ending =
            SchemaEnding::new(schema).ending(partial).unwrap_or_else(|| panic!("{partial:?}: no ending"));
        let whole = format!("{partial}{ending}");
        serde_json::from_str::<Value>(&whole).unwrap_or_else(|e| panic!("{whole:?}: {e}"));
        whole
    }

    fn product() -> Value {
        json!({"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "name": {"type": "string", "maxLength": 60},
            "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000},
            "currency": {"enum": ["EUR", "USD", "GBP"]},
            "in_stock": {"type": "boolean"},
            "note": {"type": "string"}},
            "required": ["sku", "name", "price", "currency", "in_stock"], "additionalProperties": false})
    }

    #[test]
    fn required_members_are_written_with_their_least_values() {
        assert_eq!(
            closed(product(), r#"{"sku": "ABC-0001", "name": "Lap"#),
            r#"{"sku": "ABC-0001", "name": "Lap", "price": 1, "currency": "EUR", "in_stock": true}"#
        );
        assert_eq!(
            closed(product(), r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "USD","#),
            r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "USD", "in_stock": true}"#
        );
        assert_eq!(
            closed(product(), r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "G"#),
            r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "GBP", "in_stock": true}"#
        );
        // A key begun is finished as the one it can be.
        assert_eq!(
            closed(product(), r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "USD", "in"#),
            r#"{"sku": "ABC-0001", "name": "Lap", "price": 9.5, "currency": "USD", "in_stock": true}"#
        );
        // A pattern's least string, from what was written.
        assert_eq!(
            closed(product(), r#"{"sku": "AB"#),
            r#"{"sku": "ABA-0000", "name": "", "price": 1, "currency": "EUR", "in_stock": true}"#
        );
        assert_eq!(SchemaEnding::new(product()).ending(r#"{"sku": "AB1"#), None);
        let pattern =
            |p: &str, written: &str| SchemaEnding::new(Value::Bool(true)).pattern_rest(p, written.as_bytes());
        assert_eq!(pattern(r"^\+?[0-9 ]{6,20}$", "+3").as_deref(), Some("00000"));
        assert_eq!(pattern("^/[a-z0-9/_-]{0,40}$", "").as_deref(), Some("/"));
        assert_eq!(pattern("(cat|horse)s?", "h").as_deref(), Some("orse"));
        assert_eq!(pattern("[", ""), None);
    }

    #[test]
    fn arrays_are_filled_to_their_min_items() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"},
            "ingredients": {"type": "array", "minItems": 2, "items": {"type": "object",
                "properties": {"item": {"type": "string", "minLength": 2}, "grams": {"type": "integer", "minimum": 5}},
                "required": ["item", "grams"]}}},
            "required": ["name", "ingredients"]});
        assert_eq!(
            closed(schema.clone(), r#"{"name": "Pancake", "ingredients": [{"item": "eg"#),
            r#"{"name": "Pancake", "ingredients": [{"item": "eg", "grams": 5}, {"item": "aa", "grams": 5}]}"#
        );
        assert_eq!(
            closed(schema.clone(), r#"{"name": "x", "ingredients": [{"item": "a"#),
            r#"{"name": "x", "ingredients": [{"item": "aa", "grams": 5}, {"item": "aa", "grams": 5}]}"#
        );
        assert_eq!(
            closed(schema, r#"{"name"#),
            r#"{"name": "", "ingredients": [{"item": "aa", "grams": 5}, {"item": "aa", "grams": 5}]}"#
        );
    }

    #[test]
    fn refs_branches_and_bounds_are_followed() {
        let schema = json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "exclusiveMinimum": 3}},
            "required": ["x"]}}, "anyOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "p": {"$ref": "#/$defs/point"}}, "required": ["kind", "p"]},
            {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": ["null", "number"]}}, "required": ["kind", "n"]}]});
        assert_eq!(closed(schema.clone(), r#"{"kind": "a", "p": {"#), r#"{"kind": "a", "p": {"x": 4}}"#);
        assert_eq!(closed(schema.clone(), r#"{"kind": "b""#), r#"{"kind": "b", "n": 0}"#);
        assert_eq!(closed(schema, ""), r#"{"kind": "b", "n": 0}"#);
        let number = |bounds: Value| least_number(bounds.as_object().unwrap(), false);
        assert_eq!(number(json!({"minimum": -2.5, "maximum": 7})).as_deref(), Some("0"));
        assert_eq!(number(json!({"minimum": 2.5})).as_deref(), Some("2.5"));
        assert_eq!(number(json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1})).as_deref(), Some("0.5"));
        assert_eq!(number(json!({"maximum": -3})).as_deref(), Some("-3"));
        assert_eq!(least_number(json!({"minimum": 0.5}).as_object().unwrap(), true).as_deref(), Some("1"));
    }

    #[test]
    fn a_whole_value_needs_nothing_and_a_broken_one_has_no_ending() {
        let any = SchemaEnding::new(Value::Bool(true));
        assert_eq!(any.ending(r#"{"a": [1]}"#).as_deref(), Some(""));
        assert_eq!(any.ending(r#"{"a": [1, "#).as_deref(), Some("null]}"));
        // Any key may come: the least member is the empty key's.
        assert_eq!(any.ending(r#"{"a": 1, "#).as_deref(), Some(r#""": null}"#));
        assert_eq!(any.ending(r#"{""#).as_deref(), Some(r#"": null}"#));
        assert_eq!(any.ending(r#"{"a": "x\u0"#), None);
        assert_eq!(any.ending(r#"{"a" 1"#), None);
    }
}
