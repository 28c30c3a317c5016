//! Tensors that hold data — weights, the KV cache — as a safe handle: their descriptions in a
//! no_alloc ggml context, their data in backend buffers that the arena allocated on a device or
//! that wrap host memory the arena keeps alive. Everything is freed together, buffers before
//! the context and the memory they wrap, so a [`Tensor`] of an arena is valid as long as it.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use memmap2::{Mmap, MmapMut, UncheckedAdvice};

use crate::error::{Error, Result};
use crate::ffi::device::{buft_name, cstring};
use crate::ffi::graph::Tensor;

/// Host memory a buffer wraps.
pub(crate) enum HostMemory {
    /// Anonymous memory the arena owns (written: a CPU KV cache).
    Anon(MmapMut),
    /// A model file's mapping (read-only weights used where they lie).
    File(Arc<Mmap>),
}

impl HostMemory {
    fn range(&self) -> Range<*const u8> {
        match self {
            HostMemory::Anon(m) => m.as_ptr_range(),
            HostMemory::File(m) => m.as_ptr_range(),
        }
    }
}

/// Which buffer of an arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferId(usize);

/// Tensor descriptions and the buffers holding their data.
pub(crate) struct Arena {
    ctx: NonNull<sys::ggml_context>,
    buffers: Vec<NonNull<sys::ggml_backend_buffer>>,
    /// Per buffer, the host memory it wraps (none: allocated by its buffer type).
    memory: Vec<Option<HostMemory>>,
}

// SAFETY: the arena's tensors are written only through `&mut self` or by the session that owns
// it (a KV cache), and otherwise only read (weights are graph sources), which ggml allows
// from any thread.
unsafe impl Send for Arena {}
// SAFETY: as for Send.
unsafe impl Sync for Arena {}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: each buffer and the context were created here and are freed once, the
        // buffers first; the host memory they wrap is dropped after this body.
        unsafe {
            for b in &self.buffers {
                sys::ggml_backend_buffer_free(b.as_ptr());
            }
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}

impl Arena {
    /// An empty arena with room for `capacity` tensor descriptions.
    pub(crate) fn new(capacity: usize) -> Result<Arena> {
        // SAFETY: a fresh no_alloc context sized for `capacity` descriptions.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (capacity + 1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::Ggml("ggml_init failed".into()))?;
        Ok(Arena { ctx, buffers: Vec::new(), memory: Vec::new() })
    }

    fn wrap(t: *mut sys::ggml_tensor, what: &str) -> Result<Tensor> {
        let t = NonNull::new(t).ok_or_else(|| Error::Ggml(format!("{what} failed: the arena is full")))?;
        // SAFETY: a tensor of this arena's context, which lives as long as the arena.
        Ok(unsafe { Tensor::from_raw(t) })
    }

    /// A new `ne0 × ne1` tensor of type `ty`, not yet placed.
    pub(crate) fn matrix(&self, ty: sys::ggml_type, ne0: usize, ne1: usize) -> Result<Tensor> {
        // SAFETY: a live context; ggml records the description (no data: no_alloc).
        let t = unsafe { sys::ggml_new_tensor_2d(self.ctx.as_ptr(), ty, ne0 as i64, ne1 as i64) };
        Self::wrap(t, "ggml_new_tensor_2d")
    }

    /// A new `ne0 × ne1` tensor of type `ty` named `name`, not yet placed.
    pub(crate) fn named_matrix(
        &self,
        ty: sys::ggml_type,
        ne0: usize,
        ne1: usize,
        name: &str,
    ) -> Result<Tensor> {
        Ok(named(self.matrix(ty, ne0, ne1)?, name))
    }

    /// A new tensor shaped and typed like `like`, named `name`, not yet placed.
    pub(crate) fn dup(&self, like: Tensor, name: &str) -> Result<Tensor> {
        // SAFETY: a live context and a live description to copy.
        let t = unsafe { sys::ggml_dup_tensor(self.ctx.as_ptr(), like.ptr()) };
        Ok(named(Self::wrap(t, "ggml_dup_tensor")?, name))
    }

    /// Allocate every tensor not yet placed in one new buffer of type `buft`.
    pub(crate) fn alloc_in(&mut self, buft: sys::ggml_backend_buffer_type_t) -> Result<BufferId> {
        // SAFETY: a live context; ggml allocates one buffer for its unplaced tensors.
        let buf = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(self.ctx.as_ptr(), buft) };
        let buf = NonNull::new(buf)
            .ok_or_else(|| Error::Ggml(format!("cannot allocate a buffer in {}", buft_name(buft))))?;
        Ok(self.push(buf, None))
    }

    /// Wrap `memory` in a CPU buffer, in which tensors are then [placed](Arena::place).
    pub(crate) fn wrap_host(&mut self, memory: HostMemory) -> Result<BufferId> {
        let range = memory.range();
        let len = range.end as usize - range.start as usize;
        // SAFETY: the memory is kept by the arena until after the buffer is freed; ggml writes
        // only through tensors placed inside it (`place` checks), and only anonymous memory
        // is written (weights are read-only graph sources).
        let buf = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(range.start as *mut _, len) };
        let buf =
            NonNull::new(buf).ok_or_else(|| Error::Ggml("cannot wrap host memory in a buffer".into()))?;
        Ok(self.push(buf, Some(memory)))
    }

    /// Mark every buffer of this arena as holding weights. ggml's scheduler then runs an op
    /// that reads a weight on the weight's backend and copies only the op's result to the next
    /// backend: the token embedding, kept in host memory beside a GPU, is gathered from on the
    /// CPU, as llama.cpp does, instead of being copied whole to the GPU for every pass.
    pub(crate) fn mark_weights(&self) {
        for b in &self.buffers {
            // SAFETY: a live buffer of this arena; the usage is a flag the scheduler reads.
            unsafe { sys::ggml_backend_buffer_set_usage(b.as_ptr(), sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS) };
        }
    }

    fn push(&mut self, buf: NonNull<sys::ggml_backend_buffer>, memory: Option<HostMemory>) -> BufferId {
        self.buffers.push(buf);
        self.memory.push(memory);
        BufferId(self.buffers.len() - 1)
    }

    /// Place `t` (a tensor of this arena, not yet placed) at byte `offset` of the host memory
    /// of buffer `id`.
    pub(crate) fn place(&self, t: Tensor, id: BufferId, offset: usize) -> Result<()> {
        let Some(memory) = &self.memory[id.0] else {
            return Err(Error::Ggml("tensors are placed only in wrapped host memory".into()));
        };
        let range = memory.range();
        let len = range.end as usize - range.start as usize;
        if t.is_allocated() || offset.checked_add(t.nbytes()).is_none_or(|end| end > len) {
            return Err(Error::Ggml(format!("{} does not fit at {offset} of {len} bytes", t.name())));
        }
        // SAFETY: the range [offset, offset + nbytes) lies inside the buffer's memory (checked
        // above) and the tensor has no data yet.
        let status = unsafe {
            sys::ggml_backend_tensor_alloc(
                self.buffers[id.0].as_ptr(),
                t.ptr(),
                range.start.add(offset) as *mut _,
            )
        };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(Error::Ggml(format!("placing {} failed", t.name())));
        }
        Ok(())
    }

    /// Copy the first `rows` rows of `src` into `dst`: matrices of this or another arena, of
    /// one type and row length, in buffers of any backend (a device copies within itself).
    pub(crate) fn copy_rows(src: Tensor, dst: Tensor, rows: usize) -> Result<()> {
        let (sn, dn) = (src.ne(), dst.ne());
        if src.ty() != dst.ty() || sn[0] != dn[0] || rows as i64 > sn[1].min(dn[1]) {
            return Err(Error::Ggml(format!(
                "cannot copy {rows} rows of {} into {}",
                src.name(),
                dst.name()
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let views = Arena::new(2)?;
        // SAFETY: views of live, allocated tensors, described in a context of their own and
        // bound to their sources' buffers (view_init) before the copy; both lie inside their
        // sources (rows checked above), have the same layout, and the context is freed after.
        unsafe {
            let view = |t: Tensor| {
                sys::ggml_view_2d(views.ctx.as_ptr(), t.ptr(), t.ne()[0], rows as i64, t.nb()[1], 0)
            };
            let (sv, dv) = (view(src), view(dst));
            if sv.is_null() || dv.is_null() {
                return Err(Error::Ggml("cannot describe the rows to copy".into()));
            }
            if sys::ggml_backend_view_init(sv) != sys::GGML_STATUS_SUCCESS
                || sys::ggml_backend_view_init(dv) != sys::GGML_STATUS_SUCCESS
            {
                return Err(Error::Ggml("cannot bind the rows to copy".into()));
            }
            sys::ggml_backend_tensor_copy(sv, dv);
        }
        Ok(())
    }

    /// Whether buffer `id` is in host memory (where ggml's CPU kernels read it).
    pub(crate) fn is_host(&self, id: BufferId) -> bool {
        // SAFETY: a live buffer.
        unsafe { sys::ggml_backend_buffer_is_host(self.buffers[id.0].as_ptr()) }
    }

    /// Whether every buffer of this arena is in host memory.
    pub(crate) fn all_host(&self) -> bool {
        // SAFETY: live buffers.
        self.buffers.iter().all(|b| unsafe { sys::ggml_backend_buffer_is_host(b.as_ptr()) })
    }

    /// Zero the whole of buffer `id`.
    pub(crate) fn clear(&self, id: BufferId) {
        // SAFETY: a live buffer of this arena.
        unsafe { sys::ggml_backend_buffer_clear(self.buffers[id.0].as_ptr(), 0) }
    }

    /// Zero `range` of buffer `id`'s anonymous host memory.
    pub(crate) fn zero(&mut self, id: BufferId, range: Range<usize>) {
        if let Some(HostMemory::Anon(map)) = &mut self.memory[id.0] {
            map[range].fill(0);
        }
    }

    /// Give the pages of `range` of buffer `id`'s anonymous host memory back to the system;
    /// they read as zeros afterwards. For positions of a cache that nothing reads again before
    /// rewriting them.
    pub(crate) fn release(&self, id: BufferId, range: Range<usize>) {
        if let Some(HostMemory::Anon(map)) = &self.memory[id.0]
            && range.end <= map.len()
            && range.start < range.end
        {
            // SAFETY: a range inside a private anonymous mapping, of which no Rust reference
            // exists (ggml reaches it through raw pointers); its pages read back as zeros.
            let _ =
                unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, range.start, range.len()) };
        }
    }
}

/// `t`, named `name`.
fn named(t: Tensor, name: &str) -> Tensor {
    let name = cstring(name);
    // SAFETY: a live tensor; ggml copies the name.
    unsafe { sys::ggml_set_name(t.ptr(), name.as_ptr()) };
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a device's KV cache does when it grows, here in host buffers.
    #[test]
    fn copy_rows_copies_the_first_rows_between_buffers() {
        crate::ffi::init();
        // SAFETY: the CPU backend's buffer type, a registry singleton.
        let buft = unsafe { sys::ggml_backend_cpu_buffer_type() };
        let mut small = Arena::new(1).unwrap();
        let src = small.matrix(sys::GGML_TYPE_F16, 8, 3).unwrap();
        small.alloc_in(buft).unwrap();
        let mut large = Arena::new(1).unwrap();
        let dst = large.matrix(sys::GGML_TYPE_F16, 8, 5).unwrap();
        let id = large.alloc_in(buft).unwrap();
        large.clear(id);
        let rows: Vec<u16> = (0..24).collect();
        src.set_data(&rows).unwrap();
        Arena::copy_rows(src, dst, 3).unwrap();
        let mut out = vec![7u16; 40];
        dst.get_data(&mut out).unwrap();
        assert_eq!(&out[..24], &rows[..]);
        assert!(out[24..].iter().all(|&x| x == 0), "rows past the copy stay as they were");
        // More rows than the source has: refused, nothing copied.
        assert!(Arena::copy_rows(src, dst, 4).is_err());
    }
}
