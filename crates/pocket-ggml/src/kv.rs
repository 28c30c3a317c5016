//! The KV cache of one session.
//!
//! On the CPU the cache is one anonymous mapping that *reserves* address space for the whole
//! context but is only backed by memory where tokens have been written: every layer's K and V
//! is a contiguous `[n_embd_kv, n_ctx]` tensor (so attention reads it as one view, no copies),
//! and a page becomes resident when the first token in it is written. Truncating releases the
//! pages past the tokens still held (in blocks), so a session's memory follows its length in
//! both directions. Accounting is in blocks of [`KV_BLOCK_TOKENS`] tokens, and every block is
//! reserved in the session's memory ledger before it is written.
//!
//! On other devices (CUDA, Vulkan) device memory cannot be committed by the page, so the
//! cache grows by reallocation: it holds [`KV_PAD`] positions at first, and a pass that
//! needs more gets a cache of as many more blocks of that size as it needs, the positions held
//! copied over within the device, paid for in the ledger before it is allocated (the old and
//! the new for the moment of the copy). A new cache is a new layout (a new id), so the graphs
//! built on the old one are not used again. Truncating keeps the capacity.
//!
//! A model split across machines ([`crate::split`]) keeps each layer's cache with the layer: a
//! layer on a peer has its K and V in the peer's memory, the others here; such a cache grows as
//! a device's does, and the ledger pays for this machine's layers only.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapOptions;
use pocket_core::memory::{Place, Reservation};
use pocket_core::{KvElement, KvType};

use crate::ffi::arena::{Arena, BufferId, HostMemory};
use crate::ffi::device::{BufferType, Device, buft_is_host};
use crate::ffi::graph::Tensor;
use crate::ffi::types::{self, ggml_type};
use crate::hparams::Hparams;
use crate::{Error, Result};
use llama_cpp_sys_2 as sys;

/// The KV cache grows and shrinks in blocks of this many tokens.
pub const KV_BLOCK_TOKENS: usize = 64;

/// Attention reads the cache in lengths padded to this many positions (masked past the tokens
/// held), as llama.cpp does: a decode step's graph then keeps its shape for this many steps and
/// is reused instead of rebuilt.
pub(crate) const KV_PAD: usize = 256;

const PAGE: usize = 4096;

/// Bytes of one token's K (or V, by `t`) in one layer.
pub(crate) fn row_bytes(hp: &Hparams, t: KvElement) -> usize {
    width_bytes(hp.n_embd_kv(), t)
}

/// Bytes of `n` values of type `t`, in whole blocks.
pub(crate) fn width_bytes(n: usize, t: KvElement) -> usize {
    // (ggml_row_size would abort on a row that is not whole blocks, which a footprint may be
    // asked of before a session refuses it.)
    types::bytes_of(ggml_type(t), n)
}

/// Values per block of `t` (1 for the float types).
pub(crate) fn block_size(t: KvElement) -> usize {
    types::info(ggml_type(t)).block
}

/// Values per block of the coarser of `kv`'s two types: what a head's size must divide by.
pub(crate) fn kv_block_size(kv: KvType) -> usize {
    block_size(kv.k).max(block_size(kv.v))
}

/// KV bytes per token over all layers, K and V.
pub(crate) fn bytes_per_token(hp: &Hparams, kv: KvType) -> usize {
    hp.n_layer * (row_bytes(hp, kv.k) + row_bytes(hp, kv.v))
}

/// A new [`KvLayout::id`].
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a graph reads of a cache: its tensors, their types and sizes — fixed when the cache is
/// made. Shared (an `Arc`) with a batched pass that another session's thread builds, while
/// this cache's session waits for it (the tensors live as long as the [`KvCache`]).
pub(crate) struct KvLayout {
    /// Unique in the process, never reused: what a graph built on this cache is known by.
    pub(crate) id: u64,
    pub(crate) kv: KvType,
    n_ctx: usize,
    /// Bytes of one token's K in one layer, and of its V.
    k_row_bytes: usize,
    v_row_bytes: usize,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// In host memory, where ggml's CPU kernels read it.
    host: bool,
}

pub(crate) struct KvCache {
    layout: Arc<KvLayout>,
    /// On a device: its buffer type, what each layer's rows hold, and the most positions the
    /// cache may grow to (its tensors hold `layout.n_ctx` now). None: host memory.
    device: Option<DeviceCache>,
    /// Most tokens held; blocks are accounted up to here.
    limit: usize,
    n_layer: usize,
    /// Layers whose cache is in this machine's memory (all but those on peers): the ledger
    /// pays for theirs.
    charged_layers: usize,
    arena: Arena,
    buffer: BufferId,
    /// A split cache's arenas in other buffer types than `arena`'s (a peer's memory).
    other_arenas: Vec<Arena>,
    /// In host memory: the bytes each tensor's region takes (address space reserved for the
    /// whole context, committed as written; K's and V's rows may differ in size, and each
    /// region fits the larger). None: device memory, reallocated as it grows.
    region: Option<usize>,
    /// Tokens of capacity currently committed (a multiple of the block size; on a device,
    /// the positions its tensors hold).
    committed: usize,
    /// What the committed blocks take in the memory ledger.
    reservation: Reservation,
    /// Tokens of capacity never released (all of it after [`KvCache::hold_whole`]).
    floor: usize,
}

/// What a cache in device memory is reallocated with.
struct DeviceCache {
    /// Each layer's buffer type: the device's, or for a layer on a peer, the peer's.
    bufts: Vec<BufferType>,
    n_embd_kv: usize,
    /// Most positions it grows to (the context, padded).
    max: usize,
}

/// A device cache of `rows` positions: its arenas (one per buffer type, each with one buffer;
/// the first's id beside them) and each layer's K and V, zeroed.
fn device_tensors(d: &DeviceCache, kv: KvType, rows: usize) -> Result<DeviceTensors> {
    let n_layer = d.bufts.len();
    let mut bufts: Vec<sys::ggml_backend_buffer_type_t> = Vec::new();
    for b in &d.bufts {
        if !bufts.contains(&b.0) {
            bufts.push(b.0);
        }
    }
    let mut arenas = Vec::with_capacity(bufts.len());
    for _ in &bufts {
        arenas.push(Arena::new(2 * n_layer)?);
    }
    let mut k = Vec::with_capacity(n_layer);
    let mut v = Vec::with_capacity(n_layer);
    for (il, b) in d.bufts.iter().enumerate() {
        let arena = &mut arenas[bufts.iter().position(|&x| x == b.0).expect("listed above")];
        // llama.cpp's names: ggml's OpenVINO backend finds each attention's layer by them.
        k.push(arena.named_matrix(ggml_type(kv.k), d.n_embd_kv, rows, &format!("cache_k_l{il}"))?);
        v.push(arena.named_matrix(ggml_type(kv.v), d.n_embd_kv, rows, &format!("cache_v_l{il}"))?);
    }
    let mut first = None;
    for (arena, &buft) in arenas.iter_mut().zip(&bufts) {
        let buffer = arena.alloc_in(buft).map_err(|_| {
            Error::Ggml(format!(
                "cannot allocate a {rows}-token KV cache in {}",
                crate::ffi::device::buft_name(buft)
            ))
        })?;
        // Device memory comes uninitialised, unlike fresh anonymous pages. Attention reads
        // padded lengths past the written positions and masks them, but a masked weight of 0
        // times a NaN left in the memory is still NaN: zero the cache, as llama.cpp does.
        arena.clear(buffer);
        first.get_or_insert(buffer);
    }
    let host = arenas.iter().all(Arena::all_host);
    let buffer = first.expect("a model has layers");
    Ok(DeviceTensors { arenas, buffer, k, v, host })
}

/// What [`device_tensors`] makes.
struct DeviceTensors {
    arenas: Vec<Arena>,
    /// The first arena's buffer.
    buffer: BufferId,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Whether every layer's cache is in host memory.
    host: bool,
}

impl KvCache {
    /// A cache holding at most `limit` tokens, with room (address space) for `n_ctx ≥ limit`
    /// positions so that attention may read padded lengths. `reservation` (empty) pays for
    /// the blocks as they are committed; a device cache, allocated whole, is paid for here.
    pub(crate) fn new(
        hp: &Hparams,
        device: &Device,
        kv: KvType,
        limit: usize,
        n_ctx: usize,
        mut reservation: Reservation,
    ) -> Result<Self> {
        let block = kv_block_size(kv);
        if !hp.head_dim.is_multiple_of(block) {
            return Err(Error::Core(pocket_core::Error::invalid(format!(
                "a {kv} KV cache stores heads in blocks of {block} values; this model's heads have {}: \
                 use kv = \"f16\"",
                hp.head_dim
            ))));
        }
        let (k_row_bytes, v_row_bytes) = (row_bytes(hp, kv.k), row_bytes(hp, kv.v));
        let charged_layers = (0..hp.n_layer).filter(|&il| device.remote_of(il).is_none()).count();
        if !device.all_on_cpu() {
            // Each layer's cache where the layer is: a peer's memory, else this device's
            // (host memory for the CPU).
            let here = if device.is_cpu() { device.cpu_buffer_type() } else { device.buffer_type() };
            let bufts = (0..hp.n_layer)
                .map(|il| BufferType(device.remote_of(il).map_or(here, |r| r.buffer_type())))
                .collect();
            let d = DeviceCache { bufts, n_embd_kv: hp.n_embd_kv(), max: n_ctx };
            // A first block; passes that need more grow it (`grow_to`).
            let rows = KV_PAD.min(n_ctx);
            if !buft_is_host(here) {
                reservation.move_to(Place::Device)?;
            }
            reservation.resize((rows * charged_layers * (k_row_bytes + v_row_bytes)) as u64)?;
            let DeviceTensors { mut arenas, buffer, k, v, host } = device_tensors(&d, kv, rows)?;
            let arena = arenas.remove(0);
            return Ok(KvCache {
                layout: Arc::new(KvLayout {
                    id: next_id(),
                    kv,
                    n_ctx: rows,
                    k_row_bytes,
                    v_row_bytes,
                    k,
                    v,
                    host,
                }),
                device: Some(d),
                limit: limit.min(n_ctx),
                n_layer: hp.n_layer,
                charged_layers,
                arena,
                buffer,
                other_arenas: arenas,
                region: None,
                committed: rows,
                reservation,
                floor: 0,
            });
        }
        let n_tensors = 2 * hp.n_layer;
        let mut arena = Arena::new(n_tensors)?;
        let mut k = Vec::with_capacity(hp.n_layer);
        let mut v = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            k.push(arena.named_matrix(ggml_type(kv.k), hp.n_embd_kv(), n_ctx, &format!("cache_k_l{il}"))?);
            v.push(arena.named_matrix(ggml_type(kv.v), hp.n_embd_kv(), n_ctx, &format!("cache_v_l{il}"))?);
        }
        let region = (n_ctx * k_row_bytes.max(v_row_bytes)).next_multiple_of(PAGE);
        let map = MmapOptions::new()
            .len(region * n_tensors)
            .map_anon()
            .map_err(|e| Error::Ggml(format!("cannot reserve the KV cache: {e}")))?;
        let buffer = arena.wrap_host(HostMemory::Anon(map))?;
        // Each tensor in a region of its own, so that blocks are committed per tensor.
        for (i, t) in k.iter().zip(&v).flat_map(|(a, b)| [a, b]).enumerate() {
            arena.place(*t, buffer, i * region)?;
        }
        let host = arena.is_host(buffer);
        Ok(KvCache {
            layout: Arc::new(KvLayout { id: next_id(), kv, n_ctx, k_row_bytes, v_row_bytes, k, v, host }),
            device: None,
            limit: limit.min(n_ctx),
            n_layer: hp.n_layer,
            charged_layers,
            arena,
            buffer,
            other_arenas: Vec::new(),
            region: Some(region),
            committed: 0,
            reservation,
            floor: 0,
        })
    }

    /// Commit and write the whole cache now and never release it: what an engine that sizes
    /// its cache for the context does (for comparisons with one; see
    /// [`pocket_core::SessionConfig::preallocate`]).
    pub(crate) fn hold_whole(&mut self) -> Result<()> {
        self.grow_to(self.limit)?;
        if let Some(region) = self.region {
            for i in 0..2 * self.n_layer {
                let used = (self.limit * self.tensor_row_bytes(i)).min(region);
                self.arena.zero(self.buffer, i * region..i * region + used);
            }
        }
        self.floor = self.limit;
        Ok(())
    }

    /// The layout, shared: for a pass built on another thread.
    pub(crate) fn layout(&self) -> &Arc<KvLayout> {
        &self.layout
    }

    /// Row bytes of the `i`-th tensor in placement order (K, V of layer 0, then of layer 1...).
    fn tensor_row_bytes(&self, i: usize) -> usize {
        if i.is_multiple_of(2) { self.k_row_bytes } else { self.v_row_bytes }
    }

    /// Bytes of one token's K and V over all layers.
    fn token_bytes(&self) -> usize {
        self.n_layer * (self.k_row_bytes + self.v_row_bytes)
    }
}

impl KvLayout {
    pub(crate) fn k(&self, layer: usize) -> Tensor {
        self.k[layer]
    }

    pub(crate) fn v(&self, layer: usize) -> Tensor {
        self.v[layer]
    }

    /// Whether the cache is in host memory (a CPU cache), where ggml's CPU kernels read it.
    pub(crate) fn in_host_memory(&self) -> bool {
        self.host
    }

    /// Whether K is stored quantized.
    pub(crate) fn k_quantized(&self) -> bool {
        self.kv.k.is_quantized()
    }

    /// Whether V is stored quantized.
    pub(crate) fn v_quantized(&self) -> bool {
        self.kv.v.is_quantized()
    }

    /// Whether K and V are stored as f16.
    pub(crate) fn is_f16(&self) -> bool {
        self.kv == KvType::F16
    }

    /// Bytes of one token's K in one layer.
    pub(crate) fn k_row_bytes(&self) -> usize {
        self.k_row_bytes
    }

    /// Bytes of one token's V in one layer.
    pub(crate) fn v_row_bytes(&self) -> usize {
        self.v_row_bytes
    }

    pub(crate) fn n_ctx(&self) -> usize {
        self.n_ctx
    }
}

impl Deref for KvCache {
    type Target = KvLayout;

    fn deref(&self) -> &KvLayout {
        &self.layout
    }
}

impl KvCache {
    /// Make room for `tokens` tokens (whole blocks), reserving them in the ledger first; on
    /// [`pocket_core::Error::OverBudget`] nothing changes. Pages are touched by the writes
    /// that follow.
    pub(crate) fn grow_to(&mut self, tokens: usize) -> Result<()> {
        if self.device.is_some() {
            return self.grow_device(tokens);
        }
        if tokens > self.committed {
            let committed = tokens.next_multiple_of(KV_BLOCK_TOKENS).min(self.limit);
            self.reservation.resize(self.bytes_for(committed) as u64)?;
            self.committed = committed;
        }
        Ok(())
    }

    /// [`KvCache::grow_to`] on a device: a cache of enough more blocks of [`KV_PAD`]
    /// positions (attention reads lengths padded to them), the positions held copied over.
    ///
    fn grow_device(&mut self, tokens: usize) -> Result<()> {
        let Some(d) = &self.device else { return Ok(()) };
        let held = self.layout.n_ctx;
        if tokens <= held {
            return Ok(());
        }
        let rows = tokens.next_multiple_of(KV_PAD).min(d.max).max(tokens);
        // The old cache and the new are both held while the positions are copied.
        self.reservation.resize(self.bytes_for(held + rows) as u64)?;
        let grown = device_tensors(d, self.kv, rows).and_then(|t| {
            for (old, new) in self.layout.k.iter().zip(&t.k).chain(self.layout.v.iter().zip(&t.v)) {
                Arena::copy_rows(*old, *new, held)?;
            }
            Ok(t)
        });
        let DeviceTensors { mut arenas, buffer, k, v, host } = match grown {
            Ok(grown) => grown,
            Err(e) => {
                let _ = self.reservation.resize(self.bytes_for(held) as u64);
                return Err(e);
            }
        };
        let l = &self.layout;
        let (kv, k_row_bytes, v_row_bytes) = (l.kv, l.k_row_bytes, l.v_row_bytes);
        self.layout =
            Arc::new(KvLayout { id: next_id(), kv, n_ctx: rows, k_row_bytes, v_row_bytes, k, v, host });
        // The old tensors go with the old arenas (graphs on them are not used again: new id).
        self.arena = arenas.remove(0);
        self.other_arenas = arenas;
        self.buffer = buffer;
        self.committed = rows;
        let _ = self.reservation.resize(self.bytes_for(rows) as u64);
        Ok(())
    }

    /// Release the blocks past `tokens` tokens.
    pub(crate) fn shrink_to(&mut self, tokens: usize) {
        let Some(region) = self.region else {
            return; // device memory, allocated whole: nothing to release
        };
        let keep = tokens.max(self.floor).next_multiple_of(KV_BLOCK_TOKENS).min(self.limit);
        if keep >= self.committed {
            return;
        }
        for i in 0..2 * self.n_layer {
            let row = self.tensor_row_bytes(i);
            let from = (keep * row).next_multiple_of(PAGE);
            let to = (self.committed * row).next_multiple_of(PAGE).min(region);
            if to > from {
                self.arena.release(self.buffer, i * region + from..i * region + to);
            }
        }
        self.committed = keep;
        // Shrinking a reservation cannot fail.
        let _ = self.reservation.resize(self.bytes_for(keep) as u64);
    }

    /// A copy of the first `tokens` positions: each layer's K rows, then its V rows.
    pub(crate) fn save(&self, tokens: usize) -> Result<Vec<u8>> {
        let (k_run, v_run) = (tokens * self.k_row_bytes, tokens * self.v_row_bytes);
        let mut out = vec![0u8; tokens * self.token_bytes()];
        for (il, chunk) in out.chunks_exact_mut((k_run + v_run).max(1)).enumerate().take(self.n_layer) {
            let (k, v) = chunk.split_at_mut(k_run);
            self.k[il].read_at(0, k)?;
            self.v[il].read_at(0, v)?;
        }
        Ok(out)
    }

    /// Hold the first `tokens` positions of what [`KvCache::save`] copied out of a cache of
    /// the same model and type holding `saved` positions, reserving their blocks first.
    pub(crate) fn restore(&mut self, data: &[u8], saved: usize, tokens: usize) -> Result<()> {
        let (k_run, v_run) = (saved * self.k_row_bytes, saved * self.v_row_bytes);
        if tokens > saved || data.len() != saved * self.token_bytes() {
            return Err(Error::Core(pocket_core::Error::invalid(format!(
                "a saved cache of {} bytes does not hold {saved} positions of this model's {} KV \
                 ({} bytes each)",
                data.len(),
                self.kv,
                self.token_bytes()
            ))));
        }
        self.grow_to(tokens)?;
        let (k_used, v_used) = (tokens * self.k_row_bytes, tokens * self.v_row_bytes);
        for il in 0..self.n_layer {
            let k = il * (k_run + v_run);
            self.k[il].write_at(0, &data[k..k + k_used])?;
            self.v[il].write_at(0, &data[k + k_run..k + k_run + v_used])?;
        }
        Ok(())
    }

    /// Copy position `from`'s K and V to position `to` in every layer (keeping one path of a
    /// tree of drafts: its rows move down to follow one another).
    pub(crate) fn move_row(&self, from: usize, to: usize) -> Result<()> {
        let mut row = vec![0u8; self.k_row_bytes.max(self.v_row_bytes)];
        for il in 0..self.n_layer {
            for (t, n) in [(self.k[il], self.k_row_bytes), (self.v[il], self.v_row_bytes)] {
                t.read_at(from * n, &mut row[..n])?;
                t.write_at(to * n, &row[..n])?;
            }
        }
        Ok(())
    }

    /// Bytes committed to the cache now.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes_for(self.committed)
    }

    /// Bytes `tokens` committed tokens take in this machine's memory (each layer's K and V
    /// also ends on a page, up to 4 KiB more, which the process reserve covers; layers on
    /// peers are in theirs).
    fn bytes_for(&self, tokens: usize) -> usize {
        tokens * self.charged_layers * (self.k_row_bytes + self.v_row_bytes)
    }
}
