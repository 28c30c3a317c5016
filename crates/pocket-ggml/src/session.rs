//! A session: its KV cache, its compute machinery (backends, scheduler, thread pool) and the
//! tokens it holds.

use std::sync::Arc;

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::{
    Error as CoreError, LayerPlan, Logits, PassThreads, Rows, SavedState, Session, SessionConfig, Token,
};

use crate::ffi::graph::Ctx;
use crate::ffi::sched::Scheduler;
use crate::graph::{self, PassShape};
use crate::kv::KvCache;
use crate::model::Inner;
use crate::{Error, Result};

/// Most rows of logits one pass computes (a session's [`SessionConfig::max_rows`] may ask
/// for fewer); a verification asking for more is split into several passes. Bounds the
/// logits part of the compute buffer (rows × vocabulary × 4 bytes).
pub const MAX_LOGIT_ROWS: usize = pocket_core::DEFAULT_MAX_ROWS;

/// The compute machinery of one session: its scheduler, the memory graphs are built in, and
/// the last graph built.
struct Compute {
    sched: Scheduler,
    /// Memory for the next graph's context, handed back by the last one dropped.
    graph_mem: Vec<u8>,
    compute_bytes: usize,
    /// The compute buffers' bytes in the memory ledger.
    _reservation: Option<Reservation>,
    /// The last graph, built and allocated: consecutive passes of one shape and plan (decode
    /// steps) reuse it, skipping graph construction and scheduling.
    cached: Option<CachedGraph>,
}

struct CachedGraph {
    shape: PassShape,
    plan: LayerPlan,
    graph: graph::Graph,
}

impl Drop for Compute {
    fn drop(&mut self) {
        // The cached graph's tensors live in the scheduler's buffers: it goes first.
        self.drop_cached();
    }
}

impl Compute {
    /// The compute machinery of a session on `kv`, its buffers reserved in `ledger` and then
    /// allocated for the largest pass; with no ledger, only measured (`compute_bytes`), for
    /// predicting a footprint without allocating it.
    fn new(model: &Inner, kv: &KvCache, config: &SessionConfig, ledger: Option<&Ledger>) -> Result<Compute> {
        let hp = &model.hp;
        let nodes = graph::graph_nodes(hp);
        let sched = Scheduler::new(&model.device, config.threads, nodes)?;
        let graph_mem_size = Ctx::memory_for(nodes);
        let mut compute = Compute {
            sched,
            graph_mem: vec![0; graph_mem_size],
            compute_bytes: 0,
            _reservation: None,
            cached: None,
        };

        // Reserve the compute buffers for the largest pass this session will run, so that no
        // later pass allocates: a full batch at the end of the context, with the most rows.
        let n_batch = config.n_batch.min(kv.n_ctx());
        let worst = PassShape::new(
            kv.n_ctx() - n_batch,
            n_batch,
            n_batch.min(config.max_rows),
            kv,
            hp,
            model.attention,
        );
        let plan = LayerPlan::full(hp.n_layer).map_err(|e| Error::Ggml(e.to_string()))?;
        let g = compute.build(model, kv, &plan, worst)?;
        // Measure the buffers first and pay for them in the ledger, then allocate them.
        let measured = compute.sched.measure(&g.ctx);
        let Some(ledger) = ledger else {
            compute.graph_mem = g.ctx.into_memory();
            compute.compute_bytes = measured;
            return Ok(compute);
        };
        let what = format!("the compute buffer of {}", model.info.name);
        let reservation = ledger.reserve(measured as u64, &what);
        let reserved = reservation.is_ok() && compute.sched.reserve(&g.ctx);
        compute.graph_mem = g.ctx.into_memory();
        compute._reservation = Some(reservation?);
        if !reserved {
            return Err(Error::Ggml("cannot reserve the compute buffer".into()));
        }
        compute.compute_bytes = compute.sched.buffer_bytes();
        Ok(compute)
    }

    /// Build the graph of `shape` in the graph memory (which must not hold a live graph).
    fn build(
        &mut self,
        model: &Inner,
        kv: &KvCache,
        plan: &LayerPlan,
        shape: PassShape,
    ) -> Result<graph::Graph> {
        debug_assert!(self.cached.is_none());
        let ctx = Ctx::new(std::mem::take(&mut self.graph_mem), graph::graph_nodes(&model.hp))?;
        Ok(graph::build(ctx, &model.hp, &model.weights, kv, plan, shape))
    }

    /// The graph for `shape` and `plan`, allocated and ready for its inputs (the cached one if
    /// it matches, else a new one), and the scheduler that computes it.
    fn graph(
        &mut self,
        model: &Inner,
        kv: &KvCache,
        plan: &LayerPlan,
        shape: PassShape,
    ) -> Result<(&graph::Graph, &Scheduler)> {
        let hit = self.cached.as_ref().is_some_and(|c| c.shape == shape && c.plan == *plan);
        if !hit {
            self.drop_cached();
            let graph = self.build(model, kv, plan, shape)?;
            if !self.sched.alloc(&graph.ctx) {
                self.graph_mem = graph.ctx.into_memory();
                return Err(Error::Ggml("cannot allocate the graph".into()));
            }
            self.cached = Some(CachedGraph { shape, plan: *plan, graph });
        }
        Ok((&self.cached.as_ref().expect("cached just above").graph, &self.sched))
    }

    fn drop_cached(&mut self) {
        if let Some(c) = self.cached.take() {
            self.graph_mem = c.graph.ctx.into_memory();
        }
    }
}

/// One conversation on a [`crate::GgmlModel`].
pub struct GgmlSession {
    model: Arc<Inner>,
    config: SessionConfig,
    // Declared before `kv`: the scheduler's graphs reference the cache.
    compute: Compute,
    kv: KvCache,
    /// Every token held, so positions decoded with a partial plan can be recomputed.
    tokens: Vec<Token>,
    /// Positions `0..complete_len` have KV in every layer.
    complete_len: usize,
    /// The partial plan that positions `complete_len..` were decoded with.
    partial: Option<LayerPlan>,
    logits: Vec<f32>,
    /// The logits buffer's bytes in the memory ledger.
    logits_reservation: Reservation,
    mask: Vec<u16>,
    mask_swa: Vec<u16>,
    scratch_i32: Vec<i32>,
    scratch_i64: Vec<i64>,
    /// Hadamard matrices for a quantized cache (K, V), fed to every pass.
    rotations: (Vec<f32>, Vec<f32>),
    /// The threads of the passes run so far.
    pass_threads: PassThreads,
}

impl GgmlSession {
    pub(crate) fn new(model: Arc<Inner>, config: &SessionConfig, ledger: &Ledger) -> Result<Self> {
        let config = Self::effective(&model, config);
        // The cache's capacity is rounded up to the attention padding, so padded lengths are
        // the same as llama.cpp's (which rounds its context likewise) whatever n_ctx is: ggml
        // splits long attention into per-thread chunks by that length, which shows in the last
        // bits. Only address space is reserved for the extra positions; the limit stays n_ctx.
        let capacity = config.n_ctx.next_multiple_of(graph::KV_PAD);
        let name = &model.info.name;
        let kv_reservation = ledger.reserve(0, &format!("the KV cache of {name}"))?;
        let mut kv =
            KvCache::new(&model.hp, &model.device, config.kv, config.n_ctx, capacity, kv_reservation)?;
        if config.preallocate {
            kv.hold_whole()?;
        }
        let compute = Compute::new(&model, &kv, &config, Some(ledger))?;
        let logits_reservation = ledger.reserve(0, &format!("the logits of {name}"))?;
        let (k_rot, v_rot) = graph::rotation_sizes(&model.hp, kv.k_quantized(), kv.v_quantized());
        let rotations =
            (k_rot.map(graph::hadamard).unwrap_or_default(), v_rot.map(graph::hadamard).unwrap_or_default());
        Ok(GgmlSession {
            model,
            config,
            compute,
            kv,
            tokens: Vec::new(),
            complete_len: 0,
            partial: None,
            logits: Vec::new(),
            logits_reservation,
            mask: Vec::new(),
            mask_swa: Vec::new(),
            scratch_i32: Vec::new(),
            scratch_i64: Vec::new(),
            rotations,
            pass_threads: PassThreads::default(),
        })
    }

    /// Bytes of the compute buffers a session on `model` with `config` would reserve,
    /// measured without allocating them.
    pub(crate) fn measure_compute(model: &Inner, config: &SessionConfig) -> Result<usize> {
        let config = Self::effective(model, config);
        let capacity = config.n_ctx.next_multiple_of(graph::KV_PAD);
        let none = Ledger::unlimited().reserve(0, "measuring")?;
        let kv = KvCache::new(&model.hp, &model.device, config.kv, config.n_ctx, capacity, none)?;
        Ok(Compute::new(model, &kv, &config, None)?.compute_bytes)
    }

    /// `config` as a session on `model` uses it: context within the training context, batch
    /// within the context.
    fn effective(model: &Inner, config: &SessionConfig) -> SessionConfig {
        let mut config = config.clone();
        config.n_ctx = config.n_ctx.clamp(1, model.hp.n_ctx_train);
        config.n_batch = config.n_batch.clamp(1, config.n_ctx);
        config.max_rows = config.max_rows.clamp(1, MAX_LOGIT_ROWS);
        config
    }

    /// Bytes of the compute buffers reserved for this session.
    pub fn compute_bytes(&self) -> usize {
        self.compute.compute_bytes
    }

    /// Bytes of KV cache committed now.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// Run one pass over `self.tokens[pos0..pos0 + n_tokens]`, writing the last `n_out` rows of
    /// logits into `self.logits[row_off * n_vocab..]`.
    fn pass(
        &mut self,
        plan: &LayerPlan,
        pos0: usize,
        n_tokens: usize,
        n_out: usize,
        row_off: usize,
    ) -> Result<()> {
        let n_vocab = self.model.hp.n_vocab;
        let shape = PassShape::new(pos0, n_tokens, n_out, &self.kv, &self.model.hp, self.model.attention);
        graph::fill_mask(&mut self.mask, pos0, n_tokens, shape.q_rows, shape.n_kv, None);
        if let Some(swa) = &self.model.hp.swa {
            graph::fill_mask(&mut self.mask_swa, pos0, n_tokens, shape.q_rows, shape.n_kv, Some(swa.window));
        }
        let (g, sched) = self.compute.graph(&self.model, &self.kv, plan, shape)?;
        let inp = &g.inputs;
        let scratch = &mut self.scratch_i32;
        scratch.clear();
        scratch.extend(self.tokens[pos0..pos0 + n_tokens].iter().map(|&t| t as i32));
        inp.tokens.set_data(scratch)?;
        scratch.clear();
        scratch.extend((pos0..pos0 + n_tokens).map(|p| p as i32));
        inp.pos.set_data(scratch)?;
        self.scratch_i64.clear();
        self.scratch_i64.extend((pos0..pos0 + n_tokens).map(|p| p as i64));
        inp.kv_idxs.set_data(&self.scratch_i64)?;
        // A pass that only fills the cache (n_out 0) with a plan that runs one layer stops
        // before that layer's attention: the mask is then not in the graph, and not allocated
        // (nor is the sliding-window mask where no such layer runs).
        if inp.mask.is_allocated() {
            inp.mask.set_data(&self.mask)?;
        }
        if let Some(mask) = inp.mask_swa.filter(|m| m.is_allocated()) {
            mask.set_data(&self.mask_swa)?;
        }
        if let Some(ids) = inp.out_ids {
            scratch.clear();
            scratch.extend((n_tokens - n_out..n_tokens).map(|i| i as i32));
            ids.set_data(scratch)?;
        }
        if let Some(r) = inp.k_rot {
            r.set_data(&self.rotations.0)?;
        }
        if let Some(r) = inp.v_rot {
            r.set_data(&self.rotations.1)?;
        }
        let threads = sched.compute(&g.ctx)?;
        self.pass_threads.add(threads);
        if let Some(out) = g.logits {
            out.get_data(&mut self.logits[row_off * n_vocab..(row_off + n_out) * n_vocab])?;
        }
        Ok(())
    }
}

impl Session for GgmlSession {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> pocket_core::Result<Logits<'_>> {
        let hp = &self.model.hp;
        let n_vocab = hp.n_vocab;
        plan.check(hp.n_layer)?;
        pocket_core::check_decode(tokens, n_vocab, self.tokens.len(), self.config.n_ctx)?;
        let old_len = self.tokens.len();
        let new_len = old_len + tokens.len();
        // Positions decoded with another plan are recomputed with this one, in this pass.
        let start = match self.partial {
            Some(p) if p != *plan => self.complete_len,
            _ => old_len,
        };
        let batch = new_len - start;
        let n_rows = rows.count(batch)?;
        let logits_len = n_rows * n_vocab;
        if logits_len > self.logits.capacity() {
            self.logits_reservation.resize((logits_len * size_of::<f32>()) as u64)?;
        }
        self.kv.grow_to(new_len)?;
        self.tokens.extend_from_slice(tokens);
        self.logits.clear();
        self.logits.reserve_exact(logits_len);
        self.logits.resize(logits_len, 0.0);

        let mut row_off = 0;
        for (pass, n_out) in pocket_core::passes(batch, n_rows, self.config.n_batch, self.config.max_rows) {
            if let Err(e) = self.pass(plan, start + pass.start, pass.len(), n_out, row_off) {
                self.tokens.truncate(old_len);
                return Err(e.into());
            }
            row_off += n_out;
        }
        if plan.is_full() {
            self.complete_len = new_len;
            self.partial = None;
        } else {
            self.partial = Some(*plan);
        }
        Ok(Logits::new(&self.logits, n_vocab))
    }

    fn truncate(&mut self, len: usize) -> pocket_core::Result<()> {
        if len > self.tokens.len() {
            return Err(CoreError::invalid(format!(
                "cannot truncate a session of {} tokens to {len}",
                self.tokens.len()
            )));
        }
        self.tokens.truncate(len);
        self.complete_len = self.complete_len.min(len);
        if self.complete_len == len {
            self.partial = None;
        }
        self.kv.shrink_to(len);
        Ok(())
    }

    fn memory(&self) -> u64 {
        (self.kv.bytes() + self.compute.compute_bytes + self.logits.capacity() * 4) as u64
    }

    fn kv_bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }

    fn pass_threads(&self) -> PassThreads {
        self.pass_threads
    }

    /// The positions with KV in every layer (those a partial plan left are not kept).
    fn save(&self) -> pocket_core::Result<Option<SavedState>> {
        let n = self.complete_len;
        let data = self.kv.save(n)?;
        Ok(Some(SavedState { tokens: self.tokens[..n].to_vec(), kv: self.kv.kv, data }))
    }

    fn restore(&mut self, saved: &SavedState, len: usize) -> pocket_core::Result<()> {
        let (held, n_vocab) = (self.tokens.len(), self.model.hp.n_vocab);
        if !pocket_core::check_restore(saved, len, held, self.kv.kv, n_vocab, self.config.n_ctx)? {
            return Ok(());
        }
        if let Err(e) = self.kv.restore(&saved.data, saved.tokens.len(), len) {
            self.kv.shrink_to(0);
            return Err(e.into());
        }
        self.tokens.extend_from_slice(&saved.tokens[..len]);
        self.complete_len = len;
        self.partial = None;
        Ok(())
    }
}
