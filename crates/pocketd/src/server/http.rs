//! HTTP/1.1 on the Unix socket (and the optional loopback TCP listener): OpenAI's
//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`, pocketd's `/v1/status`,
//! `/v1/models/{name}/load|unload` and `/metrics`.
//!
//! Bodies are parsed here rather than by axum's `Json` extractor so that every error,
//! malformed JSON included, has OpenAI's shape (`{"error": {message, type, param, code}}`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::Stream;
use pocket_api::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, Completion, CompletionChoice, CompletionLogprobs,
    CompletionRequest, DeltaToolCall, ModelAction, ModelList, ModelObject, OnePrompt,
};
use pocket_runtime::Engine;
use serde::de::DeserializeOwned;

use super::connections::Connections;
use super::error::ServeError;
use super::job::{Finished, Input, Job, JobOptions, Piece, Running};
use super::registry::{Available, now_seconds};
use super::scheduler::Scheduler;

/// The largest request body accepted (a prompt larger than this could not fit any context
/// these boards hold).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Who is connected: the peer's credentials on the Unix socket, its address on TCP (put in
/// each request's extensions by [`super::accept`]).
#[derive(Debug, Clone)]
pub struct Peer(pub String);

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.to_openai())).into_response()
    }
}

type Shared = State<Arc<Scheduler>>;

/// The API's routes.
pub fn router(scheduler: Arc<Scheduler>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{name}", get(model))
        .route("/v1/models/{name}/load", post(load_model))
        .route("/v1/models/{name}/unload", post(unload_model))
        .route("/v1/status", get(status))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(scheduler)
}

async fn not_found(uri: axum::http::Uri) -> ServeError {
    ServeError::UnknownEndpoint(format!(
        "no such endpoint {}; pocketd serves /v1/chat/completions, /v1/completions, /v1/models, /v1/status, \
         /v1/models/NAME/load|unload, /health and /metrics",
        uri.path()
    ))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = ServeError::bad_request(format!("{method} is not allowed on {}", uri.path()));
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(e.to_openai())).into_response()
}

pub(super) fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ServeError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ServeError::TooLarge(format!("the request body is larger than {} bytes", MAX_BODY_BYTES))
        } else {
            ServeError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    if std::str::from_utf8(&body).is_err() {
        return Err(ServeError::bad_request("the request body is not valid UTF-8; send JSON in UTF-8"));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ServeError::bad_request(format!("the request body is not valid: {e}")))
}

async fn chat_completions(
    State(s): Shared,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: ChatCompletionRequest = parse(body)?;
    if request.messages.is_empty() {
        return Err(ServeError::invalid("messages", "messages is empty; send at least one message"));
    }
    let job = Job {
        model: request.model.clone(),
        input: Input::Chat(request.messages),
        options: JobOptions::from_openai(&request.options, true)?,
        client: format!("http {}", peer.0),
    };
    let running = s.submit(job).await?;
    if request.options.stream {
        return Ok(sse(running, Shape::Chat, include_usage(&request.options)));
    }
    let (id, model) = (Shape::Chat.id(&running.started.id), running.started.model.clone());
    let f = running.collect().await?;
    Ok(axum::Json(ChatCompletion {
        id,
        object: "chat.completion".into(),
        created: now_seconds(),
        model,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: pocket_core::Role::Assistant,
                content: (f.tool_calls.is_empty() || !f.content.is_empty()).then(|| f.content.clone()),
                tool_calls: f.tool_calls.clone(),
            },
            finish_reason: f.finish_reason,
            logprobs: f.logprobs.clone().map(|content| ChatLogprobs { content }),
        }],
        usage: f.usage,
        timings: Some(f.timings),
        tokens: f.tokens,
    })
    .into_response())
}

async fn completions(
    State(s): Shared,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: CompletionRequest = parse(body)?;
    let options = JobOptions::from_openai(&request.options, false)?;
    let prompts = request.prompt.into_prompts();
    if prompts.is_empty() {
        return Err(ServeError::invalid("prompt", "prompt is an empty list; send at least one prompt"));
    }
    if prompts.len() > 1 && request.options.stream {
        return Err(ServeError::invalid(
            "prompt",
            format!(
                "{} prompts in one stream: pocketd streams one prompt per request; send them without stream \
                 (each gets a choice), or one request each",
                prompts.len()
            ),
        ));
    }
    let mut jobs = prompts.into_iter().map(|p| Job {
        model: request.model.clone(),
        input: match p {
            OnePrompt::Text(text) => Input::Text(text),
            OnePrompt::Tokens(tokens) => Input::Tokens(tokens),
        },
        options: options.clone(),
        client: format!("http {}", peer.0),
    });
    if request.options.stream {
        let running = s.submit(jobs.next().expect("one prompt, checked above")).await?;
        return Ok(sse(running, Shape::Text, include_usage(&request.options)));
    }
    // Several prompts are answered one after another, each a choice of its own, under the
    // first one's id; the usage is their sum.
    let mut answers = Vec::new();
    for job in jobs {
        let running = s.submit(job).await?;
        let (id, model) = (Shape::Text.id(&running.started.id), running.started.model.clone());
        answers.push((id, model, running.collect().await?));
    }
    let usage = answers.iter().map(|(.., f)| f.usage).reduce(add_usage);
    let choices = answers
        .iter()
        .enumerate()
        .map(|(index, (.., f))| CompletionChoice {
            index: index as u32,
            text: f.text.clone(),
            finish_reason: Some(f.finish_reason),
            logprobs: f.logprobs.as_deref().map(CompletionLogprobs::from_tokens),
        })
        .collect();
    let one = answers.len() == 1;
    let (id, model, first) = answers.swap_remove(0);
    // pocketd's statistics and tokens describe one completion: with several, they are left out.
    let (timings, tokens) = if one { (Some(first.timings), first.tokens) } else { (None, None) };
    Ok(axum::Json(Completion {
        id,
        object: "text_completion".into(),
        created: now_seconds(),
        model,
        choices,
        usage,
        timings,
        tokens,
    })
    .into_response())
}

/// The usage of two completions together.
fn add_usage(a: pocket_api::Usage, b: pocket_api::Usage) -> pocket_api::Usage {
    let cached = |u: &pocket_api::Usage| u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    pocket_api::Usage {
        prompt_tokens: a.prompt_tokens + b.prompt_tokens,
        completion_tokens: a.completion_tokens + b.completion_tokens,
        total_tokens: a.total_tokens + b.total_tokens,
        prompt_tokens_details: (a.prompt_tokens_details.is_some() || b.prompt_tokens_details.is_some())
            .then(|| pocket_api::PromptTokensDetails { cached_tokens: cached(&a) + cached(&b) }),
    }
}

/// Which OpenAI stream a response is.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Chat,
    Text,
}

impl Shape {
    /// A request's id as OpenAI spells it for this kind of answer.
    fn id(self, request: &str) -> String {
        match self {
            Shape::Chat => format!("chatcmpl-{request}"),
            Shape::Text => format!("cmpl-{request}"),
        }
    }
}

enum Phase {
    Opening,
    Body,
    /// The tool calls were sent; the last chunk follows.
    Ending(Box<Finished>),
    /// The last chunk was sent; the usage follows (`include_usage`).
    Usage(pocket_api::Usage),
    Closing,
    Over,
}

/// Whether a stream ends with a chunk of the usage (`stream_options.include_usage`).
fn include_usage(o: &pocket_api::GenerationOptions) -> bool {
    o.stream_options.is_some_and(|s| s.include_usage)
}

struct StreamState {
    running: Running,
    shape: Shape,
    phase: Phase,
    id: String,
    model: String,
    created: u64,
    /// Text held back while it may be a tool call (an answer that may call tools and starts
    /// with `<`): sent as `tool_calls` at the end, or as text if it was not one.
    holding: bool,
    held: String,
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
        let delta = ChatDelta { role: None, content, tool_calls };
        let chunk = ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices: vec![ChatChunkChoice { index: 0, delta, finish_reason: None, logprobs: None }],
            usage: None,
            timings: None,
            tokens: None,
        };
        Event::default().data(serde_json::to_string(&chunk).unwrap_or_default())
    }

    fn chunk(&self, text: Option<String>, role: bool, end: Option<&Finished>) -> Event {
        let finish_reason = end.map(|f| f.finish_reason);
        let logprobs = end.and_then(|f| f.logprobs.clone());
        let json = match self.shape {
            Shape::Chat => serde_json::to_string(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk".into(),
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChunkChoice {
                    index: 0,
                    delta: ChatDelta {
                        role: role.then_some(pocket_core::Role::Assistant),
                        content: text,
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
                    index: 0,
                    text: text.unwrap_or_default(),
                    finish_reason,
                    logprobs: logprobs.as_deref().map(CompletionLogprobs::from_tokens),
                }],
                usage: None,
                timings: end.map(|f| f.timings.clone()),
                tokens: end.and_then(|f| f.tokens.clone()),
            }),
        };
        Event::default().data(json.unwrap_or_default())
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

    /// What follows the last chunk: the usage if asked for, then `[DONE]`.
    fn after_last(&self, f: &Finished) -> Phase {
        if self.include_usage { Phase::Usage(f.usage) } else { Phase::Closing }
    }
}

/// Server-sent events: (for chat, an opening chunk with the role), a chunk per piece of text,
/// a last chunk with `finish_reason` and `timings`, with `include_usage` a chunk of the
/// `usage`, then `data: [DONE]`. A failure after the start is sent as an `{"error": ...}`
/// event. Dropping the stream (the client went away) drops the [`Running`] and so cancels the
/// generation.
fn sse(running: Running, shape: Shape, include_usage: bool) -> Response {
    let state = StreamState {
        id: shape.id(&running.started.id),
        model: running.started.model.clone(),
        created: now_seconds(),
        phase: match shape {
            Shape::Chat => Phase::Opening,
            Shape::Text => Phase::Body,
        },
        holding: running.started.tools && matches!(shape, Shape::Chat),
        held: String::new(),
        include_usage,
        running,
        shape,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let event = match st.phase {
            Phase::Opening => {
                st.phase = Phase::Body;
                st.chunk(Some(String::new()), true, None)
            }
            Phase::Body => loop {
                match st.running.pieces.recv().await {
                    Some(Piece::Text(t)) if st.holding => {
                        // The grammar lets text start with anything but '<' or '{', and a
                        // call with nothing else: the first character decides.
                        st.held.push_str(&t);
                        if !st.held.is_empty() && !st.held.starts_with(['<', '{']) {
                            st.holding = false;
                            let text = std::mem::take(&mut st.held);
                            break st.chunk(Some(text), false, None);
                        }
                    }
                    Some(Piece::Text(t)) => break st.chunk(Some(t), false, None),
                    Some(Piece::Done(f))
                        if st.holding && !(f.tool_calls.is_empty() && f.content.is_empty()) =>
                    {
                        let event = if f.tool_calls.is_empty() {
                            st.chunk(Some(f.content.clone()), false, None)
                        } else {
                            st.calls(&f)
                        };
                        st.phase = Phase::Ending(f);
                        break event;
                    }
                    Some(Piece::Done(f)) => {
                        st.phase = st.after_last(&f);
                        break st.chunk(None, false, Some(&f));
                    }
                    Some(Piece::Failed(e)) => {
                        st.phase = Phase::Closing;
                        break Event::default()
                            .data(serde_json::to_string(&e.to_openai()).unwrap_or_default());
                    }
                    None => return None,
                }
            },
            Phase::Ending(ref f) => {
                let event = st.chunk(None, false, Some(f));
                st.phase = st.after_last(f);
                event
            }
            Phase::Usage(usage) => {
                st.phase = Phase::Closing;
                st.usage(usage)
            }
            Phase::Closing => {
                st.phase = Phase::Over;
                Event::default().data("[DONE]")
            }
            Phase::Over => return None,
        };
        Some((Ok::<_, Infallible>(event), st))
    });
    sse_response(stream)
}

fn sse_response(stream: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Response {
    let mut response = Sse::new(stream).into_response();
    // Proxies (nginx) would otherwise hold the events back.
    response.headers_mut().insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    response
}

async fn models(State(s): Shared) -> Result<axum::Json<ModelList>, ServeError> {
    let data = s.registry.available()?.into_iter().map(model_object).collect();
    Ok(axum::Json(ModelList { object: "list".into(), data }))
}

/// `GET /v1/models/{id}`: one model as the list has it, or `model_not_found`.
async fn model(State(s): Shared, Path(name): Path<String>) -> Result<axum::Json<ModelObject>, ServeError> {
    Ok(axum::Json(model_object(s.registry.find(&name)?)))
}

fn model_object(a: Available) -> ModelObject {
    ModelObject {
        engine: Some(Engine::for_path(&a.path).name().to_owned()),
        id: a.name,
        object: "model".into(),
        created: a.created,
        owned_by: "pocketd".into(),
    }
}

async fn load_model(
    State(s): Shared,
    Path(name): Path<String>,
) -> Result<axum::Json<ModelAction>, ServeError> {
    if s.is_stopping() {
        return Err(ServeError::ShuttingDown);
    }
    let m = s.registry.get(&name).await?;
    s.registry.release(&m.name);
    Ok(axum::Json(ModelAction { model: m.name.clone(), loaded: true, bytes: m.bytes() }))
}

async fn unload_model(
    State(s): Shared,
    Path(name): Path<String>,
) -> Result<axum::Json<ModelAction>, ServeError> {
    let model = s.registry.unload(&name)?;
    Ok(axum::Json(ModelAction { model, loaded: false, bytes: 0 }))
}

/// The connection table, which the accept loop puts in every request's extensions.
type Table = Option<Extension<Arc<Connections>>>;

/// `GET /health`, as llama.cpp's server answers it: 200 `{"status": "ok"}` while requests are
/// taken (models load on demand, so there is no loading state), 503 once the daemon stops.
async fn health(State(s): Shared) -> Result<axum::Json<serde_json::Value>, ServeError> {
    if s.is_stopping() {
        return Err(ServeError::ShuttingDown);
    }
    Ok(axum::Json(serde_json::json!({"status": "ok"})))
}

async fn status(State(s): Shared, table: Table) -> axum::Json<pocket_api::Status> {
    let mut status = s.status();
    status.connections = table.map(|Extension(c)| connection_status(&c));
    axum::Json(status)
}

fn connection_status(c: &Connections) -> pocket_api::ConnectionStatus {
    let (counts, limits) = (c.counts(), c.limits());
    pocket_api::ConnectionStatus {
        open: counts.open,
        max: limits.max,
        max_per_peer: limits.per_peer,
        accepted: counts.accepted,
        refused: counts.refused,
        evicted: counts.evicted,
        timed_out: counts.timed_out,
    }
}

async fn metrics(State(s): Shared, table: Table) -> Response {
    let mut text = s.metrics.render(&s.status(), s.prompt_cache());
    if let Some(Extension(c)) = table {
        super::metrics::render_connections(&mut text, c.counts());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
