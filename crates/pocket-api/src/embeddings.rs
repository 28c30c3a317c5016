//! OpenAI's embeddings API: `POST /v1/embeddings`.

use serde::{Deserialize, Serialize};

/// The body of `POST /v1/embeddings`, as OpenAI takes it, plus pocketd's `truncate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    /// The embedding model (the daemon's default model when absent, which must then be one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What to embed: a text, texts, token ids, or lists of token ids.
    pub input: EmbeddingInput,
    /// `float` (the default) or `base64` (little-endian f32s, as OpenAI encodes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    /// Values per vector: accepted where the model makes vectors of that size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<usize>,
    /// The end user, for OpenAI's abuse monitoring; accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// pocketd's extension (as ollama's and TEI's `truncate`): cut an input longer than the
    /// model reads to its first tokens, as the model's tokenizer cuts, rather than refuse it.
    #[serde(default)]
    pub truncate: bool,
}

/// `input` of an [`EmbeddingRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input as token ids.
    Tokens(Vec<u32>),
    /// Several inputs as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// The answer to `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    /// Always `list`.
    pub object: String,
    /// One per input, in order.
    pub data: Vec<Embedding>,
    /// The model that made them.
    pub model: String,
    /// Tokens read.
    pub usage: EmbeddingUsage,
}

/// One vector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// Always `embedding`.
    pub object: String,
    /// Which input it is of.
    pub index: usize,
    /// The vector.
    pub embedding: EmbeddingVector,
}

/// A vector as `encoding_format` asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// A JSON array of numbers.
    Float(Vec<f32>),
    /// Base64 of the little-endian f32 values.
    Base64(String),
}

/// `usage` of an [`EmbeddingResponse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingUsage {
    /// Tokens the model read (after truncation).
    pub prompt_tokens: usize,
    /// The same (OpenAI's shape).
    pub total_tokens: usize,
    /// pocketd's extension: inputs cut to the model's length (`truncate`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncated_inputs: usize,
    /// pocketd's extension: the most tokens the model reads of one input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<usize>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_form_parses_and_unknown_fields_are_refused() {
        for (json, want) in [
            (r#"{"input": "a"}"#, EmbeddingInput::Text("a".into())),
            (r#"{"input": ["a", "b"]}"#, EmbeddingInput::Texts(vec!["a".into(), "b".into()])),
            (r#"{"input": [101, 102]}"#, EmbeddingInput::Tokens(vec![101, 102])),
            (r#"{"input": [[101], [102, 7]]}"#, EmbeddingInput::TokenLists(vec![vec![101], vec![102, 7]])),
        ] {
            let r: EmbeddingRequest = serde_json::from_str(json).unwrap();
            assert_eq!(r.input, want);
        }
        let err =
            serde_json::from_str::<EmbeddingRequest>(r#"{"input": "a", "pooling": "max"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `pooling`"), "{err}");
    }
}
