//! llama.cpp itself, through llama.h: the reference our logits are checked against and the
//! baseline our speed is compared with.

use std::path::Path;
use std::sync::Arc;

use pocket_core::{KvType, Token};

use crate::ffi::llama::{ContextParams, LlamaContext, LlamaWeights, Load};
use crate::{Error, Result};

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
        let weights = LlamaWeights::load(path, Load::Full { gpu, repack })
            .ok_or_else(|| Error::Ggml(format!("llama.cpp could not load {}", path.display())))?;
        // llama.cpp runs on the count it is given, as its programs do.
        let threads = pocket_core::Threads::Fixed(threads.max(1));
        let params = ContextParams { n_ctx, n_batch, max_rows: n_batch, threads, kv, flash_attn: true };
        let ctx = LlamaContext::new(Arc::new(weights), &params)?;
        Ok(LlamaCpp { ctx, n_past: 0, logits: Vec::new() })
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
