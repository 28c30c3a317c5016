//! A loaded model as its sessions hold it ([`Inner`]): its [`Parts`] and the passes its
//! sessions share.

use std::ops::Deref;

use crate::batch::Batcher;
use crate::parts::Parts;

/// The parts of a model that sessions share, and their shared passes.
pub(crate) struct Inner {
    // Field order is drop order: shared passes' graphs read the weights, so they go first.
    /// The passes its sessions share; `None` where a row of a shared pass would not be
    /// exactly what that row's pass alone computes (see `model::shares_passes`).
    pub(crate) batch: Option<Batcher>,
    pub(crate) parts: Parts,
}

impl Deref for Inner {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}
