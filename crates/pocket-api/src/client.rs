//! A small HTTP/1.1 client for pocketd's Unix socket (hyper over a tokio `UnixStream`): what
//! `pocket ask`, `chat`, `models`, `status` and `pocket bench`'s `socket:` modes use.

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ErrorObject, ErrorResponse};

/// The socket pocketd listens on unless told otherwise (the systemd unit's).
pub const DEFAULT_SOCKET: &str = "/run/pocketd/pocketd.sock";

/// What went wrong talking to pocketd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing answers at the socket.
    #[error(
        "cannot connect to pocketd at {}: {source}; is it running? (start it with `pocketd --socket {}` \
         or `systemctl start pocketd.socket`, or point --socket / $POCKET_SOCKET at it)",
        socket.display(), socket.display()
    )]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// pocketd refused the request, with its error object.
    #[error("pocketd: {} ({status})", error.message)]
    Refused {
        /// The HTTP status.
        status: u16,
        /// OpenAI's error object: message, type, param, code.
        error: ErrorObject,
    },
    /// pocketd answered with an error status and a body that is not an error object.
    #[error("pocketd answered {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
    /// The connection failed mid-request.
    #[error("talking to pocketd: {0}")]
    Http(#[from] hyper::Error),
    /// An answer is not what its endpoint returns.
    #[error("pocketd's answer to {path} is not what was expected: {source}")]
    Decode {
        /// The endpoint.
        path: String,
        /// serde's reason.
        source: serde_json::Error,
    },
    /// A request body could not be encoded.
    #[error("cannot encode the request: {0}")]
    Encode(serde_json::Error),
    /// A stream ended before its `[DONE]`.
    #[error("pocketd's stream ended without [DONE]")]
    Truncated,
    /// The caller's handler of a streamed event failed.
    #[error("{0}")]
    Handler(HandlerError),
}

/// What a stream's handler may fail with.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// A connection-per-request client.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

type Response = hyper::Response<hyper::body::Incoming>;

impl Client {
    /// A client for the daemon at `socket`.
    pub fn new(socket: &Path) -> Client {
        Client { socket: socket.to_path_buf() }
    }

    /// The socket it talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response, ClientError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect { socket: self.socket.clone(), source })?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("a request of a method, a path and a body is well-formed");
        let response = sender.send_request(request).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<ErrorResponse>(&bytes) {
            Ok(e) => Err(ClientError::Refused { status, error: e.error }),
            Err(_) => Err(ClientError::Status { status, body: String::from_utf8_lossy(&bytes).into_owned() }),
        }
    }

    async fn json<T: DeserializeOwned>(path: &str, response: Response) -> Result<T, ClientError> {
        let bytes = response.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode { path: path.to_owned(), source })
    }

    /// GET `path` and parse the JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let response = self.send(hyper::Method::GET, path, None).await?;
        Self::json(path, response).await
    }

    /// POST `body` as JSON to `path` and parse the JSON answer.
    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        let response = self.send(hyper::Method::POST, path, Some(body)).await?;
        Self::json(path, response).await
    }

    /// POST `body` to `path` and call `on_data` with each server-sent event's data as it
    /// arrives, until `[DONE]`.
    pub async fn stream(
        &self,
        path: &str,
        body: &impl Serialize,
        on_data: &mut dyn FnMut(&str) -> Result<(), HandlerError>,
    ) -> Result<(), ClientError> {
        let body = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        let response = self.send(hyper::Method::POST, path, Some(body)).await?;
        let mut body = response.into_body();
        let mut buffer = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            let Some(data) = frame.data_ref() else { continue };
            buffer.extend_from_slice(data);
            while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buffer.drain(..end + 2).collect();
                let event = String::from_utf8_lossy(&event);
                for line in event.lines() {
                    if let Some(data) = line.strip_prefix("data:") {
                        let data = data.trim_start();
                        if data == "[DONE]" {
                            return Ok(());
                        }
                        on_data(data).map_err(ClientError::Handler)?;
                    }
                }
            }
        }
        Err(ClientError::Truncated)
    }
}
