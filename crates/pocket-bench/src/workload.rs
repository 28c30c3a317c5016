//! The benchmark workload: JSON Lines, one prompt per line (format in `shared/bench/README.md`).
//!
//! ```json
//! {"id": "edit-textwrap-indent", "kind": "edit", "messages": [{"role": "user", "content": "..."}], "max_tokens": 256}
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use pocket_core::ChatMessage;
use serde::{Deserialize, Serialize};

use super::Error;

/// The project's default workload (`benches/workload.jsonl`), built in so that a `pocket`
/// binary copied to a board has it too.
pub const DEFAULT_WORKLOAD: &str = include_str!("../../../benches/workload.jsonl");

/// The name results give the built-in workload.
pub const DEFAULT_WORKLOAD_NAME: &str = "benches/workload.jsonl (built in)";

/// The project's workload for encoder-decoder models (`benches/seq2seq.jsonl`), built in.
pub const DEFAULT_SEQ2SEQ_WORKLOAD: &str = include_str!("../../../benches/seq2seq.jsonl");

/// The name results give the built-in encoder-decoder workload.
pub const DEFAULT_SEQ2SEQ_WORKLOAD_NAME: &str = "benches/seq2seq.jsonl (built in)";

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

/// A line of a workload that is not a valid prompt.
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

impl RawPrompt {
    fn check(self) -> Result<Prompt, String> {
        if self.id.trim().is_empty() {
            return Err("`id` is empty".into());
        }
        if self.max_tokens == 0 {
            return Err("`max_tokens` must be at least 1".into());
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

/// Parse a workload: one JSON object per line, blank lines ignored.
///
/// Errors name the line (1-based) and what is wrong: invalid JSON, a missing or unknown
/// field, an unknown kind, `messages` and `input` both or neither, `max_tokens` of 0, an id
/// used twice, or no prompts at all.
pub fn parse(text: &str) -> Result<Vec<Prompt>, WorkloadError> {
    let mut prompts = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let fail = |message: String| WorkloadError { line: line_no, message };
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawPrompt = serde_json::from_str(line).map_err(|e| fail(json_message(&e)))?;
        let prompt = raw.check().map_err(fail)?;
        if let Some(first) = seen.insert(prompt.id.clone(), line_no) {
            return Err(fail(format!("id {:?} is already used on line {first}", prompt.id)));
        }
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        return Err(WorkloadError {
            line: text.lines().count().max(1),
            message: "the workload has no prompts".into(),
        });
    }
    Ok(prompts)
}

/// Read and [`parse`] the workload at `path`.
pub fn load(path: &Path) -> Result<Vec<Prompt>, Error> {
    let text = std::fs::read_to_string(path).map_err(|error| Error::Io {
        action: "read the workload",
        path: path.to_owned(),
        error,
    })?;
    parse(&text).map_err(|error| Error::Workload { path: path.to_owned(), error })
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
            PromptInput::Messages(vec![ChatMessage { role: pocket_core::Role::User, content: "hi".into() }])
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
    }
}
