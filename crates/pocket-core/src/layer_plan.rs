//! Which layers a forward pass runs.

use std::fmt;
use std::ops::Range;

use crate::{Error, Result};

/// The largest number of layers a [`LayerPlan`] can describe.
pub const MAX_LAYERS: usize = 256;

const WORDS: usize = MAX_LAYERS / 64;

/// The set of layers one forward pass runs: all of them to verify, a subset to self-draft.
///
/// A skipped layer passes the residual stream through unchanged and writes no KV for the
/// positions it skips. A fixed-size bitset, so building and copying a plan never allocates.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerPlan {
    bits: [u64; WORDS],
    n_layers: u16,
}

impl LayerPlan {
    /// Every layer of an `n_layers` model.
    pub fn full(n_layers: usize) -> Result<Self> {
        if n_layers == 0 || n_layers > MAX_LAYERS {
            return Err(Error::LayerPlan(format!(
                "a model must have 1..={MAX_LAYERS} layers, not {n_layers}"
            )));
        }
        let mut bits = [0u64; WORDS];
        for i in 0..n_layers {
            bits[i / 64] |= 1 << (i % 64);
        }
        Ok(LayerPlan { bits, n_layers: n_layers as u16 })
    }

    /// This plan with `layers` skipped.
    pub fn without(mut self, layers: Range<usize>) -> Result<Self> {
        if layers.end > self.n_layers() {
            return Err(Error::LayerPlan(format!(
                "cannot skip layers {layers:?} of a {}-layer model",
                self.n_layers
            )));
        }
        for i in layers {
            self.bits[i / 64] &= !(1 << (i % 64));
        }
        Ok(self)
    }

    /// A plan from the indices of the layers to skip.
    pub fn skipping(n_layers: usize, skip: impl IntoIterator<Item = usize>) -> Result<Self> {
        let mut plan = Self::full(n_layers)?;
        for i in skip {
            plan = plan.without(i..i + 1)?;
        }
        Ok(plan)
    }

    /// Number of layers of the model this plan is for.
    pub fn n_layers(&self) -> usize {
        self.n_layers as usize
    }

    /// Whether layer `i` runs.
    pub fn runs(&self, i: usize) -> bool {
        i < self.n_layers() && self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Number of layers that run.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether every layer runs (a verification pass).
    pub fn is_full(&self) -> bool {
        self.count() == self.n_layers()
    }

    /// The layers that run, in order.
    pub fn layers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n_layers()).filter(|&i| self.runs(i))
    }

    /// Check that this plan was made for a model with `n_layers` layers.
    pub fn check(&self, n_layers: usize) -> Result<()> {
        if self.n_layers() != n_layers {
            return Err(Error::LayerPlan(format!(
                "plan is for {} layers, the model has {n_layers}",
                self.n_layers
            )));
        }
        if self.count() == 0 {
            return Err(Error::LayerPlan("a plan must run at least one layer".into()));
        }
        Ok(())
    }
}

impl fmt::Debug for LayerPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skipped: Vec<usize> = (0..self.n_layers()).filter(|&i| !self.runs(i)).collect();
        write!(f, "LayerPlan({}/{} layers, skip {skipped:?})", self.count(), self.n_layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_plan_runs_every_layer() {
        let p = LayerPlan::full(30).unwrap();
        assert!(p.is_full());
        assert_eq!(p.count(), 30);
        assert!(!p.runs(30));
        assert_eq!(p.layers().count(), 30);
    }

    #[test]
    fn skipping_layers_across_words() {
        let p = LayerPlan::skipping(200, [0, 63, 64, 199]).unwrap();
        assert_eq!(p.count(), 196);
        assert!(!p.runs(63) && !p.runs(64) && p.runs(65));
        assert!(!p.is_full());
    }

    #[test]
    fn plans_out_of_range_are_errors() {
        assert!(LayerPlan::full(0).is_err());
        assert!(LayerPlan::full(MAX_LAYERS + 1).is_err());
        assert!(LayerPlan::full(4).unwrap().without(2..5).is_err());
        let empty = LayerPlan::full(2).unwrap().without(0..2).unwrap();
        assert!(empty.check(2).is_err());
        assert!(LayerPlan::full(3).unwrap().check(4).is_err());
    }
}
