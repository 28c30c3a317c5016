//! `Model::footprint` against what a session really makes resident: the process's anonymous
//! resident memory (`RssAnon`; the weights are a file mapping and do not count there) grows
//! by the predicted compute buffer, KV cache and logits, within 5%.
//!
//! One test in its own file, so its process runs nothing else while it reads its own memory.

mod common;

use common::*;
use pocket_core::{KvType, Model, Rows, Session, SessionConfig};

const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn the_footprint_predicts_resident_memory_within_five_percent() {
    let model = smol();
    let plan = full(&model);
    let text = prose(&model, 1024);
    // Everything a first session touches once per process (ggml's tables, the tokenizer's
    // caches) is touched by this one, dropped before measuring.
    {
        let mut warm = session(&model, &config(4096));
        warm.decode(&text[..300], &plan, Rows::Last).unwrap();
    }
    // One session per process: a second one would be given the first one's freed compute
    // buffer back by the allocator (glibc raises its mmap threshold after the warm-up frees a
    // large block, so later buffers come from, and return to, the heap it keeps), which
    // resident memory cannot tell from a new allocation.
    measure(&model, &plan, &text, &SessionConfig { kv: KvType::F16, ..config(4096) });
}

fn measure(
    model: &pocket_ggml::GgmlModel,
    plan: &pocket_core::LayerPlan,
    text: &[u32],
    config: &SessionConfig,
) {
    let fp = model.footprint(config).unwrap();
    let before = rss_anon();
    let mut s = session(model, config);
    // Full batches, so the compute buffer is used to its size.
    s.decode(text, plan, Rows::Last).unwrap();
    let after = rss_anon();
    let predicted = fp.compute_bytes + fp.kv_bytes(1024) + fp.logits_row_bytes;
    let grew = after.saturating_sub(before);
    let error = (grew as f64 - predicted as f64).abs() / predicted as f64;
    eprintln!(
        "{}: predicted {:.2} MiB (compute {:.2}, KV {:.2}); RssAnon grew {:.2} MiB ({:.1}% off)",
        config.kv,
        predicted as f64 / MIB,
        fp.compute_bytes as f64 / MIB,
        fp.kv_bytes(1024) as f64 / MIB,
        grew as f64 / MIB,
        100.0 * error
    );
    assert!(error <= 0.05, "{}: off by {:.1}%", config.kv, 100.0 * error);
    drop(s);
}
