//! Closing a JSON value that was cut off: what an answer cut by `max_tokens` in the middle
//! of a tool call's arguments needs to be one value again.

/// `partial` — the start of one JSON value, cut anywhere — made a complete value by the
/// shortest ending: an unfinished string closed, a cut literal or number finished, a key
/// without a value given `null`, a dangling comma dropped, brackets closed. `None` when
/// `partial` is not the start of a JSON value (or holds more than one).
pub fn close_json(partial: &str) -> Option<String> {
    scan(partial)?.close(partial.trim_end(), "null")
}

/// What to append to `partial` — the start of one JSON value, as [`close_json`] takes it —
/// to complete it without changing what is there: `filler` as the value of a key that has
/// none. `None` when appending cannot do it (after a comma, a value or key must come first;
/// a cut escape).
pub fn json_ending(partial: &str, filler: &str) -> Option<String> {
    let full = scan(partial)?.close(partial, filler)?;
    full.strip_prefix(partial).map(str::to_owned)
}

/// Whether `partial`, the start of a JSON value, ends inside a string.
pub fn in_string(partial: &str) -> bool {
    scan(partial).is_some_and(|s| s.string.is_some())
}

fn scan(partial: &str) -> Option<Scan> {
    let mut scan = Scan::default();
    for c in partial.chars() {
        scan.push(c)?;
    }
    Some(scan)
}

/// Where an object is between its members.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Member {
    /// After `{` or `,`: a key (or, after `{`, the end) comes next.
    Key,
    /// After a key: the `:`.
    Colon,
    /// After the `:`: the value.
    Value,
    /// After a value: `,` or the end.
    Next,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Object(Member),
    /// Whether a value was read since the `[` or the last `,`.
    Array(bool),
}

#[derive(Default)]
struct Scan {
    open: Vec<Open>,
    /// Inside a string: whether it is a key, and whether a `\` was the last character.
    string: Option<(bool, bool)>,
    /// A literal or number being read (its text so far).
    word: String,
    /// The top-level value ended.
    done: bool,
}

impl Scan {
    fn push(&mut self, c: char) -> Option<()> {
        if let Some((key, escaped)) = self.string {
            self.string = match (escaped, c) {
                (true, _) => Some((key, false)),
                (false, '\\') => Some((key, true)),
                (false, '"') => {
                    self.value_ended(key);
                    None
                }
                _ => Some((key, false)),
            };
            return Some(());
        }
        if !self.word.is_empty() {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-') {
                self.word.push(c);
                return Some(());
            }
            self.word_ended()?;
        }
        match c {
            ' ' | '\t' | '\n' | '\r' => {}
            '{' | '[' => {
                self.value_starts()?;
                self.open.push(if c == '{' { Open::Object(Member::Key) } else { Open::Array(false) });
            }
            '}' => match self.open.pop()? {
                Open::Object(Member::Key | Member::Next) => self.value_ended(false),
                _ => return None,
            },
            ']' => match self.open.pop()? {
                Open::Array(_) => self.value_ended(false),
                Open::Object(_) => return None,
            },
            ',' => match self.open.last_mut()? {
                Open::Object(m @ Member::Next) => *m = Member::Key,
                Open::Array(read @ true) => *read = false,
                _ => return None,
            },
            ':' => match self.open.last_mut()? {
                Open::Object(m @ Member::Colon) => *m = Member::Value,
                _ => return None,
            },
            '"' => {
                let key = matches!(self.open.last(), Some(Open::Object(Member::Key)));
                if !key {
                    self.value_starts()?;
                }
                self.string = Some((key, false));
            }
            c if c.is_ascii_alphanumeric() || c == '-' => {
                self.value_starts()?;
                self.word.push(c);
            }
            _ => return None,
        }
        Some(())
    }

    /// A value may start here.
    fn value_starts(&self) -> Option<()> {
        let ok = match self.open.last() {
            None => !self.done,
            Some(Open::Object(m)) => *m == Member::Value,
            Some(Open::Array(read)) => !read,
        };
        ok.then_some(())
    }

    /// A value (or, `key`, an object's key) ended.
    fn value_ended(&mut self, key: bool) {
        match self.open.last_mut() {
            None => self.done = true,
            Some(Open::Object(m)) => *m = if key { Member::Colon } else { Member::Next },
            Some(Open::Array(read)) => *read = true,
        }
    }

    fn word_ended(&mut self) -> Option<()> {
        let word = std::mem::take(&mut self.word);
        (json_number(&word) || matches!(word.as_str(), "true" | "false" | "null")).then_some(())?;
        self.value_ended(false);
        Some(())
    }

    /// The ending that completes what was read, appended to `partial` (less a dangling comma
    /// or a cut escape), with `filler` as a missing value.
    fn close(mut self, partial: &str, filler: &str) -> Option<String> {
        let mut out = partial.to_owned();
        if let Some((key, escaped)) = self.string.take() {
            if escaped {
                out.pop();
            }
            // A cut `\u` escape is dropped with its digits.
            if let Some(at) =
                out.rfind("\\u").filter(|&at| out.len() - at < 6 && !escaped_backslash(&out, at))
            {
                out.truncate(at);
            }
            out.push('"');
            self.value_ended(key);
        }
        if !self.word.is_empty() {
            let word = std::mem::take(&mut self.word);
            let ending = ["true", "false", "null"].iter().find_map(|l| l.strip_prefix(word.as_str()));
            match ending {
                Some(rest) => out.push_str(rest),
                None if json_number(&word) => {}
                // A number cut after its point, exponent or sign takes a 0.
                None if json_number(&format!("{word}0")) => out.push('0'),
                None => return None,
            }
            self.value_ended(false);
        }
        let top_level_empty = self.open.is_empty() && !self.done;
        if top_level_empty {
            return None;
        }
        while let Some(open) = self.open.pop() {
            match open {
                Open::Object(Member::Colon) => out.push_str(&format!(": {filler}}}")),
                Open::Object(Member::Value) if out.ends_with(char::is_whitespace) => {
                    out.push_str(&format!("{filler}}}"));
                }
                Open::Object(Member::Value) => out.push_str(&format!(" {filler}}}")),
                Open::Object(Member::Key) => {
                    drop_dangling_comma(&mut out);
                    out.push('}');
                }
                Open::Object(Member::Next) => out.push('}'),
                Open::Array(_) => {
                    drop_dangling_comma(&mut out);
                    out.push(']');
                }
            }
            // The container closed is its parent's value.
            self.value_ended(false);
        }
        Some(out)
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
        closes("{", "{}");
    }

    #[test]
    fn an_ending_only_appends() {
        let ending = |p: &str| json_ending(p, "0");
        assert_eq!(ending(r#"{"steps": ["Toast the br"#).as_deref(), Some(r#""]}"#));
        assert_eq!(ending(r#"{"a": "#).as_deref(), Some("0}"));
        assert_eq!(ending(r#"{"a":"#).as_deref(), Some(" 0}"));
        assert_eq!(ending(r#"{"a""#).as_deref(), Some(": 0}"));
        assert_eq!(ending(r#"{"a": 1"#).as_deref(), Some("}"));
        assert_eq!(ending(r#"{"a": [1, 2]"#).as_deref(), Some("}"));
        assert_eq!(ending(r#"{"a": 1}"#).as_deref(), Some(""));
        // A comma wants a member or an item next, and a cut escape its characters.
        for stuck in [r#"{"a": 1, "#, r#"{"a": [1,"#, r#"{"a": "x\"#, r#"{"a": "x\u0"#] {
            assert_eq!(ending(stuck), None, "{stuck:?}");
        }
    }

    #[test]
    fn what_is_not_the_start_of_one_value_is_refused() {
        for bad in
            ["", "  ", "}", r#"{"a" 1"#, r#"{"a": 1} 2"#, "[1 2", r#"{"a": trux"#, "{1: 2}", r#"{"a": 1.e"#]
        {
            assert_eq!(close_json(bad), None, "{bad:?}");
        }
    }
}
