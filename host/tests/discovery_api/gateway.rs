//! The gateway as a client uses it: the `proxy-operator gateway` binary in front of this
//! discovery API (the leader's side), two real squids requiring their logins as upstreams, a
//! loopback site that tells which squid carried each request (each squid leaves from its own
//! loopback address), and the clients users run: curl (HTTP, CONNECT, SOCKS5), Python requests
//! with `HTTP_PROXY`, Scrapy with only `meta['proxy']`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::gateway::GatewayProcess;
use harness::process::{Check, Scratch, free_port, wait_for};
use harness::squid::Squid;
use proxy_operator::leasing::leases::store::PoolGateway;
use proxy_operator::leasing::leases::{LeaseOptions, ProvisionedProxy};
use proxy_operator::provider::credentials::ProxyLogin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Api, GATEWAY_TOKEN, TOKEN, key, pooled, serve};

pub(super) const PAGE: &str = "the site's page\n";
/// `/browser`: a page a browser renders (its script runs) and the other clients do not.
pub(super) const BROWSER_PAGE: &str = "<!doctype html><title>site</title><p id=\"static\">the site's page</p><p id=\"script\"></p><script>document.getElementById('script').textContent = 'rendered over ' + location.protocol;</script>";
/// `/big`: long enough to kill a gateway in the middle of it.
const BIG: usize = 8 << 20;
/// Each upstream squid leaves from its own loopback address: the site tells them apart.
pub(super) const EXITS: [&str; 2] = ["127.0.0.3", "127.0.0.4"];

/// One request the site saw.
#[derive(Clone, Debug)]
pub(super) struct Seen {
    pub(super) path: String,
    pub(super) from: String,
    pub(super) host: String,
    pub(super) headers: BTreeMap<String, String>,
}

/// A loopback site on 127.0.0.1 and 127.0.0.2 (two "sites", one port): `/page`, `/blocked`
/// (429), `/captcha` (200 with a captcha page), `/browser` (HTML), `/sized?n=N` (reads the
/// request's body, answers N bytes), and everything it saw.
pub(super) struct Site {
    pub(super) port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Site {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Site {
    pub(super) async fn start() -> Site {
        use axum::extract::{ConnectInfo, Request};
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = seen.clone();
        let app = axum::Router::new().fallback(
            move |ConnectInfo(peer): ConnectInfo<SocketAddr>, request: Request| {
                let record = record.clone();
                async move {
                    let headers: BTreeMap<String, String> = request
                        .headers()
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.as_str().to_string(),
                                v.to_str().unwrap_or("?").to_string(),
                            )
                        })
                        .collect();
                    let path = request.uri().path().to_string();
                    let query = request.uri().query().unwrap_or_default().to_string();
                    let body = axum::body::to_bytes(request.into_body(), 16 << 20)
                        .await
                        .unwrap_or_default();
                    record.lock().unwrap().push(Seen {
                        path: path.clone(),
                        from: peer.ip().to_string(),
                        host: headers.get("host").cloned().unwrap_or_default(),
                        headers,
                    });
                    use axum::http::{StatusCode, header::CONTENT_TYPE};
                    use axum::response::IntoResponse;
                    match path.as_str() {
                        "/blocked" => {
                            (StatusCode::TOO_MANY_REQUESTS, b"slow down\n".to_vec()).into_response()
                        }
                        "/big" => (StatusCode::OK, vec![b'x'; BIG]).into_response(),
                        "/sized" => {
                            let n = query
                                .strip_prefix("n=")
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(0);
                            let read = format!("{}", body.len());
                            ([("x-body-read", read)], vec![b'd'; n]).into_response()
                        }
                        "/browser" => ([(CONTENT_TYPE, "text/html")], BROWSER_PAGE).into_response(),
                        // A soft block: a captcha page answered with 200.
                        "/captcha" => (
                            StatusCode::OK,
                            b"<html><h1>Please solve the CAPTCHA</h1></html>\n".to_vec(),
                        )
                            .into_response(),
                        _ => (StatusCode::OK, PAGE.as_bytes().to_vec()).into_response(),
                    }
                }
            },
        );
        let port = free_port().unwrap();
        let mut tasks = Vec::new();
        for ip in ["127.0.0.1", "127.0.0.2"] {
            let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
            let app = app.clone();
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .await;
            }));
        }
        Site { port, seen, tasks }
    }

    pub(super) fn url(&self, ip: &str, path: &str) -> String {
        format!("http://{ip}:{}{path}", self.port)
    }

    pub(super) fn seen(&self, path: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }

    /// The exit (which squid) of the last request for `path`.
    pub(super) fn last_exit(&self, path: &str) -> String {
        self.seen(path).last().expect("a request").from.clone()
    }
}

/// A ready `proxy-operator gateway` replica in front of the leader's API at `leader`, allowed
/// to reach `ports` (the site's) on 127.0.0.1 and 127.0.0.2.
pub(super) async fn spawn_replica(
    leader: SocketAddr,
    ports: &[u16],
    name: &str,
    extra_flags: &[&str],
) -> GatewayProcess {
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut flags = vec![
        "--allowed-networks",
        "127.0.0.1/32,127.0.0.2/32",
        "--allowed-ports",
        &ports,
    ];
    flags.extend_from_slice(extra_flags);
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_proxy-operator"));
    let mut replica = GatewayProcess::spawn(binary, leader, GATEWAY_TOKEN, name, &flags).unwrap();
    replica
        .wait_ready(Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    replica
}

/// The squids, the leader's API with both in pool `crawlers/gw`, the gateway binary.
pub(super) struct Gateway {
    api: Api,
    pub(super) squids: Vec<Squid>,
    logins: Vec<ProxyLogin>,
    pub(super) site: Site,
    pub(super) replica: GatewayProcess,
}

impl Gateway {
    async fn start(extra_flags: &[&str]) -> Gateway {
        Gateway::start_allowing(&[], extra_flags).await
    }

    /// [`Gateway::start`] with `extra_ports` allowed besides the site's (e.g. a TLS front's).
    pub(super) async fn start_allowing(extra_ports: &[u16], extra_flags: &[&str]) -> Gateway {
        let site = Site::start().await;
        let mut squids = Vec::new();
        let mut logins = Vec::new();
        let mut pool = Vec::new();
        for (i, exit) in EXITS.iter().enumerate() {
            let squid =
                Squid::start_requiring_login_with(&format!("tcp_outgoing_address {exit}\n"))
                    .await
                    .unwrap();
            let login = ProxyLogin::generate(&format!("squid-{i}"));
            let hashed = login.hashed();
            squid
                .set_passwords(&format!("{}:{}\n", hashed.username, hashed.password_hash))
                .unwrap();
            pool.push(ProvisionedProxy {
                port: squid.port(),
                login: Some(login.clone()),
                ..pooled(&format!("up-{i}"), "gw")
            });
            squids.push(squid);
            logins.push(login);
        }
        let options = LeaseOptions {
            failure_threshold: 1,
            ..super::options()
        };
        let api = serve(options, pool).await;
        let ports = [&[site.port], extra_ports].concat();
        let replica = spawn_replica(api.addr, &ports, "gw-test", extra_flags).await;
        Gateway {
            api,
            squids,
            logins,
            site,
            replica,
        }
    }

    fn proxy_url(&self, username: &str) -> String {
        self.replica.proxy_url(username, TOKEN)
    }

    /// curl with `args`: (HTTP status or 0, body, exit code).
    pub(super) async fn curl(&self, args: &[&str]) -> (u16, String, i32) {
        curl(args).await
    }

    pub(super) fn log(&self) -> String {
        self.replica.process.log_tail(200)
    }
}

/// curl with `args`, no proxy from the environment: (HTTP status or 0, body, exit code).
pub(super) async fn curl(args: &[&str]) -> (u16, String, i32) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .output()
        .await
        .expect("curl is installed (Debian package curl)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        body.to_string(),
        out.status.code().unwrap_or(-1),
    )
}

/// The examples' venv python (requests and Scrapy, pinned in docs/examples/requirements.txt;
/// .ci/install-fixtures.sh makes it).
pub(super) fn python() -> PathBuf {
    let pyenv = std::env::var_os("PROXY_OPERATOR_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/proxy-operator/pyenv")
        });
    let python = pyenv.join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run .ci/install-fixtures.sh (it installs docs/examples/requirements.txt)",
        python.display()
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_requests_and_scrapy_reach_the_site_through_the_fleet_never_passing_on_their_login() {
    let gw = Gateway::start(&[]).await;
    let page = gw.site.url("127.0.0.1", "/page");
    let proxy = gw.proxy_url("pool-crawlers.gw");

    // curl: a plain request, a CONNECT tunnel, SOCKS5 with the name resolved upstream.
    let (status, body, _) = gw.curl(&["-x", &proxy, &page]).await;
    assert_eq!((status, body.as_str()), (200, PAGE), "{}", gw.log());
    let (status, body, _) = gw.curl(&["-p", "-x", &proxy, &page]).await;
    assert_eq!((status, body.as_str()), (200, PAGE), "{}", gw.log());
    let socks = gw.replica.socks.to_string();
    let (status, body, code) = gw
        .curl(&[
            "--socks5-hostname",
            &socks,
            "-U",
            &format!("pool-crawlers.gw:{TOKEN}"),
            &page,
        ])
        .await;
    assert_eq!(
        (status, body.as_str(), code),
        (200, PAGE, 0),
        "{}",
        gw.log()
    );

    // Python requests with nothing but HTTP_PROXY.
    let out = tokio::process::Command::new(python())
        .args([
            "-c",
            "import os, requests; r = requests.get(os.environ['PAGE'], timeout=20); print(r.status_code); print(r.text, end='')",
        ])
        .env("HTTP_PROXY", &proxy)
        .env("PAGE", &page)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text,
        format!("200\n{PAGE}"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Scrapy with only meta['proxy'] (its built-in HttpProxyMiddleware).
    let dir = Scratch::new("scrapy").unwrap();
    let spider = dir.path().join("spider.py");
    std::fs::write(
        &spider,
        r#"import os, scrapy
class Page(scrapy.Spider):
    name = "page"
    async def start(self):
        yield scrapy.Request(os.environ["PAGE"], meta={"proxy": os.environ["GATEWAY"]})
    def parse(self, response):
        with open(os.environ["OUT"], "w") as out:
            out.write(f"{response.status}\n{response.text}")
"#,
    )
    .unwrap();
    let out_file = dir.path().join("out.txt");
    let out = tokio::process::Command::new(python())
        .args([
            "-m",
            "scrapy",
            "runspider",
            "-s",
            "TELNETCONSOLE_ENABLED=False",
        ])
        .arg(&spider)
        .env("PAGE", &page)
        .env("GATEWAY", &proxy)
        .env("OUT", &out_file)
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap_or_default(),
        format!("200\n{PAGE}"),
        "scrapy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Every request came from one of the fleet's squids, and none carried the client's login.
    let seen = gw.site.seen("/page");
    assert_eq!(seen.len(), 5, "{seen:?}");
    for s in &seen {
        assert!(EXITS.contains(&s.from.as_str()), "{s:?}");
        assert!(!s.headers.contains_key("proxy-authorization"), "{s:?}");
        assert!(!s.headers.values().any(|v| v.contains(TOKEN)), "{s:?}");
    }
    // Without a session, requests rotate over both upstreams.
    let exits: std::collections::BTreeSet<&str> = seen.iter().map(|s| s.from.as_str()).collect();
    assert_eq!(exits.len(), 2, "{seen:?}");
    // The squids saw the fleet's logins, never the client's token.
    for (squid, login) in gw.squids.iter().zip(&gw.logins) {
        let log = squid.access_log();
        assert!(!log.contains(TOKEN), "{log}");
        // (Lines without a request are the harness's own readiness checks.)
        let requests: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("NONE_NONE/000"))
            .collect();
        assert!(!requests.is_empty(), "{log}");
        for line in requests {
            assert!(line.contains(login.username()), "{line}");
        }
    }
    // The metrics and the leader's view show the gateway at work.
    let metrics = reqwest::get(format!("http://{}/metrics", gw.replica.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Each request counted for the team whose pool it was routed to.
    for family in [
        "proxy_operator_gateway_requests_total{namespace=\"crawlers\",outcome=\"ok\",pool=\"crawlers/gw\",protocol=\"http\"}",
        "proxy_operator_gateway_requests_total{namespace=\"crawlers\",outcome=\"ok\",pool=\"crawlers/gw\",protocol=\"connect\"}",
        "proxy_operator_gateway_requests_total{namespace=\"crawlers\",outcome=\"ok\",pool=\"crawlers/gw\",protocol=\"socks5\"}",
        "proxy_operator_gateway_clients",
    ] {
        assert!(metrics.contains(family), "{family} in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_upstream_and_a_blocked_site_moves_only_that_site() {
    let gw = Gateway::start(&[]).await;
    let session = gw.proxy_url("pool-crawlers.gw,session-shop");
    for _ in 0..3 {
        let (status, _, _) = gw
            .curl(&["-x", &session, &gw.site.url("127.0.0.1", "/page")])
            .await;
        assert_eq!(status, 200, "{}", gw.log());
    }
    let exits: Vec<String> = gw
        .site
        .seen("/page")
        .iter()
        .map(|s| s.from.clone())
        .collect();
    assert!(
        exits.iter().all(|e| *e == exits[0]),
        "one upstream: {exits:?}"
    );
    let first = exits[0].clone();

    // 127.0.0.1 answers 429: the client gets it, and the upstream cools down for that site.
    let (status, body, _) = gw
        .curl(&["-x", &session, &gw.site.url("127.0.0.1", "/blocked")])
        .await;
    assert_eq!((status, body.as_str()), (429, "slow down\n"));
    assert_eq!(gw.site.last_exit("/blocked"), first);
    let (status, _, _) = gw
        .curl(&["-x", &session, &gw.site.url("127.0.0.1", "/page")])
        .await;
    assert_eq!(status, 200);
    let moved = gw.site.last_exit("/page");
    assert_ne!(moved, first, "the session moved off the blocked upstream");
    // The other site still goes through the first upstream.
    let mut other = std::collections::BTreeSet::new();
    for i in 0..4 {
        let proxy = gw.proxy_url(&format!("pool-crawlers.gw,session-news{i}"));
        let (status, _, _) = gw
            .curl(&["-x", &proxy, &gw.site.url("127.0.0.2", "/page")])
            .await;
        assert_eq!(status, 200);
        other.insert(gw.site.last_exit("/page"));
    }
    assert!(other.contains(&first), "{other:?}");
    // Only that site: the block reached the leader as a target cooldown.
    for s in gw.site.seen("/page") {
        assert!(
            ["127.0.0.1", "127.0.0.2"]
                .iter()
                .any(|h| s.host.starts_with(h))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upstream_is_reported_and_retried_once_on_another() {
    let mut gw = Gateway::start(&[]).await;
    gw.squids[0].stop().await.unwrap();
    let proxy = gw.proxy_url("pool-crawlers.gw");
    let page = gw.site.url("127.0.0.1", "/page");
    // Whichever upstream the leader picks first, every request is carried by the live one.
    for _ in 0..3 {
        let (status, body, _) = gw.curl(&["-x", &proxy, &page]).await;
        assert_eq!((status, body.as_str()), (200, PAGE), "{}", gw.log());
        assert_eq!(gw.site.last_exit("/page"), EXITS[1]);
    }
    let (status, _, _) = gw.curl(&["-p", "-x", &proxy, &page]).await;
    assert_eq!(status, 200);
    // The failure reached the leader, which asks the health engine for a probe of it.
    let suspect = tokio::time::timeout(Duration::from_secs(10), gw.api.suspects.recv())
        .await
        .expect("a failure report")
        .unwrap();
    assert_eq!(suspect, key("up-0"));
    // Both down: 502 naming the reason, after one retry.
    gw.squids[1].stop().await.unwrap();
    let (status, body, _) = gw.curl(&["-i", "-x", &proxy, &page]).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("x-proxy-operator-reason: upstream-failed"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_logins_refused_destinations_and_exclusive_leases_are_answered_with_the_reason() {
    let gw = Gateway::start(&["--max-clients-per-token", "3"]).await;
    let page = gw.site.url("127.0.0.1", "/page");
    // Both proxies leased exclusively through the lease API (before any route): the gateway
    // has none to share until they are released.
    let mut leases = Vec::new();
    for _ in 0..2 {
        let reply = gw
            .api
            .grant(serde_json::json!({ "pool": "crawlers/gw" }))
            .await;
        assert_eq!(reply.status, reqwest::StatusCode::CREATED, "{}", reply.body);
        leases.push(reply.body["id"].as_str().unwrap().to_string());
    }
    let proxy = gw.proxy_url("pool-crawlers.gw");
    let (status, body, _) = gw.curl(&["-i", "-x", &proxy, &page]).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("Retry-After"), "{body}");
    assert!(gw.site.seen("/page").is_empty());
    for id in &leases {
        let reply = gw
            .api
            .send(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
            .await;
        assert_eq!(reply.status, reqwest::StatusCode::NO_CONTENT);
    }
    let (status, _, _) = gw.curl(&["-x", &proxy, &page]).await;
    assert_eq!(status, 200, "{}", gw.log());

    // No login: 407 with the challenge.
    let bare = format!("http://{}", gw.replica.http);
    let (status, body, _) = gw.curl(&["-i", "-x", &bare, &page]).await;
    assert_eq!(status, 407);
    assert!(body.contains("Proxy-Authenticate: Basic"), "{body}");
    // A malformed username: 407 naming the part.
    let (status, body, _) = gw
        .curl(&[
            "-i",
            "-x",
            &gw.proxy_url("pool-crawlers.gw,sesion-x"),
            &page,
        ])
        .await;
    assert_eq!(status, 407);
    assert!(body.contains("X-Proxy-Operator-Error: part 2"), "{body}");
    assert!(body.contains("sesion"), "{body}");
    assert!(gw.log().contains("sesion"), "logged");
    // A token the leader does not accept: 407, never logged.
    let wrong = format!("http://pool-crawlers.gw:not-the-token@{}", gw.replica.http);
    let (status, _, _) = gw.curl(&["-x", &wrong, &page]).await;
    assert_eq!(status, 407);
    assert!(!gw.log().contains(TOKEN) && !gw.log().contains("not-the-token"));
    // A pool that does not exist: 407 naming it.
    let (status, body, _) = gw
        .curl(&["-i", "-x", &gw.proxy_url("pool-crawlers.nope"), &page])
        .await;
    assert_eq!(status, 407);
    assert!(body.contains("crawlers/nope"), "{body}");
    // Destinations the policy refuses: 403, nothing sent upstream.
    for url in [
        "http://127.0.0.1:25/".to_string(),
        format!("http://10.0.0.1:{}/", gw.site.port),
        format!("http://kubernetes.default.svc:{}/", gw.site.port),
    ] {
        let (status, body, _) = gw.curl(&["-x", &proxy, &url]).await;
        assert_eq!(status, 403, "{url}: {body}");
    }
    let socks = gw.replica.socks.to_string();
    let login = format!("pool-crawlers.gw:{TOKEN}");
    let (_, _, code) = gw
        .curl(&[
            "--socks5-hostname",
            &socks,
            "-U",
            &login,
            "http://10.0.0.1:80/",
        ])
        .await;
    assert_ne!(code, 0, "SOCKS5 refuses it too");
    for squid in &gw.squids {
        assert!(!squid.access_log().contains("10.0.0.1"));
    }

    // A hostile client holding tunnels: the per-token bound refuses the fourth.
    let mut held = Vec::new();
    let authorization = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("pool-crawlers.gw:{TOKEN}"))
    };
    for i in 0..4 {
        let mut stream = tokio::net::TcpStream::connect(gw.replica.http)
            .await
            .unwrap();
        let request = format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic {authorization}\r\n\r\n",
            port = gw.site.port
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 256];
        let n = stream.read(&mut answer).await.unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]).to_string();
        if i < 3 {
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            held.push(stream);
        } else {
            assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_transfer_leaves_the_session_on_its_upstream_through_another() {
    let mut gw = Gateway::start(&[]).await;
    // A second replica: stateless, so the session's upstream is the leader's answer there too.
    let other = spawn_replica(gw.api.addr, &[gw.site.port], "gw-other", &[]).await;
    let session = gw.proxy_url("pool-crawlers.gw,session-long");
    let page = gw.site.url("127.0.0.1", "/page");
    let (status, _, _) = gw.curl(&["-x", &session, &page]).await;
    assert_eq!(status, 200);
    let upstream = gw.site.last_exit("/page");

    // A slow download through the first replica, killed once the site is sending it.
    let big = gw.site.url("127.0.0.1", "/big");
    let download = tokio::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "--limit-rate",
            "200k",
            "-x",
            &session,
            &big,
        ])
        .args(["-w", "%{size_download}"])
        .output();
    let download = tokio::spawn(download);
    let site = gw.site.seen.clone();
    wait_for("the site sending /big", Duration::from_secs(20), || {
        let started = site.lock().unwrap().iter().any(|s| s.path == "/big");
        async move {
            if started {
                Check::Ready(())
            } else {
                Check::NotYet("not asked yet".into())
            }
        }
    })
    .await
    .unwrap();
    gw.replica.process.kill();
    let out = download.await.unwrap().unwrap();
    assert!(!out.status.success(), "the transfer broke with its replica");
    let got: usize = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(got < BIG, "{got} bytes");

    // The client reconnects to the other replica: the whole body, through the same upstream.
    let through_other = format!(
        "http://pool-crawlers.gw,session-long:{TOKEN}@{}",
        other.http
    );
    let (status, _, code) = gw
        .curl(&["-o", "/dev/null", "-x", &through_other, &big])
        .await;
    assert_eq!((status, code), (200, 0), "{}", other.process.log_tail(20));
    assert_eq!(
        gw.site.last_exit("/big"),
        upstream,
        "the session kept its upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_own_block_rules_and_a_clients_own_report_move_a_session_off_its_upstream() {
    let gw = Gateway::start(&[]).await;
    // The pool's own rules: a captcha page is a block, a 429 is not.
    gw.api.store.set_pool_gateways(vec![(
        key("gw"),
        PoolGateway {
            max_connections_per_proxy: None,
            block_statuses: Some(vec![]),
            block_body_patterns: vec!["captcha".into()],
        },
    )]);
    let session = gw.proxy_url("pool-crawlers.gw,session-shop");
    let get = |path: &'static str| {
        let url = gw.site.url("127.0.0.1", path);
        let session = session.clone();
        let gw = &gw;
        async move { gw.curl(&["-x", &session, &url]).await.0 }
    };
    assert_eq!(get("/page").await, 200, "{}", gw.log());
    let first = gw.site.last_exit("/page");
    assert_eq!(get("/blocked").await, 429);
    assert_eq!(get("/page").await, 200);
    assert_eq!(gw.site.last_exit("/page"), first, "a 429 is no block here");
    assert_eq!(
        get("/captcha").await,
        200,
        "the client gets the page as sent"
    );
    assert_eq!(get("/page").await, 200);
    assert_ne!(gw.site.last_exit("/page"), first, "the captcha moved it");

    // A client that read a block inside its TLS tunnel tells the gateway itself.
    let tls = gw.proxy_url("pool-crawlers.gw,session-tls");
    let (status, _, _) = gw
        .curl(&["-x", &tls, &gw.site.url("127.0.0.2", "/page")])
        .await;
    assert_eq!(status, 200);
    let before = gw.site.last_exit("/page");
    let report = "http://gateway.proxy-operator.invalid/report?outcome=blocked&target=127.0.0.2";
    let (status, body, _) = gw.curl(&["-x", &tls, "-X", "POST", report]).await;
    assert_eq!(status, 200, "{body}");
    let landed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let up = if before == EXITS[0] { "up-0" } else { "up-1" };
    assert_eq!(landed["proxy"], format!("crawlers/{up}"), "{body}");
    let (status, _, _) = gw
        .curl(&["-x", &tls, &gw.site.url("127.0.0.2", "/page")])
        .await;
    assert_eq!(status, 200);
    assert_ne!(gw.site.last_exit("/page"), before, "the report moved it");
    assert!(gw.site.seen("/report").is_empty(), "never sent to a site");

    // Without a session there is no upstream to land on; a GET changes nothing.
    let bare = gw.proxy_url("pool-crawlers.gw");
    let (status, body, _) = gw.curl(&["-x", &bare, "-X", "POST", report]).await;
    assert_eq!(status, 400);
    assert!(body.contains("session-<id>"), "{body}");
    let (status, _, _) = gw.curl(&["-x", &tls, report]).await;
    assert_eq!(status, 405);
    let unknown = gw.proxy_url("pool-crawlers.gw,session-never");
    let (status, body, _) = gw.curl(&["-x", &unknown, "-X", "POST", report]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("has no proxy now"), "{body}");
}

/// `proxy_operator_gateway_bytes_total` of `pool` on a replica's /metrics: (sent, received).
async fn bytes_on_metrics(replica: &GatewayProcess, pool: &str) -> (u64, u64) {
    let metrics = reqwest::get(format!("http://{}/metrics", replica.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The pool's namespace is the team its bytes are billed to.
    let namespace = pool.split_once('/').map_or("none", |(ns, _)| ns);
    let value = |direction: &str| {
        let series = format!(
            "proxy_operator_gateway_bytes_total{{direction=\"{direction}\",namespace=\"{namespace}\",pool=\"{pool}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    (value("sent"), value("received"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_each_way_count_for_the_upstreams_pool_over_http_connect_and_socks5() {
    // Known payloads each way; the rest is the HTTP heads inside (curl's request, the site's
    // and squid's response headers), well under 2 KiB each way.
    const UP: usize = 300_000;
    const DOWN: usize = 700_000;
    const HEADS: u64 = 2048;
    let gw = Gateway::start(&[]).await;
    let dir = Scratch::new("bytes").unwrap();
    let upload = dir.path().join("upload");
    std::fs::write(&upload, vec![b'u'; UP]).unwrap();
    let upload = format!("@{}", upload.display());
    let url = gw.site.url("127.0.0.1", &format!("/sized?n={DOWN}"));
    let socks = gw.replica.socks.to_string();
    let login = format!("pool-crawlers.gw:{TOKEN}");
    // The plain request names no pool: its bytes count under the pool the leader's route
    // names (the upstream's).
    let anonymous = gw.proxy_url("");
    let pooled = gw.proxy_url("pool-crawlers.gw");
    let ways: [(&str, Vec<&str>); 3] = [
        ("plain HTTP", vec!["-x", &anonymous]),
        ("CONNECT", vec!["-p", "-x", &pooled]),
        ("SOCKS5", vec!["--socks5-hostname", &socks, "-U", &login]),
    ];
    let mut total = (0, 0);
    for (way, args) in ways {
        let before = bytes_on_metrics(&gw.replica, "crawlers/gw").await;
        let mut args = args.clone();
        args.extend(["-H", "Expect:", "--data-binary", &upload, &url]);
        let (status, body, code) = gw.curl(&args).await;
        assert_eq!(
            (status, body.len(), code),
            (200, DOWN, 0),
            "{way}: {}",
            gw.log()
        );
        let read = gw.site.seen("/sized").len();
        assert!(read > 0, "{way}");
        // The connection's last bytes reach the counter as it closes, just after curl ends.
        let replica = &gw.replica;
        let counted = wait_for(
            "the bytes counted",
            Duration::from_secs(10),
            || async move {
                let now = bytes_on_metrics(replica, "crawlers/gw").await;
                let delta = (now.0 - before.0, now.1 - before.1);
                if delta.0 >= UP as u64 && delta.1 >= DOWN as u64 {
                    Check::Ready(delta)
                } else {
                    Check::NotYet(format!("{delta:?}"))
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{way}: {e:#}\n{}", gw.log()));
        assert!(
            counted.0 <= UP as u64 + HEADS && counted.1 <= DOWN as u64 + HEADS,
            "{way}: {counted:?} for {UP} up, {DOWN} down"
        );
        total = (total.0 + counted.0, total.1 + counted.1);
    }
    // Nothing counted under another pool, nor under `none`.
    assert_eq!(bytes_on_metrics(&gw.replica, "none").await, (0, 0));

    // The replica tells the leader with its load reports: the status page's figure.
    let store = gw.api.store.clone();
    wait_for("the leader's byte totals", Duration::from_secs(20), || {
        let bytes = store.gateway_bytes();
        async move {
            match bytes.iter().find(|(pool, _)| pool == "crawlers/gw") {
                Some((_, t)) if (t.sent, t.received) == total => Check::Ready(()),
                _ => Check::NotYet(format!("{bytes:?}, want {total:?}")),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}
