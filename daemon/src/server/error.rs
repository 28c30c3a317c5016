//! What can go wrong with a request, once for both transports: HTTP maps each kind to a
//! status and OpenAI's error body, D-Bus to a named `org.pocketd.Error.*` error.

/// A request's failure, with the message the client sees.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    /// Something in the request is wrong (a field's value, a malformed body).
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
    /// The prompt does not fit the context (or the body is larger than allowed).
    #[error("{0}")]
    TooLarge(String),
    /// Every turn and every place in the queue is taken.
    #[error("the request queue is full ({0} requests running or waiting); retry later")]
    QueueFull(usize),
    /// The memory budget cannot hold what the request needs, even after unloading idle models.
    #[error("{0}")]
    OverBudget(String),
    /// The model is in use and cannot be unloaded now.
    #[error("{0}")]
    Busy(String),
    /// The daemon is stopping and takes no new requests.
    #[error("pocketd is shutting down")]
    ShuttingDown,
    /// The request was cancelled (by its client, or by the shutdown deadline).
    #[error("the request was cancelled")]
    Cancelled,
    /// The engine failed.
    #[error("{0}")]
    Internal(String),
}

impl ServeError {
    /// An [`ServeError::InvalidArgument`] about the field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ServeError::InvalidArgument { message: message.into(), param: Some(param.to_owned()) }
    }

    /// An [`ServeError::InvalidArgument`] not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ServeError::InvalidArgument { message: message.into(), param: None }
    }

    /// Classify an engine or loading error: the engine's own kinds (invalid argument,
    /// context overflow, over budget, cancelled) keep their meaning, anything else is internal.
    pub fn from_engine(e: &anyhow::Error) -> Self {
        use pocket_core::Error as E;
        let message = format!("{e:#}");
        let core = e.chain().find_map(|c| {
            c.downcast_ref::<E>()
                .or_else(|| match c.downcast_ref::<pocket_ggml::Error>() {
                    Some(pocket_ggml::Error::Core(inner)) => Some(inner),
                    _ => None,
                })
                .or_else(|| match c.downcast_ref::<pocket_tract::Error>() {
                    Some(pocket_tract::Error::Core(inner)) => Some(inner),
                    _ => None,
                })
        });
        match core {
            Some(E::InvalidArgument(_) | E::Unsupported(_) | E::Tokenizer(_)) => {
                ServeError::bad_request(message)
            }
            Some(E::ContextOverflow { .. }) => ServeError::TooLarge(message),
            Some(E::OverBudget { .. }) => ServeError::OverBudget(message),
            Some(E::Cancelled) => ServeError::Cancelled,
            _ => match e.chain().find_map(|c| c.downcast_ref::<pocket_ggml::Error>()) {
                Some(
                    pocket_ggml::Error::NotGguf { .. }
                    | pocket_ggml::Error::Corrupt { .. }
                    | pocket_ggml::Error::UnsupportedArchitecture { .. }
                    | pocket_ggml::Error::BadModel { .. },
                ) => ServeError::bad_request(message),
                // A model directory whose files are missing or wrong: the operator's to fix,
                // described in the message.
                _ if e.chain().any(|c| c.is::<pocket_tract::Error>()) => ServeError::bad_request(message),
                _ => ServeError::Internal(message),
            },
        }
    }

    /// Whether this is the budget being full (worth unloading idle models and retrying).
    pub fn is_over_budget(&self) -> bool {
        matches!(self, ServeError::OverBudget(_))
    }

    /// The HTTP status of this error.
    pub fn http_status(&self) -> u16 {
        match self {
            ServeError::InvalidArgument { .. } => 400,
            ServeError::UnknownModel(_) => 404,
            ServeError::Busy(_) => 409,
            ServeError::TooLarge(_) => 413,
            ServeError::QueueFull(_) => 429,
            ServeError::Cancelled => 499,
            ServeError::Internal(_) => 500,
            ServeError::OverBudget(_) | ServeError::ShuttingDown => 503,
        }
    }

    /// OpenAI's error `type` for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            ServeError::InvalidArgument { .. } | ServeError::TooLarge(_) => "invalid_request_error",
            ServeError::UnknownModel(_) => "not_found_error",
            ServeError::Busy(_) => "conflict_error",
            ServeError::QueueFull(_) => "rate_limit_error",
            ServeError::OverBudget(_) | ServeError::ShuttingDown => "service_unavailable_error",
            ServeError::Cancelled => "cancelled",
            ServeError::Internal(_) => "server_error",
        }
    }

    /// A short machine-readable code (OpenAI's `code`, and the last part of the D-Bus error
    /// name).
    pub fn code(&self) -> &'static str {
        match self {
            ServeError::InvalidArgument { .. } => "InvalidArgument",
            ServeError::UnknownModel(_) => "UnknownModel",
            ServeError::TooLarge(_) => "TooLarge",
            ServeError::QueueFull(_) => "QueueFull",
            ServeError::OverBudget(_) => "OverBudget",
            ServeError::Busy(_) => "Busy",
            ServeError::ShuttingDown => "ShuttingDown",
            ServeError::Cancelled => "Cancelled",
            ServeError::Internal(_) => "Failed",
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
                code: Some(self.code().to_owned()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_keep_their_kind_through_context() {
        let e = anyhow::Error::new(pocket_core::Error::OverBudget {
            what: "a session".into(),
            needed: 10 << 20,
            available: 1 << 20,
            budget: 100 << 20,
        })
        .context("planning");
        let s = ServeError::from_engine(&e);
        assert!(s.is_over_budget());
        assert_eq!(s.http_status(), 503);
        assert!(s.to_string().contains("10.0 MiB"), "{s}");
        let e = anyhow::Error::new(pocket_core::Error::ContextOverflow {
            needed: 5000,
            limit: 4096,
            prompt: 4999,
        });
        assert_eq!(ServeError::from_engine(&e).http_status(), 413);
        let e = anyhow::anyhow!("ggml fell over");
        assert_eq!(ServeError::from_engine(&e).http_status(), 500);
    }

    #[test]
    fn openai_body_names_the_field() {
        let body = ServeError::invalid("temperature", "temperature must be in [0, 2]").to_openai();
        assert_eq!(body.error.param.as_deref(), Some("temperature"));
        assert_eq!(body.error.kind, "invalid_request_error");
        assert_eq!(body.error.code.as_deref(), Some("InvalidArgument"));
    }
}
