//! KV cache types and the cache's accounting: every type runs, the quantized ones are as small
//! as promised, and a session holds KV for the tokens it holds (in blocks), not for its context.
//!
//! Whether that memory is really resident (and really released) is measured from the process's
//! own figures in `kv_resident_memory.rs`, alone in its process.

mod common;

use common::*;
use pocket_core::{KvType, Model, Rows, Session, SessionConfig, argmax};
use pocket_ggml::KV_BLOCK_TOKENS;

fn with_kv(kv: KvType, n_ctx: usize) -> SessionConfig {
    SessionConfig { kv, ..config(n_ctx) }
}

#[test]
fn every_kv_type_decodes_and_the_type_is_really_used() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let prompt = prose(&model, 40);
    let more = other_prose(&model, 8);
    let mut last_rows = Vec::new();
    for kv in
        [KvType::F16, KvType::Q8_0, KvType::Q4_0, KvType::F32, KvType::Q8_0_Q4_0, "f16/q8_0".parse().unwrap()]
    {
        let mut s = session(&model, &with_kv(kv, 128));
        assert_eq!(s.config().kv, kv);
        s.decode(&prompt, &plan, Rows::None).unwrap();
        // One token at a time after the prompt: the attention reads the cache written before.
        let mut row = Vec::new();
        for t in &more {
            row = collect(&s.decode(std::slice::from_ref(t), &plan, Rows::Last).unwrap());
            assert!(row.iter().all(|v| v.is_finite()), "{kv}: non-finite logits");
        }
        assert_eq!(s.kv_bytes(), KV_BLOCK_TOKENS * model.kv_bytes_per_token(kv), "{kv}");
        last_rows.push((kv, row));
    }
    let f16 = &last_rows[0].1;
    for (kv, row) in &last_rows[1..] {
        let d = max_abs_diff(f16, row);
        // Each type stores different bits, so the logits differ a little; a cache that ignored
        // the type would give f16's logits exactly.
        assert!(d > 0.0, "{kv} gave f16's logits bit for bit: is the type used?");
        // Rotated 8-bit (and f32) keys change nothing that matters on plain prose.
        if [KvType::Q8_0, KvType::F32].contains(kv) {
            assert_eq!(argmax(row), argmax(f16), "{kv} picks another token than f16 (max |Δ| {d})");
        }
        eprintln!("{kv} vs f16 after 48 tokens: max |Δlogit| {d:.4}");
    }
}

#[test]
fn quantized_kv_types_take_the_promised_fraction_of_f16() {
    let _serial = serial();
    for name in [SMOL, QWEN] {
        let model = model(name);
        let f16 = model.kv_bytes_per_token(KvType::F16) as f64;
        let q8 = model.kv_bytes_per_token(KvType::Q8_0) as f64;
        let q4 = model.kv_bytes_per_token(KvType::Q4_0) as f64;
        assert!(q8 <= 0.55 * f16, "{name}: q8_0 {q8} B/token vs f16 {f16}");
        assert!(q4 <= 0.30 * f16, "{name}: q4_0 {q4} B/token vs f16 {f16}");
        assert_eq!(model.kv_bytes_per_token(KvType::F32) as f64, 2.0 * f16, "{name}");
        // Keys of one type and values of another: each half at its own type's size.
        let mixed = model.kv_bytes_per_token(KvType::Q8_0_Q4_0) as f64;
        assert_eq!(mixed, (q8 + q4) / 2.0, "{name}");
        // The footprint the planner sees says the same.
        for kv in [KvType::F16, KvType::Q8_0, KvType::Q4_0, KvType::Q8_0_Q4_0] {
            let fp = model.footprint(&with_kv(kv, 1024)).unwrap();
            assert_eq!(fp.kv_bytes_per_token, model.kv_bytes_per_token(kv) as u64, "{name} {kv}");
            assert_eq!(fp.kv_block_tokens, KV_BLOCK_TOKENS as u64);
        }
    }
}

#[test]
fn kv_bytes_follow_the_tokens_held_in_blocks() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let config = config(2048);
    let fp = model.footprint(&config).unwrap();
    let text = prose(&model, 1024);

    let mut s = session(&model, &config);
    assert_eq!(s.kv_bytes(), 0, "a new session holds no KV, whatever its context");
    assert_eq!(s.compute_bytes() as u64, fp.compute_bytes, "the footprint's compute buffer is the session's");
    s.decode(&text[..64], &plan, Rows::None).unwrap();
    let at_64 = s.kv_bytes();
    assert_eq!(at_64 as u64, fp.kv_bytes(64));
    s.decode(&text[64..65], &plan, Rows::None).unwrap();
    assert_eq!(s.kv_bytes(), 2 * at_64, "the 65th token opens a second block");
    s.decode(&text[65..], &plan, Rows::Last).unwrap();
    let at_1024 = s.kv_bytes();
    assert_eq!(at_1024, 16 * at_64, "1024 tokens are 16 blocks of 64");
    assert_eq!(at_1024 as u64, fp.kv_bytes(1024), "measured equals the footprint");
    assert!(s.memory() >= at_1024 as u64 + fp.compute_bytes, "memory() counts the KV and compute buffers");

    s.truncate(100).unwrap();
    assert_eq!(s.kv_bytes() as u64, fp.kv_bytes(100), "truncating releases whole blocks");
    s.truncate(64).unwrap();
    assert_eq!(s.kv_bytes(), at_64);
}

#[test]
fn a_session_at_its_context_limit_holds_kv_for_the_context_only() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    // A context that is not a multiple of the block: the last block is cut to the context.
    let config = config(100);
    let text = prose(&model, 100);
    let mut s = session(&model, &config);
    s.decode(&text, &plan, Rows::Last).unwrap();
    assert_eq!(s.len(), 100);
    assert_eq!(s.kv_bytes(), 100 * model.kv_bytes_per_token(KvType::F16));
}
