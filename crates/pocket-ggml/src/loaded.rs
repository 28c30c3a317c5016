//! A loaded model as its sessions hold it ([`Inner`]): its [`Parts`] and the passes its
//! sessions share.

use std::ops::Deref;
use std::sync::atomic::AtomicUsize;

use crate::batch::Batcher;
use crate::ffi::sched::CompiledModelsKept;
use crate::parts::Parts;

/// The parts of a model that sessions share, and their shared passes.
pub(crate) struct Inner {
    // Field order is drop order: shared passes' graphs read the weights, so they go first.
    /// The passes its sessions share; `None` where a row of a shared pass would not be
    /// exactly what that row's pass alone computes (see `model::shares_passes`).
    pub(crate) batch: Option<Batcher>,
    /// On an OpenVINO device, what keeps the models the backend compiled for the sessions'
    /// passes for later sessions (set after the probe at load, whose shapes are not kept).
    /// Those models hold the weights' memory: they go before it.
    pub(crate) compiled: Option<CompiledModelsKept>,
    pub(crate) parts: Parts,
    /// Rows a decode step is computed as: 1, or on a device where that makes single steps
    /// round as the rows of wider passes do, more (the token repeated; see `exact`). Set by
    /// the probe at load, before any session but the probe's exists.
    pub(crate) step_rows: AtomicUsize,
}

impl Deref for Inner {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}
