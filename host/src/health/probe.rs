//! One health probe: an HTTP `CONNECT` through the proxy to a target, as a crawler would use it.
//! Written on a bare TCP stream: reqwest hides the proxy's answer to CONNECT behind its own
//! error types, and the probe needs exactly that answer (status code, timing), nothing more.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest CONNECT response head read (squid sends a few hundred bytes).
const MAX_HEAD: usize = 8 * 1024;

/// Why a probe failed. `reason()` is a fixed set, used as a metric label.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProbeFailure {
    #[error("cannot connect to the proxy: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the proxy answered CONNECT with HTTP {0}")]
    Status(u16),
    #[error("the proxy's answer is not HTTP: {0}")]
    Protocol(String),
}

impl ProbeFailure {
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeFailure::Connect(_) => "connect",
            ProbeFailure::Timeout(_) => "timeout",
            ProbeFailure::Status(_) => "status",
            ProbeFailure::Protocol(_) => "protocol",
        }
    }
}

/// `CONNECT target` through `address:port`; the latency until the proxy said 2xx.
pub async fn probe(
    address: &str,
    port: u16,
    target: &str,
    timeout: Duration,
) -> Result<Duration, ProbeFailure> {
    let started = Instant::now();
    match tokio::time::timeout(timeout, connect_through(address, port, target)).await {
        Ok(Ok(())) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ProbeFailure::Timeout(timeout)),
    }
}

async fn connect_through(address: &str, port: u16, target: &str) -> Result<(), ProbeFailure> {
    let mut stream = TcpStream::connect((address, port))
        .await
        .map_err(|e| ProbeFailure::Connect(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| ProbeFailure::Connect(e.to_string()))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| ProbeFailure::Protocol(e.to_string()))?;
        if n == 0 {
            return Err(ProbeFailure::Protocol(
                "connection closed before a response".into(),
            ));
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Err(ProbeFailure::Protocol(format!(
                "response head larger than {MAX_HEAD} bytes"
            )));
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|s| s.parse::<u16>().ok());
    match (version.starts_with("HTTP/1."), status) {
        (true, Some(code)) if (200..300).contains(&code) => Ok(()),
        (true, Some(code)) => Err(ProbeFailure::Status(code)),
        _ => Err(ProbeFailure::Protocol(format!(
            "status line `{}`",
            line.trim().chars().take(80).collect::<String>()
        ))),
    }
}
