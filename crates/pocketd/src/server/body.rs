//! What every endpoint takes from a request: who sent it, and its body parsed as JSON.
//!
//! Bodies are parsed here rather than by axum's `Json` extractor so that every error,
//! malformed JSON included, has OpenAI's shape (`{"error": {message, type, param, code}}`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ServeError;

/// The largest request body accepted (a prompt larger than this could not fit any context
/// these boards hold).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Who is connected: the peer's credentials on the Unix socket, its address on TCP (put in
/// each request's extensions by [`super::accept`]).
#[derive(Debug, Clone)]
pub struct Peer(pub String);

/// A request body as `T`: an error in OpenAI's shape where it is too large, not UTF-8 or not
/// what `T` takes.
pub(super) fn parse<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ServeError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ServeError::TooLarge(format!("the request body is larger than {} bytes", MAX_BODY_BYTES))
        } else {
            ServeError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    if std::str::from_utf8(&body).is_err() {
        return Err(ServeError::bad_request("the request body is not valid UTF-8; send JSON in UTF-8"));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ServeError::bad_request(format!("the request body is not valid: {e}")))
}
