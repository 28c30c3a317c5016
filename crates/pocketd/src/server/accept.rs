//! Accepting HTTP connections: each is admitted to the [`Connections`] table (or refused
//! with a fast 503), served by hyper with the router, and closed when the table says so —
//! evicted, timed out — or when the daemon stops.
//!
//! axum's own `serve` is not used: it has no connection caps or idle timeout, and it sleeps
//! a whole second after an `accept` error such as running out of file descriptors, during
//! which nobody is let in.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use axum::response::IntoResponse;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tower_service::Service;

use super::body::Peer;
use super::connections::{Activity, Admitted, Connections, PeerKey, Refusal};
use super::error::ServeError;

/// A listener's connections, with who is on the other end.
pub trait Accept: Send + 'static {
    /// The connection's stream.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Stream, PeerKey, Peer)>> + Send;
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn accept(&self) -> std::io::Result<(Self::Stream, PeerKey, Peer)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        let (key, peer) = match stream.peer_cred() {
            Ok(c) => (
                PeerKey::Uid(c.uid()),
                Peer(format!(
                    "uid={} gid={} pid={}",
                    c.uid(),
                    c.gid(),
                    c.pid().map_or_else(|| "?".to_owned(), |p| p.to_string())
                )),
            ),
            Err(e) => (PeerKey::Unknown, Peer(format!("unix (credentials unavailable: {e})"))),
        };
        Ok((stream, key, peer))
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;

    async fn accept(&self) -> std::io::Result<(Self::Stream, PeerKey, Peer)> {
        let (stream, addr) = tokio::net::TcpListener::accept(self).await?;
        Ok((stream, PeerKey::Tcp, Peer(format!("tcp {addr}"))))
    }
}

/// Serve `router` on `listener` until `stop` turns true; then connections answering a
/// request finish it (hyper's graceful shutdown) and the others are closed.
pub async fn serve<L: Accept>(
    listener: L,
    router: Router,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, key, peer)) => match connections.admit(key) {
                Ok(admitted) => {
                    tracing::debug!(peer = %peer.0, "connection");
                    let (router, connections, stop) = (router.clone(), connections.clone(), stop.clone());
                    tokio::spawn(connection(stream, peer, admitted, router, connections, stop));
                }
                Err(refusal) => {
                    tracing::warn!(peer = %peer.0, "connection refused: {refusal}");
                    tokio::spawn(refuse(stream, refusal));
                }
            },
            Err(e) if out_of_descriptors(&e) => {
                // Free one by closing the connection that has waited longest for a request,
                // and go on at once; with none to close, wait for one to end.
                if !connections.evict_oldest() {
                    tracing::warn!("accept: {e}; every connection is answering a request");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Err(e) => {
                tracing::debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    // EMFILE (24): this process's limit; ENFILE (23): the system's.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// A fast 503 for a connection over a cap, then close it. What the client sends is read for a
/// moment before the close, so that its writes do not fail before it reads the 503.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, refusal: Refusal) {
    let body = serde_json::json!({"error": {
        "message": refusal.to_string(),
        "type": "service_unavailable_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_millis(250), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            match stream.read(&mut sink).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
        std::io::Result::Ok(())
    })
    .await;
}

async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: Peer,
    admitted: Admitted,
    router: Router,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) {
    let activity = admitted.activity.clone();
    let body_timeout = connections.limits().header_timeout;
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let request_guard = activity.begin_request();
        let mut request = request.map(|b| Body::new(Deadline::new(b, body_timeout)));
        request.extensions_mut().insert(ConnectInfo(peer.clone()));
        request.extensions_mut().insert(connections.clone());
        let mut router = router.clone();
        async move {
            // A panic in a handler is a 500 with an id, not a connection closed without a word.
            let answered = std::panic::AssertUnwindSafe(router.call(request)).catch_unwind().await;
            let response: Response<Body> = match answered {
                Ok(r) => r.unwrap_or_else(|e| match e {}),
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    ServeError::internal(None, format!("a request handler panicked: {what}")).into_response()
                }
            };
            // The connection stays busy until the whole body is sent (a stream may last minutes).
            Ok::<_, Infallible>(response.map(|b| {
                Body::new(b.map_frame(move |frame| {
                    let _busy = &request_guard;
                    frame
                }))
            }))
        }
    });
    let io = TokioIo::new(Watched { inner: stream, activity: admitted.activity.clone() });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The head timeout is ours (Connections::sweep), which also knows idle from slow.
    builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection: {e}");
                }
                break;
            }
            // Evicted or timed out: dropping the connection closes the socket.
            _ = admitted.close.notified() => break,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    drop(admitted);
}

/// A stream that tells its connection's [`Activity`] when bytes arrive.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read_some();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A request body that must arrive within a time (the head's timeout, again): a client that
/// sends a head and then trickles or withholds its body gets a 400, not a connection held
/// open for ever.
struct Deadline<B> {
    inner: B,
    within: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Deadline<B> {
    fn new(inner: B, within: Duration) -> Self {
        Deadline { inner, within, sleep: Box::pin(tokio::time::sleep(within)) }
    }
}

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(Duration);

impl<B> hyper::body::Body for Deadline<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.within)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
