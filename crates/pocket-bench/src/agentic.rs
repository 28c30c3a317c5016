//! Agentic streams replayed through a running pocketd: the similar requests that apps on a
//! board send again and again (a helper writing SQL for one schema, an assistant turning
//! commands into JSON), in file order, so that what pocketd keeps of earlier answers builds up
//! as in use. Each request is sent in three modes, one after the other:
//!
//! - `off` (`spec: off`): plain decoding, the reference the other modes' answers are compared
//!   with. It runs first, so that a cost of the daemon's first request falls on it.
//! - `no-history`: the daemon's default speculation without earlier answers (`cache_prompt:
//!   false`, which leaves a request out of them): what the default does without them.
//! - `default`: the request as an app sends it, with no speculation setting, so the daemon's
//!   default decides, drafting from earlier answers too.
//!
//! Every (app, mode) has a `prompt_cache_key` of its own, unique to this run: each mode's
//! requests learn only from that mode's earlier answers of the same app, never from the
//! other mode's answer to the same request, nor from another app's. The figures that matter
//! are over the stream's second half, once earlier answers are there.
//!
//! Beside them, the bound that no drafter copying earlier text can beat on this device
//! ([`crate::copying_bound`]), from the `off` answers, the prompts' tokens and the cost curve
//! pocketd drafts with: what the `default` mode reached is best read against it.

use std::collections::BTreeMap;

use pocket_api::client::Client;
use pocket_api::{
    ChatCompletionRequest, GenerationOptions, StreamOptions, TokenizeRequest, TokenizeResponse, Tokens,
};
use pocket_core::cost::CostModel;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::config::{BenchConfig, DAEMON_SETTLE_MAX};
use crate::copying_bound::{CopyingBound, Runs, longest_runs};
use crate::machine::{Load, sha256_tokens, wait_for_quiet};
use crate::modes::{self, SocketRunner};
use crate::workload::AgenticRequest;

/// Plain decoding: the reference.
pub const OFF: &str = "off";

/// The daemon's default speculation without earlier answers.
pub const NO_HISTORY: &str = "no-history";

/// What an app sends: no speculation setting.
pub const DEFAULT: &str = "default";

/// The modes in the order each request runs in them; the first is the reference.
pub const MODES: [&str; 3] = [OFF, NO_HISTORY, DEFAULT];

/// One request of the stream in one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticRecord {
    /// The request's id.
    pub id: String,
    /// The app that sent it.
    pub app: String,
    /// Its place in the stream, 0-based.
    pub index: usize,
    /// The mode.
    pub mode: String,
    /// Tokens generated (the end token not counted).
    pub generated_tokens: usize,
    /// Seconds from the first text to the last, seen by the client.
    pub decode_seconds: f64,
    /// Tokens after the first over `decode_seconds`; `null` for fewer than two tokens.
    pub decode_tok_per_s: Option<f64>,
    /// Tokens drafted, accepted, and drafted from earlier answers (pocketd's timings).
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Drafts made.
    #[serde(default)]
    pub drafts: u64,
    /// Drafts that branched (trees).
    #[serde(default)]
    pub trees: u64,
    /// Drafted tokens that came from earlier answers.
    pub recalled: u64,
    /// What the drafter did, in a line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<String>,
    /// sha256 of the generated token ids.
    pub output_sha256: String,
    /// Whether the tokens equal the `off` mode's for the same request.
    pub identical_to_off: bool,
}

/// One mode over a part of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticPart {
    /// Requests.
    pub requests: usize,
    /// Tokens after each answer's first, over the part's decode seconds.
    pub decode_tok_per_s: f64,
    /// `decode_tok_per_s` over the `off` mode's for the same requests.
    pub speedup: f64,
    /// `decode_tok_per_s` over the `no-history` mode's for the same requests.
    pub over_no_history: f64,
    /// Drafted tokens accepted, over drafted tokens.
    pub acceptance: f64,
    /// Drafted tokens per generated token.
    pub drafted_per_token: f64,
    /// Drafted tokens per draft (a tree's counted along the path verification walked).
    #[serde(default)]
    pub draft_len: f64,
    /// Of the drafts, the share that branched (trees).
    #[serde(default)]
    pub tree_share: f64,
    /// Of the drafted tokens, the share drafted from earlier answers.
    pub recalled_share: f64,
    /// Answers identical to the `off` mode's.
    pub identical: usize,
}

/// One mode over the first half, the second half and the whole stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticModeSummary {
    /// The first half of the stream (earlier answers still few).
    pub first_half: AgenticPart,
    /// The second half.
    pub second_half: AgenticPart,
    /// All of it.
    pub all: AgenticPart,
}

/// What pocketd held of earlier answers after the stream, from `/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSize {
    /// Histories (one per model and key).
    pub histories: usize,
    /// Answers held.
    pub answers: usize,
    /// Tokens held.
    pub tokens: usize,
    /// Bytes held in the budget.
    pub bytes: u64,
}

/// An agentic stream replayed through pocketd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgenticResults {
    /// The modes, in the order every request ran in them; the first is the reference.
    pub modes: Vec<String>,
    /// The apps, in order of their first request.
    pub apps: Vec<String>,
    /// Every request in every mode, in the order they ran.
    pub requests: Vec<AgenticRecord>,
    /// Per mode.
    pub summary: BTreeMap<String, AgenticModeSummary>,
    /// Earlier answers pocketd held after the stream (every key, this run's and others').
    pub store: StoreSize,
    /// What an oracle that copies earlier text could reach on this device, from the `off`
    /// answers (absent in results written before it was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<CopyingBound>,
}

/// Replay `requests` in order through the pocketd at `config.socket`, each in [`MODES`].
pub fn replay(config: &BenchConfig, requests: &[AgenticRequest]) -> Result<AgenticResults, Error> {
    let socket = config.socket.as_deref().ok_or_else(|| {
        Error::Invalid("agentic streams are replayed through pocketd: give its socket (--socket PATH)".into())
    })?;
    if requests.is_empty() {
        return Err(Error::Invalid("no agentic requests to replay".into()));
    }
    SocketRunner::check_daemon(socket, &config.model_name, None, config.start)?;
    let client = Client::new(socket);
    let runtime = modes::socket::runtime()?;
    let run_id = crate::conversation::run_id();
    let mut apps: Vec<String> = Vec::new();
    let mut records = Vec::with_capacity(requests.len() * MODES.len());
    // Per app, its `off` answers so far; per request, the runs a copying drafter could see.
    let mut earlier: BTreeMap<&str, Vec<Vec<u32>>> = BTreeMap::new();
    let mut runs: Vec<Runs> = Vec::with_capacity(requests.len());
    let (load, quiet) = Load::beside(config)?;
    for (index, request) in requests.iter().enumerate() {
        if !apps.contains(&request.app) {
            apps.push(request.app.clone());
        }
        let mut reference: Option<Vec<u32>> = None;
        for mode in MODES {
            if !quiet.is_zero() {
                wait_for_quiet(quiet);
            }
            let max_tokens = config.max_tokens_cap.map_or(request.max_tokens, |c| request.max_tokens.min(c));
            let body = ChatCompletionRequest {
                model: Some(config.model_name.clone()),
                messages: request.messages.clone(),
                options: GenerationOptions {
                    max_tokens: Some(u32::try_from(max_tokens).unwrap_or(u32::MAX)),
                    temperature: Some(0.0),
                    stream: true,
                    stream_options: StreamOptions::with_usage(),
                    spec: (mode == OFF).then(|| "off".to_owned()),
                    cache_prompt: (mode == NO_HISTORY).then_some(false),
                    return_tokens: true,
                    prompt_cache_key: Some(format!("pocket-bench {run_id} {} {mode}", request.app)),
                    ..GenerationOptions::default()
                },
            };
            let body = serde_json::to_value(body)?;
            let s = modes::socket::stream(&runtime, &client, "/v1/chat/completions", &body).map_err(|e| {
                Error::Prompt { id: request.id.clone(), mode: mode.to_owned(), error: Box::new(e) }
            })?;
            // pocketd's threads are the "others" here: let them go idle before the next.
            wait_for_quiet(DAEMON_SETTLE_MAX);
            let generated = s.tokens.len();
            let identical = reference.get_or_insert_with(|| s.tokens.clone()) == &s.tokens;
            records.push(AgenticRecord {
                id: request.id.clone(),
                app: request.app.clone(),
                index,
                mode: mode.to_owned(),
                generated_tokens: generated,
                decode_seconds: s.decode_seconds,
                decode_tok_per_s: (generated >= 2 && s.decode_seconds > 0.0)
                    .then(|| (generated - 1) as f64 / s.decode_seconds),
                drafted: s.timings.drafted,
                accepted: s.timings.accepted,
                drafts: s.timings.drafts,
                trees: s.timings.trees,
                recalled: s.timings.recalled,
                drafter: s.timings.drafter.clone(),
                output_sha256: sha256_tokens(&s.tokens),
                identical_to_off: identical,
            });
        }
        let answer = reference.unwrap_or_default();
        let prompt = prompt_tokens(&runtime, &client, config, request)?;
        let app = earlier.entry(request.app.as_str()).or_default();
        runs.push(longest_runs(&answer, &prompt, app));
        app.push(answer);
    }
    drop(load);
    let status = status(&runtime, &client)?;
    let store = store_size(&status);
    let bound = Some(CopyingBound::of(&runs, cost_curve(&status, &config.model_name)));
    let summary = MODES.iter().map(|&m| (m.to_owned(), summarize(&records, m, requests.len()))).collect();
    Ok(AgenticResults {
        modes: MODES.map(String::from).to_vec(),
        apps,
        requests: records,
        summary,
        store,
        bound,
    })
}

/// `request`'s prompt as the model sees it (its chat template applied), from pocketd.
fn prompt_tokens(
    runtime: &tokio::runtime::Runtime,
    client: &Client,
    config: &BenchConfig,
    request: &AgenticRequest,
) -> Result<Vec<u32>, Error> {
    let body = TokenizeRequest {
        model: Some(config.model_name.clone()),
        messages: Some(request.messages.clone()),
        ..TokenizeRequest::default()
    };
    let tokenized = runtime
        .block_on(client.post::<TokenizeResponse>("/tokenize", &body))
        .map_err(|e| Error::Invalid(format!("cannot tokenize {}'s prompt: {e}", request.id)))?;
    Ok(match tokenized.tokens {
        Tokens::Ids(ids) => ids,
        Tokens::Pieces(pieces) => pieces.into_iter().map(|p| p.id).collect(),
    })
}

/// Steps for passes of 1, 2, ... tokens (up to [`FLAT_WIDTH`](crate::copying_bound::FLAT_WIDTH)),
/// from the cost curve pocketd drafts `model` with, between its measured widths linear; empty
/// where pocketd lists none.
fn cost_curve(status: &pocket_api::Status, model: &str) -> Vec<f64> {
    let loaded = match status.loaded.iter().find(|m| m.name == model) {
        Some(m) => Some(m),
        None if status.loaded.len() == 1 => status.loaded.first(),
        None => None,
    };
    let points = loaded.map_or(&[][..], |m| m.cost_curve.as_slice());
    let Some(widest) = points.iter().map(|p| p.n).max() else { return Vec::new() };
    let model = CostModel::from_curve(points);
    (1..=widest.min(crate::copying_bound::FLAT_WIDTH)).map(|n| model.pass(n)).collect()
}

/// pocketd's `/v1/status`.
fn status(runtime: &tokio::runtime::Runtime, client: &Client) -> Result<pocket_api::Status, Error> {
    runtime
        .block_on(client.get::<pocket_api::Status>("/v1/status"))
        .map_err(|e| Error::Invalid(format!("cannot read pocketd's status: {e}")))
}

/// What pocketd holds of earlier answers, from its status.
fn store_size(status: &pocket_api::Status) -> StoreSize {
    StoreSize {
        histories: status.histories.len(),
        answers: status.histories.iter().map(|h| h.answers).sum(),
        tokens: status.histories.iter().map(|h| h.tokens).sum(),
        bytes: status.histories.iter().map(|h| h.bytes).sum(),
    }
}

/// `mode` over the first half, the second half and all of a stream of `n` requests.
pub fn summarize(records: &[AgenticRecord], mode: &str, n: usize) -> AgenticModeSummary {
    let half = n / 2;
    let part = |range: std::ops::Range<usize>| {
        let of = |m: &str| -> Vec<&AgenticRecord> {
            records.iter().filter(|r| r.mode == m && range.contains(&r.index)).collect()
        };
        let rate = |rs: &[&AgenticRecord]| {
            let tokens: usize = rs.iter().map(|r| r.generated_tokens.saturating_sub(1)).sum();
            let seconds: f64 = rs.iter().filter(|r| r.generated_tokens >= 2).map(|r| r.decode_seconds).sum();
            if seconds > 0.0 { tokens as f64 / seconds } else { 0.0 }
        };
        let (these, reference, without) = (of(mode), of(OFF), of(NO_HISTORY));
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let drafted: u64 = these.iter().map(|r| r.drafted).sum();
        let generated: usize = these.iter().map(|r| r.generated_tokens).sum();
        let drafts: u64 = these.iter().map(|r| r.drafts).sum();
        AgenticPart {
            requests: these.len(),
            decode_tok_per_s: rate(&these),
            speedup: ratio(rate(&these), rate(&reference)),
            over_no_history: ratio(rate(&these), rate(&without)),
            acceptance: ratio(these.iter().map(|r| r.accepted).sum::<u64>() as f64, drafted as f64),
            drafted_per_token: ratio(drafted as f64, generated as f64),
            draft_len: ratio(drafted as f64, drafts as f64),
            tree_share: ratio(these.iter().map(|r| r.trees).sum::<u64>() as f64, drafts as f64),
            recalled_share: ratio(these.iter().map(|r| r.recalled).sum::<u64>() as f64, drafted as f64),
            identical: these.iter().filter(|r| r.identical_to_off).count(),
        }
    };
    AgenticModeSummary { first_half: part(0..half), second_half: part(half..n), all: part(0..n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: usize, mode: &str, tokens: usize, seconds: f64, drafted: u64) -> AgenticRecord {
        AgenticRecord {
            id: format!("r{index}"),
            app: "a".into(),
            index,
            mode: mode.into(),
            generated_tokens: tokens,
            decode_seconds: seconds,
            decode_tok_per_s: None,
            drafted,
            accepted: drafted / 2,
            drafts: drafted / 4,
            trees: drafted / 8,
            recalled: drafted / 4,
            drafter: None,
            output_sha256: String::new(),
            identical_to_off: true,
        }
    }

    #[test]
    fn halves_are_summarized_apart_against_the_reference() {
        let records = [
            record(0, OFF, 11, 1.0, 0),
            record(0, DEFAULT, 11, 1.0, 8),
            record(1, OFF, 11, 1.0, 0),
            record(1, DEFAULT, 11, 0.25, 8),
            record(1, NO_HISTORY, 11, 0.5, 8),
        ];
        let s = summarize(&records, DEFAULT, 2);
        assert_eq!((s.first_half.requests, s.second_half.requests, s.all.requests), (1, 1, 2));
        assert!((s.first_half.speedup - 1.0).abs() < 1e-12);
        assert!((s.second_half.speedup - 4.0).abs() < 1e-12);
        assert!((s.second_half.over_no_history - 2.0).abs() < 1e-12);
        assert!((s.all.decode_tok_per_s - 20.0 / 1.25).abs() < 1e-9);
        assert_eq!((s.all.acceptance, s.all.recalled_share), (0.5, 0.25));
        assert_eq!((s.all.draft_len, s.all.tree_share), (4.0, 0.5));
        assert_eq!(summarize(&records, OFF, 2).second_half.speedup, 1.0);
    }
}
