//! [`TractModel`]: the graphs, tokenizer and dimensions of one encoder-decoder model.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use pocket_core::cost::CostCurveConfig;
use pocket_core::memory::{Ledger, Reservation};
use pocket_core::spec::SpecMode;
use pocket_core::{
    CacheKey, Footprint, Model, ModelInfo, ModelKind, Session, SessionConfig, Token, Tokenizer,
};
use serde_json::Value;

use crate::Error;
use crate::graph::Graph;
use crate::layout::Layout;
use crate::loaded::Inner;
use crate::roles::{DecoderGraph, EncoderGraph};
use crate::session::TractSession;
use crate::tokenizer::HfTokenizer;

/// An ONNX encoder-decoder model loaded into tract.
pub struct TractModel {
    pub(crate) inner: Arc<Inner>,
    /// The weights' bytes, paid for in the ledger the model was loaded in.
    _weights: Reservation,
}

/// `config.json` and `generation_config.json` merged (the latter wins), where present.
fn read_config(layout: &Layout) -> Result<Value, Error> {
    let mut merged = serde_json::Map::new();
    for path in [layout.config.as_ref(), layout.generation_config.as_ref()].into_iter().flatten() {
        let text = std::fs::read(path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let value: Value = serde_json::from_slice(&text)
            .map_err(|e| Error::BadGraph { path: path.clone(), reason: format!("not valid JSON: {e}") })?;
        if let Value::Object(map) = value {
            merged.extend(map);
        }
    }
    Ok(Value::Object(merged))
}

fn usize_key(config: &Value, keys: &[&str]) -> Option<usize> {
    keys.iter().find_map(|k| config.get(*k)?.as_u64()).map(|v| v as usize)
}

impl TractModel {
    /// The speculation modes its sessions support ([`Model::drafters`]): drafts are verified
    /// by decoding several tokens in one call, and the encoder's source is there to copy from;
    /// there are no partial layer plans (layer skipping) or draft models.
    pub const DRAFTERS: &'static [SpecMode] =
        &[SpecMode::Off, SpecMode::Auto, SpecMode::Suffix, SpecMode::InputCopy];

    /// Load the model in directory `dir` (see [`Layout`] for what it must hold), with no
    /// memory budget.
    pub fn load(dir: &Path) -> Result<Self, Error> {
        Self::load_in(dir, &Ledger::unlimited())
    }

    /// Load the model in `dir`, its weights paid for in `ledger` before they are read.
    pub fn load_in(dir: &Path, ledger: &Ledger) -> Result<Self, Error> {
        let layout = Layout::find(dir)?;
        let weights = ledger.reserve(layout.graph_bytes(), "the model's graphs")?;
        let config = read_config(&layout)?;
        let name = dir.file_name().map_or_else(|| "onnx model".into(), |n| n.to_string_lossy().into_owned());
        let eos = usize_key(&config, &["eos_token_id"]).map(|v| v as Token);
        let tokenizer = HfTokenizer::load(&layout.tokenizer, &name, eos)?;

        let encoder = EncoderGraph::new(Graph::load(&layout.encoder)?)?;
        let decoder = DecoderGraph::first(Graph::load(&layout.decoder)?)?;
        let with_past = match &layout.decoder_with_past {
            Some(path) if !decoder.present.is_empty() => {
                Some(DecoderGraph::with_past(Graph::load(path)?, decoder.present.len())?)
            }
            Some(path) => {
                return Err(Error::BadGraph {
                    path: path.clone(),
                    reason: format!(
                        "a with-past decoder beside a first decoder ({}) that returns no present.* K/V to start it with",
                        layout.decoder.display()
                    ),
                });
            }
            None => None,
        };
        let n_vocab = decoder
            .vocab()
            .ok_or_else(|| decoder.graph.error("the logits' last axis (the vocabulary) is not fixed"))?;
        let n_embd = encoder.width().or_else(|| usize_key(&config, &["d_model"])).unwrap_or(0);
        let n_layers = usize_key(&config, &["num_decoder_layers", "num_layers"])
            .or((!decoder.present.is_empty()).then_some(decoder.present.len()))
            .unwrap_or(1);
        let (heads, head_dim) = with_past.as_ref().and_then(|d| d.kv_dims()).unwrap_or_else(|| {
            let heads = usize_key(&config, &["num_heads"]).unwrap_or(8);
            (heads, usize_key(&config, &["d_kv"]).unwrap_or(64))
        });
        let decoder_start = usize_key(&config, &["decoder_start_token_id"])
            .map(|v| v as Token)
            .or_else(|| tokenizer.token_id("<pad>"))
            .unwrap_or(0);
        let info = ModelInfo {
            name,
            architecture: config
                .get("model_type")
                .and_then(Value::as_str)
                .unwrap_or("onnx-seq2seq")
                .to_owned(),
            kind: ModelKind::EncoderDecoder,
            n_layers,
            n_embd,
            n_vocab,
            // T5's relative positions have no hard limit; 512 is what it was trained on.
            n_ctx_train: usize_key(&config, &["n_positions"]).unwrap_or(512),
            weights_bytes: layout.graph_bytes(),
            exact_passes: None,
            placement: Vec::new(),
        };
        tracing::debug!(
            model = %info.name,
            with_past = with_past.is_some(),
            n_vocab,
            n_layers,
            "loaded an encoder-decoder model"
        );
        let graphs: Vec<&Path> = layout.graphs().collect();
        let cache_key = match pocket_core::fingerprint(&graphs) {
            Ok(fingerprint) => Some(CacheKey {
                fingerprint,
                device: "CPU".into(),
                kernels: "tract".into(),
                weights: "stored".into(),
            }),
            Err(e) => {
                tracing::warn!(
                    "cannot fingerprint {}; nothing measured on it is remembered: {e}",
                    dir.display()
                );
                None
            }
        };
        let inner = Inner {
            info,
            layout,
            tokenizer,
            encoder,
            decoder,
            with_past,
            decoder_start,
            heads,
            head_dim,
            executors: Mutex::new(HashMap::new()),
            cache_key,
        };
        Ok(TractModel { inner: Arc::new(inner), _weights: weights })
    }

    /// The directory the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.layout.dir
    }

    /// The token the decoder starts from (T5: `<pad>`, 0).
    pub fn decoder_start(&self) -> Token {
        self.inner.decoder_start
    }

    /// Whether the model has a with-past decoder, so that sessions keep a KV cache; without
    /// one every decoder call recomputes the whole prefix.
    pub fn has_kv_cache(&self) -> bool {
        self.inner.with_past.is_some()
    }

    /// The tokenizer, with its Hugging Face specifics.
    pub fn hf_tokenizer(&self) -> &HfTokenizer {
        &self.inner.tokenizer
    }

    /// A new session of the concrete type (for the engine's own tests and tools).
    pub fn new_session(&self, config: &SessionConfig, ledger: &Ledger) -> pocket_core::Result<TractSession> {
        TractSession::new(self.inner.clone(), config, ledger)
    }
}

impl Model for TractModel {
    fn info(&self) -> &ModelInfo {
        &self.inner.info
    }

    fn drafters(&self) -> &'static [SpecMode] {
        TractModel::DRAFTERS
    }

    fn cache_key(&self) -> Option<&CacheKey> {
        self.inner.cache_key.as_ref()
    }

    fn cost_curve_config(&self) -> CostCurveConfig {
        // A few sizes at a short context: a decoder without a cache recomputes its whole
        // prefix at every call, so a long context would make measuring slow.
        CostCurveConfig { sizes: vec![1, 2, 4, 8, 16], context: 16, repetitions: 3, warmup: 1 }
    }

    fn decoder_start(&self) -> Option<Token> {
        Some(self.inner.decoder_start)
    }

    fn tokenizer(&self) -> &dyn Tokenizer {
        &self.inner.tokenizer
    }

    fn footprint(&self, config: &SessionConfig) -> pocket_core::Result<Footprint> {
        self.inner.footprint(config)
    }

    fn session_in(&self, config: &SessionConfig, ledger: &Ledger) -> pocket_core::Result<Box<dyn Session>> {
        Ok(Box::new(self.new_session(config, ledger)?))
    }
}
