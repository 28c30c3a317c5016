//! OpenAI-compatible requests and responses (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`), with pocketd's extra request fields.
//!
//! Unknown request fields are ignored, as OpenAI-compatible servers do, so that clients that
//! send newer fields still work; fields pocketd cannot honour (`n` > 1, `logprobs`, tools) are
//! refused by the daemon with a 400 that names them.

pub use pocket_core::{ChatMessage, Role};
use serde::{Deserialize, Serialize};

/// `stop`: one string or several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// What both kinds of completion request share: sampling, limits and pocketd's extensions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationOptions {
    /// Most tokens to generate (`max_completion_tokens` is accepted too).
    #[serde(default, alias = "max_completion_tokens", skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature; 0 (the default here) is greedy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k sampling (an extension many local servers accept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Seed for sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings (at most four, as OpenAI allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Stop>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Number of answers; only 1 is supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// pocketd: speculation for this request (`off`, `suffix`, `layerskip`, `draft`, `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
    /// pocketd: the draft model for `draft` (and `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// pocketd: KV cache type (`f16`, `q8_0`, `q4_0`); the planner may lower it to fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv: Option<String>,
    /// pocketd: also return the generated token ids (`tokens`, in the answer or the stream's
    /// last chunk), as llama.cpp's server does; for comparing outputs exactly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub return_tokens: bool,
    /// Which earlier conversations this one may continue from the prompt cache: only those
    /// sent with the same key (OpenAI's field). Without it any conversation of the same model
    /// sharing a prefix may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// The end user (OpenAI's field): the prompt cache's key when `prompt_cache_key` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// pocketd (llama.cpp's server's name): `false` processes the whole prompt and parks
    /// nothing, as without a prompt cache (for measuring what it saves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_prompt: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Sampling, limits, streaming and pocketd's extensions.
    #[serde(flatten)]
    pub options: GenerationOptions,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model; the daemon's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The text to continue.
    pub prompt: String,
    /// Sampling, limits, streaming and pocketd's extensions.
    #[serde(flatten)]
    pub options: GenerationOptions,
}

/// Why a completion ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end token or a stop string.
    Stop,
    /// `max_tokens`, or the context is full.
    Length,
    /// The request was cancelled (by its client, or by the daemon stopping): pocketd's own.
    Cancelled,
}

impl FinishReason {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Token counts of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the prompt (chat template applied).
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
    /// Both.
    pub total_tokens: u32,
    /// What the prompt's tokens were (OpenAI's shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens continued from the prompt cache instead of being processed again.
    pub cached_tokens: u32,
}

/// pocketd's statistics of one completion (an extra field OpenAI clients ignore).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Timings {
    /// Milliseconds from the request's start of generation to its first token.
    pub prefill_ms: f64,
    /// Prompt tokens processed per second (those from the prompt cache not counted).
    pub prefill_tok_per_s: f64,
    /// Prompt tokens continued from the prompt cache (a parked earlier conversation sharing
    /// the prompt's beginning) instead of being processed again.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Generated tokens per second after the first.
    pub decode_tok_per_s: f64,
    /// Tokens drafted by speculation.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// What the drafter did, in a line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<String>,
    /// Milliseconds the request waited in the queue before it started.
    pub queued_ms: f64,
    /// The most bytes the request's session (and drafter) held in the memory budget.
    #[serde(default)]
    pub peak_bytes: u64,
}

/// One answer of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The answer.
    pub message: ChatMessage,
    /// `stop` (an end token or a stop string) or `length` (`max_tokens` or the context).
    pub finish_reason: FinishReason,
}

/// The response of `POST /v1/chat/completions` without streaming.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model that answered.
    pub model: String,
    /// One answer.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// pocketd's statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// pocketd: the generated token ids, when the request set `return_tokens` (in a stream,
    /// on the last chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
}

/// The new part of a streamed chat answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant`, in the first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Always 0.
    pub index: u32,
    /// What is new.
    pub delta: ChatDelta,
    /// Set in the last chunk.
    pub finish_reason: Option<FinishReason>,
}

/// One server-sent event of a streamed chat completion (`data: {…}`), ending with
/// `data: [DONE]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// The same for every chunk of a completion.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts, in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// pocketd's statistics, in the last chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// pocketd: the generated token ids, when the request set `return_tokens` (in a stream,
    /// on the last chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
}

/// One answer of a text completion (also the shape of a stream chunk's choice).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Always 0.
    pub index: u32,
    /// The text (in a stream chunk, what is new).
    pub text: String,
    /// `stop` or `length`; `null` in stream chunks before the last.
    pub finish_reason: Option<FinishReason>,
}

/// The response of `POST /v1/completions`, and each chunk of its stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The model.
    pub model: String,
    /// One answer.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (in a stream, the last chunk only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// pocketd's statistics (in a stream, the last chunk only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// pocketd: the generated token ids, when the request set `return_tokens` (in a stream,
    /// on the last chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelObject {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Unix seconds (the file's modification time).
    pub created: u64,
    /// `pocketd`.
    pub owned_by: String,
    /// pocketd: the engine that runs it — `ggml` (our graph), `llama.cpp` (llama.cpp's graph,
    /// for GGUF files ours does not build) or `tract` (ONNX encoder-decoders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The models.
    pub data: Vec<ModelObject>,
}

/// The body of every error response: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorObject,
}

/// What went wrong, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// For people: what was wrong and what is allowed.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A stable code for programs: `model_not_found`, `over_budget`, `queue_full`,
    /// `context_length_exceeded`, …
    pub code: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_openai_chat_request_parses_with_pocketd_extensions_and_unknown_fields() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"smollm2-135m","messages":[{"role":"user","content":"hi"}],
                "max_completion_tokens":8,"stop":"\n","stream":true,"spec":"suffix",
                "frequency_penalty":0,"user":"x"}"#,
        )
        .unwrap();
        assert_eq!(r.options.max_tokens, Some(8));
        assert_eq!(r.options.stop.clone().map(Stop::into_vec), Some(vec!["\n".to_string()]));
        assert!(r.options.stream);
        assert_eq!(r.options.spec.as_deref(), Some("suffix"));
        let c: CompletionRequest =
            serde_json::from_str(r#"{"prompt":"Once","stop":["a","b"],"temperature":0.5}"#).unwrap();
        assert_eq!(c.model, None);
        assert_eq!(c.options.stop.map(Stop::into_vec).unwrap(), ["a", "b"]);
    }

    #[test]
    fn errors_have_openais_shape() {
        let e = ErrorResponse {
            error: ErrorObject {
                message: "unknown model x".into(),
                kind: "not_found_error".into(),
                param: Some("model".into()),
                code: Some("model_not_found".into()),
            },
        };
        let v: serde_json::Value = serde_json::to_value(&e).unwrap();
        assert_eq!(v["error"]["type"], "not_found_error");
        assert_eq!(v["error"]["code"], "model_not_found");
    }
}
