//! Constrained decoding: which tokens may come next.
//!
//! A [`Constraint`] follows the generated tokens through a grammar (a JSON schema, a tool
//! call's shape, a Lark grammar) and, at each step, masks the logits of every token the
//! grammar does not allow, so that such a token is never sampled. The generation loop
//! ([`crate::generate`]) asks it for two more things that make it work with speculation:
//! how much of a draft the grammar allows (the rest is cut before verification), and which
//! tokens the grammar forces (drafted at no drafter time). When the grammar is complete its
//! mask allows only end tokens.
//!
//! The state only ever moves forward: the loop advances it with tokens it has accepted, never
//! with drafted tokens that might be rejected, so no rollback is needed.

use std::time::Instant;

use crate::spec::Draft;
use crate::{Result, Token};

/// A grammar over the tokens a session generates.
///
/// Implementations live above the core (the runtime compiles JSON schemas and grammars with
/// llguidance); the core's loop only calls these methods.
pub trait Constraint: Send {
    /// Set the logit of every token the grammar does not allow next to negative infinity.
    ///
    /// End tokens are allowed exactly when the grammar may end here. When the grammar allows
    /// nothing more, only end tokens are allowed, so generation ends.
    fn mask(&mut self, logits: &mut [f32]) -> Result<()>;

    /// Take `token` (one [`Constraint::mask`] allowed, never an end token) as generated.
    fn advance(&mut self, token: Token) -> Result<()>;

    /// How many of `tokens`, from the first, the grammar allows in order from here. Does not
    /// change the state.
    fn allowed_prefix(&mut self, tokens: &[Token]) -> Result<usize>;

    /// The tokens the grammar forces from here (its only way on: a key, punctuation, a fixed
    /// string), at most `max` (no more than a draft holds), appended to `out`. Does not change
    /// the state.
    fn forced(&mut self, max: usize, out: &mut Draft) -> Result<()>;

    /// Count `token`, generated outside what the grammar holds (a model's thinking before the
    /// answer the grammar is for): it is not taken, but it used one of the tokens
    /// `max_tokens` allows, which a grammar that closes its answer in time must know.
    fn passed(&mut self, _token: Token) {}
}

/// Applies an optional [`Constraint`] to rows of logits before they are sampled: the rows
/// themselves belong to the session and are only read, so a masked row is a copy.
pub struct Masker<'c> {
    constraint: Option<&'c mut dyn Constraint>,
    scratch: Vec<f32>,
    seconds: f64,
}

impl<'c> Masker<'c> {
    /// A masker for `constraint`; `None` passes rows through untouched.
    pub fn new(constraint: Option<&'c mut dyn Constraint>) -> Self {
        Masker { constraint, scratch: Vec::new(), seconds: 0.0 }
    }

    /// A masker that changes nothing.
    pub fn none() -> Self {
        Masker::new(None)
    }

    /// Whether there is a constraint to apply.
    pub fn is_some(&self) -> bool {
        self.constraint.is_some()
    }

    /// Seconds spent in the constraint so far.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// `row` as the sampler must see it: with the tokens the constraint forbids at -inf.
    pub fn row<'a>(&'a mut self, row: &'a [f32]) -> Result<&'a [f32]> {
        match self.constraint.as_deref_mut() {
            None => Ok(row),
            Some(c) => {
                let start = Instant::now();
                self.scratch.clear();
                self.scratch.extend_from_slice(row);
                let masked = c.mask(&mut self.scratch);
                self.seconds += start.elapsed().as_secs_f64();
                masked.map(|()| &self.scratch[..])
            }
        }
    }

    /// Move the constraint past `token`, a generated token that is not an end token.
    pub fn advance(&mut self, token: Token) -> Result<()> {
        self.timed(|c| c.advance(token), ())
    }

    /// How many of `tokens` the constraint allows from here (all of them without one).
    pub fn allowed_prefix(&mut self, tokens: &[Token]) -> Result<usize> {
        self.timed(|c| c.allowed_prefix(tokens), tokens.len())
    }

    /// The tokens the constraint forces from here, at most `max` (none without one).
    pub fn forced(&mut self, max: usize, out: &mut Draft) -> Result<()> {
        if max == 0 {
            return Ok(());
        }
        self.timed(|c| c.forced(max, out), ())
    }

    /// `f` of the constraint, timed; `without` when there is none.
    fn timed<T>(&mut self, f: impl FnOnce(&mut dyn Constraint) -> Result<T>, without: T) -> Result<T> {
        let Some(c) = self.constraint.as_deref_mut() else {
            return Ok(without);
        };
        let start = Instant::now();
        let result = f(c);
        self.seconds += start.elapsed().as_secs_f64();
        result
    }
}
