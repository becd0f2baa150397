use anyhow::{Context, Result, ensure};
use std::time::{Duration, Instant};

use harness::Squid;
use harness::process::{Check, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback TCP service that answers "ping" with "pong".
async fn pong_server() -> Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).await.is_ok() && &buf == b"ping" {
                    let _ = s.write_all(b"pong").await;
                }
            });
        }
    });
    Ok(addr)
}

/// CONNECT through squid to `target`; returns the status line and the tunnel.
async fn connect_via(
    proxy: std::net::SocketAddr,
    target: std::net::SocketAddr,
) -> Result<(String, TcpStream)> {
    let mut s = TcpStream::connect(proxy)
        .await
        .context("connect to squid")?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    // Read the response head byte by byte so no tunnel bytes are consumed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        ensure!(
            s.read(&mut b).await? == 1,
            "squid closed the connection: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    let head = String::from_utf8(head)?;
    Ok((head.lines().next().unwrap_or_default().to_owned(), s))
}

async fn ping_through(squid: &Squid, target: std::net::SocketAddr) -> Result<()> {
    let (status, mut tunnel) = connect_via(squid.addr(), target).await?;
    ensure!(
        status.contains("200 Connection established"),
        "status line {status:?}"
    );
    tunnel.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    tunnel.read_exact(&mut buf).await?;
    ensure!(&buf == b"pong", "got {buf:?}");
    Ok(())
}

#[tokio::test]
async fn connect_through_squid_and_restart_on_same_port() -> Result<()> {
    let target = pong_server().await?;
    let t = Instant::now();
    let mut squid = Squid::start().await?;
    eprintln!("squid started in {:?}", t.elapsed());
    let port = squid.port();
    ping_through(&squid, target).await?;
    // squid logs a tunnel when it ends.
    wait_for("CONNECT in access.log", Duration::from_secs(10), || {
        let log = squid.access_log();
        async move {
            if log.contains(&format!("CONNECT {target}")) {
                Check::Ready(())
            } else {
                Check::NotYet(log)
            }
        }
    })
    .await?;

    // A closed target port: squid answers 503.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let (status, _) = connect_via(squid.addr(), closed).await?;
    assert!(status.contains(" 503 "), "{status}");

    let t = Instant::now();
    squid.stop().await?;
    eprintln!("squid stopped in {:?}", t.elapsed());
    assert!(TcpStream::connect(squid.addr()).await.is_err());
    let t = Instant::now();
    squid.start_again().await?;
    eprintln!("squid started again in {:?}", t.elapsed());
    assert_eq!(squid.port(), port);
    ping_through(&squid, target).await?;

    // An abrupt death, and back again.
    squid.kill();
    assert!(TcpStream::connect(squid.addr()).await.is_err());
    squid.start_again().await?;
    ping_through(&squid, target).await?;
    Ok(())
}
