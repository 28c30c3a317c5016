//! What can go wrong with a request, once for both transports: HTTP maps each kind to a
//! status and OpenAI's error body, D-Bus to a named `org.pocketd.Error.*` error.

/// A request's failure, with the message the client sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    /// Something in the request is wrong (a field's value, a malformed body), or the model it
    /// names cannot be served (its file is damaged or of an unsupported kind).
    #[error("{message}")]
    InvalidArgument {
        /// What was wrong and what is allowed.
        message: String,
        /// The request field at fault, if one is.
        param: Option<String>,
    },
    /// No model by that name in the models directory.
    #[error("{0}")]
    UnknownModel(String),
    /// No endpoint at that path (HTTP only).
    #[error("{0}")]
    UnknownEndpoint(String),
    /// No stored response by that id (HTTP only: the Responses API).
    #[error("{0}")]
    UnknownResponse(String),
    /// The prompt does not fit the context.
    #[error("{0}")]
    ContextLength(String),
    /// The request's body is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// Every turn and every place in the queue is taken.
    #[error("the request queue is full ({0} requests running or waiting); retry later")]
    QueueFull(usize),
    /// The memory budget cannot hold what the request needs, even after unloading idle models.
    #[error(
        "over the memory budget: {what} needs {} but {} of the {} budget is free; retry when other \
         requests have finished, or ask for less (a shorter context, a smaller KV type)",
        format_size(*.needed), format_size(*.available), format_size(*.budget)
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
    /// The caller has as many jobs running or queued as one caller may.
    #[error("{0}")]
    CallerLimit(String),
    /// The model is in use and cannot be unloaded now.
    #[error("{0}")]
    Busy(String),
    /// The daemon is stopping and takes no new requests.
    #[error("pocketd is shutting down")]
    ShuttingDown,
    /// Something the model needs outside the daemon is unavailable: an RPC peer holding some
    /// of its layers is down or stopped answering. The model is loaded again, peer and all, by
    /// the next request for it.
    #[error("{0}; retry when the peer is back")]
    Unavailable(String),
    /// The request was cancelled (by its client, or by the shutdown deadline).
    #[error("the request was cancelled")]
    Cancelled,
    /// The daemon failed. What failed is in its log under the request's id; clients get the id
    /// only, since the engine's own text may say things about the machine they should not see.
    #[error("pocketd failed internally on request {request}; its log has the details under that id")]
    Internal {
        /// The request's id (or, for a failure outside a generation, an id minted for it).
        request: String,
    },
}

use pocket_core::memory::format_size;
use pocket_runtime::ErrorKind;

impl ServeError {
    /// An [`ServeError::InvalidArgument`] about the field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ServeError::InvalidArgument { message: message.into(), param: Some(param.to_owned()) }
    }

    /// This error in the words of an API whose fields are named otherwise: a `param` among
    /// `names` (pocketd's name, the API's) takes the API's name.
    pub fn named(self, names: &[(&str, &str)]) -> Self {
        match self {
            ServeError::InvalidArgument { message, param: Some(param) } => {
                let param = names
                    .iter()
                    .find(|(ours, _)| *ours == param)
                    .map_or(param, |(_, theirs)| theirs.to_string());
                ServeError::InvalidArgument { message, param: Some(param) }
            }
            e => e,
        }
    }

    /// An [`ServeError::InvalidArgument`] not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ServeError::InvalidArgument { message: message.into(), param: None }
    }

    /// An internal failure of `request`: `detail` goes to the log with the request's id, the
    /// client gets the id.
    pub fn internal(request: Option<&str>, detail: impl std::fmt::Display) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let request = request.map_or_else(
            || format!("pocketd-e{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
            str::to_owned,
        );
        tracing::error!(request = %request, "internal error: {detail}");
        ServeError::Internal { request }
    }

    /// Classify a failure of the request pipeline by its kind, keeping its data: a context
    /// overflow is OpenAI's 400 `context_length_exceeded`, a budget that cannot fit is 503 with
    /// its numbers, a bad setting names its field, an engine failure is internal (logged under
    /// `request`).
    pub fn from_runtime(e: pocket_runtime::Error, request: Option<&str>) -> Self {
        match e.kind() {
            ErrorKind::Invalid => {
                ServeError::InvalidArgument { param: e.param().map(str::to_owned), message: e.to_string() }
            }
            // In OpenAI's words, which client libraries (litellm, LangChain) recognise to raise
            // their context-window errors.
            ErrorKind::TooLarge => match e.core() {
                Some(pocket_core::Error::ContextOverflow { needed, limit, prompt }) => {
                    ServeError::ContextLength(format!(
                        "This model's maximum context length is {limit} tokens. However, your request needs \
                         {needed} tokens (the prompt's {prompt} and at least one to generate); the context \
                         holds {limit}: shorten the prompt, or raise ctx_size"
                    ))
                }
                _ => ServeError::ContextLength(e.to_string()),
            },
            ErrorKind::OverBudget => match e.core() {
                Some(pocket_core::Error::OverBudget { what, needed, available, budget }) => {
                    ServeError::OverBudget {
                        what: what.clone(),
                        needed: *needed,
                        available: *available,
                        budget: *budget,
                    }
                }
                _ => ServeError::internal(request, e),
            },
            ErrorKind::Cancelled => ServeError::Cancelled,
            ErrorKind::BadModel => ServeError::invalid("model", e.client_message()),
            ErrorKind::Internal => ServeError::internal(request, e),
            ErrorKind::Unavailable => {
                let text = e.to_string();
                ServeError::Unavailable(
                    text.trim_start_matches("unavailable: ").trim_start_matches("rpc: ").to_owned(),
                )
            }
        }
    }

    /// A failure to open the model served as `name`.
    pub fn from_model(name: &str, e: pocket_runtime::Error) -> Self {
        match e.kind() {
            ErrorKind::BadModel | ErrorKind::Invalid => {
                // The full error, path included, goes to the log; the client gets the file name.
                tracing::warn!("cannot serve {name}: {e}");
                ServeError::invalid("model", format!("cannot serve {name}: {}", e.client_message()))
            }
            _ => ServeError::from_runtime(e, None),
        }
    }

    /// Whether this is the budget being full (worth unloading idle models and retrying).
    pub fn is_over_budget(&self) -> bool {
        matches!(self, ServeError::OverBudget { .. })
    }

    /// The HTTP status of this error.
    pub fn http_status(&self) -> u16 {
        match self {
            ServeError::InvalidArgument { .. } => 400,
            ServeError::UnknownModel(_) | ServeError::UnknownEndpoint(_) | ServeError::UnknownResponse(_) => {
                404
            }
            // OpenAI's status for a prompt over the context, which clients map to their
            // context-window errors.
            ServeError::ContextLength(_) => 400,
            ServeError::Busy(_) => 409,
            ServeError::TooLarge(_) => 413,
            ServeError::QueueFull(_) | ServeError::CallerLimit(_) => 429,
            ServeError::Cancelled => 499,
            ServeError::Internal { .. } => 500,
            ServeError::OverBudget { .. } | ServeError::ShuttingDown | ServeError::Unavailable(_) => 503,
        }
    }

    /// OpenAI's error `type` for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            ServeError::InvalidArgument { .. } | ServeError::ContextLength(_) | ServeError::TooLarge(_) => {
                "invalid_request_error"
            }
            ServeError::UnknownModel(_) | ServeError::UnknownEndpoint(_) | ServeError::UnknownResponse(_) => {
                "not_found_error"
            }
            ServeError::Busy(_) => "conflict_error",
            ServeError::QueueFull(_) | ServeError::CallerLimit(_) => "rate_limit_error",
            ServeError::OverBudget { .. } | ServeError::ShuttingDown | ServeError::Unavailable(_) => {
                "service_unavailable_error"
            }
            ServeError::Cancelled => "cancelled",
            ServeError::Internal { .. } => "server_error",
        }
    }

    /// OpenAI's machine-readable `code` (`model_not_found`, `context_length_exceeded`, ...);
    /// pocketd's own conditions in the same style.
    pub fn openai_code(&self) -> &'static str {
        match self {
            ServeError::InvalidArgument { .. } => "invalid_value",
            ServeError::UnknownModel(_) => "model_not_found",
            ServeError::UnknownEndpoint(_) => "unknown_url",
            ServeError::UnknownResponse(_) => "not_found",
            ServeError::ContextLength(_) => "context_length_exceeded",
            ServeError::TooLarge(_) => "request_too_large",
            ServeError::QueueFull(_) | ServeError::CallerLimit(_) => "rate_limit_exceeded",
            ServeError::OverBudget { .. } => "over_memory_budget",
            ServeError::Busy(_) => "model_busy",
            ServeError::ShuttingDown => "shutting_down",
            ServeError::Unavailable(_) => "peer_unavailable",
            ServeError::Cancelled => "cancelled",
            ServeError::Internal { .. } => "server_error",
        }
    }

    /// The name of the condition in pocketd's own terms: the last part of the D-Bus error name
    /// and the `code` label of the failed-requests metric.
    pub fn name(&self) -> &'static str {
        match self {
            ServeError::InvalidArgument { .. } => "InvalidArgument",
            ServeError::UnknownModel(_) => "UnknownModel",
            ServeError::UnknownEndpoint(_) => "UnknownEndpoint",
            ServeError::UnknownResponse(_) => "UnknownResponse",
            ServeError::ContextLength(_) | ServeError::TooLarge(_) => "TooLarge",
            ServeError::QueueFull(_) | ServeError::CallerLimit(_) => "QueueFull",
            ServeError::OverBudget { .. } => "OverBudget",
            ServeError::Busy(_) => "Busy",
            ServeError::ShuttingDown => "ShuttingDown",
            ServeError::Unavailable(_) => "Unavailable",
            ServeError::Cancelled => "Cancelled",
            ServeError::Internal { .. } => "Failed",
        }
    }

    /// The body OpenAI's clients expect.
    pub fn to_openai(&self) -> pocket_api::ErrorResponse {
        let param = match self {
            ServeError::InvalidArgument { param, .. } => param.clone(),
            ServeError::UnknownModel(_) => Some("model".to_owned()),
            _ => None,
        };
        pocket_api::ErrorResponse {
            error: pocket_api::ErrorObject {
                message: self.to_string(),
                kind: self.kind().to_owned(),
                param,
                code: Some(self.openai_code().to_owned()),
            },
        }
    }
}

/// A core error before any request ran (a setting that does not parse, say): its kind as
/// [`ServeError::from_runtime`] sees it, its field as it names it.
impl From<pocket_core::Error> for ServeError {
    fn from(e: pocket_core::Error) -> Self {
        ServeError::from_runtime(e.into(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipeline_errors_keep_their_kind_and_data_and_internal_text_stays_in_the_log() {
        let over = pocket_core::Error::OverBudget {
            what: "a session".into(),
            needed: 10 << 20,
            available: 1 << 20,
            budget: 100 << 20,
        };
        let s = ServeError::from_runtime(over.into(), Some("pocketd-3"));
        assert!(s.is_over_budget());
        assert_eq!(s.http_status(), 503);
        assert!(matches!(s, ServeError::OverBudget { needed, .. } if needed == 10 << 20));
        assert!(s.to_string().contains("10.0 MiB"), "{s}");
        let e = pocket_core::Error::ContextOverflow { needed: 5000, limit: 4096, prompt: 4999 };
        let s = ServeError::from_runtime(e.into(), None);
        assert_eq!((s.http_status(), s.openai_code()), (400, "context_length_exceeded"));
        assert!(s.to_string().starts_with("This model's maximum context length is 4096 tokens"), "{s}");
        assert!(
            s.to_string().contains("needs 5000 tokens") && s.to_string().contains("context holds 4096"),
            "{s}"
        );
        let e = pocket_core::Error::engine("ggml fell over at /home/secret/model.gguf");
        let s = ServeError::from_runtime(e.into(), Some("pocketd-7"));
        assert_eq!(s.http_status(), 500);
        assert!(s.to_string().contains("pocketd-7") && !s.to_string().contains("secret"), "{s}");
        let e = pocket_core::Error::engine("ggml fell over at /home/secret/model.gguf");
        let s = ServeError::from_runtime(e.into(), None);
        assert!(s.to_string().contains("pocketd-e") && !s.to_string().contains("secret"), "{s}");
        let s = ServeError::from_runtime(pocket_runtime::Error::invalid("spec", "no such mode"), None);
        assert_eq!(s.to_openai().error.param.as_deref(), Some("spec"));
    }

    #[test]
    fn openai_body_names_the_field() {
        let body = ServeError::invalid("temperature", "temperature must be in [0, 2]").to_openai();
        assert_eq!(body.error.param.as_deref(), Some("temperature"));
        assert_eq!(body.error.kind, "invalid_request_error");
        assert_eq!(body.error.code.as_deref(), Some("invalid_value"));
    }
}
