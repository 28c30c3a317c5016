//! Parity: our engine against llama.cpp on the same file — our graph where it builds the
//! file, else our llama.cpp engine (which must then give llama.cpp's logits exactly: it is
//! llama.cpp, driven through our session's batching, rows and rollback).
//!
//! llama.cpp generates a greedy continuation; our engine is then fed the very same tokens
//! (teacher forcing, one token per pass as in generation) so every position compares logits
//! computed from identical inputs, and one disagreement cannot cascade into the next.
//!
//! The graph is compared with ggml's flash attention, the kernel llama.cpp uses, so that every
//! other op is checked to llama.cpp's rounding. Our own attention kernel (f32 where ggml
//! accumulates an f16 cache in f16) is then run on the same tokens and reported beside it:
//! its logits move by about what ggml's own attention paths differ by, so it is judged by
//! top-1 agreement and by how close to a tie each disagreement was.

use std::path::Path;

use pocket_core::sampling::argmax;
use pocket_core::{KvType, LayerPlan, Model, Rows, SessionConfig, Token};

use crate::{
    AttentionKernel, DeviceChoice, GgmlModel, GraphSupport, LlamaCpp, LlamaCppModel, LoadOptions, Repack,
    Result, graph_support,
};

/// What to compare.
#[derive(Debug, Clone)]
pub struct ParityOptions {
    /// The prompt.
    pub prompt: String,
    /// Tokens of greedy continuation to compare.
    pub n_tokens: usize,
    /// CPU threads for both engines.
    pub threads: usize,
    /// KV types to run our engine with; the first is compared with llama.cpp, the rest also
    /// with the first (top-1 agreement).
    pub kv_types: Vec<KvType>,
    /// The device our graph runs on; llama.cpp offloads every layer when it is a GPU, so
    /// that both run the same backend's kernels.
    pub device: DeviceChoice,
}

/// One compared position.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Position {
    /// Index in the continuation (0 = the token after the prompt).
    pub index: usize,
    /// llama.cpp's top-1 token.
    pub reference: Token,
    /// Our top-1 token (with the first KV type).
    pub ours: Token,
    /// max |Δlogit| over the vocabulary.
    pub max_abs_diff: f32,
    /// Where the top-1 tokens differ: by how much llama.cpp's logit for its token exceeds its
    /// logit for ours (a near-tie when small).
    pub reference_margin: Option<f32>,
}

/// Agreement of one KV type.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvAgreement {
    /// The KV type.
    pub kv: KvType,
    /// Positions whose top-1 equals llama.cpp's (run with the same KV type).
    pub top1_vs_llama_cpp: usize,
    /// Positions whose top-1 equals ours with the first KV type.
    pub top1_vs_first: usize,
    /// max |Δlogit| against llama.cpp with the same KV type.
    pub max_abs_diff: f32,
}

/// Agreement of our own attention kernel with llama.cpp (first KV type).
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttentionAgreement {
    /// Positions whose top-1 equals llama.cpp's.
    pub top1_vs_llama_cpp: usize,
    /// max |Δlogit| against llama.cpp.
    pub max_abs_diff: f32,
    /// Where the top-1 differs: by how much llama.cpp preferred its token over ours (its
    /// logit margin; a near tie is a small one).
    pub flip_margins: Vec<f32>,
}

/// The result of a parity run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParityReport {
    /// The engine compared with llama.cpp: `ggml` (our graph) or `llama.cpp` (our engine over
    /// llama.h, for a file our graph does not build).
    pub engine: String,
    /// The ggml device our graph ran on (`CPU`, `Vulkan0`, `openvino:CPU`, ...). llama.cpp runs
    /// on the same kind: the CPU, or with every layer offloaded to the GPUs ggml finds (on the
    /// CPU for an OpenVINO device).
    pub device: String,
    /// Where llama.cpp ran: the same device, or `CPU` (always for an OpenVINO device).
    pub reference_device: String,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Positions compared.
    pub n: usize,
    /// Per position, first KV type.
    pub positions: Vec<Position>,
    /// Per KV type.
    pub kv: Vec<KvAgreement>,
    /// Our own attention kernel, where the model's first KV type uses it (an f16 cache on
    /// the CPU).
    pub own_attention: Option<AttentionAgreement>,
}

impl ParityReport {
    /// Top-1 agreements with llama.cpp for the first KV type.
    pub fn top1(&self) -> usize {
        self.kv.first().map_or(0, |k| k.top1_vs_llama_cpp)
    }

    /// max |Δlogit| for the first KV type.
    pub fn max_abs_diff(&self) -> f32 {
        self.kv.first().map_or(f32::NAN, |k| k.max_abs_diff)
    }
}

/// Run llama.cpp on `path`: greedily, or fed `forced` tokens when given. Returns the
/// continuation and its logits rows (one per position, each predicting that position).
fn reference_run(
    path: &Path,
    prompt: &[Token],
    forced: Option<&[Token]>,
    n: usize,
    threads: usize,
    kv: KvType,
    gpu: bool,
) -> Result<(Vec<Token>, Vec<f32>)> {
    let mut llama = LlamaCpp::load(path, threads, prompt.len() + n + 8, 512, kv, gpu, false)?;
    let n_vocab = llama.n_vocab();
    let mut rows = Vec::with_capacity(n * n_vocab);
    let mut tokens = Vec::with_capacity(n);
    let mut last = llama.decode(prompt, false)?.to_vec();
    for i in 0..n {
        let t = forced.map_or_else(|| argmax(&last), |f| f[i]);
        rows.extend_from_slice(&last);
        tokens.push(t);
        last = llama.decode(&[t], false)?.to_vec();
    }
    Ok((tokens, rows))
}

/// Feed `prompt` then `forced` through our engine and return the logits row of every position.
fn teacher_forced(
    model: &dyn Model,
    prompt: &[Token],
    forced: &[Token],
    threads: usize,
    kv: KvType,
) -> Result<Vec<f32>> {
    let n_vocab = model.info().n_vocab;
    let config = SessionConfig {
        kv,
        n_ctx: prompt.len() + forced.len() + 8,
        n_batch: 512,
        threads: pocket_core::Threads::Fixed(threads),
        ..SessionConfig::default()
    };
    let mut session = model.session(&config)?;
    let plan = LayerPlan::full(model.info().n_layers)?;
    let mut rows = Vec::with_capacity(forced.len() * n_vocab);
    rows.extend_from_slice(session.decode(prompt, &plan, Rows::Last)?.last());
    for &t in &forced[..forced.len().saturating_sub(1)] {
        rows.extend_from_slice(session.decode(&[t], &plan, Rows::Last)?.last());
    }
    Ok(rows)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Compare our engine with llama.cpp on the model at `path`.
pub fn parity(path: &Path, options: &ParityOptions) -> Result<ParityReport> {
    let device = options.device.clone();
    // Weights as the file stores them, as llama.cpp loads them here: ggml's one-row kernels on
    // both sides. (What pocketd repacks by default, Q4_K on x86, its kernels compute as ggml's
    // one-token kernel for that layout does, checked bit for bit by `gemm`'s tests; that
    // kernel rounds otherwise than the one-row kernel on the stored layout.)
    let load = LoadOptions {
        attention: AttentionKernel::Ggml,
        device: device.clone(),
        repack: Repack::None,
        ..Default::default()
    };
    // Our graph, kept as such for the report on its own attention kernel.
    let (model, ours, engine, device_name, on_gpu): (Box<dyn Model>, Option<GgmlModel>, _, String, bool) =
        match graph_support(path)? {
            GraphSupport::Ours => {
                let m = GgmlModel::load(path, &load)?;
                let (name, gpu) = (m.device_name().to_owned(), m.on_gpu());
                (Box::new(m.clone()), Some(m), "ggml", name, gpu)
            }
            GraphSupport::LlamaCpp { .. } => {
                let m = LlamaCppModel::load(path, &load)?;
                let (name, gpu) = (m.device_name().to_owned(), m.on_gpu());
                (Box::new(m), None, "llama.cpp", name, gpu)
            }
        };
    // On an OpenVINO device the reference is llama.cpp on the CPU: the OpenVINO backend
    // compiles whole graphs, and in this llama.cpp its cache of compiled graphs takes a decode
    // step's graph for the prompt's (llama.cpp's graph fails there after the first pass).
    let on_gpu = on_gpu && !device_name.starts_with("openvino:");
    let model = model.as_ref();
    let n_vocab = model.info().n_vocab;
    let prompt = model.tokenizer().encode(&options.prompt, true)?;
    if prompt.is_empty() {
        return Err(crate::Error::Ggml("the prompt tokenizes to nothing".into()));
    }
    let kv_types = if options.kv_types.is_empty() { vec![KvType::F16] } else { options.kv_types.clone() };
    let n = options.n_tokens;
    let mut report = ParityReport {
        engine: engine.to_owned(),
        reference_device: if on_gpu { device_name.clone() } else { "CPU".to_owned() },
        device: device_name,
        prompt_tokens: prompt.len(),
        n,
        positions: Vec::new(),
        kv: Vec::new(),
        own_attention: None,
    };
    let mut first_reference = Vec::new();
    let mut first_top1: Vec<Token> = Vec::new();
    // The continuation is llama.cpp's greedy one with the first KV type; every KV type is then
    // fed those same tokens, so agreement between KV types compares like with like.
    let mut forced: Vec<Token> = Vec::new();
    for (k, &kv) in kv_types.iter().enumerate() {
        let forced_tokens = (k > 0).then_some(&forced[..]);
        let (tokens, reference) =
            reference_run(path, &prompt, forced_tokens, n, options.threads, kv, on_gpu)?;
        if k == 0 {
            forced = tokens;
        }
        if k == 0 && kv == KvType::F16 {
            first_reference = reference.clone();
        }
        let ours = teacher_forced(model, &prompt, &forced, options.threads, kv)?;
        let mut agree = KvAgreement { kv, top1_vs_llama_cpp: 0, top1_vs_first: 0, max_abs_diff: 0.0 };
        let mut tops = Vec::with_capacity(n);
        for i in 0..n {
            let (r, o) = (&reference[i * n_vocab..(i + 1) * n_vocab], &ours[i * n_vocab..(i + 1) * n_vocab]);
            let (rt, ot) = (argmax(r), argmax(o));
            let d = max_abs_diff(r, o);
            agree.top1_vs_llama_cpp += usize::from(rt == ot);
            agree.max_abs_diff = agree.max_abs_diff.max(d);
            tops.push(ot);
            if k == 0 {
                let reference_margin = (rt != ot).then(|| r[rt as usize] - r[ot as usize]);
                report.positions.push(Position {
                    index: i,
                    reference: rt,
                    ours: ot,
                    max_abs_diff: d,
                    reference_margin,
                });
            }
        }
        if k == 0 {
            first_top1 = tops.clone();
        }
        agree.top1_vs_first = tops.iter().zip(&first_top1).filter(|(a, b)| a == b).count();
        report.kv.push(agree);
    }
    if !first_reference.is_empty() && ours.as_ref().is_some_and(|m| m.attention_kernel().is_some()) {
        let own =
            GgmlModel::load(path, &LoadOptions { device, repack: Repack::None, ..LoadOptions::default() })?;
        let ours = teacher_forced(&own, &prompt, &forced, options.threads, kv_types[0])?;
        let mut agree =
            AttentionAgreement { top1_vs_llama_cpp: 0, max_abs_diff: 0.0, flip_margins: Vec::new() };
        for (r, o) in first_reference.chunks(n_vocab).zip(ours.chunks(n_vocab)) {
            let (rt, ot) = (argmax(r), argmax(o));
            agree.max_abs_diff = agree.max_abs_diff.max(max_abs_diff(r, o));
            if rt == ot {
                agree.top1_vs_llama_cpp += 1;
            } else {
                agree.flip_margins.push(r[rt as usize] - r[ot as usize]);
            }
        }
        report.own_attention = Some(agree);
    }
    Ok(report)
}
