//! The benchmark workload: JSON Lines, one prompt or conversation per line (format in
//! this crate's `README.md`).
//!
//! ```json
//! {"id": "edit-textwrap-indent", "kind": "edit", "messages": [{"role": "user", "content": "..."}], "max_tokens": 256}
//! {"id": "conv-trip-planning", "kind": "conversation", "system": "...", "turns": ["...", "..."], "max_tokens": 96}
//! ```
//!
//! Prompts run in every mode; conversations are replayed turn by turn through pocketd
//! ([`crate::conversation`]). [`parse`] and [`load`] read prompts only (a conversation there
//! is an error that says so); [`parse_workload`] and [`load_workload`] read both.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use pocket_core::ChatMessage;
use serde::{Deserialize, Serialize};

use super::Error;

/// The project's default workload (`crates/pocket-bench/workload.jsonl`), built in so that a `pocket`
/// binary copied to a board has it too.
pub const DEFAULT_WORKLOAD: &str = include_str!("../workload.jsonl");

/// The name results give the built-in workload.
pub const DEFAULT_WORKLOAD_NAME: &str = "crates/pocket-bench/workload.jsonl (built in)";

/// The project's workload for encoder-decoder models (`crates/pocket-bench/seq2seq.jsonl`), built in.
pub const DEFAULT_SEQ2SEQ_WORKLOAD: &str = include_str!("../seq2seq.jsonl");

/// The name results give the built-in encoder-decoder workload.
pub const DEFAULT_SEQ2SEQ_WORKLOAD_NAME: &str = "crates/pocket-bench/seq2seq.jsonl (built in)";

/// What a prompt asks for; results are also summarised per kind, since speculation pays
/// very differently on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Rewrite given code or text: the output copies much of the input.
    Edit,
    /// Summarise given text: input-grounded.
    Summarize,
    /// An open-ended question.
    Qa,
    /// Several turns of conversation.
    Chat,
    /// Input text for an encoder-decoder model (`input` instead of `messages`).
    Seq2seq,
    /// A conversation replayed turn by turn (`system` and `turns` instead of `messages`): not
    /// a [`Prompt`] but a [`Conversation`], whose turns are results of their own.
    Conversation,
    /// One request of an app's stream of similar requests (`app` beside `messages`): not a
    /// [`Prompt`] but an [`AgenticRequest`], replayed in file order through pocketd so that
    /// what it learns from earlier answers builds up as in use.
    Agentic,
}

impl Kind {
    /// The name used in workloads and results.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Edit => "edit",
            Kind::Summarize => "summarize",
            Kind::Qa => "qa",
            Kind::Chat => "chat",
            Kind::Seq2seq => "seq2seq",
            Kind::Conversation => "conversation",
            Kind::Agentic => "agentic",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the model is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    /// A conversation, rendered with the model's chat template.
    Messages(Vec<ChatMessage>),
    /// Plain text (seq2seq).
    Text(String),
}

/// One prompt of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Unique name of the prompt.
    pub id: String,
    /// What it asks for.
    pub kind: Kind,
    /// What the model is given.
    pub input: PromptInput,
    /// Most tokens to generate (generation also stops at an end token).
    pub max_tokens: usize,
}

/// A conversation of a workload, replayed as a chat app sends it: turn k's request holds the
/// system message, every earlier user turn and the model's own answers to them, then user
/// turn k.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// Unique name of the conversation (among prompts and conversations).
    pub id: String,
    /// The system message every request starts with (`None`: none).
    pub system: Option<String>,
    /// The user's turns, in order (at least one).
    pub turns: Vec<String>,
    /// Most tokens to generate for each turn's answer.
    pub max_tokens: usize,
}

/// One request of an app's stream: apps ask similar things again and again, and the stream
/// is replayed in order ([`crate::agentic`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgenticRequest {
    /// Unique name of the request (among all lines).
    pub id: String,
    /// The app that sends it: its requests share a `prompt_cache_key`, apart from other apps'.
    pub app: String,
    /// The chat.
    pub messages: Vec<ChatMessage>,
    /// Most tokens to generate.
    pub max_tokens: usize,
}

/// A whole workload: prompts, run in every mode, and conversations and agentic streams,
/// replayed through pocketd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// The prompts, in file order.
    pub prompts: Vec<Prompt>,
    /// The conversations, in file order.
    pub conversations: Vec<Conversation>,
    /// The agentic requests, in file order (the order they are sent in).
    pub agentic: Vec<AgenticRequest>,
}

/// A line of a workload that is not a valid prompt or conversation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct WorkloadError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

/// One line as written; checked into a [`Prompt`] by [`RawPrompt::check`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrompt {
    id: String,
    kind: Kind,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    input: Option<String>,
    max_tokens: usize,
}

/// What a line's `kind` is, read before the line is read as a prompt or a conversation
/// (which have different fields, each refusing the other's).
#[derive(Deserialize)]
struct KindOnly {
    kind: Kind,
}

/// A `conversation` line as written; checked into a [`Conversation`] by
/// [`RawConversation::check`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConversation {
    id: String,
    /// Always `conversation` (how the line was told apart).
    #[serde(rename = "kind")]
    _kind: Kind,
    #[serde(default)]
    system: Option<String>,
    turns: Vec<String>,
    max_tokens: usize,
}

impl RawConversation {
    fn check(self) -> Result<Conversation, String> {
        check_common(&self.id, self.max_tokens)?;
        if self.turns.is_empty() {
            return Err("`turns` is empty: a conversation needs at least one user turn".into());
        }
        if let Some(i) = self.turns.iter().position(|t| t.trim().is_empty()) {
            return Err(format!("turn {} is empty", i + 1));
        }
        Ok(Conversation { id: self.id, system: self.system, turns: self.turns, max_tokens: self.max_tokens })
    }
}

/// An `agentic` line as written; checked into an [`AgenticRequest`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgentic {
    id: String,
    /// Always `agentic` (how the line was told apart).
    #[serde(rename = "kind")]
    _kind: Kind,
    app: String,
    messages: Vec<ChatMessage>,
    max_tokens: usize,
}

impl RawAgentic {
    fn check(self) -> Result<AgenticRequest, String> {
        check_common(&self.id, self.max_tokens)?;
        if self.app.trim().is_empty() {
            return Err("`app` is empty".into());
        }
        if self.messages.is_empty() {
            return Err("`messages` is empty".into());
        }
        Ok(AgenticRequest {
            id: self.id,
            app: self.app,
            messages: self.messages,
            max_tokens: self.max_tokens,
        })
    }
}

/// What prompts and conversations both need.
fn check_common(id: &str, max_tokens: usize) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err("`id` is empty".into());
    }
    if max_tokens == 0 {
        return Err("`max_tokens` must be at least 1".into());
    }
    Ok(())
}

impl RawPrompt {
    fn check(self) -> Result<Prompt, String> {
        check_common(&self.id, self.max_tokens)?;
        if self.kind == Kind::Conversation {
            // Not reached through `parse_line` (which reads such lines as conversations), but a
            // prompt of this kind would mean nothing.
            return Err("a `conversation` has `system` and `turns`, not `messages`".into());
        }
        let seq2seq = self.kind == Kind::Seq2seq;
        let input = match (self.messages, self.input) {
            (Some(_), Some(_)) => return Err("give either `messages` or `input`, not both".into()),
            (None, Some(text)) if seq2seq => PromptInput::Text(text),
            (Some(messages), None) if !seq2seq => {
                if messages.is_empty() {
                    return Err("`messages` is empty".into());
                }
                PromptInput::Messages(messages)
            }
            _ if seq2seq => {
                return Err("a `seq2seq` prompt needs `input` (text), not `messages`".into());
            }
            _ => return Err(format!("a `{}` prompt needs `messages`", self.kind)),
        };
        Ok(Prompt { id: self.id, kind: self.kind, input, max_tokens: self.max_tokens })
    }
}

/// A line: a prompt, a conversation or an agentic request.
enum Line {
    Prompt(Prompt),
    Conversation(Conversation),
    Agentic(AgenticRequest),
}

impl Line {
    fn id(&self) -> &str {
        match self {
            Line::Prompt(p) => &p.id,
            Line::Conversation(c) => &c.id,
            Line::Agentic(a) => &a.id,
        }
    }
}

/// Read one non-blank line. Its `kind` decides which fields it may have; a line whose `kind`
/// cannot be read is read as a prompt, so that the error is the prompt's (`unknown variant`,
/// `missing field`).
fn parse_line(line: &str) -> Result<Line, String> {
    let kind = serde_json::from_str::<KindOnly>(line).ok().map(|k| k.kind);
    if kind == Some(Kind::Conversation) {
        let raw: RawConversation = serde_json::from_str(line).map_err(|e| json_message(&e))?;
        return raw.check().map(Line::Conversation);
    }
    if kind == Some(Kind::Agentic) {
        let raw: RawAgentic = serde_json::from_str(line).map_err(|e| json_message(&e))?;
        return raw.check().map(Line::Agentic);
    }
    let raw: RawPrompt = serde_json::from_str(line).map_err(|e| json_message(&e))?;
    raw.check().map(Line::Prompt)
}

/// Parse a workload of prompts and conversations: one JSON object per line, blank lines
/// ignored.
///
/// Errors name the line (1-based) and what is wrong: invalid JSON, a missing or unknown
/// field, an unknown kind, `messages` and `input` both or neither, a conversation without
/// turns or with an empty one, `max_tokens` of 0, an id used twice, or nothing at all.
pub fn parse_workload(text: &str) -> Result<Workload, WorkloadError> {
    parse_lines(text, true)
}

/// Parse a workload of prompts only: as [`parse_workload`], and a conversation is an error
/// (it is replayed through pocketd: `pocket bench --socket`).
pub fn parse(text: &str) -> Result<Vec<Prompt>, WorkloadError> {
    parse_lines(text, false).map(|w| w.prompts)
}

fn parse_lines(text: &str, conversations: bool) -> Result<Workload, WorkloadError> {
    let mut workload = Workload::default();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let fail = |message: String| WorkloadError { line: line_no, message };
        if line.trim().is_empty() {
            continue;
        }
        let parsed = parse_line(line).map_err(fail)?;
        if let Some(first) = seen.insert(parsed.id().to_owned(), line_no) {
            return Err(fail(format!("id {:?} is already used on line {first}", parsed.id())));
        }
        match parsed {
            Line::Prompt(p) => workload.prompts.push(p),
            Line::Conversation(c) if conversations => workload.conversations.push(c),
            Line::Agentic(a) if conversations => workload.agentic.push(a),
            Line::Agentic(a) => {
                return Err(fail(format!(
                    "{:?} is an agentic request: agentic streams are replayed through pocketd (`pocket bench \
                     --socket`), not run as prompts",
                    a.id
                )));
            }
            Line::Conversation(c) => {
                return Err(fail(format!(
                    "{:?} is a conversation: conversations are replayed through pocketd (`pocket bench \
                     --socket`), not run as prompts",
                    c.id
                )));
            }
        }
    }
    if workload.prompts.is_empty() && workload.conversations.is_empty() && workload.agentic.is_empty() {
        return Err(WorkloadError {
            line: text.lines().count().max(1),
            message: if conversations {
                "the workload has no prompts or conversations"
            } else {
                "the workload has no prompts"
            }
            .into(),
        });
    }
    Ok(workload)
}

/// Read and [`parse`] the workload of prompts at `path`.
pub fn load(path: &Path) -> Result<Vec<Prompt>, Error> {
    parse(&read(path)?).map_err(|error| Error::Workload { path: path.to_owned(), error })
}

/// Read and [`parse_workload`] the workload at `path`.
pub fn load_workload(path: &Path) -> Result<Workload, Error> {
    parse_workload(&read(path)?).map_err(|error| Error::Workload { path: path.to_owned(), error })
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|error| Error::Io {
        action: "read the workload",
        path: path.to_owned(),
        error,
    })
}

/// serde_json's message with "at line 1 column N" (always line 1 of a one-line document)
/// turned into just the column.
fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match full.strip_suffix(&suffix) {
        Some(message) => format!("{message} (column {})", e.column()),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> WorkloadError {
        parse(text).unwrap_err()
    }

    #[test]
    fn parses_messages_and_input_prompts_skipping_blank_lines() {
        let text = concat!(
            r#"{"id": "e1", "kind": "edit", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}"#,
            "\n\n   \n",
            r#"{"id": "s1", "kind": "seq2seq", "input": "translate", "max_tokens": 8}"#,
            "\n",
        );
        let prompts = parse(text).unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[0].id, "e1");
        assert_eq!(prompts[0].kind, Kind::Edit);
        assert_eq!(prompts[0].max_tokens, 64);
        assert_eq!(
            prompts[0].input,
            PromptInput::Messages(vec![ChatMessage::new(pocket_core::Role::User, "hi")])
        );
        assert_eq!(prompts[1].kind, Kind::Seq2seq);
        assert_eq!(prompts[1].input, PromptInput::Text("translate".into()));
    }

    #[test]
    fn malformed_lines_name_the_line_and_the_problem() {
        let good =
            r#"{"id": "a", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}"#;

        let e = err(&format!("{good}\n{{\"id\": \"b\", \"kind\": \"qa\""));
        assert_eq!(e.line, 2);
        assert!(e.message.contains("EOF"), "{e}");

        let e =
            err(&format!("{good}\n\n{}", r#"{"id": "b", "kind": "poem", "messages": [], "max_tokens": 4}"#));
        assert_eq!(e.line, 3);
        assert!(e.message.contains("poem") && e.message.contains("summarize"), "{e}");

        let e = err(r#"{"id": "b", "kind": "qa", "messages": [{"role": "user", "content": "q"}]}"#);
        assert_eq!(e.line, 1);
        assert!(e.message.contains("missing field `max_tokens`"), "{e}");
        assert!(e.message.contains("column"), "{e}");

        let e = err(
            r#"{"id": "b", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_token": 3, "max_tokens": 3}"#,
        );
        assert!(e.message.contains("unknown field `max_token`"), "{e}");

        let e = err(
            r#"{"id": "b", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_tokens": -3}"#,
        );
        assert!(e.message.contains("-3"), "{e}");

        let e = err(
            r#"{"id": "b", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_tokens": 0}"#,
        );
        assert!(e.message.contains("at least 1"), "{e}");

        let e = err(r#"{"id": "b", "kind": "chat", "messages": [], "max_tokens": 5}"#);
        assert!(e.message.contains("`messages` is empty"), "{e}");

        let e = err(r#"{"id": "b", "kind": "qa", "input": "x", "max_tokens": 5}"#);
        assert!(e.message.contains("needs `messages`"), "{e}");

        let e = err(
            r#"{"id": "b", "kind": "seq2seq", "messages": [{"role": "user", "content": "q"}], "max_tokens": 5}"#,
        );
        assert!(e.message.contains("needs `input`"), "{e}");

        let e = err(
            r#"{"id": "b", "kind": "qa", "input": "x", "messages": [{"role": "user", "content": "q"}], "max_tokens": 5}"#,
        );
        assert!(e.message.contains("not both"), "{e}");

        let e = err(
            r#"{"id": " ", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_tokens": 5}"#,
        );
        assert!(e.message.contains("`id` is empty"), "{e}");

        let e = err(&format!("{good}\n{good}"));
        assert_eq!(e.line, 2);
        assert!(e.message.contains("already used on line 1"), "{e}");

        let e = err("[1, 2]");
        assert_eq!(e.line, 1);

        let e = err("\n\n");
        assert!(e.message.contains("no prompts"), "{e}");

        assert_eq!(err("nope").to_string(), "line 1: expected ident (column 2)");
    }

    const CONVERSATION: &str = r#"{"id": "c1", "kind": "conversation", "system": "Be brief.", "turns": ["hi", "and then?"], "max_tokens": 16}"#;

    #[test]
    fn conversations_parse_beside_prompts() {
        let prompt =
            r#"{"id": "q1", "kind": "qa", "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}"#;
        let w = parse_workload(&format!("{CONVERSATION}\n{prompt}\n")).unwrap();
        assert_eq!(w.prompts.len(), 1);
        assert_eq!(
            w.conversations,
            [Conversation {
                id: "c1".into(),
                system: Some("Be brief.".into()),
                turns: vec!["hi".into(), "and then?".into()],
                max_tokens: 16,
            }]
        );
        // Without a system message.
        let w = parse_workload(r#"{"id": "c", "kind": "conversation", "turns": ["hi"], "max_tokens": 2}"#)
            .unwrap();
        assert_eq!((w.conversations[0].system.as_deref(), w.prompts.len()), (None, 0));
        // Ids are unique among prompts and conversations.
        let e = parse_workload(&format!("{CONVERSATION}\n{}", prompt.replace("q1", "c1"))).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("already used on line 1"), "{e}");
    }

    #[test]
    fn malformed_conversations_name_the_line_and_the_problem() {
        let conv_err = |line: &str| parse_workload(&format!("{CONVERSATION}\n{line}")).unwrap_err();

        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "system": "s", "max_tokens": 16}"#);
        assert_eq!(e.line, 2);
        assert!(e.message.contains("missing field `turns`") && e.message.contains("column"), "{e}");

        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "turns": ["a"]}"#);
        assert!(e.message.contains("missing field `max_tokens`"), "{e}");

        // A prompt's field on a conversation, and an unknown one.
        let e = conv_err(
            r#"{"id": "c2", "kind": "conversation", "turns": ["a"], "messages": [], "max_tokens": 4}"#,
        );
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unknown field `messages`"), "{e}");
        let e =
            conv_err(r#"{"id": "c2", "kind": "conversation", "turns": ["a"], "max_tokens": 4, "temp": 1}"#);
        assert!(e.message.contains("unknown field `temp`") && e.message.contains("turns"), "{e}");
        // A conversation's field on a prompt.
        let e = conv_err(
            r#"{"id": "q", "kind": "chat", "messages": [{"role": "user", "content": "q"}], "turns": [], "max_tokens": 4}"#,
        );
        assert!(e.message.contains("unknown field `turns`"), "{e}");

        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "turns": [], "max_tokens": 4}"#);
        assert!(e.message.contains("`turns` is empty"), "{e}");
        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "turns": ["a", " "], "max_tokens": 4}"#);
        assert!(e.message.contains("turn 2 is empty"), "{e}");
        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "turns": ["a"], "max_tokens": 0}"#);
        assert!(e.message.contains("at least 1"), "{e}");
        let e = conv_err(r#"{"id": "c2", "kind": "conversation", "turns": "a", "max_tokens": 4}"#);
        assert!(e.message.contains("invalid type"), "{e}");

        // The unknown-kind message names conversations too.
        let e = conv_err(r#"{"id": "c2", "kind": "dialogue", "turns": ["a"], "max_tokens": 4}"#);
        assert!(e.message.contains("dialogue") && e.message.contains("conversation"), "{e}");

        // Where only prompts are read, a conversation says where it belongs.
        let e = parse(&format!("\n{CONVERSATION}")).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("\"c1\" is a conversation") && e.message.contains("--socket"), "{e}");
        assert!(parse_workload("\n").unwrap_err().message.contains("no prompts or conversations"));
    }

    #[test]
    fn agentic_requests_are_read_in_order_and_malformed_ones_name_the_problem() {
        let line = |id: &str, app: &str| {
            format!(
                r#"{{"id": "{id}", "kind": "agentic", "app": "{app}", "messages": [{{"role": "user", "content": "q"}}], "max_tokens": 8}}"#
            )
        };
        let w = parse_workload(&format!("{}\n{}\n", line("a1", "sql"), line("b1", "home"))).unwrap();
        assert_eq!(
            w.agentic.iter().map(|a| (a.id.as_str(), a.app.as_str())).collect::<Vec<_>>(),
            [("a1", "sql"), ("b1", "home")]
        );
        assert!(w.prompts.is_empty() && w.conversations.is_empty());
        let err = |text: &str| parse_workload(text).unwrap_err().message;
        assert!(err(&line("a1", " ")).contains("`app` is empty"));
        let no_app = r#"{"id": "a1", "kind": "agentic", "messages": [{"role": "user", "content": "q"}], "max_tokens": 8}"#;
        assert!(err(no_app).contains("missing field `app`"), "{}", err(no_app));
        let empty = r#"{"id": "a1", "kind": "agentic", "app": "x", "messages": [], "max_tokens": 8}"#;
        assert!(err(empty).contains("`messages` is empty"));
        // Where only prompts are read, an agentic request says where it belongs.
        let e = parse(&line("a1", "sql")).unwrap_err();
        assert!(e.message.contains("\"a1\" is an agentic request") && e.message.contains("--socket"), "{e}");
    }

    #[test]
    fn the_shipped_workloads_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let prompts = parse(DEFAULT_WORKLOAD).unwrap();
        assert!(prompts.len() >= 10);
        for kind in [Kind::Edit, Kind::Summarize, Kind::Qa, Kind::Chat] {
            assert!(prompts.iter().any(|p| p.kind == kind), "no {kind} prompt");
        }
        assert!(parse(DEFAULT_SEQ2SEQ_WORKLOAD).unwrap().iter().all(|p| p.kind == Kind::Seq2seq));
        let sample = root.join("../shared/bench/prompts.jsonl");
        if sample.exists() {
            load(&sample).unwrap();
        }
        let conversations = root.join("../shared/bench/conversations.jsonl");
        if conversations.exists() {
            let w = load_workload(&conversations).unwrap();
            assert!(w.prompts.is_empty() && !w.conversations.is_empty());
            assert!(w.conversations.iter().all(|c| c.turns.len() >= 2));
        }
    }
}
