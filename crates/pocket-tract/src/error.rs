use std::path::PathBuf;

/// What went wrong loading or running an ONNX encoder-decoder model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model directory is missing a file the layouts need, or is no directory.
    #[error("{dir}: {reason}")]
    Layout {
        /// The model directory.
        dir: PathBuf,
        /// What is missing, and what was expected.
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A graph does not load, or its inputs and outputs are not those of its role.
    #[error("{path}: {reason}")]
    BadGraph {
        /// The graph file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `tokenizer.json` does not load.
    #[error("{path}: not a usable tokenizer.json: {reason}")]
    BadTokenizer {
        /// The file.
        path: PathBuf,
        /// What the tokenizers crate said.
        reason: String,
    },
    /// An error of the engine boundary (bad argument, context overflow, budget).
    #[error(transparent)]
    Core(#[from] pocket_core::Error),
}

impl From<Error> for pocket_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Core(inner) => inner,
            other => pocket_core::Error::engine(other),
        }
    }
}
