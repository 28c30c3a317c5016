//! pocketd's own responses: `GET /v1/status` (memory, loaded models, running sessions and
//! their plans) and the body of `POST /v1/models/{name}/load|unload`.

use serde::{Deserialize, Serialize};

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// pocketd's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_seconds: f64,
    /// The memory budget and what is reserved in it.
    pub memory: MemoryStatus,
    /// Models loaded now.
    pub loaded: Vec<LoadedModel>,
    /// Requests generating now.
    pub sessions: Vec<SessionStatus>,
    /// Requests waiting for a turn.
    pub queued: usize,
    /// Most requests that may wait.
    pub queue_capacity: usize,
    /// Requests that generate at once now (`parallel`, which `auto` sets from the default
    /// model's cost curve); more wait in the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<usize>,
    /// CPU threads a forward pass runs on now (`cpu` says what the count follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    /// The CPU threads of passes: the setting, the count now and what it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStatus>,
    /// What the daemon is learning about a model while it is idle (`smollm2 (f16 KV): cost
    /// curve`), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning: Option<String>,
    /// Finished conversations kept for the next request to continue, most recently used first.
    #[serde(default)]
    pub parked: Vec<ParkedPrefix>,
    /// Earlier answers kept for drafting later ones, one history per model and
    /// `prompt_cache_key` (or `user`), most recently used first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub histories: Vec<AnswerHistory>,
    /// The HTTP connections (absent when the status did not come over HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<ConnectionStatus>,
    /// ggml's RPC backend, through which models use other boards' devices (absent in a build
    /// without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc: Option<RpcStatus>,
}

/// ggml's RPC backend (`GET /v1/status`'s `rpc`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RpcStatus {
    /// The protocol version this build speaks (`7.0.0`): a peer must speak the same major
    /// version and a minor no newer.
    pub protocol: String,
    /// The peers models have used since the daemon started, live.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<RpcPeerStatus>,
}

/// An RPC peer as the daemon's link to it sees it (`/v1/status`'s `rpc.peers`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RpcPeerStatus {
    /// `host:port`, as configured.
    pub peer: String,
    /// Whether a model holds a connection to it now.
    pub connected: bool,
    /// Why the peer was lost, if the current (or last) connection lost it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
    /// The shortest request–reply round trip seen, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_min_us: Option<u64>,
    /// The latest request–reply round trip, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_last_us: Option<u64>,
    /// Bytes sent to it, all connections together.
    pub bytes_to_peer: u64,
    /// Bytes received from it, all connections together.
    pub bytes_from_peer: u64,
}

/// The CPU threads of forward passes (`GET /v1/status`'s `cpu`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuStatus {
    /// `threads` as configured: `auto` or a count.
    pub threads_setting: String,
    /// Threads a pass runs on now.
    pub threads: usize,
    /// The most a pass may run on (each model's thread pool has this many).
    pub max_threads: usize,
    /// Cores this process may use: its affinity and its cgroup's CPU quota.
    pub allowed_cores: usize,
    /// Other processes' load on those cores, in cores (over the last fraction of a second).
    pub others_load: f64,
}

/// pocketd's HTTP connections: open now, the caps, and what became of them since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// Open now.
    pub open: usize,
    /// The cap on connections open at once (`max_connections`, lowered to stay under the
    /// open files limit).
    pub max: usize,
    /// The cap per peer (`max_connections_per_peer`; a peer is a uid on the Unix socket).
    pub max_per_peer: usize,
    /// Accepted since start.
    pub accepted: u64,
    /// Turned away with a 503: a cap was reached and every candidate was answering a request.
    pub refused: u64,
    /// Closed to let a newer connection in (the oldest of those not answering a request).
    pub evicted: u64,
    /// Closed because a request's head did not arrive in `header_timeout_seconds`, or no
    /// request came in `idle_timeout_seconds`.
    pub timed_out: u64,
}

/// A conversation in the prompt cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParkedPrefix {
    /// The model it belongs to, when it is loaded (else the first digits of its fingerprint).
    pub model: String,
    /// Tokens it holds.
    pub tokens: usize,
    /// Bytes it holds in the budget.
    pub bytes: u64,
    /// Its KV cache type.
    pub kv: String,
    /// The `prompt_cache_key` (or `user`) it was parked under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Seconds since it was parked or last continued.
    pub idle_seconds: f64,
}

/// A model's earlier answers under one key, which later requests under that key draft from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerHistory {
    /// The model they were given by, when it is loaded (else the first digits of its
    /// fingerprint).
    pub model: String,
    /// The `prompt_cache_key` (or `user`) they were given under; absent: requests without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Answers held.
    pub answers: usize,
    /// Tokens held (each answer after the last few tokens of its prompt).
    pub tokens: usize,
    /// Bytes held in the budget.
    pub bytes: u64,
}

/// `POST /v1/cache/clear`'s body (it may be empty: everything is cleared).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearCache {
    /// Clear only the answers given under this `prompt_cache_key` (or `user`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
}

/// What `POST /v1/cache/clear` cleared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCleared {
    /// Answer histories dropped.
    pub histories: usize,
    /// Bytes given back to the budget.
    pub bytes: u64,
}

/// The budget and its use, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    /// The budget (of host memory, and of the device's where it shares the host's).
    pub budget_bytes: u64,
    /// Reserved now (the process, models, sessions), in host memory.
    pub used_bytes: u64,
    /// The most ever reserved at once.
    pub peak_bytes: u64,
    /// The process's resident memory now (VmRSS).
    pub resident_bytes: u64,
    /// The device models run on, when it is not the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceMemoryStatus>,
}

/// A device's memory and what is reserved in it, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemoryStatus {
    /// Its name (`CUDA0`, `Vulkan0`).
    pub name: String,
    /// Whether it computes in the host's memory (an integrated GPU: Jetson's): then one budget,
    /// the host's, covers both, and what is on the device is part of `used_bytes` above.
    pub unified: bool,
    /// The budget of its own memory (the host's budget when unified).
    pub budget_bytes: u64,
    /// Reserved on it now (weights, KV caches, compute buffers).
    pub used_bytes: u64,
    /// The most ever reserved on it at once.
    pub peak_bytes: u64,
    /// Its memory in all, as its backend reports it.
    pub total_bytes: u64,
    /// Free on it now, for every process, as its backend reports it.
    pub free_bytes: u64,
}

/// A model held in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadedModel {
    /// Its name.
    pub name: String,
    /// The engine that runs it: `ggml`, `llama.cpp` or `tract`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Bytes its weights take in the budget.
    pub bytes: u64,
    /// Sessions using it now.
    pub sessions: usize,
    /// Seconds since it last served a request.
    pub idle_seconds: f64,
    /// Seconds of idleness after which it is unloaded (`null`: kept until memory is needed).
    pub keep_alive_seconds: Option<f64>,
    /// Whether what speculation needs about it on this device (its cost curve, a skip set
    /// where one could pay) is known for the daemon's settings; until it is, `auto` decodes
    /// plainly and the daemon learns it while idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuned: Option<bool>,
    /// What a verification pass of `n` tokens costs on this device for the daemon's settings
    /// (`n`, median `seconds`, and `relative`: over a pass of one), where it is known: what
    /// speculation sizes its drafts by.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cost_curve: Vec<pocket_core::cost::CostPoint>,
    /// Its passes so far, where its sessions share them (requests decoding at the same time
    /// in one pass); absent where each session's passes are its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_passes: Option<pocket_core::SharedPasses>,
    /// The device its passes run on (`CPU`, `CUDA0`, `Vulkan0`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Where not every pass width gives exactly the rows single steps give on that device:
    /// the widest that does, and why, found by a probe at load. Drafts are kept to it; where
    /// it is 1, speculation makes no drafts there (greedy output stays plain decoding's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_passes: Option<pocket_core::ExactPasses>,
    /// Where its layers are when some are on other machines (`rpc` peers): runs of layers,
    /// each with its device, the peer's address, the bytes of its weights and the round trip
    /// to the peer measured at load. Absent when every layer is on `device`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<pocket_core::LayerPlacement>,
}

/// A request generating now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// The request's id (`chatcmpl-…`).
    pub id: String,
    /// Its model.
    pub model: String,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// What the planner gave it under the budget.
    pub plan: serde_json::Value,
}

/// The answer to `POST /v1/models/{name}/load` and `…/unload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelAction {
    /// The model.
    pub model: String,
    /// Whether it is loaded now.
    pub loaded: bool,
    /// Bytes its weights take in the budget (0 when unloaded).
    pub bytes: u64,
}
