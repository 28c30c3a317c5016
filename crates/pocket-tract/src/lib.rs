//! pocketd's encoder-decoder engine: ONNX seq2seq models (T5 and its kin) on tract.
//!
//! A model is a directory in Hugging Face Optimum's layout (`encoder_model.onnx`,
//! `decoder_model.onnx`, optionally `decoder_with_past_model.onnx`) or the two-file layout
//! without a cache (`encoder.onnx`, `decoder.onnx`), with `tokenizer.json` beside them
//! ([`Layout`]). [`TractModel`] and [`TractSession`] implement the engine boundary of
//! `pocket_core`: a session encodes its source once ([`pocket_core::Session::encode`]), then
//! decodes — with the with-past decoder, feeding it the KV cache this engine owns (f32, or
//! KIVI-quantized: [`kivi`]); without it, recomputing the prefix. Several tokens decode in
//! one call either way, which is what verifying a speculative draft needs.
//!
//! ```no_run
//! use pocket_core::{LayerPlan, Model, Rows, SessionConfig, Tokenizer, argmax};
//! use pocket_tract::TractModel;
//!
//! let model = TractModel::load("models/store/flan-t5-small".as_ref())?;
//! let source = model.tokenizer().encode("translate English to German: The house is wonderful.", true)?;
//! let mut session = model.session(&SessionConfig::default())?;
//! session.encode(&source)?;
//! let plan = LayerPlan::full(model.info().n_layers)?;
//! let first = argmax(session.decode(&[model.decoder_start()], &plan, Rows::Last)?.last());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod graph;
pub mod kivi;
pub mod kv;
mod layout;
mod loaded;
mod model;
mod roles;
mod session;
mod tokenizer;

pub use error::Error;
pub use kv::{KV_WINDOW, kv_bits, kv_bytes_per_token};
pub use layout::Layout;
pub use model::TractModel;
pub use session::TractSession;
pub use tokenizer::HfTokenizer;
