//! The listeners (TCP and the Unix socket, sharing the connection slots) and the
//! connection loop.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;

use super::{Peer, TcpPeer};

/// A listener that holds at most `max` connections open: the next is accepted
/// only when one closes (it waits in the kernel's backlog meanwhile). Connections
/// cost descriptors, and the ledger needs descriptors of its own: a flood of idle
/// connections must never make an append or a sync fail.
pub(crate) struct CappedListener {
    pub inner: tokio::net::TcpListener,
    pub slots: Arc<tokio::sync::Semaphore>,
}

pub(crate) struct CappedIo<S> {
    io: S,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CappedIo<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CappedIo<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl CappedListener {
    /// The next connection, once one of the slots is free.
    async fn accept(&self) -> (CappedIo<tokio::net::TcpStream>, std::net::SocketAddr) {
        let slot = Arc::clone(&self.slots).acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => {
                    let _ = io.set_nodelay(true);
                    return (CappedIo { io, _slot: slot }, addr);
                }
                // Out of descriptors or similar: wait a little, never spin.
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The Unix-socket listener: it shares the connection slots with TCP, and each of
/// its connections carries the peer's credentials.
pub(crate) struct UnixCapped {
    pub inner: tokio::net::UnixListener,
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl UnixCapped {
    async fn accept(&self) -> (CappedIo<tokio::net::UnixStream>, Option<Peer>) {
        let slot = Arc::clone(&self.slots).acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((io, _)) => {
                    let peer = io.peer_cred().ok().and_then(|c| {
                        let pid = u32::try_from(c.pid()?).ok()?;
                        Some(Peer { pid })
                    });
                    return (CappedIo { io, _slot: slot }, peer);
                }
                Err(e) => {
                    tracing::warn!("accept (unix): {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The daemon's connection loop: HTTP/1.1 on every accepted connection, with
/// hyper's header-read timeout (`header_read`): a client has that long to send a
/// request's headers — on a new connection, and between requests on a kept-alive
/// one (hyper starts the timer when it waits for a request head), so idle and
/// slow-header connections are closed and their slots freed. On `shutdown` it
/// stops accepting, lets every connection finish its request (graceful), and
/// returns once all are closed.
pub(crate) async fn serve(
    tcp: CappedListener,
    unix: Option<UnixCapped>,
    router: Router,
    header_read: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
    access_log: bool,
) {
    // Every connection task holds a clone of `alive`; `closed()` resolves once
    // all are dropped.
    let (alive, _) = tokio::sync::watch::channel(());
    let mut stop = shutdown.clone();
    loop {
        let unix_accept = async {
            match &unix {
                Some(u) => u.accept().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (io, addr) = tcp.accept() => {
                // The peer's address is carried only for the access log (a layer
                // per connection costs every request a little).
                let svc = if access_log { router.clone().layer(axum::Extension(TcpPeer(addr))) } else { router.clone() };
                connection(io, svc, header_read, shutdown.clone(), alive.subscribe());
            }
            (io, peer) = unix_accept => {
                let svc = match peer {
                    Some(p) => router.clone().layer(axum::Extension(p)),
                    // A peer the kernel does not name is served as a remote caller.
                    None => router.clone(),
                };
                connection(io, svc, header_read, shutdown.clone(), alive.subscribe());
            }
            _ = stop.wait_for(|d| *d) => break,
        }
    }
    drop(tcp);
    drop(unix);
    alive.closed().await;
}

fn connection<I>(
    io: I,
    svc: Router,
    header_read: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    alive: tokio::sync::watch::Receiver<()>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let svc = hyper_util::service::TowerToHyperService::new(svc);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read).keep_alive(true);
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
        let mut conn = std::pin::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection: {e}");
                    }
                    break;
                }
                _ = shutdown.wait_for(|d| *d), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
        drop(alive);
    });
}
