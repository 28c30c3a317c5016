//! Timing the kernels alone, against ggml's one-row kernel (for repacked Q4_K, its
//! one-token kernel), on random data: what `cargo bench -p pocket-ggml --bench kernels`
//! prints, so that a board's owner can see them on the device.

use std::time::Instant;

use llama_cpp_sys_2 as sys;

use super::{Quant, Rows, Work, gemm, isa, quantizer};

/// One format at one number of activation rows.
#[derive(Debug, Clone)]
pub struct KernelTiming {
    /// The weight format (`q4_K`, `q5_0`, ...).
    pub format: &'static str,
    /// Weight rows × weights per row.
    pub shape: (usize, usize),
    /// Activation rows.
    pub rows: usize,
    /// Seconds for the product by all rows with our kernel, or `None` where this CPU has none.
    pub ours_seconds: Option<f64>,
    /// Seconds for the same with ggml's one-row kernel, once per (weight row, activation row)
    /// (for repacked Q4_K, its one-token kernel once per activation row), or `None` where not
    /// timed (prompt-sized passes).
    pub one_row_seconds: Option<f64>,
    /// Seconds for the same with ggml's own `mul_mat`, as llama.cpp runs it on this CPU (see
    /// [`ggml_mul_mat_seconds`]), or `None` where ggml could not be run so.
    pub ggml_seconds: Option<f64>,
    /// Bytes of weights read.
    pub weight_bytes: usize,
}

impl KernelTiming {
    /// Multiply-adds ×2 per second of our kernel (NaN where we have none).
    pub fn gflops(&self) -> f64 {
        let (m, k) = self.shape;
        2.0 * (m * k * self.rows) as f64 / self.ours_seconds.unwrap_or(f64::NAN) / 1e9
    }

    /// Weight bytes read per second by our kernel (each weight is read once per call).
    pub fn gbytes_per_second(&self) -> f64 {
        self.weight_bytes as f64 / self.ours_seconds.unwrap_or(f64::NAN) / 1e9
    }
}

/// The instructions our kernels use on this CPU (`avx2`, `avxvnni`, `avx512`; `neon`,
/// `neon-sdot-permuted`, `neon-dotprod`), or `None`.
pub fn kernel_isa() -> Option<&'static str> {
    isa().map(|i| i.name())
}

/// Activation rows up to which the one-row kernel is timed too (beyond, only ours and ggml's
/// `mul_mat`: the one-row kernel's time is linear in the rows).
pub(crate) const ONE_ROW_UP_TO: usize = 16;

/// [`super::time_kernel`] for one of ggml's formats (a [`Quant`] by name).
pub(crate) fn time_stored(
    format: &str,
    m: usize,
    k: usize,
    rows: &[usize],
    reps: usize,
) -> Option<Vec<KernelTiming>> {
    let quant = Quant::ALL.into_iter().find(|q| q.name() == format)?;
    if !k.is_multiple_of(quant.block_len()) || m == 0 {
        return None;
    }
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let (w, y) = random_operands(quant, m, max_rows, k, 7);
    // SAFETY: a pure function of a type and a length.
    let weight_bytes = unsafe { sys::ggml_row_size(quant.ggml(), k as i64) } * m;
    let mut out = vec![0f32; m * max_rows];
    let mut work = Work::default();
    let best = |f: &mut dyn FnMut()| best_of(reps, f);
    Some(
        rows.iter()
            .zip(ggml_mul_mat_seconds(quant.ggml(), &w, (m, k), rows, reps))
            .map(|(&n, ggml_seconds)| {
                let one_row_seconds = (n <= ONE_ROW_UP_TO).then(|| {
                    best(&mut || {
                        for c in 0..n {
                            for r in 0..m {
                                out[c * m + r] = one_row_dot(quant, &w, &y, k, r, c);
                            }
                        }
                    })
                });
                let ours_seconds = isa().map(|isa| {
                    best(&mut || {
                        let call = Rows { w: w.as_ptr().cast(), y: y.as_ptr().cast(), k, n, range: 0..m };
                        // SAFETY: an instruction set this CPU has; the operands hold m and n
                        // rows of k; out holds m × n.
                        unsafe { gemm(isa, quant, call, out.as_mut_ptr(), m, &mut work) };
                    })
                });
                KernelTiming {
                    format: quant.name(),
                    shape: (m, k),
                    rows: n,
                    ours_seconds,
                    one_row_seconds,
                    ggml_seconds,
                    weight_bytes,
                }
            })
            .collect(),
    )
}

/// ggml's own `mul_mat` of `w` (`m × k` weights of type `ty`, stored layout) by `n` rows of
/// f32 activations, for each `n` of `rows`, as llama.cpp runs it on the CPU: the weights in
/// the buffer ggml's CPU backend prefers for them (repacked where it repacks that format), in
/// a graph of its CPU backend on one thread. What it takes is ggml's choice: its repacked
/// kernels, llamafile's tiled kernels, its tiled K-quant kernels (off in this process unless
/// `GGML_CPU_TILED_MM=1` was set before the first use of ggml) or one-row dot products. The
/// best of `reps` runs each; `None` for a size ggml could not run.
pub(crate) fn ggml_mul_mat_seconds(
    ty: sys::ggml_type,
    w: &[u64],
    (m, k): (usize, usize),
    rows: &[usize],
    reps: usize,
) -> Vec<Option<f64>> {
    use crate::ffi::arena::Arena;
    use crate::ffi::device::{Device, DeviceChoice, Repack, WeightOp};
    use crate::ffi::graph::Ctx;
    use crate::ffi::sched::Scheduler;

    let setup = || -> Option<(Arena, crate::ffi::graph::Tensor, Device)> {
        let device = Device::select(&DeviceChoice::Cpu, Repack::All, || None).ok()?;
        let mut arena = Arena::new(1).ok()?;
        let t = arena.matrix(ty, k, m).ok()?;
        arena.alloc_in(device.weight_buft(t, WeightOp::MulMat)).ok()?;
        // SAFETY: the words' bytes, at least as many as the matrix holds (checked).
        let bytes =
            unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), t.nbytes().min(w.len() * 8)) };
        (bytes.len() == t.nbytes()).then_some(())?;
        // ggml repacks while copying, where the buffer is a repacking one.
        t.write_at(0, bytes).ok()?;
        Some((arena, t, device))
    };
    let Some((_arena, t, device)) = setup() else { return vec![None; rows.len()] };
    let Ok(sched) = Scheduler::new(&device, pocket_core::Threads::Fixed(1), 8) else {
        return vec![None; rows.len()];
    };
    let mut state = 0x5eed_u64;
    let most = rows.iter().copied().max().unwrap_or(1);
    let x: Vec<f32> = (0..most * k)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    rows.iter()
        .map(|&n| {
            let ctx = Ctx::new(Vec::new(), 8).ok()?;
            let input = ctx.input(sys::GGML_TYPE_F32, &[k as i64, n as i64], "x");
            let product = ctx.mul_mat(t, input);
            ctx.output(product);
            ctx.expand(product);
            sched.alloc(&ctx).then_some(())?;
            input.set_data(&x[..n * k]).ok()?;
            sched.compute(&ctx).ok()?;
            Some(best_of(reps, &mut || {
                let _ = sched.compute(&ctx);
            }))
        })
        .collect()
}

/// The fastest of `reps` runs of `f`, in seconds.
pub(crate) fn best_of(reps: usize, f: &mut dyn FnMut()) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Random weights (`rows × k`, quantized to `quant` by ggml) and activations (`cols × k`,
/// quantized as ggml's `mul_mat` quantizes them), as raw bytes.
pub(crate) fn random_operands(
    quant: Quant,
    rows: usize,
    cols: usize,
    k: usize,
    seed: u64,
) -> (Vec<u64>, Vec<u64>) {
    let mut state = seed;
    let mut rand = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    let wf: Vec<f32> = (0..rows * k).map(|_| rand()).collect();
    let yf: Vec<f32> = (0..cols * k).map(|_| rand() * 3.0).collect();
    // SAFETY: pure functions of types and lengths.
    let (w_row, y_row) = unsafe {
        (sys::ggml_row_size(quant.ggml(), k as i64), sys::ggml_row_size(quant.activations(), k as i64))
    };
    let mut w = vec![0u64; (rows * w_row).div_ceil(8)];
    let mut y = vec![0u64; (cols * y_row).div_ceil(8)];
    // SAFETY: buffers sized for the rows; ggml's quantizers.
    unsafe {
        sys::ggml_quantize_chunk(
            quant.ggml(),
            wf.as_ptr(),
            w.as_mut_ptr().cast(),
            0,
            rows as i64,
            k as i64,
            std::ptr::null(),
        );
        let quantize = quantizer(quant.activations());
        for c in 0..cols {
            quantize(yf[c * k..].as_ptr(), y.as_mut_ptr().cast::<u8>().add(c * y_row).cast(), k as i64);
        }
    }
    (w, y)
}

/// ggml's one-row kernel on weight row `r` and activation row `c` of [`random_operands`].
pub(crate) fn one_row_dot(quant: Quant, w: &[u64], y: &[u64], k: usize, r: usize, c: usize) -> f32 {
    let mut s = 0f32;
    // SAFETY: one row of each, inside the buffers; ggml's own one-row kernel.
    unsafe {
        let (w_row, y_row) =
            (sys::ggml_row_size(quant.ggml(), k as i64), sys::ggml_row_size(quant.activations(), k as i64));
        assert!((r + 1) * w_row <= w.len() * 8 && (c + 1) * y_row <= y.len() * 8);
        let dot = (*sys::ggml_get_type_traits_cpu(quant.ggml()))
            .vec_dot
            .expect("every format has a one-row kernel");
        let wp = w.as_ptr().cast::<u8>().add(r * w_row);
        let yp = y.as_ptr().cast::<u8>().add(c * y_row);
        dot(k as i32, &mut s, 0, wp.cast(), 0, yp.cast(), 0, 1);
    }
    s
}
