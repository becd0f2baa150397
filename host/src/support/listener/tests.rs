//! The connection bounds, and the slow-loris run every listener's test uses
//! ([`slow_loris`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::*;

#[test]
fn connections_are_bounded_in_all_and_per_peer() {
    let limits = ConnectionLimits::new(ListenerBounds {
        max_connections: 3,
        max_connections_per_peer: 2,
        ..ListenerBounds::default()
    });
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let a_mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
    let b: IpAddr = "10.0.0.2".parse().unwrap();
    let c: IpAddr = "fd00::3".parse().unwrap();
    let first = limits.admit(a).unwrap();
    let second = limits.admit(a_mapped).unwrap();
    // The same address in its IPv4-mapped form is the same peer.
    assert_eq!(limits.admit(a).unwrap_err(), Refused::Peer);
    let third = limits.admit(b).unwrap();
    assert_eq!(limits.open(), 3);
    assert_eq!(limits.admit(c).unwrap_err(), Refused::Total);
    drop(first);
    let fourth = limits.admit(c).unwrap();
    assert_eq!(limits.admit(a).unwrap_err(), Refused::Total);
    drop((second, third, fourth));
    assert_eq!(limits.open(), 0);
    let again: Vec<_> = (0..2).map(|_| limits.admit(a).unwrap()).collect();
    assert_eq!(again.len(), 2);
}

/// Bounds small enough for a test to reach them: a head within 3 s, 16 connections per peer,
/// 16 KiB of head.
pub(crate) fn test_bounds() -> ListenerBounds {
    ListenerBounds {
        header_read_timeout: Duration::from_secs(3),
        idle_timeout: Duration::from_secs(6),
        max_connections: 64,
        max_connections_per_peer: 16,
        max_head_bytes: 16 << 10,
    }
}

/// The process's resident memory, in bytes (Linux).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// A connection from `source` (a loopback address of the test's choosing) to `addr`.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source.into(), 0)).unwrap();
    socket.connect(addr).await.unwrap()
}

/// `GET path` from `source` with `headers`, answered: the status line and the body.
pub(crate) async fn get_from(
    source: Ipv4Addr,
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> String {
    let mut stream = connect_from(source, addr).await;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\n{headers}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// How one trickling connection ended.
struct Ended {
    after: Duration,
    answered: bool,
}

/// One slow-loris connection: the request line, then a header byte every 100 ms, until the
/// server closes it. `started`: before the connection was made (so before the server could
/// accept it and start its clock).
async fn trickle(mut stream: TcpStream, path: String, started: Instant) -> Ended {
    let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nX-Slow: ");
    let mut answered = false;
    let mut buf = [0u8; 1024];
    let mut first = true;
    loop {
        let byte: &[u8] = if first { head.as_bytes() } else { b"a" };
        first = false;
        if stream.write_all(byte).await.is_err() {
            break;
        }
        // Pacing, and a look at whether the server closed it meanwhile.
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await {
            Err(_) => {}
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => answered = true,
        }
    }
    Ended {
        after: started.elapsed(),
        answered,
    }
}

/// The slow-loris run of docs/security.md ("Every listener bounded") against the listener at
/// `addr` served with `bounds`: `bounds.max_connections_per_peer + 8` connections from 127.0.0.1
/// trickle header bytes; the 8 over the per-peer bound are closed at once, the others at the
/// header-read timeout (not before); meanwhile `path` is answered 200 to a client on 127.0.0.2
/// (with `headers`), and the process's memory grows by less than 32 MiB (the bounds' worst case
/// is 16 × 16 KiB of heads; the figure leaves room for the test's own tasks and other tests).
/// Then a head larger than `max_head_bytes` is refused with 431 and closed.
pub(crate) async fn slow_loris(
    addr: SocketAddr,
    bounds: &ListenerBounds,
    path: &str,
    headers: &str,
) {
    let per_peer = bounds.max_connections_per_peer;
    let over = 8;
    let before = resident_bytes();
    let mut lorises = tokio::task::JoinSet::new();
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..per_peer + over {
        let started = Instant::now();
        let stream = connect_from(Ipv4Addr::LOCALHOST, addr).await;
        let (path, closed) = (path.to_string(), closed_tx.clone());
        lorises.spawn(async move {
            let ended = trickle(stream, path, started).await;
            let _ = closed.send(ended.after);
            ended
        });
    }
    // The connections over the per-peer bound are closed as soon as they are accepted.
    for _ in 0..over {
        let after = closed_rx.recv().await.unwrap();
        assert!(
            after < bounds.header_read_timeout,
            "a connection over the per-peer bound was held for {after:?}"
        );
    }
    // The others still trickle; a client from another address is served meanwhile.
    let answer = get_from(Ipv4Addr::new(127, 0, 0, 2), addr, path, headers).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "memory grew by {} KiB under the slow loris",
        grown >> 10
    );
    assert!(
        closed_rx.try_recv().is_err(),
        "an admitted connection closed before the header-read timeout ({:?})",
        bounds.header_read_timeout
    );
    // Every admitted one is closed at the header-read timeout, without an answer to its
    // request (hyper closes it, or answers 408).
    let mut at_the_bound = 0;
    while let Some(ended) = lorises.join_next().await {
        let ended = ended.unwrap();
        if ended.after >= bounds.header_read_timeout {
            at_the_bound += 1;
        } else {
            assert!(!ended.answered, "a refused connection was answered");
        }
    }
    assert_eq!(at_the_bound, per_peer, "closed at the header-read timeout");
    // A head as large as the bound and not finished: 431, and closed. (Exactly the bound, so
    // the server reads every byte sent and its close is not a reset that could lose the 431.)
    let mut stream = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr).await;
    let mut huge = format!("GET {path} HTTP/1.1\r\nHost: test\r\nX-Big: ");
    huge.push_str(&"a".repeat(bounds.max_head_bytes - huge.len()));
    let _ = stream.write_all(huge.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

/// The shared server for axum routers (the metrics ports') within the bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_is_served_within_the_bounds() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
    let bounds = test_bounds();
    let server = tokio::spawn(serve_router(listener, router, bounds));
    slow_loris(addr, &bounds, "/healthz", "").await;
    server.abort();
}

/// A connection that sends a complete head and then nothing more of its body is closed at the
/// idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_for_the_idle_timeout_is_closed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().route(
        "/echo",
        axum::routing::post(|body: String| async move { body }),
    );
    let bounds = ListenerBounds {
        idle_timeout: Duration::from_secs(2),
        ..test_bounds()
    };
    let server = tokio::spawn(serve_router(listener, router, bounds));
    let mut stream = connect_from(Ipv4Addr::LOCALHOST, addr).await;
    let started = Instant::now();
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\nonly this")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    assert!(started.elapsed() >= bounds.idle_timeout);
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    server.abort();
}
