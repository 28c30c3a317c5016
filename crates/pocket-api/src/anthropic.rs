//! Anthropic's Messages API as the `anthropic` client libraries speak it: `POST /v1/messages`
//! (text, `tool_use` and `tool_result` blocks, tools, streaming) and
//! `POST /v1/messages/count_tokens`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /v1/messages` (and, without `max_tokens`, of `count_tokens`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    /// The model (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation, user and assistant turns.
    pub messages: Vec<InputMessage>,
    /// The system prompt: a string or text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Content>,
    /// The most tokens to generate (required by `/v1/messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Strings that end the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    /// Server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Sampling temperature (0, greedy, by default here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// How it may call them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`: whether a model
    /// that thinks does (its template's `enable_thinking`); the budget is not enforced apart
    /// from `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Value>,
    /// Accepted and ignored (`user_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
}

/// A message's content: a string or blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<Block>),
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// What it says.
    pub content: Content,
}

/// A block of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool, in an assistant turn.
    ToolUse {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
        /// Its arguments.
        input: Value,
    },
    /// An earlier answer's thinking, sent back (not shown to the model again).
    Thinking {
        /// The thinking.
        #[serde(default)]
        thinking: String,
        /// Its signature.
        #[serde(default)]
        signature: String,
    },
    /// A call's result, in a user turn.
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// The result: a string or text blocks.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Content>,
        /// Whether the call failed.
        #[serde(default)]
        is_error: bool,
    },
}

impl Content {
    /// The text of the content's text blocks, joined.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Blocks(blocks) => blocks
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A tool: `name`, `description`, `input_schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema of its input.
    pub input_schema: Value,
}

/// `tool_choice`: `auto`, `any` (some tool), `tool` (the one named) or `none`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool, for `tool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// At most one call.
    #[serde(default)]
    pub disable_parallel_tool_use: bool,
}

/// A block of the answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    /// A thinking model's thinking, before the answer.
    Thinking {
        /// The thinking.
        thinking: String,
        /// Empty: pocketd signs nothing (a client sends the block back as it came).
        signature: String,
    },
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool.
    ToolUse {
        /// The call's id, which the `tool_result` names.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments.
        input: Value,
    },
}

/// Token counts, as Anthropic splits them: `input_tokens` are those processed, apart from
/// those read from the prompt cache.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MessagesUsage {
    /// Prompt tokens processed.
    pub input_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Prompt tokens continued from the prompt cache.
    pub cache_read_input_tokens: u32,
    /// Always 0: the prompt cache keeps conversations by itself.
    pub cache_creation_input_tokens: u32,
}

/// The answer of `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageResponse {
    /// `msg_…`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`.
    pub role: String,
    /// The model that answered.
    pub model: String,
    /// Text and tool calls.
    pub content: Vec<OutputBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use` (`null` in `message_start`).
    pub stop_reason: Option<String>,
    /// The stop sequence that ended it.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessagesUsage,
}

/// The answer of `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenCount {
    /// Tokens of the prompt the request would make.
    pub input_tokens: u32,
}
