//! The engine-agnostic core of pocketd.
//!
//! Engines (ggml for decoders, tract for encoder-decoders) implement two traits:
//! [`Model`], loaded read-only weights, and [`Session`], one conversation's state (its KV
//! cache). Everything above the engines — sampling, stop conditions, the generation loop and
//! speculative decoding — is written against these traits only, so it never knows
//! which engine runs underneath.
//!
//! ```
//! use pocket_core::LayerPlan;
//!
//! // A 30-layer model drafting with layers 10..20 skipped.
//! let plan = LayerPlan::full(30).unwrap().without(10..20).unwrap();
//! assert_eq!(plan.count(), 20);
//! assert!(plan.runs(9) && !plan.runs(10));
//! ```
#![deny(missing_docs)]

pub mod conformance;
pub mod constraint;
pub mod cost;
pub mod cpu;
pub mod embed;
mod error;
mod fingerprint;
pub mod generate;
mod layer_plan;
pub mod memory;
mod model;
pub mod sampling;
pub mod spec;
pub mod stop;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tokenizer;

pub use constraint::Constraint;
pub use cpu::Threads;
pub use embed::{Embedder, EmbedderInfo};
pub use error::{Error, Result};
pub use fingerprint::fingerprint;
pub use generate::{
    Event, GenerateRequest, Generation, Guide, generate, generate_guided, generate_speculative,
};
pub use layer_plan::{LayerPlan, MAX_LAYERS};
pub use model::{
    CacheKey, DEFAULT_MAX_ROWS, ExactPasses, Footprint, KvElement, KvType, LayerPlacement, Logits, Model,
    ModelInfo, ModelKind, PassRecord, PassStats, Rows, SavedState, Session, SessionConfig, SharedPasses,
    check_decode, check_path, check_restore, check_tree, default_threads, next_pass, passes, tree_depths,
};
pub use sampling::{Distribution, Sampler, SamplingConfig, argmax};
pub use stop::{Chunk, StopConfig, StopReason, TextStream};
pub use tokenizer::{ChatMessage, FunctionCall, Role, Tokenizer, ToolCall};

/// A token id in a model's vocabulary.
pub type Token = u32;

/// pocketd's cache directory (what it learned of models and devices, compiled graphs):
/// `$POCKET_CACHE_DIR`, else `$XDG_CACHE_HOME/pocketd`, else `~/.cache/pocketd` (the systemd
/// unit sets `POCKET_CACHE_DIR=/var/cache/pocketd`).
pub fn cache_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("POCKET_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(std::path::PathBuf::from(d).join("pocketd"));
    }
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/pocketd"))
}
