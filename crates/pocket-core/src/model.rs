//! The engine boundary: [`Model`] and [`Session`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cost::CostCurveConfig;
use crate::memory::Ledger;
use crate::spec::SpecMode;
use crate::{Error, LayerPlan, Result, Threads, Token, Tokenizer};

/// Decoder-only or encoder-decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A decoder-only transformer (llama, qwen2, gemma3, ...).
    Decoder,
    /// An encoder-decoder transformer (T5, ...): [`Session::encode`] comes first.
    EncoderDecoder,
    /// An encoder that makes one vector of a text ([`Model::embedder`]); it generates nothing.
    Embedding,
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Display name (from the file's metadata or its file name).
    pub name: String,
    /// Architecture as the file names it (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// Decoder or encoder-decoder.
    pub kind: ModelKind,
    /// Number of transformer layers (of the decoder, for encoder-decoders).
    pub n_layers: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Vocabulary size: the length of one row of logits.
    pub n_vocab: usize,
    /// The context length the model was trained for.
    pub n_ctx_train: usize,
    /// Bytes of the weights file(s).
    pub weights_bytes: u64,
    /// How wide a pass may be for its rows to be exactly what single decode steps give, where
    /// not every width is (a device whose kernels change with the number of rows); `None`:
    /// every width is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_passes: Option<ExactPasses>,
    /// Where its layers are, when not all on its device: a model split across machines
    /// (ggml's RPC backend), in runs of consecutive layers. Empty: all on its device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<LayerPlacement>,
}

/// A run of consecutive layers of a model on one device ([`ModelInfo::placement`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPlacement {
    /// The device (`CPU`, `CUDA0`; a peer's device as ggml names it, `RPC0`).
    pub device: String,
    /// The peer's address (`host:port`), for a device on another machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The first layer of the run.
    pub first_layer: usize,
    /// Layers in the run.
    pub n_layers: usize,
    /// Bytes of their weights, as the file stores them.
    pub weight_bytes: u64,
    /// The shortest request–reply round trip to the peer, measured at load (microseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip_us: Option<u64>,
}

/// How wide a pass may be, on a model's device, for each of its rows to be bit for bit what
/// decoding that token alone gives: what greedy speculation needs to give exactly plain
/// decoding's tokens (a verification pass decodes the next token and its draft together).
/// The CPU kernels are built so that every width is; a GPU's kernels switch with the number
/// of rows, which a probe at load finds out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExactPasses {
    /// Most tokens of one exact pass (1: only single steps are, so drafts are never made).
    pub max_tokens: usize,
    /// Passes stay within aligned blocks of this many positions (attention reads the cache in
    /// lengths padded to them, and a kernel may split its work by that length); `None`:
    /// anywhere.
    pub block: Option<usize>,
    /// What was found, in a sentence: the device and the widths probed.
    pub why: String,
}

impl ExactPasses {
    /// Most tokens of an exact pass starting at position `pos`.
    pub fn at(&self, pos: usize) -> usize {
        let in_block = self.block.map_or(usize::MAX, |b| b - pos % b.max(1));
        self.max_tokens.min(in_block)
    }

    /// Whether drafts can be verified exactly at all.
    pub fn allows_drafts(&self) -> bool {
        self.max_tokens >= 2
    }
}

/// Element type of one half of the KV cache: the keys or the values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvElement {
    /// 32-bit floats.
    F32,
    /// 16-bit floats: the reference for the quantized types.
    #[default]
    F16,
    /// 8-bit blocks of 32 with one f16 scale (ggml q8_0): 34 bytes per 32 values.
    Q8_0,
    /// 4-bit blocks of 32 with one f16 scale (ggml q4_0): 18 bytes per 32 values.
    Q4_0,
}

impl KvElement {
    /// All element types, in order of decreasing precision (the order of `Ord`).
    pub const ALL: [KvElement; 4] = [KvElement::F32, KvElement::F16, KvElement::Q8_0, KvElement::Q4_0];

    /// Bytes that `n` values take (n a multiple of 32 for the quantized types).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            KvElement::F32 => n * 4,
            KvElement::F16 => n * 2,
            KvElement::Q8_0 => n / 32 * 34,
            KvElement::Q4_0 => n / 32 * 18,
        }
    }

    /// Whether values are stored in quantized blocks.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvElement::Q8_0 | KvElement::Q4_0)
    }

    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            KvElement::F32 => "f32",
            KvElement::F16 => "f16",
            KvElement::Q8_0 => "q8_0",
            KvElement::Q4_0 => "q4_0",
        }
    }
}

impl fmt::Display for KvElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvElement {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        KvElement::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            Error::invalid_field("kv", format!("unknown KV type {s:?}; use f32, f16, q8_0 or q4_0"))
        })
    }
}

/// The types of the KV cache: one for the keys and one for the values. They may differ, as in
/// llama.cpp (`-ctk`/`-ctv`): keys carry the outlier channels that decide which tokens
/// attention picks, so on some models (Qwen2.5) 4-bit keys change most top-1 tokens while
/// 4-bit values barely move them. Written `q8_0` when both are one type, `q8_0/q4_0` (keys,
/// then values) when they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvType {
    /// The keys' element type.
    pub k: KvElement,
    /// The values' element type.
    pub v: KvElement,
}

impl KvType {
    /// 32-bit floats.
    pub const F32: KvType = KvType::uniform(KvElement::F32);
    /// 16-bit floats: the reference for the quantized types.
    pub const F16: KvType = KvType::uniform(KvElement::F16);
    /// q8_0 keys and values.
    pub const Q8_0: KvType = KvType::uniform(KvElement::Q8_0);
    /// q8_0 keys with q4_0 values: most of q4_0's saving where 4-bit keys would hurt.
    pub const Q8_0_Q4_0: KvType = KvType { k: KvElement::Q8_0, v: KvElement::Q4_0 };
    /// q4_0 keys and values.
    pub const Q4_0: KvType = KvType::uniform(KvElement::Q4_0);

    /// The memory ladder's KV types, in order of decreasing bytes: what a session gives up to
    /// fit goes down this list from the type it asked for.
    pub const ALL: [KvType; 5] = [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q8_0_Q4_0, KvType::Q4_0];

    /// Keys of `k` and values of `v`.
    pub const fn new(k: KvElement, v: KvElement) -> Self {
        KvType { k, v }
    }

    /// Keys and values of one type.
    pub const fn uniform(t: KvElement) -> Self {
        KvType { k: t, v: t }
    }

    /// Bytes that `n` values of K and `n` values of V take together (n a multiple of 32 for
    /// the quantized types).
    pub fn bytes_for(self, n: usize) -> usize {
        self.k.bytes_for(n) + self.v.bytes_for(n)
    }

    /// Whether keys and values are of one type.
    pub fn is_uniform(self) -> bool {
        self.k == self.v
    }

    /// Whether neither keys nor values are stored more precisely than in `floor`: the types a
    /// ladder going down to `floor` may reach.
    pub fn at_least(self, floor: KvType) -> bool {
        self.k <= floor.k && self.v <= floor.v
    }

    /// Whether this type stores keys and values no more precisely than `other` (and is not it).
    pub fn is_below(self, other: KvType) -> bool {
        self != other && self.k >= other.k && self.v >= other.v
    }

    /// The name used on the command line and in config files: `q8_0`, or `q8_0/q4_0` (keys,
    /// then values) when they differ.
    pub fn name(self) -> &'static str {
        const NAMES: [[&str; 4]; 4] = [
            ["f32", "f32/f16", "f32/q8_0", "f32/q4_0"],
            ["f16/f32", "f16", "f16/q8_0", "f16/q4_0"],
            ["q8_0/f32", "q8_0/f16", "q8_0", "q8_0/q4_0"],
            ["q4_0/f32", "q4_0/f16", "q4_0/q8_0", "q4_0"],
        ];
        NAMES[self.k as usize][self.v as usize]
    }
}

impl From<KvElement> for KvType {
    fn from(t: KvElement) -> Self {
        KvType::uniform(t)
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let parse =
            |t: &str| {
                t.trim().parse::<KvElement>().map_err(|_| {
                Error::invalid_field("kv", format!(
                    "unknown KV type {s:?}; use f32, f16, q8_0 or q4_0, or keys/values such as q8_0/q4_0"
                ))
            })
            };
        match s.split_once('/') {
            Some((k, v)) => Ok(KvType::new(parse(k)?, parse(v)?)),
            None => parse(s).map(KvType::uniform),
        }
    }
}

impl Serialize for KvType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for KvType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How a session is set up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionConfig {
    /// Element type of the KV cache.
    pub kv: KvType,
    /// Most tokens the session may hold (prompt + generated). The cache grows towards this,
    /// it is not allocated up front.
    pub n_ctx: usize,
    /// Most tokens one forward pass processes; longer inputs are split. Also the compute
    /// buffer's size: 1 + the longest draft for speculation, larger for fast prefill.
    pub n_batch: usize,
    /// CPU threads for the forward pass: a count, or as many as other programs leave free
    /// (see [`crate::cpu`]).
    #[serde(default)]
    pub threads: Threads,
    /// Most rows of logits one pass returns: 1 + the longest draft verified (a request for
    /// more rows is split into passes). The compute buffer holds this many rows of logits,
    /// which for a large vocabulary is most of it.
    #[serde(default = "default_max_rows")]
    pub max_rows: usize,
    /// Which session's rows go first into a shared pass that cannot take them all: lower is
    /// sooner (vLLM's `priority`), then the order they came.
    #[serde(default)]
    pub priority: i32,
    /// Hold the KV cache for the whole context from the start and keep it, as engines without
    /// a memory budget do (llama.cpp allocates and clears its cache when a context is made).
    /// Only for comparing with them: it defeats the point of growing the cache.
    #[serde(default)]
    pub preallocate: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            kv: KvType::F16,
            n_ctx: 4096,
            n_batch: 256,
            threads: Threads::Auto,
            max_rows: DEFAULT_MAX_ROWS,
            priority: 0,
            preallocate: false,
        }
    }
}

/// [`SessionConfig::max_rows`] unless a plan says otherwise: room to verify the longest
/// draft any drafter makes ([`crate::spec::MAX_DRAFT`]) and more.
pub const DEFAULT_MAX_ROWS: usize = 32;

fn default_max_rows() -> usize {
    DEFAULT_MAX_ROWS
}

/// Every core the process may run on: the most threads [`Threads::Auto`] uses, and the
/// count cost curves are measured with.
pub fn default_threads() -> usize {
    Threads::Auto.max()
}

/// The memory a session would take, predicted before anything is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Footprint {
    /// Weights held in anonymous memory (copies the engine made, e.g. repacked tensors).
    pub weights_anon_bytes: u64,
    /// Weights read through the file mapping (resident in the page cache while in use).
    pub weights_mapped_bytes: u64,
    /// KV cache bytes per token held, over all layers, K and V.
    pub kv_bytes_per_token: u64,
    /// The KV cache grows in blocks of this many tokens.
    pub kv_block_tokens: u64,
    /// The compute buffer for one forward pass of `n_batch` tokens.
    pub compute_bytes: u64,
    /// Bytes of one row of logits.
    pub logits_row_bytes: u64,
}

impl Footprint {
    /// KV bytes the session holds when it holds `tokens` tokens (rounded up to blocks).
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        let block = self.kv_block_tokens.max(1);
        tokens.div_ceil(block) * block * self.kv_bytes_per_token
    }
}

/// Which rows of a forward pass to return logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// None: the pass only fills the KV cache (prefill of all but the last token).
    None,
    /// The last row: plain decoding.
    Last,
    /// The last `n` rows of the pass: verification of `n - 1` drafted tokens.
    Tail(usize),
}

impl Rows {
    /// How many rows this asks for out of a pass of `batch` tokens.
    pub fn count(self, batch: usize) -> Result<usize> {
        let n = match self {
            Rows::None => 0,
            Rows::Last => 1,
            Rows::Tail(n) => n,
        };
        if n > batch {
            return Err(Error::invalid(format!("asked for logits of {n} rows of a pass of {batch} tokens")));
        }
        Ok(n)
    }
}

/// What every engine's [`Session::decode`] checks before it changes anything: at least one
/// token, every id inside the vocabulary of `n_vocab`, and room for them beside the `held`
/// tokens within `n_ctx`.
pub fn check_decode(tokens: &[Token], n_vocab: usize, held: usize, n_ctx: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::invalid("decode needs at least one token"));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(Error::invalid(format!("token id {bad} is outside the vocabulary (0..{n_vocab})")));
    }
    let needed = held + tokens.len();
    if needed > n_ctx {
        return Err(Error::ContextOverflow { needed, limit: n_ctx, prompt: tokens.len() });
    }
    Ok(())
}

/// What every engine's [`Session::decode_tree`] checks: what [`check_decode`] checks, a
/// parent given for every token, and each parent before its child.
pub fn check_tree(tokens: &[Token], parents: &[u8], n_vocab: usize, held: usize, n_ctx: usize) -> Result<()> {
    check_decode(tokens, n_vocab, held, n_ctx)?;
    if parents.len() != tokens.len() {
        return Err(Error::invalid(format!(
            "a tree of {} tokens needs as many parents, not {}",
            tokens.len(),
            parents.len()
        )));
    }
    if let Some(i) = (1..parents.len()).find(|&i| parents[i] as usize >= i) {
        return Err(Error::invalid(format!(
            "token {i} of a tree has parent {}; a parent comes before its child",
            parents[i]
        )));
    }
    Ok(())
}

/// What every engine's [`Session::keep_path`] checks of `path` in the tree of `parents`: it
/// starts at the first token and each of its tokens is the parent of the next.
pub fn check_path(path: &[u8], parents: &[u8]) -> Result<()> {
    let follows = path.windows(2).all(|w| parents.get(w[1] as usize) == Some(&w[0]) && w[0] < w[1]);
    if path.first() != Some(&0) || !follows {
        return Err(Error::invalid(format!(
            "{path:?} is no path from the first token of the tree {parents:?}"
        )));
    }
    Ok(())
}

/// The depth of each token of the tree of `parents` (see [`Session::decode_tree`]): 0 for
/// the first, one more than its parent's for the others.
pub fn tree_depths(parents: &[u8], out: &mut Vec<usize>) {
    out.clear();
    for (i, &p) in parents.iter().enumerate() {
        let d = if i == 0 { 0 } else { out[p as usize] + 1 };
        out.push(d);
    }
}

/// What every engine's [`Session::restore`] checks before it changes anything: the session is
/// empty (`held` 0), the state is in the session's KV type `kv`, `len` is within the saved
/// tokens, and those are inside the vocabulary and the context. `Ok(false)`: nothing to
/// restore (`len` 0).
pub fn check_restore(
    saved: &SavedState,
    len: usize,
    held: usize,
    kv: KvType,
    n_vocab: usize,
    n_ctx: usize,
) -> Result<bool> {
    if held > 0 {
        return Err(Error::invalid("only an empty session can be restored into"));
    }
    if saved.kv != kv {
        return Err(Error::invalid(format!("a saved {} cache cannot be restored into a {kv} one", saved.kv)));
    }
    if len > saved.tokens.len() {
        return Err(Error::invalid(format!(
            "cannot restore {len} tokens of a saved session of {}",
            saved.tokens.len()
        )));
    }
    if len == 0 {
        return Ok(false);
    }
    check_decode(&saved.tokens[..len], n_vocab, 0, n_ctx)?;
    Ok(true)
}

/// The forward passes a batch of `batch` tokens is split into when it asks for logits of its
/// last `n_rows` rows: passes of at most `n_batch` tokens, and of at most `max_rows` rows of
/// logits. The rows asked for are the batch's tail, so in each pass they are that pass's
/// tail. Each item is the pass's tokens (a range of the batch) and how many rows it returns.
pub fn passes(
    batch: usize,
    n_rows: usize,
    n_batch: usize,
    max_rows: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> {
    let mut c0 = 0;
    std::iter::from_fn(move || {
        let pass = next_pass(c0, batch, n_rows, n_batch, max_rows)?;
        c0 = pass.0.end;
        Some(pass)
    })
}

/// The pass of [`passes`] that starts at token `c0` of the batch, for an engine that sizes
/// each pass when it comes to it (`n_batch` may differ from one call to the next); `None` when
/// `c0` is the batch's end.
pub fn next_pass(
    c0: usize,
    batch: usize,
    n_rows: usize,
    n_batch: usize,
    max_rows: usize,
) -> Option<(std::ops::Range<usize>, usize)> {
    if c0 >= batch {
        return None;
    }
    let want_from = batch - n_rows.min(batch);
    let (n_batch, max_rows) = (n_batch.max(1), max_rows.max(1));
    let mut c1 = (c0 + n_batch).min(batch);
    if c1 > want_from {
        c1 = c1.min(c0.max(want_from) + max_rows);
    }
    Some((c0..c1, c1.saturating_sub(c0.max(want_from))))
}

/// Logits of the rows a [`Session::decode`] asked for, borrowed from the session.
#[derive(Debug, Clone, Copy)]
pub struct Logits<'a> {
    data: &'a [f32],
    n_vocab: usize,
}

impl<'a> Logits<'a> {
    /// Wrap `data`, `rows × n_vocab` values, row-major.
    pub fn new(data: &'a [f32], n_vocab: usize) -> Self {
        debug_assert!(n_vocab > 0 && data.len().is_multiple_of(n_vocab));
        Logits { data, n_vocab }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len() / self.n_vocab
    }

    /// Row `i` (0 = the first row asked for).
    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.n_vocab..(i + 1) * self.n_vocab]
    }

    /// The last row.
    pub fn last(&self) -> &'a [f32] {
        self.row(self.rows() - 1)
    }
}

/// What measurements of a model's speed on a device hold for: the same file, on the same
/// device, with the same kernels and weight format. Cost curves and skip sets are remembered
/// under it (with the threads and KV type for cost curves).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    /// The model's file(s), as [`crate::fingerprint`] hashes them.
    pub fingerprint: String,
    /// The device the model runs on (`CPU`, `Vulkan0`, ...).
    pub device: String,
    /// The kernels of the engine's own that its passes use (`mm-avx512(q4_0,…)+attn-avx512`,
    /// `ggml`, `tract`, ...).
    pub kernels: String,
    /// The format its weight matrices are held in (`stored`, `q8_0`).
    pub weights: String,
}

/// Loaded weights, shared and read-only; sessions are made from it.
pub trait Model: Send + Sync {
    /// What the model is.
    fn info(&self) -> &ModelInfo;

    /// The speculation modes its sessions support: [`SpecMode::Off`], and the drafters whose
    /// needs the engine meets (partial layer plans for `layerskip`, an encoder's source for
    /// `inputcopy`, ...).
    fn drafters(&self) -> &'static [SpecMode];

    /// What measurements of this model on its device are remembered under; `None` when they
    /// cannot be remembered (a model with no file).
    fn cache_key(&self) -> Option<&CacheKey> {
        None
    }

    /// How to measure its verification cost curve ([`crate::cost::measure_cost_curve`]).
    fn cost_curve_config(&self) -> CostCurveConfig {
        CostCurveConfig::default()
    }

    /// The token an encoder-decoder model's decoder starts from; `None` for decoders.
    fn decoder_start(&self) -> Option<Token> {
        None
    }

    /// The model's tokenizer and chat template.
    fn tokenizer(&self) -> &dyn Tokenizer;

    /// The memory a session with `config` would take, computed without allocating it.
    fn footprint(&self, config: &SessionConfig) -> Result<Footprint>;

    /// A new, empty session that reserves what it allocates (compute buffers, each block of
    /// KV cache as it grows, logits) in `ledger` first, and fails with
    /// [`Error::OverBudget`] rather than allocate past it.
    fn session_in(&self, config: &SessionConfig, ledger: &Ledger) -> Result<Box<dyn Session>>;

    /// A new, empty session with no memory budget.
    fn session(&self, config: &SessionConfig) -> Result<Box<dyn Session>> {
        self.session_in(config, &Ledger::unlimited())
    }

    /// What the passes of this model's sessions were, where sessions decoding at the same
    /// time share them (one pass over the weights for all); `None` where each session's passes
    /// are its own.
    fn shared_passes(&self) -> Option<SharedPasses> {
        None
    }

    /// Why the model can no longer compute, if it cannot: a peer holding some of its layers
    /// (ggml's RPC backend) died or stopped answering. A server unloads such a model and loads
    /// it again, peer and all, for the next request.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// What it embeds texts with, where it is an embedding model ([`ModelKind::Embedding`]).
    fn embedder(&self) -> Option<&dyn crate::Embedder> {
        None
    }
}

/// What [`Model::shared_passes`] counts: how many passes, how many of them carried several
/// sessions, and how many sessions' passes those carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SharedPasses {
    /// Passes run (alone or shared).
    pub passes: u64,
    /// Of those, passes of two sessions or more.
    pub shared: u64,
    /// Sessions' passes the shared ones carried (sessions per shared pass: `jobs / shared`).
    pub jobs: u64,
}

/// One conversation's state: the tokens held and their KV cache.
///
/// Positions decoded with a partial [`LayerPlan`] have no KV in the layers the plan skips.
/// The next pass with a different plan (e.g. the full plan that verifies a draft) therefore
/// first recomputes those positions from the tokens the session keeps, in the same batch:
/// the rows asked for count from the end of that whole batch, so `Rows::Tail(k + 1)` after
/// drafting `k` tokens one by one returns exactly the verification rows.
pub trait Session: Send {
    /// Tokens held (the next token's position).
    fn len(&self) -> usize;

    /// Whether the session holds no tokens.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tokens the session holds, in order (`len()` of them). Drafters continue them.
    fn tokens(&self) -> &[Token];

    /// The session's configuration.
    fn config(&self) -> &SessionConfig;

    /// Run the encoder over `tokens` (encoder-decoder models only).
    fn encode(&mut self, _tokens: &[Token]) -> Result<()> {
        Err(Error::Unsupported("this model has no encoder".into()))
    }

    /// Append `tokens` at the current length, running the layers in `plan`, and return the
    /// logits of `rows`.
    fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> Result<Logits<'_>>;

    /// Drop every token from position `len` on.
    fn truncate(&mut self, len: usize) -> Result<()>;

    /// Whether [`Session::decode_tree`] works here: each row of a pass over a tree of drafts
    /// is then bitwise what decoding the path to it would give.
    fn decodes_trees(&self) -> bool {
        false
    }

    /// Append `tokens` as a tree (every layer): token 0 follows what the session holds, token
    /// `i > 0` follows token `parents[i]` (`parents[i] < i`; `parents[0]` is not read). Each
    /// token sits at the position its depth gives and attends to what the session held and
    /// to the tokens on its path; the logits of every row come back. Until
    /// [`Session::keep_path`] the session holds the tokens in the order given, which is no
    /// sequence: call it next.
    fn decode_tree(&mut self, _tokens: &[Token], _parents: &[u8], _plan: &LayerPlan) -> Result<Logits<'_>> {
        Err(Error::Unsupported("this engine decodes drafts as paths, not trees".into()))
    }

    /// After [`Session::decode_tree`] at length `base`: keep the tokens `path` of that tree
    /// (increasing indices into its tokens, each the parent of the next, starting at 0), so
    /// that the session holds `base + path.len()` tokens, that path in order.
    fn keep_path(&mut self, _base: usize, _path: &[u8]) -> Result<()> {
        Err(Error::Unsupported("this engine decodes drafts as paths, not trees".into()))
    }

    /// Bytes this session holds now (KV cache, compute and logits buffers).
    fn memory(&self) -> u64;

    /// Bytes of KV cache this session holds now for the tokens it holds, what
    /// [`Footprint::kv_bytes`] predicts (part of [`Session::memory`]).
    fn kv_bytes(&self) -> u64;

    /// A copy of what the session holds for its tokens (their KV cache, an encoder's output),
    /// to be [restored](Session::restore) into another session of the same model, KV type and
    /// device later: what a parked conversation keeps. `None` where the engine cannot.
    fn save(&self) -> Result<Option<SavedState>> {
        Ok(None)
    }

    /// Make this session, which must be empty, hold the first `len` tokens of `saved` as if
    /// it had decoded them (an encoder-decoder session: the whole source, encoded). Reserves
    /// the KV it takes in the ledger like any decode; on an error the session stays empty.
    fn restore(&mut self, _saved: &SavedState, _len: usize) -> Result<()> {
        Err(Error::Unsupported("this engine cannot restore a saved session".into()))
    }

    /// This session's passes so far: how many, their thread counts summed (with
    /// [`Threads::Auto`] the count can change from pass to pass), their graph splits and
    /// time. Zero for an engine that does not count.
    fn pass_stats(&self) -> PassStats {
        PassStats::default()
    }
}

/// What [`Session::pass_stats`] counts: the forward passes run, the CPU threads they ran on,
/// and where their time went — what shows per-step overhead on a device (a GPU computes a
/// small model's pass in well under a millisecond, so time around it is what a step costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PassStats {
    /// Forward passes run.
    pub passes: u64,
    /// Their thread counts, summed.
    pub threads: u64,
    /// Graph splits summed: the runs of consecutive nodes on one backend that the engine's
    /// scheduler cut each pass's graph into (every split past the first copies its inputs
    /// between backends). 0 where the engine does not say.
    #[serde(default)]
    pub splits: u64,
    /// Nanoseconds in the engine's passes, from the call until the logits were in hand.
    #[serde(default)]
    pub pass_ns: u64,
    /// Of those, nanoseconds computing the graph (on a device: launching it and waiting for
    /// it); the rest is the engine's host work around it (inputs, graph choice, logits copy).
    #[serde(default)]
    pub graph_ns: u64,
}

/// One pass, as [`PassStats::add`] counts it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PassRecord {
    /// CPU threads it ran on.
    pub threads: usize,
    /// Graph splits (0: not known).
    pub splits: usize,
    /// The whole pass.
    pub pass: std::time::Duration,
    /// The graph's computation within it.
    pub graph: std::time::Duration,
}

impl PassStats {
    /// Count one pass.
    pub fn add(&mut self, pass: PassRecord) {
        self.passes += 1;
        self.threads += pass.threads as u64;
        self.splits += pass.splits as u64;
        self.pass_ns += pass.pass.as_nanos() as u64;
        self.graph_ns += pass.graph.as_nanos() as u64;
    }

    /// The passes counted since `earlier`.
    pub fn since(self, earlier: PassStats) -> PassStats {
        PassStats {
            passes: self.passes.saturating_sub(earlier.passes),
            threads: self.threads.saturating_sub(earlier.threads),
            splits: self.splits.saturating_sub(earlier.splits),
            pass_ns: self.pass_ns.saturating_sub(earlier.pass_ns),
            graph_ns: self.graph_ns.saturating_sub(earlier.graph_ns),
        }
    }

    /// Threads per pass on average (0 when none was counted).
    pub fn mean(self) -> f64 {
        self.per_pass(self.threads as f64)
    }

    /// Graph splits per pass on average.
    pub fn splits_per_pass(self) -> f64 {
        self.per_pass(self.splits as f64)
    }

    /// Milliseconds per pass in the engine.
    pub fn pass_ms(self) -> f64 {
        self.per_pass(self.pass_ns as f64 / 1e6)
    }

    /// Milliseconds per pass computing the graph.
    pub fn graph_ms(self) -> f64 {
        self.per_pass(self.graph_ns as f64 / 1e6)
    }

    fn per_pass(self, total: f64) -> f64 {
        if self.passes == 0 { 0.0 } else { total / self.passes as f64 }
    }
}

/// What a session held for its tokens, copied out by [`Session::save`]: the tokens and the
/// engine's bytes for them (their KV cache in the engine's own layout). Only the engine that
/// wrote it can read it, and only for the same model, device and KV type: the key under which
/// it is kept says which ([`CacheKey`] and `kv`).
#[derive(Clone, PartialEq, Eq)]
pub struct SavedState {
    /// The tokens it holds state for, from position 0.
    pub tokens: Vec<Token>,
    /// The KV type the state is in.
    pub kv: KvType,
    /// The engine's bytes.
    pub data: Vec<u8>,
}

impl SavedState {
    /// Bytes it takes in memory.
    pub fn bytes(&self) -> u64 {
        (self.data.len() + self.tokens.len() * size_of::<Token>()) as u64
    }
}

impl fmt::Debug for SavedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SavedState")
            .field("tokens", &self.tokens.len())
            .field("kv", &self.kv)
            .field("bytes", &self.data.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn kv_types_are_written_as_one_type_or_keys_slash_values() {
        for kv in KvType::ALL {
            assert_eq!(kv.name().parse::<KvType>().unwrap(), kv);
            assert_eq!(serde_json::to_string(&kv).unwrap(), format!("\"{kv}\""));
        }
        let mixed: KvType = "Q8_0 / q4_0".parse().unwrap();
        assert_eq!(mixed, KvType::new(KvElement::Q8_0, KvElement::Q4_0));
        assert_eq!(mixed.to_string(), "q8_0/q4_0");
        assert_eq!("f16/q8_0".parse::<KvType>().unwrap().name(), "f16/q8_0");
        assert_eq!(serde_json::from_str::<KvType>("\"q8_0/q4_0\"").unwrap(), KvType::Q8_0_Q4_0);
        assert_eq!(KvType::Q8_0_Q4_0.bytes_for(64), 68 + 36);
        let e = "q8_0/q3".parse::<KvType>().unwrap_err().to_string();
        assert!(e.contains("q8_0/q3") && e.contains("q8_0/q4_0"), "{e}");
    }

    use super::*;

    #[test]
    fn passes_hold_the_rows_asked_for_at_their_tails() {
        // 10 tokens, the last 5 rows, passes of 4 tokens and 2 rows.
        let got: Vec<_> = passes(10, 5, 4, 2).collect();
        assert_eq!(got, [(0..4, 0), (4..7, 2), (7..9, 2), (9..10, 1)]);
        assert_eq!(passes(3, 0, 8, 2).collect::<Vec<_>>(), [(0..3, 0)]);
        assert_eq!(passes(1, 1, 8, 2).collect::<Vec<_>>(), [(0..1, 1)]);
    }

    #[test]
    fn decode_checks_name_what_is_wrong() {
        assert!(check_decode(&[], 10, 0, 8).unwrap_err().to_string().contains("at least one token"));
        assert!(check_decode(&[10], 10, 0, 8).unwrap_err().to_string().contains("outside the vocabulary"));
        assert!(matches!(
            check_decode(&[1, 2], 10, 7, 8),
            Err(Error::ContextOverflow { needed: 9, limit: 8, prompt: 2 })
        ));
        assert!(check_decode(&[1], 10, 7, 8).is_ok());
    }
}
