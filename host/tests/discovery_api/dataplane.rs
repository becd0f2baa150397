//! The gateway's data plane with real clients (curl, Python requests) through real squids that
//! require a login, to a loopback origin that echoes what reaches it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::Squid;
use harness::process::{Check, wait_for};
use proxy_operator::leasing::gateway::metrics::GatewayMetrics;
use proxy_operator::leasing::gateway::options::GatewayOptions;
use proxy_operator::leasing::gateway::policy::{DestinationPolicy, Networks};
use proxy_operator::leasing::gateway::server::Gateway;
use proxy_operator::leasing::gateway::{
    Destination, Report, Route, RouteError, RouteRequest, Routes, SessionReport, UpstreamLogin,
};
use proxy_operator::provider::credentials::ProxyLogin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "client-token-9f8e7d";
const REFUSED_TOKEN: &str = "refused-token";

/// Two upstreams; `session-b` prefers the second, anything else the first; `avoid` is obeyed.
struct TestRoutes {
    upstreams: Vec<Route>,
    reports: Mutex<Vec<(String, Destination, Report)>>,
}

impl Routes for TestRoutes {
    async fn route(&self, request: &RouteRequest) -> Result<Route, RouteError> {
        if request.token == REFUSED_TOKEN {
            return Err(RouteError::Unauthenticated);
        }
        let first = usize::from(request.routing.session.as_deref() == Some("b"));
        [first, 1 - first]
            .iter()
            .map(|i| &self.upstreams[*i])
            .find(|r| request.avoid.as_deref() != Some(r.proxy.as_str()))
            .cloned()
            .ok_or(RouteError::NoProxy {
                retry_after: Duration::from_secs(1),
            })
    }

    async fn report(&self, route: &Route, destination: &Destination, report: Report) {
        let entry = (route.proxy.clone(), destination.clone(), report);
        self.reports.lock().unwrap().push(entry);
    }

    async fn report_session(&self, report: &SessionReport) -> Result<String, RouteError> {
        let upstream = usize::from(report.routing.session.as_deref() == Some("b"));
        Ok(self.upstreams[upstream].proxy.clone())
    }
}

/// An origin on loopback that answers every request with the head it received (so a test sees
/// which headers arrived); `/blocked` answers 429.
async fn echo_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let status = if head.contains(" /blocked ") {
                    "429 Too Many Requests"
                } else {
                    "200 OK"
                };
                let body = format!("origin saw:\n{head}");
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

struct World {
    squids: Vec<Squid>,
    logins: Vec<ProxyLogin>,
    routes: Arc<TestRoutes>,
    origin: SocketAddr,
    http: SocketAddr,
    socks: SocketAddr,
    metrics: prometheus::Registry,
    stop: CancellationToken,
    serving: tokio::task::JoinHandle<()>,
    _stop: tokio_util::sync::DropGuard,
}

impl World {
    async fn start(max_per_token: u32) -> World {
        let mut squids = Vec::new();
        let mut logins = Vec::new();
        let mut upstreams = Vec::new();
        for name in ["upstream-a", "upstream-b"] {
            let squid = Squid::start_requiring_login().await.unwrap();
            let login = ProxyLogin::generate(name);
            let hashed = login.hashed();
            squid
                .set_passwords(&format!("{}:{}\n", hashed.username, hashed.password_hash))
                .unwrap();
            upstreams.push(Route {
                proxy: format!("proxies/{name}"),
                pool: Some("proxies/dataplane".into()),
                address: "127.0.0.1".into(),
                port: squid.port(),
                login: Some(UpstreamLogin {
                    username: login.username().into(),
                    password: login.password().into(),
                }),
                protocol: Default::default(),
                block_statuses: vec![403, 429],
                block_body_patterns: vec!["captcha".into()],
            });
            squids.push(squid);
            logins.push(login);
        }
        let origin = echo_origin().await;
        let routes = Arc::new(TestRoutes {
            upstreams,
            reports: Mutex::new(Vec::new()),
        });
        let options = GatewayOptions {
            max_clients_per_token: max_per_token,
            policy: DestinationPolicy {
                ports: vec![80, 443, origin.port()],
                allowed_networks: "127.0.0.0/8".parse::<Networks>().unwrap().0,
                allowed_host_suffixes: Vec::new(),
            },
            ..GatewayOptions::default()
        };
        let metrics = prometheus::Registry::new();
        let gateway = Arc::new(Gateway::new(
            routes.clone(),
            options,
            GatewayMetrics::register(&metrics).unwrap(),
        ));
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socks = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (http_addr, socks_addr) = (http.local_addr().unwrap(), socks.local_addr().unwrap());
        let stop = CancellationToken::new();
        let serving = tokio::spawn(gateway.serve(http, socks, stop.clone()));
        World {
            squids,
            logins,
            routes,
            origin,
            http: http_addr,
            socks: socks_addr,
            metrics,
            serving,
            _stop: stop.clone().drop_guard(),
            stop,
        }
    }

    fn proxy_url(&self, user: &str, token: &str) -> String {
        format!("http://{user}:{token}@{}", self.http)
    }

    fn page(&self, path: &str) -> String {
        format!("http://{}{path}", self.origin)
    }

    fn reports(&self) -> Vec<(String, Destination, Report)> {
        self.routes.reports.lock().unwrap().clone()
    }

    /// Waits for `n` reports (a block is reported once the response is relayed).
    async fn reports_when(&self, n: usize) -> Vec<(String, Destination, Report)> {
        wait_for("reports", Duration::from_secs(10), || async {
            let reports = self.reports();
            if reports.len() >= n {
                Check::Ready(reports)
            } else {
                Check::NotYet(format!("{reports:?}"))
            }
        })
        .await
        .unwrap()
    }

    /// Waits until squid `i`'s access log has a line with `needle`, and returns the log.
    async fn squid_logged(&self, i: usize, needle: &str) -> String {
        self.squid_logged_times(i, needle, 1).await
    }

    /// Waits until squid `i`'s access log has `needle` `times` times (squid logs a tunnel when
    /// it closes, maybe after the client is done).
    async fn squid_logged_times(&self, i: usize, needle: &str, times: usize) -> String {
        let squid = &self.squids[i];
        wait_for("squid's access log", Duration::from_secs(10), || async {
            let log = squid.access_log();
            if log.matches(needle).count() >= times {
                Check::Ready(log)
            } else {
                Check::NotYet(format!("no `{needle}` in:\n{log}"))
            }
        })
        .await
        .unwrap()
    }
}

/// Runs a client program; a missing one fails the test.
async fn run(program: &str, args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
    ] {
        command.env_remove(var);
    }
    command.envs(envs.iter().copied());
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} timed out"))
        .unwrap_or_else(|e| panic!("{program} must be installed to run this test: {e}"));
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn curl(args: &[&str]) -> String {
    let (ok, out, err) = curl_exit(args).await;
    assert!(ok, "curl {args:?}: {err}\n{out}");
    out
}

/// curl that may fail (a refused CONNECT is an error to curl); its output and errors.
async fn curl_exit(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["-sS", "--max-time", "30"];
    all.extend_from_slice(args);
    run("curl", &all, &[]).await
}

fn assert_no_client_secret(seen: &str) {
    assert!(!seen.contains(TOKEN), "the client's token went on: {seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-authorization"),
        "a Proxy-Authorization reached the origin: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_go_through_the_squid_their_route_names_and_never_leak_the_token() {
    let world = World::start(1000).await;
    // curl, plain HTTP through the gateway: the first squid (session-a).
    let proxy = world.proxy_url("pool-ns.pool,session-a", TOKEN);
    let body = curl(&["-x", &proxy, &world.page("/plain")]).await;
    assert!(
        body.starts_with("origin saw:\nGET /plain HTTP/1.1"),
        "{body}"
    );
    assert_no_client_secret(&body);
    let log = world.squid_logged(0, "/plain").await;
    assert!(
        log.contains("upstream-a"),
        "squid logs the gateway's login: {log}"
    );
    assert_no_client_secret(&log);
    assert!(!world.squids[1].access_log().contains("/plain"));

    // curl through a CONNECT tunnel: the second squid (session-b).
    let proxy_b = world.proxy_url("session-b", TOKEN);
    let body = curl(&["-p", "-x", &proxy_b, &world.page("/tunnelled")]).await;
    assert!(body.contains("GET /tunnelled HTTP/1.1"), "{body}");
    assert_no_client_secret(&body);
    let log = world
        .squid_logged(1, &format!("CONNECT {}", world.origin))
        .await;
    assert!(log.contains("upstream-b"), "{log}");
    assert_no_client_secret(&log);

    // curl over SOCKS5, the name left to the upstream.
    let socks = world.socks.to_string();
    let user = format!("session-b:{TOKEN}");
    let body = curl(&[
        "--socks5-hostname",
        &socks,
        "-U",
        &user,
        &world.page("/socks"),
    ])
    .await;
    assert!(body.contains("GET /socks HTTP/1.1"), "{body}");
    assert_no_client_secret(&body);
    let log = world.squid_logged_times(1, "CONNECT", 2).await;
    assert_no_client_secret(&log);

    // Python requests with HTTP_PROXY.
    let script = "import os, requests; r = requests.get(os.environ['PAGE'], timeout=30); print(r.status_code); print(r.text)";
    let page = world.page("/python");
    let (ok, out, err) = run(
        super::gateway::python().to_str().unwrap(),
        &["-c", script],
        &[("HTTP_PROXY", &proxy), ("PAGE", &page)],
    )
    .await;
    assert!(ok, "python requests: {err}");
    assert!(
        out.starts_with("200\norigin saw:\nGET /python HTTP/1.1"),
        "{out}"
    );
    assert_no_client_secret(&out);
    world.squid_logged(0, "/python").await;
    assert!(world.reports().is_empty(), "{:?}", world.reports());
    drop(world.logins);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_their_reason() {
    let world = World::start(1000).await;
    let page = world.page("/x");
    // No credentials.
    let head = curl(&["-i", "-x", &world.http.to_string(), &page]).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.contains("Proxy-Authenticate: Basic realm=\"proxy-operator\""),
        "{head}"
    );
    // A malformed username: the part is named.
    let head = curl(&[
        "-i",
        "-x",
        &world.proxy_url("pool-ns.p,sesion-a", TOKEN),
        &page,
    ])
    .await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    assert!(
        head.contains("X-Proxy-Operator-Error: part 2 `sesion-a`: unknown key `sesion`"),
        "{head}"
    );
    // A token the fleet refuses.
    let head = curl(&["-i", "-x", &world.proxy_url("", REFUSED_TOKEN), &page]).await;
    assert!(head.starts_with("HTTP/1.1 407"), "{head}");
    // Destinations the policy refuses, by port and by address.
    let proxy = world.proxy_url("", TOKEN);
    for target in [
        "http://127.0.0.1:25/",
        "http://10.0.0.1/",
        "http://metadata.google.internal/",
    ] {
        let head = curl(&["-i", "-x", &proxy, target]).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
    }
    let (ok, _, err) = curl_exit(&["-p", "-x", &proxy, "http://10.0.0.1:443/"]).await;
    assert!(
        !ok && err.contains("CONNECT tunnel failed, response 403"),
        "{err}"
    );
    for squid in &world.squids {
        assert!(
            !squid.access_log().contains("10.0.0.1"),
            "refused before any upstream"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_status_is_reported_and_a_down_upstream_is_retried_once() {
    let mut world = World::start(1000).await;
    let proxy = world.proxy_url("session-a", TOKEN);
    let head = curl(&["-i", "-x", &proxy, &world.page("/blocked")]).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    let reports = world.reports_when(1).await;
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].0, "proxies/upstream-a");
    assert_eq!(reports[0].2, Report::Blocked);
    world.routes.reports.lock().unwrap().clear();
    // A 200 whose body has one of the route's texts (the origin echoes the path) is one too.
    let body = curl(&["-x", &proxy, &world.page("/a-captcha-wall")]).await;
    assert!(body.contains("GET /a-captcha-wall"), "{body}");
    let reports = world.reports_when(1).await;
    assert_eq!(reports[0].2, Report::Blocked, "{reports:?}");
    world.routes.reports.lock().unwrap().clear();

    // The first squid down: the retry on the second carries the request.
    world.squids[0].kill();
    let body = curl(&["-x", &proxy, &world.page("/after-a")]).await;
    assert!(body.contains("GET /after-a"), "{body}");
    world.squid_logged(1, "/after-a").await;
    let body = curl(&["-p", "-x", &proxy, &world.page("/tunnel-after-a")]).await;
    assert!(body.contains("GET /tunnel-after-a"), "{body}");
    let reports = world.reports();
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        reports
            .iter()
            .all(|(p, _, r)| p == "proxies/upstream-a" && *r == Report::Failure),
        "{reports:?}"
    );

    // Both down: 502 naming why.
    world.squids[1].kill();
    let page = world.page("/nowhere");
    let head = curl(&["-i", "-x", &proxy, &page]).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(
        head.contains("X-Proxy-Operator-Reason: upstream-failed"),
        "{head}"
    );
    // curl keeps a refused CONNECT's answer to itself but for its status; the header is read
    // on a bare tunnel request.
    let (_, status) = connect_tunnel(world.http, world.origin, "").await;
    assert!(status.starts_with("HTTP/1.1 502"), "{status}");
    let (ok, _, err) = curl_exit(&["-p", "-x", &proxy, &page]).await;
    assert!(!ok && err.contains("response 502"), "{err}");
}

/// Opens a CONNECT tunnel through the gateway and returns the stream and the status line.
async fn connect_tunnel(
    gateway: SocketAddr,
    target: SocketAddr,
    user: &str,
) -> (TcpStream, String) {
    use base64::Engine;
    let mut stream = TcpStream::connect(gateway).await.unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{TOKEN}"));
    let request = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    (stream, text.lines().next().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_more_than_its_bound_is_refused() {
    let world = World::start(3).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (stream, status) = connect_tunnel(world.http, world.origin, "").await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        held.push(stream);
    }
    for _ in 0..5 {
        let (_, status) = connect_tunnel(world.http, world.origin, "").await;
        assert!(status.starts_with("HTTP/1.1 429"), "{status}");
    }
    held.pop();
    // The bound frees with the connection (the gateway sees the close on its next read).
    wait_for("a freed slot", Duration::from_secs(10), || async {
        let (_, status) = connect_tunnel(world.http, world.origin, "").await;
        if status.starts_with("HTTP/1.1 200") {
            Check::Ready(())
        } else {
            Check::NotYet(status)
        }
    })
    .await
    .unwrap();
}

/// A SOCKS5 handshake by hand: greeting with `methods`, then (if 0x02 was chosen) the login,
/// then CONNECT (`command`) to `address` (an ATYP byte and the address bytes) and `port`.
/// Returns every reply byte the gateway sent before it closed or answered the request.
async fn socks5(
    socks: SocketAddr,
    methods: &[u8],
    login: (&str, &str),
    command: u8,
    address: &[u8],
    port: u16,
) -> (Vec<u8>, TcpStream) {
    let mut stream = TcpStream::connect(socks).await.unwrap();
    let mut greeting = vec![5, methods.len() as u8];
    greeting.extend_from_slice(methods);
    stream.write_all(&greeting).await.unwrap();
    let mut replies = vec![0u8; 2];
    stream.read_exact(&mut replies).await.unwrap();
    if replies[1] != 2 {
        return (replies, stream);
    }
    let (user, password) = login;
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.push(password.len() as u8);
    auth.extend_from_slice(password.as_bytes());
    stream.write_all(&auth).await.unwrap();
    let mut status = [0u8; 2];
    stream.read_exact(&mut status).await.unwrap();
    replies.extend_from_slice(&status);
    if status[1] != 0 {
        return (replies, stream);
    }
    let mut request = vec![5, command, 0];
    request.extend_from_slice(address);
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    stream.read_exact(&mut reply).await.unwrap();
    replies.extend_from_slice(&reply[..2]);
    (replies, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_replies_say_why() {
    let world = World::start(1000).await;
    let origin_v4 = [1, 127, 0, 0, 1];
    let port = world.origin.port();
    let ok = ("session-b", TOKEN);
    // No username/password method offered: no acceptable method, and closed.
    let (replies, _) = socks5(world.socks, &[0], ok, 1, &origin_v4, port).await;
    assert_eq!(replies, [5, 0xFF]);
    // A malformed username: RFC 1929 failure.
    let bad = ("pool-nodot", TOKEN);
    let (replies, _) = socks5(world.socks, &[0, 2], bad, 1, &origin_v4, port).await;
    assert_eq!(replies, [5, 2, 1, 1]);
    // BIND: command not supported.
    let (replies, _) = socks5(world.socks, &[2], ok, 2, &origin_v4, port).await;
    assert_eq!(replies, [5, 2, 1, 0, 5, 7]);
    // A destination the policy refuses: not allowed by ruleset.
    let private = [1, 10, 0, 0, 1];
    let (replies, _) = socks5(world.socks, &[2], ok, 1, &private, 80).await;
    assert_eq!(replies, [5, 2, 1, 0, 5, 2]);
    // A token the fleet refuses (known only with the request): not allowed.
    let refused = ("", REFUSED_TOKEN);
    let (replies, _) = socks5(world.socks, &[2], refused, 1, &origin_v4, port).await;
    assert_eq!(replies, [5, 2, 1, 0, 5, 2]);
    // An IPv4 address through the second squid: succeeded, and the tunnel carries HTTP.
    let (replies, mut stream) = socks5(world.socks, &[2], ok, 1, &origin_v4, port).await;
    assert_eq!(replies, [5, 2, 1, 0, 5, 0]);
    let request = format!("GET /raw-socks HTTP/1.1\r\nHost: {}\r\n\r\n", world.origin);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.contains("GET /raw-socks HTTP/1.1"), "{answer}");
    world
        .squid_logged(1, &format!("CONNECT {}", world.origin))
        .await;
}

/// The value of a sample of the gateway's metrics, 0 when it has no series.
fn sample(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .find(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        // A sample is a gauge or a counter; the other reads 0.
        .map_or(0.0, |m| {
            m.get_gauge().get_value() + m.get_counter().get_value()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_and_lets_open_tunnels_finish_and_metrics_count() {
    let world = World::start(1000).await;
    let (mut tunnel, status) = connect_tunnel(world.http, world.origin, "session-a").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // The load on upstreams is per pool (never per proxy): one connection, one proxy in use.
    let connections = "proxy_operator_gateway_connections";
    let pool = [("pool", "proxies/dataplane")];
    assert_eq!(sample(&world.metrics, connections, &pool), 1.0);
    for family in [
        "proxy_operator_gateway_proxies_in_use",
        "proxy_operator_gateway_proxy_connections_max",
    ] {
        assert_eq!(sample(&world.metrics, family, &pool), 1.0, "{family}");
    }
    assert!(
        !world
            .metrics
            .gather()
            .iter()
            .flat_map(|f| f.get_metric())
            .any(|m| m.get_label().iter().any(|l| l.name() == "proxy")),
        "no series names a proxy"
    );
    assert_eq!(
        sample(&world.metrics, "proxy_operator_gateway_clients", &[]),
        1.0
    );
    world.stop.cancel();
    wait_for("the ports closed", Duration::from_secs(10), || async {
        match TcpStream::connect(world.http).await {
            Err(_) => Check::Ready(()),
            Ok(_) => Check::NotYet("the HTTP port still accepts".into()),
        }
    })
    .await
    .unwrap();
    assert!(
        !world.serving.is_finished(),
        "the open tunnel holds the gateway"
    );
    // The open tunnel still carries a request.
    let request = format!(
        "GET /during-shutdown HTTP/1.1\r\nHost: {}\r\n\r\n",
        world.origin
    );
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tunnel.read_to_string(&mut answer).await.unwrap();
    assert!(answer.contains("GET /during-shutdown"), "{answer}");
    drop(tunnel);
    tokio::time::timeout(Duration::from_secs(10), world.serving)
        .await
        .expect("serve returns once the last tunnel closed")
        .unwrap();
    assert_eq!(
        sample(&world.metrics, connections, &pool),
        0.0,
        "the series goes with the last connection"
    );
    assert!(
        !world
            .metrics
            .gather()
            .iter()
            .any(|f| f.name() == connections && !f.get_metric().is_empty()),
        "no pool series left"
    );
    let requests = "proxy_operator_gateway_requests_total";
    let ok = [("protocol", "connect"), ("outcome", "ok")];
    assert_eq!(sample(&world.metrics, requests, &ok), 1.0);
    assert_eq!(
        sample(&world.metrics, "proxy_operator_gateway_clients", &[]),
        0.0
    );
}
