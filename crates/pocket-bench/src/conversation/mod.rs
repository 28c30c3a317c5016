//! Conversations replayed turn by turn through a running pocketd, as a chat app sends them:
//! turn k's request holds the system message, every earlier user turn and the model's own
//! answers, then user turn k. Each turn is sent in two modes, alternating per turn so that a
//! drifting machine affects both alike:
//!
//! - `no-cache` (`cache_prompt: false`): every request is prefilled whole and nothing is
//!   parked, as without a prompt cache. It runs first in each pair, so that a cost of the
//!   daemon's first request falls on the baseline, not on the cache's figures, and it is the
//!   reference the other mode's answers are compared with.
//! - `cache`: the request as a chat app sends it (`cache_prompt` absent), so the daemon
//!   continues the conversation parked after the previous turn and prefills only what is new.
//!
//! Every (conversation, mode, round) has a `prompt_cache_key` of its own, unique to this run,
//! so that no replay continues another's conversation: the cache mode starts cold at turn 1,
//! and nothing the other mode did (or an earlier benchmark parked) is continued.
//!
//! Each mode answers from its own history: greedy answers are equal while the cache changes
//! nothing, and `identical_to_vanilla` per turn shows where they stop being so (after which
//! the two histories differ).

pub mod summary;

use std::path::Path;
use std::time::Duration;

use pocket_api::client::Client;
use pocket_api::{ChatCompletionRequest, ChatMessage, GenerationOptions, Role, StreamOptions};
use pocket_core::spec::SpecMode;

use crate::Error;
use crate::config::{BenchConfig, DAEMON_SETTLE_MAX, Progress, Start};
use crate::machine::{Load, sha256_tokens, wait_for_quiet};
use crate::modes::{self, Mode, SocketRunner};
use crate::results::{ConversationResults, TurnRecord};
use crate::workload::Conversation;

/// The mode that continues each conversation from pocketd's prompt cache.
pub const CACHE: &str = "cache";

/// The mode that prefills every request whole and parks nothing: the reference.
pub const NO_CACHE: &str = "no-cache";

/// The modes in the order each turn runs in them; the first is the reference.
pub const MODES: [&str; 2] = [NO_CACHE, CACHE];

/// Most tokens the warm-up request generates.
const WARMUP_TOKENS: usize = 16;

/// Replay `conversations` through the pocketd at `config.socket` in [`MODES`], each
/// `config.rounds` times, with the speculation of `config.conversation_mode`.
pub fn replay(
    config: &BenchConfig,
    conversations: &[Conversation],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConversationResults, Error> {
    let (socket, spec, draft_model) = check(config)?;
    if conversations.is_empty() {
        return Err(Error::Invalid("no conversations to replay".into()));
    }
    // Both modes go through the same daemon, so its threads need not be this process's.
    let daemon = SocketRunner::check_daemon(socket, &config.model_name, None, config.start)?;
    if let Some(seconds) = daemon.reloaded {
        progress(Progress::DaemonReloaded { seconds });
    }
    let replayer = Replayer {
        client: Client::new(socket),
        runtime: modes::socket::runtime()?,
        config,
        spec,
        draft_model: draft_model.clone(),
        run_id: run_id(),
    };
    if config.start == Start::Warm {
        replayer.warm_up(&conversations[0])?;
    }

    let modes: Vec<String> = MODES.map(String::from).to_vec();
    let total = config.rounds * modes.len() * conversations.iter().map(|c| c.turns.len()).sum::<usize>();
    let mut turns = Vec::with_capacity(total);
    let mut outputs = Vec::with_capacity(total);
    let (load, quiet) = Load::beside(config)?;
    for round in 0..config.rounds {
        for conversation in conversations {
            let max_tokens =
                config.max_tokens_cap.map_or(conversation.max_tokens, |c| conversation.max_tokens.min(c));
            let mut histories: Vec<Vec<ChatMessage>> =
                vec![
                    conversation.system.iter().map(|s| ChatMessage::new(Role::System, s)).collect();
                    modes.len()
                ];
            for (t, user) in conversation.turns.iter().enumerate() {
                for (mode, history) in modes.iter().zip(&mut histories) {
                    history.push(ChatMessage::new(Role::User, user));
                    if !quiet.is_zero() {
                        wait_for_quiet(quiet);
                    }
                    let key =
                        format!("pocket-bench {} {} {mode} round {round}", replayer.run_id, conversation.id);
                    let turn = replayer.turn(history, max_tokens, mode == CACHE, key).map_err(|e| {
                        Error::Prompt {
                            id: format!("{} turn {}", conversation.id, t + 1),
                            mode: mode.clone(),
                            error: Box::new(e),
                        }
                    })?;
                    // pocketd's threads are the "others" here: let them go idle before the next.
                    wait_for_quiet(DAEMON_SETTLE_MAX);
                    history.push(ChatMessage::new(Role::Assistant, turn.text));
                    turns.push(TurnRecord {
                        mode: mode.clone(),
                        conversation_id: conversation.id.clone(),
                        round,
                        turn: t + 1,
                        output_sha256: sha256_tokens(&turn.tokens),
                        ..turn.record
                    });
                    outputs.push(turn.tokens);
                    progress(Progress::Turn {
                        index: turns.len(),
                        of: total,
                        record: turns.last().expect("just pushed"),
                    });
                }
            }
        }
    }
    drop(load);
    summary::compare_turns(&mut turns, &outputs, NO_CACHE);
    let (by_conversation, summary) = summary::summarize(&turns, &modes);
    Ok(ConversationResults {
        modes,
        spec: spec.name().to_owned(),
        draft_model,
        daemon_threads: daemon.threads,
        turns,
        by_conversation,
        summary,
    })
}

/// Check the settings a replay needs: pocketd's socket, rounds, the cap, and the
/// speculation (and draft model) of `config.conversation_mode`, which are returned.
pub(crate) fn check(config: &BenchConfig) -> Result<(&Path, SpecMode, Option<String>), Error> {
    let socket = config.socket.as_deref().ok_or_else(|| {
        Error::Invalid("conversations are replayed through pocketd: give its socket (--socket PATH)".into())
    })?;
    if config.rounds == 0 {
        return Err(Error::Invalid("rounds must be at least 1".into()));
    }
    if config.max_tokens_cap == Some(0) {
        return Err(Error::Invalid("the max-tokens cap must be at least 1".into()));
    }
    let mode = &config.conversation_mode;
    let spec = mode.spec().ok_or_else(|| {
        Error::Invalid(format!(
            "conversations are replayed through pocketd, which does not run {mode}: give one of our engine's \
             modes (vanilla, auto, ...)"
        ))
    })?;
    let draft_model = match mode {
        Mode::Draft(name) => Some(name.clone()),
        _ => None,
    };
    Ok((socket, spec, draft_model))
}

/// A name unique to this benchmark run, for the prompt-cache keys: this process and the time
/// it started replaying (a daemon that keeps parked conversations on disk may hold an earlier
/// run's).
pub(crate) fn run_id() -> String {
    let since_epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or(Duration::ZERO);
    format!("{}-{}", std::process::id(), since_epoch.as_millis())
}

/// What one turn produced: its record (but for where it belongs and its output's hash), its
/// tokens and its text (the next turn's history).
struct Turn {
    record: TurnRecord,
    tokens: Vec<u32>,
    text: String,
}

/// Sends the turns.
struct Replayer<'a> {
    client: Client,
    runtime: tokio::runtime::Runtime,
    config: &'a BenchConfig,
    spec: SpecMode,
    draft_model: Option<String>,
    run_id: String,
}

impl Replayer<'_> {
    /// One streamed, greedy chat request of `messages` under the prompt-cache `key`; with
    /// `cache` false, `cache_prompt: false`.
    fn turn(
        &self,
        messages: &[ChatMessage],
        max_tokens: usize,
        cache: bool,
        key: String,
    ) -> Result<Turn, Error> {
        let request = ChatCompletionRequest {
            model: Some(self.config.model_name.clone()),
            messages: messages.to_vec(),
            options: GenerationOptions {
                max_tokens: Some(u32::try_from(max_tokens).unwrap_or(u32::MAX)),
                temperature: Some(0.0),
                stream: true,
                stream_options: StreamOptions::with_usage(),
                spec: Some(self.spec.name().to_owned()),
                draft_model: self.draft_model.clone(),
                kv: Some(self.config.kv.name().to_owned()),
                return_tokens: true,
                prompt_cache_key: Some(key),
                // The cache mode sends what a chat app sends: nothing.
                cache_prompt: (!cache).then_some(false),
                ..GenerationOptions::default()
            },
        };
        let body = serde_json::to_value(request)?;
        let s = modes::socket::stream(&self.runtime, &self.client, "/v1/chat/completions", &body)?;
        let generated = s.tokens.len();
        let usage = s.usage.unwrap_or_default();
        let record = TurnRecord {
            mode: String::new(),
            conversation_id: String::new(),
            round: 0,
            turn: 0,
            prompt_tokens: usage.prompt_tokens as usize,
            cached_tokens: s.timings.cached_tokens as usize,
            generated_tokens: generated,
            ttft_ms: s.first_text_seconds.unwrap_or(s.total_seconds) * 1e3,
            prefill_ms: s.timings.prefill_ms,
            decode_tok_per_s: (generated >= 2 && s.decode_seconds > 0.0)
                .then(|| (generated - 1) as f64 / s.decode_seconds),
            output_sha256: String::new(),
            identical_to_vanilla: None,
            diverges_at: None,
        };
        Ok(Turn { record, tokens: s.tokens, text: s.text })
    }

    /// One unrecorded short request, parking nothing, so that the measured turns find the
    /// daemon's model warm.
    fn warm_up(&self, conversation: &Conversation) -> Result<(), Error> {
        let mut messages: Vec<ChatMessage> =
            conversation.system.iter().map(|s| ChatMessage::new(Role::System, s)).collect();
        messages.push(ChatMessage::new(Role::User, &conversation.turns[0]));
        let max_tokens = conversation.max_tokens.min(WARMUP_TOKENS);
        let key = format!("pocket-bench {} warm-up", self.run_id);
        self.turn(&messages, max_tokens, false, key).map_err(|e| Error::Prompt {
            id: conversation.id.clone(),
            mode: "warm-up".into(),
            error: Box::new(e),
        })?;
        wait_for_quiet(DAEMON_SETTLE_MAX);
        Ok(())
    }
}
