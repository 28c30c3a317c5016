//! Anthropic's Messages API on the same jobs as OpenAI's: `POST /v1/messages` (plain and
//! streamed) and `POST /v1/messages/count_tokens`, with Anthropic's error body.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use pocket_api::FinishReason;
use pocket_api::anthropic::{
    Block, Content, MessageResponse, MessagesRequest, MessagesUsage, OutputBlock, TokenCount,
};
use pocket_core::{ChatMessage, FunctionCall, Role, SamplingConfig, ToolCall};
use pocket_runtime::tools::{ToolChoice, Tools};
use serde_json::{Value, json};

use super::body::{Peer, parse};
use super::error::ServeError;
use super::job::{Finished, Input, Job, JobOptions, Piece, Running};
use super::scheduler::Scheduler;
use super::stream::{HeldText, sse_response};

/// A [`ServeError`] in Anthropic's body: `{"type": "error", "error": {"type", "message"}}`.
pub(super) struct AnthropicError(ServeError);

impl From<ServeError> for AnthropicError {
    fn from(e: ServeError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(error_body(&self.0))).into_response()
    }
}

fn error_body(e: &ServeError) -> Value {
    let kind = match e.http_status() {
        400 | 409 => "invalid_request_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.to_string()}})
}

type Shared = State<Arc<Scheduler>>;

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(s): Shared,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let request: MessagesRequest = parse(body)?;
    let Some(max_tokens) = request.max_tokens else {
        return Err(ServeError::invalid("max_tokens", "max_tokens is required").into());
    };
    let stream = request.stream;
    let job = Job {
        model: request.model.clone(),
        input: Input::Chat(chat_messages(&request)?),
        options: options(&request, max_tokens)?,
        client: format!("http {}", peer.0),
    };
    let running = s.submit(job).await?;
    let (id, model) = (message_id(&running.started.id), running.started.model.clone());
    if stream {
        return Ok(events(running, id, model));
    }
    let f = running.collect().await?;
    let (stop_reason, stop_sequence) = stop_reason(&f)?;
    Ok(axum::Json(MessageResponse {
        id,
        kind: "message".into(),
        role: "assistant".into(),
        model,
        content: output_blocks(f.reasoning.as_deref(), &f.content, &f.tool_calls),
        stop_reason: Some(stop_reason.into()),
        stop_sequence,
        usage: usage(&f.usage),
    })
    .into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would make it.
pub(super) async fn count_tokens(
    State(s): Shared,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let request: MessagesRequest = parse(body)?;
    let messages = chat_messages(&request)?;
    let tools = tools(&request)?;
    let kwargs = template_kwargs(&request)?;
    let m = s.model_or_default(request.model.as_deref()).await?;
    let tokens = pocket_runtime::pipeline::render(&m.model, &Input::Chat(messages), &tools, &kwargs);
    s.registry.release(&m.name);
    let tokens = tokens.map_err(|e| ServeError::from_runtime(e, None))?;
    Ok(axum::Json(TokenCount { input_tokens: tokens.len() as u32 }).into_response())
}

/// Anthropic's ids start `msg_`.
fn message_id(request: &str) -> String {
    format!("msg_{request}")
}

/// The conversation as chat messages: the system prompt first; a user turn's tool results as
/// `tool` messages, then its text; an assistant turn's tool uses as its tool calls.
fn chat_messages(request: &MessagesRequest) -> Result<Vec<ChatMessage>, ServeError> {
    if request.messages.is_empty() {
        return Err(ServeError::invalid("messages", "messages is empty; send at least one message"));
    }
    let mut out = Vec::new();
    if let Some(system) = &request.system {
        out.push(ChatMessage::new(Role::System, system.text()));
    }
    for (i, m) in request.messages.iter().enumerate() {
        let blocks = match &m.content {
            Content::Text(text) => vec![Block::Text { text: text.clone() }],
            Content::Blocks(blocks) => blocks.clone(),
        };
        let mut message = match m.role.as_str() {
            "user" => ChatMessage::new(Role::User, String::new()),
            "assistant" => ChatMessage::new(Role::Assistant, String::new()),
            other => {
                return Err(ServeError::invalid(
                    "messages",
                    format!(
                        "messages[{i}].role is {other:?}: user or assistant (the system prompt goes in system)"
                    ),
                ));
            }
        };
        let mut texts = Vec::new();
        for block in blocks {
            match block {
                Block::Text { text } => texts.push(text),
                // Thinking is not shown to the model again (as chat templates drop it).
                Block::Thinking { .. } => {}
                Block::ToolUse { id, name, input } if message.role == Role::Assistant => {
                    message.tool_calls.push(ToolCall {
                        id,
                        kind: "function".into(),
                        function: FunctionCall { name, arguments: input.to_string() },
                    });
                }
                Block::ToolResult { tool_use_id, content, is_error } if message.role == Role::User => {
                    let text = content.map(|c| c.text()).unwrap_or_default();
                    let text = if is_error { format!("Error: {text}") } else { text };
                    let mut result = ChatMessage::new(Role::Tool, text);
                    result.tool_call_id = Some(tool_use_id);
                    out.push(result);
                }
                _ => {
                    return Err(ServeError::invalid(
                        "messages",
                        format!(
                            "messages[{i}]: tool_use blocks belong in assistant turns, tool_result blocks in user turns"
                        ),
                    ));
                }
            }
        }
        message.content = texts.join("\n");
        if !message.content.is_empty() || !message.tool_calls.is_empty() {
            out.push(message);
        }
    }
    Ok(out)
}

/// The request's tools as OpenAI's, and its `tool_choice`.
fn tools(request: &MessagesRequest) -> Result<Tools, ServeError> {
    let tools = request
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description.clone().unwrap_or_default(), "parameters": t.input_schema,
            }})
        })
        .collect();
    let (choice, parallel) = match &request.tool_choice {
        None => (ToolChoice::Auto, true),
        Some(c) => {
            let choice = match (c.kind.as_str(), &c.name) {
                ("auto", _) => ToolChoice::Auto,
                ("any", _) => ToolChoice::Required,
                ("none", _) => ToolChoice::None,
                ("tool", Some(name)) => ToolChoice::Function(name.clone()),
                _ => {
                    return Err(ServeError::invalid(
                        "tool_choice",
                        "tool_choice is {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or \
                         {\"type\": \"tool\", \"name\": …}",
                    ));
                }
            };
            (choice, !c.disable_parallel_tool_use)
        }
    };
    Ok(Tools { tools, choice, parallel })
}

fn options(request: &MessagesRequest, max_tokens: u32) -> Result<JobOptions, ServeError> {
    let mut sampling = SamplingConfig::default();
    if let Some(t) = request.temperature {
        sampling.temperature = t;
    }
    if let Some(p) = request.top_p {
        sampling.top_p = p;
    }
    if let Some(k) = request.top_k {
        sampling.top_k = k as usize;
    }
    Ok(JobOptions {
        max_tokens: Some(max_tokens),
        sampling,
        stop: request.stop_sequences.clone(),
        tools: tools(request)?,
        template_kwargs: template_kwargs(request)?,
        ..JobOptions::default()
    })
}

/// The template's variables `thinking` sets: `enable_thinking` for a model that thinks.
fn template_kwargs(request: &MessagesRequest) -> Result<serde_json::Map<String, Value>, ServeError> {
    let mut kwargs = serde_json::Map::new();
    if let Some(thinking) = &request.thinking {
        let enabled = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(ServeError::invalid(
                    "thinking",
                    "thinking is {\"type\": \"enabled\", \"budget_tokens\": …} or {\"type\": \"disabled\"}",
                ));
            }
        };
        kwargs.insert("enable_thinking".into(), enabled.into());
    }
    Ok(kwargs)
}

/// Anthropic's `stop_reason` and `stop_sequence`; a cancelled answer is an error.
fn stop_reason(f: &Finished) -> Result<(&'static str, Option<String>), ServeError> {
    Ok(match f.finish_reason {
        FinishReason::Stop if f.stop_string.is_some() => ("stop_sequence", f.stop_string.clone()),
        FinishReason::Stop => ("end_turn", None),
        FinishReason::Length => ("max_tokens", None),
        FinishReason::ToolCalls => ("tool_use", None),
        FinishReason::Cancelled => return Err(ServeError::Cancelled),
    })
}

fn usage(u: &pocket_api::Usage) -> MessagesUsage {
    let cached = u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    MessagesUsage {
        input_tokens: u.prompt_tokens - cached.min(u.prompt_tokens),
        output_tokens: u.completion_tokens,
        cache_read_input_tokens: cached,
        cache_creation_input_tokens: 0,
    }
}

/// A call's arguments as the JSON value `tool_use` carries (`{}` if they are not one).
fn input(call: &ToolCall) -> Value {
    serde_json::from_str(&call.function.arguments).unwrap_or_else(|_| json!({}))
}

fn output_blocks(reasoning: Option<&str>, content: &str, calls: &[ToolCall]) -> Vec<OutputBlock> {
    let thinking =
        reasoning.map(|t| OutputBlock::Thinking { thinking: t.to_owned(), signature: String::new() });
    let text = (!content.is_empty()).then(|| OutputBlock::Text { text: content.to_owned() });
    thinking
        .into_iter()
        .chain(text)
        .chain(calls.iter().map(|c| OutputBlock::ToolUse {
            id: c.id.clone(),
            name: c.function.name.clone(),
            input: input(c),
        }))
        .collect()
}

/// A stream's state: the generation, and the events ready to go.
struct EventStream {
    running: Running,
    ready: VecDeque<Event>,
    /// Text held back while it may be a tool call.
    held: HeldText,
    /// Whether a thinking block is open.
    thinking_open: bool,
    /// Whether a text block is open, and how many blocks were opened.
    text_open: bool,
    blocks: usize,
    over: bool,
}

fn event(kind: &str, data: Value) -> Event {
    Event::default().event(kind).data(data.to_string())
}

impl EventStream {
    fn thinking(&mut self, thinking: String) {
        if !self.thinking_open {
            self.ready.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.blocks,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            ));
            self.thinking_open = true;
            self.blocks += 1;
        }
        self.ready.push_back(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.blocks - 1,
                "delta": {"type": "thinking_delta", "thinking": thinking}}),
        ));
    }

    fn close_thinking(&mut self) {
        if self.thinking_open {
            self.thinking_open = false;
            self.ready.push_back(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.blocks - 1,
                    "delta": {"type": "signature_delta", "signature": ""}}),
            ));
            self.ready.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.blocks - 1}),
            ));
        }
    }

    fn text(&mut self, text: String) {
        self.close_thinking();
        if !self.text_open {
            self.ready.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.blocks, "content_block": {"type": "text", "text": ""}}),
            ));
            self.text_open = true;
            self.blocks += 1;
        }
        self.ready.push_back(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": {"type": "text_delta", "text": text}}),
        ));
    }

    fn close_text(&mut self) {
        if self.text_open {
            self.text_open = false;
            self.ready.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.blocks - 1}),
            ));
        }
    }

    /// The end: text held back, the tool calls, then `message_delta` and `message_stop`.
    fn end(&mut self, f: &Finished) {
        if self.held.holding() && !f.content.is_empty() {
            self.text(f.content.clone());
        }
        self.close_thinking();
        self.close_text();
        for call in &f.tool_calls {
            let index = self.blocks;
            self.blocks += 1;
            self.ready.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block":
                    {"type": "tool_use", "id": call.id, "name": call.function.name, "input": {}}}),
            ));
            self.ready.push_back(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta":
                    {"type": "input_json_delta", "partial_json": input(call).to_string()}}),
            ));
            self.ready.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
        match stop_reason(f) {
            Ok((reason, sequence)) => {
                self.ready.push_back(event(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(&f.usage)}),
                ));
                self.ready.push_back(event("message_stop", json!({"type": "message_stop"})));
            }
            Err(e) => self.ready.push_back(event("error", error_body(&e))),
        }
    }

    /// The next event; `None` at the end.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            if self.over {
                return None;
            }
            match self.running.pieces.recv().await {
                Some(Piece::Text { text, .. }) => {
                    if let Some(text) = self.held.pass(text) {
                        self.text(text);
                    }
                }
                Some(Piece::Reasoning(thinking)) => self.thinking(thinking),
                Some(Piece::Done(f)) => {
                    self.end(&f);
                    self.over = true;
                }
                Some(Piece::Failed(e)) => {
                    self.ready.push_back(event("error", error_body(&e)));
                    self.over = true;
                }
                None => self.over = true,
            }
        }
    }
}

/// Anthropic's stream: `message_start`, the content blocks (`content_block_start`, deltas,
/// `content_block_stop`), `message_delta` with the stop reason and usage, `message_stop`.
fn events(running: Running, id: String, model: String) -> Response {
    // How much of the prompt the prompt cache held is known at the end (`message_delta`).
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": running.started.prompt_tokens, "output_tokens": 0},
    }});
    let state = EventStream {
        held: HeldText::new(running.started.tools),
        running,
        ready: VecDeque::from([event("message_start", start)]),
        thinking_open: false,
        text_open: false,
        blocks: 0,
        over: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let e = st.next().await?;
        Some((Ok::<_, Infallible>(e), st))
    });
    sse_response(stream)
}
