//! Closing a JSON value that was cut off: what an answer cut by `max_tokens` in the middle
//! of a tool call's arguments needs to be one value again; and the [`Scan`] of a cut value
//! that [`crate::json_least`] completes against a schema.

/// `partial` — the start of one JSON value, cut anywhere — made a complete value by the
/// shortest ending: an unfinished string closed, a cut literal or number finished, a key
/// without a value given `null`, a dangling comma dropped, brackets closed. `None` when
/// `partial` is not the start of a JSON value (or holds more than one).
pub fn close_json(partial: &str) -> Option<String> {
    Scan::of(partial.as_bytes())?.close(partial.trim_end(), "null")
}

/// Where an object is between its members.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Member {
    /// After `{` or `,`: a key (or, after `{`, the end) comes next.
    Key,
    /// After a key: the `:`.
    Colon,
    /// After the `:`: the value.
    Value,
    /// After a value: `,` or the end.
    Next,
}

/// An object being read.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub(crate) member: Member,
    /// The members read, each key with its value's text when that is a string, number or
    /// literal (what tells `anyOf` branches apart).
    pub(crate) members: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The key whose value comes next (from [`Member::Colon`] to the value's end).
    pub(crate) key: Vec<u8>,
}

impl Object {
    /// Whether `key` was read already.
    pub(crate) fn has(&self, key: &[u8]) -> bool {
        self.members.iter().any(|(k, _)| k == key)
    }
}

/// An open object or array.
#[derive(Debug, Clone)]
pub(crate) enum Open {
    Object(Object),
    /// The items read, and whether one was read since the `[` or the last `,`.
    Array {
        items: usize,
        read: bool,
    },
}

/// A string being read.
#[derive(Debug, Clone)]
pub(crate) struct Str {
    /// Whether it is an object's key.
    pub(crate) key: bool,
    /// Whether a `\` was the last byte.
    pub(crate) escaped: bool,
    /// Its text so far, as written (escapes and all).
    pub(crate) text: Vec<u8>,
}

/// What a JSON value cut anywhere holds open, read byte by byte (a cut character inside a
/// string is only bytes of its text).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scan {
    pub(crate) open: Vec<Open>,
    pub(crate) string: Option<Str>,
    /// A literal or number being read (its text so far).
    pub(crate) word: String,
    /// The top-level value ended.
    pub(crate) done: bool,
    /// The last byte read.
    pub(crate) last: Option<u8>,
}

impl Scan {
    /// The scan of `partial`; `None` when it is not the start of one JSON value.
    pub(crate) fn of(partial: &[u8]) -> Option<Scan> {
        let mut scan = Scan::default();
        scan.push_all(partial)?;
        Some(scan)
    }

    /// Read `bytes`; `None` (the scan then half-moved) when they cannot continue the value.
    pub(crate) fn push_all(&mut self, bytes: &[u8]) -> Option<()> {
        bytes.iter().try_for_each(|&b| self.push(b))
    }

    /// Whether the value ends inside a string.
    pub(crate) fn in_string(&self) -> bool {
        self.string.is_some()
    }

    fn push(&mut self, c: u8) -> Option<()> {
        self.last = Some(c);
        if let Some(s) = self.string.as_mut() {
            match (s.escaped, c) {
                (true, _) => s.escaped = false,
                (false, b'\\') => s.escaped = true,
                (false, b'"') => {
                    let s = self.string.take()?;
                    let mut raw = Vec::with_capacity(s.text.len() + 2);
                    raw.push(b'"');
                    raw.extend_from_slice(&s.text);
                    raw.push(b'"');
                    self.value_ended(s.key, Some(if s.key { s.text } else { raw }));
                    return Some(());
                }
                _ => {}
            }
            s.text.push(c);
            return Some(());
        }
        if !self.word.is_empty() {
            if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'+' | b'-') {
                self.word.push(c as char);
                return Some(());
            }
            self.word_ended()?;
        }
        match c {
            b' ' | b'\t' | b'\n' | b'\r' => {}
            b'{' | b'[' => {
                self.value_starts()?;
                self.open.push(if c == b'{' {
                    Open::Object(Object { member: Member::Key, members: Vec::new(), key: Vec::new() })
                } else {
                    Open::Array { items: 0, read: false }
                });
            }
            b'}' => match self.open.pop()? {
                Open::Object(Object { member: Member::Key | Member::Next, .. }) => {
                    self.value_ended(false, None)
                }
                _ => return None,
            },
            b']' => match self.open.pop()? {
                Open::Array { .. } => self.value_ended(false, None),
                Open::Object(_) => return None,
            },
            b',' => match self.open.last_mut()? {
                Open::Object(o) if o.member == Member::Next => o.member = Member::Key,
                Open::Array { read: read @ true, .. } => *read = false,
                _ => return None,
            },
            b':' => match self.open.last_mut()? {
                Open::Object(o) if o.member == Member::Colon => o.member = Member::Value,
                _ => return None,
            },
            b'"' => {
                let key = matches!(self.open.last(), Some(Open::Object(o)) if o.member == Member::Key);
                if !key {
                    self.value_starts()?;
                }
                self.string = Some(Str { key, escaped: false, text: Vec::new() });
            }
            c if c.is_ascii_alphanumeric() || c == b'-' => {
                self.value_starts()?;
                self.word.push(c as char);
            }
            _ => return None,
        }
        Some(())
    }

    /// A value may start here.
    fn value_starts(&self) -> Option<()> {
        let ok = match self.open.last() {
            None => !self.done,
            Some(Open::Object(o)) => o.member == Member::Value,
            Some(Open::Array { read, .. }) => !read,
        };
        ok.then_some(())
    }

    /// A value ended — `text`, when it was a string, number or literal — or, `key`, an
    /// object's key (`text` is then the key).
    pub(crate) fn value_ended(&mut self, key: bool, text: Option<Vec<u8>>) {
        match self.open.last_mut() {
            None => self.done = true,
            Some(Open::Object(o)) if key => {
                o.key = text.unwrap_or_default();
                o.member = Member::Colon;
            }
            Some(Open::Object(o)) => {
                let key = std::mem::take(&mut o.key);
                o.members.push((key, text));
                o.member = Member::Next;
            }
            Some(Open::Array { items, read }) => {
                *items += 1;
                *read = true;
            }
        }
    }

    fn word_ended(&mut self) -> Option<()> {
        let word = std::mem::take(&mut self.word);
        (json_number(&word) || matches!(word.as_str(), "true" | "false" | "null")).then_some(())?;
        self.value_ended(false, Some(word.into_bytes()));
        Some(())
    }

    /// The ending that completes what was read, appended to `partial` (less a dangling comma
    /// or a cut escape), with `filler` as a missing value.
    fn close(mut self, partial: &str, filler: &str) -> Option<String> {
        let mut out = partial.to_owned();
        if let Some(s) = self.string.take() {
            if s.escaped {
                out.pop();
            }
            // A cut `\u` escape is dropped with its digits.
            if let Some(at) =
                out.rfind("\\u").filter(|&at| out.len() - at < 6 && !escaped_backslash(&out, at))
            {
                out.truncate(at);
            }
            out.push('"');
            self.value_ended(s.key, None);
        }
        if !self.word.is_empty() {
            let word = std::mem::take(&mut self.word);
            out.push_str(word_ending(&word)?);
            self.value_ended(false, None);
        }
        let top_level_empty = self.open.is_empty() && !self.done;
        if top_level_empty {
            return None;
        }
        while let Some(open) = self.open.pop() {
            match open {
                Open::Object(o) => match o.member {
                    Member::Colon => out.push_str(&format!(": {filler}}}")),
                    Member::Value if out.ends_with(char::is_whitespace) => {
                        out.push_str(&format!("{filler}}}"))
                    }
                    Member::Value => out.push_str(&format!(" {filler}}}")),
                    Member::Key => {
                        drop_dangling_comma(&mut out);
                        out.push('}');
                    }
                    Member::Next => out.push('}'),
                },
                Open::Array { .. } => {
                    drop_dangling_comma(&mut out);
                    out.push(']');
                }
            }
            // The container closed is its parent's value.
            self.value_ended(false, None);
        }
        Some(out)
    }
}

/// What finishes `word`, a literal or number cut: the rest of a literal, nothing for a whole
/// number, a `0` for one cut after its point, exponent or sign. `None` for no such start.
pub(crate) fn word_ending(word: &str) -> Option<&'static str> {
    if let Some(rest) = ["true", "false", "null"].iter().find_map(|l| l.strip_prefix(word)) {
        return Some(rest);
    }
    if json_number(word) {
        Some("")
    } else if json_number(&format!("{word}0")) {
        Some("0")
    } else {
        None
    }
}

/// Whether `word` is a number as JSON writes them.
fn json_number(word: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(word).is_ok_and(|v| v.is_number())
}

/// Whether the `\` at `at` is itself escaped (preceded by an odd run of backslashes).
fn escaped_backslash(s: &str, at: usize) -> bool {
    s[..at].chars().rev().take_while(|&c| c == '\\').count() % 2 == 1
}

fn drop_dangling_comma(out: &mut String) {
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    if out.ends_with(',') {
        out.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closes(partial: &str, want: &str) {
        let got = close_json(partial).unwrap_or_else(|| panic!("{partial:?} not closed"));
        assert_eq!(got, want, "{partial:?}");
        serde_json::from_str::<serde_json::Value>(&got).unwrap_or_else(|e| panic!("{got:?}: {e}"));
    }

    #[test]
    fn values_cut_anywhere_are_closed_by_the_shortest_ending() {
        closes(
            r#"{"name": "get_weather", "arguments": {"city": "Par"#,
            r#"{"name": "get_weather", "arguments": {"city": "Par"}}"#,
        );
        closes(r#"{"a": [1, 2,"#, r#"{"a": [1, 2]}"#);
        closes(r#"{"a": tr"#, r#"{"a": true}"#);
        closes(r#"{"a": 1."#, r#"{"a": 1.0}"#);
        closes(r#"{"a": -"#, r#"{"a": -0}"#);
        closes(r#"{"a": 12"#, r#"{"a": 12}"#);
        closes(r#"{"a":"#, r#"{"a": null}"#);
        closes(r#"{"a""#, r#"{"a": null}"#);
        closes(r#"{"ke"#, r#"{"ke": null}"#);
        closes(r#"{"a": 1, "#, r#"{"a": 1}"#);
        closes(r#"{"a": "x\"#, r#"{"a": "x"}"#);
        closes(r#"{"a": "x\u00"#, r#"{"a": "x"}"#);
        closes(r#"{"a": "x\\"#, r#"{"a": "x\\"}"#);
        closes(r#"[{"a": [], "b": {}}, "#, r#"[{"a": [], "b": {}}]"#);
        closes(r#"{"a": 1}"#, r#"{"a": 1}"#);
        closes(r#"{"é": "ü"#, r#"{"é": "ü"}"#);
        closes("{", "{}");
    }

    #[test]
    fn what_is_not_the_start_of_one_value_is_refused() {
        for bad in
            ["", "  ", "}", r#"{"a" 1"#, r#"{"a": 1} 2"#, "[1 2", r#"{"a": trux"#, "{1: 2}", r#"{"a": 1.e"#]
        {
            assert_eq!(close_json(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_scan_knows_the_members_and_items_read() {
        let scan = Scan::of(br#"{"a": 1, "b": "x", "c": [true, {"d": nu"#).unwrap();
        let [Open::Object(top), Open::Array { items: 1, read: false }, Open::Object(inner)] = &scan.open[..]
        else {
            panic!("{scan:?}")
        };
        let read: Vec<_> = top.members.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
        assert_eq!(read, [(&b"a"[..], Some(&b"1"[..])), (b"b", Some(br#""x""#))]);
        assert_eq!(
            (top.key.as_slice(), inner.key.as_slice(), scan.word.as_str()),
            (&b"c"[..], &b"d"[..], "nu")
        );
    }
}
