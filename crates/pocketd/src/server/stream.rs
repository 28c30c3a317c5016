//! OpenAI's server-sent events: the chunks of a chat or text completion, choice after
//! choice, with each piece of text's log-probabilities, text that may be a tool call held
//! back, the usage chunk of `include_usage`, and `[DONE]`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::header;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use pocket_api::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, ChatLogprobs, Completion, CompletionChoice,
    CompletionLogprobs, DeltaToolCall, TokenLogprob,
};

use super::error::ServeError;
use super::job::{Finished, Job, Piece, Running};
use super::openai::with_choice;
use super::registry::now_seconds;
use super::scheduler::Scheduler;

/// Which OpenAI stream a response is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    Chat,
    Text,
}

impl Shape {
    /// A request's id as OpenAI spells it for this kind of answer.
    pub(super) fn id(self, request: &str) -> String {
        match self {
            Shape::Chat => format!("chatcmpl-{request}"),
            Shape::Text => format!("cmpl-{request}"),
        }
    }
}

enum Phase {
    Opening,
    Body,
    /// The tool calls were sent; the choice's last chunk follows.
    Ending(Box<Finished>),
    /// A choice ended; the next one starts.
    Next,
    /// The last chunk was sent; the usage follows (`include_usage`).
    Usage(pocket_api::Usage),
    Closing,
    Over,
}

/// Whether a stream ends with a chunk of the usage (`stream_options.include_usage`).
pub(super) fn include_usage(o: &pocket_api::GenerationOptions) -> bool {
    o.stream_options.is_some_and(|s| s.include_usage)
}

struct StreamState {
    scheduler: Arc<Scheduler>,
    running: Running,
    /// The choices still to generate, after `running`'s.
    rest: std::vec::IntoIter<Job>,
    /// The choice streaming now.
    index: u32,
    shape: Shape,
    phase: Phase,
    id: String,
    model: String,
    created: u64,
    /// Text held back while it may be a tool call (an answer that may call tools and starts
    /// with `<`): sent as `tool_calls` at the end, or as text if it was not one; and its
    /// tokens' log-probabilities.
    holding: bool,
    held: String,
    held_logprobs: Vec<TokenLogprob>,
    /// Of this choice's log-probabilities, how many were sent, and the bytes of their tokens
    /// (a completion's `text_offset`).
    sent_logprobs: usize,
    sent_bytes: usize,
    /// The usage of the choices that ended.
    usage: Option<pocket_api::Usage>,
    include_usage: bool,
}

impl StreamState {
    /// The chunk carrying an answer's tool calls (and its text, if it was held back).
    fn calls(&self, f: &Finished) -> Event {
        let tool_calls = f
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| DeltaToolCall {
                index: i as u32,
                id: c.id.clone(),
                kind: c.kind.clone(),
                function: c.function.clone(),
            })
            .collect();
        let content = (!f.content.is_empty()).then(|| f.content.clone());
        self.delta(ChatDelta { role: None, content, reasoning_content: None, tool_calls })
    }

    /// A chunk of a thinking model's thinking (chat streams only have them).
    fn reasoning(&self, text: String) -> Event {
        self.delta(ChatDelta { reasoning_content: Some(text), ..ChatDelta::default() })
    }

    /// A chat chunk of `delta` alone.
    fn delta(&self, delta: ChatDelta) -> Event {
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice { index: self.index, delta, finish_reason: None, logprobs: None }],
            usage: None,
            timings: None,
            tokens: None,
        };
        Event::default().data(serde_json::to_string(&chunk).unwrap_or_default())
    }

    /// A chunk of text (`None`: none, as the last chunk), with its tokens' log-probabilities.
    fn chunk(
        &mut self,
        text: Option<String>,
        logprobs: Vec<TokenLogprob>,
        role: bool,
        end: Option<&Finished>,
    ) -> Event {
        let finish_reason = end.map(|f| f.finish_reason);
        let offset = self.sent_bytes;
        self.sent_logprobs += logprobs.len();
        self.sent_bytes += logprobs.iter().map(|l| l.bytes.len()).sum::<usize>();
        let logprobs = (!logprobs.is_empty()).then_some(logprobs);
        let json = match self.shape {
            Shape::Chat => serde_json::to_string(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk".into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChunkChoice {
                    index: self.index,
                    delta: ChatDelta {
                        role: role.then_some(pocket_core::Role::Assistant),
                        content: text,
                        reasoning_content: None,
                        tool_calls: Vec::new(),
                    },
                    finish_reason,
                    logprobs: logprobs.map(|content| ChatLogprobs { content }),
                }],
                usage: None,
                timings: end.map(|f| f.timings.clone()),
                tokens: end.and_then(|f| f.tokens.clone()),
            }),
            Shape::Text => serde_json::to_string(&Completion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![CompletionChoice {
                    index: self.index,
                    text: text.unwrap_or_default(),
                    finish_reason,
                    logprobs: logprobs.as_deref().map(|l| CompletionLogprobs::from_tokens_at(l, offset)),
                }],
                usage: None,
                timings: end.map(|f| f.timings.clone()),
                tokens: end.and_then(|f| f.tokens.clone()),
            }),
        };
        Event::default().data(json.unwrap_or_default())
    }

    /// A choice's last chunk: its finish reason, and the log-probabilities of its tokens no
    /// text carried (a stop string's, a tool call's).
    fn last(&mut self, f: &Finished) -> Event {
        let unsent = f.logprobs.as_deref().and_then(|l| l.get(self.sent_logprobs..)).unwrap_or_default();
        let event = self.chunk(None, unsent.to_vec(), false, Some(f));
        self.phase = self.after_choice(f);
        event
    }

    /// The chunk of the usage that ends a stream with `include_usage`: no choices, as OpenAI's
    /// (the same for both shapes but for its `object`).
    fn usage(&self, usage: pocket_api::Usage) -> Event {
        let object = match self.shape {
            Shape::Chat => "chat.completion.chunk",
            Shape::Text => "text_completion",
        };
        let chunk = serde_json::json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": usage,
        });
        Event::default().data(chunk.to_string())
    }

    /// What follows a choice's last chunk: the next choice, or the usage if asked for, then
    /// `[DONE]`.
    fn after_choice(&mut self, f: &Finished) -> Phase {
        let usage = self.usage.map_or(f.usage, |u| with_choice(u, f.usage));
        self.usage = Some(usage);
        if self.rest.len() > 0 {
            Phase::Next
        } else if self.include_usage {
            Phase::Usage(usage)
        } else {
            Phase::Closing
        }
    }

    /// The first phase of a choice.
    fn opening(shape: Shape) -> Phase {
        match shape {
            Shape::Chat => Phase::Opening,
            Shape::Text => Phase::Body,
        }
    }

    /// The next event: `None` when the stream is over.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            let event = match self.phase {
                Phase::Opening => {
                    self.phase = Phase::Body;
                    self.chunk(Some(String::new()), Vec::new(), true, None)
                }
                Phase::Body => match self.running.pieces.recv().await? {
                    Piece::Text { text, logprobs } if self.holding => {
                        self.held.push_str(&text);
                        self.held_logprobs.extend(logprobs);
                        if !pocket_runtime::tools::starts_as_text(&self.held) {
                            continue;
                        }
                        self.holding = false;
                        let (text, logprobs) =
                            (std::mem::take(&mut self.held), std::mem::take(&mut self.held_logprobs));
                        self.chunk(Some(text), logprobs, false, None)
                    }
                    Piece::Text { text, logprobs } => self.chunk(Some(text), logprobs, false, None),
                    Piece::Reasoning(text) => self.reasoning(text),
                    Piece::Done(f) if self.holding && !(f.tool_calls.is_empty() && f.content.is_empty()) => {
                        let event = if f.tool_calls.is_empty() {
                            let logprobs = std::mem::take(&mut self.held_logprobs);
                            self.chunk(Some(f.content.clone()), logprobs, false, None)
                        } else {
                            self.calls(&f)
                        };
                        self.phase = Phase::Ending(f);
                        event
                    }
                    Piece::Done(f) => self.last(&f),
                    Piece::Failed(e) => {
                        self.phase = Phase::Closing;
                        Event::default().data(serde_json::to_string(&e.to_openai()).unwrap_or_default())
                    }
                },
                Phase::Ending(ref f) => {
                    let f = f.clone();
                    self.last(&f)
                }
                Phase::Next => {
                    let job = self.rest.next()?;
                    match self.scheduler.submit(job).await {
                        Ok(running) => {
                            self.holding = running.started.tools && matches!(self.shape, Shape::Chat);
                            self.running = running;
                            self.index += 1;
                            (self.held_logprobs, self.sent_logprobs, self.sent_bytes) = (Vec::new(), 0, 0);
                            self.held.clear();
                            self.phase = StreamState::opening(self.shape);
                            continue;
                        }
                        Err(e) => {
                            self.phase = Phase::Closing;
                            Event::default().data(serde_json::to_string(&e.to_openai()).unwrap_or_default())
                        }
                    }
                }
                Phase::Usage(usage) => {
                    self.phase = Phase::Closing;
                    self.usage(usage)
                }
                Phase::Closing => {
                    self.phase = Phase::Over;
                    Event::default().data("[DONE]")
                }
                Phase::Over => return None,
            };
            return Some(event);
        }
    }
}

/// Server-sent events, for each choice in turn: (for chat, an opening chunk with the role), a
/// chunk per piece of text with its tokens' log-probabilities, a last chunk with
/// `finish_reason` and `timings`; then, with `include_usage`, a chunk of the `usage`, and
/// `data: [DONE]`. A failure after the start is sent as an `{"error": ...}` event. Dropping
/// the stream (the client went away) drops the [`Running`] and so cancels the generation.
pub(super) async fn sse(
    s: &Arc<Scheduler>,
    jobs: Vec<Job>,
    shape: Shape,
    include_usage: bool,
) -> Result<Response, ServeError> {
    let mut jobs = jobs.into_iter();
    let first = jobs.next().ok_or_else(|| ServeError::internal(None, "a request without a choice"))?;
    let running = s.submit(first).await?;
    let state = StreamState {
        scheduler: s.clone(),
        id: shape.id(&running.started.id),
        model: running.started.model.clone(),
        created: now_seconds(),
        phase: StreamState::opening(shape),
        holding: running.started.tools && matches!(shape, Shape::Chat),
        held: String::new(),
        held_logprobs: Vec::new(),
        sent_logprobs: 0,
        sent_bytes: 0,
        usage: None,
        include_usage,
        index: 0,
        rest: jobs,
        running,
        shape,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let event = st.next_event().await?;
        Some((Ok::<_, Infallible>(event), st))
    });
    Ok(sse_response(stream))
}

/// Text held back while an answer that may call tools may be starting a call (the Anthropic
/// and Responses streams'; the chat stream holds log-probabilities too): released as soon as
/// it cannot be one, else sent whole (as calls, or as text) at the end.
pub(super) struct HeldText {
    holding: bool,
    held: String,
}

impl HeldText {
    /// A holder for an answer that may call tools (`tools`), or one that passes text through.
    pub(super) fn new(tools: bool) -> HeldText {
        HeldText { holding: tools, held: String::new() }
    }

    /// Whether text is still held (the answer may still be a call).
    pub(super) fn holding(&self) -> bool {
        self.holding
    }

    /// The text to send now, given the next piece.
    pub(super) fn pass(&mut self, text: String) -> Option<String> {
        if !self.holding {
            return Some(text);
        }
        self.held.push_str(&text);
        if !pocket_runtime::tools::starts_as_text(&self.held) {
            return None;
        }
        self.holding = false;
        Some(std::mem::take(&mut self.held))
    }
}

pub(super) fn sse_response(
    stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
) -> Response {
    let mut response = Sse::new(stream).into_response();
    // Proxies (nginx) would otherwise hold the events back.
    response.headers_mut().insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    response
}
