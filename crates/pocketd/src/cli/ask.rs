//! `pocket ask` and `pocket chat`: generate through the daemon, streaming the text.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use anyhow::Context;
use pocket_api::{
    ChatCompletionChunk, ChatCompletionRequest, ChatMessage, Completion, CompletionRequest,
    GenerationOptions, Stop, StreamOptions,
};
use serde::Serialize;

use super::client::{Client, SocketArgs, runtime};

/// Generation settings shared by `ask` and `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct RequestArgs {
    /// The model (default: the daemon's default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    /// Most tokens to generate (default: the daemon's limit).
    #[arg(short = 'n', long)]
    max_tokens: Option<u32>,
    /// Sampling temperature (0: greedy, the default).
    #[arg(long)]
    temperature: Option<f32>,
    /// Seed of the sampler.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when this text appears; may be repeated.
    #[arg(long)]
    stop: Vec<String>,
    /// Speculation: off, auto, suffix, inputcopy (encoder-decoder models), layerskip or draft
    /// (default: the daemon's).
    #[arg(long)]
    spec: Option<String>,
    /// The draft model for `--spec draft`.
    #[arg(long)]
    draft_model: Option<String>,
    /// KV cache type: f16, q8_0 or q4_0, or keys/values such as q8_0/q4_0.
    #[arg(long)]
    kv: Option<String>,
    #[command(flatten)]
    socket: SocketArgs,
}

impl RequestArgs {
    fn options(&self) -> GenerationOptions {
        GenerationOptions {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            seed: self.seed,
            stop: (!self.stop.is_empty()).then(|| Stop::Many(self.stop.clone())),
            stream: true,
            stream_options: StreamOptions::with_usage(),
            spec: self.spec.clone(),
            draft_model: self.draft_model.clone(),
            kv: self.kv.clone(),
            ..GenerationOptions::default()
        }
    }
}

/// Flags of `pocket ask`.
#[derive(Debug, clap::Args)]
pub struct AskArgs {
    /// The prompt (`-` reads it from standard input).
    prompt: String,
    /// A system message before the prompt.
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Send the prompt as it is (`/v1/completions`) instead of as a chat message.
    #[arg(long)]
    raw: bool,
    /// After the text, print the request's statistics as JSON on stderr (with the time to
    /// the first token as this client saw it).
    #[arg(long)]
    stats: bool,
    #[command(flatten)]
    request: RequestArgs,
}

/// What `--stats` prints.
#[derive(Debug, Serialize)]
struct Stats {
    model: String,
    /// Milliseconds from sending the request to the first text.
    ttft_ms: Option<f64>,
    total_ms: f64,
    finish_reason: Option<pocket_api::FinishReason>,
    usage: Option<pocket_api::Usage>,
    timings: Option<pocket_api::Timings>,
}

/// One streamed exchange: prints text as it arrives and returns the whole text and stats.
async fn exchange(
    client: &Client,
    messages: Option<&[ChatMessage]>,
    prompt: &str,
    args: &RequestArgs,
) -> anyhow::Result<(String, Stats)> {
    let start = Instant::now();
    let mut stats = Stats {
        model: String::new(),
        ttft_ms: None,
        total_ms: 0.0,
        finish_reason: None,
        usage: None,
        timings: None,
    };
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    // Chat and text completion streams differ only in where a chunk keeps its text.
    type Parse = fn(&str) -> anyhow::Result<Chunk>;
    let (path, body, parse): (&str, serde_json::Value, Parse) = match messages {
        Some(messages) => {
            let body = ChatCompletionRequest {
                model: args.model.clone(),
                messages: messages.to_vec(),
                options: args.options(),
            };
            ("/v1/chat/completions", serde_json::to_value(body)?, |d| {
                Ok(parse_event::<ChatCompletionChunk>(d)?.into())
            })
        }
        None => {
            let body = CompletionRequest {
                model: args.model.clone(),
                prompt: prompt.into(),
                options: args.options(),
            };
            ("/v1/completions", serde_json::to_value(body)?, |d| Ok(parse_event::<Completion>(d)?.into()))
        }
    };
    client
        .stream(path, &body, &mut |data| {
            let chunk = parse(data)?;
            stats.model = chunk.model;
            if !chunk.text.is_empty() {
                if stats.ttft_ms.is_none() {
                    stats.ttft_ms = Some(start.elapsed().as_secs_f64() * 1e3);
                }
                text.push_str(&chunk.text);
                stdout.write_all(chunk.text.as_bytes())?;
                stdout.flush()?;
            }
            stats.finish_reason = chunk.finish_reason.or(stats.finish_reason.take());
            stats.usage = chunk.usage.or(stats.usage);
            stats.timings = chunk.timings.or(stats.timings.take());
            Ok(())
        })
        .await?;
    stats.total_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((text, stats))
}

/// What `exchange` takes from a streamed chunk of either kind.
struct Chunk {
    model: String,
    text: String,
    finish_reason: Option<pocket_api::FinishReason>,
    usage: Option<pocket_api::Usage>,
    timings: Option<pocket_api::Timings>,
}

impl From<ChatCompletionChunk> for Chunk {
    fn from(c: ChatCompletionChunk) -> Chunk {
        let choice = c.choices.into_iter().next();
        Chunk {
            model: c.model,
            finish_reason: choice.as_ref().and_then(|ch| ch.finish_reason),
            text: choice.and_then(|ch| ch.delta.content).unwrap_or_default(),
            usage: c.usage,
            timings: c.timings,
        }
    }
}

impl From<Completion> for Chunk {
    fn from(c: Completion) -> Chunk {
        let choice = c.choices.into_iter().next();
        Chunk {
            model: c.model,
            finish_reason: choice.as_ref().and_then(|ch| ch.finish_reason),
            text: choice.map(|ch| ch.text).unwrap_or_default(),
            usage: c.usage,
            timings: c.timings,
        }
    }
}

/// An event's data: a chunk, or an error the daemon sent after the stream began.
fn parse_event<T: serde::de::DeserializeOwned>(data: &str) -> anyhow::Result<T> {
    if let Ok(e) = serde_json::from_str::<pocket_api::ErrorResponse>(data) {
        anyhow::bail!("pocketd: {}", e.error.message);
    }
    serde_json::from_str(data).with_context(|| format!("unexpected event from pocketd: {data}"))
}

/// Run `pocket ask`.
pub fn ask(args: AskArgs) -> anyhow::Result<()> {
    let prompt = if args.prompt == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the prompt from stdin")?
    } else {
        args.prompt.clone()
    };
    let client = Client::new(&args.request.socket.socket);
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new(pocket_core::Role::System, s.clone()));
    }
    messages.push(ChatMessage::new(pocket_core::Role::User, prompt.clone()));
    let chat = (!args.raw).then_some(messages.as_slice());
    let (_, stats) = runtime()?.block_on(exchange(&client, chat, &prompt, &args.request))?;
    println!();
    if args.stats {
        eprintln!("{}", serde_json::to_string_pretty(&stats)?);
    }
    Ok(())
}

/// Flags of `pocket chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    request: RequestArgs,
}

/// Run `pocket chat`: read a line, send the conversation so far, stream the answer; until
/// end of input or `/exit`.
pub fn chat(args: ChatArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.request.socket.socket);
    let rt = runtime()?;
    let interactive = std::io::stdin().is_terminal();
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(ChatMessage::new(pocket_core::Role::System, s.clone()));
    }
    if interactive {
        eprintln!("pocket chat: type a message and press Enter; /exit or Ctrl-D ends.");
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next().transpose()? else { break };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/exit" || line == "/quit" {
            break;
        }
        messages.push(ChatMessage::new(pocket_core::Role::User, line.to_owned()));
        match rt.block_on(exchange(&client, Some(&messages), "", &args.request)) {
            Ok((text, _)) => {
                println!();
                messages.push(ChatMessage::new(pocket_core::Role::Assistant, text));
            }
            Err(e) => {
                // The conversation goes on without the turn that failed.
                messages.pop();
                eprintln!("\n{e:#}");
                if !interactive {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}
