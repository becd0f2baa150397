//! Bytes carried per pool (`proxy_operator_gateway_bytes_total{pool,direction}`), counted in
//! the relay without slowing it: each connection counts its writes in an atomic of its own and
//! adds them to the pool's counter every [`FLUSH_BYTES`] and when it ends. The pool's counter is
//! looked up once per connection, never per chunk.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's bytes reach its pool's counter at least this often (and at its end), so a
/// long tunnel shows on `/metrics` while it runs.
pub const FLUSH_BYTES: u64 = 1 << 20;

/// The `pool` label of a request whose upstream belongs to no ProxyPool.
pub const NO_POOL: &str = "none";

/// Bytes one way of one connection, for its pool's counter.
pub struct ByteMeter {
    pending: AtomicU64,
    counter: IntCounter,
}

impl ByteMeter {
    pub fn new(counter: IntCounter) -> Self {
        ByteMeter {
            pending: AtomicU64::new(0),
            counter,
        }
    }

    /// Counts `n` bytes; every [`FLUSH_BYTES`] they go to the pool's counter.
    pub fn add(&self, n: u64) {
        let pending = self.pending.fetch_add(n, Ordering::Relaxed) + n;
        if pending >= FLUSH_BYTES {
            self.flush();
        }
    }

    fn flush(&self) {
        let taken = self.pending.swap(0, Ordering::Relaxed);
        if taken > 0 {
            self.counter.inc_by(taken);
        }
    }
}

impl Drop for ByteMeter {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Both ways of one request or tunnel, as the client sees them: `sent` is what it sent towards
/// the site (written to the upstream), `received` what it got back (written to the client).
pub struct PoolBytes {
    pub sent: ByteMeter,
    pub received: ByteMeter,
}

/// A stream whose writes count in a [`ByteMeter`] (the bytes the stream took, not those
/// offered); reads pass through.
pub struct Metered<'a, S> {
    pub inner: S,
    meter: &'a ByteMeter,
}

impl<'a, S> Metered<'a, S> {
    pub fn new(inner: S, meter: &'a ByteMeter) -> Self {
        Metered { inner, meter }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.meter.add(n as u64);
        }
        written
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
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            self.meter.add(n as u64);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn bytes_reach_the_counter_every_flush_and_at_the_end() {
        let counter = IntCounter::new("t", "t").unwrap();
        let meter = ByteMeter::new(counter.clone());
        meter.add(10);
        assert_eq!(counter.get(), 0, "not per chunk");
        meter.add(FLUSH_BYTES);
        assert_eq!(counter.get(), FLUSH_BYTES + 10);
        meter.add(7);
        drop(meter);
        assert_eq!(counter.get(), FLUSH_BYTES + 17);
    }

    #[tokio::test]
    async fn a_metered_stream_counts_what_it_wrote() {
        let counter = IntCounter::new("t", "t").unwrap();
        let meter = ByteMeter::new(counter.clone());
        let (near, mut far) = tokio::io::duplex(64);
        let mut metered = Metered::new(near, &meter);
        metered.write_all(b"twelve bytes").await.unwrap();
        let mut got = [0u8; 12];
        far.read_exact(&mut got).await.unwrap();
        far.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        metered.read_exact(&mut back).await.unwrap();
        drop(metered);
        drop(meter);
        assert_eq!(counter.get(), 12, "reads are not counted");
    }
}
