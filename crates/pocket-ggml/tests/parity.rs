//! Parity with llama.cpp: our graph, fed the tokens llama.cpp generated greedily, picks the same
//! token at every position; and a quantized cache picks what the f16 cache picks.
//!
//! The graph is compared attending with ggml's flash attention, llama.cpp's kernel, to its
//! rounding (1e-3). Our own attention kernel (f32 throughout, `attention.rs`, checked against
//! an exact softmax in its unit tests) moves SmolLM2's logits by up to about one, as ggml's
//! own one-row and tiled attention paths differ by (see below); it is held to top-1 agreement.

mod common;

use common::*;
use pocket_core::{KvType, Model, Rows, Session, argmax};
use pocket_ggml::LlamaCpp;
use pocket_ggml::parity::{ParityOptions, ParityReport, parity};

/// Tokens of greedy continuation compared per model.
const N_TOKENS: usize = 128;

fn run(name: &str, prompt: &str, kv_types: Vec<KvType>) -> ParityReport {
    let options = ParityOptions {
        prompt: prompt.into(),
        n_tokens: N_TOKENS,
        threads: THREADS,
        kv_types,
        device: device(),
    };
    let report = parity(&model_path(name), &options).unwrap_or_else(|e| panic!("parity on {name}: {e}"));
    eprintln!("{name}: our graph on {}, llama.cpp on {}", report.device, report.reference_device);
    // Built with a GPU backend, the comparison is of our graph on the GPU (`scripts/test-vulkan`
    // makes lavapipe one); falling back to the CPU would test nothing new.
    assert_on_the_device(&report.device);
    assert_eq!(report.n, N_TOKENS);
    assert_eq!(report.positions.len(), N_TOKENS);
    for kv in &report.kv {
        eprintln!(
            "{name} {}: top-1 {}/{} with llama.cpp, {}/{} with {}, max |Δlogit| {:e}",
            kv.kv,
            kv.top1_vs_llama_cpp,
            report.n,
            kv.top1_vs_first,
            report.n,
            report.kv[0].kv,
            kv.max_abs_diff
        );
    }
    report
}

/// The positions where our top-1 differs from llama.cpp's, for the failure message.
fn disagreements(report: &ParityReport) -> Vec<String> {
    report
        .positions
        .iter()
        .filter(|p| p.reference != p.ours)
        .map(|p| {
            format!(
                "#{}: llama.cpp {} ours {} (max |Δ| {}, llama.cpp's margin {:?})",
                p.index, p.reference, p.ours, p.max_abs_diff, p.reference_margin
            )
        })
        .collect()
}

#[test]
fn smollm2_agrees_with_llama_cpp_at_every_position_and_q8_0_with_f16() {
    let _serial = serial();
    // On this prompt q8_0 agrees at 126 of 128 positions on x86-64. Some prompts come closer to
    // the line (122 of 128 on "The history of the printing press begins in the fifteenth
    // century, when"): part of the disagreement is the f16 reference's own, since ggml
    // accumulates attention over an f16 cache in f16 when decoding one token (an f32 cache
    // disagrees with f16 at 3 of those 128 positions).
    let kv = if quantized_kv() { vec![KvType::F16, KvType::Q8_0] } else { vec![KvType::F16] };
    let report = run(SMOL, "To make a good cup of tea, you need", kv);
    agrees_at_every_position(&report);
    own_attention_agrees(&report);
    let Some(q8) = report.kv.get(1) else { return };
    assert_eq!(q8.kv, KvType::Q8_0);
    // 95% of 128, rounded up.
    assert!(q8.top1_vs_first >= 122, "q8_0 agrees with f16 at {}/{N_TOKENS} positions", q8.top1_vs_first);
}

#[test]
fn qwen2_5_coder_agrees_with_llama_cpp_at_every_position() {
    let _serial = serial();
    let kv = if quantized_kv() { vec![KvType::F16, KvType::Q8_0_Q4_0] } else { vec![KvType::F16] };
    let report = run(QWEN, "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n", kv);
    agrees_at_every_position(&report);
    own_attention_agrees(&report);
    // Keys and values of different types, as llama.cpp's -ctk q8_0 -ctv q4_0: our graph
    // against llama.cpp with the same cache (bit for bit on x86-64 with AVX2).
    let Some(mixed) = report.kv.get(1) else { return };
    assert_eq!(mixed.kv, KvType::Q8_0_Q4_0);
    assert_eq!(mixed.top1_vs_llama_cpp, N_TOKENS, "{mixed:?}");
}

/// Our graph picks llama.cpp's token at every position where both run on the same backend.
/// On an OpenVINO device llama.cpp runs on the CPU (its graph fails there, docs/benchmarks.md)
/// and the backend computes otherwise (its attention in f16, its activations quantized its own
/// way): there our graph is held to 95% and differs only at near ties, as our attention kernel
/// is below.
#[track_caller]
fn agrees_at_every_position(report: &ParityReport) {
    if report.reference_device == report.device {
        assert_eq!(report.top1(), N_TOKENS, "f16: {}", disagreements(report).join("; "));
        return;
    }
    let margins: Vec<f32> = report.positions.iter().filter_map(|p| p.reference_margin).collect();
    agrees_but_at_near_ties(report.top1(), &margins);
}

/// Top-1 agreement at 95% of the positions or more (122 of 128), every disagreement a near tie
/// (llama.cpp's own margin for its token under one logit).
#[track_caller]
fn agrees_but_at_near_ties(top1: usize, flip_margins: &[f32]) {
    assert!(
        top1 >= 122,
        "top-1 agrees at {top1}/{N_TOKENS} positions (margins where it differs {flip_margins:?})"
    );
    assert!(flip_margins.iter().all(|&m| m < 1.0), "a disagreement far from a tie: {flip_margins:?}");
}

/// Our attention kernel picks llama.cpp's token at 95% of the positions or more, and differs
/// only at near ties (llama.cpp's own margin for its token under one logit).
#[track_caller]
fn own_attention_agrees(report: &ParityReport) {
    let Some(own) = report.own_attention.as_ref() else {
        // On a GPU the graph attends with the backend's own flash attention.
        assert_ne!(report.device, "CPU", "our attention kernel runs on every CPU");
        return;
    };
    eprintln!(
        "own attention: top-1 {}/{} with llama.cpp, max |Δlogit| {}, margins where it differs {:?}",
        own.top1_vs_llama_cpp, report.n, own.max_abs_diff, own.flip_margins
    );
    agrees_but_at_near_ties(own.top1_vs_llama_cpp, &own.flip_margins);
}

/// Our passes of `n_batch` tokens against llama.cpp's ubatches of the same size: the same
/// kernels on the same shapes. Passes shorter than 64 tokens take ggml's one-row flash
/// attention (f16 Q, f16 accumulation over an f16 cache) rather than the tiled f32 one, which
/// moves the logits by about one; this pins that the move is ggml's, not our splitting's.
#[test]
fn prompt_passes_match_llama_cpp_ubatches_of_the_same_size() {
    let _serial = serial();
    let model = model_with_ggml_attention(SMOL);
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let prompt = prose(&model, 300);
    let threads = THREADS;
    let mut last_rows = Vec::new();
    // 64: passes of 64 × 4 + 44 (the last one below the attention tile); 512: one pass.
    for n_batch in [64, 512] {
        // Our session is dropped before llama.cpp runs: two idle-spinning thread pools in one
        // process would slow each other down.
        let got = {
            let mut ours = session(&model, &pocket_core::SessionConfig { n_batch, ..config(512) });
            collect(&ours.decode(&prompt, &plan, Rows::Last).unwrap())
        };
        let mut llama =
            LlamaCpp::load(&model_path(SMOL), threads, 512, n_batch, KvType::F16, false, false).unwrap();
        let reference = llama.decode(&prompt, false).unwrap().to_vec();
        let d =
            assert_close(&format!("ours vs llama.cpp, passes of {n_batch}"), &got, &reference, n_vocab, 1e-3);
        eprintln!("passes of {n_batch}: max |Δ| vs llama.cpp {d:e}");
        last_rows.push(got);
    }
    assert_eq!(argmax(&last_rows[0]), argmax(&last_rows[1]), "passes of 64 and 512 pick the same token");
    eprintln!("passes of 64 vs 512: max |Δ| {:e}", max_abs_diff(&last_rows[0], &last_rows[1]));
}

/// Far into the context: a 1000-token prompt (16 KV blocks) and 32 tokens decoded one at a time
/// after it, past the 512 positions where ggml's one-token attention changes path. The 128-token
/// parity runs above never get there.
#[test]
fn long_context_matches_llama_cpp() {
    let _serial = serial();
    let model = model_with_ggml_attention(SMOL);
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let text = prose(&model, 1032);
    let (prompt, forced) = text.split_at(1000);
    // One thread: with two, llama.cpp's one-token attention over 512+ positions takes ggml's
    // split-KV path, which our engine avoids on purpose (each row of a verification pass must
    // equal decoding that token alone; see graph::LoneQuery). With one thread the split
    // path is a single chunk and computes what the per-row path does.
    let threads = 1;
    // A context that is a multiple of 256, as llama.cpp rounds its own up to: attention then
    // reads the same padded cache length in both (one-token attention splits the cache into
    // one chunk per thread, so a different padding sums in a different order; over an f16
    // cache, accumulated in f16, that moves logits by up to ~0.7 on SmolLM2).
    let n_ctx = 1280;
    let config = pocket_core::SessionConfig {
        n_batch: 512,
        threads: pocket_core::Threads::Fixed(threads),
        ..config(n_ctx)
    };

    let mut ours = Vec::new();
    {
        let mut s = session(&model, &config);
        ours.extend(collect(&s.decode(prompt, &plan, Rows::Last).unwrap()));
        for t in forced {
            ours.extend(collect(&s.decode(std::slice::from_ref(t), &plan, Rows::Last).unwrap()));
        }
    }
    let mut reference = Vec::new();
    let mut llama =
        LlamaCpp::load(&model_path(SMOL), threads, n_ctx, 512, KvType::F16, false, false).unwrap();
    reference.extend_from_slice(llama.decode(prompt, false).unwrap());
    for t in forced {
        reference.extend_from_slice(llama.decode(std::slice::from_ref(t), false).unwrap());
    }
    let d = assert_close("positions 1000..1032 vs llama.cpp", &ours, &reference, n_vocab, 1e-3);
    eprintln!("positions 1000..1032: max |Δ| vs llama.cpp {d:e}");
}
