//! HTTP/1.1 on the Unix socket (and the optional loopback TCP listener): OpenAI's
//! `/v1/chat/completions`, `/v1/completions` (their streams in [`super::stream`]) and
//! `/v1/models`, the Responses API's `/v1/responses` (in [`super::responses`]), Anthropic's
//! `/v1/messages` (in [`super::messages`]), llama.cpp's `/health`,
//! `/tokenize` and `/detokenize`, pocketd's `/v1/status`, `/v1/models/{name}/load|unload`
//! and `/metrics`.
//!
//! Bodies are parsed by [`super::body`], so that every error has OpenAI's shape.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use pocket_api::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionRequest, ChatLogprobs, Completion,
    CompletionChoice, CompletionLogprobs, CompletionRequest, DetokenizeRequest, DetokenizeResponse,
    ModelAction, ModelList, ModelObject, OnePrompt, TokenPiece, TokenizeRequest, TokenizeResponse, Tokens,
};

use super::body::{MAX_BODY_BYTES, Peer, parse};
use super::connections::Connections;
use super::error::ServeError;
use super::job::{Finished, Input, Job, JobOptions};
use super::openai::{add_usage, choices, choices_usage};
use super::registry::{Available, Registry, now_seconds};
use super::scheduler::Scheduler;
use super::stream::{Shape, include_usage, sse};

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
        .route("/v1/embeddings", post(super::embeddings::create))
        .route("/v1/models", get(models))
        .route("/v1/models/{name}", get(model))
        .route("/v1/models/{name}/load", post(load_model))
        .route("/v1/models/{name}/unload", post(unload_model))
        .route("/v1/responses", post(super::responses::create))
        .route("/v1/responses/{id}", get(super::responses::get).delete(super::responses::delete))
        .route("/v1/messages", post(super::messages::messages))
        .route("/v1/messages/count_tokens", post(super::messages::count_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/status", get(status))
        .route("/v1/cache/clear", post(clear_cache))
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
         /v1/models/NAME/load|unload, /v1/cache/clear, /v1/messages (Anthropic's), /tokenize, /detokenize, /health and /metrics",
        uri.path()
    ))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = ServeError::bad_request(format!("{method} is not allowed on {}", uri.path()));
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(e.to_openai())).into_response()
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
    let jobs = job.choices(choices(&request.options)?);
    if request.options.stream {
        return sse(&s, jobs, Shape::Chat, include_usage(&request.options)).await;
    }
    let n = jobs.len();
    let (id, model, answers) = answer(&s, jobs, Shape::Chat).await?;
    let usage = choices_usage(&answers);
    let choices = answers
        .iter()
        .enumerate()
        .map(|(index, f)| ChatChoice {
            index: index as u32,
            message: AssistantMessage {
                role: pocket_core::Role::Assistant,
                content: (f.tool_calls.is_empty() || !f.content.is_empty()).then(|| f.content.clone()),
                reasoning_content: f.reasoning.clone(),
                tool_calls: f.tool_calls.clone(),
            },
            finish_reason: f.finish_reason,
            logprobs: f.logprobs.clone().map(|content| ChatLogprobs { content }),
        })
        .collect();
    let (timings, tokens) = one_answers_extras(answers, n);
    Ok(axum::Json(ChatCompletion {
        id,
        object: "chat.completion".into(),
        created: now_seconds(),
        model,
        choices,
        usage,
        timings,
        tokens,
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
    let n = choices(&request.options)?;
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
    // OpenAI's order: the n choices of the first prompt, then the second's.
    let jobs: Vec<Job> = prompts
        .into_iter()
        .flat_map(|p| {
            let job = Job {
                model: request.model.clone(),
                input: match p {
                    OnePrompt::Text(text) => Input::Text(text),
                    OnePrompt::Tokens(tokens) => Input::Tokens(tokens),
                },
                options: options.clone(),
                client: format!("http {}", peer.0),
            };
            job.choices(n)
        })
        .collect();
    if request.options.stream {
        return sse(&s, jobs, Shape::Text, include_usage(&request.options)).await;
    }
    let count = jobs.len();
    let (id, model, answers) = answer(&s, jobs, Shape::Text).await?;
    // Each prompt's n choices read it once.
    let usage = answers.chunks(n as usize).map(choices_usage).reduce(add_usage);
    let choices = answers
        .iter()
        .enumerate()
        .map(|(index, f)| CompletionChoice {
            index: index as u32,
            text: f.text.clone(),
            finish_reason: Some(f.finish_reason),
            logprobs: f.logprobs.as_deref().map(CompletionLogprobs::from_tokens),
        })
        .collect();
    let (timings, tokens) = one_answers_extras(answers, count);
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

/// The answers to `jobs`, generated one after another, under the first one's id and model.
async fn answer(
    s: &Arc<Scheduler>,
    jobs: Vec<Job>,
    shape: Shape,
) -> Result<(String, String, Vec<Finished>), ServeError> {
    let mut first = None;
    let mut answers = Vec::with_capacity(jobs.len());
    for job in jobs {
        let running = s.submit(job).await?;
        first.get_or_insert_with(|| (shape.id(&running.started.id), running.started.model.clone()));
        answers.push(running.collect().await?);
    }
    let (id, model) = first.ok_or_else(|| ServeError::internal(None, "a request without a choice"))?;
    Ok((id, model, answers))
}

/// pocketd's statistics and tokens describe one completion: with several, they are left out.
fn one_answers_extras(
    mut answers: Vec<Finished>,
    n: usize,
) -> (Option<pocket_api::Timings>, Option<Vec<u32>>) {
    match answers.pop() {
        Some(f) if n == 1 => (Some(f.timings), f.tokens),
        _ => (None, None),
    }
}

async fn models(State(s): Shared) -> Result<axum::Json<ModelList>, ServeError> {
    let mut available = s.registry.available()?;
    available.extend(s.registry.aliases()?);
    let data = available.into_iter().map(|a| model_object(&s.registry, a)).collect();
    Ok(axum::Json(ModelList { object: "list".into(), data }))
}

/// `GET /v1/models/{id}`: one model as the list has it, or `model_not_found`.
async fn model(State(s): Shared, Path(name): Path<String>) -> Result<axum::Json<ModelObject>, ServeError> {
    Ok(axum::Json(model_object(&s.registry, s.registry.find(&name)?)))
}

fn model_object(registry: &Registry, a: Available) -> ModelObject {
    ModelObject {
        engine: Some(registry.engine(&a.path).name().to_owned()),
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

/// `POST /tokenize`: a text's tokens (`content`), or a conversation's as a chat request's
/// prompt (`messages`), in the model's vocabulary.
async fn tokenize(State(s): Shared, body: Result<Bytes, BytesRejection>) -> Result<Response, ServeError> {
    let request: TokenizeRequest = parse(body)?;
    let input = match (request.content, request.messages) {
        (Some(text), None) => Input::Text(text),
        (None, Some(messages)) if !request.add_special => Input::Chat(messages),
        (None, Some(_)) => {
            return Err(ServeError::invalid(
                "add_special",
                "add_special is for content: messages are tokenized as a chat prompt, special tokens and all",
            ));
        }
        _ => {
            return Err(ServeError::invalid(
                "content",
                "send content (a text) or messages (a conversation): one of them",
            ));
        }
    };
    let m = s.model_or_default(request.model.as_deref()).await?;
    let tokenizer = m.model.model().tokenizer();
    let tokens = match &input {
        Input::Text(text) => tokenizer
            .encode(text, request.add_special)
            .map_err(|e| ServeError::invalid("content", e.to_string())),
        _ => pocket_runtime::pipeline::render(&m.model, &input, &Default::default(), &Default::default())
            .map_err(|e| ServeError::from_runtime(e, None)),
    };
    s.registry.release(&m.name);
    let tokens = tokens?;
    let count = tokens.len();
    let tokens = if request.with_pieces {
        let piece = |t| String::from_utf8_lossy(&tokenizer.piece(t)).into_owned();
        Tokens::Pieces(tokens.into_iter().map(|id| TokenPiece { id, piece: piece(id) }).collect())
    } else {
        Tokens::Ids(tokens)
    };
    let max_model_len = m.model.model().info().n_ctx_train;
    Ok(axum::Json(TokenizeResponse { tokens, count, max_model_len, model: m.name.clone() }).into_response())
}

/// `POST /detokenize`: the text of token ids, as a generated text starting with them.
async fn detokenize(State(s): Shared, body: Result<Bytes, BytesRejection>) -> Result<Response, ServeError> {
    let request: DetokenizeRequest = parse(body)?;
    let m = s.model_or_default(request.model.as_deref()).await?;
    s.registry.release(&m.name);
    let n_vocab = m.model.model().info().n_vocab;
    if let Some(t) = request.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ServeError::invalid(
            "tokens",
            format!("token {t} is not in {}'s vocabulary: ids go from 0 to {}", m.name, n_vocab - 1),
        ));
    }
    let tokenizer = m.model.model().tokenizer();
    let mut bytes = Vec::new();
    for &t in &request.tokens {
        // The first token with text starts the text (SentencePiece's word-start space dropped).
        bytes.extend(if bytes.is_empty() { tokenizer.first_piece(t) } else { tokenizer.piece(t) });
    }
    let content = String::from_utf8_lossy(&bytes).into_owned();
    Ok(axum::Json(DetokenizeResponse { content, model: m.name.clone() }).into_response())
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

/// `POST /v1/cache/clear`: forgets the earlier answers kept for drafting later ones, all of
/// them or (with `{"prompt_cache_key": KEY}`) those given under one key.
async fn clear_cache(
    State(s): Shared,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<pocket_api::CacheCleared>, ServeError> {
    let empty = body.as_ref().is_ok_and(|b| b.iter().all(u8::is_ascii_whitespace));
    let request: pocket_api::ClearCache =
        if empty { pocket_api::ClearCache::default() } else { parse(body)? };
    let before = s.histories().bytes();
    let histories = s.histories().clear(request.prompt_cache_key.as_deref());
    s.registry.changed();
    Ok(axum::Json(pocket_api::CacheCleared {
        histories,
        bytes: before.saturating_sub(s.histories().bytes()),
    }))
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
