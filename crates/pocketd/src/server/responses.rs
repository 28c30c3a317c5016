//! OpenAI's Responses API on the same jobs as chat completions: `POST /v1/responses` (plain
//! and streamed as semantic events), `GET` and `DELETE /v1/responses/{id}`. Stored responses
//! ([`super::stored`]) carry their conversation, so `previous_response_id` rebuilds the
//! prompt as messages and the prompt cache continues it where the last answer ended.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use pocket_api::FinishReason;
use pocket_api::responses::{
    InputItem, OutputItem, OutputText, ReasoningText, ResponseDeleted, ResponseObject, ResponsesInput,
    ResponsesRequest, ResponsesUsage, TextFormat,
};
use pocket_core::{ChatMessage, FunctionCall, Role, SamplingConfig, ToolCall};
use pocket_runtime::grammar::Grammar;
use pocket_runtime::tools::{ToolChoice, Tools};
use serde_json::{Value, json};

use super::body::{Peer, parse};
use super::error::ServeError;
use super::job::{Finished, Input, Job, JobOptions, Piece, Running};
use super::registry::now_seconds;
use super::scheduler::Scheduler;
use super::stream::{HeldText, sse_response};

type Shared = State<Arc<Scheduler>>;

/// `POST /v1/responses`.
pub(super) async fn create(
    State(s): Shared,
    ConnectInfo(peer): ConnectInfo<Peer>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: ResponsesRequest = parse(body)?;
    if request.background == Some(true) {
        return Err(ServeError::invalid(
            "background",
            "background: true is not supported; pocketd answers while the request is open (stream for progress)",
        ));
    }
    if let Some(t) = request.truncation.as_deref().filter(|t| !matches!(*t, "disabled" | "auto")) {
        return Err(ServeError::invalid(
            "truncation",
            format!("truncation is \"disabled\" or \"auto\", not {t:?}"),
        ));
    }
    let conversation = conversation(&s, &request)?;
    let mut messages = Vec::new();
    if let Some(instructions) = &request.instructions {
        messages.push(ChatMessage::new(Role::System, instructions.clone()));
    }
    messages.extend(conversation.iter().cloned());
    let job = Job {
        model: request.model.clone(),
        input: Input::Chat(messages),
        options: options(&request)?,
        client: format!("http {}", peer.0),
    };
    let temperature = job.options.sampling.temperature;
    let top_p = job.options.sampling.top_p;
    let running = s.submit(job).await.map_err(|e| e.named(FIELDS))?;
    let shell = Shell {
        id: format!("resp_{}", running.started.id),
        created_at: now_seconds(),
        model: running.started.model.clone(),
        temperature,
        top_p,
        request,
        conversation,
    };
    if shell.request.stream {
        return Ok(events(s, running, shell));
    }
    let f = running.collect().await.map_err(|e| e.named(FIELDS))?;
    let output = output_items(&shell.id, f.reasoning.as_deref(), &f.content, &f.tool_calls, status_of(&f)?);
    let response = shell.response(status_of(&f)?, output, Some(ResponsesUsage::from(&f.usage)));
    shell.keep(&s, &response, &f);
    Ok(axum::Json(response).into_response())
}

/// The request fields the Responses API names otherwise than chat completions (errors from
/// generating name the field as the client sent it).
const FIELDS: &[(&str, &str)] = &[("max_tokens", "max_output_tokens"), ("response_format", "text.format")];

/// `GET /v1/responses/{id}`.
pub(super) async fn get(State(s): Shared, Path(id): Path<String>) -> Result<Response, ServeError> {
    let stored = s.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(stored.response.clone()).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(State(s): Shared, Path(id): Path<String>) -> Result<Response, ServeError> {
    if !s.responses.delete(&id) {
        return Err(not_found(&id));
    }
    Ok(axum::Json(ResponseDeleted { id, object: "response".into(), deleted: true }).into_response())
}

fn not_found(id: &str) -> ServeError {
    ServeError::UnknownResponse(format!(
        "no stored response {id:?}: it was made with store: false, deleted, or pushed out of the store \
         (stored_responses in the configuration, and the memory budget, bound it)"
    ))
}

/// The conversation the request continues, without its instructions: the stored response's
/// (`previous_response_id`), then the request's input.
fn conversation(s: &Scheduler, request: &ResponsesRequest) -> Result<Vec<ChatMessage>, ServeError> {
    let mut out = match &request.previous_response_id {
        None => Vec::new(),
        Some(id) => match s.responses.get(id) {
            Some(stored) => stored.conversation.clone(),
            None => {
                return Err(ServeError::invalid(
                    "previous_response_id",
                    format!(
                        "previous response {id:?} is not stored (store: false, deleted, or pushed out of the store)"
                    ),
                ));
            }
        },
    };
    let items = match &request.input {
        ResponsesInput::Text(text) => vec![InputItem::Message {
            role: "user".into(),
            content: pocket_api::responses::MessageContent::Text(text.clone()),
        }],
        ResponsesInput::Items(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| InputItem::from_value(i, v.clone()).map_err(|e| ServeError::invalid("input", e)))
            .collect::<Result<_, _>>()?,
    };
    if items.is_empty() {
        return Err(ServeError::invalid("input", "input is empty; send text or at least one item"));
    }
    for (i, item) in items.into_iter().enumerate() {
        match item {
            InputItem::Message { role, content } => {
                let role = match role.as_str() {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "system" | "developer" => Role::System,
                    other => {
                        return Err(ServeError::invalid(
                            "input",
                            format!("input[{i}].role is {other:?}: user, assistant, system or developer"),
                        ));
                    }
                };
                out.push(ChatMessage::new(role, content.text()));
            }
            InputItem::FunctionCall { call_id, name, arguments } => {
                let call = ToolCall {
                    id: call_id,
                    kind: "function".into(),
                    function: FunctionCall { name, arguments },
                };
                // Calls that follow an assistant's turn are that turn's.
                match out.last_mut() {
                    Some(last) if last.role == Role::Assistant => last.tool_calls.push(call),
                    _ => {
                        let mut turn = ChatMessage::new(Role::Assistant, String::new());
                        turn.tool_calls.push(call);
                        out.push(turn);
                    }
                }
            }
            InputItem::FunctionCallOutput { call_id, output } => {
                let name = out
                    .iter()
                    .flat_map(|m| &m.tool_calls)
                    .find(|c| c.id == call_id)
                    .map(|c| c.function.name.clone());
                let mut result = ChatMessage::new(Role::Tool, output.text());
                result.tool_call_id = Some(call_id);
                result.name = name;
                out.push(result);
            }
            // Thinking is not shown to the model again (as chat templates drop it).
            InputItem::Reasoning {} => {}
        }
    }
    Ok(out)
}

fn options(request: &ResponsesRequest) -> Result<JobOptions, ServeError> {
    let mut sampling = SamplingConfig::default();
    if let Some(t) = request.temperature {
        sampling.temperature = t;
    }
    if let Some(p) = request.top_p {
        sampling.top_p = p;
    }
    if let Some(seed) = request.seed {
        sampling.seed = seed;
    }
    let grammar = match request.text.as_ref().and_then(|t| t.format.as_ref()) {
        None | Some(TextFormat::Text) => None,
        Some(TextFormat::JsonObject) => Some(Grammar::JsonObject),
        Some(TextFormat::JsonSchema { schema, strict, .. }) => {
            Some(Grammar::JsonSchema { schema: schema.clone(), strict: strict.unwrap_or(false) })
        }
    };
    let mut template_kwargs = serde_json::Map::new();
    if let Some(effort) = request.reasoning.as_ref().and_then(|r| r.get("effort")).and_then(Value::as_str) {
        super::openai::thinking_effort("reasoning", effort, &mut template_kwargs)?;
    }
    Ok(JobOptions {
        template_kwargs,
        max_tokens: request.max_output_tokens,
        sampling,
        cache_key: request.prompt_cache_key.clone().or_else(|| request.user.clone()),
        grammar,
        tools: tools(request)?,
        ..JobOptions::default()
    })
}

/// The request's function tools in OpenAI's chat shape, and its `tool_choice`.
fn tools(request: &ResponsesRequest) -> Result<Tools, ServeError> {
    let mut tools = Vec::new();
    for (i, t) in request.tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ServeError::invalid(
                "tools",
                format!("tools[{i}] is of type {:?}: pocketd has function tools only", t.kind),
            ));
        }
        tools.push(json!({"type": "function", "function": {
            "name": t.name, "description": t.description.clone().unwrap_or_default(), "parameters": t.parameters,
        }}));
    }
    let choice = match &request.tool_choice {
        None => ToolChoice::Auto,
        Some(c) => {
            match (c.as_str(), c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
                (Some("auto"), ..) => ToolChoice::Auto,
                (Some("none"), ..) => ToolChoice::None,
                (Some("required"), ..) => ToolChoice::Required,
                (None, Some("function"), Some(name)) => ToolChoice::Function(name.to_owned()),
                _ => {
                    return Err(ServeError::invalid(
                        "tool_choice",
                        "tool_choice is \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": …}",
                    ));
                }
            }
        }
    };
    Ok(Tools { tools, choice, parallel: request.parallel_tool_calls.unwrap_or(true) })
}

/// The response's `status`; a cancelled answer is an error.
fn status_of(f: &Finished) -> Result<&'static str, ServeError> {
    match f.finish_reason {
        FinishReason::Length => Ok("incomplete"),
        FinishReason::Stop | FinishReason::ToolCalls => Ok("completed"),
        FinishReason::Cancelled => Err(ServeError::Cancelled),
    }
}

fn message_item(response: &str, text: String, status: &str) -> OutputItem {
    OutputItem::Message {
        id: format!("msg_{}", response.trim_start_matches("resp_")),
        status: status.into(),
        role: "assistant".into(),
        content: vec![OutputText::new(text)],
    }
}

fn reasoning_item(response: &str, text: String) -> OutputItem {
    OutputItem::Reasoning {
        id: format!("rs_{}", response.trim_start_matches("resp_")),
        summary: Vec::new(),
        content: vec![ReasoningText::new(text)],
    }
}

fn call_item(response: &str, index: usize, call: &ToolCall, status: &str) -> OutputItem {
    OutputItem::FunctionCall {
        id: format!("fc_{}_{index}", response.trim_start_matches("resp_")),
        call_id: call.id.clone(),
        name: call.function.name.clone(),
        arguments: call.function.arguments.clone(),
        status: status.into(),
    }
}

/// The answer as items: a thinking model's thinking, its text as a message (left out when it
/// only calls tools), then one `function_call` per call.
fn output_items(
    response: &str,
    reasoning: Option<&str>,
    content: &str,
    calls: &[ToolCall],
    status: &str,
) -> Vec<OutputItem> {
    let thinking = reasoning.map(|t| reasoning_item(response, t.to_owned()));
    let text =
        (!content.is_empty() || calls.is_empty()).then(|| message_item(response, content.to_owned(), status));
    thinking
        .into_iter()
        .chain(text)
        .chain(calls.iter().enumerate().map(|(i, c)| call_item(response, i, c, "completed")))
        .collect()
}

/// What a response says besides its output, known at the start.
struct Shell {
    id: String,
    created_at: u64,
    model: String,
    temperature: f32,
    top_p: f32,
    request: ResponsesRequest,
    conversation: Vec<ChatMessage>,
}

impl Shell {
    fn response(
        &self,
        status: &str,
        output: Vec<OutputItem>,
        usage: Option<ResponsesUsage>,
    ) -> ResponseObject {
        let r = &self.request;
        let text_format = r.text.as_ref().and_then(|t| t.format.clone()).unwrap_or(TextFormat::Text);
        ResponseObject {
            id: self.id.clone(),
            object: "response".into(),
            created_at: self.created_at,
            status: status.into(),
            error: None,
            incomplete_details: (status == "incomplete").then(|| json!({"reason": "max_output_tokens"})),
            instructions: r.instructions.clone(),
            max_output_tokens: r.max_output_tokens,
            model: self.model.clone(),
            output,
            parallel_tool_calls: r.parallel_tool_calls.unwrap_or(true),
            previous_response_id: r.previous_response_id.clone(),
            reasoning: json!({"effort": null, "summary": null}),
            store: r.store.unwrap_or(true),
            temperature: self.temperature,
            text: json!({"format": text_format}),
            tool_choice: r.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            tools: r.tools.clone(),
            top_p: self.top_p,
            truncation: r.truncation.clone().unwrap_or_else(|| "disabled".into()),
            usage,
            user: r.user.clone(),
            metadata: r.metadata.clone().unwrap_or_else(|| json!({})),
        }
    }

    /// Keep the response (unless `store: false`) with its conversation and answer.
    fn keep(self, s: &Scheduler, response: &ResponseObject, f: &Finished) {
        if !response.store {
            return;
        }
        let mut conversation = self.conversation;
        let mut answer = ChatMessage::new(Role::Assistant, f.content.clone());
        answer.tool_calls = f.tool_calls.clone();
        conversation.push(answer);
        s.responses.put(response.clone(), conversation);
    }
}

/// A stream's state: the generation, the events ready to go, and what was sent.
struct EventStream {
    scheduler: Arc<Scheduler>,
    running: Running,
    shell: Option<Shell>,
    ready: VecDeque<Event>,
    sequence: u64,
    /// Text held back while it may be a tool call.
    held: HeldText,
    /// The items done, in order (the response's `output`).
    output: Vec<OutputItem>,
    /// The thinking sent so far, while its item is open.
    thinking: Option<String>,
    /// The message's text sent so far (`None` until the message is opened).
    text: Option<String>,
    over: bool,
}

impl EventStream {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.ready.push_back(Event::default().event(kind).data(data.to_string()));
    }

    fn id(&self) -> String {
        self.shell.as_ref().map(|s| s.id.clone()).unwrap_or_default()
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.id().trim_start_matches("resp_"))
    }

    /// The index the open item has (the items done come before it).
    fn index(&self) -> usize {
        self.output.len()
    }

    fn send_thinking(&mut self, delta: String) {
        let (item_id, index) = (self.item_id("rs"), self.index());
        if self.thinking.is_none() {
            let item = json!({"type": "reasoning", "id": item_id, "summary": [], "content": []});
            self.push("response.output_item.added", json!({"output_index": index, "item": item}));
            self.thinking = Some(String::new());
        }
        if let Some(thinking) = self.thinking.as_mut() {
            thinking.push_str(&delta);
        }
        self.push(
            "response.reasoning_text.delta",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
        );
    }

    fn close_thinking(&mut self) {
        let Some(text) = self.thinking.take() else { return };
        let (item_id, index) = (self.item_id("rs"), self.index());
        self.push(
            "response.reasoning_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
        );
        let item = reasoning_item(&self.id(), text);
        self.push("response.output_item.done", json!({"output_index": index, "item": item}));
        self.output.push(item);
    }

    fn send_text(&mut self, delta: String) {
        self.close_thinking();
        let (item_id, index) = (self.item_id("msg"), self.index());
        if self.text.is_none() {
            let item = message_item(&self.id(), String::new(), "in_progress");
            self.push("response.output_item.added", json!({"output_index": index, "item": item}));
            let part = OutputText::new(String::new());
            self.push(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            );
            self.text = Some(String::new());
        }
        if delta.is_empty() {
            return;
        }
        if let Some(text) = self.text.as_mut() {
            text.push_str(&delta);
        }
        self.push(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
        );
    }

    /// The end: held text, the thinking and the message closed, the calls, then
    /// `response.completed` (or `incomplete`), and the response kept.
    fn end(&mut self, f: &Finished) {
        let status = match status_of(f) {
            Ok(status) => status,
            Err(e) => return self.fail(&e),
        };
        if self.held.holding() && !f.content.is_empty() {
            self.send_text(f.content.clone());
        }
        if self.text.is_none() && f.tool_calls.is_empty() {
            self.send_text(String::new());
        }
        self.close_thinking();
        if let Some(text) = self.text.take() {
            let (item_id, index) = (self.item_id("msg"), self.index());
            let part = OutputText::new(text.clone());
            self.push(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            );
            self.push(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            );
            let item = message_item(&self.id(), text, status);
            self.push("response.output_item.done", json!({"output_index": index, "item": item}));
            self.output.push(item);
        }
        for (i, call) in f.tool_calls.iter().enumerate() {
            let index = self.index();
            let mut item = call_item(&self.id(), i, call, "in_progress");
            if let OutputItem::FunctionCall { arguments, .. } = &mut item {
                arguments.clear();
            }
            self.push("response.output_item.added", json!({"output_index": index, "item": item}));
            let done = call_item(&self.id(), i, call, "completed");
            let OutputItem::FunctionCall { id, arguments, name, .. } = &done else { unreachable!() };
            self.push(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": arguments}),
            );
            self.push(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
            );
            self.push("response.output_item.done", json!({"output_index": index, "item": done}));
            self.output.push(done);
        }
        let Some(shell) = self.shell.take() else { return };
        let output = std::mem::take(&mut self.output);
        let response = shell.response(status, output, Some(ResponsesUsage::from(&f.usage)));
        let kind = if status == "completed" { "response.completed" } else { "response.incomplete" };
        self.push(kind, json!({"response": response}));
        shell.keep(&self.scheduler, &response, f);
    }

    fn fail(&mut self, e: &ServeError) {
        let Some(shell) = self.shell.take() else { return };
        let mut response = shell.response("failed", Vec::new(), None);
        response.error = Some(json!({"code": e.openai_code(), "message": e.to_string()}));
        self.push("response.failed", json!({"response": response}));
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
                        self.send_text(text);
                    }
                }
                Some(Piece::Reasoning(thinking)) => self.send_thinking(thinking),
                Some(Piece::Done(f)) => {
                    self.end(&f);
                    self.over = true;
                }
                Some(Piece::Failed(e)) => {
                    self.fail(&e);
                    self.over = true;
                }
                None => self.over = true,
            }
        }
    }
}

/// The Responses API's stream: `response.created`, `response.in_progress`, the output items
/// (`output_item.added`, `content_part.added`, `output_text.delta`s, … `output_item.done`;
/// a function call's `function_call_arguments.delta` and `.done`), then `response.completed`
/// (`response.incomplete` when cut by `max_output_tokens`, `response.failed` on an error).
fn events(scheduler: Arc<Scheduler>, running: Running, shell: Shell) -> Response {
    let mut state = EventStream {
        scheduler,
        held: HeldText::new(running.started.tools),
        running,
        shell: None,
        ready: VecDeque::new(),
        sequence: 0,
        output: Vec::new(),
        thinking: None,
        text: None,
        over: false,
    };
    let opening = shell.response("in_progress", Vec::new(), None);
    state.shell = Some(shell);
    state.push("response.created", json!({"response": opening}));
    state.push("response.in_progress", json!({"response": opening}));
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let e = st.next().await?;
        Some((Ok::<_, Infallible>(e), st))
    });
    sse_response(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            kind: "function".into(),
            function: FunctionCall { name: "f".into(), arguments: "{}".into() },
        }
    }

    #[test]
    fn an_answer_that_only_calls_has_no_message_and_an_empty_one_has_one() {
        let items = output_items("resp_x-1", None, "", &[call("c1"), call("c2")], "completed");
        assert_eq!(items.len(), 2);
        assert!(
            matches!(&items[1], OutputItem::FunctionCall { id, call_id, .. } if id == "fc_x-1_1" && call_id == "c2")
        );
        let items = output_items("resp_x-1", None, "", &[], "incomplete");
        assert!(
            matches!(&items[..], [OutputItem::Message { id, status, .. }] if id == "msg_x-1" && status == "incomplete")
        );
    }
}
