//! What an agentic replay records: each request in each mode, and each mode summed over the
//! stream's halves. Plain data, so that results files and reports read it without the replay.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::copying_bound::CopyingBound;

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
