//! The bounds every HTTP listener of the operator and the gateway serves within: the discovery
//! API, the operator's metrics/status port and the gateway's metrics port (docs/security.md,
//! "Every listener bounded"). One piece, so the three cannot drift apart:
//!
//! - **header-read timeout**: a request's head (its line and headers) must be complete within
//!   it, from the moment the connection waits for a request (so it also bounds an idle
//!   keep-alive connection). hyper's own, which needs a timer (served without one, as
//!   `axum::serve` does, it never applies): [`http1`] gives it hyper-util's `TokioTimer`.
//! - **head size**: hyper's read buffer stops at [`ListenerBounds::max_head_bytes`] (431 beyond),
//!   so a connection trickling an endless header holds at most that much.
//! - **idle timeout**: no byte either way for this long closes the connection (a body trickled
//!   slowly, a response nobody reads).
//! - **connections**: at most [`ListenerBounds::max_connections`] open, and
//!   [`ListenerBounds::max_connections_per_peer`] from one IP address; past either a connection
//!   is closed as soon as it is accepted, before anything is read from it.
//!
//! Worst case per listener: `max_connections × max_head_bytes` of unfinished heads (4096 × 64 KiB
//! = 256 MiB with the defaults, for at most the header-read timeout), and a peer alone
//! `max_connections_per_peer ×` that (32 MiB). The per-peer default is not small: a crawler host
//! with many workers, a NAT or a gateway replica is one address (96 concurrent grants from one
//! host are a tested case).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The bounds of one listener (flags `--listener-*` of `run` and `gateway`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerBounds {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub max_head_bytes: usize,
}

impl Default for ListenerBounds {
    fn default() -> Self {
        ListenerBounds {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_peer: 512,
            max_head_bytes: 64 << 10,
        }
    }
}

/// hyper's smallest read buffer: a smaller `max_head_bytes` would panic in hyper.
pub const MIN_HEAD_BYTES: usize = 8192;

/// An HTTP/1.1 server builder with the bounds' header-read timeout (and the timer it needs)
/// and head size.
pub fn http1(bounds: &ListenerBounds) -> hyper::server::conn::http1::Builder {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout)
        .max_buf_size(bounds.max_head_bytes.max(MIN_HEAD_BYTES));
    http
}

/// The connections a listener holds open, in all and per peer address.
///
/// Written here: tower's limits (`ConcurrencyLimit`, `RateLimit`) bound requests inside a
/// service, after a connection was accepted and its head read; neither hyper nor hyper-util
/// counts connections, let alone per peer. A mutex over a small map: taken once at accept and
/// once at close, never across an await.
#[derive(Debug)]
pub struct ConnectionLimits {
    bounds: ListenerBounds,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `max_connections` are open.
    Total,
    /// `max_connections_per_peer` are open from this address.
    Peer,
}

/// An admitted connection's place; given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    limits: Arc<ConnectionLimits>,
    peer: IpAddr,
}

impl ConnectionLimits {
    pub fn new(bounds: ListenerBounds) -> Arc<Self> {
        Arc::new(ConnectionLimits {
            bounds,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for a connection from `peer` (IPv4-mapped IPv6 counts as its IPv4 address).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, Refused> {
        let peer = peer.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_peer) = &mut *open;
        if *total >= self.bounds.max_connections {
            return Err(Refused::Total);
        }
        let mine = per_peer.entry(peer).or_insert(0);
        if *mine >= self.bounds.max_connections_per_peer {
            return Err(Refused::Peer);
        }
        *mine += 1;
        *total += 1;
        Ok(Admitted {
            limits: self.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    pub fn bounds(&self) -> &ListenerBounds {
        &self.bounds
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_peer) = &mut *open;
        *total -= 1;
        if let Some(mine) = per_peer.get_mut(&self.peer) {
            *mine -= 1;
            if *mine == 0 {
                per_peer.remove(&self.peer);
            }
        }
    }
}

/// The next connection within `limits`: one past them is closed at once (said at debug: a
/// flood would fill the log otherwise) and the next is accepted.
pub async fn accept(
    listener: &mut TcpListener,
    limits: &Arc<ConnectionLimits>,
    what: &'static str,
) -> (TcpStream, SocketAddr, Admitted) {
    loop {
        // axum's accept: errors such as EMFILE are retried after a pause, never returned.
        let (stream, peer) = axum::serve::Listener::accept(listener).await;
        match limits.admit(peer.ip()) {
            Ok(admitted) => return (stream, peer, admitted),
            Err(why) => {
                tracing::debug!(%peer, listener = what, ?why, "connection refused: over the listener's connection bound");
                drop(stream);
            }
        }
    }
}

/// Runs `serve` over `io` until it ends or no byte went either way for `idle` (then the
/// connection is dropped, which closes it).
///
/// Written here: hyper's HTTP/1 server has a header-read timeout but no idle timeout, and
/// hyper-util's and tower's timeouts bound a request's handling, not the bytes of a connection.
pub async fn within_idle_timeout<I, F, Fut>(io: I, idle: Duration, serve: F)
where
    I: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(IdleIo<I>) -> Fut,
    Fut: Future,
{
    let activity = Activity::new();
    let io = IdleIo {
        io,
        activity: activity.clone(),
    };
    tokio::select! {
        _ = serve(io) => {}
        () = activity.idle_for(idle) => tracing::debug!("connection closed: idle for {idle:?}"),
    }
}

/// When a connection last moved a byte.
#[derive(Clone)]
struct Activity {
    start: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Returns once no byte moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = last.elapsed();
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// A connection that notes each byte it moves (for [`within_idle_timeout`]).
pub struct IdleIo<I> {
    io: I,
    activity: Activity,
}

impl<I: AsyncRead + Unpin> AsyncRead for IdleIo<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for IdleIo<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves an axum `router` on `listener` within `bounds` until the task is dropped: the
/// metrics/status ports of the operator and the gateway.
pub async fn serve_router(mut listener: TcpListener, router: axum::Router, bounds: ListenerBounds) {
    use tower::ServiceExt as _;
    let limits = ConnectionLimits::new(bounds);
    loop {
        let (stream, _, admitted) = accept(&mut listener, &limits, "metrics").await;
        let router = router.clone();
        tokio::spawn(async move {
            let _admitted = admitted;
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    router.clone().oneshot(request)
                },
            );
            within_idle_timeout(stream, bounds.idle_timeout, |io| async move {
                if let Err(e) = http1(&bounds)
                    .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                    .await
                {
                    tracing::trace!("metrics connection: {e}");
                }
            })
            .await;
        });
    }
}

#[cfg(test)]
pub(crate) mod tests;
