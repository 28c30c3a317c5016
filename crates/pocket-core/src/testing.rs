//! A fake [`Session`] for the unit tests of the generation loop and the cost curve.

use crate::{LayerPlan, Logits, Result, Rows, Session, SessionConfig, Token};

/// Vocabulary size of [`FakeSession`].
pub(crate) const V: usize = 8;

/// One `decode` call: the position it started at, its tokens, the rows asked for, and
/// whether the plan was the full model.
pub(crate) type Call = (usize, Vec<Token>, Rows, bool);

/// A model whose argmax after token t is (t + 1) % V, with `bias` added to some logits;
/// records every decode.
pub(crate) struct FakeSession {
    pub(crate) config: SessionConfig,
    pub(crate) tokens: Vec<Token>,
    logits: Vec<f32>,
    pub(crate) bias: Vec<(Token, f32)>,
    pub(crate) calls: Vec<Call>,
}

impl FakeSession {
    pub(crate) fn new(n_ctx: usize) -> Self {
        FakeSession {
            config: SessionConfig { n_ctx, ..SessionConfig::default() },
            tokens: Vec::new(),
            logits: vec![0.0; V],
            bias: Vec::new(),
            calls: Vec::new(),
        }
    }
}

impl Session for FakeSession {
    fn len(&self) -> usize {
        self.tokens.len()
    }

    fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    fn config(&self) -> &SessionConfig {
        &self.config
    }

    fn decode(&mut self, tokens: &[Token], plan: &LayerPlan, rows: Rows) -> Result<Logits<'_>> {
        assert!(self.tokens.len() + tokens.len() <= self.config.n_ctx, "context overrun");
        self.calls.push((self.tokens.len(), tokens.to_vec(), rows, plan.is_full()));
        self.tokens.extend_from_slice(tokens);
        let n = rows.count(tokens.len())?;
        self.logits.clear();
        self.logits.resize(n * V, 0.0);
        for (row, &t) in self.logits.chunks_mut(V).zip(&tokens[tokens.len() - n..]) {
            row[(t as usize + 1) % V] = 1.0;
            for &(t, b) in &self.bias {
                row[t as usize] += b;
            }
        }
        Ok(Logits::new(&self.logits, V))
    }

    fn truncate(&mut self, len: usize) -> Result<()> {
        self.tokens.truncate(len);
        Ok(())
    }

    fn memory(&self) -> u64 {
        0
    }

    fn kv_bytes(&self) -> u64 {
        0
    }
}
