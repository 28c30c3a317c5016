//! The engine boundary's conformance suite (`pocket_core::conformance`) on tract: t5-tiny with
//! its KV cache (f32 and KIVI 4-bit) and without it (every call recomputes the prefix).

mod common;

use common::*;
use pocket_core::conformance::Subject;
use pocket_core::{KvType, Model, SessionConfig};
use pocket_tract::TractModel;

/// tract's matrix products may sum a pass of several rows in another order than one row.
const TOL: f32 = 1e-3;

fn subject(model: TractModel, kv: KvType) -> Subject {
    let prompt =
        model.tokenizer().encode("translate English to German: The house is wonderful.", true).unwrap();
    Subject {
        model: Box::new(model),
        prompt,
        config: SessionConfig {
            kv,
            n_ctx: 64,
            threads: pocket_core::Threads::Fixed(1),
            ..SessionConfig::default()
        },
        tolerance: TOL,
        serial: None,
    }
}

fn with_past() -> Subject {
    subject(TractModel::load(&t5_tiny()).unwrap(), KvType::F32)
}

fn with_past_4bit() -> Subject {
    subject(TractModel::load(&t5_tiny()).unwrap(), KvType::Q4_0)
}

fn without_past() -> Subject {
    // The directory is only needed while loading: the graphs are read into memory.
    let dir = t5_tiny_without_past();
    subject(TractModel::load(dir.path()).unwrap(), KvType::F32)
}

pocket_core::conformance_tests!(t5_tiny_with_past, with_past);
pocket_core::conformance_tests!(t5_tiny_with_past_4bit, with_past_4bit);
pocket_core::conformance_tests!(t5_tiny_without_past, without_past);
