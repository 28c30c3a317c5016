//! llama.cpp itself, through llama.h: the reference our logits are checked against and the
//! baseline our speed is compared with.

use std::path::Path;
use std::sync::Arc;

use pocket_core::{KvType, Token};

use crate::ffi::llama::{ContextParams, LlamaContext, LlamaWeights, Load};
use crate::{Error, Result};

/// One sequence of [`LlamaCpp::generate_together`]: its tokens, and when (from the start) its
/// first token was chosen and its last one.
#[derive(Debug, Clone, Default)]
pub struct Together {
    /// Generated tokens, the end token not included.
    pub tokens: Vec<Token>,
    /// When its first token was chosen.
    pub first_at: std::time::Duration,
    /// When its last kept token was chosen.
    pub last_at: std::time::Duration,
    sampled_at: std::time::Duration,
}

/// A llama.cpp model and context for one sequence, set up like our engine: same threads,
/// flash attention, same KV type, weights memory-mapped with the same repacking.
pub struct LlamaCpp {
    ctx: LlamaContext,
    n_past: usize,
    logits: Vec<f32>,
}

impl LlamaCpp {
    /// Load `path` with a context of `n_ctx` tokens; `repack` is llama.cpp's
    /// `use_extra_bufts` (on by default there; for identical arithmetic compare `false` with a
    /// model loaded with [`crate::Repack::None`]).
    pub fn load(
        path: &Path,
        threads: usize,
        n_ctx: usize,
        n_batch: usize,
        kv: KvType,
        gpu: bool,
        repack: bool,
    ) -> Result<Self> {
        Self::load_parallel(path, threads, n_ctx, n_batch, kv, gpu, repack, 1)
    }

    /// As [`LlamaCpp::load_parallel`] on the CPU, with the layers `split` says on peers (ggml's
    /// RPC backend, through the same links our engine uses), as llama.cpp's `--rpc` with `-ngl`
    /// places them: what our split is compared with.
    #[allow(clippy::too_many_arguments)]
    pub fn load_split(
        path: &Path,
        threads: usize,
        n_ctx: usize,
        n_batch: usize,
        kv: KvType,
        repack: bool,
        n_seq: usize,
        split: &crate::rpc::SplitOptions,
    ) -> Result<Self> {
        let file = crate::ffi::gguf::GgufFile::open(path)?;
        let plan = crate::split::plan(&file, crate::split::n_layer(&file)?, split, "CPU")?;
        let load = match &plan {
            Some(plan) => Load::Split {
                remote: &plan.remote,
                remote_layers: plan.remote.layers.iter().filter(|l| l.is_some()).count(),
                repack,
            },
            None => Load::Full { gpu: false, repack },
        };
        let weights = LlamaWeights::load(path, load)
            .ok_or_else(|| Error::Ggml(format!("llama.cpp could not load {}", path.display())))?;
        Self::on(weights, threads, n_ctx, n_batch, kv, n_seq)
    }

    /// As [`LlamaCpp::load`], for `n_seq` sequences of `n_ctx` tokens each that decode
    /// together ([`LlamaCpp::generate_together`]), as llama.cpp's server batches its slots
    /// (`-np`).
    #[allow(clippy::too_many_arguments)]
    pub fn load_parallel(
        path: &Path,
        threads: usize,
        n_ctx: usize,
        n_batch: usize,
        kv: KvType,
        gpu: bool,
        repack: bool,
        n_seq: usize,
    ) -> Result<Self> {
        let weights = LlamaWeights::load(path, Load::Full { gpu, repack })
            .ok_or_else(|| Error::Ggml(format!("llama.cpp could not load {}", path.display())))?;
        Self::on(weights, threads, n_ctx, n_batch, kv, n_seq)
    }

    /// A context for `n_seq` sequences of `n_ctx` tokens on `weights`.
    fn on(
        weights: LlamaWeights,
        threads: usize,
        n_ctx: usize,
        n_batch: usize,
        kv: KvType,
        n_seq: usize,
    ) -> Result<Self> {
        // llama.cpp runs on the count it is given, as its programs do.
        let threads = pocket_core::Threads::Fixed(threads.max(1));
        let n_seq = n_seq.max(1);
        let n_batch = n_batch.max(n_seq);
        let params = ContextParams {
            n_ctx: n_ctx * n_seq,
            n_batch,
            max_rows: n_batch,
            threads,
            kv,
            flash_attn: true,
            n_seq,
        };
        let ctx = LlamaContext::new(Arc::new(weights), &params)?;
        Ok(LlamaCpp { ctx, n_past: 0, logits: Vec::new() })
    }

    /// Greedy generation for every prompt at once, one sequence each (at most the context's
    /// sequences): each prompt is read, then every step decodes the next token of every
    /// sequence still going in one batch. A sequence stops at `is_end`, at its `max_tokens`,
    /// or when its share of the context is full. The clock readings are from the start.
    pub fn generate_together(
        &mut self,
        prompts: &[&[Token]],
        max_tokens: &[usize],
        n_ctx: usize,
        is_end: &dyn Fn(Token) -> bool,
    ) -> Result<Vec<Together>> {
        self.clear();
        let start = std::time::Instant::now();
        let n_vocab = self.n_vocab();
        let mut out: Vec<Together> = Vec::with_capacity(prompts.len());
        let mut next = Vec::with_capacity(prompts.len());
        for (seq, prompt) in prompts.iter().enumerate() {
            self.logits.clear();
            self.ctx.prefill_seq(prompt, seq, &mut self.logits)?;
            next.push(pocket_core::argmax(&self.logits) as Token);
            let at = start.elapsed();
            out.push(Together { first_at: at, sampled_at: at, ..Together::default() });
        }
        let mut going: Vec<usize> = (0..prompts.len()).filter(|&s| max_tokens[s] > 0).collect();
        loop {
            // Take each going sequence's pending token; those that end stop here.
            going.retain(|&s| {
                let t = next[s];
                if is_end(t) {
                    return false;
                }
                out[s].tokens.push(t);
                out[s].last_at = out[s].sampled_at;
                out[s].tokens.len() < max_tokens[s] && prompts[s].len() + out[s].tokens.len() < n_ctx
            });
            if going.is_empty() {
                break;
            }
            let items: Vec<(Token, usize, usize)> =
                going.iter().map(|&s| (next[s], prompts[s].len() + out[s].tokens.len() - 1, s)).collect();
            self.logits.clear();
            self.ctx.decode_seqs(&items, &mut self.logits)?;
            let now = start.elapsed();
            for (row, &s) in going.iter().enumerate() {
                next[s] = pocket_core::argmax(&self.logits[row * n_vocab..(row + 1) * n_vocab]) as Token;
                out[s].sampled_at = now;
            }
        }
        Ok(out)
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.ctx.weights().n_vocab()
    }

    /// Forget the sequence.
    pub fn clear(&mut self) {
        self.ctx.clear();
        self.n_past = 0;
    }

    /// Append `tokens`; returns the logits of every token if `all_rows`, else of the last one.
    pub fn decode(&mut self, tokens: &[Token], all_rows: bool) -> Result<&[f32]> {
        self.logits.clear();
        let n_batch = self.ctx.n_batch();
        for (i, chunk) in tokens.chunks(n_batch).enumerate() {
            let last_chunk = (i + 1) * n_batch >= tokens.len();
            let out_from = if all_rows {
                0
            } else if last_chunk {
                chunk.len() - 1
            } else {
                chunk.len()
            };
            self.ctx.decode(chunk, self.n_past, out_from, &mut self.logits)?;
            self.n_past += chunk.len();
        }
        Ok(&self.logits)
    }
}
