//! A generation request as both transports hand it to the scheduler ([`Job`], its
//! [`JobOptions`]), and what they get back: the [`Running`] generation, its [`Piece`]s of
//! text and how it [`Finished`]. Nothing here knows a wire format.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pocket_api::FinishReason;
use pocket_core::memory::Plan;
use pocket_core::spec::SpecMode;
use pocket_core::{KvType, SamplingConfig, ToolCall};
use pocket_runtime::grammar::Grammar;
use pocket_runtime::tools::{ToolChoice, Tools};
use tokio::sync::mpsc;

use super::error::ServeError;

/// What to generate from: chat messages or text (what the pipeline takes).
pub use pocket_runtime::pipeline::Input;

/// A request's settings; `None` takes the daemon's configured default.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOptions {
    /// Most tokens to generate (capped at the configured `max_tokens`).
    pub max_tokens: Option<u32>,
    /// How tokens are chosen (greedy by default).
    pub sampling: SamplingConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Speculation.
    pub spec: Option<SpecMode>,
    /// The draft model for `draft` (and for `auto` to consider).
    pub draft_model: Option<String>,
    /// KV cache type.
    pub kv: Option<KvType>,
    /// Return the generated token ids with the result.
    pub return_tokens: bool,
    /// Which parked conversations the prompt cache may continue (`prompt_cache_key`, else
    /// `user`): only those parked under the same key.
    pub cache_key: Option<String>,
    /// Use the prompt cache (continue a parked conversation, park this one); `false` is as
    /// if there were none.
    pub cache_prompt: bool,
    /// What the answer must be (a JSON schema, any JSON object, a Lark grammar).
    pub grammar: Option<Grammar>,
    /// The tools the model may call.
    pub tools: Tools,
    /// Return each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// Lower is sooner: the queue's order, and the order rows go into a full shared pass.
    pub priority: i32,
    /// More variables for the chat template (`enable_thinking`, …).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

/// The priorities a request may ask for (vLLM's `priority`: lower is sooner, 0 by default).
pub const PRIORITIES: std::ops::RangeInclusive<i32> = -100..=100;

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            max_tokens: None,
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            spec: None,
            draft_model: None,
            kv: None,
            return_tokens: false,
            cache_key: None,
            cache_prompt: true,
            grammar: None,
            tools: Tools::default(),
            logprobs: None,
            priority: 0,
            template_kwargs: serde_json::Map::new(),
        }
    }
}

/// A priority in [`PRIORITIES`], or the 400 that says so.
pub fn check_priority(priority: i32) -> Result<(), ServeError> {
    if PRIORITIES.contains(&priority) {
        return Ok(());
    }
    Err(ServeError::invalid(
        "priority",
        format!(
            "priority = {priority}: from {} to {}, lower is served sooner (0 by default)",
            PRIORITIES.start(),
            PRIORITIES.end()
        ),
    ))
}

/// OpenAI's `tool_choice`: a string, or `{"type": "function", "function": {"name": …}}`.
pub fn tool_choice(v: &serde_json::Value) -> Result<ToolChoice, ServeError> {
    let named = v.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str());
    match (v.as_str(), named) {
        (Some("none"), _) => Ok(ToolChoice::None),
        (Some("auto"), _) => Ok(ToolChoice::Auto),
        (Some("required"), _) => Ok(ToolChoice::Required),
        (None, Some(name)) => Ok(ToolChoice::Function(name.to_owned())),
        _ => Err(ServeError::invalid(
            "tool_choice",
            "tool_choice is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
        )),
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The model (`None`: the configured default).
    pub model: Option<String>,
    /// What to generate from.
    pub input: Input,
    /// Its settings.
    pub options: JobOptions,
    /// Who asked (for the logs): `"http uid=1000 pid=42"`, `"dbus :1.7"`.
    pub client: String,
}

/// What a request was given, once its session exists.
#[derive(Debug, Clone)]
pub struct Started {
    /// The request's id.
    pub id: String,
    /// The model's name.
    pub model: String,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// What the planner gave it.
    pub plan: Plan,
    /// Seconds it waited for a turn (and for memory).
    pub queued_seconds: f64,
    /// Whether the answer may call tools (a stream then holds back text that may be a call).
    pub tools: bool,
}

/// How a generation ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The whole text.
    pub text: String,
    /// The text without its thinking and its tool calls (the whole text when it has
    /// neither).
    pub content: String,
    /// A thinking model's thinking.
    pub reasoning: Option<String>,
    /// The tools the answer calls.
    pub tool_calls: Vec<ToolCall>,
    /// Each token's log-probability, when asked for.
    pub logprobs: Option<Vec<pocket_api::TokenLogprob>>,
    /// The generated token ids, when the request asked for them.
    pub tokens: Option<Vec<u32>>,
    /// OpenAI's `finish_reason`.
    pub finish_reason: FinishReason,
    /// The stop string that ended the answer, if one did.
    pub stop_string: Option<String>,
    /// Usage.
    pub usage: pocket_api::Usage,
    /// Speed and speculation.
    pub timings: pocket_api::Timings,
    /// The most this session held in the budget.
    pub peak_bytes: u64,
    /// Seconds of decoding after the first token.
    pub decode_seconds: f64,
}

/// What a running generation sends.
#[derive(Debug)]
pub enum Piece {
    /// Text made final, with the log-probabilities of the tokens that made it (when asked
    /// for; empty otherwise).
    Text {
        /// The text.
        text: String,
        /// Its tokens' log-probabilities.
        logprobs: Vec<pocket_api::TokenLogprob>,
    },
    /// Thinking made final, of a model that thinks (its tokens' log-probabilities are not
    /// sent).
    Reasoning(String),
    /// The end.
    Done(Box<Finished>),
    /// A failure after the start.
    Failed(ServeError),
}

/// A generation in progress. Dropping it cancels the generation.
pub struct Running {
    /// What it was given.
    pub started: Started,
    /// Its text, then [`Piece::Done`] or [`Piece::Failed`].
    pub pieces: mpsc::UnboundedReceiver<Piece>,
    cancel: CancelOnDrop,
}

impl Running {
    /// A generation that sends its pieces to `pieces`, cancelled through `cancel` when dropped.
    pub(super) fn new(
        started: Started,
        pieces: mpsc::UnboundedReceiver<Piece>,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        Running { started, pieces, cancel: CancelOnDrop(cancel) }
    }

    /// A handle that cancels this generation, usable after `self` is moved.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.0.clone())
    }

    /// Wait for the end, collecting the text.
    pub async fn collect(mut self) -> Result<Finished, ServeError> {
        while let Some(piece) = self.pieces.recv().await {
            match piece {
                Piece::Text { .. } | Piece::Reasoning(_) => {}
                Piece::Done(f) => return Ok(*f),
                Piece::Failed(e) => return Err(e),
            }
        }
        Err(ServeError::internal(Some(&self.started.id), "the generation ended without a result"))
    }
}

/// Cancels a generation.
#[derive(Debug, Clone)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Ask the generation to stop at its next token.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A canceller of nothing (for tests of what holds cancellers).
    #[cfg(test)]
    pub(crate) fn new() -> Canceller {
        Canceller(Arc::default())
    }
}

struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_checked() {
        assert!(check_priority(0).is_ok() && check_priority(-100).is_ok() && check_priority(100).is_ok());
        let e = check_priority(101).unwrap_err().to_string();
        assert!(e.contains("priority = 101") && e.contains("lower is served sooner"), "{e}");
    }
}
