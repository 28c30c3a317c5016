//! Embedding requests: texts (or token ids) in, one vector each out, through the model's
//! [`Embedder`](pocket_core::Embedder) — what `/v1/embeddings`, D-Bus `Embed` and
//! `pocket embed` all call.

use pocket_core::{Threads, Token};

use crate::{Error, LoadedModel, Result};

/// What to embed.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    /// Texts, tokenized by the model's own tokenizer (special tokens added).
    Texts(Vec<String>),
    /// Token ids, read as they are.
    Tokens(Vec<Vec<Token>>),
}

impl EmbedInput {
    /// How many inputs.
    pub fn len(&self) -> usize {
        match self {
            EmbedInput::Texts(t) => t.len(),
            EmbedInput::Tokens(t) => t.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The vectors, in the order of the inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One per input.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the model read, over all inputs (after truncation).
    pub prompt_tokens: usize,
    /// How many inputs were truncated.
    pub truncated: usize,
    /// The most tokens the model reads of one input.
    pub max_tokens: usize,
}

/// The most inputs of one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Embed `input` on `model`, on up to `threads`. An input longer than the model reads is
/// refused (param `input`) unless `truncate`, when it is cut as the model's tokenizer cuts;
/// `dimensions`, where given, must be the size of the model's vectors (param `dimensions`).
pub fn embed(
    model: &LoadedModel,
    input: &EmbedInput,
    truncate: bool,
    dimensions: Option<usize>,
    threads: Threads,
) -> Result<Embedded> {
    let Some(embedder) = model.model().embedder() else {
        return Err(Error::invalid(
            "model",
            "this model generates text; embeddings come from an embedding model (all-minilm-l6-v2: `pocket pull \
             all-minilm-l6-v2`)",
        ));
    };
    let made = embedder.embedder_info().dimensions;
    if let Some(d) = dimensions.filter(|&d| d != made) {
        // A model trained to be cut (Matryoshka) could give fewer; this one was not.
        return Err(Error::invalid(
            "dimensions",
            format!(
                "the model makes vectors of {made} values and cannot shorten them; dimensions {d} is not one it allows"
            ),
        ));
    }
    if input.is_empty() {
        return Err(Error::invalid("input", "input is empty: send a text, a list of texts, or token ids"));
    }
    if input.len() > MAX_INPUTS {
        return Err(Error::invalid(
            "input",
            format!("{} inputs in one request; at most {MAX_INPUTS}", input.len()),
        ));
    }
    let max = embedder.embedder_info().max_tokens;
    let tokens: Vec<Vec<Token>> = match input {
        EmbedInput::Texts(texts) => {
            texts.iter().map(|t| embedder.tokenize(t).map_err(Error::from)).collect::<Result<_>>()?
        }
        EmbedInput::Tokens(t) => t.clone(),
    };
    let mut truncated = 0;
    let mut inputs = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.into_iter().enumerate() {
        if t.is_empty() {
            return Err(Error::invalid("input", format!("input {i} has no tokens")));
        }
        if t.len() > max {
            if !truncate {
                return Err(Error::invalid(
                    "input",
                    format!(
                        "input {i} is {} tokens, more than the model reads ({max}); shorten it, or send \
                         \"truncate\": true to embed its first {max} tokens",
                        t.len(),
                    ),
                ));
            }
            truncated += 1;
            inputs.push(embedder.truncate(&t));
        } else {
            inputs.push(t);
        }
    }
    let prompt_tokens = inputs.iter().map(Vec::len).sum();
    let vectors = embedder.embed(&inputs, threads)?;
    Ok(Embedded { vectors, prompt_tokens, truncated, max_tokens: max })
}
