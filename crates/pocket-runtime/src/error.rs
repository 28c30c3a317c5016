//! What can go wrong on the request path, typed so that transports can choose a status and a
//! message from the data rather than from text.

/// A request's or a model's failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request's setting is wrong; `param` names the field at fault where one is.
    #[error("{message}")]
    Invalid {
        /// The request field (`spec`, `messages`, `draft_model`, ...).
        param: Option<&'static str>,
        /// What was wrong and what is allowed.
        message: String,
    },
    /// An error of the engine boundary, with its data (a context overflow with its numbers, an
    /// allocation over the budget with its bytes, a cancellation, ...).
    #[error(transparent)]
    Core(pocket_core::Error),
    /// A GGUF model ggml cannot serve (not GGUF, damaged, an architecture we do not build), or
    /// ggml itself failing.
    #[error(transparent)]
    Ggml(pocket_ggml::Error),
    /// An ONNX model directory tract cannot serve.
    #[error(transparent)]
    Tract(pocket_tract::Error),
}

/// What kind of failure an [`Error`] is, for a transport to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong: a field's value, an empty prompt, a mode the model lacks.
    Invalid,
    /// The prompt does not fit the context.
    TooLarge,
    /// The memory budget cannot hold what is asked for.
    OverBudget,
    /// The request was cancelled.
    Cancelled,
    /// The model's file cannot be served (missing, damaged, unsupported): the operator's to fix.
    BadModel,
    /// The engine failed; the message is for the logs, not for clients.
    Internal,
    /// Something the model needs outside this process is unavailable (a peer holding some of
    /// its layers): worth retrying later.
    Unavailable,
}

/// Results of the pipeline.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::Invalid`] about the request field `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid { param: Some(param), message: message.into() }
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        use pocket_core::Error as Core;
        match self {
            Error::Invalid { .. } => ErrorKind::Invalid,
            Error::Core(e) => match e {
                Core::ContextOverflow { .. } => ErrorKind::TooLarge,
                Core::OverBudget { .. } => ErrorKind::OverBudget,
                Core::Cancelled => ErrorKind::Cancelled,
                Core::Engine(_) => ErrorKind::Internal,
                Core::Unavailable(_) => ErrorKind::Unavailable,
                _ => ErrorKind::Invalid,
            },
            Error::Ggml(e) => match e {
                pocket_ggml::Error::Ggml(_) => ErrorKind::Internal,
                pocket_ggml::Error::Rpc(_) => ErrorKind::Unavailable,
                pocket_ggml::Error::NoDevice { .. } => ErrorKind::Invalid,
                _ => ErrorKind::BadModel,
            },
            Error::Tract(_) => ErrorKind::BadModel,
        }
    }

    /// The request field at fault, where one is.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            Error::Invalid { param, .. } => *param,
            _ => None,
        }
    }

    /// The model file or directory the error is about, where it names one.
    pub fn model_path(&self) -> Option<&std::path::Path> {
        use pocket_ggml::Error as G;
        use pocket_tract::Error as T;
        match self {
            Error::Ggml(
                G::Io { path, .. }
                | G::NotGguf { path, .. }
                | G::Corrupt { path, .. }
                | G::Unsupported { path, .. }
                | G::BadModel { path, .. },
            ) => Some(path),
            Error::Tract(T::Layout { dir: path, .. } | T::Io { path, .. } | T::BadGraph { path, .. }) => {
                Some(path)
            }
            Error::Tract(T::BadTokenizer { path, .. }) => Some(path),
            _ => None,
        }
    }

    /// The message for a client: as [`std::fmt::Display`], with the model's path on the
    /// server shortened to its file name (where the models are kept is the operator's).
    pub fn client_message(&self) -> String {
        let text = self.to_string();
        match self.model_path() {
            Some(path) => {
                let name = path.file_name().map_or_else(|| "the model".into(), |n| n.to_string_lossy());
                text.replace(&path.display().to_string(), &name)
            }
            None => text,
        }
    }

    /// The engine-boundary error inside, if this is one.
    pub fn core(&self) -> Option<&pocket_core::Error> {
        match self {
            Error::Core(e) => Some(e),
            _ => None,
        }
    }
}

impl From<pocket_core::Error> for Error {
    /// An invalid argument becomes [`Error::Invalid`] with its field and message as they are;
    /// every other core error is kept whole.
    fn from(e: pocket_core::Error) -> Self {
        match e {
            pocket_core::Error::InvalidArgument { param, message } => Error::Invalid { param, message },
            other => Error::Core(other),
        }
    }
}

impl From<pocket_ggml::Error> for Error {
    fn from(e: pocket_ggml::Error) -> Self {
        match e {
            pocket_ggml::Error::Core(core) => core.into(),
            other => Error::Ggml(other),
        }
    }
}

impl From<pocket_tract::Error> for Error {
    fn from(e: pocket_tract::Error) -> Self {
        match e {
            pocket_tract::Error::Core(core) => core.into(),
            other => Error::Tract(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_keep_their_kind_and_data() {
        let over = pocket_core::Error::OverBudget {
            what: "a session".into(),
            needed: 10,
            available: 1,
            budget: 100,
        };
        let e = Error::from(pocket_ggml::Error::Core(over.clone()));
        assert_eq!(e.kind(), ErrorKind::OverBudget);
        assert_eq!(e.core(), Some(&over));
        let e = Error::from(pocket_core::Error::ContextOverflow { needed: 5, limit: 4, prompt: 4 });
        assert_eq!(e.kind(), ErrorKind::TooLarge);
        assert_eq!(Error::from(pocket_core::Error::engine("boom")).kind(), ErrorKind::Internal);
        let e = Error::from(pocket_ggml::Error::UnsupportedArchitecture {
            arch: "mamba".into(),
            supported: pocket_ggml::SUPPORTED_ARCHITECTURES,
        });
        assert_eq!(e.kind(), ErrorKind::BadModel);
        let e = Error::invalid("spec", "no");
        assert_eq!((e.kind(), e.param()), (ErrorKind::Invalid, Some("spec")));
        // A core error's field and message arrive as they are, from whichever engine.
        let e = Error::from(pocket_ggml::Error::Core(pocket_core::Error::invalid_field("kv", "no q2 cache")));
        assert_eq!(
            (e.kind(), e.param(), e.to_string().as_str()),
            (ErrorKind::Invalid, Some("kv"), "no q2 cache")
        );
        // Where the operator keeps models stays on the server.
        let path = std::path::PathBuf::from("/var/lib/pocketd/models/bad.gguf");
        let e = Error::from(pocket_ggml::Error::Corrupt { path, reason: "a count past the end".into() });
        assert_eq!(e.client_message(), "bad.gguf is a damaged GGUF file: a count past the end");
    }
}
