//! A session's compute machinery as a safe handle: its backends (the device's and the CPU's),
//! the thread pools the CPU backend runs on, and ggml's scheduler, which splits a graph between
//! the backends and allocates its compute buffers.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;
use pocket_core::Threads;
use pocket_core::cpu::governor;
use pocket_core::memory::{Ledger, Place, Reservation};

use crate::error::{Error, Result};
use crate::ffi::device::{Device, buft_is_host};
use crate::ffi::graph::Ctx;
use crate::ffi::pools::Pools;

/// Bytes of compute buffers, in the device's own memory and in host memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BufferBytes {
    pub(crate) device: usize,
    pub(crate) host: usize,
}

impl BufferBytes {
    pub(crate) fn total(self) -> usize {
        self.device + self.host
    }

    /// The larger of each.
    pub(crate) fn max(self, other: BufferBytes) -> BufferBytes {
        BufferBytes { device: self.device.max(other.device), host: self.host.max(other.host) }
    }

    /// Whether either is larger than in `other`.
    pub(crate) fn exceeds(self, other: BufferBytes) -> bool {
        self.device > other.device || self.host > other.host
    }
}

/// Backends, thread pools and scheduler of one session. Not shared: ggml's CPU backend keeps
/// per-computation state, so two sessions computing at once need one each.
pub(crate) struct Scheduler {
    sched: NonNull<sys::ggml_backend_sched>,
    /// Peers' backends first (a split model's), then the device's (if it is not the CPU),
    /// the CPU's last.
    backends: Vec<NonNull<sys::ggml_backend>>,
    /// How many of `backends` are peers': their compute buffers are in the peers' memory.
    remote: usize,
    /// The threads each pass asks the governor for.
    threads: Threads,
    /// A pool per thread count passes have run on (dropped after the backends: Drop frees
    /// those first), and the count of the one the CPU backend uses now.
    pools: RefCell<Pools>,
    attached: Cell<usize>,
}

// SAFETY: the scheduler, backends and thread pools belong to this value alone and are used by
// one thread at a time (`&mut` or owned by a session that is); ggml's pool threads do not care
// which thread submits a graph.
unsafe impl Send for Scheduler {}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: all created in `new`, freed once: the scheduler before the backends it uses;
        // the pools they run on go after them (a field, dropped after this).
        unsafe {
            sys::ggml_backend_sched_free(self.sched.as_ptr());
            for b in &self.backends {
                sys::ggml_backend_free(b.as_ptr());
            }
        }
    }
}

/// A backend made from a registry device, freed unless handed on.
struct Backend(NonNull<sys::ggml_backend>);

impl Backend {
    fn init(dev: sys::ggml_backend_dev_t, what: &str) -> Result<Backend> {
        // SAFETY: a registry device; the backend is owned by the returned value.
        let b = unsafe { sys::ggml_backend_dev_init(dev, std::ptr::null()) };
        NonNull::new(b).map(Backend).ok_or_else(|| Error::Ggml(format!("cannot start {what}")))
    }

    fn into_raw(self) -> NonNull<sys::ggml_backend> {
        let b = self.0;
        std::mem::forget(self);
        b
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created in `init` and not handed on (into_raw forgets it).
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// A backend of an OpenVINO device that computes nothing, held for as long as a model is
/// loaded, and what the models compiled for it cost in the memory budget. ggml-openvino keeps
/// the models it compiled (one per pass shape, seconds each, each with its own copy of the
/// weights) in one cache for the whole process while any backend of it lives, and frees them
/// all when the last goes: with sessions' backends the only ones, every request that found no
/// other session alive compiled its shapes again.
pub(crate) struct CompiledModelsKept {
    /// The compiled models' bytes in the budget, from [`CompiledModelsKept::charge`].
    charge: Option<Reservation>,
    _backend: Backend,
}

// SAFETY: the backend is never used, only freed (Drop), by whichever thread drops the model.
unsafe impl Send for CompiledModelsKept {}
// SAFETY: as above: no method reads or writes it.
unsafe impl Sync for CompiledModelsKept {}

/// The keepers alive, and the charges of those gone whose compiled models ggml-openvino still
/// keeps (it frees them only with the last of its backends).
static KEPT: Mutex<(usize, Vec<Reservation>)> = Mutex::new((0, Vec::new()));

fn kept() -> std::sync::MutexGuard<'static, (usize, Vec<Reservation>)> {
    KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CompiledModelsKept {
    /// On an OpenVINO device, a backend to keep its compiled models with; else none.
    pub(crate) fn on(device: &Device) -> Result<Option<CompiledModelsKept>> {
        if !device.is_openvino() {
            return Ok(None);
        }
        let backend = Backend::init(device.dev, &device.name)?;
        kept().0 += 1;
        Ok(Some(CompiledModelsKept { charge: None, _backend: backend }))
    }

    /// Whether another model's compiled models are kept: then what this model's probe at load
    /// compiles stays too, until the last keeper goes.
    pub(crate) fn others_alive() -> bool {
        kept().0 > 0
    }

    /// Charge `bytes` for the models compiled for this model's passes to `ledger` (an
    /// [`Error::Core`] over-budget error, charging nothing, where they do not fit). The charge
    /// lasts as long as ggml-openvino keeps them, which may be past this keeper's life.
    pub(crate) fn charge(&mut self, ledger: &Ledger, bytes: u64, what: &str) -> Result<()> {
        self.charge = Some(ledger.reserve_in(Place::Host, bytes, what)?);
        Ok(())
    }
}

impl Drop for CompiledModelsKept {
    fn drop(&mut self) {
        let mut kept = kept();
        kept.0 -= 1;
        if kept.0 == 0 {
            // This keeper's backend is the last (a session's would hold the model, and so this
            // keeper, alive): the compiled models all go with it, and every charge.
            kept.1.clear();
        } else if let Some(charge) = self.charge.take() {
            kept.1.push(charge);
        }
    }
}

impl Scheduler {
    /// Backends for `device` (and the CPU, whose ops run on a pool of their own of
    /// `threads.max()` threads, of which each pass uses as many as the governor says) under a
    /// scheduler for graphs of up to `nodes` nodes.
    pub(crate) fn new(device: &Device, threads: Threads, nodes: usize) -> Result<Scheduler> {
        let max = threads.max();
        let mut pools = Pools::new(max);
        let pool = pools.get(max)?;
        let mut remote = Vec::new();
        for r in device.remote.iter().flat_map(|r| &r.devices) {
            remote.push(Backend::init(r.dev, &format!("the RPC backend of {}", r.endpoint))?);
        }
        let n_remote = remote.len();
        let gpu = if device.is_cpu() { None } else { Some(Backend::init(device.dev, &device.name)?) };
        let cpu = Backend::init(device.cpu, "the CPU backend")?;
        // SAFETY: a CPU backend and a live pool of `max` threads, which outlives it (Drop).
        unsafe {
            sys::ggml_backend_cpu_set_n_threads(cpu.0.as_ptr(), max as i32);
            sys::ggml_backend_cpu_set_threadpool(cpu.0.as_ptr(), pool.as_ptr());
        }
        // ggml's scheduler gives an op with no weights to the first backend that can run it
        // next to its inputs: peers' and the GPU's before the CPU, as llama.cpp orders them.
        let backends: Vec<Backend> = remote.into_iter().chain(gpu).chain([cpu]).collect();
        let mut raw: Vec<sys::ggml_backend_t> = backends.iter().map(|b| b.0.as_ptr()).collect();
        // SAFETY: the backends array is valid for the call; ggml copies it.
        let sched = unsafe {
            sys::ggml_backend_sched_new(
                raw.as_mut_ptr(),
                std::ptr::null_mut(),
                raw.len() as i32,
                nodes,
                false,
                true,
            )
        };
        let Some(sched) = NonNull::new(sched) else {
            // The backends go before the pools (declared after them).
            drop(backends);
            return Err(Error::Ggml("cannot create the scheduler".into()));
        };
        let backends = backends.into_iter().map(Backend::into_raw).collect();
        Ok(Scheduler {
            sched,
            backends,
            remote: n_remote,
            threads,
            pools: RefCell::new(pools),
            attached: Cell::new(max),
        })
    }

    /// Bytes of the compute buffers `graph` needs, without allocating them. Like
    /// [`Scheduler::reserve`] and [`Scheduler::alloc`], it splits the graph, which rewrites it:
    /// a graph is given to one of the three, once. (ggml resets the scheduler first, so our
    /// ops are not pinned to the CPU here: on a split model the measure may put a few small
    /// tensors on the peer that the allocation then puts here.)
    pub(crate) fn measure(&self, graph: &Ctx) -> BufferBytes {
        let mut sizes = vec![0usize; self.backends.len()];
        // SAFETY: a graph built for this scheduler's backends; one size per backend.
        unsafe {
            sys::ggml_backend_sched_reserve_size(self.sched.as_ptr(), graph.graph(), sizes.as_mut_ptr())
        };
        self.by_place(|i, _| sizes[i])
    }

    /// Sum `size(index, backend)` over this machine's backends, apart for those whose
    /// buffers are in the device's own memory and those in host memory (peers' are theirs).
    fn by_place(&self, size: impl Fn(usize, NonNull<sys::ggml_backend>) -> usize) -> BufferBytes {
        let mut bytes = BufferBytes::default();
        for (i, &b) in self.backends.iter().enumerate().skip(self.remote) {
            // SAFETY: a backend of this scheduler; its default buffer type is a registry one.
            let buft = unsafe { sys::ggml_backend_get_default_buffer_type(b.as_ptr()) };
            let n = size(i, b);
            if buft_is_host(buft) {
                bytes.host += n;
            } else {
                bytes.device += n;
            }
        }
        bytes
    }

    /// Allocate compute buffers large enough for `graph` (and every smaller one).
    pub(crate) fn reserve(&self, graph: &Ctx) -> bool {
        self.pin_custom_ops(graph);
        // SAFETY: a graph built for this scheduler's backends.
        unsafe { sys::ggml_backend_sched_reserve(self.sched.as_ptr(), graph.graph()) }
    }

    /// Keep our own ops (custom ops: our kernels, whose code is in this process) on the CPU.
    /// A GPU backend refuses them, but ggml's RPC backend says it runs every op, and the
    /// scheduler would give a peer an op whose input came from the peer: the peer would call
    /// a function pointer of ours (it crashed, on Qwen's verification passes).
    fn pin_custom_ops(&self, graph: &Ctx) {
        if self.remote == 0 {
            return;
        }
        let cpu = self.backends.last().expect("the CPU backend is always there").as_ptr();
        let g = graph.graph();
        // SAFETY: a graph built for this scheduler's backends: its nodes are live; the CPU
        // backend is one of the scheduler's.
        unsafe {
            for i in 0..sys::ggml_graph_n_nodes(g) {
                let node = sys::ggml_graph_node(g, i);
                if (*node).op == sys::GGML_OP_CUSTOM {
                    sys::ggml_backend_sched_set_tensor_backend(self.sched.as_ptr(), node, cpu);
                }
            }
        }
    }

    /// Bytes of the compute buffers allocated, on the device and in host memory.
    pub(crate) fn buffer_bytes(&self) -> BufferBytes {
        // SAFETY: backends of this scheduler.
        self.by_place(|_, b| unsafe {
            sys::ggml_backend_sched_get_buffer_size(self.sched.as_ptr(), b.as_ptr())
        })
    }

    /// Assign `graph`'s tensors to the backends and their buffers, ready for inputs.
    pub(crate) fn alloc(&self, graph: &Ctx) -> bool {
        // SAFETY: a graph built for this scheduler's backends.
        unsafe { sys::ggml_backend_sched_reset(self.sched.as_ptr()) };
        self.pin_custom_ops(graph);
        // SAFETY: as above; the pins set since the reset hold for this allocation.
        unsafe { sys::ggml_backend_sched_alloc_graph(self.sched.as_ptr(), graph.graph()) }
    }

    /// Splits of the graph allocated last: the runs of consecutive nodes on one backend that
    /// it computes one after another, each past the first copying its inputs from the others.
    pub(crate) fn splits(&self) -> usize {
        // SAFETY: this scheduler; a count of what it holds.
        unsafe { sys::ggml_backend_sched_get_n_splits(self.sched.as_ptr()) }.max(0) as usize
    }

    /// The ops of the nodes of `graph` (allocated on this scheduler) that the CPU computes
    /// beside a device, each with its count; empty where the CPU is the only backend.
    pub(crate) fn off_device(&self, graph: &Ctx) -> Vec<(String, usize)> {
        let mut ops: Vec<(String, usize)> = Vec::new();
        if self.backends.len() < 2 {
            return ops;
        }
        let cpu = self.backends.last().expect("the CPU backend is always there").as_ptr();
        let g = graph.graph();
        // SAFETY: a graph allocated on this scheduler: its nodes are live, and each has the
        // backend the scheduler assigned; op names are static strings.
        unsafe {
            for i in 0..sys::ggml_graph_n_nodes(g) {
                let node = sys::ggml_graph_node(g, i);
                if sys::ggml_backend_sched_get_tensor_backend(self.sched.as_ptr(), node) != cpu {
                    continue;
                }
                let op = std::ffi::CStr::from_ptr(sys::ggml_op_desc(node)).to_string_lossy();
                match ops.iter_mut().find(|(name, _)| *name == op) {
                    Some((_, n)) => *n += 1,
                    None => ops.push((op.into_owned(), 1)),
                }
            }
        }
        ops
    }

    /// Compute `graph`, allocated by [`Scheduler::alloc`], on as many CPU threads as the
    /// governor gives the pass: returns how many.
    pub(crate) fn compute(&self, graph: &Ctx) -> Result<usize> {
        let pass = governor().begin(self.threads, self.pools.borrow().max());
        let n = pass.threads();
        let cpu = self.backends.last().expect("the CPU backend is always there");
        if n != self.attached.get() {
            let pool = match self.pools.borrow_mut().get(n) {
                Ok(pool) => pool,
                Err(e) => {
                    governor().end(pass);
                    return Err(e);
                }
            };
            // SAFETY: the CPU backend of this scheduler and a live pool of `n` threads, which
            // outlives it; the pool it replaces is paused by ggml (its threads sleep).
            unsafe {
                sys::ggml_backend_cpu_set_threadpool(cpu.as_ptr(), pool.as_ptr());
                sys::ggml_backend_cpu_set_n_threads(cpu.as_ptr(), n as i32);
            }
            self.attached.set(n);
        }
        graph.begin_pass();
        // SAFETY: a graph allocated on this scheduler, its inputs set.
        let status = unsafe { sys::ggml_backend_sched_graph_compute(self.sched.as_ptr(), graph.graph()) };
        governor().end(pass);
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Ggml(format!("graph computation failed (status {status})")));
        }
        Ok(n)
    }
}
