//! OpenAI-compatible requests and responses (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`), with pocketd's extra request fields.
//!
//! No field is silently ignored: every OpenAI field pocketd reads is honoured (sampling,
//! penalties, `logit_bias`, `logprobs`, `response_format`, `tools`), and any other field is
//! collected in [`GenerationOptions::unsupported`] and refused by the daemon with a 400 that
//! names it — except the few that change nothing about the answer (`metadata`, `store`,
//! `service_tier`), which are accepted.

use std::collections::BTreeMap;

pub use pocket_core::{ChatMessage, FunctionCall, Role, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// What a stream adds: `include_usage` sends the token counts in a last chunk of their own
    /// (with no choices), as OpenAI does; without it, a stream carries no usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Number of answers (choices), generated one after another.
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
    /// pocketd (vLLM's name): this request's priority, from -100 to 100; lower is served
    /// sooner — first out of the queue, first into a full shared pass. 0 by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
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
    /// What the answer must be: `{"type": "text"}`, `{"type": "json_object"}` or
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// pocketd: a grammar the answer must follow, in llguidance's Lark dialect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Functions the model may call: `[{"type": "function", "function": {"name",
    /// "description", "parameters"}}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"` (the default with tools), `"required"`, or
    /// `{"type": "function", "function": {"name": …}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Several calls in one answer (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Chat: `true` to return each token's log-probability. Completions: how many
    /// alternatives to return with each token (0–20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsOption>,
    /// Chat: how many alternatives with each token's log-probability (0–20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    /// Lowers the logits of tokens already present (−2 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    /// Lowers the logits of tokens by how often they are present (−2 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's multiplicative penalty (1 = off), `repeat_penalty` accepted too.
    #[serde(default, alias = "repeat_penalty", skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Added to the logits of the given token ids (−100 to 100), keys as strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// How hard a reasoning model thinks: `"none"` turns a thinking model's thinking off
    /// (its template's `enable_thinking = false`); any other effort leaves it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// More variables for the model's chat template (vLLM's and llama.cpp's server's field),
    /// as `{"enable_thinking": false}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Every other field of the request; the daemon refuses those that would change the answer.
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unsupported: BTreeMap<String, Value>,
}

/// Fields OpenAI defines that change nothing about an answer, accepted and not used.
pub const IGNORED_FIELDS: &[&str] = &["metadata", "store", "service_tier"];

/// `stream_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send the usage in a last chunk.
    #[serde(default)]
    pub include_usage: bool,
}

impl StreamOptions {
    /// The options of a client that reads the usage of a stream.
    pub fn with_usage() -> Option<StreamOptions> {
        Some(StreamOptions { include_usage: true })
    }
}

/// `logprobs`: a boolean in chat completions, a count in text completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogprobsOption {
    /// Chat: whether to return them.
    Enabled(bool),
    /// Completions: how many alternatives.
    Count(u32),
}

/// `response_format`. A key that is not OpenAI's for its `type` is refused, not dropped: a
/// `schema` beside `"type": "json_object"` would otherwise go unenforced without a word.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", try_from = "RawResponseFormat")]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid against a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format` as sent: serde lets unknown keys beside a unit variant's tag through,
/// so the keys are checked here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<JsonSchemaFormat>,
}

impl TryFrom<RawResponseFormat> for ResponseFormat {
    type Error = String;

    fn try_from(raw: RawResponseFormat) -> Result<Self, String> {
        match (raw.kind.as_str(), raw.json_schema) {
            ("text", None) => Ok(ResponseFormat::Text),
            ("json_object", None) => Ok(ResponseFormat::JsonObject),
            ("json_schema", Some(json_schema)) => Ok(ResponseFormat::JsonSchema { json_schema }),
            ("json_schema", None) => Err("response_format of type json_schema needs json_schema".into()),
            ("text" | "json_object", Some(_)) => Err(format!(
                "unknown field `json_schema` in a response_format of type {}: only json_schema has one",
                raw.kind
            )),
            (other, _) => Err(format!(
                "unknown response_format type `{other}`: expected text, json_object or json_schema"
            )),
        }
    }
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    #[serde(default)]
    pub name: String,
    /// What the format is for (the model is not shown it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON schema.
    #[serde(default)]
    pub schema: Value,
    /// Refuse schemas with keywords that cannot be enforced (else enforce the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
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
    /// What to continue.
    pub prompt: Prompt,
    /// Sampling, limits, streaming and pocketd's extensions.
    #[serde(flatten)]
    pub options: GenerationOptions,
}

/// A completion's `prompt` in OpenAI's four forms: a string, strings, token ids, lists of
/// token ids. Each prompt of a list gets a choice of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// One prompt of a [`Prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnePrompt {
    /// Text, tokenized by the model.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

impl From<String> for Prompt {
    fn from(text: String) -> Prompt {
        Prompt::Text(text)
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Prompt {
        Prompt::Text(text.to_owned())
    }
}

impl Prompt {
    /// Each prompt, in order.
    pub fn into_prompts(self) -> Vec<OnePrompt> {
        match self {
            Prompt::Text(t) => vec![OnePrompt::Text(t)],
            Prompt::Texts(ts) => ts.into_iter().map(OnePrompt::Text).collect(),
            Prompt::Tokens(ts) => vec![OnePrompt::Tokens(ts)],
            Prompt::TokenLists(ls) => ls.into_iter().map(OnePrompt::Tokens).collect(),
        }
    }
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
    /// The answer calls tools (`message.tool_calls`).
    ToolCalls,
}

impl FinishReason {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::ToolCalls => "tool_calls",
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
    /// What the generated tokens were (OpenAI's shape): given when the model thought.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

/// `usage.completion_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompletionTokensDetails {
    /// Tokens of thinking (`<think>…</think>`), part of `completion_tokens`.
    pub reasoning_tokens: u32,
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
    /// Drafts made (verification passes that carried one): `drafted / drafts` is the mean
    /// draft's length.
    #[serde(default)]
    pub drafts: u64,
    /// Of the drafts, those that branched (verified as trees); `drafted` counts a tree's
    /// tokens along the path verification walked.
    #[serde(default)]
    pub trees: u64,
    /// Tokens the trees held, all their branches.
    #[serde(default)]
    pub tree_tokens: u64,
    /// Of the drafted tokens, those drafted from earlier answers (to requests under the same
    /// `prompt_cache_key`).
    #[serde(default)]
    pub recalled: u64,
    /// What the drafter did, in a line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<String>,
    /// Milliseconds from admission until generation started: waiting for a turn and for
    /// memory, loading the model if it was not loaded, and preparing the request (template,
    /// tokens, plan, grammar).
    pub queued_ms: f64,
    /// The most bytes the request's session (and drafter) held in the memory budget.
    #[serde(default)]
    pub peak_bytes: u64,
    /// Milliseconds compiling the request's grammar (JSON schema, tools) took.
    #[serde(default)]
    pub grammar_ms: f64,
    /// Milliseconds spent on the grammar while generating: token masks, forced tokens.
    #[serde(default)]
    pub constraint_ms: f64,
    /// Tokens the grammar forced and speculation drafted for free.
    #[serde(default)]
    pub forced: u64,
    /// Of those, how many the model's own choice confirmed.
    #[serde(default)]
    pub forced_accepted: u64,
    /// CPU threads per forward pass of this request, on average (with `threads = "auto"` the
    /// count follows the cores other programs leave free, pass by pass).
    #[serde(default)]
    pub threads: f64,
}

/// One answer of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The answer.
    pub message: AssistantMessage,
    /// `stop` (an end token or a stop string), `length` (`max_tokens` or the context) or
    /// `tool_calls`.
    pub finish_reason: FinishReason,
    /// Each token's log-probability, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
}

/// The model's answer in a chat completion: text, or tool calls (then `content` is null).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: Role,
    /// The text; `null` when the answer only calls tools.
    pub content: Option<String>,
    /// A thinking model's thinking, apart from the answer (vLLM's and llama.cpp's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// `choices[].logprobs` of a chat completion.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<TokenLogprob>,
}

/// A token's log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's text (invalid UTF-8 replaced).
    pub token: String,
    /// Its natural-log probability under the model (−9999 for an impossible token).
    pub logprob: f32,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative in [`TokenLogprob::top_logprobs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// `choices[].logprobs` of a text completion (the legacy shape).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// The alternatives at each position, text → log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Where each token starts in the text, in bytes.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// The legacy shape of the same figures.
    pub fn from_tokens(tokens: &[TokenLogprob]) -> Self {
        CompletionLogprobs::from_tokens_at(tokens, 0)
    }

    /// [`CompletionLogprobs::from_tokens`] for tokens that start `offset` bytes into the
    /// text (a streamed chunk's).
    pub fn from_tokens_at(tokens: &[TokenLogprob], mut offset: usize) -> Self {
        let mut out = CompletionLogprobs::default();
        for t in tokens {
            out.tokens.push(t.token.clone());
            out.token_logprobs.push(t.logprob);
            out.top_logprobs.push(t.top_logprobs.iter().map(|a| (a.token.clone(), a.logprob)).collect());
            out.text_offset.push(offset);
            offset += t.bytes.len();
        }
        out
    }
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
    /// Thinking, of a model that thinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, each whole in one chunk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaToolCall>,
}

/// A tool call in a stream chunk (OpenAI's shape: its `index` among the answer's calls).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaToolCall {
    /// Which call of the answer.
    pub index: u32,
    /// The call's id.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its name and arguments.
    pub function: FunctionCall,
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
    /// The log-probabilities, when asked for (in the last chunk, for every token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
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
    /// The log-probabilities, when asked for (in a stream, on the last chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<CompletionLogprobs>,
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
    /// A stable code for programs; pocketd sends its error kinds (`UnknownModel`,
    /// `UnknownEndpoint`, `TooLarge`, `OverBudget`, `QueueFull`, …).
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
        assert_eq!(r.options.frequency_penalty, Some(0.0));
        assert!(r.options.unsupported.is_empty(), "{:?}", r.options.unsupported);
        let c: CompletionRequest =
            serde_json::from_str(r#"{"prompt":"Once","stop":["a","b"],"temperature":0.5}"#).unwrap();
        assert_eq!(c.model, None);
        assert_eq!(c.options.stop.map(Stop::into_vec).unwrap(), ["a", "b"]);
        // Fields pocketd does not read are kept for the daemon to refuse by name.
        let c: CompletionRequest =
            serde_json::from_str(r#"{"prompt":"x","echo":true,"logprobs":2,"best_of":3}"#).unwrap();
        assert_eq!(c.options.unsupported.keys().collect::<Vec<_>>(), ["best_of", "echo"]);
        assert_eq!(c.options.logprobs, Some(LogprobsOption::Count(2)));
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":3,
                "response_format":{"type":"json_schema","json_schema":{"name":"p","schema":{"type":"object"},"strict":true}},
                "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}"#,
        )
        .unwrap();
        assert_eq!(r.options.logprobs, Some(LogprobsOption::Enabled(true)));
        assert!(matches!(r.options.response_format, Some(ResponseFormat::JsonSchema { .. })));
        assert!(r.options.unsupported.is_empty());
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

    #[test]
    fn response_format_keys_that_are_not_openais_are_refused_by_name() {
        let parse = |f: &str| serde_json::from_str::<ResponseFormat>(f).map_err(|e| e.to_string());
        for (bad, key) in [
            (r#"{"type": "json_object", "schema": {"type": "object"}}"#, "schema"),
            (r#"{"type": "text", "foo": 1}"#, "foo"),
            (
                r#"{"type": "json_schema", "json_schema": {"name": "p", "schema": {}, "stirct": true}}"#,
                "stirct",
            ),
            (r#"{"type": "json_schema", "json_schema": {"schema": {}}, "extra": 1}"#, "extra"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(key), "{bad}: {e}");
        }
        let ok = r#"{"type": "json_schema", "json_schema": {"name": "p", "description": "d", "schema": {}, "strict": true}}"#;
        assert!(matches!(parse(ok), Ok(ResponseFormat::JsonSchema { .. })));
        assert_eq!(parse(r#"{"type": "text"}"#), Ok(ResponseFormat::Text));
    }

    #[test]
    fn a_completion_prompt_comes_in_openais_four_forms() {
        let prompts = |body: &str| {
            serde_json::from_str::<CompletionRequest>(body)
                .map(|r| r.prompt.into_prompts())
                .map_err(|e| e.to_string())
        };
        let text = |t: &str| OnePrompt::Text(t.to_owned());
        assert_eq!(prompts(r#"{"prompt": "hi"}"#), Ok(vec![text("hi")]));
        assert_eq!(prompts(r#"{"prompt": ["a", "b"]}"#), Ok(vec![text("a"), text("b")]));
        assert_eq!(prompts(r#"{"prompt": [1, 2, 3]}"#), Ok(vec![OnePrompt::Tokens(vec![1, 2, 3])]));
        assert_eq!(
            prompts(r#"{"prompt": [[1], [2, 3]]}"#),
            Ok(vec![OnePrompt::Tokens(vec![1]), OnePrompt::Tokens(vec![2, 3])])
        );
        assert_eq!(prompts(r#"{"prompt": []}"#), Ok(vec![]));
        assert!(prompts(r#"{"prompt": [1, "a"]}"#).is_err());
        assert!(prompts(r#"{"prompt": [-1]}"#).is_err());
    }
}
