//! The llama.cpp engine: models whose architecture (or some feature of it) our graph does not
//! build run on llama.cpp's own graph, through llama.h, behind the same [`Model`] and
//! [`Session`] as ours.
//!
//! What it keeps of ours: the memory ledger (weights, KV cache and compute buffers are paid for
//! before they are allocated), batched verification of drafts with rows of logits chosen per
//! token, and rollback of rejected drafts (`llama_memory_seq_rm`). What it cannot do: run a
//! partial [`LayerPlan`] (so no layer-skip drafts), grow its KV cache by blocks (llama.cpp
//! allocates the whole context when a session starts), and roll back a recurrent state (such
//! models decode plainly).

use std::path::Path;
use std::sync::Arc;

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{
    CacheKey, Error as CoreError, Footprint, KvType, LayerPlan, Logits, Model, ModelInfo, ModelKind,
    PassRecord, PassStats, Rows, SavedState, Session, SessionConfig, Token, Tokenizer,
};

use crate::ffi::device::Device;
use crate::ffi::gguf::GgufFile;
use crate::ffi::llama::{ContextParams, LlamaContext, LlamaWeights, Load};
use crate::ffi::vocab::Vocab;
use crate::kv;
use crate::{Error, LoadOptions, Repack, Result};

/// llama.cpp rounds a context up to a multiple of this many tokens and allocates its KV cache
/// for all of them at once.
const LLAMA_CTX_PAD: usize = 256;

/// What sessions of a model share.
struct Inner {
    vocab: Vocab,
    weights: Arc<LlamaWeights>,
    info: ModelInfo,
    shape: Shape,
    device: String,
    /// [`LlamaCppModel::kernels`].
    kernels: String,
    recurrent: bool,
    cache_key: Option<CacheKey>,
    /// The weights' bytes in the memory ledger.
    _reservation: Option<Reservation>,
}

/// The sizes a footprint is computed from, read from the file's metadata as llama.cpp reads
/// them.
#[derive(Debug, Clone)]
struct Shape {
    /// Per layer: values of K and of V per token (0 for a layer without attention).
    kv_widths: Vec<(usize, usize)>,
    /// Heads' K and V sizes (what a quantized cache's blocks must divide).
    head_k: usize,
    head_v: usize,
    n_embd: usize,
    n_ff: usize,
    n_vocab: usize,
}

impl Shape {
    fn read(f: &GgufFile, arch: &str, n_layer: usize, n_embd: usize, n_vocab: usize) -> Shape {
        let key = |k: &str| format!("{arch}.{k}");
        // A per-layer value: an array of one per layer, or one value for all.
        let per_layer = |k: &str| -> Option<Vec<u64>> {
            match f.get_u64s(&key(k)) {
                Some(v) if v.len() == n_layer => Some(v),
                Some(v) if !v.is_empty() => Some(vec![v[0]; n_layer]),
                _ => None,
            }
        };
        let heads = per_layer("attention.head_count").unwrap_or_else(|| vec![1; n_layer]);
        let heads_kv = per_layer("attention.head_count_kv").unwrap_or_else(|| heads.clone());
        let head0 = heads.iter().copied().max().unwrap_or(1).max(1) as usize;
        let head_k = f.get_u64(&key("attention.key_length")).map_or(n_embd / head0, |v| v as usize);
        let head_v = f.get_u64(&key("attention.value_length")).map_or(head_k, |v| v as usize);
        let kv_widths = heads_kv.iter().map(|&h| (h as usize * head_k, h as usize * head_v)).collect();
        let n_ff = per_layer("feed_forward_length")
            .and_then(|v| v.into_iter().max())
            .map_or(4 * n_embd, |v| v as usize);
        Shape { kv_widths, head_k, head_v, n_embd, n_ff, n_vocab }
    }

    /// KV bytes per token over all layers, K and V.
    fn kv_bytes_per_token(&self, kv: KvType) -> usize {
        self.kv_widths.iter().map(|&(k, v)| kv::width_bytes(k, kv.k) + kv::width_bytes(v, kv.v)).sum()
    }

    /// The compute and output buffers of a context, estimated from the largest tensors of a
    /// pass of `n_batch` tokens with `rows` rows of logits (llama.cpp says the true size only
    /// once it has allocated them; a session then pays for that).
    fn compute_bytes(&self, n_batch: usize, rows: usize) -> usize {
        let activations = n_batch * (8 * self.n_embd + 3 * self.n_ff);
        let logits = 2 * rows * self.n_vocab; // the graph's output and the copy llama.cpp keeps
        4 * (activations + logits) + (1 << 20)
    }
}

/// A GGUF model on llama.cpp's own graph.
///
/// Cheap to clone (the weights are shared); every [`LlamaCppSession`] keeps it alive.
#[derive(Clone)]
pub struct LlamaCppModel {
    inner: Arc<Inner>,
}

impl LlamaCppModel {
    /// The speculation modes its sessions support: the drafters that need no layer plan.
    pub const DRAFTERS: &'static [SpecMode] =
        &[SpecMode::Off, SpecMode::Auto, SpecMode::Suffix, SpecMode::Draft];

    /// What a model whose memory is a recurrent state offers: it cannot roll back a rejected
    /// draft.
    const PLAIN: &'static [SpecMode] = &[SpecMode::Off];

    /// Load the model at `path` on llama.cpp. Of `options`, the device and the ledger apply;
    /// llama.cpp keeps the weights as stored, not repacked.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        // Our reader first: it refuses damaged files with a precise reason, where llama.cpp
        // would only fail.
        let file = GgufFile::open(path)?;
        let arch = file.get_str("general.architecture").unwrap_or_default();
        let device = Device::select(&options.device, Repack::None, || None)?;
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let what = format!("the weights of {}", path.display());
        // Layers on peers, as llama.cpp's `--rpc` with `-ngl` places them (the last ones).
        let split = match &options.split {
            Some(_) if !device.is_cpu() => {
                return Err(Error::Rpc(format!(
                    "llama.cpp's graph places layers on peers beside the CPU, not beside {}: use device = \"cpu\"",
                    device.name
                )));
            }
            Some(split) => crate::split::plan(&file, crate::split::n_layer(&file)?, split, &device.name)?,
            None => None,
        };
        let here_bytes = file_bytes - split.as_ref().map_or(0, |p| p.remote_bytes);
        let reservation = options.ledger.as_ref().map(|l| l.reserve(here_bytes, &what)).transpose()?;
        let load = match &split {
            Some(plan) => Load::Split {
                remote: &plan.remote,
                remote_layers: plan.remote.layers.iter().filter(|l| l.is_some()).count(),
                repack: false,
            },
            None => Load::Full { gpu: !device.is_cpu(), repack: false },
        };
        let weights = LlamaWeights::load(path, load).ok_or_else(|| Error::BadModel {
            path: path.to_owned(),
            reason: format!("llama.cpp could not load this {arch:?} model (its log says why)"),
        })?;
        if weights.has_encoder() {
            return Err(Error::Core(CoreError::Unsupported(format!(
                "{} is an encoder-decoder GGUF ({arch}); pocketd runs encoder-decoder models from ONNX",
                path.display()
            ))));
        }
        let weights = Arc::new(weights);
        let vocab = Vocab::of(Arc::clone(&weights));
        let (n_layers, n_embd, n_ctx_train) = weights.dims();
        let n_vocab = weights.n_vocab();
        let name = file.model_name();
        let info = ModelInfo {
            name,
            architecture: arch.clone(),
            kind: ModelKind::Decoder,
            n_layers,
            n_embd,
            n_vocab,
            n_ctx_train,
            weights_bytes: file_bytes,
            exact_passes: None,
            placement: split.map(|p| p.placement).unwrap_or_default(),
        };
        let shape = Shape::read(&file, &arch, n_layers, n_embd, n_vocab);
        let recurrent = weights.is_recurrent();
        let kernels = device.llama_cpp_kernels();
        let cache_key = pocket_core::fingerprint(&[path]).ok().map(|fingerprint| CacheKey {
            fingerprint,
            device: device.name.clone(),
            kernels: kernels.clone(),
            weights: crate::WeightFormat::AsStored.name().to_owned(),
        });
        tracing::info!(model = %info.name, arch = %arch, device = %device.name, recurrent, "loaded model on llama.cpp");
        let inner = Inner {
            vocab,
            weights,
            info,
            shape,
            device: device.name.clone(),
            kernels,
            recurrent,
            cache_key,
            _reservation: reservation,
        };
        Ok(LlamaCppModel { inner: Arc::new(inner) })
    }

    /// The name of the device the model runs on.
    pub fn device_name(&self) -> &str {
        &self.inner.device
    }

    /// The kernels its passes use, as measured speeds are kept under: `llama.cpp`, and on the
    /// CPU what ggml was compiled for (`llama.cpp+ggml-avx512`).
    pub fn kernels(&self) -> &str {
        &self.inner.kernels
    }

    /// Whether the model runs on a GPU.
    pub fn on_gpu(&self) -> bool {
        !self.inner.device.eq_ignore_ascii_case("cpu")
    }

    /// A new session, as the concrete type.
    pub fn new_session_in(&self, config: &SessionConfig, ledger: &Ledger) -> Result<LlamaCppSession> {
        LlamaCppSession::new(Arc::clone(&self.inner), config, ledger)
    }
}

/// `config` as a session on `inner` runs it: context within the training context, batch and
/// rows within the context.
fn effective(inner: &Inner, config: &SessionConfig) -> SessionConfig {
    let mut config = config.clone();
    config.n_ctx = config.n_ctx.clamp(1, inner.info.n_ctx_train.max(1));
    config.n_batch = config.n_batch.clamp(1, config.n_ctx);
    config.max_rows = config.max_rows.clamp(1, config.n_batch.min(crate::MAX_LOGIT_ROWS));
    config
}

fn footprint(inner: &Inner, config: &SessionConfig) -> Result<Footprint> {
    let config = effective(inner, config);
    let shape = &inner.shape;
    let block = kv::kv_block_size(config.kv);
    if block > 1 && (!shape.head_k.is_multiple_of(block) || !shape.head_v.is_multiple_of(block)) {
        return Err(Error::Core(CoreError::invalid(format!(
            "a {} KV cache needs heads whose size is a multiple of {block}; {} has heads of {} (K) and {} (V): \
             use an f16 cache",
            config.kv, inner.info.name, shape.head_k, shape.head_v
        ))));
    }
    let on_cpu = inner.device.eq_ignore_ascii_case("cpu");
    let file = inner.info.weights_bytes;
    Ok(Footprint {
        weights_anon_bytes: 0,
        weights_mapped_bytes: if on_cpu { file } else { 0 },
        kv_bytes_per_token: shape.kv_bytes_per_token(config.kv) as u64,
        kv_block_tokens: LLAMA_CTX_PAD as u64,
        compute_bytes: shape.compute_bytes(config.n_batch, config.max_rows) as u64,
        logits_row_bytes: (shape.n_vocab * 4) as u64,
    })
}

impl Model for LlamaCppModel {
    fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    fn drafters(&self) -> &'static [SpecMode] {
        if self.inner.recurrent { Self::PLAIN } else { Self::DRAFTERS }
    }

    fn unavailable(&self) -> Option<String> {
        self.inner.weights.lost_peer()
    }

    fn cache_key(&self) -> Option<&CacheKey> {
        self.inner.cache_key.as_ref()
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.inner.vocab
    }

    fn footprint(&self, config: &SessionConfig) -> pocket_core::Result<Footprint> {
        Ok(footprint(&self.inner, config)?)
    }

    fn session_in(&self, config: &SessionConfig, ledger: &Ledger) -> pocket_core::Result<Box<dyn Session>> {
        Ok(Box::new(self.new_session_in(config, ledger)?))
    }
}

/// One conversation on a [`LlamaCppModel`]: a llama.cpp context of one sequence.
pub struct LlamaCppSession {
    model: Arc<Inner>,
    config: SessionConfig,
    ctx: LlamaContext,
    tokens: Vec<Token>,
    logits: Vec<f32>,
    kv_bytes: u64,
    compute_bytes: u64,
    /// The KV cache and compute buffers in the ledger.
    _buffers: Reservation,
    /// Our copy of the logits in the ledger.
    logits_reservation: Reservation,
    /// The threads of the passes run so far.
    pass_stats: PassStats,
}

impl LlamaCppSession {
    fn new(model: Arc<Inner>, config: &SessionConfig, ledger: &Ledger) -> Result<Self> {
        let config = effective(&model, config);
        let predicted = footprint(&model, &config)?;
        let name = &model.info.name;
        // llama.cpp allocates the whole context's cache now: it is paid for now.
        let kv_predicted = predicted.kv_bytes(config.n_ctx as u64);
        let mut buffers = ledger.reserve(
            kv_predicted + predicted.compute_bytes,
            &format!("the KV cache and compute buffers of {name} (llama.cpp)"),
        )?;
        let params = ContextParams {
            n_ctx: config.n_ctx,
            n_batch: config.n_batch,
            max_rows: config.max_rows,
            threads: config.threads,
            kv: config.kv,
            flash_attn: false,
            n_seq: 1,
        };
        let ctx = LlamaContext::new(Arc::clone(&model.weights), &params)?;
        // What llama.cpp says it allocated replaces the prediction.
        let said = ctx.buffers();
        // The log prints MiB to two decimals (read rounded up): a prediction within that is
        // exact.
        let within_print = |said: u64, predicted: u64| predicted <= said && said - predicted <= 11 << 10;
        let kv_bytes =
            if said.kv > 0 && !within_print(said.kv, kv_predicted) { said.kv } else { kv_predicted };
        let compute_bytes = if said.compute > 0 { said.compute } else { predicted.compute_bytes };
        if compute_bytes > predicted.compute_bytes || kv_bytes > kv_predicted {
            tracing::debug!(
                kv_bytes,
                kv_predicted,
                compute_bytes,
                compute_predicted = predicted.compute_bytes,
                "llama.cpp allocated more than predicted"
            );
        }
        buffers.resize(kv_bytes + compute_bytes)?;
        let logits_reservation = ledger.reserve(0, &format!("the logits of {name}"))?;
        Ok(LlamaCppSession {
            model,
            config,
            ctx,
            tokens: Vec::new(),
            logits: Vec::new(),
            kv_bytes,
            compute_bytes,
            _buffers: buffers,
            logits_reservation,
            pass_stats: PassStats::default(),
        })
    }

    /// Undo a decode that failed part-way: the tokens and cache positions from `len` on.
    fn roll_back(&mut self, len: usize) {
        self.tokens.truncate(len);
        if !self.ctx.remove_from(len) {
            // A recurrent state cannot drop a suffix: the session starts over, empty (its
            // `len()` tells the caller).
            self.ctx.clear();
            self.tokens.clear();
        }
    }
}

impl Session for LlamaCppSession {
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
        let info = &self.model.info;
        let n_vocab = info.n_vocab;
        plan.check(info.n_layers)?;
        if !plan.is_full() {
            return Err(CoreError::Unsupported(
                "llama.cpp's engine runs every layer; layer plans need a model our graph builds".into(),
            ));
        }
        let old_len = self.tokens.len();
        pocket_core::check_decode(tokens, n_vocab, old_len, self.config.n_ctx)?;
        let batch = tokens.len();
        let n_rows = rows.count(batch)?;
        let logits_len = n_rows * n_vocab;
        if logits_len > self.logits.capacity() {
            self.logits_reservation.resize((logits_len * size_of::<f32>()) as u64)?;
        }
        self.logits.clear();
        self.logits.reserve_exact(logits_len);
        for (pass, n_out) in pocket_core::passes(batch, n_rows, self.config.n_batch, self.config.max_rows) {
            let chunk = &tokens[pass.clone()];
            let t0 = std::time::Instant::now();
            match self.ctx.decode(chunk, old_len + pass.start, chunk.len() - n_out, &mut self.logits) {
                Ok(threads) => {
                    // llama_decode computes and hands back the logits in one call.
                    let took = t0.elapsed();
                    self.pass_stats.add(PassRecord { threads, splits: 0, pass: took, graph: took });
                }
                Err(e) => {
                    self.roll_back(old_len);
                    return Err(e.into());
                }
            }
            self.tokens.extend_from_slice(chunk);
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
        if len == self.tokens.len() {
            return Ok(());
        }
        if len == 0 {
            self.ctx.clear();
        } else if !self.ctx.remove_from(len) {
            return Err(CoreError::Unsupported(format!(
                "{} keeps a recurrent state, which cannot go back to an earlier position",
                self.model.info.name
            )));
        }
        self.tokens.truncate(len);
        Ok(())
    }

    fn memory(&self) -> u64 {
        self.kv_bytes + self.compute_bytes + (self.logits.capacity() * 4) as u64
    }

    fn kv_bytes(&self) -> u64 {
        self.kv_bytes
    }

    fn pass_stats(&self) -> PassStats {
        self.pass_stats
    }

    fn save(&self) -> pocket_core::Result<Option<SavedState>> {
        let data = self.ctx.save_sequence()?;
        Ok(Some(SavedState { tokens: self.tokens.clone(), kv: self.config.kv, data }))
    }

    fn restore(&mut self, saved: &SavedState, len: usize) -> pocket_core::Result<()> {
        let (held, n_vocab) = (self.tokens.len(), self.model.info.n_vocab);
        if !pocket_core::check_restore(saved, len, held, self.config.kv, n_vocab, self.config.n_ctx)? {
            return Ok(());
        }
        // The cache was allocated (and paid for) whole with the context: nothing to reserve.
        if !self.ctx.load_sequence(&saved.data) {
            self.ctx.clear();
            return Err(CoreError::invalid(
                "llama.cpp refused the saved state (another model or cache type)",
            ));
        }
        if len < saved.tokens.len() && !self.ctx.remove_from(len) {
            self.ctx.clear();
            return Err(CoreError::Unsupported(format!(
                "{} keeps a recurrent state, which can only be continued whole",
                self.model.info.name
            )));
        }
        self.tokens.extend_from_slice(&saved.tokens[..len]);
        Ok(())
    }
}
