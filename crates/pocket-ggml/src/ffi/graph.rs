//! Safe handles for building ggml graphs: a [`Ctx`] (a no_alloc ggml context holding one
//! graph's tensor descriptions, in memory it owns) and [`Tensor`] handles.
//!
//! Graph code (`graph/`, `arch/`) builds with these and has no `unsafe` of its own. What keeps
//! it sound: a [`Tensor`] is only ever made here, from a tensor of a live context — this
//! [`Ctx`], a model's weights or a session's KV cache — and those are kept alive for as long
//! as any graph built from them (the session drops its graphs before its cache, the model
//! outlives its sessions). ggml checks shapes itself and aborts on a mismatch; that is a
//! crash, never undefined behaviour, and the loaders check every weight's shape beforehand so
//! that it does not happen.

use std::cell::RefCell;
use std::ffi::CStr;
use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};
use crate::ffi::chunks::{Chunks, PassCount};

/// A tensor of a live ggml context (see the module notes for why handles stay valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tensor(NonNull<sys::ggml_tensor>);

// SAFETY: a handle is a pointer to a tensor description; sending it to another thread is
// sound as long as the owner is (weights are shared read-only; graphs belong to one session).
unsafe impl Send for Tensor {}
// SAFETY: as for Send.
unsafe impl Sync for Tensor {}

impl Tensor {
    /// A handle for `t`.
    ///
    /// # Safety
    /// `t` must be a tensor of a ggml context that outlives every use of the handle.
    pub(crate) unsafe fn from_raw(t: NonNull<sys::ggml_tensor>) -> Tensor {
        Tensor(t)
    }

    /// The raw pointer, for the FFI layer and the kernels.
    pub(crate) fn ptr(self) -> *mut sys::ggml_tensor {
        self.0.as_ptr()
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: a handle points to a live tensor (module notes); its description is only
        // written by ggml while building (which we are not doing concurrently).
        unsafe { self.0.as_ref() }
    }

    /// Elements per dimension.
    pub(crate) fn ne(self) -> [i64; 4] {
        self.get().ne
    }

    /// Bytes per step in each dimension.
    pub(crate) fn nb(self) -> [usize; 4] {
        self.get().nb
    }

    /// The element type.
    pub(crate) fn ty(self) -> sys::ggml_type {
        self.get().type_
    }

    /// Elements in all.
    pub(crate) fn nelements(self) -> i64 {
        self.ne().iter().product()
    }

    /// Bytes of its data.
    pub(crate) fn nbytes(self) -> usize {
        // SAFETY: a live tensor.
        unsafe { sys::ggml_nbytes(self.ptr()) }
    }

    /// Whether its elements lie one after another, with no gaps (a view of a fused
    /// projection does not).
    pub(crate) fn is_contiguous(self) -> bool {
        // SAFETY: a live tensor.
        unsafe { sys::ggml_is_contiguous(self.ptr()) }
    }

    /// Whether memory has been allocated for it (a scheduler allocates only what the graph
    /// it computes uses).
    pub(crate) fn is_allocated(self) -> bool {
        !self.get().buffer.is_null()
    }

    /// Copy `data` into the tensor, which must be allocated and hold exactly that many bytes.
    pub(crate) fn set_data<T: Copy>(self, data: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(data);
        if !self.is_allocated() || self.nbytes() != bytes {
            return Err(Error::Ggml(format!(
                "input {} takes {} bytes{}, given {bytes}",
                self.name(),
                self.nbytes(),
                if self.is_allocated() { "" } else { " (not allocated)" }
            )));
        }
        // SAFETY: allocated with exactly `bytes` bytes, checked above.
        unsafe { sys::ggml_backend_tensor_set(self.ptr(), data.as_ptr().cast(), 0, bytes) };
        Ok(())
    }

    /// Copy `bytes` into the tensor's data from byte `offset` on (the tensor must be allocated
    /// and that long).
    pub(crate) fn write_at(self, offset: usize, bytes: &[u8]) -> Result<()> {
        if !self.is_allocated() || offset.checked_add(bytes.len()).is_none_or(|end| end > self.nbytes()) {
            return Err(Error::Ggml(format!(
                "{} bytes at {offset} do not fit {} ({} bytes)",
                bytes.len(),
                self.name(),
                self.nbytes()
            )));
        }
        // SAFETY: allocated, and the range lies inside its data (checked above).
        unsafe { sys::ggml_backend_tensor_set(self.ptr(), bytes.as_ptr().cast(), offset, bytes.len()) };
        Ok(())
    }

    /// Copy the tensor's data from byte `offset` on into `out` (the tensor must be allocated
    /// and that long).
    pub(crate) fn read_at(self, offset: usize, out: &mut [u8]) -> Result<()> {
        if !self.is_allocated() || offset.checked_add(out.len()).is_none_or(|end| end > self.nbytes()) {
            return Err(Error::Ggml(format!(
                "{} bytes at {offset} are not inside {} ({} bytes)",
                out.len(),
                self.name(),
                self.nbytes()
            )));
        }
        // SAFETY: allocated, and the range lies inside its data (checked above).
        unsafe { sys::ggml_backend_tensor_get(self.ptr(), out.as_mut_ptr().cast(), offset, out.len()) };
        Ok(())
    }

    /// Copy the start of the tensor's data into `out` (at most its size).
    pub(crate) fn get_data<T: Copy>(self, out: &mut [T]) -> Result<()> {
        self.get_data_from(0, out)
    }

    /// Copy the tensor's data from element `first` on (elements of `T`) into `out`.
    pub(crate) fn get_data_from<T: Copy>(self, first: usize, out: &mut [T]) -> Result<()> {
        let (offset, bytes) = (first * size_of::<T>(), std::mem::size_of_val(out));
        if !self.is_allocated() || offset.checked_add(bytes).is_none_or(|end| end > self.nbytes()) {
            return Err(Error::Ggml(format!(
                "output {} holds {} bytes, {bytes} at {offset} asked",
                self.name(),
                self.nbytes()
            )));
        }
        // SAFETY: allocated, and the range lies inside its data (checked above).
        unsafe { sys::ggml_backend_tensor_get(self.ptr(), out.as_mut_ptr().cast(), offset, bytes) };
        Ok(())
    }

    /// Its name (as `ggml_set_name` gave it).
    pub(crate) fn name(self) -> String {
        // SAFETY: ggml keeps a NUL-terminated name in the tensor.
        unsafe { CStr::from_ptr(self.get().name.as_ptr()) }.to_string_lossy().into_owned()
    }
}

/// A no_alloc ggml context holding one graph and its tensor descriptions, in memory it owns.
pub(crate) struct Ctx {
    ctx: NonNull<sys::ggml_context>,
    graph: NonNull<sys::ggml_cgraph>,
    /// The context's memory: freed (or handed back for reuse) after the context.
    mem: Vec<u8>,
    /// The graph's passes, and the chunk counters of its ops that hand out work in chunks
    /// (their user data points here: boxed, so that they do not move when the list grows).
    pass: Box<PassCount>,
    #[allow(clippy::vec_box)]
    chunks: RefCell<Vec<Box<Chunks>>>,
}

// SAFETY: the context and graph are used by one thread at a time (the session owning them).
unsafe impl Send for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once, before its memory (dropped after this body).
        unsafe { sys::ggml_free(self.ctx.as_ptr()) };
    }
}

impl Ctx {
    /// Bytes of memory a context for a graph of `nodes` nodes needs.
    pub(crate) fn memory_for(nodes: usize) -> usize {
        // SAFETY: pure size computations.
        unsafe { sys::ggml_tensor_overhead() * nodes + sys::ggml_graph_overhead_custom(nodes, false) }
    }

    /// A context for a graph of at most `nodes` nodes in `mem` (at least
    /// [`Ctx::memory_for`]`(nodes)` bytes; reused from a dropped graph by [`Ctx::into_memory`]).
    pub(crate) fn new(mut mem: Vec<u8>, nodes: usize) -> Result<Ctx> {
        mem.resize(mem.len().max(Self::memory_for(nodes)), 0);
        // SAFETY: the context lives in `mem`, which the Ctx owns and frees after it.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: mem.len(),
                mem_buffer: mem.as_mut_ptr().cast(),
                no_alloc: true,
            })
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::Ggml("ggml_init failed".into()))?;
        // SAFETY: a live context sized for a graph of `nodes`.
        let graph = unsafe { sys::ggml_new_graph_custom(ctx.as_ptr(), nodes, false) };
        let Some(graph) = NonNull::new(graph) else {
            // SAFETY: created above, not yet owned by a Ctx.
            unsafe { sys::ggml_free(ctx.as_ptr()) };
            return Err(Error::Ggml("ggml_new_graph failed".into()));
        };
        Ok(Ctx { ctx, graph, mem, pass: Box::default(), chunks: RefCell::default() })
    }

    /// Chunk counters for an op of this graph (its user data), holding the op's parameter
    /// `data`: they live as long as the graph.
    pub(crate) fn chunks(&self, data: u64) -> *mut std::ffi::c_void {
        let chunks = Box::new(Chunks::new(&self.pass, data));
        let ptr = (&*chunks as *const Chunks).cast_mut().cast();
        self.chunks.borrow_mut().push(chunks);
        ptr
    }

    /// A computation of the graph starts: its ops' chunks are counted anew.
    pub(crate) fn begin_pass(&self) {
        self.pass.next();
    }

    /// Free the context and hand back its memory, for the next graph.
    pub(crate) fn into_memory(mut self) -> Vec<u8> {
        let mem = std::mem::take(&mut self.mem);
        drop(self);
        mem
    }

    /// The raw context, for the kernels' custom ops.
    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.ctx.as_ptr()
    }

    /// The raw graph, for the scheduler.
    pub(crate) fn graph(&self) -> *mut sys::ggml_cgraph {
        self.graph.as_ptr()
    }

    /// Wrap what a ggml builder returned; it returns null only when the context is full,
    /// which [`Ctx::new`]'s sizing rules out.
    fn wrap(&self, t: *mut sys::ggml_tensor) -> Tensor {
        Tensor(NonNull::new(t).expect("ggml context sized for the graph"))
    }

    /// Add `t` and what it depends on to the graph, in order: nodes added earlier run first.
    pub(crate) fn expand(&self, t: Tensor) {
        // SAFETY: a live graph of this context and a live tensor.
        unsafe { sys::ggml_build_forward_expand(self.graph.as_ptr(), t.ptr()) }
    }

    /// Name `t` (for debugging against llama.cpp's `cb(cur, name, il)` names): `name` for a
    /// whole-model tensor (`il` = None), `name-il` for a layer's.
    pub(crate) fn name(&self, t: Tensor, name: &str, il: Option<usize>) -> Tensor {
        let full = match il {
            Some(il) => format!("{name}-{il}"),
            None => name.to_owned(),
        };
        let full = std::ffi::CString::new(full).unwrap_or_default();
        // SAFETY: a live tensor; ggml copies the name (truncating it to its buffer).
        unsafe { sys::ggml_set_name(t.ptr(), full.as_ptr()) };
        t
    }

    /// A new input tensor of `ty` and shape `ne` (1 to 4 dimensions), named `name`.
    pub(crate) fn input(&self, ty: sys::ggml_type, ne: &[i64], name: &str) -> Tensor {
        let ne4 = [0, 1, 2, 3].map(|i| ne.get(i).copied().unwrap_or(1));
        // SAFETY: a live context; the dimension count is 1..=4.
        let t = unsafe { sys::ggml_new_tensor(self.raw(), ty, ne.len().clamp(1, 4) as i32, ne4.as_ptr()) };
        let t = self.wrap(t);
        self.name(t, name, None);
        // SAFETY: a live tensor of this context.
        unsafe { sys::ggml_set_input(t.ptr()) };
        t
    }

    /// Mark `t` as an output of the graph (its memory is not reused by later nodes).
    pub(crate) fn output(&self, t: Tensor) {
        // SAFETY: a live tensor.
        unsafe { sys::ggml_set_output(t.ptr()) }
    }
}

/// Builders of graph nodes: each is ggml's function of the same name on live tensors.
impl Ctx {
    pub(crate) fn get_rows(&self, a: Tensor, ids: Tensor) -> Tensor {
        // SAFETY: live context and tensors (module notes).
        self.wrap(unsafe { sys::ggml_get_rows(self.raw(), a.ptr(), ids.ptr()) })
    }

    pub(crate) fn add(&self, a: Tensor, b: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_add(self.raw(), a.ptr(), b.ptr()) })
    }

    pub(crate) fn mul(&self, a: Tensor, b: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_mul(self.raw(), a.ptr(), b.ptr()) })
    }

    pub(crate) fn scale(&self, a: Tensor, s: f32) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_scale(self.raw(), a.ptr(), s) })
    }

    pub(crate) fn tanh(&self, a: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_tanh(self.raw(), a.ptr()) })
    }

    pub(crate) fn rms_norm(&self, a: Tensor, eps: f32) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_rms_norm(self.raw(), a.ptr(), eps) })
    }

    pub(crate) fn mul_mat(&self, a: Tensor, b: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_mul_mat(self.raw(), a.ptr(), b.ptr()) })
    }

    /// `a · b` where `a` is a Hadamard matrix (ggml may take a faster path for it).
    pub(crate) fn mul_mat_hadamard(&self, a: Tensor, b: Tensor) -> Tensor {
        let y = self.mul_mat(a, b);
        // SAFETY: a live mul_mat node.
        unsafe { sys::ggml_mul_mat_set_hint(y.ptr(), sys::GGML_HINT_SRC0_IS_HADAMARD) };
        y
    }

    /// Rotary embedding (`ggml_rope_ext`) with no YaRN: `freqs` are per-dimension factors
    /// (Llama 3's `rope_freqs`), or none.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope(
        &self,
        a: Tensor,
        pos: Tensor,
        freqs: Option<Tensor>,
        n_rot: usize,
        mode: i32,
        n_ctx_orig: usize,
        base: f32,
        freq_scale: f32,
    ) -> Tensor {
        let freqs = freqs.map_or(std::ptr::null_mut(), Tensor::ptr);
        // SAFETY: as above; a null factor tensor means none.
        self.wrap(unsafe {
            sys::ggml_rope_ext(
                self.raw(),
                a.ptr(),
                pos.ptr(),
                freqs,
                n_rot as i32,
                mode,
                n_ctx_orig as i32,
                base,
                freq_scale,
                0.0,  // ext_factor: no YaRN
                1.0,  // attn_factor
                32.0, // beta_fast
                1.0,  // beta_slow
            )
        })
    }

    pub(crate) fn reshape(&self, a: Tensor, ne: &[i64]) -> Tensor {
        // SAFETY: as above; ggml checks that the element counts agree.
        self.wrap(unsafe {
            match *ne {
                [a0, a1] => sys::ggml_reshape_2d(self.raw(), a.ptr(), a0, a1),
                [a0, a1, a2] => sys::ggml_reshape_3d(self.raw(), a.ptr(), a0, a1, a2),
                [a0, a1, a2, a3] => sys::ggml_reshape_4d(self.raw(), a.ptr(), a0, a1, a2, a3),
                _ => panic!("reshape to {} dimensions", ne.len()),
            }
        })
    }

    /// A view of `ne` elements with strides `nb` (bytes, dimensions 1 and up) at `offset`.
    pub(crate) fn view(&self, a: Tensor, ne: &[i64], nb: &[usize], offset: usize) -> Tensor {
        // SAFETY: as above; ggml checks the view lies inside `a`.
        self.wrap(unsafe {
            match (ne, nb) {
                (&[a0, a1], &[b1]) => sys::ggml_view_2d(self.raw(), a.ptr(), a0, a1, b1, offset),
                (&[a0, a1, a2], &[b1, b2]) => {
                    sys::ggml_view_3d(self.raw(), a.ptr(), a0, a1, a2, b1, b2, offset)
                }
                (&[a0, a1, a2, a3], &[b1, b2, b3]) => {
                    sys::ggml_view_4d(self.raw(), a.ptr(), a0, a1, a2, a3, b1, b2, b3, offset)
                }
                _ => panic!("view of {} dimensions with {} strides", ne.len(), nb.len()),
            }
        })
    }

    pub(crate) fn cont(&self, a: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_cont(self.raw(), a.ptr()) })
    }

    pub(crate) fn permute(&self, a: Tensor, axes: [i32; 4]) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_permute(self.raw(), a.ptr(), axes[0], axes[1], axes[2], axes[3]) })
    }

    pub(crate) fn concat(&self, a: Tensor, b: Tensor, dim: i32) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_concat(self.raw(), a.ptr(), b.ptr(), dim) })
    }

    /// Write the rows of `src` into `dst` at the row indices `ids` (the KV cache append).
    pub(crate) fn set_rows(&self, dst: Tensor, src: Tensor, ids: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_set_rows(self.raw(), dst.ptr(), src.ptr(), ids.ptr()) })
    }

    /// `silu(a) * b`.
    pub(crate) fn swiglu_split(&self, a: Tensor, b: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_swiglu_split(self.raw(), a.ptr(), b.ptr()) })
    }

    /// `silu` of the first half of each row times its second half.
    pub(crate) fn swiglu(&self, a: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_swiglu(self.raw(), a.ptr()) })
    }

    /// `gelu(a) * b`.
    pub(crate) fn geglu_split(&self, a: Tensor, b: Tensor) -> Tensor {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_geglu_split(self.raw(), a.ptr(), b.ptr()) })
    }

    /// ggml's flash attention, accumulating in f32.
    pub(crate) fn flash_attn(&self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: f32) -> Tensor {
        // SAFETY: as above.
        let t = self.wrap(unsafe {
            sys::ggml_flash_attn_ext(self.raw(), q.ptr(), k.ptr(), v.ptr(), mask.ptr(), scale, 0.0, 0.0)
        });
        // SAFETY: a live flash-attention node.
        unsafe { sys::ggml_prec_set_acc(t.ptr(), sys::GGML_PREC_F32) };
        t
    }

    /// A custom op of the kernels (`attention`, `gemm`).
    ///
    /// # Safety
    /// `fun` must be sound to call on a destination of `ty` and shape `ne` with these `srcs`
    /// and `userdata`, from every thread of the pool at once.
    pub(crate) unsafe fn custom(
        &self,
        ty: sys::ggml_type,
        ne: [i64; 4],
        srcs: &[Tensor],
        fun: sys::ggml_custom_op_t,
        userdata: *mut std::ffi::c_void,
    ) -> Tensor {
        let mut args: Vec<*mut sys::ggml_tensor> = srcs.iter().map(|t| t.ptr()).collect();
        // SAFETY: by the caller; ggml copies the sources' pointers into the node.
        self.wrap(unsafe {
            sys::ggml_custom_4d(
                self.raw(),
                ty,
                ne[0],
                ne[1],
                ne[2],
                ne[3],
                args.as_mut_ptr(),
                args.len() as std::ffi::c_int,
                fun,
                -1, // every thread of the pool
                userdata,
            )
        })
    }
}
