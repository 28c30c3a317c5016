//! What the pipeline's tests share: opening a catalogue model and running a request on it.
#![allow(dead_code)] // each test file uses what it needs

use std::ops::ControlFlow;
use std::path::Path;

use pocket_core::memory::Ledger;
use pocket_runtime::pipeline::{self, OnEvent, Outcome, Request};
use pocket_runtime::{LoadedModel, OpenOptions};

/// The catalogue model `name`, what it learns kept in `cache`.
pub(crate) fn open(name: &str, cache: &Path) -> LoadedModel {
    let dir = pocket_models::models_dir(None);
    let path = pocket_models::resolve(name, &dir)
        .unwrap_or_else(|e| panic!("the tests need {name} (pocket pull {name}): {e}"))
        .path;
    let options = OpenOptions { cache_dir: Some(cache.to_path_buf()), ..OpenOptions::default() };
    LoadedModel::open(&path, &options).unwrap()
}

/// The default model, SmolLM2-135M.
pub(crate) fn smollm2(cache: &Path) -> LoadedModel {
    open("smollm2-135m", cache)
}

/// Prepare and run `r` with no budget, ignoring the events.
pub(crate) fn run(model: &LoadedModel, r: &Request) -> Outcome {
    let ledger = Ledger::unlimited();
    let prepared = pipeline::prepare(model, None, r, &ledger).unwrap();
    pipeline::run(model, None, &prepared, &ledger, &mut OnEvent::new(|_| ControlFlow::Continue(()))).unwrap()
}
