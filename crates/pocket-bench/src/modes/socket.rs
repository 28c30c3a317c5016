//! `socket:MODE`: the prompt sent to a running pocketd over HTTP on its Unix socket, as an app
//! would send it, so that the figures include the scheduler, the plan and the transport.

use std::path::Path;
use std::time::Instant;

use pocket_api::client::Client;
use pocket_api::{
    ChatCompletionRequest, CompletionRequest, GenerationOptions, StreamOptions, Timings, Usage,
};
use pocket_core::Threads;
use pocket_core::spec::SpecMode;
use serde::Deserialize;

use super::{PromptRun, RunMode, RunOutput, Runner, RunnerContext};
use crate::workload::PromptInput;
use crate::{Error, Start};

/// Sends each prompt to pocketd — chat messages to `/v1/chat/completions`, text to
/// `/v1/completions` — streamed, greedy, with the mode's `spec` (and `draft_model`), the
/// benchmark's KV type and `return_tokens`, and times it from this side: prefill until the
/// first text arrives, decode from there to the last text.
pub struct SocketRunner {
    name: String,
    spec: SpecMode,
    client: Client,
    model: String,
    draft_model: Option<String>,
    kv: pocket_core::KvType,
    runtime: tokio::runtime::Runtime,
    kv_bytes_per_token: u64,
}

impl SocketRunner {
    /// A runner for `mode` (`spec` its speculation, `draft_model` its draft model's name)
    /// through the pocketd at `socket`.
    pub fn new(
        mode: &RunMode,
        spec: SpecMode,
        draft_model: Option<String>,
        socket: &Path,
        cx: RunnerContext<'_>,
    ) -> Result<Self, Error> {
        let runtime = runtime()?;
        Ok(SocketRunner {
            name: mode.name(),
            spec,
            client: Client::new(socket),
            model: cx.model_name.to_owned(),
            draft_model,
            kv: cx.session.kv,
            runtime,
            kv_bytes_per_token: cx.model.kv_bytes_per_token(cx.session)?,
        })
    }
}

/// The async runtime a socket client is driven on, one thread: the benchmark sends one
/// request at a time.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start an async runtime for the socket: {e}")))
}

impl SocketRunner {
    /// Check that pocketd answers at `socket`, generates with the `threads` setting this
    /// benchmark uses, when given (otherwise the two would not be compared on the same cores), and serves
    /// `model`, loading it. For a cold start the model is unloaded and loaded
    /// again, so that the first measured request is its first since it was loaded.
    pub fn check_daemon(
        socket: &Path,
        model: &str,
        threads: Option<Threads>,
        start: Start,
    ) -> Result<DaemonCheck, Error> {
        let client = Client::new(socket);
        runtime()?.block_on(async {
            let status: pocket_api::Status = client.get("/v1/status").await?;
            // A daemon from before `threads = "auto"` reports only a count.
            let theirs = match &status.cpu {
                Some(cpu) => Some(cpu.threads_setting.clone()),
                None => status.threads.map(|n| n.to_string()),
            };
            if let Some((theirs, threads)) = theirs.zip(threads).filter(|(t, ours)| *t != ours.to_string()) {
                return Err(Error::Invalid(format!(
                    "pocketd at {} runs with threads = {theirs} and this benchmark with {threads}: give --threads \
                     {theirs} (or start pocketd with --threads {threads}) so that both run on the same cores",
                    socket.display()
                )));
            }
            let action = |verb: &str| format!("/v1/models/{model}/{verb}");
            let empty = serde_json::json!({});
            let mut reloaded = None;
            if start == Start::Cold {
                let _: pocket_api::ModelAction = client.post(&action("unload"), &empty).await?;
                let t0 = Instant::now();
                let _: pocket_api::ModelAction = client.post(&action("load"), &empty).await?;
                reloaded = Some(t0.elapsed().as_secs_f64());
            } else {
                let _: pocket_api::ModelAction = client.post(&action("load"), &empty).await?;
            }
            let max = status.cpu.as_ref().map(|c| c.max_threads).or(status.threads);
            Ok(DaemonCheck { reloaded, threads: max })
        })
    }
}

/// What [`SocketRunner::check_daemon`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DaemonCheck {
    /// Seconds the model took to load again, for a cold start.
    pub reloaded: Option<f64>,
    /// The most threads pocketd's passes run on, if its status says.
    pub threads: Option<usize>,
}

/// A streamed request's answer, timed from this side.
pub(crate) struct Streamed {
    /// The text, as its chunks carried it.
    pub text: String,
    /// The generated token ids (`return_tokens`).
    pub tokens: Vec<u32>,
    /// Token counts (with the prompt cache's `prompt_tokens_details`).
    pub usage: Option<Usage>,
    /// pocketd's statistics.
    pub timings: Timings,
    /// Seconds from sending the request until its first text arrived; `None` when no text
    /// did.
    pub first_text_seconds: Option<f64>,
    /// Seconds from sending the request until the stream ended.
    pub total_seconds: f64,
    /// Seconds from the first text to the last.
    pub decode_seconds: f64,
}

/// POST `body` to `path` on pocketd, streamed (the request must ask for `stream` and
/// `return_tokens`), and time it: the first and last chunks that carry text.
pub(crate) fn stream(
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    path: &str,
    body: &serde_json::Value,
) -> Result<Streamed, Error> {
    runtime.block_on(stream_from(client, path, body, Instant::now()))
}

/// [`stream`] as a future, its times counted from `start` (several requests sent at once
/// share it).
pub(crate) async fn stream_from(
    client: &Client,
    path: &str,
    body: &serde_json::Value,
    start: Instant,
) -> Result<Streamed, Error> {
    let (mut first, mut last) = (None, None);
    let mut end: Option<Chunk> = None;
    // With `include_usage`, the counts come in a last chunk of their own.
    let mut usage = None;
    let mut all_text = String::new();
    client
        .stream(path, body, &mut |data| {
            let chunk: Chunk = serde_json::from_str(data)?;
            if let Some(e) = &chunk.error {
                return Err(format!("pocketd failed mid-stream: {}", e.message).into());
            }
            let text = chunk
                .choices
                .first()
                .and_then(|c| c.delta.as_ref().and_then(|d| d.content.as_deref()).or(c.text.as_deref()));
            if let Some(text) = text.filter(|t| !t.is_empty()) {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                all_text.push_str(text);
            }
            usage = chunk.usage.or(usage);
            if chunk.timings.is_some() {
                end = Some(chunk);
            }
            Ok(())
        })
        .await?;
    let total_seconds = start.elapsed().as_secs_f64();
    let end = end.ok_or_else(|| Error::Invalid("pocketd's stream ended without its statistics".into()))?;
    let tokens = end.tokens.ok_or_else(|| {
        Error::Invalid("pocketd did not return the tokens (`return_tokens`); is it an older version?".into())
    })?;
    debug_assert_eq!(usage.map_or(tokens.len(), |u: Usage| u.completion_tokens as usize), tokens.len());
    Ok(Streamed {
        text: all_text,
        tokens,
        usage,
        timings: end.timings.unwrap_or_default(),
        first_text_seconds: first.map(|f: Instant| f.duration_since(start).as_secs_f64()),
        total_seconds,
        decode_seconds: first.zip(last).map_or(0.0, |(f, l)| l.duration_since(f).as_secs_f64()),
    })
}

/// What a streamed chunk may carry, of either shape (chat or text).
#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    timings: Option<Timings>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    error: Option<pocket_api::ErrorObject>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
}

impl Runner for SocketRunner {
    fn name(&self) -> &str {
        &self.name
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    fn accounts_memory(&self) -> bool {
        true
    }

    fn remote(&self) -> bool {
        true
    }

    fn run(&mut self, prompt: &PromptRun<'_>) -> Result<RunOutput, Error> {
        let (path, body) = self.request(prompt)?;
        let streamed = stream(&self.runtime, &self.client, path, &body)?;
        Ok(self.output(streamed))
    }

    /// All `prompts` sent at once, each on a connection of its own, as several apps would.
    fn run_concurrent(&mut self, prompts: &[PromptRun<'_>]) -> Result<Vec<RunOutput>, Error> {
        let requests = prompts.iter().map(|p| self.request(p)).collect::<Result<Vec<_>, _>>()?;
        let start = Instant::now();
        let client = &self.client;
        let streamed = self.runtime.block_on(futures_util::future::join_all(
            requests.iter().map(|(path, body)| stream_from(client, path, body, start)),
        ));
        streamed.into_iter().map(|s| s.map(|s| self.output(s))).collect()
    }
}

impl SocketRunner {
    /// The request for `prompt`: where it goes and its body.
    fn request(&self, prompt: &PromptRun<'_>) -> Result<(&'static str, serde_json::Value), Error> {
        let options = GenerationOptions {
            max_tokens: Some(u32::try_from(prompt.max_tokens).unwrap_or(u32::MAX)),
            temperature: Some(0.0),
            stream: true,
            stream_options: StreamOptions::with_usage(),
            spec: Some(self.spec.name().to_owned()),
            draft_model: self.draft_model.clone(),
            kv: Some(self.kv.name().to_owned()),
            return_tokens: true,
            // Every run starts from an empty context (see `Runner`), as it does in this process:
            // a prompt cache continuing the same prompt from another mode's run would leave
            // its prefill out of the figures.
            cache_prompt: Some(false),
            ..GenerationOptions::default()
        };
        let model = Some(self.model.clone());
        let (path, body) = match prompt.input {
            PromptInput::Messages(messages) => {
                let messages = messages.to_vec();
                let body = serde_json::to_value(ChatCompletionRequest { model, messages, options });
                ("/v1/chat/completions", body)
            }
            PromptInput::Text(text) => {
                let body =
                    serde_json::to_value(CompletionRequest { model, prompt: text.clone().into(), options });
                ("/v1/completions", body)
            }
        };
        let body = body.map_err(|e| Error::Invalid(format!("cannot encode the request: {e}")))?;
        Ok((path, body))
    }

    /// What a streamed answer says, as a run's output.
    fn output(&self, streamed: Streamed) -> RunOutput {
        let Streamed { tokens, timings, first_text_seconds, decode_seconds, .. } = streamed;
        RunOutput {
            tokens,
            prefill_seconds: first_text_seconds.unwrap_or(0.0),
            decode_seconds,
            drafted: timings.drafted,
            accepted: timings.accepted,
            draft_steps: 0,
            drafter: timings.drafter,
            generation_memory_bytes: timings.peak_bytes,
            plan: None,
            passes: None,
        }
    }
}
