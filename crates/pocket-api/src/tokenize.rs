//! `POST /tokenize` and `POST /detokenize`: a model's tokens for a text or a conversation,
//! and the text of tokens (the fields of llama.cpp's server, with vLLM's names as aliases).

use serde::{Deserialize, Serialize};

use crate::ChatMessage;

/// The body of `POST /tokenize`: `content` (or `prompt`) or `messages`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The model whose tokenizer to use (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Text to tokenize as it is.
    #[serde(default, alias = "prompt", skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A conversation, tokenized as a chat request's prompt is (the model's chat template,
    /// the assistant's turn opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// Add the model's special tokens (its BOS) to `content`; false by default, as
    /// llama.cpp's server.
    #[serde(default, alias = "add_special_tokens")]
    pub add_special: bool,
    /// Return each token with its text, as `{"id", "piece"}`.
    #[serde(default)]
    pub with_pieces: bool,
}

/// One token with its text (`with_pieces`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenPiece {
    /// The token id.
    pub id: u32,
    /// Its text (invalid UTF-8, part of a character, replaced by U+FFFD).
    pub piece: String,
}

/// Token ids, or tokens with their text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tokens {
    /// Ids only.
    Ids(Vec<u32>),
    /// Ids with their text.
    Pieces(Vec<TokenPiece>),
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    /// The tokens.
    pub tokens: Tokens,
    /// How many.
    pub count: usize,
    /// The longest context the model was trained for.
    pub max_model_len: usize,
    /// The model whose tokenizer was used.
    pub model: String,
}

/// The body of `POST /detokenize`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The model whose tokenizer to use (the daemon's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The token ids.
    pub tokens: Vec<u32>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    /// The tokens' text.
    pub content: String,
    /// The model whose tokenizer was used.
    pub model: String,
}
