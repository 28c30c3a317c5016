//! A loaded decoder model.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use pocket_core::cost::CostCurveConfig;
use pocket_core::memory::{Ledger, Place};
use pocket_core::spec::SpecMode;
use pocket_core::{
    CacheKey, Footprint, KvType, LayerPlan, Model, ModelInfo, ModelKind, Rows, Session, SessionConfig, Token,
    Tokenizer,
};

use crate::attention::AttentionKernel;
use crate::batch::Batcher;
use crate::convert::WeightFormat;
use crate::ffi::device::{Device, DeviceChoice, Repack};
use crate::ffi::gguf::GgufFile;
use crate::ffi::sched::CompiledModelsKept;
use crate::ffi::vocab::Vocab;
use crate::hparams::Hparams;
use crate::kv::{self, KV_BLOCK_TOKENS};
use crate::loaded::Inner;
use crate::parts::Parts;
use crate::session::{GgmlSession, OPENVINO_PASS};
use crate::weights::Weights;
use crate::{Error, Result};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// The device to run on.
    pub device: DeviceChoice,
    /// Which quantized matrices ggml repacks into its CPU layouts at load ([`Repack`]).
    pub repack: Repack,
    /// The format weight matrices are held in: as stored, or widened to Q8_0 for a flatter
    /// verification cost curve on CPUs (see [`WeightFormat`]).
    pub weights: WeightFormat,
    /// Which attention kernel the graph uses over an f16 cache on the CPU.
    pub attention: AttentionKernel,
    /// The memory ledger the weights are paid for in, for as long as the model is loaded
    /// (none: no budget).
    pub ledger: Option<Ledger>,
    /// Layers placed on other machines' devices through ggml's RPC backend (none: every layer
    /// here). The ledger pays for this machine's share only.
    pub split: Option<crate::rpc::SplitOptions>,
}

/// Which engine of this crate a GGUF file needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphSupport {
    /// Our graph builds it ([`GgmlModel`]).
    Ours,
    /// Our graph does not build it, for `reason`; llama.cpp's does ([`crate::LlamaCppModel`]).
    LlamaCpp {
        /// What our graph does not build (the architecture, a feature of it).
        reason: String,
    },
}

/// Whether our graph builds the model at `path`, from its metadata and tensor names (nothing
/// is loaded). Errors: a file that is not a readable GGUF model.
pub fn graph_support(path: &Path) -> Result<GraphSupport> {
    let file = GgufFile::open(path)?;
    let read = crate::arch::read_hparams(&file);
    match read.and_then(|hp| crate::weights::check_tensors(&file, &hp, crate::arch::layer_tensors(hp.arch))) {
        Ok(()) => Ok(GraphSupport::Ours),
        Err(e) if e.not_built_here() => Ok(GraphSupport::LlamaCpp { reason: e.to_string() }),
        Err(e) => Err(e),
    }
}

/// Whether sessions of a model may share passes: only where every row of a shared pass is
/// bitwise what that row's own pass computes — every matrix multiplied by a multi-row kernel
/// of ours (which rounds each row as ggml's one-row kernel does), on the CPU, with no layout
/// that ggml multiplies one way for one row and another for several (`Repack::All`).
/// `POCKET_SHARED_PASSES=0` turns sharing off, for measuring what it brings.
fn shares_passes(device: &Device, weights: &Weights, repack: Repack) -> bool {
    let off = std::env::var_os("POCKET_SHARED_PASSES").is_some_and(|v| v == "0");
    !off && device.all_on_cpu() && repack != Repack::All && weights.matrices().all(crate::gemm::rows_exact)
}

/// On an OpenVINO device, have the backend compile the shapes every request's passes take
/// (a wide pass of a prompt, and a single token: `session::fixed_width`) as the model loads,
/// rather than in its first request: seconds each.
fn compile_pass_shapes(inner: &Arc<Inner>) -> Result<()> {
    let mut session = GgmlSession::new(Arc::clone(inner), &SessionConfig::default(), &Ledger::unlimited())?;
    // Any ids of the vocabulary: only the shapes matter.
    let tokens: Vec<Token> = (0..OPENVINO_PASS as Token + 2).collect();
    session.decode(&tokens, &LayerPlan::full(inner.hp.n_layer)?, Rows::Last)?;
    Ok(())
}

/// The process's resident memory now (`VmRSS`), 0 where `/proc` cannot say.
fn resident_bytes() -> u64 {
    pocket_core::memory::MemoryLimits::read().resident
}

/// A decoder model loaded from a GGUF file: weights placed on a device, tokenizer ready.
///
/// Cheap to clone (the weights are shared); every [`GgmlSession`] made from it keeps it alive.
#[derive(Clone)]
pub struct GgmlModel {
    inner: Arc<Inner>,
}

impl GgmlModel {
    /// The speculation modes its sessions support ([`Model::drafters`]): every layer plan
    /// runs (layer skipping), and a draft model can share the vocabulary; there is no encoder
    /// source to copy from.
    pub const DRAFTERS: &'static [SpecMode] =
        &[SpecMode::Off, SpecMode::Auto, SpecMode::Suffix, SpecMode::LayerSkip, SpecMode::Draft];

    /// Load the model at `path`.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        Self::load_with_progress(path, options, &mut |_, _| {})
    }

    /// Load the model at `path`, calling `progress(done, total)` (bytes of weights placed).
    pub fn load_with_progress(
        path: &Path,
        options: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        // The device first: it starts ggml (an OpenVINO device is chosen before it starts).
        let mut device = Device::select(&options.device, options.repack, crate::gemm::repacked::buffer_type)?;
        let file = GgufFile::open(path)?;
        let hp = crate::arch::read_hparams(&file)?;
        let what = format!("the weights of {}", path.display());
        // Weights read through the mapping become resident as they are used: at most the file.
        // Converted or repacked copies are known once made, and paid for then.
        // On a device they are copied into its memory (all but the token embedding, which stays
        // in host memory): the file's size is reserved there first, then split as placed.
        // Layers on peers are paid for there (their cap), not here.
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let mut here_bytes = file_bytes;
        let mut placement = Vec::new();
        if let Some(split) = &options.split
            && let Some(plan) = crate::split::plan(&file, hp.n_layer, split, &device.name)?
        {
            device = device.with_remote(plan.remote);
            here_bytes = file_bytes.saturating_sub(plan.remote_bytes);
            placement = plan.placement;
        }
        let first = if device.is_cpu() { Place::Host } else { Place::Device };
        let mut reservations = match &options.ledger {
            Some(l) => vec![l.reserve_in(first, here_bytes, &what)?, l.reserve_in(Place::Host, 0, &what)?],
            None => Vec::new(),
        };
        let layer_tensors = crate::arch::layer_tensors(hp.arch);
        let weights = Weights::load(&file, (&hp, layer_tensors), &device, options.weights, progress)?;
        if let [in_first, host] = &mut reservations[..] {
            let placed = weights.mapped_bytes + weights.copied_bytes - weights.remote_bytes;
            in_first.resize(if first == Place::Device { weights.device_bytes } else { placed })?;
            host.resize(placed - in_first.bytes())?;
        }
        let vocab = Vocab::load(path)?;
        let name = if hp.name.is_empty() {
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
        } else {
            hp.name.clone()
        };
        let info = ModelInfo {
            name,
            architecture: hp.arch_name.clone(),
            kind: ModelKind::Decoder,
            n_layers: hp.n_layer,
            n_embd: hp.n_embd,
            n_vocab: hp.n_vocab,
            n_ctx_train: hp.n_ctx_train,
            weights_bytes: file_bytes,
            exact_passes: None,
            placement,
        };
        let batch = shares_passes(&device, &weights, options.repack).then(Batcher::default);
        tracing::info!(
            model = %info.name, arch = %info.architecture, device = %device.name,
            mapped = weights.mapped_bytes, copied = weights.copied_bytes, format = %options.weights,
            shared_passes = batch.is_some(), "loaded model"
        );
        let (repack, format, attention) = (options.repack, options.weights, options.attention);
        let cache_key = match pocket_core::fingerprint(&[path]) {
            Ok(fingerprint) => Some(CacheKey {
                fingerprint,
                device: device.name.clone(),
                kernels: kernels(&device, &hp, attention),
                weights: format.name().to_owned(),
            }),
            Err(e) => {
                tracing::warn!(
                    "cannot fingerprint {}; nothing measured on it is remembered: {e}",
                    path.display()
                );
                None
            }
        };
        let parts = Parts {
            weights,
            vocab,
            hp,
            device,
            info,
            file,
            repack,
            format,
            attention,
            cache_key,
            ledger: options.ledger.clone().unwrap_or_else(Ledger::unlimited),
            _reservations: reservations,
        };
        let mut inner = Arc::new(Inner { batch, compiled: None, parts, step_rows: AtomicUsize::new(1) });
        if !inner.device.all_on_cpu() {
            // What compiling for this model costs, where it is kept (on OpenVINO): from here
            // when the probe's models are kept too (another model's keeper keeps them all).
            let resident_before_probe = CompiledModelsKept::others_alive().then(resident_bytes);
            // A backend that cannot compute our graph (ggml's OpenVINO backend converts whole
            // graphs and knows llama.cpp's) leaves the model to llama.cpp's graph.
            let exact = crate::exact::probe(&inner).map_err(|e| match e {
                Error::Ggml(why) | Error::Core(pocket_core::Error::Engine(why)) => Error::Unsupported {
                    path: path.to_owned(),
                    arch: inner.info.architecture.clone(),
                    reason: format!("on {}: the device could not compute it ({why})", inner.device.name),
                },
                e => e,
            })?;
            tracing::info!(model = %inner.info.name, max_tokens = exact.max_tokens, "{}", exact.why);
            let only = Arc::get_mut(&mut inner).expect("the probe's session is gone");
            only.parts.info.exact_passes = Some(exact);
            only.compiled = CompiledModelsKept::on(&only.parts.device)?;
            if inner.compiled.is_some() {
                let before = resident_before_probe.unwrap_or_else(resident_bytes);
                compile_pass_shapes(&inner)?;
                // The host memory the process grew by is what the compiled models took (the
                // weights were paid for above): an estimate, as other work may run beside the
                // load, but the budget must know them (a model's worth of weights per shape).
                let grew = resident_bytes().saturating_sub(before);
                let what = format!("the models OpenVINO compiled for {}'s passes", inner.info.name);
                let only = Arc::get_mut(&mut inner).expect("the compiling session is gone");
                let (compiled, ledger) = (only.compiled.as_mut().expect("kept above"), &only.parts.ledger);
                compiled.charge(ledger, grew, &what)?;
                tracing::info!(model = %inner.info.name, bytes = grew, "charged the compiled models to the budget");
            }
        }
        Ok(GgmlModel { inner })
    }

    /// A new session, as the concrete type (with its engine-specific accessors).
    pub fn new_session(&self, config: &SessionConfig) -> Result<GgmlSession> {
        GgmlSession::new(Arc::clone(&self.inner), config, &Ledger::unlimited())
    }

    /// A new session that pays for its memory in `ledger` (see [`Model::session_in`]).
    pub fn new_session_in(&self, config: &SessionConfig, ledger: &Ledger) -> Result<GgmlSession> {
        GgmlSession::new(Arc::clone(&self.inner), config, ledger)
    }

    /// KV bytes per token for `kv`, over all layers.
    pub fn kv_bytes_per_token(&self, kv: KvType) -> usize {
        kv::bytes_per_token(&self.inner.hp, kv)
    }

    /// Rows a decode step is computed as: 1, or on a device whose probe at load found that
    /// steps computed as more rows (the token repeated) round as wider passes do, that many.
    pub fn step_rows(&self) -> usize {
        self.inner.step_rows.load(Ordering::Relaxed)
    }

    /// Compute decode steps as `rows` rows from now on (at least 1), whatever the probe chose:
    /// for measuring what it costs and for tests. Each row gives the same bits on the CPU.
    pub fn set_step_rows(&self, rows: usize) {
        self.inner.step_rows.store(rows.max(1), Ordering::Relaxed);
    }

    /// Which weights may be repacked ([`LoadOptions::repack`]).
    pub fn repacks(&self) -> Repack {
        self.inner.repack
    }

    /// The format the weight matrices are held in ([`LoadOptions::weights`]).
    pub fn weight_format(&self) -> WeightFormat {
        self.inner.format
    }

    /// Our attention kernel for this model's f16 caches on its device, whether or not it was
    /// loaded to use it (`LoadOptions::attention`).
    pub(crate) fn attention_kernel(&self) -> Option<crate::attention::Kernel> {
        crate::attention::kernel_for(self.inner.device.all_on_cpu(), self.inner.hp.head_dim)
    }

    /// The name of the device the model runs on.
    pub fn device_name(&self) -> &str {
        &self.inner.device.name
    }

    /// Whether the model runs on a GPU (weights and KV cache in its memory).
    pub fn on_gpu(&self) -> bool {
        !self.inner.device.is_cpu()
    }

    /// The kernels of our own that the graph uses beside ggml's, and on the CPU what ggml's
    /// were compiled for, as a short name (`mm-avx512(q4_0,…)+attn-avx512+ggml-avx512`,
    /// `ggml-avx2`, or `ggml` on another device): measurements of speed, such as cached cost
    /// curves, hold only for the kernels they were taken with. Attention is named where this
    /// model's f16 caches would use it (on the CPU); quantized caches keep ggml's.
    pub fn kernels(&self) -> String {
        kernels(&self.inner.device, &self.inner.hp, self.inner.attention)
    }

    /// The model file.
    pub fn path(&self) -> &Path {
        self.inner.file.path()
    }

    /// The concrete tokenizer (also reachable as `&dyn Tokenizer` through [`Model`]).
    pub fn vocab(&self) -> &Vocab {
        &self.inner.vocab
    }
}

/// [`GgmlModel::kernels`] for a model of `hp` on `device`.
fn kernels(device: &Device, hp: &Hparams, attention: AttentionKernel) -> String {
    let matmul = crate::gemm::name();
    let attention = crate::attention::kernel_for(device.all_on_cpu(), hp.head_dim)
        .filter(|_| attention == AttentionKernel::Auto)
        .map(crate::attention::Kernel::name);
    let names: Vec<String> =
        matmul.into_iter().chain(attention.map(str::to_owned)).chain([device.ggml_kernels()]).collect();
    names.join("+")
}

impl Model for GgmlModel {
    fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    fn drafters(&self) -> &'static [SpecMode] {
        GgmlModel::DRAFTERS
    }

    fn unavailable(&self) -> Option<String> {
        self.inner.device.lost_peer()
    }

    fn cache_key(&self) -> Option<&CacheKey> {
        self.inner.cache_key.as_ref()
    }

    fn cost_curve_config(&self) -> CostCurveConfig {
        let mut config = CostCurveConfig::default();
        // ggml-openvino compiles a model for every pass shape and keeps it while the model is
        // loaded (seconds and a copy of the weights each): there the curve times only the
        // widths a verification pass may take (the probe's), which requests compile anyway.
        if self.inner.device.is_openvino() {
            let widest = self.inner.info.exact_passes.as_ref().map_or(1, |e| e.max_tokens.max(1));
            config.sizes.retain(|&n| n <= widest);
        }
        config
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.inner.vocab
    }

    fn footprint(&self, config: &SessionConfig) -> pocket_core::Result<Footprint> {
        // The compute buffer is measured the way a session reserves it, without allocating it:
        // creating the scheduler is cheap next to loading, and it makes the number exact.
        let compute_bytes = GgmlSession::measure_compute(&self.inner, config)?;
        let w = &self.inner.weights;
        Ok(Footprint {
            weights_anon_bytes: w.copied_bytes - w.remote_bytes,
            weights_mapped_bytes: w.mapped_bytes,
            kv_bytes_per_token: kv::bytes_per_token(&self.inner.hp, config.kv) as u64,
            kv_block_tokens: KV_BLOCK_TOKENS as u64,
            compute_bytes: compute_bytes as u64,
            logits_row_bytes: (self.inner.hp.n_vocab * 4) as u64,
        })
    }

    fn session_in(&self, config: &SessionConfig, ledger: &Ledger) -> pocket_core::Result<Box<dyn Session>> {
        Ok(Box::new(self.new_session_in(config, ledger)?))
    }

    fn shared_passes(&self) -> Option<pocket_core::SharedPasses> {
        self.inner.batch.as_ref().map(Batcher::stats)
    }
}
