//! Q4_K matrices in ggml's repacked CPU layout, on x86 with AVX2.
//!
//! ggml's CPU backend can repack Q4_K matrices into `block_q4_Kx8` (8 rows' super-blocks
//! interleaved) when they are loaded, as llama.cpp does by default. Its one-token kernel on
//! that layout (`ggml_gemv_q4_K_8x8_q8_K`) decodes Qwen2.5-Coder-1.5B's Q4_K_M about 30%
//! faster here than its one-row kernel on the stored layout, but its several-token kernel
//! rounds otherwise, so a verification pass would not compute each row as decoding that token
//! alone does. So: Q4_K matrices are repacked, a single token goes through ggml's gemv, and a
//! pass of two or more tokens through our kernel (`x86::q4_k_x8`), which gives every element
//! bitwise what the gemv gives (probed once, at start).
//!
//! On ARM ggml picks other layouts (4 bytes interleaved with the dot-product instructions, 8
//! with i8mm) and repacks Q5_K, Q6_K and Q8_0 as well; there the matrices stay as stored for
//! our NEON kernels.

#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::*;

/// Nowhere but on x86-64 are matrices repacked for our kernels.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn buffer_type() -> Option<llama_cpp_sys_2::ggml_backend_buffer_type_t> {
    None
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn applies(_: crate::ffi::graph::Tensor, _: crate::ffi::graph::Tensor) -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn is_repacked(_: crate::ffi::graph::Tensor) -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn mul_mat(
    _: &crate::ffi::graph::Ctx,
    _: crate::ffi::graph::Tensor,
    _: crate::ffi::graph::Tensor,
) -> crate::ffi::graph::Tensor {
    unreachable!("`applies` is false off x86-64")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn time(
    _: usize,
    _: usize,
    _: &[usize],
    _: usize,
) -> Option<Vec<crate::gemm::timing::KernelTiming>> {
    None
}

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_int, c_void};
    use std::sync::OnceLock;

    use llama_cpp_sys_2 as sys;

    use crate::ffi::arena::Arena;
    use crate::ffi::chunks::{Chunks, chunk_size};
    use crate::ffi::device::cpu_repack_buffer_type;
    use crate::ffi::graph::{Ctx, Tensor};
    use crate::gemm::{Isa, Quant, Rows, WORK, Work, isa, timing, x86};

    unsafe extern "C" {
        /// ggml's one-token kernel on a repacked Q4_K matrix (`ggml-cpu/arch/x86/repack.cpp`):
        /// `s[r] = dot(row r, the activation row at vy)` for `nc` rows (a multiple of 8) of
        /// `n` weights; `nr` must be 1 and `bs` is unused. What ggml's `mul_mat` runs for one
        /// token; here only to check our kernel against it.
        fn ggml_gemv_q4_K_8x8_q8_K(
            n: c_int,
            s: *mut f32,
            bs: usize,
            vx: *const c_void,
            vy: *const c_void,
            nr: c_int,
            nc: c_int,
        );
    }

    /// A buffer type handle that may be kept in a static (ggml's buffer types are static
    /// objects, never freed, used from any thread).
    #[derive(Clone, Copy)]
    struct Buft(sys::ggml_backend_buffer_type_t);
    // SAFETY: see the type's comment.
    unsafe impl Send for Buft {}
    // SAFETY: as for Send.
    unsafe impl Sync for Buft {}

    /// ggml's repacking buffer type, where Q4_K matrices go: on a CPU with our kernels
    /// (AVX2), where ggml repacks Q4_K to `block_q4_Kx8` and our kernel agreed with its gemv,
    /// bit for bit, on a probe. `None` elsewhere (the matrices stay as stored), or when
    /// `POCKET_GGML_REPACK=0`.
    pub(crate) fn buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
        static BUFT: OnceLock<Option<Buft>> = OnceLock::new();
        BUFT.get_or_init(|| {
            if std::env::var_os("POCKET_GGML_REPACK").is_some_and(|v| v == "0") {
                return None;
            }
            // Where `isa()` finds kernels, ggml was built with AVX2 and FMA and the CPU has
            // them: ggml's gemv on this layout takes its AVX2 branch, which ours follows.
            isa()?;
            let buft = cpu_repack_buffer_type()?;
            let agrees = agrees_with_ggml(buft);
            if !agrees {
                tracing::warn!(
                    "our kernel on ggml's repacked Q4_K does not round as this build of ggml does; Q4_K matrices stay as stored"
                );
            }
            agrees.then_some(Buft(buft))
        })
        .map(|b| b.0)
    }

    /// Whether [`mul_mat`] computes `w · x`: `w` a Q4_K matrix repacked by ggml (in
    /// [`buffer_type`]), `x` two or more f32 rows.
    pub(crate) fn applies(w: Tensor, x: Tensor) -> bool {
        is_repacked(w) && crate::gemm::several_rows_for(w, x)
    }

    /// Whether `w` is a Q4_K matrix ggml repacked, of a shape [`mul_mat`] takes.
    pub(crate) fn is_repacked(w: Tensor) -> bool {
        let Some(buft) = buffer_type() else { return false };
        // SAFETY: live tensors (graph handles); reading where a weight's data lies.
        let repacked = unsafe {
            let raw = &*w.ptr();
            !raw.extra.is_null()
                && !raw.buffer.is_null()
                && sys::ggml_backend_buffer_get_type(raw.buffer) == buft
        };
        let wn = w.ne();
        repacked
            && w.ty() == sys::GGML_TYPE_Q4_K
            && wn[0] % 256 == 0
            && wn[1] % 8 == 0
            && wn[2] == 1
            && wn[3] == 1
    }

    /// `w · x` as a ggml custom op, `x` quantized to Q8_K: `[w.ne1, x.ne1]` f32. The matrix
    /// is passed in the op's userdata (its chunks' parameter), not as a source: ggml's CPU
    /// backend hands an op with a source in a repacking buffer to that buffer type, which runs
    /// only `mul_mat`. Weights are placed before any graph is built and outlive every graph of
    /// their model, so the scheduler needs no edge to them. Call only where [`applies`] holds.
    pub(crate) fn mul_mat(ctx: &Ctx, w: Tensor, xq: Tensor) -> Tensor {
        // SAFETY: `compute` reads the repacked matrix `w` (alive as long as the model, which
        // outlives its graphs) and rows of Q8_K of the shapes `applies` checked, and chunks of
        // the graph's (its user data); each thread writes the rows of the chunks it claims.
        unsafe {
            ctx.custom(
                sys::GGML_TYPE_F32,
                [w.ne()[1], xq.ne()[1], 1, 1],
                &[xq],
                Some(compute),
                ctx.chunks(w.ptr() as u64),
            )
        }
    }

    /// The custom op's body on thread `ith` of `nth`: chunks of groups of 8 weight rows,
    /// claimed one after another (`userdata` is the graph's [`Chunks`] for the node, holding
    /// the matrix), times every activation row — so that a thread the OS let run late does not
    /// hold the others at the next barrier with a share fixed in advance.
    ///
    /// # Safety
    /// Only ggml calls it, from its CPU backend's threads, with `dst` the node this module
    /// built (its sources as set there) and `userdata` that node's [`Chunks`].
    unsafe extern "C" fn compute(dst: *mut sys::ggml_tensor, _ith: c_int, nth: c_int, userdata: *mut c_void) {
        let Some(isa) = isa() else { return };
        // SAFETY: ggml calls this with the tensor `mul_mat` built: the Q8_K rows in src 0, the
        // chunks with the matrix as userdata; `applies` checked their types and shapes. Each
        // chunk is claimed by one thread, which writes its rows of dst.
        unsafe {
            let chunks = &*userdata.cast::<Chunks>();
            let (w, y) = (&*(chunks.data as *const sys::ggml_tensor), &*(*dst).src[0]);
            let (k, m, n) = (w.ne[0] as usize, w.ne[1] as usize, y.ne[1] as usize);
            let chunk = chunk_size(m, nth.max(1) as usize).next_multiple_of(8);
            WORK.with_borrow_mut(|work| {
                for range in chunks.ranges(m, chunk) {
                    let rows =
                        Rows { w: w.data.cast_const().cast(), y: y.data.cast_const().cast(), k, n, range };
                    x86::q4_k_x8::gemm(isa, &rows, (*dst).data.cast(), m, work);
                }
            });
        }
    }

    /// A Q4_K matrix repacked by ggml, for tests and timing.
    pub(crate) struct Repacked {
        /// Holds the matrix's buffer.
        _arena: Arena,
        data: *const c_void,
        m: usize,
        k: usize,
    }

    impl Repacked {
        /// `m` rows of `k` Q4_K weights (`w`, stored layout) repacked by ggml in `buft`.
        pub(crate) fn new(
            buft: sys::ggml_backend_buffer_type_t,
            w: &[u64],
            m: usize,
            k: usize,
        ) -> Option<Repacked> {
            let mut arena = Arena::new(1).ok()?;
            let t = arena.matrix(sys::GGML_TYPE_Q4_K, k, m).ok()?;
            arena.alloc_in(buft).ok()?;
            assert!(w.len() * 8 >= t.nbytes() && k.is_multiple_of(256) && m.is_multiple_of(8));
            // SAFETY: the words' bytes, as many as the matrix holds (checked).
            let bytes = unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), t.nbytes()) };
            // ggml repacks while copying.
            t.write_at(0, bytes).ok()?;
            // SAFETY: a placed tensor of a host buffer: its data is the repacked matrix.
            let data = unsafe { (*t.ptr()).data.cast_const() };
            Some(Repacked { _arena: arena, data, m, k })
        }

        /// ggml's gemv for each of `n` rows of Q8_K (`y`): `out[c * m + r]`.
        pub(crate) fn gemv(&self, y: &[u64], n: usize, out: &mut [f32]) {
            let (m, k) = (self.m, self.k);
            // SAFETY: a pure function of a type and a length.
            let y_row = unsafe { sys::ggml_row_size(sys::GGML_TYPE_Q8_K, k as i64) };
            assert!(y.len() * 8 >= n * y_row && out.len() >= m * n);
            for c in 0..n {
                // SAFETY: the repacked matrix of m rows of k and one Q8_K row of k (checked);
                // m outputs (checked).
                unsafe {
                    let yc = y.as_ptr().cast::<u8>().add(c * y_row);
                    ggml_gemv_q4_K_8x8_q8_K(
                        k as c_int,
                        out.as_mut_ptr().add(c * m),
                        0,
                        self.data,
                        yc.cast(),
                        1,
                        m as c_int,
                    );
                }
            }
        }

        /// Our kernel with `isa`'s instructions (one this CPU has, as [`isa`] finds them) on
        /// rows `range` (whole groups of 8) by `n` rows of Q8_K: `out[c * m + r]`.
        pub(crate) fn ours(
            &self,
            isa: Isa,
            y: &[u64],
            n: usize,
            range: std::ops::Range<usize>,
            out: &mut [f32],
            work: &mut Work,
        ) {
            // SAFETY: a pure function of a type and a length.
            let y_row = unsafe { sys::ggml_row_size(sys::GGML_TYPE_Q8_K, self.k as i64) };
            assert!(y.len() * 8 >= n * y_row && out.len() >= self.m * n && range.end <= self.m);
            assert!(range.start.is_multiple_of(8) && range.end.is_multiple_of(8));
            let rows = Rows { w: self.data.cast(), y: y.as_ptr().cast(), k: self.k, n, range };
            // SAFETY: the CPU has isa's instructions (by the caller); the operands
            // hold the rows (checked); out holds m × n.
            unsafe { x86::q4_k_x8::gemm(isa, &rows, out.as_mut_ptr(), self.m, work) };
        }
    }

    /// `out[c * m + r]`, ggml's gemv and ours, for `m` rows of a Q4_K matrix (`w`, stored
    /// layout) repacked by ggml in `buft`, times `n` rows of Q8_K (`y`), `k` weights each.
    /// Ours, with `isa`'s instructions, computes rows `..split` and `split..` in two calls, as
    /// two threads would.
    pub(crate) fn both(
        isa: Isa,
        buft: sys::ggml_backend_buffer_type_t,
        w: &[u64],
        y: &[u64],
        (m, n, k): (usize, usize, usize),
        split: usize,
    ) -> Option<(Vec<f32>, Vec<f32>)> {
        let matrix = Repacked::new(buft, w, m, k)?;
        let mut gemv = vec![f32::NAN; m * n];
        matrix.gemv(y, n, &mut gemv);
        let mut ours = vec![f32::NAN; m * n];
        let mut work = Work::default();
        for range in [0..split, split..m] {
            matrix.ours(isa, y, n, range, &mut ours, &mut work);
        }
        Some((gemv, ours))
    }

    /// [`crate::gemm::time_kernel`] for repacked Q4_K: ours against ggml's gemv once per token.
    pub(crate) fn time(m: usize, k: usize, rows: &[usize], reps: usize) -> Option<Vec<timing::KernelTiming>> {
        if !(k.is_multiple_of(256) && m.is_multiple_of(8) && m > 0) {
            return None;
        }
        let (buft, isa) = (buffer_type()?, isa()?);
        let max_rows = rows.iter().copied().max().unwrap_or(1);
        let (w, y) = timing::random_operands(Quant::Q4K, m, max_rows, k, 7);
        let matrix = Repacked::new(buft, &w, m, k)?;
        // SAFETY: a pure function of a type and a length.
        let weight_bytes = unsafe { sys::ggml_row_size(sys::GGML_TYPE_Q4_K, k as i64) } * m;
        let mut out = vec![0f32; m * max_rows];
        let mut work = Work::default();
        let ggml = timing::ggml_mul_mat_seconds(sys::GGML_TYPE_Q4_K, &w, (m, k), rows, reps);
        Some(
            rows.iter()
                .zip(ggml)
                .map(|(&n, ggml_seconds)| timing::KernelTiming {
                    format: "q4_Kx8",
                    shape: (m, k),
                    rows: n,
                    one_row_seconds: (n <= timing::ONE_ROW_UP_TO)
                        .then(|| timing::best_of(reps, &mut || matrix.gemv(&y, n, &mut out))),
                    ours_seconds: Some(timing::best_of(reps, &mut || {
                        matrix.ours(isa, &y, n, 0..m, &mut out, &mut work)
                    })),
                    ggml_seconds,
                    weight_bytes,
                })
                .collect(),
        )
    }

    /// Whether our kernel gives ggml's gemv results bit for bit on random operands: 16 rows
    /// (two groups) × 5 tokens (tiles of 3 and 2) of 3 super-blocks.
    fn agrees_with_ggml(buft: sys::ggml_backend_buffer_type_t) -> bool {
        let (m, n, k) = (16, 5, 3 * 256);
        let (w, y) = timing::random_operands(Quant::Q4K, m, n, k, 0x5eed);
        let Some(isa) = isa() else { return false };
        both(isa, buft, &w, &y, (m, n, k), 8)
            .is_some_and(|(gemv, ours)| gemv.iter().zip(&ours).all(|(a, b)| a.to_bits() == b.to_bits()))
    }
}
