//! The KIVI-quantized cache against the f32 cache: memory and agreement over 100 tokens,
//! long enough that most of the cache is quantized (the f32 window is 17 tokens).

mod common;

use common::{cases, config, t5_tiny};
use pocket_core::{KvType, LayerPlan, Model, Rows, argmax};
use pocket_tract::TractModel;

const TOKENS: usize = 100;

/// Greedy tokens and every step's logits with an f32 cache.
fn reference(model: &TractModel, source: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let plan = LayerPlan::full(model.info().n_layers).unwrap();
    let mut s = model.new_session(&config(KvType::F32), &pocket_core::memory::Ledger::unlimited()).unwrap();
    pocket_core::Session::encode(&mut s, source).unwrap();
    let (mut inputs, mut rows) = (vec![model.decoder_start()], Vec::new());
    for _ in 0..TOKENS {
        let logits =
            pocket_core::Session::decode(&mut s, &inputs[inputs.len() - 1..], &plan, Rows::Last).unwrap();
        rows.push(logits.last().to_vec());
        inputs.push(argmax(logits.last()));
    }
    inputs.pop();
    (inputs, rows)
}

#[test]
fn quantized_caches_agree_with_f32_and_take_less_memory() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    let plan = LayerPlan::full(model.info().n_layers).unwrap();
    let mut bytes = Vec::new();
    for kv in [KvType::F32, KvType::Q8_0, KvType::Q8_0_Q4_0, KvType::Q4_0] {
        let (mut agree, mut total, mut worst) = (0, 0, 0f32);
        let mut kv_bytes = 0;
        for case in cases() {
            let (inputs, rows) = reference(&model, &case.input_ids);
            let mut s = model.new_session(&config(kv), &pocket_core::memory::Ledger::unlimited()).unwrap();
            pocket_core::Session::encode(&mut s, &case.input_ids).unwrap();
            // Teacher-forced with the f32 run's tokens, so that one flip does not change the rest.
            for (k, want) in rows.iter().enumerate() {
                let logits =
                    pocket_core::Session::decode(&mut s, &inputs[k..k + 1], &plan, Rows::Last).unwrap();
                let row = logits.last();
                agree += usize::from(argmax(row) == argmax(want));
                total += 1;
                worst = row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(worst, f32::max);
            }
            kv_bytes = s.kv_bytes();
            // Drafts of up to 16 tokens rejected: only the f32 window is cut.
            let before = pocket_core::Session::decode(&mut s, &[inputs[1]], &plan, Rows::Last)
                .unwrap()
                .last()
                .to_vec();
            pocket_core::Session::truncate(&mut s, TOKENS).unwrap();
            let again = pocket_core::Session::decode(&mut s, &[inputs[1]], &plan, Rows::Last)
                .unwrap()
                .last()
                .to_vec();
            assert_eq!(before, again, "{kv}: cutting a rejected token changed the cache");
        }
        let agreement = agree as f64 / total as f64;
        println!(
            "kv {kv}: {kv_bytes} bytes of self-attention cache for {TOKENS} tokens ({:.0} per token); \
             greedy agreement with f32 {agreement:.4} over {total} steps; worst logit difference {worst:.2e}",
            kv_bytes as f64 / TOKENS as f64
        );
        match kv {
            KvType::F32 => assert_eq!((agreement, worst), (1.0, 0.0)),
            KvType::Q8_0 => assert!(agreement >= 0.99, "{kv}: {agreement}"),
            _ => assert!(agreement >= 0.9, "{kv}: {agreement}"),
        }
        bytes.push(kv_bytes);
    }
    assert!(bytes.is_sorted_by(|a, b| a > b), "each type smaller than the one before: {bytes:?}");
}

#[test]
fn the_footprint_covers_what_a_session_holds() {
    let model = TractModel::load(&t5_tiny()).unwrap();
    let plan = LayerPlan::full(model.info().n_layers).unwrap();
    let case = &cases()[3];
    for kv in [KvType::F32, KvType::Q8_0, KvType::Q8_0_Q4_0, KvType::Q4_0] {
        let config = config(kv);
        let footprint = model.footprint(&config).unwrap();
        let ledger = pocket_core::memory::Ledger::unlimited();
        let mut s = model.new_session(&config, &ledger).unwrap();
        pocket_core::Session::encode(&mut s, &case.input_ids).unwrap();
        let mut next = 0;
        for _ in 0..TOKENS {
            next = argmax(pocket_core::Session::decode(&mut s, &[next], &plan, Rows::Last).unwrap().last());
        }
        // The f32 window is charged with the compute, the rest at the quantized rate.
        assert!(s.kv_bytes() <= footprint.kv_bytes(TOKENS as u64) + footprint.compute_bytes, "{kv}");
        assert!(
            s.kv_bytes() >= footprint.kv_bytes(TOKENS as u64 - 48),
            "{kv}: {} vs {footprint:?}",
            s.kv_bytes()
        );
        assert_eq!(pocket_core::Session::memory(&s), ledger.used(), "{kv}");
        drop(s);
        assert_eq!(ledger.used(), 0, "{kv}: the session's memory was not given back");
    }
}
