//! Sessions under a memory budget: what a session allocates is reserved in the ledger first,
//! the footprint predicts those reservations, and an allocation past the budget is an error
//! that changes nothing.

mod common;

use common::*;
use pocket_core::memory::Ledger;
use pocket_core::{Error, Model, Rows, Session};
use pocket_ggml::{GgmlModel, KV_BLOCK_TOKENS, LoadOptions};

#[test]
fn the_footprint_predicts_what_a_session_reserves() {
    let _serial = serial();
    let model = smol();
    let config = config(1024);
    let fp = model.footprint(&config).unwrap();
    let ledger = Ledger::unlimited();
    let mut s = model.new_session_in(&config, &ledger).unwrap();
    assert_eq!(ledger.used(), fp.compute_bytes, "a new session holds its compute buffer and nothing else");
    let plan = full(&model);
    let prompt = prose(&model, 150);
    s.decode(&prompt, &plan, Rows::Last).unwrap();
    let held = fp.compute_bytes + fp.kv_bytes(150) + fp.logits_row_bytes;
    assert_eq!(ledger.used(), held);
    assert_eq!(s.memory(), held, "the session's own account agrees with the ledger");
    s.truncate(10).unwrap();
    assert_eq!(ledger.used(), fp.compute_bytes + fp.kv_bytes(10) + fp.logits_row_bytes);
    drop(s);
    assert_eq!(ledger.used(), 0, "a dropped session gives everything back");
}

#[test]
fn a_session_stops_at_the_budget_with_an_error_that_loses_nothing() {
    let _serial = serial();
    let model = smol();
    let config = config(1024);
    let fp = model.footprint(&config).unwrap();
    // Room for the compute buffer, one row of logits and three blocks of KV.
    let blocks = 3;
    let budget = fp.compute_bytes + fp.logits_row_bytes + fp.kv_bytes(blocks * KV_BLOCK_TOKENS as u64);
    let ledger = Ledger::new(budget);
    let mut s = model.new_session_in(&config, &ledger).unwrap();
    let plan = full(&model);
    let text = prose(&model, 300);
    let (prompt, rest) = text.split_at(100);
    s.decode(prompt, &plan, Rows::Last).unwrap();
    let mut failed_at = None;
    for t in rest {
        let before = s.len();
        match s.decode(std::slice::from_ref(t), &plan, Rows::Last) {
            Ok(_) => assert!(ledger.used() <= budget),
            Err(e) => {
                let Error::OverBudget { needed, available, budget: b, ref what } = e else { panic!("{e}") };
                assert_eq!(b, budget);
                assert!(needed > available && what.contains("KV cache"), "{e}");
                assert!(e.to_string().contains("budget"), "{e}");
                assert_eq!(s.len(), before, "a refused decode leaves the session as it was");
                failed_at = Some(before);
                break;
            }
        }
    }
    assert_eq!(failed_at, Some(blocks as usize * KV_BLOCK_TOKENS), "the fourth block is refused");
    // The session still works within what it holds.
    s.truncate(150).unwrap();
    s.decode(&rest[50..51], &plan, Rows::Last).unwrap();
    drop(s);
    assert_eq!(ledger.used(), 0);
}

#[test]
fn a_budget_too_small_for_the_compute_buffer_refuses_the_session() {
    let _serial = serial();
    let model = smol();
    let ledger = Ledger::new(1 << 20);
    let e = model.new_session_in(&config(1024), &ledger).err().expect("1 MiB cannot hold a session");
    let e = pocket_core::Error::from(e);
    assert!(matches!(e, Error::OverBudget { .. }), "{e}");
    assert!(e.to_string().contains("compute buffer"), "{e}");
    assert_eq!(ledger.used(), 0);
}

#[test]
fn a_long_verification_loop_reserves_only_its_window_and_reuses_rejected_positions() {
    let _serial = serial();
    let model = smol();
    let config = config(2048);
    let fp = model.footprint(&config).unwrap();
    let ledger = Ledger::unlimited();
    let mut s = model.new_session_in(&config, &ledger).unwrap();
    let plan = full(&model);
    let text = prose(&model, 1100);
    let (prompt, rest) = text.split_at(100);
    s.decode(prompt, &plan, Rows::Last).unwrap();
    // The shape of speculative decoding over 1000 tokens (16 blocks): each step verifies a
    // window of K + 1 = 9 positions and keeps some of them (here 1 to 5, as rejections do).
    let k = 8;
    let (mut kept, mut step) = (0, 0);
    while kept + k < rest.len() {
        let held = s.len();
        let window = &rest[kept..kept + k + 1];
        s.decode(window, &plan, Rows::Tail(k + 1)).unwrap();
        let logits = fp.logits_row_bytes * (k as u64 + 1);
        assert_eq!(
            ledger.used(),
            fp.compute_bytes + fp.kv_bytes(held as u64 + k as u64 + 1) + logits,
            "step {step}: the KV cache holds the tokens and the window, in blocks, and nothing more"
        );
        let accepted = 1 + step % 5;
        s.truncate(held + accepted).unwrap();
        assert_eq!(
            ledger.used(),
            fp.compute_bytes + fp.kv_bytes((held + accepted) as u64) + logits,
            "step {step}: rejected positions are given back at once"
        );
        kept += accepted;
        step += 1;
    }
    assert!(s.len() > 100 + 15 * KV_BLOCK_TOKENS, "crossed many blocks: {} tokens", s.len());
    assert!(
        ledger.peak()
            <= fp.compute_bytes + fp.kv_bytes(s.len() as u64 + k as u64 + 1) + fp.logits_row_bytes * 9,
        "the peak is the last window's, not the context's"
    );
    drop(s);
    assert_eq!(ledger.used(), 0);
}

#[test]
fn a_preallocated_session_holds_the_whole_context_from_the_start() {
    let _serial = serial();
    let model = smol();
    let config = pocket_core::SessionConfig { preallocate: true, ..config(1024) };
    let fp = model.footprint(&config).unwrap();
    let ledger = Ledger::unlimited();
    let mut s = model.new_session_in(&config, &ledger).unwrap();
    assert_eq!(ledger.used(), fp.compute_bytes + fp.kv_bytes(1024));
    s.decode(&prose(&model, 100), &full(&model), Rows::Last).unwrap();
    s.truncate(0).unwrap();
    assert_eq!(s.kv_bytes() as u64, fp.kv_bytes(1024), "kept after truncation");
}

/// SmolLM2 on the build's device, paid for in `ledger`.
fn load_in(ledger: &Ledger) -> pocket_ggml::Result<GgmlModel> {
    let options = LoadOptions { device: device(), ledger: Some(ledger.clone()), ..LoadOptions::default() };
    GgmlModel::load(&model_path(SMOL), &options)
}

#[test]
fn what_is_on_the_device_is_paid_for_in_its_memory_and_the_rest_in_the_hosts() {
    let _serial = serial();
    let file = std::fs::metadata(model_path(SMOL)).unwrap().len();
    let ledger = Ledger::new(4 << 30).with_device_pool("the device", 4 << 30);
    let model = load_in(&ledger).unwrap();
    let on_cpu = model.device_name() == "CPU";
    let weights = (ledger.used(), ledger.device_used());
    let config = config(1024);
    let mut s = model.new_session_in(&config, &ledger.sub()).unwrap();
    s.decode(&prose(&model, 300), &full(&model), Rows::Last).unwrap();
    let session = (ledger.used() - weights.0, ledger.device_used() - weights.1);
    eprintln!(
        "on {}: weights {} B in host memory, {} B on the device; a session of 300 tokens {} B and {} B",
        model.device_name(),
        weights.0,
        weights.1,
        session.0,
        session.1
    );
    if on_cpu {
        assert_eq!((weights.1, session.1), (0, 0), "nothing is on a device");
        assert!(weights.0 > 0 && session.0 > 0);
    } else {
        // The matrices and the KV cache on the device; the token embedding, the logits and
        // the CPU's share of the compute buffers in host memory.
        let embedding = model.info().n_vocab as u64 * model.info().n_embd as u64;
        assert!(weights.1 > file / 2 && weights.0 > 0 && weights.0 < file / 2, "{weights:?} of {file}");
        assert!(weights.0 >= embedding / 4, "the token embedding stays in host memory: {weights:?}");
        let kv = model.footprint(&config).unwrap().kv_bytes(300);
        assert!(session.1 >= kv && session.0 > 0, "{session:?}, KV {kv}");
    }
    drop(s);
    assert_eq!((ledger.used(), ledger.device_used()), weights, "a dropped session gives both back");
    drop(model);
    assert_eq!((ledger.used(), ledger.device_used()), (0, 0));

    // A device pool too small for the weights refuses them, naming the device, and takes
    // nothing; on the CPU it is never drawn on.
    let small = Ledger::new(4 << 30).with_device_pool("the device", 1 << 20);
    match load_in(&small) {
        Ok(m) => {
            assert!(on_cpu && small.device_used() == 0, "{} B on {}", small.device_used(), m.device_name())
        }
        Err(e) => {
            let e = pocket_core::Error::from(e);
            assert!(!on_cpu && e.to_string().contains("the device"), "{e}");
            assert!(matches!(e, Error::OverBudget { .. }), "{e}");
        }
    }
    assert_eq!((small.used(), small.device_used()), (0, 0));
}

/// A model pays for its weights in the ledger it loads in, and on an OpenVINO device for the
/// models the backend compiles for its passes too (each holds a copy of the weights: SmolLM2's
/// two took 485 MB beside 173 MB of weights); all of it comes back when the model goes.
#[test]
fn a_model_pays_for_what_its_device_compiles() {
    let _serial = serial();
    let path = model_path(SMOL);
    let file = std::fs::metadata(&path).unwrap().len();
    let ledger = Ledger::unlimited();
    let options = LoadOptions { device: device(), ledger: Some(ledger.clone()), ..Default::default() };
    let model = GgmlModel::load(&path, &options).unwrap();
    assert!(ledger.used() > 0, "the weights are paid for");
    if model.device_name().starts_with("openvino:") {
        assert!(
            ledger.used() > 3 * file,
            "on {} the compiled models are paid for: {} bytes held for a {file}-byte file",
            model.device_name(),
            ledger.used()
        );
    }
    drop(model);
    assert_eq!(ledger.used(), 0, "everything comes back with the model");
}
