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

use crate::Error;
use crate::config::{BenchConfig, DAEMON_SETTLE_MAX};
use crate::copying_bound::{CopyingBound, Runs, longest_runs};
use crate::machine::{Load, sha256_tokens, wait_for_quiet};
use crate::modes::{self, SocketRunner};
use crate::workload::AgenticRequest;

pub(crate) mod records;

pub use records::{
    AgenticModeSummary, AgenticPart, AgenticRecord, AgenticResults, DEFAULT, MODES, NO_HISTORY, OFF,
    StoreSize, summarize,
};

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
