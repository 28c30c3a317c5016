//! Compute machinery: a scheduler (backends, thread pools, compute buffers), the memory graphs
//! are built in, and the last graph built, reused while passes keep its shape. A session has
//! one for its own passes; a model has one for the passes its sessions share (`batch`).

use pocket_core::memory::{Ledger, Place, Reservation};
use pocket_core::{LayerPlan, Threads};

use crate::ffi::graph::Ctx;
use crate::ffi::sched::{BufferBytes, Scheduler};
use crate::graph::{self, PassShape, Segment};
use crate::parts::Parts;
use crate::{Error, Result};

pub(crate) struct Compute {
    sched: Scheduler,
    /// Nodes a graph here may hold (it carries at most `segments` segments).
    nodes: usize,
    /// Memory for the next graph's context, handed back by the last one dropped.
    graph_mem: Vec<u8>,
    /// Bytes of the compute buffers, as reserved.
    compute_bytes: BufferBytes,
    /// The compute buffers' bytes in the memory ledger, on the device and in host memory
    /// (none: only measured).
    reservation: Option<[Reservation; 2]>,
    /// The last graph, built and allocated: consecutive passes of one shape and plan (decode
    /// steps) reuse it, skipping graph construction and scheduling.
    cached: Option<CachedGraph>,
    /// The most rows and cache positions of one segment that the buffers were measured for: a
    /// graph past either (a device's cache grows by reallocation) is measured again.
    measured: (usize, usize),
}

/// A graph and what its structure depends on: the plan, and each segment's cache (by id) and
/// shape.
struct CachedGraph {
    plan: LayerPlan,
    segments: Vec<(u64, PassShape)>,
    graph: graph::Graph,
    /// The splits the scheduler cut it into.
    splits: usize,
}

impl CachedGraph {
    fn matches(&self, plan: &LayerPlan, segments: &[Segment<'_>]) -> bool {
        self.plan == *plan
            && self.segments.len() == segments.len()
            && self.segments.iter().zip(segments).all(|(&(id, shape), s)| id == s.kv.id && shape == s.shape)
    }
}

impl Drop for Compute {
    fn drop(&mut self) {
        // The cached graph's tensors live in the scheduler's buffers: it goes first.
        self.drop_cached();
    }
}

impl Compute {
    /// Compute machinery for `model` on `threads`, for passes of up to `segments` segments,
    /// its buffers reserved in `ledger` (as `what`) and then allocated for the largest pass,
    /// `worst`, so that no later pass allocates; with no ledger, only measured
    /// ([`Compute::bytes`]), for predicting a footprint without allocating it.
    pub(crate) fn new(
        model: &Parts,
        threads: Threads,
        segments: usize,
        worst: &[Segment<'_>],
        ledger: Option<&Ledger>,
        what: &str,
    ) -> Result<Compute> {
        let nodes = graph::graph_nodes(&model.hp, segments);
        let sched = Scheduler::new(&model.device, threads, nodes)?;
        let mut compute = Compute {
            sched,
            nodes,
            graph_mem: vec![0; Ctx::memory_for(nodes)],
            compute_bytes: BufferBytes::default(),
            reservation: None,
            cached: None,
            measured: extent((0, 0), worst),
        };
        let plan = LayerPlan::full(model.hp.n_layer).map_err(|e| Error::Ggml(e.to_string()))?;
        let g = compute.build(model, &plan, worst)?;
        // Measure the buffers first and pay for them in the ledger, then allocate them.
        let measured = compute.sched.measure(&g.ctx);
        compute.graph_mem = g.ctx.into_memory();
        let Some(ledger) = ledger else {
            compute.compute_bytes = measured;
            return Ok(compute);
        };
        let reservation = ledger
            .reserve_in(Place::Device, measured.device as u64, what)
            .and_then(|d| Ok([d, ledger.reserve(measured.host as u64, what)?]));
        // A graph the scheduler has split once is not split again (see `graph`): the same
        // graph, built anew.
        let g = compute.build(model, &plan, worst)?;
        let reserved = reservation.is_ok() && compute.sched.reserve(&g.ctx);
        compute.graph_mem = g.ctx.into_memory();
        compute.reservation = Some(reservation?);
        if !reserved {
            return Err(Error::Ggml("cannot reserve the compute buffer".into()));
        }
        compute.compute_bytes = compute.sched.buffer_bytes();
        Ok(compute)
    }

    /// Bytes of the compute buffers.
    pub(crate) fn bytes(&self) -> usize {
        self.compute_bytes.total()
    }

    /// Build the graph of a pass over `segments` in the graph memory (which must not hold a
    /// live graph).
    fn build(&mut self, model: &Parts, plan: &LayerPlan, segments: &[Segment<'_>]) -> Result<graph::Graph> {
        debug_assert!(self.cached.is_none());
        let ctx = Ctx::new(std::mem::take(&mut self.graph_mem), self.nodes)?;
        Ok(graph::build(ctx, (&model.hp, crate::arch::layer(model.hp.arch)), &model.weights, plan, segments))
    }

    /// The graph of a pass over `segments` with `plan`, allocated and ready for its inputs
    /// (the cached one if it matches, else a new one), and the scheduler that computes it.
    ///
    /// A graph of another structure than the one the buffers were reserved for (several
    /// segments) may need more: the buffers grow, and their reservation with them, or the
    /// pass fails with [`pocket_core::Error::OverBudget`].
    pub(crate) fn graph(
        &mut self,
        model: &Parts,
        plan: &LayerPlan,
        segments: &[Segment<'_>],
    ) -> Result<(&graph::Graph, &Scheduler)> {
        let hit = self.cached.as_ref().is_some_and(|c| c.matches(plan, segments));
        if !hit {
            self.drop_cached();
            let mut graph = self.build(model, plan, segments)?;
            // One segment's graph fits what was reserved for the largest it was measured for;
            // several may not, nor one past it.
            let (rows, n_kv) = self.measured;
            let past = segments.iter().any(|s| s.shape.n_tokens > rows || s.shape.n_kv > n_kv);
            let grown = if segments.len() > 1 || past {
                let grown = self.sched.measure(&graph.ctx);
                // ggml's scheduler rewrites the graph it splits (an op's input from another
                // backend becomes a copy made in the scheduler's own context, freed by the next
                // split): split again, such a graph has no inputs to copy across and reads
                // freed tensors. The graph measured is dropped and built anew for computing.
                // (Seen as a peer's KV write out of range after a split model's cache grew.)
                self.graph_mem = graph.ctx.into_memory();
                graph = self.build(model, plan, segments)?;
                grown
            } else {
                BufferBytes::default()
            };
            if past {
                self.measured = extent(self.measured, segments);
            }
            if grown.exceeds(self.compute_bytes)
                && let Some([device, host]) = &mut self.reservation
            {
                let (was, to) = (self.compute_bytes, grown.max(self.compute_bytes));
                let resized = device.resize(to.device as u64).and_then(|()| host.resize(to.host as u64));
                if let Err(e) = resized {
                    // Shrinking cannot fail: both back to what the buffers are.
                    let _ = device.resize(was.device as u64);
                    self.graph_mem = graph.ctx.into_memory();
                    return Err(e.into());
                }
            }
            if !self.sched.alloc(&graph.ctx) {
                self.graph_mem = graph.ctx.into_memory();
                return Err(Error::Ggml("cannot allocate the graph".into()));
            }
            self.compute_bytes = self.sched.buffer_bytes().max(self.compute_bytes);
            let splits = self.sched.splits();
            if tracing::enabled!(tracing::Level::DEBUG) {
                let off: Vec<String> =
                    self.sched.off_device(&graph.ctx).iter().map(|(op, n)| format!("{op}×{n}")).collect();
                let rows: usize = segments.iter().map(|s| s.shape.n_tokens).sum();
                tracing::debug!(rows, splits, on_the_cpu = %off.join(" "), device = %model.device.name,
                    "a new graph");
            }
            let segments = segments.iter().map(|s| (s.kv.id, s.shape)).collect();
            self.cached = Some(CachedGraph { plan: *plan, segments, graph, splits });
        }
        Ok((&self.cached.as_ref().expect("cached just above").graph, &self.sched))
    }

    /// Splits of the graph [`Compute::graph`] gave last.
    pub(crate) fn splits(&self) -> usize {
        self.cached.as_ref().map_or(0, |c| c.splits)
    }

    /// Forget the cached graph if it reads the cache `id` (whose session is going away).
    pub(crate) fn forget(&mut self, id: u64) {
        if self.cached.as_ref().is_some_and(|c| c.segments.iter().any(|&(s, _)| s == id)) {
            self.drop_cached();
        }
    }

    fn drop_cached(&mut self) {
        if let Some(c) = self.cached.take() {
            self.graph_mem = c.graph.ctx.into_memory();
        }
    }
}

/// `(rows, n_kv)` grown to the most rows and cache positions of any of `segments`.
fn extent((rows, n_kv): (usize, usize), segments: &[Segment<'_>]) -> (usize, usize) {
    segments.iter().fold((rows, n_kv), |(r, k), s| (r.max(s.shape.n_tokens), k.max(s.shape.n_kv)))
}
