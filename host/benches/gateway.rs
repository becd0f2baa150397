//! The gateway against going straight to the proxy, side by side in one run, on loopback: the
//! `proxy-operator gateway` binary, the leader's discovery API in this process (four pool
//! entries on one real squid requiring its login), and a loopback destination.
//!
//! 1. CONNECT setup (connect, CONNECT, `200`) at 1, 64 and 256 concurrent clients: p50 and p99
//!    through the gateway and straight to squid;
//! 2. bulk throughput of one tunnel: `BENCH_GATEWAY_BYTES` (default 1 GiB) from the destination,
//!    through the gateway and straight;
//! 3. small plain-HTTP GETs (64 clients, one request per connection as the gateway answers them)
//!    per second, through the gateway and straight;
//! 4. idle tunnels held open through the gateway (`BENCH_GATEWAY_IDLE`, default 9 000: this
//!    process holds both ends of each, two descriptors, under a hard limit of 20 000 here): the
//!    gateway's RSS per tunnel.
//!
//! `cargo bench -p proxy-operator --bench gateway` (needs squid: `.ci/install-fixtures.sh`).
//! `BENCH_SECONDS` sets the GET phases' length (default 5).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::Squid;
use harness::gateway::GatewayProcess;
use proxy_operator::leasing::leases::api::GatewayAccess;
use proxy_operator::leasing::leases::{
    self, Discovery, LeaseMetrics, LeaseOptions, LeaseStore, ProvisionedProxy,
};
use proxy_operator::provider::credentials::ProxyLogin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "bench-token";
const GATEWAY_TOKEN: &str = "bench-gateway-token";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn basic(pair: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pair)
}

/// Where a client goes: a proxy address and its `Proxy-Authorization` value.
#[derive(Clone)]
struct Via {
    addr: SocketAddr,
    authorization: String,
}

/// A destination: `/bulk` streams zeros, anything else is a tiny page; a CONNECT tunnel to it
/// is held until the client closes.
async fn destination(bulk: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                // Out of descriptors: the client side's wait below ends the phase.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                if head.starts_with(b"GET /bulk") {
                    let _ = stream
                        .write_all(
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {bulk}\r\n\r\n").as_bytes(),
                        )
                        .await;
                    let chunk = vec![0u8; 256 * 1024];
                    let mut left = bulk;
                    while left > 0 {
                        let n = left.min(chunk.len() as u64) as usize;
                        if stream.write_all(&chunk[..n]).await.is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                } else {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
                        .await;
                }
                // Held until the client goes (idle tunnels).
                let _ = stream.read(&mut buf).await;
            });
        }
    });
    addr
}

/// Opens a CONNECT tunnel to `target` through `via`.
async fn tunnel(via: &Via, target: SocketAddr) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(via.addr).await?;
    stream.set_nodelay(true)?;
    stream
        .write_all(
            format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\n\r\n",
                via.authorization
            )
            .as_bytes(),
        )
        .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other("closed during CONNECT"));
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&head).to_string(),
        ));
    }
    Ok(stream)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// CONNECT setups from `clients` at once, `per_client` each: (p50, p99).
async fn connect_setup(
    via: &Via,
    target: SocketAddr,
    clients: usize,
    per_client: usize,
) -> (Duration, Duration) {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let via = via.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::with_capacity(per_client);
            for _ in 0..per_client {
                let start = Instant::now();
                let stream = tunnel(&via, target).await.expect("tunnel");
                times.push(start.elapsed());
                drop(stream);
            }
            times
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    (percentile(&all, 0.5), percentile(&all, 0.99))
}

/// One tunnel's download of `/bulk`: MiB/s.
async fn bulk(via: &Via, target: SocketAddr, bytes: u64) -> f64 {
    let mut stream = tunnel(via, target).await.expect("tunnel");
    stream
        .write_all(format!("GET /bulk HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let start = Instant::now();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    // The head is a few dozen bytes: counted with the body, it changes nothing measurable.
    while got < bytes {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed after {got} bytes");
        got += n as u64;
    }
    got as f64 / (1024.0 * 1024.0) / start.elapsed().as_secs_f64()
}

/// Plain GETs (one per connection) from 64 clients for `seconds`: requests per second.
async fn gets(via: &Via, target: SocketAddr, seconds: Duration) -> f64 {
    let deadline = Instant::now() + seconds;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let via = via.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            let mut buf = vec![0u8; 4096];
            while Instant::now() < deadline {
                let mut stream = TcpStream::connect(via.addr).await.unwrap();
                stream
                    .write_all(
                        format!(
                            "GET http://{target}/page HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
                            via.authorization
                        )
                        .as_bytes(),
                    )
                    .await
                    .unwrap();
                let mut answer = Vec::new();
                loop {
                    let n = stream.read(&mut buf).await.unwrap();
                    answer.extend_from_slice(&buf[..n]);
                    if n == 0 || answer.ends_with(b"ok\n") {
                        break;
                    }
                }
                assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / seconds.as_secs_f64()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Room for many sockets in this process (the clients and the destination of the idle phase).
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}

#[tokio::main]
async fn main() {
    raise_fd_limit();
    let bulk_bytes: u64 = env_or("BENCH_GATEWAY_BYTES", 1u64 << 30);
    let idle: usize = env_or("BENCH_GATEWAY_IDLE", 9_000);
    let seconds = Duration::from_secs_f64(env_or("BENCH_SECONDS", 5.0));
    let target = destination(bulk_bytes).await;

    let squid = Squid::start_requiring_login_with("max_filedescriptors 65536\n")
        .await
        .expect("squid (.ci/install-fixtures.sh)");
    let login = ProxyLogin::generate("bench");
    let hashed = login.hashed();
    squid
        .set_passwords(&format!("{}:{}\n", hashed.username, hashed.password_hash))
        .unwrap();
    let store = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.restore(Default::default());
    store.set_provisioned(
        (0..4)
            .map(|i| ProvisionedProxy {
                key: leases::ProxyKey {
                    namespace: "bench".into(),
                    name: format!("p{i}").into(),
                },
                provider: "bench".into(),
                zone: None,
                labels: Default::default(),
                address: "127.0.0.1".into(),
                port: squid.port(),
                exit_ip: None,
                healthy: true,
                pool: Some("gw".into()),
                draining: false,
                login: Some(login.clone()),
                protocol: Default::default(),
            })
            .collect(),
    );
    let discovery = Discovery::new(store, TOKEN).serving_the_gateway(GatewayAccess {
        token: GATEWAY_TOKEN.into(),
        max_connections_per_proxy: 100_000,
        block_statuses: vec![403, 429],
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let leader = listener.local_addr().unwrap();
    tokio::spawn(leases::serve(listener, leases::router(Arc::new(discovery))));

    let port = target.port().to_string();
    let mut gateway = GatewayProcess::spawn(
        std::path::Path::new(env!("CARGO_BIN_EXE_proxy-operator")),
        leader,
        GATEWAY_TOKEN,
        "bench",
        &[
            "--allowed-networks",
            "127.0.0.1/32",
            "--allowed-ports",
            &port,
            "--max-clients",
            "100000",
            "--max-clients-per-token",
            "100000",
        ],
    )
    .unwrap();
    gateway.wait_ready(Duration::from_secs(30)).await.unwrap();
    let http = gateway.http;

    let through = Via {
        addr: http,
        authorization: basic(&format!("pool-bench.gw:{TOKEN}")),
    };
    let straight = Via {
        addr: squid.addr(),
        authorization: basic(&format!("{}:{}", login.username(), login.password())),
    };
    println!(
        "gateway bench: squid 127.0.0.1:{}, gateway {http}",
        squid.port()
    );
    // Warm both paths (squid's auth helper, the leader's connection).
    connect_setup(&through, target, 4, 20).await;
    connect_setup(&straight, target, 4, 20).await;
    for clients in [1, 64, 256] {
        let per_client = (2000 / clients).max(8);
        let (g50, g99) = connect_setup(&through, target, clients, per_client).await;
        let (s50, s99) = connect_setup(&straight, target, clients, per_client).await;
        println!(
            "CONNECT setup, {clients:>3} clients: gateway p50 {:.3} ms p99 {:.3} ms | straight p50 {:.3} ms p99 {:.3} ms | +{:.3} ms p50, +{:.3} ms p99",
            g50.as_secs_f64() * 1e3,
            g99.as_secs_f64() * 1e3,
            s50.as_secs_f64() * 1e3,
            s99.as_secs_f64() * 1e3,
            (g50.as_secs_f64() - s50.as_secs_f64()) * 1e3,
            (g99.as_secs_f64() - s99.as_secs_f64()) * 1e3,
        );
    }
    let g = bulk(&through, target, bulk_bytes).await;
    let s = bulk(&straight, target, bulk_bytes).await;
    println!(
        "bulk {} MiB in one tunnel: gateway {g:.0} MiB/s | straight {s:.0} MiB/s | {:.1} %",
        bulk_bytes >> 20,
        g / s * 100.0
    );
    let g = gets(&through, target, seconds).await;
    let s = gets(&straight, target, seconds).await;
    println!(
        "plain GETs, 64 clients: gateway {g:.0}/s | straight {s:.0}/s | {:.1} %",
        g / s * 100.0
    );

    let before = rss_kib(gateway.process.pid());
    let mut held = Vec::with_capacity(idle);
    for i in 0..idle {
        match tokio::time::timeout(Duration::from_secs(10), tunnel(&through, target)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => {
                println!("idle tunnels: stopped at {i}: {e}");
                break;
            }
            Err(_) => {
                println!("idle tunnels: stopped at {i}: no tunnel within 10 s (descriptors?)");
                break;
            }
        }
    }
    // The gateway's tasks settle after the last tunnel's answer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(gateway.process.pid());
    println!(
        "idle tunnels: {} held, gateway RSS {} → {} KiB: {:.1} KiB per tunnel",
        held.len(),
        before,
        after,
        after.saturating_sub(before) as f64 / held.len().max(1) as f64
    );
    drop(held);
}
