//! A real browser through the gateway: Debian's Chromium, headless, in a network namespace of
//! its own with no uplink (it calls Google on its own), renders the site's page over plain HTTP
//! and over HTTPS (a CONNECT tunnel), carried by the fleet's squids.
//!
//! Chromium's `--proxy-server` carries no login (with one it refuses the proxy, and headless it
//! cannot answer the gateway's 407 challenge without a driver): its proxy is a local forwarder
//! that adds the login, as users run one (docs/gateway.md). That forwarder listens inside the
//! namespace and is the namespace's only way out.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use harness::netns::Netns;
use harness::process::{Check, free_port, wait_for};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::TOKEN;
use super::gateway::{EXITS, Gateway};

/// The site over HTTPS: TLS on 127.0.0.1 with a self-signed certificate; each connection is
/// handed decrypted to the plain site from the address its client came from (a squid's exit),
/// so the site still tells which squid carried the tunnel.
struct TlsFront {
    /// What Chromium's `--ignore-certificate-errors-spki-list` names: base64(SHA-256(SPKI)).
    spki: String,
    task: JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    async fn start(port: u16, site_port: u16) -> TlsFront {
        use rcgen::PublicKeyData;
        use tokio_rustls::rustls;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let spki = base64::engine::general_purpose::STANDARD
            .encode(Sha256::digest(key.subject_public_key_info()));
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let socket = tokio::net::TcpSocket::new_v4().unwrap();
                    socket.bind(SocketAddr::new(peer.ip(), 0)).unwrap();
                    let site = SocketAddr::from(([127, 0, 0, 1], site_port));
                    if let Ok(mut site) = socket.connect(site).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut site).await;
                    }
                });
            }
        });
        TlsFront { spki, task }
    }
}

/// Chromium's proxy, inside its namespace: a local forwarder that logs in to the gateway for
/// it. Each connection goes to the gateway's port on the host's loopback with
/// `Proxy-Authorization` put into its first request head (enough: the gateway answers a plain
/// request with `Connection: close`, and a CONNECT's head is its only one). As a guard of this
/// test, only the site's destinations pass: Chromium's calls home get 403 here and never leave
/// the namespace.
pub(super) struct LoginForwarder {
    pub(super) addr: SocketAddr,
    /// Destinations refused (Chromium's own calls).
    refused: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl Drop for LoginForwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LoginForwarder {
    /// Logs in as `username` with `password` (the token, or a team's credential).
    pub(super) async fn start(
        netns: &Netns,
        gateway: SocketAddr,
        username: &str,
        password: &str,
        allowed: Vec<String>,
    ) -> LoginForwarder {
        let listener = netns
            .listen(([127, 0, 0, 1], 0).into())
            .await
            .expect("a listener inside the browser's namespace");
        let addr = listener.local_addr().unwrap();
        let login =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        let refused: Arc<Mutex<Vec<String>>> = Arc::default();
        let allowed = Arc::new(allowed);
        let record = refused.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (login, allowed, record) = (login.clone(), allowed.clone(), record.clone());
                tokio::spawn(async move {
                    let _ = forward(client, gateway, &login, &allowed, &record).await;
                });
            }
        });
        LoginForwarder {
            addr,
            refused,
            task,
        }
    }
}

/// One client connection of [`LoginForwarder`].
async fn forward(
    mut client: TcpStream,
    gateway: SocketAddr,
    login: &str,
    allowed: &[String],
    refused: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let end = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 || head.len() > 64 << 10 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
    let request_line = lines.next().unwrap_or_default();
    // `GET http://host:port/path` or `CONNECT host:port`.
    let target = request_line.split(' ').nth(1).unwrap_or_default();
    let authority = target
        .strip_prefix("http://")
        .map_or(target, |rest| rest.split('/').next().unwrap_or_default());
    if !allowed.iter().any(|a| a == authority) {
        refused.lock().unwrap().push(authority.to_string());
        return client
            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
    }
    let mut out = format!("{request_line}\r\nProxy-Authorization: Basic {login}\r\n");
    for line in lines.filter(|l| !l.to_ascii_lowercase().starts_with("proxy-authorization:")) {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    let mut upstream = TcpStream::connect(gateway).await?;
    upstream.write_all(out.as_bytes()).await?;
    upstream.write_all(&head[end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// The page at `url` as Chromium rendered it (`--dump-dom`), run in `netns` with `proxy` (in
/// the namespace) as its proxy and the TLS front's key trusted; or a panic with its log.
pub(super) async fn chromium_dump_dom(
    netns: &Netns,
    proxy: SocketAddr,
    spki: &str,
    url: &str,
) -> String {
    let args = [
        format!("--proxy-server=http://{proxy}"),
        // Chromium never sends loopback URLs to a proxy unless told so.
        "--proxy-bypass-list=<-loopback>".to_string(),
        format!("--ignore-certificate-errors-spki-list={spki}"),
        "--dump-dom".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let dom = harness::chromium::run(netns, &args, url, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(!dom.is_empty(), "chromium printed no page");
    dom
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_with_no_uplink_renders_the_site_through_the_gateway_over_http_and_https()
{
    let tls_port = free_port().unwrap();
    let gw = Gateway::start_allowing(&[tls_port], &[]).await;
    let front = TlsFront::start(tls_port, gw.site.port).await;
    let netns = Netns::create("browser").expect("the browser's network namespace, no uplink");
    let (plain, secure) = (
        format!("127.0.0.1:{}", gw.site.port),
        format!("127.0.0.1:{tls_port}"),
    );
    let forwarder = LoginForwarder::start(
        &netns,
        gw.replica.http,
        "pool-crawlers.gw",
        TOKEN,
        vec![plain.clone(), secure.clone()],
    )
    .await;

    // Plain HTTP: the page rendered (its script ran), fetched by Chromium through a squid.
    let url = gw.site.url("127.0.0.1", "/browser");
    let dom = chromium_dump_dom(&netns, forwarder.addr, &front.spki, &url).await;
    assert!(dom.contains("the site's page"), "{dom}\n{}", gw.log());
    assert!(
        dom.contains("<p id=\"script\">rendered over http:</p>"),
        "{dom}"
    );
    let seen = gw.site.seen("/browser");
    assert_eq!(seen.len(), 1, "{seen:?}");
    let exit = EXITS
        .iter()
        .position(|e| *e == seen[0].from)
        .unwrap_or_else(|| panic!("from a squid's exit: {seen:?}"));
    assert_eq!(seen[0].host, plain);
    assert!(
        seen[0].headers["user-agent"].contains("HeadlessChrome"),
        "{seen:?}"
    );
    assert!(!seen[0].headers.contains_key("proxy-authorization"));
    assert!(gw.squids[exit].access_log().contains(&url));

    // HTTPS: a CONNECT tunnel through the gateway and a squid; the TLS is Chromium's own.
    let url = format!("https://{secure}/browser");
    let dom = chromium_dump_dom(&netns, forwarder.addr, &front.spki, &url).await;
    assert!(
        dom.contains("<p id=\"script\">rendered over https:</p>"),
        "{dom}\n{}",
        gw.log()
    );
    let seen = gw.site.seen("/browser");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].host, secure);
    let exit = EXITS
        .iter()
        .position(|e| *e == seen[1].from)
        .unwrap_or_else(|| panic!("from a squid's exit: {seen:?}"));
    // squid logs a tunnel when it closes.
    let squid = &gw.squids[exit];
    let connect = format!("CONNECT {secure}");
    wait_for("squid to log the tunnel", Duration::from_secs(10), || {
        let logged = squid.access_log().contains(&connect);
        async move {
            if logged {
                Check::Ready(())
            } else {
                Check::NotYet("not logged".into())
            }
        }
    })
    .await
    .unwrap();

    // Only the site left the namespace: whatever else Chromium tried stopped at its proxy.
    for squid in &gw.squids {
        for line in squid.access_log().lines() {
            // (Lines without a request are the harness's own readiness checks.)
            if !line.contains("NONE_NONE/000") {
                assert!(line.contains(&plain) || line.contains(&secure), "{line}");
            }
        }
    }
    eprintln!(
        "chromium's own calls, refused in its namespace: {:?}",
        forwarder.refused.lock().unwrap()
    );
}
