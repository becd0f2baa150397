//! Copying a tunnel both ways until either side closes, or until no byte moved either way for
//! the idle timeout. Activity is one relaxed counter bumped per read (not per byte) and looked
//! at by a timer a few times per timeout, so the copy itself stays `copy_bidirectional`. The
//! bytes written each way count for the upstream's pool ([`PoolBytes`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::bytes::{Metered, PoolBytes};

/// Reads that returned bytes, on any stream wrapped in [`Counted`] over it.
#[derive(Default)]
pub struct Activity(AtomicU64);

impl Activity {
    pub fn reads(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Resolves once no read returned bytes for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        idle_for(|| self.reads(), idle).await
    }
}

/// Resolves once `reads` (a count of reads, from one or more [`Activity`]) did not change for
/// `idle`.
pub async fn idle_for(reads: impl Fn() -> u64, idle: Duration) {
    // Looked at 8 times per timeout: a tunnel closes between 1 and 1.125 timeouts idle.
    let tick = (idle / 8).max(Duration::from_millis(10));
    let mut seen = reads();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = reads();
        if now != seen {
            seen = now;
            since = Instant::now();
        } else if since.elapsed() >= idle {
            return;
        }
    }
}

/// A stream whose reads count in an [`Activity`].
pub struct Counted<'a, S> {
    pub inner: S,
    activity: &'a Activity,
}

impl<'a, S> Counted<'a, S> {
    pub fn new(inner: S, activity: &'a Activity) -> Self {
        Counted { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.0.fetch_add(1, Ordering::Relaxed);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// How a relay ended.
#[derive(Debug, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides closed; bytes client→upstream and upstream→client.
    Closed(u64, u64),
    /// Nothing moved for the idle timeout.
    Idle,
}

/// Relays `client` ⇄ `upstream`, first writing what each side already sent past its handshake
/// (`to_upstream`: the client's bytes read with its request head; `to_client`: the upstream's
/// read with its answer). What is written to the upstream counts as `bytes.sent`, to the client
/// as `bytes.received`.
pub async fn relay<C, U>(
    client: &mut C,
    upstream: &mut U,
    to_upstream: &[u8],
    to_client: &[u8],
    idle: Duration,
    bytes: &PoolBytes,
) -> io::Result<RelayEnd>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut client = Metered::new(client, &bytes.received);
    let mut upstream = Metered::new(upstream, &bytes.sent);
    if !to_upstream.is_empty() {
        upstream.write_all(to_upstream).await?;
    }
    if !to_client.is_empty() {
        client.write_all(to_client).await?;
    }
    let activity = Activity::default();
    let mut client = Counted::new(&mut client, &activity);
    let mut upstream = Counted::new(&mut upstream, &activity);
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            copied.map(|(up, down)| RelayEnd::Closed(up, down))
        }
        () = activity.idle_for(idle) => Ok(RelayEnd::Idle),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leasing::gateway::metrics::GatewayMetrics;
    use tokio::io::AsyncReadExt;

    fn meters() -> (GatewayMetrics, PoolBytes) {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let bytes = metrics.pool_bytes(Some("ns/pool"));
        (metrics, bytes)
    }

    #[tokio::test]
    async fn relays_leftovers_then_both_ways_until_closed() {
        let (mut client, mut client_far) = tokio::io::duplex(1024);
        let (mut upstream, mut upstream_far) = tokio::io::duplex(1024);
        let (metrics, bytes) = meters();
        let relaying = tokio::spawn(async move {
            relay(
                &mut client,
                &mut upstream,
                b"early",
                b"head-rest",
                Duration::from_secs(5),
                &bytes,
            )
            .await
        });
        let mut got = [0u8; 5];
        upstream_far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"early");
        let mut got = [0u8; 9];
        client_far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"head-rest");
        client_far.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        upstream_far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        upstream_far.write_all(b"pong!").await.unwrap();
        let mut got = [0u8; 5];
        client_far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong!");
        drop((client_far, upstream_far));
        assert_eq!(relaying.await.unwrap().unwrap(), RelayEnd::Closed(4, 5));
        // The pool's bytes: what each side was written, leftovers included.
        assert_eq!(metrics.bytes_by_pool()["ns/pool"], (5 + 4, 9 + 5));
    }

    #[tokio::test]
    async fn an_idle_tunnel_closes_and_a_busy_one_does_not() {
        let (mut client, mut client_far) = tokio::io::duplex(1024);
        let (mut upstream, mut upstream_far) = tokio::io::duplex(1024);
        // Real time (tokio's test-util clock is not built): a short timeout, and only the lower
        // bound asserted, which a busy machine cannot break.
        let idle = Duration::from_millis(300);
        let (_metrics, bytes) = meters();
        let relaying =
            tokio::spawn(
                async move { relay(&mut client, &mut upstream, b"", b"", idle, &bytes).await },
            );
        // Busy for two idle timeouts: a byte every 100 ms.
        let busy = Instant::now();
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client_far.write_all(b"x").await.unwrap();
            let mut got = [0u8; 1];
            upstream_far.read_exact(&mut got).await.unwrap();
        }
        assert!(busy.elapsed() >= 2 * idle);
        assert!(!relaying.is_finished(), "closed while busy");
        let quiet = Instant::now();
        assert_eq!(relaying.await.unwrap().unwrap(), RelayEnd::Idle);
        assert!(quiet.elapsed() >= idle * 7 / 8, "{:?}", quiet.elapsed());
    }
}
