//! A session: its KV cache, its compute machinery (backends, scheduler, thread pool) and the
//! tokens it holds.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::{
    Error as CoreError, KvType, LayerPlan, Logits, PassRecord, PassStats, Rows, SavedState, Session,
    SessionConfig, Token,
};

use crate::batch::{Job, SHARED_CHUNK, Turn};
use crate::compute::Compute;
use crate::graph::inputs::{self, SegmentData};
use crate::graph::{LoneQuery, PassShape, Segment};
use crate::kv::{KV_PAD, KvCache};
use crate::loaded::Inner;
use crate::{Error, Result};

/// Most rows of logits one pass computes (a session's [`SessionConfig::max_rows`] may ask
/// for fewer); a verification asking for more is split into several passes. Bounds the
/// logits part of the compute buffer (rows × vocabulary × 4 bytes).
pub const MAX_LOGIT_ROWS: usize = pocket_core::DEFAULT_MAX_ROWS;

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
    /// Where a pass's inputs are made.
    scratch: inputs::Scratch,
    /// A pass's tokens, handed to a shared pass (kept for the next).
    job_tokens: Vec<Token>,
    /// The parents of the tree of drafts decoded last, until its path is kept.
    tree: Vec<u8>,
    /// The passes run so far: their threads, splits and time.
    pass_stats: PassStats,
}

impl GgmlSession {
    pub(crate) fn new(model: Arc<Inner>, config: &SessionConfig, ledger: &Ledger) -> Result<Self> {
        let config = Self::effective(&model, config);
        // ggml's OpenVINO backend takes no view of a quantized cache (ggml aborts in its
        // scheduler at the first pass): refuse it here, saying what is allowed.
        if model.device.is_openvino() && config.kv != KvType::F16 {
            return Err(Error::Ggml(format!(
                "{}: the KV cache is f16 only on OpenVINO devices (ggml's OpenVINO backend does not \
                 attend over a {} cache); ask for kv f16",
                model.device.name, config.kv
            )));
        }
        // The cache's capacity is rounded up to the attention padding, so padded lengths are
        // the same as llama.cpp's (which rounds its context likewise) whatever n_ctx is: ggml
        // splits long attention into per-thread chunks by that length, which shows in the last
        // bits. Only address space is reserved for the extra positions; the limit stays n_ctx.
        let capacity = config.n_ctx.next_multiple_of(KV_PAD);
        let name = &model.info.name;
        let kv_reservation = ledger.reserve(0, &format!("the KV cache of {name}"))?;
        let mut kv =
            KvCache::new(&model.hp, &model.device, config.kv, config.n_ctx, capacity, kv_reservation)?;
        if config.preallocate {
            kv.hold_whole()?;
        }
        let what = format!("the compute buffer of {name}");
        let compute = Compute::new(
            &model,
            config.threads,
            1,
            &[worst_pass(&model, &kv, &config)],
            Some(ledger),
            &what,
        )?;
        let logits_reservation = ledger.reserve(0, &format!("the logits of {name}"))?;
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
            scratch: inputs::Scratch::default(),
            job_tokens: Vec::new(),
            tree: Vec::new(),
            pass_stats: PassStats::default(),
        })
    }

    /// Bytes of the compute buffers a session on `model` with `config` would reserve,
    /// measured without allocating them.
    pub(crate) fn measure_compute(model: &Inner, config: &SessionConfig) -> Result<usize> {
        let config = Self::effective(model, config);
        let capacity = config.n_ctx.next_multiple_of(KV_PAD);
        let none = Ledger::unlimited().reserve(0, "measuring")?;
        let mut kv = KvCache::new(&model.hp, &model.device, config.kv, config.n_ctx, capacity, none)?;
        // A device's cache starts small and grows: the largest pass is one at its full size.
        kv.grow_to(config.n_ctx)?;
        let worst = worst_pass(model, &kv, &config);
        Ok(Compute::new(model, config.threads, 1, &[worst], None, "measuring")?.bytes())
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
        self.compute.bytes()
    }

    /// Bytes of KV cache committed now.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// Most tokens of the next pass, `done` of `batch` tokens into a decode that wants logits
    /// of `n_rows` of them: the configured batch, or while other sessions of the model are at
    /// work, a chunk they can share a pass with ([`Batcher::prompt_chunk`]; a decode that
    /// wants fewer rows than it has reads a prompt). The first pass of a long prompt is such
    /// a chunk too: requests that come together have their sessions made within milliseconds
    /// of each other, and the first to start would otherwise read its whole prompt before the
    /// others could join. A request alone pays one smaller pass at the start of its prompt.
    ///
    /// [`Batcher::prompt_chunk`]: crate::batch::Batcher::prompt_chunk
    fn chunk(&self, done: usize, batch: usize, n_rows: usize) -> usize {
        let Some(b) = &self.model.batch else {
            // A prompt (fewer rows wanted than tokens) in the few widths an OpenVINO device
            // compiles once; a pass whose every row is wanted (a draft's verification) whole.
            return if self.model.device.is_openvino() && n_rows < batch {
                fixed_width(batch - done, self.config.n_batch)
            } else {
                self.config.n_batch
            };
        };
        match b.prompt_chunk(self.kv.id, batch - done, n_rows < batch) {
            Some(chunk) => chunk,
            None if done == 0 => SHARED_CHUNK,
            None => self.config.n_batch,
        }
        .min(self.config.n_batch)
    }

    /// Run one pass over `self.tokens[pos0..pos0 + n_tokens]`, writing the last `n_out` rows of
    /// logits into `self.logits[row_off * n_vocab..]`: with the passes of other sessions of
    /// the model where it shares them, else alone. With `tree`, the tokens are the tree of
    /// drafts whose parents `self.tree` holds.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &mut self,
        plan: &LayerPlan,
        pos0: usize,
        n_tokens: usize,
        n_out: usize,
        row_off: usize,
        rest: usize,
        tree: bool,
    ) -> Result<()> {
        let shape = PassShape::new(pos0, n_tokens, n_out, &self.kv, &self.model.hp, self.model.attention);
        let model = Arc::clone(&self.model);
        let Some(batch) = &model.batch else {
            return self.own_pass(plan, pos0, shape, row_off, tree);
        };
        let mut tokens = std::mem::take(&mut self.job_tokens);
        tokens.clear();
        tokens.extend_from_slice(&self.tokens[pos0..pos0 + n_tokens]);
        let job = Job {
            kv: Arc::clone(self.kv.layout()),
            plan: *plan,
            threads: self.config.threads,
            priority: self.config.priority,
            tokens,
            pos0,
            shape,
            parents: if tree { self.tree.clone() } else { Vec::new() },
            logits: std::mem::take(&mut self.logits),
            row_off,
            rest,
        };
        match batch.enter(&model, job) {
            Turn::Alone(job, _lead) => {
                (self.job_tokens, self.logits) = (job.tokens, job.logits);
                self.own_pass(plan, pos0, shape, row_off, tree)
            }
            Turn::Shared(job, record) => {
                (self.job_tokens, self.logits) = (job.tokens, job.logits);
                self.pass_stats.add(record);
                Ok(())
            }
            Turn::Failed => Err(crate::Error::Ggml(
                "the pass this session shared with others failed (the log says why); decode again".into(),
            )),
        }
    }

    /// [`GgmlSession::pass`] on this session's own machinery.
    fn own_pass(
        &mut self,
        plan: &LayerPlan,
        pos0: usize,
        shape: PassShape,
        row_off: usize,
        tree: bool,
    ) -> Result<()> {
        let started = Instant::now();
        let (n_vocab, n_tokens, n_out) = (self.model.hp.n_vocab, shape.n_tokens, shape.n_out);
        // A decode step computed as several rows where the probe found that exact (`exact`).
        let rows = self.model.step_rows.load(Ordering::Relaxed);
        let shape = if rows > 1 && n_tokens == 1 && n_out == 1 && shape.lone_query == LoneQuery::No {
            shape.with_rows(rows)
        } else if n_tokens == 1 && n_out == 0 && self.model.device.is_openvino() {
            // On an OpenVINO device a single token that only fills the cache is computed as a
            // decode step, its row of logits left unread: that shape's model is compiled and
            // kept anyway, and each kept shape holds a copy of the weights.
            PassShape { n_out: 1, ..shape }
        } else {
            shape
        };
        let segment = Segment { kv: &self.kv, shape };
        let (g, sched) = self.compute.graph(&self.model, plan, &[segment])?;
        let parents = if tree { &self.tree[..] } else { &[] };
        let data = SegmentData { tokens: &self.tokens[pos0..pos0 + n_tokens], pos0, shape, parents };
        inputs::set(g, &self.model.hp, &[data], &mut self.scratch)?;
        let t0 = Instant::now();
        let threads = sched.compute(&g.ctx)?;
        let graph = t0.elapsed();
        if let Some(out) = g.logits
            && n_out > 0
        {
            out.get_data(&mut self.logits[row_off * n_vocab..(row_off + n_out) * n_vocab])?;
        }
        let splits = self.compute.splits();
        self.pass_stats.add(PassRecord { threads, splits, pass: started.elapsed(), graph });
        Ok(())
    }
}

/// Most tokens of a tree of drafts: the pending token and a whole draft.
const MAX_TREE: usize = pocket_core::spec::MAX_DRAFT + 1;

/// The largest pass a session of `config` on `kv` runs, which its compute buffers are
/// reserved for: a full batch at the end of the context, with the most rows.
fn worst_pass<'a>(model: &Inner, kv: &'a KvCache, config: &SessionConfig) -> Segment<'a> {
    let n_batch = config.n_batch.min(kv.n_ctx());
    let shape = PassShape::new(
        kv.n_ctx() - n_batch,
        n_batch,
        n_batch.min(config.max_rows),
        kv,
        &model.hp,
        model.attention,
    );
    Segment { kv, shape }
}

impl Drop for GgmlSession {
    fn drop(&mut self) {
        if let Some(b) = &self.model.batch {
            b.leave(self.kv.id);
        }
    }
}

impl GgmlSession {
    /// The error of a model whose layers on a peer can no longer be computed, if they cannot.
    fn peer_lost(&self) -> Option<Error> {
        self.model.device.lost_peer().map(Error::Rpc)
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
        self.tree.clear();
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
        if let Err(e) = self.kv.grow_to(new_len) {
            return Err(self.peer_lost().unwrap_or(e).into());
        }
        self.tokens.extend_from_slice(tokens);
        self.logits.clear();
        self.logits.reserve_exact(logits_len);
        self.logits.resize(logits_len, 0.0);

        let (mut row_off, mut done) = (0, 0);
        // Each pass is sized when it comes (`chunk`: smaller while other sessions are at work,
        // and for the first pass of a prompt); rows are computed as in any chunking.
        while let Some((pass, n_out)) =
            pocket_core::next_pass(done, batch, n_rows, self.chunk(done, batch, n_rows), self.config.max_rows)
        {
            let rest = batch - pass.end;
            if let Err(e) = self.pass(plan, start + pass.start, pass.len(), n_out, row_off, rest, false) {
                self.tokens.truncate(old_len);
                return Err(self.peer_lost().unwrap_or(e).into());
            }
            row_off += n_out;
            done = pass.end;
        }
        // A peer holding layers that died during the passes left their results made up.
        if let Some(e) = self.peer_lost() {
            self.tokens.truncate(old_len);
            return Err(e.into());
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
        // A tree decoded last is no longer there to keep a path of.
        self.tree.clear();
        self.complete_len = self.complete_len.min(len);
        if self.complete_len == len {
            self.partial = None;
        }
        self.kv.shrink_to(len);
        Ok(())
    }

    /// Rows of a tree are bitwise those of its paths where our attention reads a host cache
    /// (it visits a row's positions in order and skips the masked ones; ggml's flash
    /// attention sums by position in the cache) on this machine's CPU, whose multi-row
    /// kernels compute each row as alone; a sliding window must hold a whole draft.
    /// `POCKET_GGML_TREES=0` keeps drafts to paths, for comparing the two.
    fn decodes_trees(&self) -> bool {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *OFF.get_or_init(|| std::env::var_os("POCKET_GGML_TREES").is_some_and(|v| v == "0")) {
            return false;
        }
        let hp = &self.model.hp;
        let own = self.model.attention == crate::AttentionKernel::Auto
            && crate::attention::applies(&self.kv, hp.head_dim);
        let window_holds_a_draft = hp.swa.as_ref().is_none_or(|s| s.window > 2 * MAX_TREE);
        own && self.model.info.exact_passes.is_none() && window_holds_a_draft
    }

    fn decode_tree(
        &mut self,
        tokens: &[Token],
        parents: &[u8],
        plan: &LayerPlan,
    ) -> pocket_core::Result<Logits<'_>> {
        let n_vocab = self.model.hp.n_vocab;
        plan.check(self.model.hp.n_layer)?;
        if !self.decodes_trees() {
            return Err(CoreError::Unsupported(format!(
                "{} decodes drafts as paths here, not trees",
                self.model.info.name
            )));
        }
        pocket_core::check_tree(tokens, parents, n_vocab, self.tokens.len(), self.config.n_ctx)?;
        let n = tokens.len();
        if !plan.is_full() || self.partial.is_some() || n > MAX_TREE.min(self.config.max_rows) {
            return Err(CoreError::invalid(format!(
                "a tree of {n} tokens: trees are decoded with every layer, after tokens that have \
                 all of theirs, in one pass of at most {} rows",
                MAX_TREE.min(self.config.max_rows)
            )));
        }
        let old_len = self.tokens.len();
        if n * n_vocab > self.logits.capacity() {
            self.logits_reservation.resize((n * n_vocab * size_of::<f32>()) as u64)?;
        }
        if let Err(e) = self.kv.grow_to(old_len + n) {
            return Err(self.peer_lost().unwrap_or(e).into());
        }
        self.tokens.extend_from_slice(tokens);
        self.tree.clear();
        self.tree.extend_from_slice(parents);
        self.logits.clear();
        self.logits.reserve_exact(n * n_vocab);
        self.logits.resize(n * n_vocab, 0.0);
        if let Err(e) = self.pass(plan, old_len, n, n, 0, 0, true) {
            self.tokens.truncate(old_len);
            self.tree.clear();
            return Err(self.peer_lost().unwrap_or(e).into());
        }
        self.complete_len = self.tokens.len();
        Ok(Logits::new(&self.logits, n_vocab))
    }

    fn keep_path(&mut self, base: usize, path: &[u8]) -> pocket_core::Result<()> {
        if self.tree.is_empty() || self.tokens.len() != base + self.tree.len() {
            return Err(CoreError::invalid(format!(
                "no tree of drafts was decoded at {base} to keep a path of (the session holds {} tokens)",
                self.tokens.len()
            )));
        }
        // A path that is not one leaves the session as it was before the tree.
        if let Err(e) = pocket_core::check_path(path, &self.tree) {
            self.truncate(base)?;
            return Err(e);
        }
        // Each kept row moves down to follow the one before it; every row it passes over is
        // one the path left out, so no row is overwritten before it is moved.
        for (j, &i) in path.iter().enumerate() {
            let i = usize::from(i);
            if i != j {
                if let Err(e) = self.kv.move_row(base + i, base + j) {
                    self.tree.clear();
                    self.truncate(base)?;
                    return Err(e.into());
                }
                self.tokens[base + j] = self.tokens[base + i];
            }
        }
        self.tree.clear();
        self.truncate(base + path.len())
    }

    fn memory(&self) -> u64 {
        (self.kv.bytes() + self.compute.bytes() + self.logits.capacity() * 4) as u64
    }

    fn kv_bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }

    fn pass_stats(&self) -> PassStats {
        self.pass_stats
    }

    /// The positions with KV in every layer (those a partial plan left are not kept).
    fn save(&self) -> pocket_core::Result<Option<SavedState>> {
        let n = self.complete_len;
        let data = self.kv.save(n)?;
        // What a lost peer's layers gave is not their cache.
        if let Some(e) = self.peer_lost() {
            return Err(e.into());
        }
        Ok(Some(SavedState { tokens: self.tokens[..n].to_vec(), kv: self.kv.kv, data }))
    }

    fn restore(&mut self, saved: &SavedState, len: usize) -> pocket_core::Result<()> {
        let (held, n_vocab) = (self.tokens.len(), self.model.hp.n_vocab);
        if !pocket_core::check_restore(saved, len, held, self.kv.kv, n_vocab, self.config.n_ctx)? {
            return Ok(());
        }
        if let Err(e) = self.kv.restore(&saved.data, saved.tokens.len(), len) {
            self.kv.shrink_to(0);
            return Err(self.peer_lost().unwrap_or(e).into());
        }
        if let Some(e) = self.peer_lost() {
            self.kv.shrink_to(0);
            return Err(e.into());
        }
        self.tokens.extend_from_slice(&saved.tokens[..len]);
        self.complete_len = len;
        self.partial = None;
        Ok(())
    }
}

/// Tokens in a pass of a prompt on an OpenVINO device, `left` tokens from its end: passes of
/// [`OPENVINO_PASS`] tokens (at most the configured batch) while more than that are left, then
/// single tokens. ggml-openvino compiles a model for each pass shape it meets (seconds on a
/// small CPU, kept while the model is loaded, with a copy of the weights), so a prompt of any
/// length takes the same two shapes: the wide pass, and the single step decoding takes too
/// (`own_pass` computes a lone token's logits, wanted or not). (Passes of the configured batch
/// compiled one model for every prompt length.)
fn fixed_width(left: usize, n_batch: usize) -> usize {
    let wide = OPENVINO_PASS.min(n_batch);
    if left > wide { wide } else { 1 }
}

/// The wide pass on an OpenVINO device: 16 tokens cost about two single steps on its CPU
/// device (SmolLM2, `pocket bench`'s cost curve), and leave at most 16 to single steps.
pub(crate) const OPENVINO_PASS: usize = 16;

#[cfg(test)]
mod tests {
    use super::fixed_width;

    #[test]
    fn a_prompt_goes_in_wide_passes_then_single_tokens() {
        // 38 tokens: two passes of 16, then six of one.
        let mut left = 38;
        let mut widths = Vec::new();
        while left > 0 {
            let w = fixed_width(left, 256);
            widths.push(w);
            left -= w;
        }
        assert_eq!(widths, [16, 16, 1, 1, 1, 1, 1, 1]);
        assert_eq!(fixed_width(16, 256), 1, "the last token goes alone");
        // A configured batch smaller than the wide pass is not exceeded.
        assert_eq!(fixed_width(100, 8), 8);
    }
}
