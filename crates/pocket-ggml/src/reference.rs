//! llama.cpp itself, through llama.h: the reference our logits are checked against and the
//! baseline our speed is compared with.

use std::path::Path;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;
use pocket_core::{KvType, Token};

use crate::ffi::device::cstring;
use crate::kv::ggml_type;
use crate::{Error, Result};

/// A llama.cpp model and context for one sequence, set up like our engine: same threads,
/// flash attention, same KV type, weights memory-mapped with the same repacking.
pub struct LlamaCpp {
    ctx: NonNull<sys::llama_context>,
    /// A persistent thread pool, as llama-cli attaches one (and as our sessions have): without
    /// it ggml would start and join its threads on every decode, and the baseline would look
    /// slower than llama.cpp is.
    threadpool: NonNull<sys::ggml_threadpool>,
    model: NonNull<sys::llama_model>,
    batch: sys::llama_batch,
    n_batch: usize,
    n_vocab: usize,
    n_past: usize,
    logits: Vec<f32>,
}

impl Drop for LlamaCpp {
    fn drop(&mut self) {
        // SAFETY: all were created in `load` and are freed once: the context before the model
        // and the thread pool it uses.
        unsafe {
            sys::llama_batch_free(self.batch);
            sys::llama_free(self.ctx.as_ptr());
            sys::ggml_threadpool_free(self.threadpool.as_ptr());
            sys::llama_model_free(self.model.as_ptr());
        }
    }
}

impl LlamaCpp {
    /// Load `path` with a context of `n_ctx` tokens; `repack` is llama.cpp's
    /// `use_extra_bufts` (on by default there; compare with a model loaded with the same
    /// [`crate::LoadOptions::repack`] for identical arithmetic).
    pub fn load(
        path: &Path,
        threads: usize,
        n_ctx: usize,
        n_batch: usize,
        kv: KvType,
        gpu: bool,
        repack: bool,
    ) -> Result<Self> {
        crate::ffi::init();
        let cpath = cstring(&path.to_string_lossy());
        let fail = |what: &str| Error::Ggml(format!("llama.cpp could not {what} {}", path.display()));
        // SAFETY: default parameters adjusted field by field; cpath is a valid C string.
        let model = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = if gpu { 999 } else { 0 };
            p.use_extra_bufts = repack;
            sys::llama_model_load_from_file(cpath.as_ptr(), p)
        };
        let model = NonNull::new(model).ok_or_else(|| fail("load"))?;
        // SAFETY: a loaded model.
        let n_vocab =
            unsafe { sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model.as_ptr())) } as usize;
        // SAFETY: default parameters adjusted field by field for a loaded model.
        let ctx = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = n_ctx as u32;
            p.n_batch = n_batch as u32;
            p.n_ubatch = n_batch as u32;
            p.n_seq_max = 1;
            p.n_threads = threads as i32;
            p.n_threads_batch = threads as i32;
            p.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
            p.type_k = ggml_type(kv);
            p.type_v = ggml_type(kv);
            p.no_perf = true;
            sys::llama_init_from_model(model.as_ptr(), p)
        };
        let Some(ctx) = NonNull::new(ctx) else {
            // SAFETY: loaded above, not yet owned by a LlamaCpp.
            unsafe { sys::llama_model_free(model.as_ptr()) };
            return Err(fail("create a context for"));
        };
        // SAFETY: default parameters for `threads` threads; the pool outlives the context (Drop).
        let threadpool = unsafe {
            let mut params = sys::ggml_threadpool_params_default(threads as i32);
            NonNull::new(sys::ggml_threadpool_new(&mut params))
        };
        let Some(threadpool) = threadpool else {
            // SAFETY: created above, not yet owned by a LlamaCpp.
            unsafe {
                sys::llama_free(ctx.as_ptr());
                sys::llama_model_free(model.as_ptr());
            }
            return Err(fail("start a thread pool for"));
        };
        // SAFETY: a live context and pool; the same pool serves single tokens and batches.
        unsafe { sys::llama_attach_threadpool(ctx.as_ptr(), threadpool.as_ptr(), threadpool.as_ptr()) };
        // SAFETY: a batch for n_batch tokens of one sequence.
        let batch = unsafe { sys::llama_batch_init(n_batch as i32, 0, 1) };
        Ok(LlamaCpp { ctx, threadpool, model, batch, n_batch, n_vocab, n_past: 0, logits: Vec::new() })
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Forget the sequence.
    pub fn clear(&mut self) {
        // SAFETY: valid context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx.as_ptr()), true) };
        self.n_past = 0;
    }

    /// Append `tokens`; returns the logits of every token if `all_rows`, else of the last one.
    pub fn decode(&mut self, tokens: &[Token], all_rows: bool) -> Result<&[f32]> {
        self.logits.clear();
        for chunk in tokens.chunks(self.n_batch) {
            let last_chunk = std::ptr::eq(chunk.as_ptr_range().end, tokens.as_ptr_range().end);
            // SAFETY: the batch was made for n_batch tokens of one sequence; chunk has at most
            // n_batch tokens; logits are read only for rows flagged for output.
            unsafe {
                let b = &mut self.batch;
                b.n_tokens = chunk.len() as i32;
                for (i, &t) in chunk.iter().enumerate() {
                    *b.token.add(i) = t as sys::llama_token;
                    *b.pos.add(i) = (self.n_past + i) as i32;
                    *b.n_seq_id.add(i) = 1;
                    *(*b.seq_id.add(i)) = 0;
                    *b.logits.add(i) = (all_rows || (last_chunk && i + 1 == chunk.len())) as i8;
                }
                let rc = sys::llama_decode(self.ctx.as_ptr(), *b);
                if rc != 0 {
                    return Err(Error::Ggml(format!("llama_decode failed ({rc})")));
                }
                for i in 0..chunk.len() {
                    if all_rows || (last_chunk && i + 1 == chunk.len()) {
                        let row = sys::llama_get_logits_ith(self.ctx.as_ptr(), i as i32);
                        if row.is_null() {
                            return Err(Error::Ggml("llama.cpp returned no logits".into()));
                        }
                        self.logits.extend_from_slice(std::slice::from_raw_parts(row, self.n_vocab));
                    }
                }
            }
            self.n_past += chunk.len();
        }
        Ok(&self.logits)
    }
}
