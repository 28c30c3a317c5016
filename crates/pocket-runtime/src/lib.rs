//! pocketd's one request pipeline: what `pocket run`, the daemon's scheduler and
//! `pocket bench` all call, so that what the benchmark measures is what a user gets.
//!
//! A request flows through one place:
//!
//! 1. [`LoadedModel::open`] finds the engine for the file (GGUF on our ggml graph, an ONNX
//!    directory on tract) and opens what is known about the model on this device
//!    ([`Knowledge`]: its verification cost curves and layer-skip set, remembered on disk).
//! 2. [`pipeline::prepare`] renders the input (the model's chat template, or text as it is),
//!    tokenizes it, checks it against the context, and plans the session under the memory
//!    budget ([`pocket_core::memory::plan`]) when asked to.
//! 3. [`pipeline::run`] builds the drafter the mode asks for from what the model offers
//!    ([`pocket_core::Model::drafters`]) and what is known ([`drafters`]), makes the session,
//!    encodes the source of an encoder-decoder model, and runs the generation loop of
//!    `pocket_core`, streaming events to a [`pipeline::Sink`].
//!
//! Learning — measuring cost curves, searching skip sets — is never done inside a request:
//! [`learn::tune`] runs it while the machine is otherwise idle (the daemon) or on an explicit
//! `pocket tune`, and can be cancelled between passes. Until a drafter is known to pay on this
//! device, `auto` does not use it.
#![deny(missing_docs)]

pub mod chat_template;
mod closing;
pub mod drafters;
pub mod embed;
mod engine;
mod error;
/// GBNF grammars (llama.cpp's format) converted to llguidance's Lark dialect.
pub mod gbnf;
pub mod grammar;
pub mod histories;
pub mod json_close;
pub mod json_least;
mod knowledge;
pub mod learn;
mod learning_text;
pub mod pipeline;
pub mod process;
pub mod prompt_cache;
pub mod reasoning;
pub mod tools;
mod validate;
pub mod weight_choice;

pub use engine::{Engine, LoadedModel, OpenOptions, is_onnx};
pub use error::{Error, ErrorKind, Result};
pub use histories::Histories;
pub use knowledge::{GOOD_KV_AGREEMENT, Knowledge, Known, cache_dir};
pub use pipeline::{Input, Outcome, Prepared, Request, Sink};
pub use prompt_cache::PromptCache;
pub use validate::{Settings, validate};
// What the daemon, the CLI and the benchmark need of the engines, so that they reach them only
// through this crate: the device and weight-format choices, the architectures our graph
// builds, llama.cpp as reference and baseline, and the parity check against it; the
// encoder-decoder engine and its KV arithmetic for the seq2seq benchmark's KV report.
pub use pocket_ggml::{
    DeviceChoice, DeviceMemory, LlamaCpp, SUPPORTED_ARCHITECTURES, WeightFormat, device_memory, parity, rpc,
};
pub use pocket_tract::{TractModel, kv_bytes_per_token};

/// Longest draft a request asks for unless it says otherwise (`auto` chooses its own length
/// up to this).
pub const DEFAULT_MAX_DRAFT: usize = 8;
