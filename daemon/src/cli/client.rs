//! A small HTTP/1.1 client for pocketd's Unix socket (hyper over a tokio `UnixStream`): what
//! `pocket ask`, `chat`, `models` and `status` use.

use std::path::{Path, PathBuf};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The socket pocketd listens on unless told otherwise (the systemd unit's).
pub const DEFAULT_SOCKET: &str = "/run/pocketd/pocketd.sock";

/// Flags that say where the daemon is.
#[derive(Debug, Clone, clap::Args)]
pub struct SocketArgs {
    /// pocketd's Unix socket.
    #[arg(long, env = "POCKET_SOCKET", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// A connection-per-request client.
pub struct Client {
    socket: PathBuf,
}

type Response = hyper::Response<hyper::body::Incoming>;

impl Client {
    /// A client for the daemon at `socket`.
    pub fn new(socket: &Path) -> Client {
        Client { socket: socket.to_path_buf() }
    }

    async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Response> {
        let stream = tokio::net::UnixStream::connect(&self.socket).await.with_context(|| {
            format!(
                "cannot connect to pocketd at {}; is it running? (start it with `pocketd --socket {}` or \
                 `systemctl start pocketd.socket`, or point --socket / $POCKET_SOCKET at it)",
                self.socket.display(),
                self.socket.display()
            )
        })?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let response = sender.send_request(request).await.context("pocketd closed the connection")?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<pocket_api::ErrorResponse>(&bytes) {
            Ok(e) => anyhow::bail!("pocketd: {} ({status})", e.error.message),
            Err(_) => anyhow::bail!("pocketd answered {status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }

    /// GET `path` and parse the JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let response = self.send(hyper::Method::GET, path, None).await?;
        let bytes = response.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes)
            .with_context(|| format!("pocketd's answer to {path} is not what was expected"))
    }

    /// POST `body` as JSON to `path` and parse the JSON answer.
    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> anyhow::Result<T> {
        let response = self.send(hyper::Method::POST, path, Some(serde_json::to_vec(body)?)).await?;
        let bytes = response.into_body().collect().await?.to_bytes();
        serde_json::from_slice(&bytes)
            .with_context(|| format!("pocketd's answer to {path} is not what was expected"))
    }

    /// POST `body` to `path` and call `on_data` with each server-sent event's data, until
    /// `[DONE]`.
    pub async fn stream(
        &self,
        path: &str,
        body: &impl Serialize,
        on_data: &mut dyn FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let response = self.send(hyper::Method::POST, path, Some(serde_json::to_vec(body)?)).await?;
        let mut body = response.into_body();
        let mut buffer = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("reading pocketd's stream")?;
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
                        on_data(data)?;
                    }
                }
            }
        }
        anyhow::bail!("pocketd's stream ended without [DONE]")
    }
}

/// A runtime for one client command.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}
