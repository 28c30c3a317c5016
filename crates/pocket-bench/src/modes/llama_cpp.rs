//! `llama.cpp`: the baseline, llama.cpp's own decoding through llama.h.

use std::time::Instant;

use pocket_core::stop::TextStream;
use std::sync::Arc;

use pocket_core::{Error as CoreError, argmax};
use pocket_runtime::LlamaCpp;
use pocket_runtime::rpc::{RemoteLayers, SplitOptions};
use pocket_runtime::{Engine, LoadedModel};

use super::{PromptRun, RunOutput, Runner, RunnerContext};
use crate::Error;

/// A greedy loop over [`LlamaCpp`]: decode the prompt, then one token at a time.
///
/// The loop is [`pocket_core::generate()`]'s, step for step: the same argmax, the same
/// per-token text assembly (piece lookup and [`TextStream`]), the same stop rules (end token
/// of our vocabulary, `max_tokens`, context full), and the same clock readings, so the two
/// modes differ only in the engine behind `decode`. (`LlamaCpp` is not `Send`, so it cannot
/// sit behind the `Session` trait and run `generate` itself.)
pub struct LlamaCppRunner {
    llama: LlamaCpp,
    /// For requests at once: a context of as many sequences, made when first needed (and
    /// again for another count).
    parallel: Option<(usize, LlamaCpp)>,
    /// Our engine's model, for its tokenizer: end tokens and pieces as in `vanilla`.
    model: Arc<LoadedModel>,
    n_ctx: usize,
    n_batch: usize,
    threads: usize,
    kv: pocket_core::KvType,
    kv_bytes_per_token: u64,
    /// The peers and layers our engine's model put on them, given to llama.cpp too.
    split: Option<SplitOptions>,
}

/// llama.cpp split as our engine's `model` is: its peers, as many last layers on them.
fn same_split(model: &LoadedModel) -> Option<SplitOptions> {
    let placement = &model.model().info().placement;
    let mut peers: Vec<String> = Vec::new();
    for run in placement {
        if let Some(peer) = &run.peer
            && !peers.contains(peer)
        {
            peers.push(peer.clone());
        }
    }
    let remote: usize = placement.iter().filter(|r| r.peer.is_some()).map(|r| r.n_layers).sum();
    (!peers.is_empty()).then_some(SplitOptions { peers, layers: RemoteLayers::Last(remote) })
}

impl LlamaCppRunner {
    /// Load the model file into llama.cpp with the same threads, context, batch and KV type
    /// as our engine, on the GPU when ours runs on one.
    pub fn load(cx: RunnerContext<'_>) -> Result<Self, Error> {
        let s = cx.session;
        if cx.model.engine() == Engine::Tract {
            return Err(Error::Invalid(format!(
                "llama.cpp runs GGUF files; {} is an encoder-decoder ONNX model (run vanilla, suffix, inputcopy or \
                 auto on it)",
                cx.model_name
            )));
        }
        let split = same_split(cx.model);
        let llama = match &split {
            Some(split) => LlamaCpp::load_split(
                cx.model.path(),
                s.threads.max(),
                s.n_ctx,
                s.n_batch,
                s.kv,
                true,
                1,
                split,
            ),
            None => LlamaCpp::load(
                cx.model.path(),
                s.threads.max(),
                s.n_ctx,
                s.n_batch,
                s.kv,
                cx.model.on_gpu(),
                true,
            ),
        }
        .map_err(pocket_runtime::Error::from)?;
        Ok(LlamaCppRunner {
            split,
            llama,
            parallel: None,
            kv_bytes_per_token: cx.model.kv_bytes_per_token(s)?,
            model: cx.model.clone(),
            n_ctx: s.n_ctx,
            n_batch: s.n_batch,
            threads: s.threads.max(),
            kv: s.kv,
        })
    }
}

impl Runner for LlamaCppRunner {
    fn name(&self) -> &str {
        "llama.cpp"
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    fn run(&mut self, prompt: &PromptRun<'_>) -> Result<RunOutput, Error> {
        let (prompt, max_tokens) = (prompt.tokens, prompt.max_tokens);
        if prompt.is_empty() {
            return Err(CoreError::invalid("the prompt is empty; it needs at least one token").into());
        }
        if prompt.len() + 1 > self.n_ctx {
            return Err(CoreError::ContextOverflow {
                needed: prompt.len() + 1,
                limit: self.n_ctx,
                prompt: prompt.len(),
            }
            .into());
        }
        self.llama.clear();
        let tokenizer = self.model.model().tokenizer();
        let mut stream = TextStream::new(&[]);
        let mut text = String::new();
        let mut tokens = Vec::with_capacity(max_tokens.min(self.n_ctx - prompt.len() + 1));

        let start = Instant::now();
        let mut next = argmax(self.llama.decode(prompt, false).map_err(pocket_runtime::Error::from)?);
        let first_at = Instant::now();
        let mut sampled_at = first_at;
        let mut last_at = first_at;
        while max_tokens > 0 && !tokenizer.is_end(next) {
            last_at = sampled_at;
            tokens.push(next);
            text.push_str(stream.push(&tokenizer.piece(next)).text);
            // The llama.cpp context holds the prompt and every token but `next`.
            if tokens.len() >= max_tokens || prompt.len() + tokens.len() > self.n_ctx {
                break;
            }
            next = argmax(self.llama.decode(&[next], false).map_err(pocket_runtime::Error::from)?);
            sampled_at = Instant::now();
        }
        text.push_str(stream.finish().text);
        Ok(RunOutput {
            tokens,
            prefill_seconds: first_at.duration_since(start).as_secs_f64(),
            decode_seconds: last_at.duration_since(first_at).as_secs_f64(),
            // Its KV cache was allocated (and cleared, so resident) for the whole context when
            // the context was made; the run's own growth is added by the benchmark.
            generation_memory_bytes: self.n_ctx as u64 * self.kv_bytes_per_token,
            ..RunOutput::default()
        })
    }

    /// Every prompt in a sequence of its own in one llama.cpp context, their next tokens
    /// decoded together step by step: what llama.cpp's server does with `-np N` slots.
    fn run_concurrent(&mut self, prompts: &[PromptRun<'_>]) -> Result<Vec<RunOutput>, Error> {
        let n = prompts.len();
        if self.parallel.as_ref().is_none_or(|(k, _)| *k != n) {
            self.parallel = None; // one such context at a time
            let llama = match &self.split {
                Some(split) => LlamaCpp::load_split(
                    self.model.path(),
                    self.threads,
                    self.n_ctx,
                    self.n_batch,
                    self.kv,
                    true,
                    n,
                    split,
                ),
                None => LlamaCpp::load_parallel(
                    self.model.path(),
                    self.threads,
                    self.n_ctx,
                    self.n_batch,
                    self.kv,
                    self.model.on_gpu(),
                    true,
                    n,
                ),
            }
            .map_err(pocket_runtime::Error::from)?;
            self.parallel = Some((n, llama));
        }
        let (_, llama) = self.parallel.as_mut().expect("made just above");
        let tokenizer = self.model.model().tokenizer();
        let tokens: Vec<&[pocket_core::Token]> = prompts.iter().map(|p| p.tokens).collect();
        let max_tokens: Vec<usize> = prompts.iter().map(|p| p.max_tokens).collect();
        let together = llama
            .generate_together(&tokens, &max_tokens, self.n_ctx, &|t| tokenizer.is_end(t))
            .map_err(pocket_runtime::Error::from)?;
        Ok(together
            .into_iter()
            .map(|t| RunOutput {
                prefill_seconds: t.first_at.as_secs_f64(),
                decode_seconds: t.last_at.saturating_sub(t.first_at).as_secs_f64(),
                tokens: t.tokens,
                generation_memory_bytes: self.n_ctx as u64 * self.kv_bytes_per_token,
                ..RunOutput::default()
            })
            .collect())
    }
}
