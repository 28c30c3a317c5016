//! Embedding models: a text in, one vector out (sentence encoders such as all-MiniLM-L6-v2).
//!
//! An embedding model is also a [`Model`](crate::Model) — it loads, is paid for and is
//! unloaded as every other — but it makes no sessions; what it does is asked of it through
//! [`Model::embedder`](crate::Model::embedder).

use crate::{Result, Threads, Token};

/// What an embedding model makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedderInfo {
    /// Values per vector.
    pub dimensions: usize,
    /// The most tokens of one input (special tokens included) the model reads: longer inputs
    /// are refused, or truncated when asked, as the reference implementation truncates them.
    pub max_tokens: usize,
    /// How the token vectors become one (`mean`, `cls`, `last`).
    pub pooling: &'static str,
    /// Whether vectors come out with unit length.
    pub normalized: bool,
}

/// A model that embeds texts.
pub trait Embedder: Send + Sync {
    /// What it makes.
    fn embedder_info(&self) -> &EmbedderInfo;

    /// The tokens the model reads for `text`, special tokens included, as its own tokenizer
    /// makes them; never truncated.
    fn tokenize(&self, text: &str) -> Result<Vec<Token>>;

    /// `tokens` cut to [`EmbedderInfo::max_tokens`] the way the model's tokenizer truncates
    /// (the closing special token kept).
    fn truncate(&self, tokens: &[Token]) -> Vec<Token>;

    /// One vector per input (each at most `max_tokens` tokens), pooled and normalized as the
    /// model says, computed in as few passes as its buffers allow, on up to `threads`.
    fn embed(&self, inputs: &[Vec<Token>], threads: Threads) -> Result<Vec<Vec<f32>>>;
}

/// `v` scaled to unit length (left as it is when all zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_vectors_have_unit_length_and_zero_stays_zero() {
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = [0.0f32; 3];
        normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
