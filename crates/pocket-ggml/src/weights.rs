//! Hyperparameters and weights of a decoder, read from a GGUF file and placed on a device.
//!
//! Weights that the device reads straight from host memory stay in the file mapping (the
//! page cache holds them, not anonymous memory). Weights that a faster layout exists for
//! (ggml's CPU "extra" buffer types repack quantized matrices, as llama.cpp does by default)
//! or that live on a GPU are copied once; their pages of the mapping are then released.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;
use memmap2::UncheckedAdvice;

use crate::arch::{self, Hparams, Need, Slot};
use crate::convert::{WeightFormat, convert_matrix};
use crate::ffi::device::{Device, WeightOp, buft_name, cstring};
use crate::ffi::gguf::GgufFile;
use crate::ffi::graph::Tensor;
use crate::{Error, Result};

/// The weights of one layer, by [`Slot`] (those its architecture declares and the file has).
pub(crate) struct LayerWeights {
    tensors: [Option<Tensor>; Slot::ALL.len()],
}

impl LayerWeights {
    /// The tensor in `slot`, if the layer has it.
    pub(crate) fn get(&self, slot: Slot) -> Option<Tensor> {
        self.tensors[slot as usize]
    }

    /// The tensor in `slot`, which the architecture requires (so loading checked it is there).
    pub(crate) fn req(&self, slot: Slot) -> Tensor {
        self.get(slot).unwrap_or_else(|| panic!("{} is required, and was checked at load", slot.name()))
    }
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
    shape: Vec<usize>,
    /// Where it goes: a layer's slot, or (None) a whole-model tensor.
    slot: Option<(usize, Slot)>,
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
        let wanted = wanted(f, hp)?;

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
            check_shape(f, &w.file_name, meta, &w.shape)?;
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

        // SAFETY: the placed tensors live in `weights_contexts`, which the Weights own and
        // free last; graph handles to them never outlive the model (see ffi::graph).
        let handle = |i: usize| placed[i].map(|t| unsafe { Tensor::from_raw(t) });
        let mut layers: Vec<LayerWeights> =
            (0..hp.n_layer).map(|_| LayerWeights { tensors: [None; Slot::ALL.len()] }).collect();
        for (i, w) in wanted.iter().enumerate() {
            if let Some((il, slot)) = w.slot {
                layers[il].tensors[slot as usize] = handle(i);
            }
        }
        let global = |name: &str| wanted.iter().position(|w| w.slot.is_none() && w.file_name == name);
        let req = |i: Option<usize>| i.and_then(handle).expect("required tensors were checked above");
        Ok(Weights {
            tok_embd: req(Some(0)),
            output_norm: req(global("output_norm.weight")),
            // Wanted third, under whichever name holds it (see `wanted`).
            output: req(Some(2)),
            rope_freqs: global("rope_freqs.weight").and_then(handle),
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

/// Whether the graph of `hp.arch` reads every tensor of `f` ([`Error::Unsupported`] if not).
pub(crate) fn check_tensors(f: &GgufFile, hp: &Hparams) -> Result<()> {
    wanted(f, hp).map(drop)
}

/// The tensors the graph of `hp.arch` reads, with their shapes: the token embedding first,
/// the output projection third. A tensor in the file that is not among them means the file
/// has something our graph would leave out, which it refuses.
fn wanted(f: &GgufFile, hp: &Hparams) -> Result<Vec<Wanted>> {
    let mut wanted = Vec::new();
    let [embd, norm, freqs] = arch::global_tensors(hp);
    for (name, op, required, shape) in [embd, norm] {
        wanted.push(Wanted { file_name: name.into(), op, required, shape, slot: None });
    }
    // Tied embeddings: the output projection reads the embedding table as a matrix, so it is
    // a second tensor over the same bytes, placed for a matrix product.
    let output = if f.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let shape = vec![hp.n_embd, hp.n_vocab];
    wanted.push(Wanted { file_name: output.into(), op: WeightOp::MulMat, required: true, shape, slot: None });
    let (name, op, required, shape) = freqs;
    wanted.push(Wanted { file_name: name.into(), op, required, shape, slot: None });
    for il in 0..hp.n_layer {
        let fused = f.tensor(&format!("blk.{il}.{}", Slot::Wqkv.name())).is_some();
        for &(slot, need) in arch::QKV.iter().chain(hp.arch.layer_tensors()) {
            let required = match need {
                Need::Required => true,
                Need::Optional => false,
                Need::UnlessFused => !fused,
            };
            let file_name = format!("blk.{il}.{}", slot.name());
            wanted.push(Wanted {
                file_name,
                op: slot.op(),
                required,
                shape: slot.shape(hp),
                slot: Some((il, slot)),
            });
        }
    }
    let known: std::collections::HashSet<&str> = wanted.iter().map(|w| w.file_name.as_str()).collect();
    if let Some(extra) = f.tensor_names().into_iter().find(|n| !known.contains(n.as_str())) {
        return Err(arch::unsupported(
            f,
            hp,
            format!("tensor {extra}, which our {} graph does not use", hp.arch_name),
        ));
    }
    Ok(wanted)
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
