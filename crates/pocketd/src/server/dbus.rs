//! D-Bus: `org.pocketd.Pocketd1` at `/org/pocketd/Pocketd1`, on the system or session bus.
//!
//! - `Generate(s model, s prompt, a{sv} options) -> (s text, a{sv} stats)` blocks until the
//!   text is complete.
//! - `Start(s model, s prompt, a{sv} options) -> o job` returns at once with a job object
//!   (`/org/pocketd/Pocketd1/jobs/N`, interface `org.pocketd.Pocketd1.Job`) whose `Token(s)`
//!   signals stream the text and whose `Finished(s text, a{sv} stats)` or
//!   `Failed(s name, s message)` ends it. Subscribe before calling `Start` — a match on
//!   `path_namespace='/org/pocketd/Pocketd1/jobs'` — or read the job's `Text` and `State`
//!   properties afterwards; a job object stays for a minute after it ends.
//! - `Cancel(o job)`, `ListModels() -> a(sbt)`, `LoadModel(s) -> t`, `UnloadModel(s)`.
//! - Properties `Models`, `LoadedModels`, `BudgetBytes`, `UsedBytes`, `ActiveSessions` and
//!   `Version`, with `PropertiesChanged` when they change.
//! - A caller may have `dbus_jobs_per_caller` `Generate` and `Start` calls running or queued
//!   (more: `org.pocketd.Error.QueueFull`); a caller that leaves the bus has its jobs cancelled.
//!
//! An empty model name means the default model. Options: `max_tokens` (any integer type),
//! `temperature`, `top_p` (double), `top_k`, `seed` (integers), `stop` (string or array of
//! strings), `spec`, `draft_model`, `kv` (strings), `chat` (boolean, default true: the prompt
//! is a user message in the model's chat template), `system` (string, with `chat`),
//! `history` (`a(ss)`: the earlier messages of the conversation as (role, content), roles
//! `system`, `user`, `assistant`), `cache_key` (string: only conversations parked under the
//! same key are continued) and `cache_prompt` (boolean, default true: continue a parked
//! conversation sharing the prompt's beginning and park this one; `cached_tokens` in the stats
//! says how many tokens that saved), `presence_penalty`, `frequency_penalty`,
//! `repetition_penalty` (double).
//!
//! Structured output: `json_schema` (a JSON schema, as a string; enforced strictly),
//! `json_object` (boolean: any JSON object), `grammar` (a Lark grammar), `tools` (OpenAI tool
//! definitions as a JSON string) and `tool_choice` (`auto`, `none`, `required` or a function's
//! name). The text returned is then the JSON; a tool call is in the stats as `tool_calls`
//! (OpenAI's shape, as a JSON string) with `content` the text around it; `grammar_ms` is the
//! time compiling the grammar took. `history` may hold `tool` messages (tool results).
//! Errors are `org.pocketd.Error.{InvalidArgument, UnknownModel, OverBudget, QueueFull,
//! TooLarge, Busy, ShuttingDown, Unavailable, Cancelled, Failed}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pocket_core::ChatMessage;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, ObjectPath, OwnedObjectPath, OwnedVariant, Str, Variant};

use super::bus_callers::{self, Callers, Slot};
use super::config::Bus;
use super::error::ServeError;
use super::job::{Canceller, Finished, Input, Job, JobOptions, Piece, Running, tool_choice};
use super::scheduler::Scheduler;
use pocket_runtime::grammar::Grammar;
use pocket_runtime::tools::ToolChoice;

/// The well-known name.
pub const BUS_NAME: &str = "org.pocketd.Pocketd1";
/// The main object.
pub const OBJECT_PATH: &str = "/org/pocketd/Pocketd1";
/// Where job objects live.
pub const JOBS_PATH: &str = "/org/pocketd/Pocketd1/jobs";
/// How long a job object stays after its end, for late readers of `Text` and `State`.
const JOB_LINGER: Duration = Duration::from_secs(60);

/// The errors callers see, named `org.pocketd.Error.*`.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.pocketd.Error")]
#[allow(missing_docs)]
pub enum PocketError {
    #[zbus(error)]
    ZBus(zbus::Error),
    InvalidArgument(String),
    UnknownModel(String),
    OverBudget(String),
    QueueFull(String),
    TooLarge(String),
    Busy(String),
    ShuttingDown(String),
    Unavailable(String),
    Cancelled(String),
    Failed(String),
}

impl From<ServeError> for PocketError {
    fn from(e: ServeError) -> Self {
        let m = e.to_string();
        match e {
            ServeError::InvalidArgument { .. } => PocketError::InvalidArgument(m),
            ServeError::UnknownModel(_) => PocketError::UnknownModel(m),
            // Not a D-Bus error: D-Bus has no paths to get wrong.
            ServeError::UnknownEndpoint(_) | ServeError::UnknownResponse(_) => {
                PocketError::InvalidArgument(m)
            }
            ServeError::OverBudget { .. } => PocketError::OverBudget(m),
            ServeError::QueueFull(_) | ServeError::CallerLimit(_) => PocketError::QueueFull(m),
            ServeError::ContextLength(_) | ServeError::TooLarge(_) => PocketError::TooLarge(m),
            ServeError::Busy(_) => PocketError::Busy(m),
            ServeError::ShuttingDown => PocketError::ShuttingDown(m),
            ServeError::Unavailable(_) => PocketError::Unavailable(m),
            ServeError::Cancelled => PocketError::Cancelled(m),
            ServeError::Internal { .. } => PocketError::Failed(m),
        }
    }
}

/// `org.pocketd.Pocketd1`.
pub struct Pocketd {
    scheduler: Arc<Scheduler>,
    callers: Arc<Callers>,
    jobs: Arc<Mutex<HashMap<String, Canceller>>>,
    next_job: AtomicU64,
}

pub(super) type Options = HashMap<String, OwnedVariant>;

fn integer(v: &Variant<'_>) -> Option<i128> {
    Some(match v {
        Variant::U8(x) => i128::from(*x),
        Variant::I16(x) => i128::from(*x),
        Variant::U16(x) => i128::from(*x),
        Variant::I32(x) => i128::from(*x),
        Variant::U32(x) => i128::from(*x),
        Variant::I64(x) => i128::from(*x),
        Variant::U64(x) => i128::from(*x),
        Variant::Variant(inner) => return integer(inner),
        _ => return None,
    })
}

fn string(v: &Variant<'_>) -> Option<String> {
    match v {
        Variant::Str(s) => Some(s.as_str().to_owned()),
        Variant::Variant(inner) => string(inner),
        _ => None,
    }
}

/// Chat messages from an `a(ss)` of (role, content).
fn messages(v: &Variant<'_>) -> Option<Vec<ChatMessage>> {
    let Variant::Array(a) = v else {
        return if let Variant::Variant(inner) = v { messages(inner) } else { None };
    };
    a.inner()
        .iter()
        .map(|item| {
            let Variant::Structure(s) = item else { return None };
            let [role, content] = s.fields() else { return None };
            let role = match string(role)?.as_str() {
                "system" => pocket_core::Role::System,
                "user" => pocket_core::Role::User,
                "assistant" => pocket_core::Role::Assistant,
                "tool" => pocket_core::Role::Tool,
                _ => return None,
            };
            Some(ChatMessage::new(role, string(content)?))
        })
        .collect()
}

fn wrong(key: &str, expected: &str) -> ServeError {
    ServeError::invalid(key, format!("option {key:?} must be {expected}"))
}

/// The job, from a D-Bus call's arguments.
pub(super) fn job(model: &str, prompt: &str, options: &Options, client: String) -> Result<Job, ServeError> {
    let mut o = JobOptions::default();
    let mut conversation = Conversation { chat: true, system: None, history: Vec::new() };
    for (key, value) in options {
        let v: &Variant<'_> = value;
        let known = sampling_option(&mut o, key, v)?
            || output_option(&mut o, key, v)?
            || request_option(&mut o, key, v)?
            || conversation.option(key, v)?;
        if !known {
            return Err(ServeError::invalid(
                key,
                format!(
                    "unknown option {key:?}; known: max_tokens, temperature, top_p, top_k, seed, stop, \
                     presence_penalty, frequency_penalty, repetition_penalty, json_schema, json_object, grammar, \
                     tools, tool_choice, spec, draft_model, kv, chat, system, history, cache_key, cache_prompt, priority"
                ),
            ));
        }
    }
    let input = conversation.input(prompt)?;
    Ok(Job { model: (!model.is_empty()).then(|| model.to_owned()), input, options: o, client })
}

/// How tokens are chosen: `max_tokens`, `stop` and the sampling settings. Whether `key` is one.
fn sampling_option(o: &mut JobOptions, key: &str, v: &Variant<'_>) -> Result<bool, ServeError> {
    match key {
        "max_tokens" => {
            let n = integer(v)
                .filter(|n| (1..=u32::MAX as i128).contains(n))
                .ok_or_else(|| wrong(key, "a positive integer"))?;
            o.max_tokens = Some(n as u32);
        }
        "top_k" => {
            o.sampling.top_k =
                integer(v).filter(|n| *n >= 0).ok_or_else(|| wrong(key, "an integer ≥ 0"))? as usize
        }
        "seed" => {
            o.sampling.seed =
                integer(v).filter(|n| *n >= 0).ok_or_else(|| wrong(key, "an integer ≥ 0"))? as u64
        }
        "temperature" | "top_p" | "presence_penalty" | "frequency_penalty" | "repetition_penalty" => {
            let x = match v {
                Variant::F64(x) => *x,
                other => integer(other).ok_or_else(|| wrong(key, "a double"))? as f64,
            } as f32;
            let field = match key {
                "temperature" => &mut o.sampling.temperature,
                "top_p" => &mut o.sampling.top_p,
                "presence_penalty" => &mut o.sampling.presence_penalty,
                "frequency_penalty" => &mut o.sampling.frequency_penalty,
                _ => &mut o.sampling.repetition_penalty,
            };
            *field = x;
        }
        "stop" => {
            o.stop = match v {
                Variant::Array(a) => a.inner().iter().map(string).collect::<Option<Vec<_>>>(),
                other => string(other).map(|s| vec![s]),
            }
            .ok_or_else(|| wrong(key, "a string or an array of strings"))?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// What the answer must be: a JSON schema, any JSON object, a grammar, tools. Whether `key`
/// is one.
fn output_option(o: &mut JobOptions, key: &str, v: &Variant<'_>) -> Result<bool, ServeError> {
    match key {
        "json_schema" => {
            let text = string(v).ok_or_else(|| wrong(key, "a string holding a JSON schema"))?;
            let schema = serde_json::from_str(&text)
                .map_err(|e| ServeError::invalid(key, format!("json_schema is not JSON: {e}")))?;
            // Like OpenAI's strict mode: a keyword that cannot be enforced is an error.
            o.grammar = Some(Grammar::JsonSchema { schema, strict: true });
        }
        "json_object" => {
            if matches!(v, Variant::Bool(true)) {
                o.grammar = Some(Grammar::JsonObject);
            } else if !matches!(v, Variant::Bool(false)) {
                return Err(wrong(key, "a boolean"));
            }
        }
        "grammar" => o.grammar = Some(Grammar::Lark(string(v).ok_or_else(|| wrong(key, "a string"))?)),
        "tools" => {
            let text = string(v).ok_or_else(|| wrong(key, "a string holding a JSON array of tools"))?;
            o.tools.tools = serde_json::from_str(&text).map_err(|e| {
                ServeError::invalid(key, format!("tools is not a JSON array of OpenAI tool definitions: {e}"))
            })?;
        }
        "tool_choice" => {
            let text = string(v).ok_or_else(|| wrong(key, "a string"))?;
            o.tools.choice = match text.as_str() {
                "none" | "auto" | "required" => tool_choice(&serde_json::Value::from(text))?,
                name => ToolChoice::Function(name.to_owned()),
            };
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// How the request runs: speculation, KV type, the prompt cache, its priority. Whether
/// `key` is one.
fn request_option(o: &mut JobOptions, key: &str, v: &Variant<'_>) -> Result<bool, ServeError> {
    let parsed = |e: pocket_core::Error| ServeError::invalid(key, e.to_string());
    match key {
        "priority" => {
            let p = integer(v)
                .filter(|n| (i32::MIN as i128..=i32::MAX as i128).contains(n))
                .ok_or_else(|| wrong(key, "an integer"))? as i32;
            super::job::check_priority(p)?;
            o.priority = p;
        }
        "spec" => o.spec = Some(string(v).ok_or_else(|| wrong(key, "a string"))?.parse().map_err(parsed)?),
        "kv" => o.kv = Some(string(v).ok_or_else(|| wrong(key, "a string"))?.parse().map_err(parsed)?),
        "draft_model" => o.draft_model = Some(string(v).ok_or_else(|| wrong(key, "a string"))?),
        "cache_key" => o.cache_key = Some(string(v).ok_or_else(|| wrong(key, "a string"))?),
        "cache_prompt" => {
            o.cache_prompt = match v {
                Variant::Bool(b) => *b,
                _ => return Err(wrong(key, "a boolean")),
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// What the prompt is part of: a chat (with a system message and earlier turns) or plain text.
struct Conversation {
    chat: bool,
    system: Option<String>,
    history: Vec<ChatMessage>,
}

impl Conversation {
    /// Take the option `key` if it is one of the conversation's; whether it is.
    fn option(&mut self, key: &str, v: &Variant<'_>) -> Result<bool, ServeError> {
        match key {
            "chat" => {
                self.chat = match v {
                    Variant::Bool(b) => *b,
                    _ => return Err(wrong(key, "a boolean")),
                }
            }
            "system" => self.system = Some(string(v).ok_or_else(|| wrong(key, "a string"))?),
            "history" => {
                self.history = messages(v).ok_or_else(|| {
                    wrong(
                        key,
                        "an array of (role, content) pairs, a(ss), whose roles are system, user, assistant or tool",
                    )
                })?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The input: `prompt` after the conversation so far, or `prompt` alone as text.
    fn input(self, prompt: &str) -> Result<Input, ServeError> {
        if !self.history.is_empty() && !self.chat {
            return Err(ServeError::invalid("history", "history is for chat (chat = true)"));
        }
        if !self.chat {
            return Ok(Input::Text(prompt.to_owned()));
        }
        let mut messages = Vec::new();
        if let Some(s) = self.system {
            messages.push(ChatMessage::new(pocket_core::Role::System, s));
        }
        messages.extend(self.history);
        messages.push(ChatMessage::new(pocket_core::Role::User, prompt.to_owned()));
        Ok(Input::Chat(messages))
    }
}

fn stats(f: &Finished) -> HashMap<String, OwnedVariant> {
    let mut m = HashMap::new();
    m.insert("finish_reason".into(), OwnedVariant::from(Str::from(f.finish_reason.as_str())));
    m.insert("prompt_tokens".into(), OwnedVariant::from(u64::from(f.usage.prompt_tokens)));
    m.insert("completion_tokens".into(), OwnedVariant::from(u64::from(f.usage.completion_tokens)));
    m.insert("prefill_ms".into(), OwnedVariant::from(f.timings.prefill_ms));
    m.insert("cached_tokens".into(), OwnedVariant::from(f.timings.cached_tokens));
    m.insert("decode_tok_per_s".into(), OwnedVariant::from(f.timings.decode_tok_per_s));
    m.insert("threads".into(), OwnedVariant::from(f.timings.threads));
    m.insert("drafted".into(), OwnedVariant::from(f.timings.drafted));
    m.insert("accepted".into(), OwnedVariant::from(f.timings.accepted));
    m.insert("queued_ms".into(), OwnedVariant::from(f.timings.queued_ms));
    m.insert("peak_bytes".into(), OwnedVariant::from(f.peak_bytes));
    if let Some(d) = &f.timings.drafter {
        m.insert("drafter".into(), OwnedVariant::from(Str::from(d.clone())));
    }
    m.insert("grammar_ms".into(), OwnedVariant::from(f.timings.grammar_ms));
    if !f.tool_calls.is_empty() {
        // OpenAI's shape, as JSON: [{"id", "type": "function", "function": {"name", "arguments"}}].
        let calls = serde_json::to_string(&f.tool_calls).unwrap_or_default();
        m.insert("tool_calls".into(), OwnedVariant::from(Str::from(calls)));
        m.insert("content".into(), OwnedVariant::from(Str::from(f.content.clone())));
    }
    if let Some(reasoning) = &f.reasoning {
        // A thinking model: its thinking, and the answer without it.
        m.insert("reasoning".into(), OwnedVariant::from(Str::from(reasoning.clone())));
        m.insert("content".into(), OwnedVariant::from(Str::from(f.content.clone())));
    }
    m
}

fn caller(header: &zbus::message::Header<'_>) -> String {
    format!("dbus {}", header.sender().map_or_else(|| "?".to_owned(), |s| s.to_string()))
}

impl Pocketd {
    /// Take a job slot for the caller (refused past `dbus_jobs_per_caller`), then submit.
    async fn submit(
        &self,
        job: Job,
        header: &zbus::message::Header<'_>,
        connection: &Connection,
    ) -> Result<(Running, Option<Slot>), PocketError> {
        let slot = header.sender().map(|s| self.callers.enter(s.as_str())).transpose()?;
        let running = self.scheduler.submit(job).await?;
        if let Some(slot) = &slot {
            slot.attach(running.canceller());
            if !bus_callers::still_there(connection, slot.caller()).await {
                running.canceller().cancel();
            }
        }
        Ok((running, slot))
    }
}

#[zbus::interface(name = "org.pocketd.Pocketd1")]
impl Pocketd {
    /// Generate text and return it with statistics when it is complete.
    #[zbus(out_args("text", "stats"))]
    async fn generate(
        &self,
        model: &str,
        prompt: &str,
        options: Options,
        #[zbus(header)] header: zbus::message::Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<(String, HashMap<String, OwnedVariant>), PocketError> {
        let job = job(model, prompt, &options, caller(&header))?;
        let (running, _slot) = self.submit(job, &header, connection).await?;
        let f = running.collect().await?;
        Ok((f.text.clone(), stats(&f)))
    }

    /// Start generating; returns the job object whose signals stream the text.
    #[zbus(out_args("job"))]
    async fn start(
        &self,
        model: &str,
        prompt: &str,
        options: Options,
        #[zbus(header)] header: zbus::message::Header<'_>,
        #[zbus(connection)] connection: &Connection,
    ) -> Result<OwnedObjectPath, PocketError> {
        let job = job(model, prompt, &options, caller(&header))?;
        let (running, slot) = self.submit(job, &header, connection).await?;
        let n = self.next_job.fetch_add(1, Ordering::Relaxed);
        let path = format!("{JOBS_PATH}/{n}");
        let state = Arc::new(Mutex::new(JobProgress { state: JobState::Running, text: String::new() }));
        let object = JobObject {
            state: state.clone(),
            cancel: running.canceller(),
            model: running.started.model.clone(),
        };
        connection.object_server().at(path.as_str(), object).await?;
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone(), running.canceller());
        let (connection, jobs, p) = (connection.clone(), self.jobs.clone(), path.clone());
        tokio::spawn(async move {
            if let Err(e) = stream_job(&connection, &p, running, &state).await {
                tracing::warn!(job = %p, "D-Bus job: {e}");
            }
            drop(slot);
            jobs.lock().unwrap_or_else(|e| e.into_inner()).remove(&p);
            tokio::time::sleep(JOB_LINGER).await;
            let _ = connection.object_server().remove::<JobObject, _>(p.as_str()).await;
        });
        OwnedObjectPath::try_from(path).map_err(|e| PocketError::Failed(e.to_string()))
    }

    /// Cancel a job started with `Start`.
    async fn cancel(&self, job: ObjectPath<'_>) -> Result<(), PocketError> {
        match self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get(job.as_str()) {
            Some(c) => {
                c.cancel();
                Ok(())
            }
            None => Err(PocketError::InvalidArgument(format!("no running job {}", job.as_str()))),
        }
    }

    /// Embed texts on an embedding model ("" is the default model): one vector per text, in
    /// order; a text longer than the model reads is refused (.InvalidArgument) unless
    /// `truncate`, when it is cut to the model's length.
    #[zbus(out_args("vectors"))]
    async fn embed(
        &self,
        model: &str,
        texts: Vec<String>,
        truncate: bool,
    ) -> Result<Vec<Vec<f64>>, PocketError> {
        if self.scheduler.is_stopping() {
            return Err(ServeError::ShuttingDown.into());
        }
        let model = (!model.is_empty()).then_some(model);
        let input = pocket_runtime::embed::EmbedInput::Texts(texts);
        let (_, embedded) = self.scheduler.embed(model, input, truncate, None).await?;
        Ok(embedded.vectors.into_iter().map(|v| v.into_iter().map(f64::from).collect()).collect())
    }

    /// The models that can be served: name, whether loaded, bytes in the budget.
    #[zbus(out_args("models"))]
    async fn list_models(&self) -> Result<Vec<(String, bool, u64)>, PocketError> {
        let loaded = self.scheduler.registry.loaded();
        Ok(self
            .scheduler
            .registry
            .available()?
            .into_iter()
            .map(|a| {
                let bytes = loaded.iter().find(|(m, _)| m.name == a.name).map(|(m, _)| m.bytes());
                (a.name, bytes.is_some(), bytes.unwrap_or(0))
            })
            .collect())
    }

    /// Load a model now; returns the bytes its weights take in the budget.
    #[zbus(out_args("bytes"))]
    async fn load_model(&self, name: &str) -> Result<u64, PocketError> {
        if self.scheduler.is_stopping() {
            return Err(ServeError::ShuttingDown.into());
        }
        let m = self.scheduler.registry.get(name).await?;
        self.scheduler.registry.release(&m.name);
        Ok(m.bytes())
    }

    /// Forget the earlier answers kept for drafting later ones: those given under `key` (a
    /// request's `cache_key`), or all of them when `key` is empty. Returns how many histories
    /// were dropped.
    #[zbus(out_args("histories"))]
    async fn clear_cache(&self, key: &str) -> Result<u32, PocketError> {
        let cleared = self.scheduler.histories().clear((!key.is_empty()).then_some(key));
        self.scheduler.registry.changed();
        Ok(u32::try_from(cleared).unwrap_or(u32::MAX))
    }

    /// Unload a model no request is using.
    async fn unload_model(&self, name: &str) -> Result<(), PocketError> {
        self.scheduler.registry.unload(name)?;
        Ok(())
    }

    /// The models that can be served.
    #[zbus(property)]
    fn models(&self) -> Vec<String> {
        self.scheduler
            .registry
            .available()
            .map(|v| v.into_iter().map(|a| a.name).collect())
            .unwrap_or_default()
    }

    /// The models in memory.
    #[zbus(property)]
    fn loaded_models(&self) -> Vec<String> {
        self.scheduler.registry.loaded().into_iter().map(|(m, _)| m.name.clone()).collect()
    }

    /// The memory budget in bytes.
    #[zbus(property)]
    fn budget_bytes(&self) -> u64 {
        self.scheduler.ledger().budget()
    }

    /// Bytes reserved in the budget now.
    #[zbus(property)]
    fn used_bytes(&self) -> u64 {
        self.scheduler.ledger().used()
    }

    /// Requests generating now.
    #[zbus(property)]
    fn active_sessions(&self) -> u32 {
        self.scheduler.active() as u32
    }

    /// pocketd's version.
    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_owned()
    }
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    Running,
    Finished,
    Failed,
    Cancelled,
}

impl JobState {
    /// The name of the `State` property.
    fn name(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

struct JobProgress {
    state: JobState,
    text: String,
}

/// `org.pocketd.Pocketd1.Job`: one generation started with `Start`.
pub struct JobObject {
    state: Arc<Mutex<JobProgress>>,
    cancel: Canceller,
    model: String,
}

#[zbus::interface(name = "org.pocketd.Pocketd1.Job")]
impl JobObject {
    /// Stop generating; `Failed` follows with `org.pocketd.Error.Cancelled`.
    async fn cancel(&self) {
        self.cancel.cancel();
    }

    /// `running`, `finished`, `failed` or `cancelled`.
    #[zbus(property)]
    fn state(&self) -> String {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).state.name().to_owned()
    }

    /// The text so far.
    #[zbus(property(emits_changed_signal = "false"))]
    fn text(&self) -> String {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).text.clone()
    }

    /// The model generating.
    #[zbus(property(emits_changed_signal = "const"))]
    fn model(&self) -> String {
        self.model.clone()
    }

    /// More text.
    #[zbus(signal)]
    async fn token(emitter: &SignalEmitter<'_>, text: &str) -> zbus::Result<()>;

    /// The end: the whole text and statistics.
    #[zbus(signal)]
    async fn finished(
        emitter: &SignalEmitter<'_>,
        text: &str,
        stats: HashMap<String, OwnedVariant>,
    ) -> zbus::Result<()>;

    /// A failure: the D-Bus error name and the message.
    #[zbus(signal)]
    async fn failed(emitter: &SignalEmitter<'_>, error: &str, message: &str) -> zbus::Result<()>;
}

async fn stream_job(
    connection: &Connection,
    path: &str,
    mut running: Running,
    state: &Mutex<JobProgress>,
) -> zbus::Result<()> {
    let emitter = SignalEmitter::new(connection, path.to_owned())?;
    let set = |s: JobState| state.lock().unwrap_or_else(|e| e.into_inner()).state = s;
    while let Some(piece) = running.pieces.recv().await {
        match piece {
            Piece::Text { text: t, .. } => {
                state.lock().unwrap_or_else(|e| e.into_inner()).text.push_str(&t);
                JobObject::token(&emitter, &t).await?;
            }
            // The thinking comes whole with the result (`reasoning`), not as tokens.
            Piece::Reasoning(_) => {}
            Piece::Done(f) => {
                let cancelled = f.finish_reason == pocket_api::FinishReason::Cancelled;
                set(if cancelled { JobState::Cancelled } else { JobState::Finished });
                if cancelled {
                    let e = ServeError::Cancelled;
                    JobObject::failed(&emitter, &format!("org.pocketd.Error.{}", e.name()), &e.to_string())
                        .await?;
                } else {
                    JobObject::finished(&emitter, &f.text, stats(&f)).await?;
                }
                break;
            }
            Piece::Failed(e) => {
                set(JobState::Failed);
                JobObject::failed(&emitter, &format!("org.pocketd.Error.{}", e.name()), &e.to_string())
                    .await?;
                break;
            }
        }
    }
    let iface = connection.object_server().interface::<_, JobObject>(path).await?;
    iface.get().await.state_changed(iface.signal_emitter()).await?;
    Ok(())
}

/// Serve `org.pocketd.Pocketd1` on `bus`; the connection lives as long as the returned value.
pub async fn serve(bus: Bus, scheduler: Arc<Scheduler>) -> anyhow::Result<Option<Connection>> {
    let builder = match bus {
        Bus::None => return Ok(None),
        Bus::System => zbus::connection::Builder::system(),
        Bus::Session => zbus::connection::Builder::session(),
    };
    let callers = Callers::new(scheduler.config().dbus_jobs_per_caller);
    let iface = Pocketd {
        scheduler: scheduler.clone(),
        callers: callers.clone(),
        jobs: Arc::default(),
        next_job: AtomicU64::new(1),
    };
    let connection = builder
        .serve_at(OBJECT_PATH, iface)
        .name(BUS_NAME)
        .build()
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve {BUS_NAME} on the {bus:?} bus: {e}"))?;
    tokio::spawn(watch_properties(connection.clone(), scheduler));
    tokio::spawn(bus_callers::watch(connection.clone(), callers));
    Ok(Some(connection))
}

/// Emit `PropertiesChanged` for the main object's properties when they change (whichever
/// transport changed them), woken by the registry's and scheduler's events.
async fn watch_properties(connection: Connection, scheduler: Arc<Scheduler>) {
    let Ok(iface) = connection.object_server().interface::<_, Pocketd>(OBJECT_PATH).await else { return };
    let snapshot = |s: &Scheduler| {
        let loaded: Vec<String> = s.registry.loaded().into_iter().map(|(m, _)| m.name.clone()).collect();
        (loaded, s.ledger().used(), s.active())
    };
    let mut changes = scheduler.registry.changes.subscribe();
    let mut last = snapshot(&scheduler);
    while changes.changed().await.is_ok() {
        // Events come in bursts (a session ends: its memory, the session count, a parked
        // conversation): one signal per property for the burst.
        tokio::time::sleep(Duration::from_millis(10)).await;
        changes.borrow_and_update();
        let now = snapshot(&scheduler);
        let emitter = iface.signal_emitter();
        let p = iface.get().await;
        let r = async {
            if now.0 != last.0 {
                p.loaded_models_changed(emitter).await?;
            }
            if now.1 != last.1 {
                p.used_bytes_changed(emitter).await?;
            }
            if now.2 != last.2 {
                p.active_sessions_changed(emitter).await?;
            }
            zbus::Result::Ok(())
        }
        .await;
        if let Err(e) = r {
            tracing::debug!("PropertiesChanged: {e}");
        }
        last = now;
    }
}
