//! Opening a model file on the engine that runs it: GGUF files on our ggml graph where it
//! builds them and on llama.cpp's own graph where it does not, ONNX encoder-decoder
//! directories on tract.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use pocket_core::memory::Ledger;
use pocket_core::spec::{LayerSkipDrafter, SpecMode};
use pocket_core::{Model, SessionConfig};
use pocket_ggml::{
    DeviceChoice, EmbeddingModel, GgmlModel, GraphSupport, LlamaCppModel, LoadOptions, WeightFormat,
};
use pocket_tract::TractModel;

use crate::chat_template::ChatTemplate;
use crate::grammar::Grammars;
use crate::prompt_cache::PrefixKey;
use crate::{Error, Knowledge, PromptCache, Result};

/// Which engine runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Our transformer graph on ggml (GGUF decoders of the architectures it builds).
    Ggml,
    /// llama.cpp's own graph, through llama.h (every other GGUF decoder).
    LlamaCpp,
    /// tract (ONNX encoder-decoders).
    Tract,
    /// llama.cpp's encoder graphs, for embedding models (GGUF files that pool their token
    /// vectors: BERT and its kin).
    Embedding,
}

impl Engine {
    /// The engine that runs the model at `path`, from its metadata (nothing is loaded). A
    /// file that cannot be read is left to our graph, whose loader says what is wrong with it.
    pub fn for_path(path: &Path) -> Engine {
        if is_onnx(path) {
            return Engine::Tract;
        }
        if pocket_ggml::is_embedding_model(path) {
            return Engine::Embedding;
        }
        match pocket_ggml::graph_support(path) {
            Ok(GraphSupport::LlamaCpp { .. }) => Engine::LlamaCpp,
            _ => Engine::Ggml,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Ggml => "ggml",
            Engine::LlamaCpp => "llama.cpp",
            Engine::Tract => "tract",
            Engine::Embedding => "embeddings",
        }
    }

    /// The speculation modes its models offer ([`Model::drafters`]), known before a model is
    /// opened so that a request can be refused before anything is loaded.
    pub fn drafters(self) -> &'static [SpecMode] {
        match self {
            Engine::Ggml => GgmlModel::DRAFTERS,
            Engine::LlamaCpp => LlamaCppModel::DRAFTERS,
            Engine::Tract => TractModel::DRAFTERS,
            Engine::Embedding => EmbeddingModel::DRAFTERS,
        }
    }

    /// The kind of model it runs.
    pub fn kind(self) -> pocket_core::ModelKind {
        match self {
            Engine::Ggml | Engine::LlamaCpp => pocket_core::ModelKind::Decoder,
            Engine::Tract => pocket_core::ModelKind::EncoderDecoder,
            Engine::Embedding => pocket_core::ModelKind::Embedding,
        }
    }
}

/// Whether `path` names an encoder-decoder model for tract (a directory of ONNX graphs, or one
/// of its `.onnx` files) rather than a GGUF file.
pub fn is_onnx(path: &Path) -> bool {
    path.is_dir() || path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// How to open a model.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The device (ggml; tract runs on the CPU).
    pub device: DeviceChoice,
    /// The format the weight matrices are held in (ggml; tract keeps its graphs as stored).
    pub weights: WeightFormat,
    /// The ledger the weights are paid for in, for as long as the model is open (none: no
    /// budget).
    pub ledger: Option<Ledger>,
    /// Where what is learned about the model is kept (none: [`crate::cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// Where its finished sessions are parked for the next request to continue (none: they
    /// are dropped). Its parked prefixes are given up (written to disk, where the cache has a
    /// directory) when the model is dropped.
    pub prompt_cache: Option<Arc<PromptCache>>,
    /// Where its answers are kept for later requests to draft from (none: they are not).
    pub histories: Option<Arc<crate::Histories>>,
    /// Layers on other machines' devices (ggml's RPC backend; decoder GGUF models on our
    /// graph): none, every layer here.
    pub split: Option<pocket_ggml::rpc::SplitOptions>,
}

/// A model open on its engine, with what is known about it on this device.
pub struct LoadedModel {
    model: Arc<dyn Model>,
    engine: Engine,
    path: PathBuf,
    device: String,
    kernels: String,
    weights: WeightFormat,
    knowledge: Knowledge,
    /// A skip-set search that a request interrupted, resumed when learning resumes.
    pub(crate) search: Mutex<Option<LayerSkipDrafter>>,
    prompt_cache: Option<Arc<PromptCache>>,
    histories: Option<Arc<crate::Histories>>,
    /// llguidance's view of the vocabulary, built on the first constrained request.
    grammars: Mutex<Option<Arc<Grammars>>>,
    /// The chat template the file ships, compiled on first use (`None`: it has none, or
    /// minijinja cannot compile it and llama.cpp's detection renders instead).
    chat_template: OnceLock<Option<Arc<ChatTemplate>>>,
}

impl Drop for LoadedModel {
    fn drop(&mut self) {
        if let (Some(cache), Some(key)) = (&self.prompt_cache, self.model.cache_key()) {
            cache.unload(key);
        }
    }
}

impl LoadedModel {
    /// Open the model at `path` on its engine.
    pub fn open(path: &Path, options: &OpenOptions) -> Result<Self> {
        Self::open_with_progress(path, options, &mut |_, _| {})
    }

    /// [`LoadedModel::open`], calling `progress(done, total)` as ggml places the weights.
    pub fn open_with_progress(
        path: &Path,
        options: &OpenOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self> {
        let ledger = options.ledger.clone().unwrap_or_else(Ledger::unlimited);
        if is_onnx(path) {
            if options.split.is_some() {
                return Err(Error::invalid(
                    "rpc",
                    format!(
                        "{} is an encoder-decoder ONNX model; layers on peers are for decoder GGUF models",
                        path.display()
                    ),
                ));
            }
            if options.weights != WeightFormat::AsStored {
                return Err(Error::invalid(
                    "weights",
                    format!(
                        "{} is an encoder-decoder ONNX model; weight formats ({}) are for GGUF models",
                        path.display(),
                        options.weights
                    ),
                ));
            }
            if !matches!(options.device, DeviceChoice::Auto | DeviceChoice::Cpu) {
                return Err(Error::invalid(
                    "device",
                    format!("{} is an encoder-decoder ONNX model, which runs on the CPU", path.display()),
                ));
            }
            let dir = if path.is_dir() { path } else { path.parent().unwrap_or(path) };
            let model = TractModel::load_in(dir, &ledger)?;
            let model = Arc::new(model);
            return Ok(Self::new(model, Engine::Tract, dir, "CPU", "tract", WeightFormat::AsStored, options));
        }
        let load = LoadOptions {
            device: options.device.clone(),
            weights: options.weights,
            ledger: Some(ledger),
            split: options.split.clone(),
            ..LoadOptions::default()
        };
        let split_refused = |what: &str| {
            Error::invalid(
                "rpc",
                format!("{} {what}; layers on peers are for decoder models", path.display()),
            )
        };
        if pocket_ggml::is_embedding_model(path) {
            if options.split.is_some() {
                return Err(split_refused("is an embedding model"));
            }
            let model = EmbeddingModel::load(path, &load)?;
            let (device, kernels) = (model.device_name().to_owned(), model.kernels().to_owned());
            let model = Arc::new(model);
            return Ok(Self::new(
                model,
                Engine::Embedding,
                path,
                &device,
                &kernels,
                WeightFormat::AsStored,
                options,
            ));
        }
        let why_not_ours = match pocket_ggml::graph_support(path) {
            Ok(GraphSupport::Ours) => match GgmlModel::load_with_progress(path, &load, progress) {
                Ok(model) => {
                    let (device, kernels) = (model.device_name().to_owned(), model.kernels());
                    let model = Arc::new(model);
                    return Ok(Self::new(
                        model,
                        Engine::Ggml,
                        path,
                        &device,
                        &kernels,
                        options.weights,
                        options,
                    ));
                }
                Err(e) if e.not_built_here() => e.to_string(),
                Err(e) => return Err(e.into()),
            },
            Ok(GraphSupport::LlamaCpp { reason }) => reason,
            // A file that is not a readable GGUF model (the same reader's words as our loader's).
            Err(e) => return Err(e.into()),
        };
        if options.weights != WeightFormat::AsStored {
            return Err(Error::invalid(
                "weights",
                format!(
                    "{} runs on llama.cpp's graph ({why_not_ours}), which keeps the weights as stored; \
                     weight formats ({}) are for the architectures our graph builds",
                    path.display(),
                    options.weights
                ),
            ));
        }
        tracing::info!("{}: {why_not_ours}; running it on llama.cpp's graph", path.display());
        let model = LlamaCppModel::load(path, &load)?;
        let (device, kernels) = (model.device_name().to_owned(), model.kernels().to_owned());
        let model = Arc::new(model);
        Ok(Self::new(model, Engine::LlamaCpp, path, &device, &kernels, WeightFormat::AsStored, options))
    }

    /// A model made by the caller rather than opened from a file (a test's fake model, with
    /// pocket-core's `testing` feature): served as if `engine` had opened it from `path`.
    pub fn from_model(model: Arc<dyn Model>, engine: Engine, path: &Path, options: &OpenOptions) -> Self {
        Self::new(model, engine, path, "cpu", "none", WeightFormat::AsStored, options)
    }

    fn new(
        model: Arc<dyn Model>,
        engine: Engine,
        path: &Path,
        device: &str,
        kernels: &str,
        weights: WeightFormat,
        options: &OpenOptions,
    ) -> Self {
        let dir = options.cache_dir.clone().or_else(crate::cache_dir);
        let knowledge = Knowledge::open_in(model.cache_key(), dir.as_deref());
        LoadedModel {
            model,
            engine,
            path: path.to_path_buf(),
            device: device.to_owned(),
            kernels: kernels.to_owned(),
            weights,
            knowledge,
            search: Mutex::new(None),
            prompt_cache: options.prompt_cache.clone(),
            histories: options.histories.clone(),
            grammars: Mutex::new(None),
            chat_template: OnceLock::new(),
        }
    }

    /// The model's own chat template, compiled with minijinja; `None` where the file has none
    /// (or it does not compile: then the engine's rendering is used, and a warning logged).
    pub fn chat_template(&self) -> Option<Arc<ChatTemplate>> {
        self.chat_template
            .get_or_init(|| {
                let tokenizer = self.model.tokenizer();
                let source = tokenizer.chat_template()?;
                let (bos, eos) = tokenizer.bos_eos_text();
                match ChatTemplate::new(source, &bos, &eos) {
                    Ok(t) => Some(Arc::new(t)),
                    Err(e) => {
                        tracing::warn!(model = %self.model.info().name, "cannot compile the chat template: {e}");
                        None
                    }
                }
            })
            .clone()
    }

    /// What compiles grammars for this model's vocabulary (built on first use, then shared).
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        let mut slot = self.grammars.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = slot.as_ref() {
            return Ok(g.clone());
        }
        let built = Arc::new(Grammars::new(self.model.clone())?);
        tracing::info!(
            model = %self.model.info().name,
            seconds = format!("{:.3}", built.build_seconds),
            "built the vocabulary's token trie for grammars"
        );
        *slot = Some(built.clone());
        Ok(built)
    }

    /// Where its finished sessions are parked, if anywhere.
    pub fn prompt_cache(&self) -> Option<&PromptCache> {
        self.prompt_cache.as_deref()
    }

    /// Where its answers are kept for later requests to draft from, if anywhere, and the
    /// model's name there (its files' fingerprint, else its path).
    pub fn histories(&self) -> Option<(&crate::Histories, String)> {
        let name = match self.model.cache_key() {
            Some(key) => key.fingerprint.clone(),
            None => self.path.display().to_string(),
        };
        Some((self.histories.as_deref()?, name))
    }

    /// What a session of it with `threads` threads and a `kv` cache parks its state under;
    /// `None` for a model whose measurements cannot be remembered (no file to key them).
    pub fn prefix_key(&self, threads: usize, kv: pocket_core::KvType) -> Option<PrefixKey> {
        let whole = self.model.info().kind == pocket_core::ModelKind::EncoderDecoder;
        Some(PrefixKey { model: self.model.cache_key()?.clone(), threads, kv, whole })
    }

    /// The model.
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    /// The model, shared.
    pub fn shared(&self) -> Arc<dyn Model> {
        self.model.clone()
    }

    /// The engine it runs on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The file (GGUF) or directory (ONNX) it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device it runs on (`CPU`, `Vulkan0`, ...).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Whether it runs on a GPU.
    pub fn on_gpu(&self) -> bool {
        !self.device.eq_ignore_ascii_case("cpu")
    }

    /// The engine's own kernels its passes use (`mm-avx512(q4_0,…)+attn-avx512`, `ggml`, `tract`).
    pub fn kernels(&self) -> &str {
        &self.kernels
    }

    /// The format its weight matrices are held in.
    pub fn weights(&self) -> WeightFormat {
        self.weights
    }

    /// What is known about it on this device.
    pub fn knowledge(&self) -> &Knowledge {
        &self.knowledge
    }

    /// Whether its sessions can speculate with `mode`.
    pub fn offers(&self, mode: SpecMode) -> bool {
        self.model.drafters().contains(&mode)
    }

    /// KV bytes per token its sessions hold with `config`'s KV type.
    pub fn kv_bytes_per_token(&self, config: &SessionConfig) -> Result<u64> {
        Ok(self.model.footprint(config)?.kv_bytes_per_token)
    }
}
