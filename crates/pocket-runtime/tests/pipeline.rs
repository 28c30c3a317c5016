//! The request pipeline on a real model (SmolLM2): what it refuses and how, what `auto` does
//! before and after it knows the device, and learning that gives way when cancelled.

mod common;

use pocket_core::memory::Ledger;
use pocket_core::spec::{DrafterReport, SpecMode};
use pocket_core::{ChatMessage, Role, SessionConfig};
use pocket_runtime::learn::{self, TuneSettings};
use pocket_runtime::pipeline::{self, Input, Request};
use pocket_runtime::{ErrorKind, LoadedModel};

use common::{open, run, smollm2};

fn request(text: &str, spec: SpecMode) -> Request {
    let mut r = Request::new(Input::Chat(vec![ChatMessage::new(Role::User, text)]));
    r.spec = spec;
    r.stop.max_tokens = 40;
    r.session =
        SessionConfig { threads: pocket_core::Threads::Fixed(1), n_ctx: 512, ..SessionConfig::default() };
    r
}

#[test]
fn bad_requests_are_refused_before_anything_runs_naming_the_field() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let ledger = Ledger::unlimited();
    let refuse = |r: &Request| pipeline::prepare(&model, None, r, &ledger).unwrap_err();
    let e = refuse(&request("hi", SpecMode::InputCopy));
    assert_eq!((e.kind(), e.param()), (ErrorKind::Invalid, Some("spec")));
    assert!(e.to_string().contains("use suffix"), "{e}");
    let e = refuse(&request("hi", SpecMode::Draft));
    assert_eq!(e.param(), Some("draft_model"), "{e}");
    let mut r = request("hi", SpecMode::Off);
    r.input = Input::Text(String::new());
    let e = refuse(&r);
    assert_eq!(e.param(), Some("prompt"), "{e}");
    let mut r = request(&"word ".repeat(400), SpecMode::Off);
    r.session.n_ctx = 128;
    let e = refuse(&r);
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(matches!(e.core(), Some(pocket_core::Error::ContextOverflow { limit: 128, .. })), "{e}");
    let mut r = request("hi", SpecMode::Off);
    r.sampling.temperature = -1.0;
    assert_eq!(refuse(&r).param(), Some("temperature"));
    // A budget that cannot hold the session: the plan says so with the numbers.
    let tiny = Ledger::new(1 << 20);
    let e = pipeline::prepare(&model, None, &request("hi", SpecMode::Off), &tiny).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OverBudget, "{e}");
}

#[test]
fn auto_decodes_plainly_until_the_device_is_measured_and_then_drafts_losslessly() {
    let cache = tempfile::tempdir().unwrap();
    let model = smollm2(cache.path());
    let text = "Repeat this line three times: the quick brown fox jumps over the lazy dog";
    let plain = run(&model, &request(text, SpecMode::Off));
    assert_eq!(plain.drafter, None);
    let untuned = run(&model, &request(text, SpecMode::Auto));
    assert_eq!(untuned.drafter, Some(DrafterReport::AutoUnmeasured));
    assert_eq!(untuned.generation.spec.passes, plain.generation.spec.passes, "no drafts at all");
    assert_eq!(untuned.generation.tokens, plain.generation.tokens);

    // Learning that is cancelled at once learns nothing and says so.
    let settings = TuneSettings::new(1, pocket_core::KvType::F16);
    assert!(learn::needs_tuning(&model, &settings));
    let tuned = learn::tune(&model, &settings, &Ledger::unlimited(), &|| true, &mut |_| {}).unwrap();
    assert!(tuned.cancelled && tuned.known.curve.is_none());
    // Learning that runs to its end is remembered, on disk too.
    let tuned = learn::tune(&model, &settings, &Ledger::unlimited(), &|| false, &mut |_| {}).unwrap();
    assert!(tuned.measured_curve && !tuned.cancelled);
    assert!(!learn::needs_tuning(&model, &settings));
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1);
    let again = smollm2(cache.path());
    assert!(!learn::needs_tuning(&again, &settings), "what was learned is read back");

    let auto = run(&model, &request(text, SpecMode::Auto));
    let drafter = auto.drafter.unwrap();
    assert!(matches!(drafter, DrafterReport::Auto(_)), "{drafter}");
    assert_eq!(auto.generation.tokens, plain.generation.tokens, "greedy output is plain decoding's");
}

/// The KV types a request is given as the budget shrinks, until it no longer fits.
fn kv_types_down_the_ladder(model: &LoadedModel) -> Vec<pocket_core::KvType> {
    let mut r = request("Tell me a long story about a lighthouse keeper.", SpecMode::Off);
    r.session.n_ctx = 8192;
    r.stop.max_tokens = 8000;
    let mut seen = Vec::new();
    let mut budget = 1u64 << 30;
    while let Ok(p) = pipeline::prepare(model, None, &r, &Ledger::new(budget)) {
        let kv = p.plan.unwrap().kv;
        if seen.last() != Some(&kv) {
            seen.push(kv);
        }
        budget = budget * 15 / 16;
    }
    seen
}

#[test]
fn the_memory_ladder_keeps_eight_bit_keys_where_four_bit_keys_change_the_answers() {
    use pocket_core::KvType;
    use pocket_runtime::GOOD_KV_AGREEMENT;
    let cache = tempfile::tempdir().unwrap();
    let model = open("qwen2.5-coder-0.5b", cache.path());
    // Until the agreement is measured, keys stay at 8 bits.
    assert_eq!(kv_types_down_the_ladder(&model), [KvType::F16, KvType::Q8_0, KvType::Q8_0_Q4_0]);
    let kv_types = [KvType::Q8_0, KvType::Q8_0_Q4_0, KvType::Q4_0];
    let measured =
        learn::measure_kv_agreement(&model, 2, &kv_types, &Ledger::unlimited(), &|| false).unwrap();
    eprintln!("{measured:?}");
    let agreement = |kv| measured.iter().find(|m| m.0 == kv).unwrap().1;
    // Qwen's keys lose the answer at 4 bits; its values do not.
    assert!(agreement(KvType::Q4_0) < GOOD_KV_AGREEMENT, "{measured:?}");
    assert!(agreement(KvType::Q8_0_Q4_0) >= GOOD_KV_AGREEMENT, "{measured:?}");
    assert!(agreement(KvType::Q8_0) >= agreement(KvType::Q8_0_Q4_0), "{measured:?}");
    // Once learned (as the daemon does while idle), the ladder stops at the mix...
    let tuned = learn::tune(
        &model,
        &TuneSettings { skip_search: learn::SkipSearch::Never, ..TuneSettings::new(1, KvType::F16) },
        &Ledger::unlimited(),
        &|| false,
        &mut |_| {},
    )
    .unwrap();
    assert!(tuned.measured_kv_agreement);
    assert_eq!(model.knowledge().lowest_kv(), KvType::Q8_0_Q4_0);
    assert_eq!(kv_types_down_the_ladder(&model), [KvType::F16, KvType::Q8_0, KvType::Q8_0_Q4_0]);
    // ...and a model whose 4-bit keys keep the answers would go on to q4_0.
    model.knowledge().remember_kv_agreement(KvType::Q4_0, 0.99);
    assert_eq!(kv_types_down_the_ladder(&model).last(), Some(&KvType::Q4_0));
    // What is measured is remembered for the next start.
    let again = open("qwen2.5-coder-0.5b", cache.path());
    assert_eq!(again.knowledge().kv_agreement(KvType::Q8_0_Q4_0), Some(agreement(KvType::Q8_0_Q4_0)));
}
