//! pocketd's decoder engine: our own transformer graph on ggml.
//!
//! [`GgmlModel`] loads a GGUF file — weights memory-mapped, repacked where ggml's CPU has a
//! faster layout, tokenizer and chat template from llama.cpp's vocab-only load — and makes
//! [`GgmlSession`]s, which implement pocket-core's [`Session`](pocket_core::Session): decode any
//! subset of layers ([`LayerPlan`](pocket_core::LayerPlan)), logits only for the rows asked,
//! a KV cache in f16, q8_0 or q4_0 that grows with the tokens held, and `truncate`.
//! [`LlamaCppModel`] runs, behind the same traits, the GGUF files our graph does not build
//! (other architectures, features of theirs it leaves out) on llama.cpp's own graph;
//! [`graph_support`] says which of the two a file needs. [`LlamaCpp`] runs a file through
//! llama.cpp as reference and baseline.
//!
//! ```no_run
//! use pocket_core::{LayerPlan, Model, Rows, Session, SessionConfig, Tokenizer};
//! use pocket_ggml::{GgmlModel, LoadOptions};
//!
//! let model = GgmlModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &LoadOptions::default())?;
//! let mut session = model.session(&SessionConfig::default())?;
//! let prompt = model.tokenizer().encode("The capital of France is", true)?;
//! let full = LayerPlan::full(model.info().n_layers)?;
//! let logits = session.decode(&prompt, &full, Rows::Last)?;
//! let next = pocket_core::sampling::argmax(logits.last());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod arch;
#[allow(unsafe_code)]
mod attention;
mod batch;
mod compute;
mod convert;
mod embedder;
mod encoder;
mod error;
mod exact;
#[allow(unsafe_code)]
mod ffi;
#[allow(unsafe_code)]
mod gemm;
mod graph;
mod hparams;
mod kv;
mod llama_cpp_engine;
mod llama_cpp_reference;
mod loaded;
mod model;
pub mod parity;
mod parts;
pub mod rpc;
mod session;
mod split;
mod weights;

pub use attention::AttentionKernel;
pub use convert::WeightFormat;
pub use embedder::{EmbeddingGraph, EmbeddingModel, is_embedding_model};
pub use error::{Error, Result};
pub use ffi::device::Repack;
pub use ffi::device::{DeviceChoice, DeviceMemory, device_memory, device_names};
pub use ffi::gguf::type_layout as ggml_type_layout;
pub use ffi::gguf_check;
pub use ffi::heap::release_free_heap;
pub use ffi::vocab::Vocab;
pub use gemm::timing::{KernelTiming, kernel_isa};
pub use gemm::{kernel_formats, time_kernel};
pub use hparams::SUPPORTED_ARCHITECTURES;
pub use kv::KV_BLOCK_TOKENS;
pub use llama_cpp_engine::{LlamaCppModel, LlamaCppSession};
pub use llama_cpp_reference::{LlamaCpp, Together};
pub use model::{GgmlModel, GraphSupport, LoadOptions, graph_support};
pub use session::{GgmlSession, MAX_LOGIT_ROWS};
