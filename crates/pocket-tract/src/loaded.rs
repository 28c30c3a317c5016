//! What a loaded encoder-decoder model's sessions share with it ([`Inner`]): its graphs,
//! tokenizer and dimensions, its thread pools, and what a session of it takes in memory.

use std::collections::HashMap;
use std::sync::Mutex;

use pocket_core::{CacheKey, Footprint, ModelInfo, SessionConfig, Token};
use tract_linalg::multithread::Executor;

use crate::KV_WINDOW;
use crate::kv::kv_bytes_per_token;
use crate::layout::Layout;
use crate::roles::{DecoderGraph, EncoderGraph};
use crate::tokenizer::HfTokenizer;

/// What sessions share with the model.
pub(crate) struct Inner {
    pub(crate) info: ModelInfo,
    pub(crate) layout: Layout,
    pub(crate) tokenizer: HfTokenizer,
    pub(crate) encoder: EncoderGraph,
    pub(crate) decoder: DecoderGraph,
    pub(crate) with_past: Option<DecoderGraph>,
    pub(crate) decoder_start: Token,
    /// Attention heads and their width (of the cache where there is one, else from
    /// config.json or a guess), for the footprint.
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    /// One thread pool per thread count, shared by the sessions that ask for it.
    pub(crate) executors: Mutex<HashMap<usize, Executor>>,
    /// What measurements of this model are remembered under.
    pub(crate) cache_key: Option<CacheKey>,
}

impl Inner {
    /// The thread pool for `threads` threads.
    pub(crate) fn executor(&self, threads: usize) -> Executor {
        let threads = threads.max(1);
        if threads == 1 {
            return Executor::SingleThread;
        }
        let mut pools = self.executors.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(threads)
            .or_insert_with(|| Executor::multithread_with_name(threads, "pocket-tract"))
            .clone()
    }

    /// Bytes tract's intermediate tensors take in one decoder call over `positions` positions
    /// of which `rows` return logits, with `past` cached tokens written out as f32 (an
    /// estimate from the shapes: logits, a few model-width activations per position, the
    /// attention scores, and the past and present K/V of a with-past call).
    pub(crate) fn compute_bytes(&self, positions: usize, rows: usize, past: usize) -> u64 {
        let i = &self.info;
        let activations = positions * 8 * i.n_embd.max(self.heads * self.head_dim);
        let scores = 2 * self.heads * positions * (past + positions);
        let kv = if self.with_past.is_some() {
            2 * 2 * i.n_layers * self.heads * self.head_dim * (past + positions)
        } else {
            0
        };
        (4 * (rows * i.n_vocab + activations + scores + kv)) as u64
    }

    /// What a session of this model with `config` takes in memory ([`pocket_core::Model::footprint`]).
    pub(crate) fn footprint(&self, config: &SessionConfig) -> pocket_core::Result<Footprint> {
        let n_ctx = config.n_ctx.max(1);
        let (kv_bytes_per_token, kv_block_tokens, compute_bytes) = if self.with_past.is_some() {
            let per_token = kv_bytes_per_token(config.kv, self.info.n_layers, self.heads, self.head_dim);
            // Quantized groups are 32 tokens; the f32 window is charged at the quantized rate
            // plus its own f32 bytes in the compute figure.
            let f32_only =
                [config.kv.k, config.kv.v].iter().all(|&t| crate::kv::kv_bits(t) == crate::kivi::Bits::F32);
            let block = if f32_only { 1 } else { 32 };
            let rows = config.max_rows.max(1);
            (per_token.ceil() as u64, block, self.compute_bytes(rows, rows, n_ctx))
        } else {
            // Every call recomputes the prefix: no cache, but a pass over all of it.
            (0, 1, self.compute_bytes(n_ctx, n_ctx, 0))
        };
        // The encoder's output and the cross-attention K/V are held for the source (at most
        // n_ctx tokens): charged per context token with the compute.
        let source =
            (n_ctx * 4 * (self.info.n_embd + 2 * self.info.n_layers * self.heads * self.head_dim)) as u64;
        let window = (KV_WINDOW * 2 * 4 * self.info.n_layers * self.heads * self.head_dim) as u64;
        Ok(Footprint {
            weights_anon_bytes: self.layout.graph_bytes(),
            weights_mapped_bytes: 0,
            kv_bytes_per_token,
            kv_block_tokens,
            compute_bytes: compute_bytes + source + window,
            logits_row_bytes: (self.info.n_vocab * 4) as u64,
        })
    }
}
