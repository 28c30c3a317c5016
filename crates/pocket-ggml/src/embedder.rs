//! Embedding models: texts in, pooled vectors out, many texts to a pass. BERT on the CPU runs
//! on our encoder ([`crate::encoder`]); other devices and architectures on llama.cpp's encoder
//! graphs (`POCKET_EMBEDDINGS=llama.cpp` takes llama.cpp's for BERT too, to compare).
//!
//! The tokenizer is the model's own `tokenizer.json` where the file carries it
//! (`tokenizer.huggingface.json`, as our sentence-transformers conversion writes it), so
//! tokens are exactly the reference implementation's; otherwise llama.cpp's tokenizer for the
//! vocabulary in the file. What sentence-transformers adds to the encoder — the length it
//! truncates at, the final normalization — is read from `sentence_transformers.*` where the
//! file has them (otherwise the training context, and normalized, as llama.cpp's server does).

use std::path::Path;
use std::sync::{Arc, Mutex};

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{
    Embedder, EmbedderInfo, Error as CoreError, Footprint, Model, ModelInfo, ModelKind, Session,
    SessionConfig, Threads, Token, Tokenizer,
};

use crate::encoder::{Encoder, Pooling};
use crate::ffi::device::Device;
use crate::ffi::gguf::GgufFile;
use crate::ffi::llama::{LlamaContext, LlamaWeights, Load};
use crate::ffi::vocab::Vocab;
use crate::gemm;
use crate::{Error, LoadOptions, Repack, Result};

/// Tokens of one pass: every sequence of a pass attends within itself, but llama.cpp's mask
/// spans the pass, so its buffers grow with the square; 512 holds 32 short sentences (on a
/// 2-core x86 passes of 128, 256 and 512 tokens embedded sentences at the same rate) and the
/// longest input all-MiniLM-L6-v2 reads. Our encoder takes passes of the same size (its
/// threads split a pass by texts).
const PASS_TOKENS: usize = 512;
/// Sequences of one pass.
const PASS_SEQUENCES: usize = 64;

/// Whether the GGUF file at `path` is an embedding model: one that pools its token vectors
/// (`{arch}.pooling_type` mean, CLS or last).
pub fn is_embedding_model(path: &Path) -> bool {
    let Ok(file) = GgufFile::open(path) else { return false };
    let arch = file.get_str("general.architecture").unwrap_or_default();
    matches!(file.get_u64(&format!("{arch}.pooling_type")), Some(1..=3))
}

/// How texts become tokens.
enum Tokens {
    /// The model's `tokenizer.json`, without the padding and truncation it may carry (the
    /// reference truncates at its own length, and pads nothing).
    Hf(Box<tokenizers::Tokenizer>),
    /// llama.cpp's tokenizer for the file's vocabulary.
    Llama,
}

/// Which graph computes an embedding model's passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmbeddingGraph {
    /// Our encoder where it computes the model (BERT on the CPU), llama.cpp's otherwise; with
    /// `POCKET_EMBEDDINGS=llama.cpp` in the environment, llama.cpp's.
    #[default]
    Auto,
    /// llama.cpp's, whatever the model (to compare the two).
    LlamaCpp,
}

/// What computes the passes.
enum Passes {
    /// Our encoder, on the CPU.
    Encoder(Encoder),
    /// llama.cpp's graph for the model, on these weights.
    LlamaCpp(Arc<LlamaWeights>),
}

/// What passes run in, made on first use with the threads asked for.
enum Runner {
    /// Our encoder's threads.
    Pool(rayon::ThreadPool),
    /// A llama.cpp context.
    Context(LlamaContext),
}

/// The runner of passes and what it was made for.
struct PassContext {
    runner: Runner,
    threads: Threads,
    _reservation: Reservation,
}

/// An embedding model: on our encoder where it computes the model (BERT on the CPU),
/// otherwise on llama.cpp.
pub struct EmbeddingModel {
    passes: Passes,
    vocab: Vocab,
    tokens: Tokens,
    info: ModelInfo,
    embedder: EmbedderInfo,
    n_head: usize,
    n_ff: usize,
    device: String,
    /// [`EmbeddingModel::kernels`].
    kernels: String,
    /// Where the pass context is paid for (the model's own part of the budget).
    ledger: Ledger,
    context: Mutex<Option<PassContext>>,
    /// Requests waiting for the pass context.
    queue: Mutex<Vec<Arc<Ticket>>>,
    _reservation: Option<Reservation>,
}

impl EmbeddingModel {
    /// The speculation modes: none (it generates nothing).
    pub const DRAFTERS: &'static [SpecMode] = &[SpecMode::Off];

    /// Load the embedding model at `path`; of `options`, the device and the ledger apply.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        Self::load_on(path, options, EmbeddingGraph::Auto)
    }

    /// [`EmbeddingModel::load`], its passes computed by `graph`.
    pub fn load_on(path: &Path, options: &LoadOptions, graph: EmbeddingGraph) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let arch = file.get_str("general.architecture").unwrap_or_default();
        let bad = |reason: String| Error::BadModel { path: path.to_owned(), reason };
        let pooling = match file.get_u64(&format!("{arch}.pooling_type")) {
            Some(1) => "mean",
            Some(2) => "cls",
            Some(3) => "last",
            other => {
                return Err(bad(format!("{arch} model with pooling type {other:?}: not an embedding model")));
            }
        };
        let tokens = match file.get_str("tokenizer.huggingface.json") {
            Some(json) => {
                let mut t = tokenizers::Tokenizer::from_bytes(json.as_bytes())
                    .map_err(|e| bad(format!("its tokenizer.huggingface.json does not load: {e}")))?;
                t.with_padding(None);
                t.with_truncation(None).map_err(|e| bad(format!("its tokenizer: {e}")))?;
                Tokens::Hf(Box::new(t))
            }
            None => Tokens::Llama,
        };
        let normalized = file.get_bool("sentence_transformers.normalize").unwrap_or(true);
        let max_seq = file.get_u64("sentence_transformers.max_seq_length").map(|n| n as usize);
        let n_head = file.get_u64(&format!("{arch}.attention.head_count")).unwrap_or(1).max(1) as usize;
        let n_ff = file.get_u64(&format!("{arch}.feed_forward_length")).unwrap_or(0) as usize;

        let device = Device::select(&options.device, Repack::None, || None)?;
        let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let what = format!("the weights of {}", path.display());
        let mut reservation = options.ledger.as_ref().map(|l| l.reserve(file_bytes, &what)).transpose()?;
        let llama_cpp_asked = graph == EmbeddingGraph::LlamaCpp
            || std::env::var("POCKET_EMBEDDINGS").is_ok_and(|v| v == "llama.cpp");
        let encoder = if !device.is_cpu() || llama_cpp_asked {
            None
        } else {
            let pooling = match pooling {
                "cls" => Pooling::Cls,
                "last" => Pooling::Last,
                _ => Pooling::Mean,
            };
            Encoder::load(&file, pooling)
                .inspect_err(|why| tracing::info!(model = %path.display(), "not on our encoder: {why}"))
                .ok()
        };
        let (passes, vocab_owner, kernels) = match encoder {
            Some(encoder) => {
                // Its weights are in f32 in memory, whatever the file's types.
                if let Some(r) = reservation.as_mut() {
                    r.resize(encoder.bytes())?;
                }
                let vocab = LlamaWeights::load(path, Load::VocabOnly)
                    .ok_or_else(|| bad("llama.cpp could not load its vocabulary".into()))?;
                (
                    Passes::Encoder(encoder),
                    Arc::new(vocab),
                    format!("encoder-f32+gemm-{}", gemm::dense::isa()),
                )
            }
            None => {
                let weights = LlamaWeights::load(path, Load::Full { gpu: !device.is_cpu(), repack: false })
                    .ok_or_else(|| {
                    bad(format!("llama.cpp could not load this {arch:?} model (its log says why)"))
                })?;
                let weights = Arc::new(weights);
                (Passes::LlamaCpp(Arc::clone(&weights)), weights, device.llama_cpp_kernels())
            }
        };
        let vocab = Vocab::of(Arc::clone(&vocab_owner));
        let (n_layers, n_embd, n_ctx_train) = match &passes {
            // A vocabulary-only load reads no hyperparameters: the encoder's tensors say them.
            Passes::Encoder(e) => (e.dims().0, e.dims().1, e.max_tokens()),
            Passes::LlamaCpp(weights) => weights.dims(),
        };
        if let Passes::Encoder(e) = &passes
            && e.n_vocab() != vocab_owner.n_vocab()
        {
            return Err(bad(format!(
                "its token embeddings have {} rows for a vocabulary of {} tokens",
                e.n_vocab(),
                vocab_owner.n_vocab()
            )));
        }
        let max_tokens = max_seq.unwrap_or(n_ctx_train).clamp(1, n_ctx_train.max(1)).min(PASS_TOKENS);
        let name = file.model_name();
        let info = ModelInfo {
            name,
            architecture: arch.clone(),
            kind: ModelKind::Embedding,
            n_layers,
            n_embd,
            n_vocab: vocab_owner.n_vocab(),
            n_ctx_train: max_tokens,
            weights_bytes: file_bytes,
            exact_passes: None,
            placement: Vec::new(),
        };
        let embedder = EmbedderInfo { dimensions: n_embd, max_tokens, pooling, normalized };
        tracing::info!(model = %info.name, arch = %arch, device = %device.name, %kernels, pooling, max_tokens, "loaded embedding model");
        Ok(EmbeddingModel {
            passes,
            vocab,
            tokens,
            info,
            embedder,
            n_head,
            n_ff: if n_ff == 0 { 4 * n_embd } else { n_ff },
            device: device.name.clone(),
            kernels,
            ledger: options.ledger.clone().unwrap_or_else(Ledger::unlimited),
            context: Mutex::new(None),
            queue: Mutex::new(Vec::new()),
            _reservation: reservation,
        })
    }

    /// The name of the device it runs on.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// The kernels its passes use: our encoder's (`encoder-f32+gemm-avx512`), or `llama.cpp`
    /// and on the CPU what ggml was compiled for (`llama.cpp+ggml-avx512`).
    pub fn kernels(&self) -> &str {
        &self.kernels
    }

    /// The compute buffers of a pass of `n` tokens, estimated before they are allocated: the
    /// widest activations, and (llama.cpp) the attention scores of every head over the pass.
    fn pass_bytes(&self, n: usize) -> u64 {
        if let Passes::Encoder(e) = &self.passes {
            return e.pass_bytes(n);
        }
        let activations = n * (8 * self.info.n_embd + 3 * self.n_ff);
        let scores = self.n_head * n * n;
        (4 * (activations + scores + PASS_SEQUENCES * self.info.n_embd) + (1 << 20)) as u64
    }

    fn refuse(&self) -> CoreError {
        CoreError::Unsupported(format!(
            "this model ({}) is an embedding model: it makes vectors of texts (POST /v1/embeddings, D-Bus \
             Embed, pocket embed), not text",
            self.info.name
        ))
    }
}

impl Embedder for EmbeddingModel {
    fn embedder_info(&self) -> &EmbedderInfo {
        &self.embedder
    }

    fn tokenize(&self, text: &str) -> pocket_core::Result<Vec<Token>> {
        match &self.tokens {
            Tokens::Hf(t) => t
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| CoreError::Tokenizer(e.to_string())),
            Tokens::Llama => self.vocab.encode(text, true),
        }
    }

    fn truncate(&self, tokens: &[Token]) -> Vec<Token> {
        let max = self.embedder.max_tokens;
        match tokens {
            [] => Vec::new(),
            t if t.len() <= max => t.to_vec(),
            // As Hugging Face's tokenizers cut one sequence: the text's tokens are cut, the
            // closing special token ([SEP]) kept.
            [.., last] => tokens[..max - 1].iter().copied().chain([*last]).collect(),
        }
    }

    fn embed(&self, inputs: &[Vec<Token>], threads: Threads) -> pocket_core::Result<Vec<Vec<f32>>> {
        let (max, n_vocab) = (self.embedder.max_tokens, self.info.n_vocab);
        for (i, t) in inputs.iter().enumerate() {
            if t.is_empty() || t.len() > max {
                return Err(CoreError::invalid_field(
                    "input",
                    format!("input {i} has {} tokens; the model reads 1 to {max}", t.len()),
                ));
            }
            if let Some(bad) = t.iter().find(|&&x| x as usize >= n_vocab) {
                return Err(CoreError::invalid_field(
                    "input",
                    format!("input {i} has token {bad}, not in the vocabulary (0 to {})", n_vocab - 1),
                ));
            }
        }
        // Requests from several clients share passes: each puts its inputs in the queue and
        // waits for the pass context; whoever holds it runs everything queued, so requests that
        // arrive while a pass runs go together in the next passes (flat combining).
        let ticket = Arc::new(Ticket { inputs: inputs.to_vec(), result: Mutex::new(None) });
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&ticket));
        let mut slot = self.context.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(done) = ticket.take() {
            return done;
        }
        let tickets = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
        let all: Vec<&[Token]> = tickets.iter().flat_map(|t| t.inputs.iter().map(Vec::as_slice)).collect();
        let result = self.run_passes(&mut slot, &all, threads);
        let mut vectors = match result {
            Ok(v) => v.into_iter(),
            Err(e) => {
                for t in &tickets {
                    t.set(Err(e.clone()));
                }
                return ticket.take().unwrap_or(Err(e));
            }
        };
        for t in &tickets {
            t.set(Ok(vectors.by_ref().take(t.inputs.len()).collect()));
        }
        ticket.take().unwrap_or_else(|| Err(CoreError::engine("an embedding request lost its vectors")))
    }
}

/// One request's inputs, waiting for a pass, and its vectors once computed.
struct Ticket {
    inputs: Vec<Vec<Token>>,
    result: Mutex<Option<pocket_core::Result<Vec<Vec<f32>>>>>,
}

impl Ticket {
    fn set(&self, result: pocket_core::Result<Vec<Vec<f32>>>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
    }

    fn take(&self) -> Option<pocket_core::Result<Vec<Vec<f32>>>> {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl EmbeddingModel {
    /// The pooled (and, as the model says, normalized) vector of each of `inputs`, in passes
    /// of up to [`PASS_TOKENS`] tokens and [`PASS_SEQUENCES`] sequences on the context in
    /// `slot` (made, and paid for, on first use).
    fn run_passes(
        &self,
        slot: &mut Option<PassContext>,
        inputs: &[&[Token]],
        threads: Threads,
    ) -> pocket_core::Result<Vec<Vec<f32>>> {
        if slot.as_ref().is_some_and(|c| c.threads != threads) {
            *slot = None;
        }
        let runner = match slot {
            Some(c) => &mut c.runner,
            None => {
                let mut reservation =
                    self.ledger.reserve(self.pass_bytes(PASS_TOKENS), "an embedding pass's buffers")?;
                let runner = match &self.passes {
                    Passes::Encoder(_) => Runner::Pool(
                        rayon::ThreadPoolBuilder::new()
                            .num_threads(threads.max())
                            .thread_name(|i| format!("pocket-embed-{i}"))
                            .build()
                            .map_err(|e| CoreError::engine(format!("the encoder's threads: {e}")))?,
                    ),
                    Passes::LlamaCpp(weights) => {
                        let ctx = LlamaContext::for_embeddings(
                            Arc::clone(weights),
                            PASS_TOKENS,
                            PASS_SEQUENCES,
                            threads,
                        )
                        .map_err(CoreError::engine)?;
                        // What llama.cpp allocated, where it said and it is more than planned.
                        let allocated = ctx.buffers().compute;
                        if allocated > reservation.bytes() {
                            reservation.resize(allocated)?;
                        }
                        Runner::Context(ctx)
                    }
                };
                &mut slot.insert(PassContext { runner, threads, _reservation: reservation }).runner
            }
        };
        let mut out = Vec::with_capacity(inputs.len());
        let mut start = 0;
        while start < inputs.len() {
            let (mut end, mut n) = (start, 0);
            while end < inputs.len() && end - start < PASS_SEQUENCES && n + inputs[end].len() <= PASS_TOKENS {
                n += inputs[end].len();
                end += 1;
            }
            let pass = &inputs[start..end];
            let vectors = match (&mut *runner, &self.passes) {
                (Runner::Pool(pool), Passes::Encoder(encoder)) => {
                    // As many threads as the cores other programs leave free, pass by pass.
                    let governor = pocket_core::cpu::governor();
                    let run = governor.begin(threads, pool.current_num_threads());
                    let vectors = pool.install(|| encoder.embed(pass, run.threads()));
                    governor.end(run);
                    vectors
                }
                (Runner::Context(ctx), _) => {
                    ctx.embed(pass, self.embedder.dimensions).map_err(CoreError::engine)?
                }
                (Runner::Pool(_), Passes::LlamaCpp(_)) => {
                    return Err(CoreError::engine("an encoder's threads for llama.cpp's passes"));
                }
            };
            for mut v in vectors {
                if self.embedder.normalized {
                    pocket_core::embed::normalize(&mut v);
                }
                out.push(v);
            }
            start = end;
        }
        Ok(out)
    }
}

impl Model for EmbeddingModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn drafters(&self) -> &'static [SpecMode] {
        Self::DRAFTERS
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.vocab
    }

    fn footprint(&self, _config: &SessionConfig) -> pocket_core::Result<Footprint> {
        Err(self.refuse())
    }

    fn session_in(&self, _config: &SessionConfig, _ledger: &Ledger) -> pocket_core::Result<Box<dyn Session>> {
        Err(self.refuse())
    }

    fn embedder(&self) -> Option<&dyn Embedder> {
        Some(self)
    }
}
