//! A `grammar` written for llama.cpp's server, in GBNF (`root ::= "yes" | "no"`), constrains
//! pocketd's output too: [`to_lark`] writes it in llguidance's Lark dialect.
//!
//! GBNF matches characters: every terminal of the Lark it gives is one character (a one
//! character string, or a `/[…]/` class), and every repetition is the grammar's, not a regex's.
//! llguidance's lexer is greedy (a terminal that can go on, does), so a longer terminal would
//! change what matches: with `"ing"` as one terminal, `[a-z]+ "ing"` could not match
//! `walkinging`, whose first `ing` the terminal would swallow. One character at a time, the
//! Earley parser sees every way, as llama.cpp's parser does.
//!
//! What Lark cannot say here is refused by name: token references (`<[1000]>`, `<think>`,
//! `!<…>`) constrain token ids, not text.

use std::collections::{HashMap, HashSet};

/// Why a GBNF grammar cannot be converted: what is wrong, where, and what is allowed there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GbnfError {
    /// A syntax error, a construct without a Lark equivalent, or a reference to an undefined
    /// rule, at a place in the grammar.
    #[error("line {line}, column {column}: {message}")]
    At {
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// No rule is named `root`.
    #[error("no `root` rule: a GBNF grammar's output is what its `root ::= …` rule matches")]
    NoRoot,
}

/// Whether `text` is GBNF rather than Lark: some line (not a comment) defines a rule with
/// `::=`, as `name ::= …` (Lark writes `name: …`).
pub fn looks_like_gbnf(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start();
        let name = line.find(|c| !is_name_char(c)).unwrap_or(line.len());
        name > 0 && line[name..].trim_start_matches([' ', '\t']).starts_with("::=")
    })
}

/// `gbnf` in llguidance's Lark dialect: `start: root`, then one Lark rule per GBNF rule.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let mut parser = Parser { chars: gbnf.chars().collect(), pos: 0 };
    let rules = parser.grammar()?;

    // Lark rule names are lowercase, `-` is `_` and the first is a letter: `Move-1` is
    // `move_1`. A name taken already (by `start`, or by `move-1` next to `Move-1`) gets a
    // number.
    let mut names: HashMap<&str, String> = HashMap::new();
    let mut taken: HashSet<String> = HashSet::from(["start".to_string()]);
    for rule in &rules {
        let mut base: String =
            rule.name.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect();
        if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
            base.insert(0, 'r');
        }
        let (mut name, mut n) = (base.clone(), 2);
        while !taken.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        names.insert(&rule.name, name);
    }
    let root = names.get("root").ok_or(GbnfError::NoRoot)?;

    let mut out = format!("start: {root}\n");
    for rule in &rules {
        out += &names[rule.name.as_str()];
        out += ": ";
        emit(&rule.body, Level::Alternatives, &names, &parser, &mut out)?;
        out.push('\n');
    }
    Ok(out)
}

/// A rule's body.
#[derive(Debug)]
enum Expr {
    /// `a | b`: two or more.
    Alt(Vec<Expr>),
    /// `a b`: none (the empty string) or more.
    Seq(Vec<Expr>),
    /// `"…"`.
    Text(String),
    /// `[…]`: the ranges of characters it has (or, negated, has not).
    Class { negated: bool, ranges: Vec<(char, char)> },
    /// `.`: any character.
    Any,
    /// Another rule, and where it is named (for an error if it is not defined).
    Ref { name: String, at: usize },
    /// `x*`, `x+`, `x?`, `x{m,n}`: no `max` is no bound.
    Repeat { expr: Box<Expr>, min: u32, max: Option<u32> },
}

struct Rule {
    name: String,
    body: Expr,
}

/// Repetition counts above this are refused. llama.cpp refuses a least count above it too
/// (and reads a larger most count as no bound, which would change what the grammar says).
const MAX_COUNT: u32 = 2000;

/// What a GBNF rule name is made of.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// A recursive-descent parser over the grammar's characters.
struct Parser {
    chars: Vec<char>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, at: usize) -> Option<char> {
        self.chars.get(at).copied()
    }

    /// The 1-based line and column of the character at `at`.
    fn line_column(&self, at: usize) -> (usize, usize) {
        let before = &self.chars[..at.min(self.chars.len())];
        let line = 1 + before.iter().filter(|&&c| c == '\n').count();
        (line, 1 + before.iter().rev().take_while(|&&c| c != '\n').count())
    }

    fn error(&self, at: usize, message: impl Into<String>) -> GbnfError {
        let (line, column) = self.line_column(at);
        GbnfError::At { line, column, message: message.into() }
    }

    /// Past spaces, newlines and `#` comments: a body may go on over several lines.
    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' | '\n' => self.pos += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name_end(&self, at: usize) -> usize {
        (at..self.chars.len()).find(|&i| !is_name_char(self.chars[i])).unwrap_or(self.chars.len())
    }

    /// Whether a rule `name ::=` starts at `at`: the previous rule's body ends there.
    fn rule_starts_at(&self, at: usize) -> bool {
        let mut i = self.name_end(at);
        while matches!(self.peek_at(i), Some(' ' | '\t')) {
            i += 1;
        }
        i > at && self.chars[i..].starts_with(&[':', ':', '='])
    }

    fn grammar(&mut self) -> Result<Vec<Rule>, GbnfError> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut defined: HashMap<String, usize> = HashMap::new();
        loop {
            self.skip_space();
            let at = self.pos;
            match self.peek() {
                None => break,
                Some(')') => return Err(self.error(at, "this `)` closes no `(`")),
                Some(c) if is_name_char(c) && self.rule_starts_at(at) => {}
                Some(_) => {
                    return Err(
                        self.error(at, "expected a rule `name ::= …` (a name is letters, digits and `-`)")
                    );
                }
            }
            self.pos = self.name_end(at);
            let name: String = self.chars[at..self.pos].iter().collect();
            if let Some(&first) = defined.get(&name) {
                let (line, _) = self.line_column(first);
                return Err(self.error(at, format!("rule `{name}` is defined twice (first on line {line})")));
            }
            defined.insert(name.clone(), at);
            // `::=` follows: `rule_starts_at` saw it.
            while self.peek() != Some(':') {
                self.pos += 1;
            }
            self.pos += 3;
            let body = self.alternatives()?;
            rules.push(Rule { name, body });
        }
        Ok(rules)
    }

    /// `seq | seq | …`, up to the end, a `)` or the next rule.
    fn alternatives(&mut self) -> Result<Expr, GbnfError> {
        let mut alternatives = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            alternatives.push(self.sequence()?);
        }
        Ok(if alternatives.len() == 1 { alternatives.remove(0) } else { Expr::Alt(alternatives) })
    }

    fn sequence(&mut self) -> Result<Expr, GbnfError> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None | Some('|' | ')') => break,
                Some(c) if is_name_char(c) && self.rule_starts_at(self.pos) => break,
                _ => {}
            }
            let atom = self.atom()?;
            items.push(self.repetitions(atom)?);
        }
        Ok(if items.len() == 1 { items.remove(0) } else { Expr::Seq(items) })
    }

    fn atom(&mut self) -> Result<Expr, GbnfError> {
        let at = self.pos;
        let Some(c) = self.peek() else { unreachable!("sequence() stops at the end") };
        Ok(match c {
            '"' => self.string()?,
            '[' => self.class()?,
            '.' => {
                self.pos += 1;
                Expr::Any
            }
            '(' => {
                self.pos += 1;
                let group = self.alternatives()?;
                if self.peek() != Some(')') {
                    return Err(self.error(at, "this `(` is never closed: a `)` must end the group"));
                }
                self.pos += 1;
                group
            }
            c if is_name_char(c) => {
                self.pos = self.name_end(at);
                Expr::Ref { name: self.chars[at..self.pos].iter().collect(), at }
            }
            '<' => {
                return Err(self.error(
                    at,
                    "token references (`<[1000]>`, `<think>`) are not supported: pocketd's \
                     grammars match text; write the token's text as a string (`\"<think>\"`)",
                ));
            }
            '!' if self.peek_at(at + 1) == Some('<') => {
                return Err(self.error(
                    at,
                    "negated token references (`!<…>`) are not supported: pocketd's grammars \
                     match text, not token ids",
                ));
            }
            '*' | '+' | '?' | '{' => {
                return Err(self.error(at, format!("`{c}` has nothing before it to repeat")));
            }
            c => {
                return Err(self.error(
                    at,
                    format!(
                        "unexpected `{c}`: expected a string `\"…\"`, a character class `[…]`, `.`, \
                         a rule name, a group `( … )`, `|`, or the next rule `name ::= …`"
                    ),
                ));
            }
        })
    }

    /// `expr` with the `*`, `+`, `?` and `{m,n}` after it.
    fn repetitions(&mut self, mut expr: Expr) -> Result<Expr, GbnfError> {
        loop {
            self.skip_space();
            let (min, max) = match self.peek() {
                Some('{') => self.counts()?,
                Some(c @ ('*' | '+' | '?')) => {
                    self.pos += 1;
                    match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    }
                }
                _ => return Ok(expr),
            };
            expr = Expr::Repeat { expr: Box::new(expr), min, max };
        }
    }

    /// `{m}`, `{m,}`, `{m,n}` or `{,n}`.
    fn counts(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        let at = self.pos;
        let bad = |p: &Self| p.error(at, "expected a count: `{m}`, `{m,}`, `{m,n}` or `{,n}`");
        self.pos += 1;
        self.skip_space();
        let min = self.number()?;
        self.skip_space();
        let max = match self.peek() {
            Some('}') => Some(min.ok_or_else(|| bad(self))?),
            Some(',') => {
                self.pos += 1;
                self.skip_space();
                let max = self.number()?;
                self.skip_space();
                if self.peek() != Some('}') {
                    return Err(bad(self));
                }
                max
            }
            _ => return Err(bad(self)),
        };
        self.pos += 1;
        let min = min.unwrap_or(0);
        if let Some(max) = max
            && max < min
        {
            return Err(self.error(at, format!("the most ({max}) is less than the least ({min})")));
        }
        Ok((min, max))
    }

    fn number(&mut self) -> Result<Option<u32>, GbnfError> {
        let at = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if at == self.pos {
            return Ok(None);
        }
        let digits: String = self.chars[at..self.pos].iter().collect();
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_COUNT => Ok(Some(n)),
            _ => Err(self.error(at, format!("a repetition count is at most {MAX_COUNT}"))),
        }
    }

    /// `"…"`.
    fn string(&mut self) -> Result<Expr, GbnfError> {
        let at = self.pos;
        self.pos += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error(at, "this string is never closed: a `\"` must end it")),
                Some('"') => break,
                Some(_) => text.push(self.character()?),
            }
        }
        self.pos += 1;
        Ok(Expr::Text(text))
    }

    /// `[…]`, `[^…]`: characters and ranges `a-z`; a `-` first or last is itself.
    fn class(&mut self) -> Result<Expr, GbnfError> {
        let at = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error(at, "this `[` is never closed: a `]` must end the class")),
                Some(']') => break,
                Some(_) => {}
            }
            let from = self.pos;
            let lo = self.character()?;
            let mut hi = lo;
            if self.peek() == Some('-') && self.peek_at(self.pos + 1).is_some_and(|c| c != ']') {
                self.pos += 1;
                hi = self.character()?;
                if hi < lo {
                    return Err(self.error(from, format!("the range {lo:?}-{hi:?} is reversed")));
                }
            }
            ranges.push((lo, hi));
        }
        self.pos += 1;
        match (negated, ranges.is_empty()) {
            (true, true) => Ok(Expr::Any),
            (false, true) => Err(self.error(at, "`[]` matches no character")),
            _ => Ok(Expr::Class { negated, ranges }),
        }
    }

    /// One character of a string or a class, escapes decoded.
    fn character(&mut self) -> Result<char, GbnfError> {
        let at = self.pos;
        let c = self.peek().expect("the caller saw a character");
        self.pos += 1;
        if c != '\\' {
            return Ok(c);
        }
        let escape = self.peek();
        self.pos += 1;
        let digits = match escape {
            Some('n') => return Ok('\n'),
            Some('r') => return Ok('\r'),
            Some('t') => return Ok('\t'),
            Some(c @ ('\\' | '"' | '[' | ']' | '-')) => return Ok(c),
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            _ => {
                let what = escape.map_or("`\\` at the end".into(), |c| format!("`\\{c}`"));
                return Err(self.error(
                    at,
                    format!(
                        "unknown escape {what}: allowed are \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\xHH \
                         \\uHHHH \\UHHHHHHHH"
                    ),
                ));
            }
        };
        let hex: String = self.chars[self.pos..].iter().take(digits).collect();
        let code = match u32::from_str_radix(&hex, 16) {
            // (`from_str_radix` would take a `+` too.)
            Ok(code) if hex.len() == digits && hex.chars().all(|c| c.is_ascii_hexdigit()) => code,
            _ => {
                let escape = escape.unwrap_or_default();
                return Err(self.error(at, format!("`\\{escape}` takes {digits} hex digits")));
            }
        };
        self.pos += digits;
        char::from_u32(code).ok_or_else(|| self.error(at, format!("U+{code:04X} is not a Unicode character")))
    }
}

/// Where an expression is written in Lark, for the parentheses it needs there.
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Level {
    /// A rule's body or a group's: alternatives need nothing.
    Alternatives,
    /// An item of a sequence: alternatives need a group.
    Item,
    /// What a `*`, `+`, `?` or `{m,n}` repeats: only an atom.
    Atom,
}

fn emit(
    expr: &Expr,
    level: Level,
    names: &HashMap<&str, String>,
    parser: &Parser,
    out: &mut String,
) -> Result<(), GbnfError> {
    let parens = match expr {
        Expr::Alt(_) => level > Level::Alternatives,
        Expr::Seq(items) => items.len() > 1 && level == Level::Atom,
        Expr::Text(text) => text.chars().count() > 1 && level == Level::Atom,
        Expr::Repeat { max, .. } => *max != Some(0) && level == Level::Atom,
        Expr::Class { .. } | Expr::Any | Expr::Ref { .. } => false,
    };
    if parens {
        out.push('(');
    }
    match expr {
        Expr::Alt(alternatives) => {
            for (i, alternative) in alternatives.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                emit(alternative, Level::Item, names, parser, out)?;
            }
        }
        Expr::Seq(items) if items.is_empty() => out.push_str("\"\""),
        Expr::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                emit(item, Level::Item, names, parser, out)?;
            }
        }
        Expr::Text(text) if text.is_empty() => out.push_str("\"\""),
        // One terminal per character (see the module's doc).
        Expr::Text(text) => {
            for (i, c) in text.chars().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                string(c, out);
            }
        }
        Expr::Class { negated, ranges } => {
            out.push_str(if *negated { "/[^" } else { "/[" });
            for &(lo, hi) in ranges {
                class_char(lo, out);
                if hi != lo {
                    out.push('-');
                    class_char(hi, out);
                }
            }
            out.push_str("]/");
        }
        Expr::Any => out.push_str("/(?s:.)/"),
        Expr::Ref { name, at } => {
            let lark = names.get(name.as_str()).ok_or_else(|| {
                parser.error(*at, format!("rule `{name}` is not defined (define it as `{name} ::= …`)"))
            })?;
            out.push_str(lark);
        }
        // Lark refuses a count whose most is 0; it is the empty string.
        Expr::Repeat { max: Some(0), .. } => out.push_str("\"\""),
        Expr::Repeat { expr, min, max } => {
            emit(expr, Level::Atom, names, parser, out)?;
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => out.push_str(&format!("{{{m},}}")),
                (m, Some(n)) if m == n => out.push_str(&format!("{{{m}}}")),
                (m, Some(n)) => out.push_str(&format!("{{{m},{n}}}")),
            }
        }
    }
    if parens {
        out.push(')');
    }
    Ok(())
}

/// A Lark string literal of one character: JSON's syntax.
fn string(c: char, out: &mut String) {
    out.push('"');
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        // Lark's lexer takes no raw control character in a string.
        c if c.is_ascii_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push(c),
    }
    out.push('"');
}

/// A character inside a `/[…]/` class, in the syntax of Rust's `regex` (llguidance's).
fn class_char(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        // What a class gives a meaning to (`&&`, `--`, `~~` are set operations).
        '\\' | '[' | ']' | '^' | '-' | '&' | '~' => {
            out.push('\\');
            out.push(c);
        }
        // `/` would end Lark's `/regex/`; control characters are written as codes.
        c if c == '/' || c.is_ascii_control() => out.push_str(&format!("\\x{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use llguidance::api::TopLevelGrammar;
    use llguidance::toktrie::ApproximateTokEnv;
    use llguidance::{Matcher, ParserFactory};

    use super::*;

    fn lark(gbnf: &str) -> String {
        to_lark(gbnf).unwrap_or_else(|e| panic!("{e}\n{gbnf}"))
    }

    fn error(gbnf: &str) -> String {
        match to_lark(gbnf) {
            Ok(lark) => panic!("converted:\n{gbnf}\nto:\n{lark}"),
            Err(e) => e.to_string(),
        }
    }

    /// `gbnf` converted and compiled by llguidance, over a vocabulary of one token per byte
    /// (as pocketd's [`crate::grammar::limits`] bound it): whether it matches a text whole.
    fn language(gbnf: &str) -> impl Fn(&str) -> bool {
        let lark = lark(gbnf);
        let env = ApproximateTokEnv::single_byte_env();
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.set_stderr_log_level(0);
        *factory.limits_mut() = crate::grammar::limits();
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.clone()))
            .unwrap_or_else(|e| panic!("llguidance refused:\n{lark}\n{e}"));
        let start = Matcher::new(Ok(parser));
        assert_eq!(start.get_error(), None, "{lark}");
        move |text| {
            let mut m = start.clone();
            let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
            m.try_consume_tokens(&bytes).unwrap() == bytes.len() && m.is_accepting().unwrap()
        }
    }

    /// `gbnf` matches every one of `yes` and none of `no`.
    fn check(gbnf: &str, yes: &[&str], no: &[&str]) {
        let matches = language(gbnf);
        for text in yes {
            assert!(matches(text), "{text:?} should match:\n{gbnf}\n{}", lark(gbnf));
        }
        for text in no {
            assert!(!matches(text), "{text:?} should not match:\n{gbnf}\n{}", lark(gbnf));
        }
    }

    #[test]
    fn gbnf_is_told_from_lark_by_its_rule_definitions() {
        assert!(looks_like_gbnf("root ::= \"yes\" | \"no\""));
        assert!(looks_like_gbnf("# an answer\n  root::=[a-z]+\n"));
        assert!(looks_like_gbnf("# a move\nmove-1 ::= [a-h] [1-8]\n"));
        assert!(!looks_like_gbnf("start: \"yes\" | \"no\""));
        assert!(!looks_like_gbnf("start: \"a ::= b\"\n"));
        assert!(!looks_like_gbnf("# root ::= \"commented out\"\nstart: \"x\""));
        assert!(!looks_like_gbnf(""));
    }

    #[test]
    fn gbnf_rules_become_lark_rules_under_safe_distinct_names() {
        let gbnf = r#"
# the answer
root ::= Move-1 move-1 start 1st -x # a reference to each
Move-1 ::= "a"
move-1 ::= "b"
start ::= "c"
1st ::= "d"
-x ::= "e"
"#;
        assert_eq!(
            lark(gbnf),
            "start: root\nroot: move_1 move_1_2 start_2 r1st r_x\nmove_1: \"a\"\nmove_1_2: \"b\"\n\
             start_2: \"c\"\nr1st: \"d\"\nr_x: \"e\"\n"
        );
    }

    #[test]
    fn gbnf_bodies_go_on_over_lines_until_the_next_rule() {
        let gbnf = "root ::= item\n  (\",\" item)*  # more\n\nitem ::=\n  \"x\"\n  | \"y\"\n";
        assert_eq!(lark(gbnf), "start: root\nroot: item (\",\" item)*\nitem: \"x\" | \"y\"\n");
        // An empty body, and an empty alternative, are the empty string.
        assert_eq!(lark("root ::= a | \na ::=\n"), "start: root\nroot: a | \"\"\na: \"\"\n");
    }

    #[test]
    fn gbnf_sequences_alternatives_groups_and_repetitions() {
        let gbnf = r#"root ::= ("a" | b c)* b+ c? (b c){2} b{2,} c{1,3} b{,4} c{ 0 } "x"?* "ab"+ ((b))"#;
        assert_eq!(
            lark(&format!("{gbnf}\nb ::= \"b\"\nc ::= \"c\"")),
            "start: root\nroot: (\"a\" | b c)* b+ c? (b c){2} b{2,} c{1,3} b{0,4} \"\" (\"x\"?)* \
             (\"a\" \"b\")+ b\nb: \"b\"\nc: \"c\"\n"
        );
    }

    #[test]
    fn gbnf_strings_and_their_escapes_become_lark_strings() {
        let gbnf = r#"root ::= "q\"b\\s/\n\t\r\x41\u00e9\U0001F600ü\x01\[\]\-" """#;
        assert_eq!(
            lark(gbnf),
            "start: root\nroot: \"q\" \"\\\"\" \"b\" \"\\\\\" \"s\" \"/\" \"\\n\" \"\\t\" \"\\r\" \"A\" \
             \"é\" \"😀\" \"ü\" \"\\u0001\" \"[\" \"]\" \"-\" \"\"\n"
        );
        check(gbnf, &["q\"b\\s/\n\t\rAé😀ü\u{1}[]-"], &["q\"b\\s/\n\t\rAé😀ü", "q"]);
    }

    #[test]
    fn gbnf_classes_become_regex_classes() {
        let cases = [
            ("[abc]", "/[abc]/"),
            ("[a-z0-9_]", "/[a-z0-9_]/"),
            (r#"[^\n"]"#, r#"/[^\n"]/"#),
            (r"[\]\-\\\[]", r"/[\]\-\\\[]/"),
            ("[a-]", r"/[a\-]/"),
            ("[-a]", r"/[\-a]/"),
            ("[/^&~ ]", r"/[\x{2f}\^\&\~ ]/"),
            (r"[\x00-\x1f\t]", r"/[\x{0}-\x{1f}\t]/"),
            (r"[\u00e0-\u00FFぁ-ゟ]", "/[à-ÿぁ-ゟ]/"),
            (".", "/(?s:.)/"),
            ("[^]", "/(?s:.)/"),
        ];
        for (gbnf, regex) in cases {
            assert_eq!(lark(&format!("root ::= {gbnf}")), format!("start: root\nroot: {regex}\n"), "{gbnf}");
        }
        check(
            r"root ::= [/^&~] [\]\-\\] [a-] [^\n] [\x00-\x1f] [à-ÿ] .",
            &["/]a\t\u{1}é\n", "~-- \u{1f}ÿx", "^\\aé\u{0}à😀"],
            &["/]a\n\u{1}é\n", "a]a\t\u{1}é\n", "/]a\t\u{1}é", "/]b\t\u{1}é\n", "/]a\t\u{1}z\n"],
        );
    }

    #[test]
    fn gbnf_errors_say_where_and_what_is_allowed() {
        let cases = [
            ("root ::= \"abc", "line 1, column 10: this string is never closed"),
            ("root ::= [abc", "line 1, column 10: this `[` is never closed"),
            ("root ::=\n  (\"a\" | \"b\"\n", "line 2, column 3: this `(` is never closed"),
            ("root ::= \"a\")", "line 1, column 13: this `)` closes no `(`"),
            ("root ::= \"a\\q\"", "line 1, column 12: unknown escape `\\q`: allowed are \\n \\r \\t"),
            ("root ::= \"\\x4\"", "line 1, column 11: `\\x` takes 2 hex digits"),
            ("root ::= \"\\u12G4\"", "`\\u` takes 4 hex digits"),
            ("root ::= \"\\uD800\"", "U+D800 is not a Unicode character"),
            ("root ::= [z-a]", "line 1, column 11: the range 'z'-'a' is reversed"),
            ("root ::= []", "`[]` matches no character"),
            ("root ::= * \"a\"", "line 1, column 10: `*` has nothing before it to repeat"),
            ("root ::= \"a\"{}", "line 1, column 13: expected a count: `{m}`, `{m,}`, `{m,n}` or `{,n}`"),
            ("root ::= \"a\"{,x}", "expected a count"),
            ("root ::= \"a\"{3,1}", "the most (1) is less than the least (3)"),
            ("root ::= \"a\"{99999}", "a repetition count is at most 2000"),
            ("root ::= \"a\" ; \"b\"", "line 1, column 14: unexpected `;`: expected a string"),
            ("root = \"a\"", "line 1, column 1: expected a rule `name ::= …`"),
            ("\"a\"", "line 1, column 1: expected a rule `name ::= …`"),
            (
                "root ::= a\na ::= \"x\"\n\na ::= \"y\"",
                "line 4, column 1: rule `a` is defined twice (first on line 2)",
            ),
            ("root ::= \"a\" item\n", "line 1, column 14: rule `item` is not defined"),
            ("item ::= \"a\"\n", "no `root` rule"),
            ("", "no `root` rule"),
        ];
        for (gbnf, message) in cases {
            let e = error(gbnf);
            assert!(
                e.starts_with(message) || (!message.starts_with("line") && e.contains(message)),
                "{gbnf:?}: {e}"
            );
        }
    }

    #[test]
    fn gbnf_token_references_are_refused_by_name() {
        for gbnf in ["root ::= <[1000]> \"a\"", "root ::= \"a\" <|im_end|>", "root ::= <think> .*"] {
            assert!(
                error(gbnf).contains("token references (`<[1000]>`, `<think>`) are not supported"),
                "{gbnf}"
            );
        }
        let e = error("root ::= \"a\"\nthinking ::= !</think>*");
        assert!(
            e.starts_with("line 2, column 14: negated token references (`!<…>`) are not supported"),
            "{e}"
        );
    }

    #[test]
    fn gbnf_arithmetic_expressions() {
        check(
            r#"
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?
ws     ::= " "?
"#,
            &["1", "1 + 2", "-(3.5*4) / 2", "((1))", "12 - -3"],
            &["", "1 +", "(1", "1..2", "a", "1  + 2"],
        );
    }

    #[test]
    fn gbnf_json_values() {
        check(
            r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"#,
            &[
                "{}",
                r#"{"a": 1, "b": [true, null, "x\"y\u00e9"], "c": {"d": -0.5e+3}}"#,
                "{\n  \"list\": []}",
            ],
            &["[]", r#"{"a" 1}"#, r#"{"a": tru}"#, r#"{"a": "\q"}"#, r#"{"a": 01}"#, "{\"a\": \"\n\"}"],
        );
    }

    #[test]
    fn gbnf_a_list_of_items() {
        check(
            r#"root ::= ("- " item)+
item ::= [^\n]+ "\n""#,
            &["- milk\n", "- eggs\n- bread, butter\n"],
            &["", "- \n", "- milk", "milk\n", "- milk\n\n"],
        );
    }

    #[test]
    fn gbnf_chess_moves() {
        check(
            r#"
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")*
move    ::= (pawn | nonpawn | castle) [+#]?
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle  ::= "O-O" "-O"?
"#,
            &["1. e4 e5\n", "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd1#\n"],
            &["1. e9 e5\n", "1. e4\n", "1. Ke4 e5", "2. e4 e5\n", "1. O-O-O-O e5\n"],
        );
    }

    #[test]
    fn gbnf_yes_or_no() {
        check(
            r#"root ::= ("Yes" | "No") ("." | ", because " [a-z ]{1,40} ".")"#,
            &["Yes.", "No, because it rains."],
            &["yes.", "Yes", "Maybe.", "No, because .", "No, because It rains."],
        );
    }

    #[test]
    fn gbnf_counts_escapes_and_any_character() {
        check(
            r#"root ::= phone "\t" note
phone ::= "(" [0-9]{3} ") " [0-9]{3} "-" [0-9]{4}
note ::= "\u00bfQu\u00e9? " .{2,}"#,
            &["(555) 123-4567\t¿Qué? ok", "(555) 123-4567\t¿Qué? a\nb😀"],
            &["(555) 123-456\t¿Qué? ok", "(5555) 123-4567\t¿Qué? ok", "(555) 123-4567\t¿Qué? o"],
        );
    }

    #[test]
    fn gbnf_literals_after_a_repeated_class_match_character_by_character() {
        // A literal that could take the class's last characters still matches where GBNF
        // says: `ing` is not swallowed by a terminal of its own.
        check(r#"root ::= [a-z]+ "ing""#, &["walking", "walkinging", "inging"], &["ing", "walk"]);
        check(r#"root ::= ("a" | "ab") "bc""#, &["abc", "abbc"], &["ab", "abcbc"]);
    }
}
