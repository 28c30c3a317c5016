//! Hyperparameters and weights of a decoder, read from a GGUF file and placed on a device.
//!
//! Weights that the device reads straight from host memory stay in the file mapping (the
//! page cache holds them, not anonymous memory). Weights that a faster layout exists for
//! (ggml's CPU "extra" buffer types repack quantized matrices, as llama.cpp does by default)
//! or that live on a GPU are copied once; their pages of the mapping are then released.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;
use memmap2::UncheckedAdvice;

use crate::convert::{WeightFormat, convert_matrix};
use crate::device::{Device, WeightOp, buft_name, cstring};
use crate::gguf::GgufFile;
use crate::{Error, Result};

/// The architectures this engine builds graphs for.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2"];

/// Architecture-specific choices of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    /// Llama family (SmolLM2, Llama 3.x, TinyLlama): rotary "normal" mode.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v; NeoX rotary mode.
    Qwen2,
}

impl Arch {
    /// ggml's rope mode: 0 = normal (adjacent pairs), 2 = NeoX (halves).
    pub(crate) fn rope_mode(self) -> i32 {
        match self {
            Arch::Llama => 0,
            Arch::Qwen2 => 2,
        }
    }
}

/// Hyperparameters, from the GGUF metadata.
#[derive(Debug, Clone)]
pub(crate) struct Hparams {
    pub(crate) arch: Arch,
    pub(crate) arch_name: String,
    pub(crate) name: String,
    pub(crate) n_layer: usize,
    pub(crate) n_embd: usize,
    pub(crate) n_head: usize,
    pub(crate) n_head_kv: usize,
    pub(crate) head_dim: usize,
    pub(crate) n_ff: usize,
    pub(crate) n_vocab: usize,
    pub(crate) n_ctx_train: usize,
    pub(crate) n_rot: usize,
    pub(crate) rms_eps: f32,
    pub(crate) rope_base: f32,
    pub(crate) rope_freq_scale: f32,
}

impl Hparams {
    pub(crate) fn read(f: &GgufFile) -> Result<Self> {
        let bad = |reason: String| Error::BadModel { path: f.path().to_owned(), reason };
        let arch_name =
            f.get_str("general.architecture").ok_or_else(|| bad("no general.architecture key".into()))?;
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            _ => return Err(Error::UnsupportedArchitecture { arch: arch_name }),
        };
        let a = &arch_name;
        let req = |key: &str| -> Result<usize> {
            let key = format!("{a}.{key}");
            f.get_u64(&key)
                .map(|v| v as usize)
                .filter(|&v| v > 0)
                .ok_or_else(|| bad(format!("missing or zero metadata key {key}")))
        };
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv =
            f.get_u64(&format!("{a}.attention.head_count_kv")).map(|v| v as usize).unwrap_or(n_head);
        let head_dim =
            f.get_u64(&format!("{a}.attention.key_length")).map(|v| v as usize).unwrap_or(n_embd / n_head);
        let n_vocab = f
            .get_u64(&format!("{a}.vocab_size"))
            .map(|v| v as usize)
            .or_else(|| f.get_arr_len("tokenizer.ggml.tokens"))
            .ok_or_else(|| bad("no vocabulary size".into()))?;
        let rope_scale = match f.get_str(&format!("{a}.rope.scaling.type")).as_deref() {
            None | Some("none") => 1.0,
            Some("linear") => {
                1.0 / f.get_f32(&format!("{a}.rope.scaling.factor")).filter(|&x| x > 0.0).unwrap_or(1.0)
            }
            Some(other) => return Err(bad(format!("rope scaling {other:?} is not supported yet"))),
        };
        let hp = Hparams {
            arch,
            name: f.get_str("general.name").unwrap_or_default(),
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: req("feed_forward_length")?,
            n_vocab,
            n_ctx_train: req("context_length")?,
            n_rot: f.get_u64(&format!("{a}.rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
            rms_eps: f.get_f32(&format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            rope_base: f.get_f32(&format!("{a}.rope.freq_base")).unwrap_or(10_000.0),
            rope_freq_scale: rope_scale,
            arch_name,
        };
        if !hp.n_head.is_multiple_of(hp.n_head_kv)
            || !hp.head_dim.is_multiple_of(32)
            || hp.n_layer > pocket_core::MAX_LAYERS
        {
            return Err(bad(format!(
                "unsupported shape: {} heads, {} KV heads, head size {}, {} layers",
                hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_layer
            )));
        }
        Ok(hp)
    }

    /// Width of one token's K (or V) over all KV heads of a layer.
    pub(crate) fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }
}

/// A tensor placed in a backend buffer. A plain handle: the [`Weights`] that own the buffers
/// outlive every graph built from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tensor(pub(crate) NonNull<sys::ggml_tensor>);

impl Tensor {
    pub(crate) fn ptr(self) -> *mut sys::ggml_tensor {
        self.0.as_ptr()
    }
}

/// The weights of one layer.
pub(crate) struct LayerWeights {
    pub(crate) attn_norm: Tensor,
    pub(crate) wq: Tensor,
    pub(crate) wk: Tensor,
    pub(crate) wv: Tensor,
    pub(crate) bq: Option<Tensor>,
    pub(crate) bk: Option<Tensor>,
    pub(crate) bv: Option<Tensor>,
    pub(crate) wo: Tensor,
    pub(crate) ffn_norm: Tensor,
    pub(crate) ffn_gate: Tensor,
    pub(crate) ffn_up: Tensor,
    pub(crate) ffn_down: Tensor,
}

/// All weights of a model, placed in backend buffers.
pub(crate) struct Weights {
    pub(crate) tok_embd: Tensor,
    pub(crate) output_norm: Tensor,
    pub(crate) output: Tensor,
    pub(crate) rope_freqs: Option<Tensor>,
    pub(crate) layers: Vec<LayerWeights>,
    /// Bytes copied out of the mapping (repacked or on a device).
    pub(crate) copied_bytes: u64,
    /// Bytes used in place from the mapping.
    pub(crate) mapped_bytes: u64,
    contexts: Vec<NonNull<sys::ggml_context>>,
    buffers: Vec<NonNull<sys::ggml_backend_buffer>>,
}

// SAFETY: after loading, the weight tensors and their buffers are only read (as graph
// sources), which ggml allows from any thread.
unsafe impl Send for Weights {}
// SAFETY: as for Send.
unsafe impl Sync for Weights {}

impl Drop for Weights {
    fn drop(&mut self) {
        // SAFETY: each buffer and context was created by `load` and is freed exactly once.
        unsafe {
            for b in &self.buffers {
                sys::ggml_backend_buffer_free(b.as_ptr());
            }
            for c in &self.contexts {
                sys::ggml_free(c.as_ptr());
            }
        }
    }
}

/// Tensors going to one buffer: its type, whether they are converted on the way (such a group
/// never stays in the mapping), and (index into the wanted list, description as placed).
type Group = (sys::ggml_backend_buffer_type_t, bool, Vec<(usize, NonNull<sys::ggml_tensor>)>);

/// One weight the graph needs: where it comes from in the file and what uses it.
struct Wanted {
    file_name: String,
    op: WeightOp,
    required: bool,
}

impl Weights {
    /// Place the weights of `f` on `device`, matrices converted to `format`.
    /// `progress(done, total)` is called in bytes as tensors are placed.
    pub(crate) fn load(
        f: &GgufFile,
        hp: &Hparams,
        device: &Device,
        format: WeightFormat,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Weights> {
        let mut wanted: Vec<Wanted> = Vec::new();
        let mut want = |name: String, op, required| wanted.push(Wanted { file_name: name, op, required });
        want("token_embd.weight".into(), WeightOp::GetRows, true);
        want("output_norm.weight".into(), WeightOp::Elementwise, true);
        // Tied embeddings: the output projection reads the embedding table as a matrix, so it
        // is a second tensor over the same bytes, placed for a matrix product.
        let output_name =
            if f.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
        want(output_name.into(), WeightOp::MulMat, true);
        want("rope_freqs.weight".into(), WeightOp::Elementwise, false);
        for i in 0..hp.n_layer {
            for (n, op, req) in [
                ("attn_norm.weight", WeightOp::Elementwise, true),
                ("attn_q.weight", WeightOp::MulMat, true),
                ("attn_k.weight", WeightOp::MulMat, true),
                ("attn_v.weight", WeightOp::MulMat, true),
                ("attn_q.bias", WeightOp::Elementwise, false),
                ("attn_k.bias", WeightOp::Elementwise, false),
                ("attn_v.bias", WeightOp::Elementwise, false),
                ("attn_output.weight", WeightOp::MulMat, true),
                ("ffn_norm.weight", WeightOp::Elementwise, true),
                ("ffn_gate.weight", WeightOp::MulMat, true),
                ("ffn_up.weight", WeightOp::MulMat, true),
                ("ffn_down.weight", WeightOp::MulMat, true),
            ] {
                want(format!("blk.{i}.{n}"), op, req);
            }
        }

        // Descriptions of converted matrices (type changed, shape kept) live here until they
        // are copied into their group's context.
        let converted = ScratchContext::new(wanted.len())?;

        // Group the tensors by the buffer type each goes to.
        let mut groups: Vec<Group> = Vec::new();
        let mut placed: Vec<Option<NonNull<sys::ggml_tensor>>> = vec![None; wanted.len()];
        for (i, w) in wanted.iter().enumerate() {
            let Some(meta) = f.tensor(&w.file_name) else {
                if w.required {
                    return Err(Error::BadModel {
                        path: f.path().to_owned(),
                        reason: format!("tensor {} is missing", w.file_name),
                    });
                }
                continue;
            };
            check_shape(f, &w.file_name, meta, &expected_shape(hp, &w.file_name))?;
            // SAFETY: a valid description from the GGUF context.
            let (ty, ne) = unsafe { ((*meta.as_ptr()).type_, (*meta.as_ptr()).ne) };
            let target = if w.op == WeightOp::MulMat { format.target(ty, ne[0]) } else { ty };
            let convert = target != ty;
            let desc = if convert { converted.matrix(target, ne[0], ne[1])? } else { meta };
            // The token embedding is only gathered from: it stays in host memory on every device.
            let buft = if w.op == WeightOp::GetRows {
                // SAFETY: registry device.
                unsafe { sys::ggml_backend_dev_buffer_type(device.cpu) }
            } else {
                device.weight_buft(desc, w.op)
            };
            match groups.iter_mut().find(|(b, c, _)| *b == buft && *c == convert) {
                Some((_, _, list)) => list.push((i, desc)),
                None => groups.push((buft, convert, vec![(i, desc)])),
            }
        }

        let total: u64 = groups
            .iter()
            .flat_map(|(_, _, list)| list.iter())
            .map(|&(i, _)| f.tensor_bytes(&wanted[i].file_name).map_or(0, |b| b.len() as u64))
            .sum();
        let mut weights_contexts = Vec::new();
        let mut buffers = Vec::new();
        let mut copied_bytes = 0u64;
        let mut mapped_bytes = 0u64;
        let mut counted_tied: *const u8 = std::ptr::null();
        // Bytes of the file placed so far, for `progress` (converted weights differ in size).
        let mut file_done = 0u64;
        // SAFETY: registry device.
        let cpu_buft = unsafe { sys::ggml_backend_dev_buffer_type(device.cpu) };
        for (buft, convert, list) in &groups {
            // SAFETY: a fresh no_alloc context sized for the tensor descriptions it will hold.
            let ctx = unsafe {
                sys::ggml_init(sys::ggml_init_params {
                    mem_size: sys::ggml_tensor_overhead() * (list.len() + 1),
                    mem_buffer: std::ptr::null_mut(),
                    no_alloc: true,
                })
            };
            let ctx = NonNull::new(ctx).ok_or_else(|| Error::Ggml("ggml_init failed".into()))?;
            weights_contexts.push(ctx);
            let mut tensors = Vec::with_capacity(list.len());
            for &(i, meta) in list {
                // SAFETY: ctx has room for list.len() descriptions; meta is a valid description.
                let t = unsafe { sys::ggml_dup_tensor(ctx.as_ptr(), meta.as_ptr()) };
                let name = cstring(&wanted[i].file_name);
                // SAFETY: t is valid; ggml copies the name.
                unsafe { sys::ggml_set_name(t, name.as_ptr()) };
                let t = NonNull::new(t).ok_or_else(|| Error::Ggml("ggml_dup_tensor failed".into()))?;
                tensors.push((i, t));
                placed[i] = Some(t);
            }
            // On the CPU, weights in plain host memory are used where they lie in the mapping.
            let in_place = device.is_cpu() && *buft == cpu_buft && !convert;
            if in_place {
                let mmap = f.mmap();
                let max = list.iter().map(|&(_, m)| {
                    // SAFETY: valid description.
                    unsafe { sys::ggml_nbytes(m.as_ptr()) }
                });
                let max = max.max().unwrap_or(0);
                // SAFETY: the mapping outlives the buffer (both owned by the model, buffer freed
                // first); ggml only reads weights. The pointer is page-aligned.
                let buf = unsafe {
                    sys::ggml_backend_dev_buffer_from_host_ptr(
                        device.cpu,
                        mmap.as_ptr() as *mut _,
                        mmap.len(),
                        max,
                    )
                };
                let buf = NonNull::new(buf)
                    .ok_or_else(|| Error::Ggml("cannot wrap the file mapping in a ggml buffer".into()))?;
                buffers.push(buf);
                for &(i, t) in &tensors {
                    let bytes = f.tensor_bytes(&wanted[i].file_name).expect("tensor exists");
                    // SAFETY: `bytes` lies inside the buffer's memory (the mapping) and has the
                    // tensor's size; the tensor is not yet allocated.
                    let status = unsafe {
                        sys::ggml_backend_tensor_alloc(buf.as_ptr(), t.as_ptr(), bytes.as_ptr() as *mut _)
                    };
                    if status != sys::GGML_STATUS_SUCCESS {
                        return Err(Error::Ggml(format!("placing {} failed", wanted[i].file_name)));
                    }
                    // A tied embedding is two tensors over one range: count its bytes once.
                    if !std::ptr::eq(bytes.as_ptr(), counted_tied) {
                        mapped_bytes += bytes.len() as u64;
                    }
                    if wanted[i].file_name == "token_embd.weight" {
                        counted_tied = bytes.as_ptr();
                    }
                    file_done += bytes.len() as u64;
                    progress(file_done, total);
                }
            } else {
                // SAFETY: ctx holds only this group's descriptions; ggml allocates one buffer.
                let buf = unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.as_ptr(), *buft) };
                let buf = NonNull::new(buf)
                    .ok_or_else(|| Error::Ggml(format!("cannot allocate weights in {}", buft_name(*buft))))?;
                buffers.push(buf);
                for &(i, t) in &tensors {
                    let name = &wanted[i].file_name;
                    let bytes = f.tensor_bytes(name).expect("tensor exists");
                    if *convert {
                        let meta = f.tensor(name).expect("tensor exists");
                        // SAFETY: valid descriptions (the file's and the placed one).
                        let (from, to, ne) =
                            unsafe { ((*meta.as_ptr()).type_, (*t.as_ptr()).type_, (*t.as_ptr()).ne) };
                        convert_matrix(from, to, bytes, ne[0] as usize, ne[1] as usize, &mut |at, chunk| {
                            // SAFETY: the tensor is allocated with its converted size, and
                            // convert_matrix hands out consecutive chunks that tile it.
                            unsafe {
                                sys::ggml_backend_tensor_set(
                                    t.as_ptr(),
                                    chunk.as_ptr().cast(),
                                    at,
                                    chunk.len(),
                                )
                            };
                        });
                        // SAFETY: a placed tensor.
                        copied_bytes += unsafe { sys::ggml_nbytes(t.as_ptr()) } as u64;
                    } else {
                        // SAFETY: the tensor is allocated with exactly bytes.len() bytes (same
                        // type and shape as in the file); the buffer type repacks while copying.
                        unsafe {
                            sys::ggml_backend_tensor_set(
                                t.as_ptr(),
                                bytes.as_ptr() as *const _,
                                0,
                                bytes.len(),
                            )
                        };
                        copied_bytes += bytes.len() as u64;
                    }
                    file_done += bytes.len() as u64;
                    progress(file_done, total);
                    let offset = bytes.as_ptr() as usize - f.mmap().as_ptr() as usize;
                    // SAFETY: the range is inside the mapping and nothing borrows it any more:
                    // dropping pages of a read-only file mapping only makes later reads fault
                    // them in again.
                    let _ = unsafe {
                        f.mmap().unchecked_advise_range(UncheckedAdvice::DontNeed, offset, bytes.len())
                    };
                }
            }
            tracing::debug!(buffer = %buft_name(*buft), tensors = list.len(), in_place, "placed weights");
        }

        let get = |idx: usize| placed[idx].map(Tensor);
        // Wanted entries were pushed in a fixed order; index arithmetic mirrors it.
        let req = |idx: usize| get(idx).expect("required tensors were checked above");
        let layers = (0..hp.n_layer)
            .map(|l| {
                let b = 4 + l * 12;
                LayerWeights {
                    attn_norm: req(b),
                    wq: req(b + 1),
                    wk: req(b + 2),
                    wv: req(b + 3),
                    bq: get(b + 4),
                    bk: get(b + 5),
                    bv: get(b + 6),
                    wo: req(b + 7),
                    ffn_norm: req(b + 8),
                    ffn_gate: req(b + 9),
                    ffn_up: req(b + 10),
                    ffn_down: req(b + 11),
                }
            })
            .collect();
        Ok(Weights {
            tok_embd: req(0),
            output_norm: req(1),
            output: req(2),
            rope_freqs: get(3),
            layers,
            copied_bytes,
            mapped_bytes,
            contexts: weights_contexts,
            buffers,
        })
    }
}

/// A no_alloc ggml context for tensor descriptions, freed on drop.
struct ScratchContext(NonNull<sys::ggml_context>);

impl ScratchContext {
    fn new(capacity: usize) -> Result<Self> {
        // SAFETY: a fresh no_alloc context sized for `capacity` descriptions.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (capacity + 1),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        NonNull::new(ctx).map(ScratchContext).ok_or_else(|| Error::Ggml("ggml_init failed".into()))
    }

    /// A description of an `ne0 × ne1` matrix of type `ty`.
    fn matrix(&self, ty: sys::ggml_type, ne0: i64, ne1: i64) -> Result<NonNull<sys::ggml_tensor>> {
        // SAFETY: the context was sized for every wanted tensor; ggml only records the shape.
        let t = unsafe { sys::ggml_new_tensor_2d(self.0.as_ptr(), ty, ne0, ne1) };
        NonNull::new(t).ok_or_else(|| Error::Ggml("ggml_new_tensor_2d failed".into()))
    }
}

impl Drop for ScratchContext {
    fn drop(&mut self) {
        // SAFETY: created by `new`, freed once; the descriptions in it were only copied.
        unsafe { sys::ggml_free(self.0.as_ptr()) };
    }
}

/// The shape (ne0, ne1) the graph expects of a weight; a mismatch would make ggml abort, so it
/// is an error at load time instead.
fn expected_shape(hp: &Hparams, name: &str) -> Vec<usize> {
    let q = hp.n_head * hp.head_dim;
    let kv = hp.n_embd_kv();
    let base = name.rsplit_once('.').map_or(name, |(b, _)| b);
    let base = base.rsplit('.').next().unwrap_or(base);
    let is_bias = name.ends_with(".bias");
    match (base, is_bias) {
        ("token_embd", _) | ("output", _) => vec![hp.n_embd, hp.n_vocab],
        ("output_norm", _) | ("attn_norm", _) | ("ffn_norm", _) => vec![hp.n_embd],
        ("attn_q", false) => vec![hp.n_embd, q],
        ("attn_q", true) => vec![q],
        ("attn_k", false) | ("attn_v", false) => vec![hp.n_embd, kv],
        ("attn_k", true) | ("attn_v", true) => vec![kv],
        ("attn_output", _) => vec![q, hp.n_embd],
        ("ffn_gate", _) | ("ffn_up", _) => vec![hp.n_embd, hp.n_ff],
        ("ffn_down", _) => vec![hp.n_ff, hp.n_embd],
        ("rope_freqs", _) => vec![hp.n_rot / 2],
        _ => vec![],
    }
}

fn check_shape(f: &GgufFile, name: &str, t: NonNull<sys::ggml_tensor>, want: &[usize]) -> Result<()> {
    // SAFETY: a valid tensor description.
    let ne = unsafe { (*t.as_ptr()).ne };
    let mut got: Vec<usize> = ne.iter().map(|&n| n as usize).collect();
    while got.len() > 1 && got.last() == Some(&1) {
        got.pop();
    }
    if !want.is_empty() && got != want {
        return Err(Error::BadModel {
            path: f.path().to_owned(),
            reason: format!("tensor {name} has shape {got:?}, the metadata implies {want:?}"),
        });
    }
    Ok(())
}
