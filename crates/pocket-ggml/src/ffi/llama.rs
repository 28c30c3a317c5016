//! llama.cpp's own model and context (llama.h), as safe handles: [`LlamaWeights`] (a loaded
//! `llama_model`, shared by every context and by the vocabulary) and [`LlamaContext`] (one
//! sequence's KV cache, compute buffers and thread pool).

use std::cell::RefCell;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use pocket_core::cpu::governor;
use pocket_core::{KvType, Threads, Token};

use super::types::ggml_type;
use crate::error::{Error, Result};
use crate::ffi::device::{Remote, cstring};
use crate::ffi::pools::Pools;

/// What to load of a GGUF file.
#[derive(Clone, Copy)]
pub(crate) enum Load<'a> {
    /// The vocabulary and metadata only (no tensors).
    VocabOnly,
    /// Everything: weights memory-mapped, on the GPU if `gpu`; `repack` is llama.cpp's
    /// `use_extra_bufts` (its CPU repacking buffer types).
    Full { gpu: bool, repack: bool },
    /// Everything, the last `remote_layers` layers on `remote`'s devices (peers reached
    /// through ggml's RPC backend), the rest on the CPU, as llama.cpp's `--rpc` with
    /// `-ngl` places them.
    Split { remote: &'a Remote, remote_layers: usize, repack: bool },
}

/// A `llama_model`: weights (or only the vocabulary) and metadata, read-only once loaded.
pub(crate) struct LlamaWeights {
    model: NonNull<sys::llama_model>,
    /// The links to the peers holding some of its layers (a split model's): a computation
    /// after one was lost gave made-up results.
    links: Vec<Arc<crate::rpc::Link>>,
    /// Whether its contexts compute one token a pass: on an OpenVINO device. ggml-openvino
    /// keys the models it compiles by a graph's node count and first and last node names, and
    /// llama.cpp's graphs of a prompt and of a single step share them there: the model compiled
    /// for a prompt's width was run for the next step, which failed ("the model input
    /// [1,1,160,576] and the tensor (1,1,1,576) are incompatible"). One width compiles once.
    one_token_passes: bool,
}

// SAFETY: a loaded llama_model is only read afterwards (llama.cpp's server shares one between
// the contexts of all its slots, on any thread); contexts keep their own mutable state.
unsafe impl Send for LlamaWeights {}
// SAFETY: as for Send.
unsafe impl Sync for LlamaWeights {}

impl Drop for LlamaWeights {
    fn drop(&mut self) {
        // SAFETY: loaded in `load` and freed once; every context and vocabulary using it holds
        // an `Arc` to it, so none outlives it.
        unsafe { sys::llama_model_free(self.model.as_ptr()) }
    }
}

/// Whether ggml's OpenVINO backend computes in this process: a model loaded on a GPU device
/// is then on it (a build has no other GPU backend beside it).
fn openvino_started() -> bool {
    #[cfg(feature = "openvino")]
    return crate::ffi::openvino::selected().is_some();
    #[cfg(not(feature = "openvino"))]
    false
}

impl LlamaWeights {
    /// Load `path` as `what` says; `None` when llama.cpp refuses the file (it logs why).
    pub(crate) fn load(path: &Path, what: Load<'_>) -> Option<Self> {
        crate::ffi::init();
        let cpath = cstring(&path.to_string_lossy());
        let mut devices: Vec<sys::ggml_backend_dev_t> = Vec::new();
        let mut links = Vec::new();
        // SAFETY: default parameters adjusted field by field; cpath is a valid C string; the
        // NULL-terminated device list outlives the call, which copies it.
        let model = unsafe {
            let mut p = sys::llama_model_default_params();
            match what {
                Load::VocabOnly => p.vocab_only = true,
                Load::Full { gpu, repack } => {
                    p.n_gpu_layers = if gpu { 999 } else { 0 };
                    p.use_extra_bufts = repack;
                    if !gpu {
                        // No devices but the CPU: with every device (a null list) llama.cpp
                        // still hands a GPU backend the larger products of a pass, and the
                        // OpenVINO backend the whole graph.
                        devices.push(std::ptr::null_mut());
                        p.devices = devices.as_mut_ptr();
                    }
                }
                Load::Split { remote, remote_layers, repack } => {
                    devices.extend(remote.devices.iter().map(|d| d.dev));
                    devices.push(std::ptr::null_mut());
                    links.extend(remote.devices.iter().map(|d| Arc::clone(&d.link)));
                    p.devices = devices.as_mut_ptr();
                    p.n_gpu_layers = remote_layers as i32;
                    p.use_extra_bufts = repack;
                }
            }
            sys::llama_model_load_from_file(cpath.as_ptr(), p)
        };
        let on_openvino = matches!(what, Load::Full { gpu: true, .. }) && openvino_started();
        NonNull::new(model).map(|model| LlamaWeights { model, links, one_token_passes: on_openvino })
    }

    /// Why a peer holding some of the layers stopped answering, if one did.
    pub(crate) fn lost_peer(&self) -> Option<String> {
        self.links.iter().find_map(|l| l.lost())
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::llama_model {
        self.model.as_ptr()
    }

    /// The vocabulary, alive as long as `self`.
    pub(crate) fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: a loaded model.
        unsafe { sys::llama_model_get_vocab(self.model.as_ptr()) }
    }

    /// Tokens in the vocabulary.
    pub(crate) fn n_vocab(&self) -> usize {
        // SAFETY: a loaded model's vocabulary.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) }.max(0) as usize
    }

    /// Layers, embedding width and training context, as llama.cpp read them.
    pub(crate) fn dims(&self) -> (usize, usize, usize) {
        let m = self.model.as_ptr();
        // SAFETY: a loaded model; plain getters.
        let (layers, embd, ctx) = unsafe {
            (sys::llama_model_n_layer(m), sys::llama_model_n_embd(m), sys::llama_model_n_ctx_train(m))
        };
        (layers.max(0) as usize, embd.max(0) as usize, ctx.max(0) as usize)
    }

    /// Whether its memory is (partly) a recurrent state rather than a KV cache: such a
    /// sequence cannot be rolled back to an earlier position.
    pub(crate) fn is_recurrent(&self) -> bool {
        // SAFETY: a loaded model; plain getters.
        unsafe {
            sys::llama_model_is_recurrent(self.model.as_ptr())
                || sys::llama_model_is_hybrid(self.model.as_ptr())
        }
    }

    /// Whether it has an encoder (T5 and the like), which this engine does not drive.
    pub(crate) fn has_encoder(&self) -> bool {
        // SAFETY: a loaded model; plain getter.
        unsafe { sys::llama_model_has_encoder(self.model.as_ptr()) }
    }

    /// The chat template the file ships, if any.
    pub(crate) fn chat_template(&self) -> Option<std::ffi::CString> {
        // SAFETY: a loaded model; the template string, if any, is owned by the model and copied.
        unsafe {
            let t = sys::llama_model_chat_template(self.model.as_ptr(), std::ptr::null());
            (!t.is_null()).then(|| std::ffi::CStr::from_ptr(t).to_owned())
        }
    }
}

/// How to set up a [`LlamaContext`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContextParams {
    /// Tokens of context (llama.cpp rounds it up to 256).
    pub n_ctx: usize,
    /// Most tokens of one `llama_decode` (one micro-batch).
    pub n_batch: usize,
    /// Most rows of logits one `llama_decode` returns (bounds the compute buffer's logits).
    pub max_rows: usize,
    /// Threads of each decode: its pool has `threads.max()`, the governor says how many run.
    pub threads: Threads,
    pub kv: KvType,
    /// Flash attention on (as our graph computes it) rather than llama.cpp's choice.
    pub flash_attn: bool,
    /// Sequences the context holds (as llama.cpp's server's `-np` slots): each its own part of
    /// the cache, `n_ctx / n_seq` tokens.
    pub n_seq: usize,
}

/// The buffers llama.cpp allocated for a context, as it reported them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ContextBuffers {
    /// KV cache (and recurrent state) bytes.
    pub kv: u64,
    /// Compute and output buffers.
    pub compute: u64,
}

/// One sequence on a `llama_model`: its KV cache, compute buffers and thread pools.
pub(crate) struct LlamaContext {
    ctx: NonNull<sys::llama_context>,
    /// Persistent thread pools, as llama-cli attaches one (without, ggml would start and join
    /// its threads on every decode): one per thread count decodes have run on, and the count
    /// of the one attached.
    pools: Pools,
    attached: usize,
    batch: sys::llama_batch,
    n_batch: usize,
    n_vocab: usize,
    buffers: ContextBuffers,
    threads: Threads,
    // Dropped after the context (Drop frees the context first).
    weights: Arc<LlamaWeights>,
}

// SAFETY: the context, its batch and thread pool belong to this value alone and are used by
// one thread at a time (`&mut self`); ggml's pool threads do not care which thread submits.
unsafe impl Send for LlamaContext {}

impl Drop for LlamaContext {
    fn drop(&mut self) {
        // SAFETY: both were created in `new` and are freed once, the context before the
        // thread pools it uses (a field, dropped after this; the model is freed when the last
        // Arc goes, after that).
        unsafe {
            sys::llama_batch_free(self.batch);
            sys::llama_free(self.ctx.as_ptr());
        }
    }
}

thread_local! {
    /// llama.cpp's log lines on this thread while a context is created, to read the sizes of
    /// the buffers it allocated (llama.h has no other way to ask).
    static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// Called by the log callback: keep `line` if this thread is capturing.
pub(crate) fn capture(line: &str) {
    CAPTURED.with(|c| {
        if let Some(lines) = c.borrow_mut().as_mut() {
            lines.push(line.to_owned());
        }
    });
}

/// The bytes in llama.cpp's "… buffer size = 12.34 MiB" log lines, KV (and recurrent state)
/// apart from the rest, rounded up to the printed precision.
fn buffer_sizes(lines: &[String]) -> ContextBuffers {
    let mut sizes = ContextBuffers::default();
    for line in lines {
        let Some((what, rest)) = line.split_once(" buffer size = ") else { continue };
        let Some(mib) = rest.trim().strip_suffix("MiB").and_then(|n| n.trim().parse::<f64>().ok()) else {
            continue;
        };
        let bytes = ((mib + 0.005) * 1024.0 * 1024.0).ceil() as u64;
        if what.ends_with(" KV") || what.ends_with(" RS") {
            sizes.kv += bytes;
        } else {
            sizes.compute += bytes;
        }
    }
    sizes
}

impl LlamaContext {
    /// A context of `params` on `weights`.
    pub(crate) fn new(weights: Arc<LlamaWeights>, params: &ContextParams) -> Result<Self> {
        Self::create(weights, params, |_| {})
    }

    /// A context that embeds: passes of up to `n_batch` tokens of up to `n_seq` sequences,
    /// each sequence's token vectors pooled as the model says (an encoder keeps no cache, so
    /// every sequence of a pass must fit in it whole).
    pub(crate) fn for_embeddings(
        weights: Arc<LlamaWeights>,
        n_batch: usize,
        n_seq: usize,
        threads: Threads,
    ) -> Result<Self> {
        let params = ContextParams {
            n_ctx: n_batch,
            n_batch,
            max_rows: n_batch,
            threads,
            kv: KvType::default(),
            flash_attn: false,
            n_seq,
        };
        Self::create(weights, &params, |p| {
            p.embeddings = true;
            p.pooling_type = sys::LLAMA_POOLING_TYPE_UNSPECIFIED;
            p.kv_unified = true;
        })
    }

    fn create(
        weights: Arc<LlamaWeights>,
        params: &ContextParams,
        adjust: impl FnOnce(&mut sys::llama_context_params),
    ) -> Result<Self> {
        let fail = |what: &str| Error::Ggml(format!("llama.cpp could not {what}"));
        let n_batch = params.n_batch.clamp(1, params.n_ctx.max(1));
        let max = params.threads.max();
        let mut pools = Pools::new(max);
        CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
        // SAFETY: default parameters adjusted field by field for a loaded model.
        let ctx = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = params.n_ctx as u32;
            p.n_batch = n_batch as u32;
            p.n_ubatch = if weights.one_token_passes { 1 } else { n_batch as u32 };
            p.n_seq_max = params.n_seq.max(1) as u32;
            // One cache per sequence, as the server's slots that share no prefix.
            p.kv_unified = params.n_seq <= 1;
            p.n_outputs_max = params.max_rows.clamp(1, n_batch) as u32;
            p.n_threads = max as i32;
            p.n_threads_batch = max as i32;
            if params.flash_attn {
                p.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
            }
            p.type_k = ggml_type(params.kv.k);
            p.type_v = ggml_type(params.kv.v);
            // Every layer keeps the whole context: a sliding-window cache of the window's size
            // could not be rolled back past a rejected draft.
            p.swa_full = true;
            p.no_perf = true;
            adjust(&mut p);
            sys::llama_init_from_model(weights.as_ptr(), p)
        };
        let lines = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
        let ctx = NonNull::new(ctx).ok_or_else(|| fail("create a context (see the log for why)"))?;
        let pool = match pools.get(max) {
            Ok(pool) => pool,
            Err(e) => {
                // SAFETY: created above, not yet owned by a LlamaContext.
                unsafe { sys::llama_free(ctx.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: a live context and pool, which outlives it (Drop); the same pool serves
        // single tokens and batches.
        unsafe { sys::llama_attach_threadpool(ctx.as_ptr(), pool.as_ptr(), pool.as_ptr()) };
        // SAFETY: a batch for n_batch tokens of one sequence, freed in Drop.
        let batch = unsafe { sys::llama_batch_init(n_batch as i32, 0, 1) };
        let n_vocab = weights.n_vocab();
        let buffers = buffer_sizes(&lines);
        Ok(LlamaContext {
            ctx,
            pools,
            attached: max,
            batch,
            n_batch,
            n_vocab,
            buffers,
            threads: params.threads,
            weights,
        })
    }

    /// The buffers llama.cpp allocated for this context (zero where it did not say).
    pub(crate) fn buffers(&self) -> ContextBuffers {
        self.buffers
    }

    /// The model.
    pub(crate) fn weights(&self) -> &Arc<LlamaWeights> {
        &self.weights
    }

    /// Tokens one `decode` call may pass.
    pub(crate) fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Decode `tokens` (at most [`Self::n_batch`]) at positions `pos0..` of the sequence,
    /// appending to `out` the logits of the rows from `out_from` on; returns the CPU threads
    /// it ran on (as many as the governor gave it).
    pub(crate) fn decode(
        &mut self,
        tokens: &[Token],
        pos0: usize,
        out_from: usize,
        out: &mut Vec<f32>,
    ) -> Result<usize> {
        let rows = tokens.iter().enumerate().map(|(i, &t)| BatchRow {
            token: t,
            pos: pos0 + i,
            seq: 0,
            logits: i >= out_from,
        });
        self.decode_rows(rows, out)
    }

    /// Decode one token for each of several sequences (`(token, position, sequence)`) in one
    /// batch, appending every row's logits to `out`; returns the CPU threads it ran on.
    pub(crate) fn decode_seqs(
        &mut self,
        items: &[(Token, usize, usize)],
        out: &mut Vec<f32>,
    ) -> Result<usize> {
        let rows = items.iter().map(|&(token, pos, seq)| BatchRow { token, pos, seq, logits: true });
        self.decode_rows(rows, out)
    }

    /// Decode `tokens` of sequence `seq` at positions `pos0..`, appending the last row's
    /// logits to `out` (a prompt, in chunks of [`Self::n_batch`]).
    pub(crate) fn prefill_seq(&mut self, tokens: &[Token], seq: usize, out: &mut Vec<f32>) -> Result<()> {
        let n = self.n_batch;
        for (i, chunk) in tokens.chunks(n).enumerate() {
            let last = (i + 1) * n >= tokens.len();
            let rows = chunk.iter().enumerate().map(|(j, &token)| BatchRow {
                token,
                pos: i * n + j,
                seq,
                logits: last && j + 1 == chunk.len(),
            });
            self.decode_rows(rows, out)?;
        }
        Ok(())
    }

    /// Run one `llama_decode` of `rows` (at most [`Self::n_batch`]) on the threads the
    /// governor gives it, appending the logits of the rows that ask for them to `out`.
    fn decode_rows(
        &mut self,
        rows: impl ExactSizeIterator<Item = BatchRow>,
        out: &mut Vec<f32>,
    ) -> Result<usize> {
        let n_rows = rows.len();
        assert!(n_rows > 0 && n_rows <= self.n_batch, "a batch of 1..=n_batch tokens");
        let pass = governor().begin(self.threads, self.pools.max());
        let threads = pass.threads();
        let result = self.attach(threads).and_then(|()| {
            // SAFETY: the attached pool has `threads` threads; the batch was made for n_batch
            // tokens with one sequence id each and n_rows is at most that; logits are read
            // only for the rows flagged for output, n_vocab each.
            unsafe {
                sys::llama_set_n_threads(self.ctx.as_ptr(), threads as i32, threads as i32);
                self.fill_batch(rows);
                let b = &mut self.batch;
                let rc = sys::llama_decode(self.ctx.as_ptr(), *b);
                if let Some(why) = self.weights.lost_peer() {
                    return Err(Error::Rpc(why));
                }
                if rc != 0 {
                    return Err(Error::Ggml(format!("llama_decode failed ({rc})")));
                }
                for i in (0..n_rows).filter(|&i| *b.logits.add(i) != 0) {
                    let row = sys::llama_get_logits_ith(self.ctx.as_ptr(), i as i32);
                    if row.is_null() {
                        return Err(Error::Ggml("llama.cpp returned no logits".into()));
                    }
                    out.extend_from_slice(std::slice::from_raw_parts(row, self.n_vocab));
                }
            }
            Ok(())
        });
        governor().end(pass);
        result.map(|()| threads)
    }

    /// Put `rows` (at most [`Self::n_batch`]) in the batch.
    ///
    /// # Safety
    /// The batch was made for `n_batch` tokens with one sequence id each; callers assert
    /// that `rows` is no longer.
    unsafe fn fill_batch(&mut self, rows: impl ExactSizeIterator<Item = BatchRow>) {
        let b = &mut self.batch;
        b.n_tokens = rows.len() as i32;
        for (i, row) in rows.enumerate() {
            // SAFETY: i < n_batch, the length of each array of the batch (the caller's
            // promise); each row has room for one sequence id.
            unsafe {
                *b.token.add(i) = row.token as sys::llama_token;
                *b.pos.add(i) = row.pos as i32;
                *b.n_seq_id.add(i) = 1;
                *(*b.seq_id.add(i)) = row.seq as i32;
                *b.logits.add(i) = row.logits as i8;
            }
        }
    }

    /// The pooled vector of each of `inputs` (one sequence each, together at most
    /// [`Self::n_batch`] tokens and no more sequences than the context was made for), in one
    /// pass on the threads the governor gives it; `n_embd` values each, as the model pools
    /// them (not normalized).
    pub(crate) fn embed(&mut self, inputs: &[&[Token]], n_embd: usize) -> Result<Vec<Vec<f32>>> {
        let n_rows: usize = inputs.iter().map(|t| t.len()).sum();
        assert!(n_rows > 0 && n_rows <= self.n_batch, "a pass of 1..=n_batch tokens");
        let rows = inputs.iter().enumerate().flat_map(|(seq, tokens)| {
            tokens.iter().enumerate().map(move |(pos, &token)| BatchRow { token, pos, seq, logits: true })
        });
        let rows: Vec<BatchRow> = rows.collect();
        // Each pass starts afresh: an encoder keeps no memory, but a decoder that pools (an
        // embedding model built on one) would otherwise find the last pass's cache.
        self.clear();
        let pass = governor().begin(self.threads, self.pools.max());
        let threads = pass.threads();
        let result = self.attach(threads).and_then(|()| {
            // SAFETY: the attached pool has `threads` threads; n_rows is at most n_batch
            // (asserted); each pooled vector llama.cpp returns holds n_embd floats, the
            // model's width, and is copied before the next pass.
            unsafe {
                sys::llama_set_n_threads(self.ctx.as_ptr(), threads as i32, threads as i32);
                self.fill_batch(rows.into_iter());
                let rc = sys::llama_decode(self.ctx.as_ptr(), self.batch);
                if rc != 0 {
                    return Err(Error::Ggml(format!("llama.cpp could not encode the inputs ({rc})")));
                }
                (0..inputs.len())
                    .map(|seq| {
                        let v = sys::llama_get_embeddings_seq(self.ctx.as_ptr(), seq as i32);
                        if v.is_null() {
                            return Err(Error::Ggml("llama.cpp returned no pooled vector".into()));
                        }
                        Ok(std::slice::from_raw_parts(v, n_embd).to_vec())
                    })
                    .collect()
            }
        });
        governor().end(pass);
        result
    }

    /// Run the next decodes on the pool of `n` threads.
    fn attach(&mut self, n: usize) -> Result<()> {
        if n == self.attached {
            return Ok(());
        }
        let pool = self.pools.get(n)?;
        // SAFETY: a live context and a pool that outlives it; llama.cpp hands it to the CPU
        // backend at its next decode, which pauses the one it replaces.
        unsafe { sys::llama_attach_threadpool(self.ctx.as_ptr(), pool.as_ptr(), pool.as_ptr()) };
        self.attached = n;
        Ok(())
    }

    /// Forget every position from `pos` on; false where the memory cannot do that (a
    /// recurrent state can only be cleared whole).
    pub(crate) fn remove_from(&mut self, pos: usize) -> bool {
        // SAFETY: a live context and its memory; sequence 0 is the only one.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx.as_ptr()), 0, pos as i32, -1) }
    }

    /// The state of the sequence (its cache for every position held), as llama.cpp writes it.
    pub(crate) fn save_sequence(&self) -> Result<Vec<u8>> {
        // SAFETY: a live context; sequence 0 is the only one.
        let size = unsafe { sys::llama_state_seq_get_size(self.ctx.as_ptr(), 0) };
        let mut out = vec![0u8; size];
        // SAFETY: `out` holds `size` writable bytes, the size llama.cpp asked for just above.
        let written = unsafe { sys::llama_state_seq_get_data(self.ctx.as_ptr(), out.as_mut_ptr(), size, 0) };
        if written == 0 && size > 0 {
            return Err(Error::Ggml("llama.cpp could not copy the sequence's state".into()));
        }
        out.truncate(written);
        Ok(out)
    }

    /// Make the sequence hold what [`LlamaContext::save_sequence`] copied out of a context of
    /// the same model and cache type; false when llama.cpp refuses it (it checks the layout).
    pub(crate) fn load_sequence(&mut self, state: &[u8]) -> bool {
        // SAFETY: a live context; `state` is readable for its length, which llama.cpp parses
        // with bounds checks against it.
        unsafe { sys::llama_state_seq_set_data(self.ctx.as_ptr(), state.as_ptr(), state.len(), 0) > 0 }
    }

    /// Forget the whole sequence.
    pub(crate) fn clear(&mut self) {
        // SAFETY: a live context and its memory.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx.as_ptr()), true) };
    }
}

/// One row of a `llama_decode` batch: a token at a position of a sequence, and whether its
/// logits are read back.
struct BatchRow {
    token: Token,
    pos: usize,
    seq: usize,
    logits: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_sizes_are_read_from_the_log() {
        let lines = [
            "llama_kv_cache:        CPU KV buffer size =    24.00 MiB",
            "llama_context:        CPU  output buffer size =     0.19 MiB",
            "llama_context:        CPU compute buffer size =    10.51 MiB",
            "llama_context: graph nodes  = 1000",
        ]
        .map(String::from);
        let s = buffer_sizes(&lines);
        assert_eq!(s.kv, ((24.005f64) * 1048576.0).ceil() as u64);
        assert!(s.compute >= (10.70 * 1048576.0) as u64 && s.compute <= (10.72 * 1048576.0) as u64);
    }
}
