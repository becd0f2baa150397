//! Reading an HTTP message head (request or response) off a stream, bounded: what follows the
//! blank line is kept for the relay, never lost.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Why no head was read.
#[derive(Debug)]
pub enum HeadError {
    /// No blank line within the bound.
    TooLarge,
    /// The peer closed first.
    Closed,
    Io(io::Error),
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadError::TooLarge => f.write_str("message head too large"),
            HeadError::Closed => f.write_str("connection closed before a complete head"),
            HeadError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A head read: `bytes[..end]` is the head with its blank line, `bytes[end..]` what followed.
pub struct Head {
    pub bytes: Vec<u8>,
    pub end: usize,
}

impl Head {
    pub fn head(&self) -> &[u8] {
        &self.bytes[..self.end]
    }

    pub fn rest(&self) -> &[u8] {
        &self.bytes[self.end..]
    }
}

/// Reads until `\r\n\r\n`, at most `max` bytes of head.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    max: usize,
) -> Result<Head, HeadError> {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        // Only the new bytes (and the 3 before them) can complete the blank line.
        let from = bytes.len().saturating_sub(3);
        bytes.extend_from_slice(&chunk[..n]);
        if let Some(at) = bytes[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + at + 4;
            if end > max {
                return Err(HeadError::TooLarge);
            }
            return Ok(Head { bytes, end });
        }
        if bytes.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn keeps_what_follows_the_head_and_finds_a_split_blank_line() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writing = tokio::spawn(async move {
            a.write_all(b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r")
                .await
                .unwrap();
            tokio::task::yield_now().await;
            a.write_all(b"\nbody").await.unwrap();
            a
        });
        let head = read_head(&mut b, 1024).await.unwrap();
        assert_eq!(head.head(), b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(head.rest(), b"body");
        drop(writing.await.unwrap());
    }

    #[tokio::test]
    async fn bounded_and_closed() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&[b'a'; 5000]).await.unwrap();
        assert!(matches!(
            read_head(&mut b, 4096).await,
            Err(HeadError::TooLarge)
        ));
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        drop(a);
        assert!(matches!(
            read_head(&mut b, 4096).await,
            Err(HeadError::Closed)
        ));
    }
}
