//! The results document (`--json FILE`), in the shape this crate's `README.md` describes, so
//! that runs from different machines can be compared. Fields beyond those of its first version
//! are additions; none of those was renamed or dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::workload::Kind;

/// One benchmark: where it ran, on what, how, and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// The version of pocket that ran it.
    pub pocket_version: String,
    /// The machine.
    pub machine: Machine,
    /// The model.
    pub model: BenchModel,
    /// How it was run.
    pub settings: Settings,
    /// Our engine's verification cost curve t(n)/t(1), for the weight format of the first
    /// of our modes; empty when not measured.
    pub cost_curve: Vec<CostPoint>,
    /// The cost curve of every weight format the modes ran on (`stored`, `q8_0`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_curves_by_weights: BTreeMap<String, Vec<CostPoint>>,
    /// Every measured run, in the order they ran (modes alternating per prompt).
    pub runs: Vec<RunRecord>,
    /// Per mode (by name).
    pub summary: BTreeMap<String, ModeSummary>,
    /// The requests run at once, with `--concurrent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<crate::concurrency::ConcurrencyResults>,
    /// The workload's conversations, replayed turn by turn through pocketd with and without
    /// its prompt cache; absent when the workload had none (and in results written before
    /// there were any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversations: Option<ConversationResults>,
    /// The workload's agentic streams, replayed in order through pocketd with and without
    /// speculation; absent when the workload had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agentic: Option<crate::agentic::records::AgenticResults>,
}

impl BenchResults {
    /// The modes in the order they first ran (the summary's order is alphabetical).
    pub fn modes(&self) -> Vec<&str> {
        let mut modes: Vec<&str> = Vec::new();
        for run in &self.runs {
            if !modes.contains(&run.mode.as_str()) {
                modes.push(&run.mode);
            }
        }
        modes
    }
}

/// The machine a benchmark ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name (from `/proc/cpuinfo`; under qemu-user, the host's).
    pub cpu: String,
    /// The architecture the binary was built for (`x86_64`, `aarch64`); results written
    /// before there was the field lack it.
    #[serde(default)]
    pub arch: Option<String>,
    /// Threads the engines were given.
    pub threads: usize,
    /// The ggml device the models ran on (`CPU`, `CUDA0`, ...).
    pub backend: String,
    /// Our own matrix kernels used beside ggml's (`mm-avx2(q4_0,…)`, ..., or `ggml`); results
    /// written before there were any lack the field.
    #[serde(default)]
    pub kernels: Option<String>,
    /// Where the model's layers were when some were on RPC peers (llama.cpp's were split the
    /// same way): runs of layers with their device, peer and round trip. Empty: all on
    /// `backend`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<pocket_core::LayerPlacement>,
}

/// The model benchmarked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchModel {
    /// Manifest name, or the file's stem for a model given by path.
    pub name: String,
    /// sha256 of the model file, hex.
    pub file_sha256: String,
    /// Bytes of the model file.
    pub weights_bytes: u64,
    /// The engine that ran our modes (`ggml`, `tract`); results written before there was the
    /// field lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// How the benchmark was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// KV cache type (`f16`, `q8_0`, `q4_0`).
    pub kv: String,
    /// The memory budget, when one was enforced.
    pub memory_budget_bytes: Option<u64>,
    /// Sampling seed (unused by greedy decoding, recorded for when sampling is benchmarked).
    pub seed: u64,
    /// Whether decoding was greedy.
    pub greedy: bool,
    /// Context length of every mode's session.
    pub n_ctx: usize,
    /// Most tokens per forward pass (prefill is split into passes of this size).
    pub n_batch: usize,
    /// The cap put on every prompt's `max_tokens`, if any.
    pub max_tokens_cap: Option<usize>,
    /// The workload file.
    pub workload: String,
    /// Context position the cost curve was measured at.
    pub cost_curve_context: usize,
    /// Timed repetitions per cost-curve point (the median is reported).
    pub cost_curve_repetitions: usize,
    /// Passes over the workload; each prompt runs once per mode in each.
    pub rounds: usize,
    /// How the measured runs started: `cold` (no warm-up run) or `warm`; results written
    /// before there was the field warmed up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<crate::Start>,
    /// pocketd's socket, when `socket:` modes ran through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// Busy processes that ran beside the measured runs (`--load`); 0 before there was the
    /// field.
    #[serde(default)]
    pub load: usize,
    /// Requests run at once (`--concurrent`); 1: each alone.
    #[serde(default = "one")]
    pub concurrent: usize,
}

fn one() -> usize {
    1
}

/// One point of the cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostPoint {
    /// Tokens in the decode call (logits for all of them).
    pub n: usize,
    /// Median seconds of one call.
    pub seconds: f64,
    /// `seconds` relative to n = 1.
    pub relative: f64,
}

impl From<pocket_core::cost::CostPoint> for CostPoint {
    fn from(p: pocket_core::cost::CostPoint) -> Self {
        CostPoint { n: p.n, seconds: p.seconds, relative: p.relative }
    }
}

/// One prompt run in one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The mode.
    pub mode: String,
    /// The prompt's id.
    pub prompt_id: String,
    /// Which pass over the workload this run belongs to (0-based; see `settings.rounds`).
    pub round: usize,
    /// The prompt's kind.
    pub kind: Kind,
    /// Tokens of the prompt (chat template applied).
    pub prompt_tokens: usize,
    /// Tokens generated (the end token not counted).
    pub generated_tokens: usize,
    /// Prompt tokens over the time until the first token was chosen.
    pub prefill_tok_per_s: f64,
    /// Tokens after the first over the time after the first; `null` when fewer than two
    /// tokens were generated (no decode phase to time).
    pub decode_tok_per_s: Option<f64>,
    /// Seconds of prefill.
    pub prefill_seconds: f64,
    /// Seconds of decoding after the first token.
    pub decode_seconds: f64,
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Mean accepted tokens per verification with a draft; `null` without drafts.
    pub mean_accepted_len: Option<f64>,
    /// What the drafter did (for `auto`, the share of steps of each choice); `null` without
    /// speculation.
    #[serde(default)]
    pub drafter: Option<String>,
    /// Peak resident memory of the process during this run.
    pub peak_rss_bytes: u64,
    /// What the run's generation state held at its peak, beside the weights. Our engine's
    /// modes: the peak of what its sessions and drafter reserved in the memory ledger during
    /// the run — compute buffers, KV cache, logits rows, a draft model's session — which the
    /// tests show predicts resident memory within 5%. `llama.cpp`: its KV cache, allocated for
    /// the whole context when its context was made, plus what the process's resident memory
    /// grew by during the run.
    pub generation_memory_bytes: u64,
    /// What the session was given under the memory budget; absent without one (and for
    /// `naive:` modes, which are not planned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<pocket_core::memory::Plan>,
    /// KV cache bytes per token held.
    pub kv_bytes_per_token: u64,
    /// sha256 of the generated token ids as little-endian u32s, hex.
    pub output_sha256: String,
    /// Whether the generated tokens equal `vanilla`'s for this prompt (true for `vanilla`
    /// itself); `null` when `vanilla` did not run.
    pub identical_to_vanilla: Option<bool>,
    /// Index of the first generated token that differs from `vanilla`'s (the shorter
    /// length when one output is a prefix of the other); `null` when identical or without
    /// `vanilla`.
    pub diverges_at: Option<usize>,
    /// CPU cores other processes kept busy during this run, on average (steal time of a
    /// virtual machine included); `null` where `/proc` does not say. Well above 0, the run
    /// competed for the CPU and its speed says little about the engine.
    pub other_cpu_cores: Option<f64>,
    /// Where a forward pass's time went, per pass on average; `null` where the mode's engine
    /// does not count (llama.cpp, pocketd over its socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passes: Option<PassProfile>,
}

/// Where a run's forward passes spent their time, per pass on average: the graph's
/// computation, the engine's host work around it, and the rest of the step (sampling,
/// drafting, the pipeline) — on a GPU, what decides a step's time for a small model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PassProfile {
    /// Forward passes of the run (prefill and decoding).
    pub passes: u64,
    /// Graph splits per pass (runs of nodes on one backend; each past the first copies its
    /// inputs between backends).
    pub splits: f64,
    /// Milliseconds computing the graph.
    pub graph_ms: f64,
    /// Milliseconds of the engine's host work around the graph (inputs, logits copy).
    pub engine_host_ms: f64,
    /// Milliseconds of the run outside the engine's passes (sampling, drafting, pipeline).
    pub outside_ms: f64,
}

impl PassProfile {
    /// The profile of a run of `seconds` (prefill and decoding) with these passes; `None`
    /// without passes.
    pub fn of(passes: pocket_core::PassStats, seconds: f64) -> Option<PassProfile> {
        (passes.passes > 0).then(|| PassProfile {
            passes: passes.passes,
            splits: passes.splits_per_pass(),
            graph_ms: passes.graph_ms(),
            engine_host_ms: passes.pass_ms() - passes.graph_ms(),
            outside_ms: (seconds * 1e3 / passes.passes as f64 - passes.pass_ms()).max(0.0),
        })
    }
}

/// The summary of one mode over the whole workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeSummary {
    /// Runs summarised.
    pub runs: usize,
    /// Median decode tok/s over the runs that had a decode phase.
    pub decode_tok_per_s_median: Option<f64>,
    /// Median prefill tok/s.
    pub prefill_tok_per_s_median: Option<f64>,
    /// Median over prompts of this mode's decode tok/s over `vanilla`'s; `null` without
    /// `vanilla`.
    pub speedup_vs_vanilla: Option<f64>,
    /// For a mode on converted weights (`suffix@q8_0`): the same over plain decoding on
    /// those weights (`vanilla@q8_0`); `null` otherwise or without that mode.
    #[serde(default)]
    pub speedup_vs_same_weights: Option<f64>,
    /// Median over prompts of this mode's decode tok/s over `llama.cpp`'s; `null` without
    /// `llama.cpp`.
    pub decode_vs_llama_cpp: Option<f64>,
    /// Median over prompts of this mode's prefill tok/s over `llama.cpp`'s.
    pub prefill_vs_llama_cpp: Option<f64>,
    /// The same, per prompt kind.
    pub by_kind: BTreeMap<Kind, KindSummary>,
    /// Accepted over drafted tokens; `null` for modes that do not draft.
    pub acceptance: Option<f64>,
    /// Whether every run's output equals plain decoding's on the same weights (`vanilla`, or
    /// `vanilla@q8_0` for `suffix@q8_0` when it ran, else `vanilla`); `null` without either.
    pub all_identical: Option<bool>,
    /// The highest peak RSS of any run.
    pub peak_rss_bytes_max: u64,
    /// Median over runs of the generation memory.
    #[serde(default)]
    pub generation_memory_bytes_median: Option<u64>,
    /// For a mode run beside its `naive:` form (`draft:M` and `naive:draft:M`): the median
    /// over prompts of its decode tok/s over the naive form's; `null` otherwise.
    #[serde(default)]
    pub decode_vs_naive: Option<f64>,
    /// The same for generation memory: its bytes over the naive form's.
    #[serde(default)]
    pub memory_vs_naive: Option<f64>,
    /// Median over runs of the CPU cores other processes kept busy.
    pub other_cpu_cores_median: Option<f64>,
    /// For a mode run through pocketd beside the same mode in process (`socket:auto` and
    /// `auto`): the median over prompts of its decode tok/s over the in-process one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_vs_in_process: Option<f64>,
    /// The same for prefill tok/s (the time to the first token, seen by the client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_vs_in_process: Option<f64>,
    /// The same as a difference: the median over prompts of its time to the first token
    /// minus the in-process one's, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_gap_ms: Option<f64>,
}

/// The summary of one mode over the prompts of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    /// Runs summarised.
    pub runs: usize,
    /// Median decode tok/s.
    pub decode_tok_per_s_median: Option<f64>,
    /// Median prefill tok/s.
    pub prefill_tok_per_s_median: Option<f64>,
    /// Median over prompts of decode tok/s over `vanilla`'s.
    pub speedup_vs_vanilla: Option<f64>,
    /// The same over plain decoding on the same converted weights (see [`ModeSummary`]).
    #[serde(default)]
    pub speedup_vs_same_weights: Option<f64>,
}

/// Conversations replayed turn by turn through pocketd, in each of [`Self::modes`] (this
/// crate's `README.md`, "Workload" and "Results"). Each mode answers from its own history, so
/// that it is replayed as a chat app would replay it; `identical_to_vanilla` says, per turn,
/// whether a mode's answer equals the reference mode's, and so whether the histories of the
/// turns after it are still the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationResults {
    /// The modes, in the order every turn ran in them; the first (`no-cache`) is the reference
    /// that `identical_to_vanilla` compares with.
    pub modes: Vec<String>,
    /// The speculation every request asked for (`off`, `auto`, ...).
    pub spec: String,
    /// The draft model every request named, for `draft`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// CPU threads pocketd generates on, as its status says.
    #[serde(default)]
    pub daemon_threads: Option<usize>,
    /// Every turn in every mode, in the order they ran (modes alternating per turn).
    pub turns: Vec<TurnRecord>,
    /// Per conversation, mode and round, in the order they ran.
    pub by_conversation: Vec<ConversationSummary>,
    /// Per mode (by name), over every conversation and round.
    pub summary: BTreeMap<String, ConversationModeSummary>,
}

/// One turn of a conversation in one mode: one streamed chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The mode (`cache`, `no-cache`).
    pub mode: String,
    /// The conversation's id.
    pub conversation_id: String,
    /// Which pass over the workload (0-based).
    pub round: usize,
    /// The turn, 1-based.
    pub turn: usize,
    /// Tokens of the request's prompt (the whole history, chat template applied).
    pub prompt_tokens: usize,
    /// Of those, the tokens continued from the prompt cache instead of being prefilled.
    pub cached_tokens: usize,
    /// Tokens generated (the end token not counted).
    pub generated_tokens: usize,
    /// Time to first token, seen by the client: from sending the request until its first text
    /// arrived (until the stream ended, for an answer without text), in milliseconds.
    pub ttft_ms: f64,
    /// pocketd's own time from the start of generation to the first token (no queue, no
    /// transport), in milliseconds.
    pub prefill_ms: f64,
    /// Tokens after the first over the time from the first text to the last, seen by the
    /// client; `null` when fewer than two tokens were generated.
    pub decode_tok_per_s: Option<f64>,
    /// sha256 of the generated token ids as little-endian u32s, hex.
    pub output_sha256: String,
    /// Whether the generated tokens equal the reference mode's for the same turn (true for
    /// the reference itself); `null` when the reference did not run.
    pub identical_to_vanilla: Option<bool>,
    /// Index of the first generated token that differs from the reference's; `null` when
    /// identical or without the reference.
    pub diverges_at: Option<usize>,
}

/// One conversation replayed in one mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationSummary {
    /// The mode.
    pub mode: String,
    /// The conversation's id.
    pub conversation_id: String,
    /// Which pass over the workload (0-based).
    pub round: usize,
    /// Turns replayed.
    pub turns: usize,
    /// Prompt tokens over all turns.
    pub prompt_tokens: usize,
    /// Cached (reused) prompt tokens over all turns.
    pub cached_tokens: usize,
    /// `cached_tokens / prompt_tokens`; `null` without prompt tokens.
    pub reused_share: Option<f64>,
    /// The last turn's time to first token over the first's; `null` with fewer than two
    /// turns. The first turn is prefilled whole in every mode, so this is how much longer a
    /// user waits at the end of the conversation than at its start.
    pub ttft_last_over_first: Option<f64>,
    /// The last turn's time to first token over the second's: as above, from the first turn
    /// that could be continued from the cache (and after any first-request costs of the
    /// daemon); `null` with fewer than three turns.
    pub ttft_last_over_second: Option<f64>,
    /// Whether every turn's answer equals the reference mode's; `null` without it.
    pub all_identical: Option<bool>,
}

/// One mode over every conversation and round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationModeSummary {
    /// Conversations replayed (each round counts).
    pub conversations: usize,
    /// Turns replayed.
    pub turns: usize,
    /// Cached (reused) prompt tokens over all prompt tokens of every turn; `null` without
    /// prompt tokens.
    pub reused_share: Option<f64>,
    /// Median over conversations of the last turn's time to first token over the first's.
    pub ttft_last_over_first_median: Option<f64>,
    /// Median over conversations of the last turn's time to first token over the second's.
    pub ttft_last_over_second_median: Option<f64>,
    /// Median time to first token over every turn, in milliseconds.
    pub ttft_ms_median: Option<f64>,
    /// Median decode tok/s over the turns that had a decode phase.
    pub decode_tok_per_s_median: Option<f64>,
    /// Whether every turn's answer equals the reference mode's; `null` without it.
    pub all_identical: Option<bool>,
}
