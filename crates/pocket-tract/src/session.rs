//! [`TractSession`]: one source text's encoding and the decoder's state after it.

use std::sync::Arc;

use pocket_core::memory::{Ledger, Reservation};
use pocket_core::{Error, LayerPlan, Logits, Result, Rows, SavedState, Session, SessionConfig, Token};
use tract_linalg::multithread::{Executor, multithread_tract_scope};
use tract_onnx::prelude::*;

use crate::kv::DecoderCache;
use crate::loaded::Inner;
use crate::roles::ones_mask;

/// The encoded source a session decodes against.
struct Source {
    tokens: Vec<Token>,
    mask: TValue,
    hidden: TValue,
}

/// A session of a [`crate::TractModel`]: [`Session::encode`] the source, then decode.
///
/// With a with-past decoder the session keeps the decoder's KV cache (see [`crate::kv`]);
/// without one, every call runs the decoder over every token held plus the new ones.
/// A decoder call takes all the tokens it is given at once (`n_batch` does not split it).
pub struct TractSession {
    model: Arc<Inner>,
    config: SessionConfig,
    executor: Executor,
    source: Option<Source>,
    tokens: Vec<Token>,
    cache: Option<DecoderCache>,
    logits: Vec<f32>,
    /// tract's intermediate tensors during a call and the encoded source, as planned.
    compute: Reservation,
    kv: Reservation,
    logits_bytes: Reservation,
}

impl TractSession {
    pub(crate) fn new(model: Arc<Inner>, config: &SessionConfig, ledger: &Ledger) -> Result<Self> {
        if config.n_ctx == 0 {
            return Err(Error::invalid("the context size is 0; it must hold at least one token"));
        }
        let footprint = model.footprint(config)?;
        let compute = ledger.reserve(footprint.compute_bytes, "the encoder-decoder's compute and source")?;
        Ok(TractSession {
            executor: model.executor(config.threads.max()),
            model,
            config: config.clone(),
            source: None,
            tokens: Vec::new(),
            cache: None,
            logits: Vec::new(),
            compute,
            kv: ledger.reserve(0, "the decoder's KV cache")?,
            logits_bytes: ledger.reserve(0, "logits")?,
        })
    }

    /// The source tokens encoded last (empty before [`Session::encode`]).
    pub fn source(&self) -> &[Token] {
        self.source.as_ref().map_or(&[], |s| &s.tokens)
    }

    /// Bytes of the decoder's self-attention cache (0 without a with-past decoder).
    pub fn kv_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, DecoderCache::self_bytes)
    }

    /// Bytes of the cross-attention K/V kept for the source.
    pub fn cross_kv_bytes(&self) -> u64 {
        self.cache.as_ref().map_or(0, DecoderCache::cross_bytes)
    }

    fn scoped<R>(&self, f: impl FnOnce() -> R) -> R {
        multithread_tract_scope(self.executor.clone(), f)
    }

    /// Run the decoder over `tokens` after what is held; its outputs and the position of
    /// `logits` among them.
    fn run_decoder(&mut self, tokens: &[Token]) -> Result<(TVec<TValue>, usize)> {
        let model = self.model.clone();
        let source = self.source.as_ref().ok_or_else(|| {
            Error::invalid("decode before encode: an encoder-decoder session encodes its source first")
        })?;
        let (mask, hidden) = (source.mask.clone(), source.hidden.clone());
        match &model.with_past {
            Some(past_graph) if !self.tokens.is_empty() => {
                let cache = self
                    .cache
                    .as_mut()
                    .ok_or_else(|| Error::engine("a with-past session without a cache"))?;
                let past = cache.past()?;
                let outputs = multithread_tract_scope(self.executor.clone(), || {
                    past_graph.run_with_past(tokens, &mask, past)
                })?;
                cache.append(&outputs, &past_graph.present)?;
                Ok((outputs, past_graph.logits))
            }
            Some(_) => {
                let outputs = self.scoped(|| model.decoder.run_first(tokens, &mask, &hidden))?;
                self.cache =
                    Some(DecoderCache::from_first(&outputs, &model.decoder.present, self.config.kv)?);
                Ok((outputs, model.decoder.logits))
            }
            None => {
                let mut all = Vec::with_capacity(self.tokens.len() + tokens.len());
                all.extend_from_slice(&self.tokens);
                all.extend_from_slice(tokens);
                Ok((self.scoped(|| model.decoder.run_first(&all, &mask, &hidden))?, model.decoder.logits))
            }
        }
    }

    fn charge_cache(&mut self) -> Result<()> {
        let bytes = self.cache.as_ref().map_or(0, |c| c.self_bytes() + c.cross_bytes());
        self.kv.resize(bytes)
    }
}

impl Session for TractSession {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn encode(&mut self, tokens: &[Token]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::invalid("the source text is empty; it needs at least one token"));
        }
        if tokens.len() > self.config.n_ctx {
            return Err(Error::ContextOverflow {
                needed: tokens.len(),
                limit: self.config.n_ctx,
                prompt: tokens.len(),
            });
        }
        let mask = ones_mask(tokens.len());
        let model = self.model.clone();
        let hidden = self.scoped(|| model.encoder.run(tokens, &mask))?;
        self.tokens.clear();
        self.cache = None;
        self.charge_cache()?;
        self.source = Some(Source { tokens: tokens.to_vec(), mask, hidden });
        Ok(())
    }

    fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> Result<Logits<'_>> {
        let model = self.model.clone();
        let info = &model.info;
        if plan.count() != info.n_layers {
            return Err(Error::Unsupported(
                "the tract engine runs every layer; layer-skip plans are for ggml models".into(),
            ));
        }
        let held = self.tokens.len();
        pocket_core::check_decode(tokens, info.n_vocab, held, self.config.n_ctx)?;
        let n_rows = rows.count(tokens.len())?;
        let (outputs, logits_at) = self.run_decoder(tokens)?;
        if let Err(e) = self.charge_cache() {
            // Over the budget: leave the session as it was before this call.
            if let Some(c) = &mut self.cache {
                c.truncate(held);
            }
            self.charge_cache().ok();
            return Err(e);
        }
        let n_vocab = info.n_vocab;
        let logits = outputs.get(logits_at).ok_or_else(|| Error::engine("the decoder returned no logits"))?;
        let data = logits.try_as_plain_ram().and_then(|v| v.as_slice::<f32>()).map_err(Error::engine)?;
        let positions = data.len() / n_vocab;
        if positions < n_rows || data.len() % n_vocab != 0 {
            return Err(Error::engine(format!(
                "the decoder returned {} logits for a vocabulary of {n_vocab}",
                data.len()
            )));
        }
        self.logits_bytes.resize((n_rows * n_vocab * 4) as u64)?;
        self.logits.clear();
        self.logits.extend_from_slice(&data[(positions - n_rows) * n_vocab..]);
        self.tokens.extend_from_slice(tokens);
        Ok(Logits::new(&self.logits, n_vocab))
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.tokens.len() {
            return Err(Error::invalid(format!(
                "cannot truncate to {len} tokens: the session holds {}",
                self.tokens.len()
            )));
        }
        self.tokens.truncate(len);
        if let Some(c) = &mut self.cache {
            c.truncate(len);
        }
        self.charge_cache()
    }

    fn memory(&self) -> u64 {
        self.compute.bytes() + self.kv.bytes() + self.logits_bytes.bytes()
    }

    fn kv_bytes(&self) -> u64 {
        // The decoder's own cache, what grows with the tokens held; the cross-attention K/V
        // of the source is held beside it, and the footprint counts it with the compute.
        TractSession::kv_bytes(self)
    }

    /// The encoded source: the encoder's output for it, which a request with the same source
    /// takes instead of running the encoder again. (The decoder's cache is not kept: an
    /// answer's beginning is short, and each request starts it anew.)
    fn save(&self) -> Result<Option<SavedState>> {
        let Some(source) = &self.source else { return Ok(None) };
        let hidden =
            source.hidden.try_as_plain_ram().and_then(|v| v.as_slice::<f32>()).map_err(Error::engine)?;
        let data = hidden.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(Some(SavedState { tokens: source.tokens.clone(), kv: self.config.kv, data }))
    }

    fn restore(&mut self, saved: &SavedState, len: usize) -> Result<()> {
        if self.source.is_some() || !self.tokens.is_empty() {
            return Err(Error::invalid("only an empty session can be restored into"));
        }
        let n = saved.tokens.len();
        if len != n || n == 0 {
            return Err(Error::invalid(format!(
                "an encoder-decoder session takes a saved source whole ({n} tokens), not {len} of them"
            )));
        }
        if n > self.config.n_ctx {
            return Err(Error::ContextOverflow { needed: n, limit: self.config.n_ctx, prompt: n });
        }
        let floats: Vec<f32> =
            saved.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let width = floats.len() / n;
        if width == 0 || width * n * 4 != saved.data.len() {
            return Err(Error::invalid(format!(
                "a saved source of {} bytes is not {n} rows of f32",
                saved.data.len()
            )));
        }
        let hidden = tract_ndarray::Array3::from_shape_vec((1, n, width), floats)
            .map_err(|e| Error::invalid(format!("a saved source of the wrong shape: {e}")))?;
        self.cache = None;
        self.charge_cache()?;
        self.source = Some(Source {
            tokens: saved.tokens.clone(),
            mask: ones_mask(n),
            hidden: hidden.into_tensor().into(),
        });
        Ok(())
    }
}
