//! pocketd's decoder engine: our own transformer graph on ggml.
//!
//! [`GgmlModel`] loads a GGUF file — weights memory-mapped, repacked where ggml's CPU has a
//! faster layout, tokenizer and chat template from llama.cpp's vocab-only load — and makes
//! [`GgmlSession`]s, which implement pocket-core's [`Session`](pocket_core::Session): decode any
//! subset of layers ([`LayerPlan`](pocket_core::LayerPlan)), logits only for the rows asked,
//! a KV cache in f16, q8_0 or q4_0 that grows with the tokens held, and `truncate`.
//! [`LlamaCpp`] runs the same file through llama.cpp itself, as reference and baseline.
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

mod attention;
mod convert;
mod device;
mod error;
mod gguf;
mod graph;
mod kv;
mod model;
pub mod parity;
mod q4_1_gemm;
mod reference;
mod session;
mod vocab;
mod weights;

pub use convert::WeightFormat;
pub use device::{DeviceChoice, device_names};
pub use error::{Error, Result};
pub use kv::KV_BLOCK_TOKENS;
pub use model::{AttentionKernel, GgmlModel, LoadOptions};
pub use reference::LlamaCpp;
pub use session::{GgmlSession, MAX_LOGIT_ROWS};
pub use vocab::Vocab;
pub use weights::SUPPORTED_ARCHITECTURES;

use std::ffi::{CStr, c_char, c_void};
use std::sync::Once;

use llama_cpp_sys_2 as sys;

/// Initialise llama.cpp's backends once per process and route ggml's and llama.cpp's logs to
/// `tracing` (they would otherwise print to stderr).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // ggml's tiled K-quant matmul takes over from 8 rows, with other arithmetic than the
        // 1-row kernel: verification passes (up to MAX_DRAFT + 1 rows) must compute each row
        // as plain decoding does, so it is off unless the operator asked for it explicitly.
        // ggml reads the variable once, at its first matmul, which comes after this.
        if std::env::var_os("GGML_CPU_TILED_MM").is_none() {
            // SAFETY: set once, at the first use of ggml, before any ggml code runs; Rust
            // code of this process does not read this variable concurrently.
            unsafe { std::env::set_var("GGML_CPU_TILED_MM", "0") };
        }
        // SAFETY: `log` matches ggml_log_callback and ignores user_data; backend init is
        // called once, before any other llama.cpp use.
        unsafe {
            sys::llama_log_set(Some(log), std::ptr::null_mut());
            sys::ggml_log_set(Some(log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

unsafe extern "C" fn log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated message valid for the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    if level == sys::GGML_LOG_LEVEL_ERROR {
        tracing::warn!(target: "ggml", "{msg}");
    } else if level == sys::GGML_LOG_LEVEL_WARN {
        tracing::info!(target: "ggml", "{msg}");
    } else {
        tracing::trace!(target: "ggml", "{msg}");
    }
}
