//! Hyperparameters and weights of a decoder, read from a GGUF file and placed on a device.
//!
//! Weights that the device reads straight from host memory stay in the file mapping (the
//! page cache holds them, not anonymous memory). Weights that a faster layout exists for
//! (ggml's CPU "extra" buffer types repack quantized matrices, as llama.cpp does by default)
//! or that live on a GPU are copied once; their pages of the mapping are then released.

use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use crate::convert::{WeightFormat, convert_matrix};
use crate::ffi::arena::{Arena, HostMemory};
use crate::ffi::device::{Device, WeightOp, buft_is_host, buft_name};
use crate::ffi::gguf::GgufFile;
use crate::ffi::graph::Tensor;
use crate::hparams::{Arch, Hparams};
use crate::{Error, Result};

/// Whether a layer tensor must be in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Required,
    Optional,
    /// Required unless the layer has a fused `attn_qkv` (llama.cpp's `create_tensor_qkv`).
    UnlessFused,
}

/// A tensor of a layer, named as llama.cpp's `llama-arch.cpp` names it (`blk.N.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub(crate) enum Slot {
    AttnNorm,
    Wqkv,
    Bqkv,
    Wq,
    Wk,
    Wv,
    Bq,
    Bk,
    Bv,
    QNorm,
    KNorm,
    Wo,
    Bo,
    AttnPostNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnPostNorm,
}

impl Slot {
    /// Every slot, in the order of [`LayerWeights`]' table.
    pub(crate) const ALL: [Slot; 19] = [
        Slot::AttnNorm,
        Slot::Wqkv,
        Slot::Bqkv,
        Slot::Wq,
        Slot::Wk,
        Slot::Wv,
        Slot::Bq,
        Slot::Bk,
        Slot::Bv,
        Slot::QNorm,
        Slot::KNorm,
        Slot::Wo,
        Slot::Bo,
        Slot::AttnPostNorm,
        Slot::FfnNorm,
        Slot::FfnGate,
        Slot::FfnUp,
        Slot::FfnDown,
        Slot::FfnPostNorm,
    ];

    /// The tensor's name in a layer, after `blk.N.`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Slot::AttnNorm => "attn_norm.weight",
            Slot::Wqkv => "attn_qkv.weight",
            Slot::Bqkv => "attn_qkv.bias",
            Slot::Wq => "attn_q.weight",
            Slot::Wk => "attn_k.weight",
            Slot::Wv => "attn_v.weight",
            Slot::Bq => "attn_q.bias",
            Slot::Bk => "attn_k.bias",
            Slot::Bv => "attn_v.bias",
            Slot::QNorm => "attn_q_norm.weight",
            Slot::KNorm => "attn_k_norm.weight",
            Slot::Wo => "attn_output.weight",
            Slot::Bo => "attn_output.bias",
            Slot::AttnPostNorm => "post_attention_norm.weight",
            Slot::FfnNorm => "ffn_norm.weight",
            Slot::FfnGate => "ffn_gate.weight",
            Slot::FfnUp => "ffn_up.weight",
            Slot::FfnDown => "ffn_down.weight",
            Slot::FfnPostNorm => "post_ffw_norm.weight",
        }
    }

    /// What the graph does with it (where it is placed depends on that).
    pub(crate) fn op(self) -> WeightOp {
        match self {
            Slot::Wqkv
            | Slot::Wq
            | Slot::Wk
            | Slot::Wv
            | Slot::Wo
            | Slot::FfnGate
            | Slot::FfnUp
            | Slot::FfnDown => WeightOp::MulMat,
            _ => WeightOp::Elementwise,
        }
    }

    /// The shape (ne0, ne1) the graph expects of it; a mismatch would make ggml abort, so it
    /// is an error at load time instead.
    pub(crate) fn shape(self, hp: &Hparams) -> Vec<usize> {
        let (q, kv, e) = (hp.n_head * hp.head_dim, hp.n_embd_kv(), hp.n_embd);
        // Phi-3 keeps gate and up in one matrix of twice the width.
        let up = if hp.arch == Arch::Phi3 { 2 * hp.n_ff } else { hp.n_ff };
        match self {
            Slot::AttnNorm | Slot::AttnPostNorm | Slot::FfnNorm | Slot::FfnPostNorm | Slot::Bo => vec![e],
            Slot::Wqkv => vec![e, q + 2 * kv],
            Slot::Bqkv => vec![q + 2 * kv],
            Slot::Wq => vec![e, q],
            Slot::Wk | Slot::Wv => vec![e, kv],
            Slot::Bq => vec![q],
            Slot::Bk | Slot::Bv => vec![kv],
            Slot::QNorm | Slot::KNorm => vec![hp.head_dim],
            Slot::Wo => vec![q, e],
            Slot::FfnGate => vec![e, hp.n_ff],
            Slot::FfnUp => vec![e, up],
            Slot::FfnDown => vec![hp.n_ff, e],
        }
    }
}

/// The tensors every architecture has around its layers, with the shapes expected of them.
pub(crate) fn global_tensors(hp: &Hparams) -> [(&'static str, WeightOp, bool, Vec<usize>); 3] {
    [
        ("token_embd.weight", WeightOp::GetRows, true, vec![hp.n_embd, hp.n_vocab]),
        ("output_norm.weight", WeightOp::Elementwise, true, vec![hp.n_embd]),
        ("rope_freqs.weight", WeightOp::Elementwise, false, vec![hp.n_rot / 2]),
    ]
}

/// The attention projections every architecture takes the same way, fused or separate, each
/// with an optional bias (llama.cpp's `create_tensor_qkv`).
pub(crate) const QKV: [(Slot, Need); 8] = [
    (Slot::Wqkv, Need::Optional),
    (Slot::Bqkv, Need::Optional),
    (Slot::Wq, Need::UnlessFused),
    (Slot::Wk, Need::UnlessFused),
    (Slot::Wv, Need::UnlessFused),
    (Slot::Bq, Need::Optional),
    (Slot::Bk, Need::Optional),
    (Slot::Bv, Need::Optional),
];

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
    /// Of the copied bytes, those in the device's own memory.
    pub(crate) device_bytes: u64,
    /// Of the copied bytes, those on peers (layers placed there: not in this machine's
    /// budget).
    pub(crate) remote_bytes: u64,
    /// The tensors' descriptions and buffers, one arena per buffer type (the handles above
    /// point into them).
    _arenas: Vec<Arena>,
}

/// Tensors going to one buffer: its type, whether they are converted on the way (such a group
/// never stays in the mapping), and (index into the wanted list, description as placed).
type Group = (sys::ggml_backend_buffer_type_t, bool, Vec<(usize, Tensor)>);

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
    /// Every matrix a pass multiplies activations by: each layer's projections, and the
    /// output.
    pub(crate) fn matrices(&self) -> impl Iterator<Item = Tensor> + '_ {
        const MATRICES: [Slot; 8] =
            [Slot::Wqkv, Slot::Wq, Slot::Wk, Slot::Wv, Slot::Wo, Slot::FfnGate, Slot::FfnUp, Slot::FfnDown];
        self.layers.iter().flat_map(|l| MATRICES.iter().filter_map(|&s| l.get(s))).chain([self.output])
    }

    /// Place the weights of `f` on `device`, matrices converted to `format`; each layer has
    /// the attention projections and `layer_tensors` (its architecture's).
    /// `progress(done, total)` is called in bytes as tensors are placed.
    pub(crate) fn load(
        f: &GgufFile,
        (hp, layer_tensors): (&Hparams, &[(Slot, Need)]),
        device: &Device,
        format: WeightFormat,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Weights> {
        let wanted = wanted(f, hp, layer_tensors)?;

        // Descriptions of converted matrices (type changed, shape kept) live here until they
        // are copied into their group's arena.
        let converted = Arena::new(wanted.len())?;
        let groups = group_by_buffer(f, &wanted, &converted, device, format)?;

        let total: u64 = groups
            .iter()
            .flat_map(|(_, _, list)| list.iter())
            .map(|&(i, _)| f.tensor_bytes(&wanted[i].file_name).map_or(0, |b| b.len() as u64))
            .sum();
        let mut placer = Placer {
            f,
            wanted: &wanted,
            progress,
            placed: vec![None; wanted.len()],
            copied_bytes: 0,
            mapped_bytes: 0,
            device_bytes: 0,
            remote_bytes: 0,
            counted_tied: std::ptr::null(),
            file_done: 0,
            total,
        };
        let mut arenas = Vec::new();
        let cpu_buft = device.cpu_buffer_type();
        for group in &groups {
            arenas.push(placer.place_group(device, cpu_buft, group)?);
        }

        let Placer { placed, copied_bytes, mapped_bytes, device_bytes, remote_bytes, .. } = placer;
        let handle = |i: usize| placed[i];
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
            device_bytes,
            remote_bytes,
            _arenas: arenas,
        })
    }
}

/// The wanted tensors that are in `f`, grouped by the buffer type each goes to (and whether it
/// is converted to `format` on the way); a required tensor that is missing is an error.
fn group_by_buffer(
    f: &GgufFile,
    wanted: &[Wanted],
    converted: &Arena,
    device: &Device,
    format: WeightFormat,
) -> Result<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
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
        let (ty, ne) = (meta.ty(), meta.ne());
        let mut target = if w.op == WeightOp::MulMat { format.target(ty, ne[0]) } else { ty };
        if device.is_openvino() && w.op != WeightOp::Elementwise && !openvino_holds_exactly(target) {
            target = WeightFormat::Q8_0.target(ty, ne[0]);
        }
        let convert = target != ty;
        let desc = if convert { converted.matrix(target, ne[0] as usize, ne[1] as usize)? } else { meta };
        // The token embedding is only gathered from: it stays in host memory on every device.
        let buft = if w.op == WeightOp::GetRows {
            device.cpu_buffer_type()
        } else {
            device.layer_weight_buft(w.slot.map(|(il, _)| il), desc, w.op)
        };
        match groups.iter_mut().find(|(b, c, _)| *b == buft && *c == convert) {
            Some((_, _, list)) => list.push((i, desc)),
            None => groups.push((buft, convert, vec![(i, desc)])),
        }
    }
    Ok(groups)
}

/// Whether ggml's OpenVINO backend computes with matrices of type `ty` as they are. It turns
/// the blocks of Q4_1, Q5_1, Q4_K and Q5_K into 4- or 8-bit integers with an integer zero
/// point (the block's minimum rounded to a whole step: SmolLM2's Q4_1 logits moved by up to 12,
/// llama.cpp's graph there as much as ours), and cannot take Q5_0 at all (Qwen2.5's
/// projections would run on the CPU, splitting every layer's graph). The others are widened
/// to Q8_0 as they load: each weight within about half a Q8_0 step ([`crate::convert`]), for
/// about 1.7 times their memory.
fn openvino_holds_exactly(ty: sys::ggml_type) -> bool {
    use sys::{GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_Q4_0, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0};
    matches!(
        ty,
        GGML_TYPE_F32 | GGML_TYPE_F16 | GGML_TYPE_BF16 | GGML_TYPE_Q8_0 | GGML_TYPE_Q4_0 | GGML_TYPE_Q6_K
    )
}

/// The name a weight's tensor carries in ggml: the file's, except on OpenVINO for the token
/// embedding and the output matrix. ggml's OpenVINO backend requantizes tensors by those names
/// to 8 bits per row (`ggml_openvino_get_requant_type`); under another name they keep their
/// blocks.
fn ggml_name<'a>(file_name: &'a str, device: &Device) -> std::borrow::Cow<'a, str> {
    match file_name {
        "token_embd.weight" | "output.weight" if device.is_openvino() => {
            format!("{}.stored.weight", file_name.trim_end_matches(".weight")).into()
        }
        _ => file_name.into(),
    }
}

/// Placing the groups' tensors in their buffers: where each wanted tensor went, and the bytes
/// counted so far.
struct Placer<'a> {
    f: &'a GgufFile,
    wanted: &'a [Wanted],
    /// Called with (bytes of the file placed so far, `total`).
    progress: &'a mut dyn FnMut(u64, u64),
    /// Each wanted tensor as placed (None: not in the file).
    placed: Vec<Option<Tensor>>,
    copied_bytes: u64,
    mapped_bytes: u64,
    device_bytes: u64,
    remote_bytes: u64,
    /// Where the token embedding's bytes start once they are counted as mapped.
    counted_tied: *const u8,
    /// Bytes of the file placed so far, for `progress` (converted weights differ in size).
    file_done: u64,
    total: u64,
}

impl Placer<'_> {
    /// Describe one group's tensors in an arena of their own and give them memory: their
    /// bytes in the mapping where the CPU can use them in place, else a buffer of the group's
    /// type that they are copied into.
    fn place_group(
        &mut self,
        device: &Device,
        cpu_buft: sys::ggml_backend_buffer_type_t,
        (buft, convert, list): &Group,
    ) -> Result<Arena> {
        let mut arena = Arena::new(list.len())?;
        let mut tensors = Vec::with_capacity(list.len());
        for &(i, desc) in list {
            let t = arena.dup(desc, &ggml_name(&self.wanted[i].file_name, device))?;
            tensors.push((i, t));
            self.placed[i] = Some(t);
        }
        // On the CPU, weights in plain host memory are used where they lie in the mapping.
        let in_place = device.is_cpu() && *buft == cpu_buft && !convert;
        if in_place {
            self.map_in_place(&mut arena, &tensors)?;
        } else {
            arena.alloc_in(*buft)?;
            let before = self.copied_bytes;
            self.copy_out(&tensors, *convert)?;
            if device.is_remote_buft(*buft) {
                self.remote_bytes += self.copied_bytes - before;
            } else if !buft_is_host(*buft) {
                self.device_bytes += self.copied_bytes - before;
            }
        }
        arena.mark_weights();
        tracing::debug!(buffer = %buft_name(*buft), tensors = list.len(), in_place, "placed weights");
        Ok(arena)
    }

    /// Point `tensors` at their bytes in the file mapping, wrapped as a buffer of `arena`.
    fn map_in_place(&mut self, arena: &mut Arena, tensors: &[(usize, Tensor)]) -> Result<()> {
        let (f, wanted) = (self.f, self.wanted);
        let base = f.mmap().as_ptr() as usize;
        let buffer = arena.wrap_host(HostMemory::File(Arc::clone(f.mmap())))?;
        for &(i, t) in tensors {
            let bytes = f.tensor_bytes(&wanted[i].file_name).expect("tensor exists");
            arena.place(t, buffer, bytes.as_ptr() as usize - base)?;
            // A tied embedding is two tensors over one range: count its bytes once.
            if !std::ptr::eq(bytes.as_ptr(), self.counted_tied) {
                self.mapped_bytes += bytes.len() as u64;
            }
            if wanted[i].file_name == "token_embd.weight" {
                self.counted_tied = bytes.as_ptr();
            }
            self.file_done += bytes.len() as u64;
            (self.progress)(self.file_done, self.total);
        }
        Ok(())
    }

    /// Write `tensors` into their allocated buffer, `convert`ed or as they are in the file,
    /// then release their pages of the mapping.
    fn copy_out(&mut self, tensors: &[(usize, Tensor)], convert: bool) -> Result<()> {
        let (f, wanted) = (self.f, self.wanted);
        for &(i, t) in tensors {
            let name = &wanted[i].file_name;
            let bytes = f.tensor_bytes(name).expect("tensor exists");
            if convert {
                let meta = f.tensor(name).expect("tensor exists");
                write_converted(meta, t, bytes)?;
                self.copied_bytes += t.nbytes() as u64;
            } else {
                // Same type and shape as in the file; the buffer type repacks while
                // copying.
                t.write_at(0, bytes)?;
                self.copied_bytes += bytes.len() as u64;
            }
            self.file_done += bytes.len() as u64;
            (self.progress)(self.file_done, self.total);
            // Nothing reads the mapping's copy any more.
            f.drop_pages(bytes);
        }
        Ok(())
    }
}

/// Write `bytes`, a matrix of `meta`'s type in the file, into `t`, converted to `t`'s type.
fn write_converted(meta: Tensor, t: Tensor, bytes: &[u8]) -> Result<()> {
    let ne = t.ne();
    let mut failed = None;
    convert_matrix(meta.ty(), t.ty(), bytes, ne[0] as usize, ne[1] as usize, &mut |at, chunk| {
        // convert_matrix hands out consecutive chunks that tile the tensor.
        if let Err(e) = t.write_at(at, chunk) {
            failed.get_or_insert(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(())
}

/// Whether the graph of `hp.arch`, whose layers have `layer_tensors` besides the attention
/// projections, reads every tensor of `f` ([`Error::Unsupported`] if not).
pub(crate) fn check_tensors(f: &GgufFile, hp: &Hparams, layer_tensors: &[(Slot, Need)]) -> Result<()> {
    wanted(f, hp, layer_tensors).map(drop)
}

/// The tensors the graph of `hp.arch` reads, with their shapes: the token embedding first,
/// the output projection third. A tensor in the file that is not among them means the file
/// has something our graph would leave out, which it refuses.
fn wanted(f: &GgufFile, hp: &Hparams, layer_tensors: &[(Slot, Need)]) -> Result<Vec<Wanted>> {
    let mut wanted = Vec::new();
    let [embd, norm, freqs] = global_tensors(hp);
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
        for &(slot, need) in QKV.iter().chain(layer_tensors) {
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
        return Err(
            hp.unsupported(f, format!("tensor {extra}, which our {} graph does not use", hp.arch_name))
        );
    }
    Ok(wanted)
}

fn check_shape(f: &GgufFile, name: &str, t: Tensor, want: &[usize]) -> Result<()> {
    let mut got: Vec<usize> = t.ne().iter().map(|&n| n as usize).collect();
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
