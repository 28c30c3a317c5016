use std::path::PathBuf;

/// What went wrong loading or running a model on ggml.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model file could not be opened or read.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a GGUF file.
    #[error("{path} is not a GGUF model: it starts with {found}, GGUF files start with \"GGUF\"")]
    NotGguf {
        /// The file.
        path: PathBuf,
        /// What the file starts with, described.
        found: String,
    },
    /// The file is a GGUF file but damaged: a header that does not parse, or data cut short.
    #[error("{path} is a damaged GGUF file: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The model's architecture is not one this engine builds a graph for.
    #[error("architecture {arch:?} is not supported; supported: {}", supported.join(", "))]
    UnsupportedArchitecture {
        /// The architecture the file names.
        arch: String,
        /// Those it does build.
        supported: &'static [&'static str],
    },
    /// The architecture is one our graph builds, but the file has a feature its graph does
    /// not (a RoPE scaling, a tensor it would leave out). llama.cpp itself may run it.
    #[error("{path}: our {arch} graph does not build {reason}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The architecture the file names.
        arch: String,
        /// What it has that the graph does not build.
        reason: String,
    },
    /// A metadata key or tensor that the architecture needs is missing or has the wrong shape.
    #[error("{path}: {reason}")]
    BadModel {
        /// The file.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
    },
    /// No ggml backend device matches the request.
    #[error("no ggml device {wanted:?}; available: {available}")]
    NoDevice {
        /// The device asked for.
        wanted: String,
        /// The devices there are.
        available: String,
    },
    /// ggml's RPC backend: missing from the build, a server that cannot start, a peer that is
    /// down, speaks another protocol version or fails mid-computation.
    #[error("rpc: {0}")]
    Rpc(String),
    /// An error of the engine boundary (bad argument, context overflow, tokenizer).
    #[error(transparent)]
    Core(#[from] pocket_core::Error),
    /// ggml or llama.cpp failed (allocation, graph computation).
    #[error("ggml: {0}")]
    Ggml(String),
}

impl From<Error> for pocket_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(core) => core,
            Error::Rpc(why) => pocket_core::Error::Unavailable(why),
            other => pocket_core::Error::Engine(other.to_string()),
        }
    }
}

impl Error {
    /// Whether the file is a model our graph does not build (its architecture, or a feature
    /// of it), rather than a bad file: llama.cpp may still run it.
    pub fn not_built_here(&self) -> bool {
        matches!(self, Error::UnsupportedArchitecture { .. } | Error::Unsupported { .. })
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
