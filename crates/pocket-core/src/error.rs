use std::fmt;

/// The result type of pocket-core and of the engines' trait methods.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in terms a caller can act on.
///
/// Engines map their own failures into these kinds; each variant carries the numbers or
/// names needed to say what was wrong and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A request's arguments are invalid (bad option value, empty prompt, ...).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The request field at fault (`temperature`, `stop`, `kv`, ...), where one is.
        param: Option<&'static str>,
        /// What was wrong and what is allowed.
        message: String,
    },
    /// The prompt plus the requested generation does not fit the session's context.
    #[error(
        "context overflow: {needed} tokens needed but the context holds {limit} \
         (prompt {prompt} tokens); shorten the prompt or raise the context size"
    )]
    ContextOverflow {
        /// Tokens the operation would need in the context.
        needed: usize,
        /// The context capacity.
        limit: usize,
        /// Tokens the prompt alone takes.
        prompt: usize,
    },
    /// A layer plan does not fit the model it is used with.
    #[error("layer plan: {0}")]
    LayerPlan(String),
    /// The operation is not supported by this model or engine.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The engine failed while running (allocation, backend or graph failure).
    #[error("engine: {0}")]
    Engine(String),
    /// Something the model needs outside this process is unavailable: a peer holding some of
    /// its layers is down, stopped answering or speaks another protocol.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The tokenizer could not encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The request was cancelled by its caller.
    #[error("cancelled")]
    Cancelled,
    /// An allocation would take the process past its memory budget.
    #[error(
        "over the memory budget: {what} needs {} but {} of the {} budget is free; \
         raise the budget, shorten the context or use a smaller KV type",
        crate::memory::format_size(*.needed),
        crate::memory::format_size(*.available),
        crate::memory::format_size(*.budget)
    )]
    OverBudget {
        /// What the memory was for.
        what: String,
        /// Bytes it needed.
        needed: u64,
        /// Bytes free in the budget then.
        available: u64,
        /// The budget.
        budget: u64,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] not tied to one request field.
    pub fn invalid(msg: impl fmt::Display) -> Self {
        Error::InvalidArgument { param: None, message: msg.to_string() }
    }

    /// An [`Error::InvalidArgument`] about the request field `param`.
    pub fn invalid_field(param: &'static str, msg: impl fmt::Display) -> Self {
        Error::InvalidArgument { param: Some(param), message: msg.to_string() }
    }

    /// An [`Error::Engine`] from anything printable.
    pub fn engine(msg: impl fmt::Display) -> Self {
        Error::Engine(msg.to_string())
    }
}
