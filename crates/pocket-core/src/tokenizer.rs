//! Text in and out of token ids.

use serde::{Deserialize, Serialize};

use crate::{Result, Token};

/// Who says a message in a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions to the model (OpenAI's newer `developer` is read as this).
    #[serde(alias = "developer")]
    System,
    /// The person asking.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call.
    Tool,
}

impl Role {
    /// The name chat templates and the wire use.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of a chat conversation, in OpenAI's shape.
///
/// `content` is read from a string, `null` (an assistant message that only calls tools) or
/// an array of text parts (`[{"type": "text", "text": "…"}]`, joined); it is always written
/// as a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who says it.
    pub role: Role,
    /// The message text.
    #[serde(default, deserialize_with = "content::deserialize")]
    pub content: String,
    /// The tools an assistant message calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool's name, on a `tool` message (older clients send it instead of the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage { role, content: content.into(), tool_calls: Vec::new(), tool_call_id: None, name: None }
    }
}

/// A call of a tool by the model: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the `tool` message with its result names.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_owned()
}

/// The function a [`ToolCall`] calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name, one of the request's `tools`.
    pub name: String,
    /// The arguments, as JSON text (OpenAI's shape: a string holding a JSON object).
    pub arguments: String,
}

mod content {
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
    }

    #[derive(Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Part {
        Text { text: String },
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(match Option::<Content>::deserialize(d)? {
            None => String::new(),
            Some(Content::Text(s)) => s,
            Some(Content::Parts(parts)) => parts.into_iter().map(|Part::Text { text }| text).collect(),
        })
    }
}

/// A model's tokenizer and chat template.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`; `add_special` adds the model's BOS (or equivalent) if it uses one.
    fn encode(&self, text: &str, add_special: bool) -> Result<Vec<Token>>;

    /// The bytes a token stands for. Not always valid UTF-8 on its own: a character can be
    /// split across tokens, so text is assembled from bytes (see [`crate::stop::TextStream`]).
    fn piece(&self, token: Token) -> Vec<u8>;

    /// The bytes `token` stands for as the first token of a generated text. SentencePiece
    /// tokenizers mark word starts with a space that the first word of a text does not have;
    /// by default the same as [`Tokenizer::piece`].
    fn first_piece(&self, token: Token) -> Vec<u8> {
        self.piece(token)
    }

    /// Whether `token` ends generation (end of sequence or end of turn).
    fn is_end(&self, token: Token) -> bool;

    /// Render `messages` with the model's chat template, ending with the assistant's turn
    /// opened when `add_assistant` is set. An error if the model has no chat template.
    ///
    /// This is the engine's own rendering (llama.cpp's detection of well-known templates);
    /// the runtime prefers the template's Jinja source ([`Tokenizer::chat_template`]).
    fn apply_chat_template(&self, messages: &[ChatMessage], add_assistant: bool) -> Result<String>;

    /// The Jinja source of the chat template the model file ships, if it has one.
    fn chat_template(&self) -> Option<&str> {
        None
    }

    /// The text of the beginning- and end-of-sequence tokens, which chat templates get as
    /// `bos_token` and `eos_token` (empty where the model has none).
    fn bos_eos_text(&self) -> (String, String) {
        (String::new(), String::new())
    }

    /// The text of a special (control) token such as `<|im_end|>`, which
    /// [`Tokenizer::piece`] renders as nothing; `None` for every other token.
    fn special_text(&self, token: Token) -> Option<String> {
        let _ = token;
        None
    }
}
