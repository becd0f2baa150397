//! The crawler examples of docs/examples/ (a Scrapy middleware, a `requests` client) run for
//! real with Python, as a crawler team would run them: the operator binary, a ProxyPool with
//! `recycleAfter`, one real squid per proxy, each leaving from its own loopback address, and a
//! loopback site that blocks an exit address after a few requests (403, 429 or a captcha page).
//! What a user checks: the pages came through the proxies, the blocks were reported, the pool
//! replaced the blocked proxies, every lease was given back, the proxy password never printed.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use harness::Squid;
use kube::api::{Api, ListParams};
use proxy_operator::api::labels::POOL_LABEL;
use proxy_operator::api::{Proxy, ProxyPool};
use serde_json::Value;

use super::common::operator_process::{OperatorProcess, TOKEN};
use super::world::World;

/// Requests one exit address gets answered before the site blocks it.
const BLOCK_AFTER: usize = 3;
const PAGES: usize = 10;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/examples")
}

/// The password part of every `scheme://user:password@` in `output` that is not masked (`***`).
fn printed_passwords(output: &str) -> Vec<&str> {
    output
        .split("://")
        .skip(1)
        .filter_map(|rest| {
            let token = rest
                .split(|c: char| c.is_whitespace() || "()'\"".contains(c))
                .next()?;
            let (userinfo, _) = token.split_once('@')?;
            let (_, password) = userinfo.split_once(':')?;
            (password != "***").then_some(password)
        })
        .collect()
}

/// The venv's python (.ci/install-fixtures.sh); a missing or stale one fails with the fix.
fn python() -> PathBuf {
    let pyenv = std::env::var_os("PROXY_OPERATOR_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/proxy-operator/pyenv")
        });
    let fix =
        "run .ci/install-fixtures.sh (it installs docs/examples/requirements.txt into that venv)";
    let python = pyenv.join("bin/python");
    assert!(python.exists(), "{} is missing: {fix}", python.display());
    let wanted = std::fs::read(examples_dir().join("requirements.txt")).unwrap();
    let installed = std::fs::read(pyenv.join("requirements.txt")).unwrap_or_default();
    assert!(
        wanted == installed,
        "{} holds other packages than docs/examples/requirements.txt: {fix}",
        pyenv.display()
    );
    python
}

/// What the site saw: requests per exit address, the exits it blocked (in order), the pages it
/// served.
#[derive(Default)]
struct Seen {
    requests: HashMap<IpAddr, usize>,
    blocked: Vec<IpAddr>,
    served: Vec<(IpAddr, String)>,
}

/// A site that blocks an exit address after [`BLOCK_AFTER`] requests, for good: with 403, 429
/// or a captcha page (200), in turn for each exit it blocks.
struct Site {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Site {
    async fn start() -> Site {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        Site { addr, seen, task }
    }

    fn urls(&self, prefix: &str) -> Vec<String> {
        (0..PAGES)
            .map(|i| format!("http://{}/{prefix}/{i}", self.addr))
            .collect()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    State(seen): State<Arc<Mutex<Seen>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    uri: Uri,
) -> Response {
    let mut seen = seen.lock().unwrap();
    let exit = peer.ip();
    let count = seen.requests.entry(exit).or_default();
    *count += 1;
    if *count > BLOCK_AFTER {
        let nth = match seen.blocked.iter().position(|e| *e == exit) {
            Some(nth) => nth,
            None => {
                seen.blocked.push(exit);
                seen.blocked.len() - 1
            }
        };
        return match nth % 3 {
            0 => (StatusCode::FORBIDDEN, "banned").into_response(),
            1 => (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response(),
            _ => (
                [(header::CONTENT_TYPE, "text/html")],
                "<html><body>Please solve this CAPTCHA to go on</body></html>",
            )
                .into_response(),
        };
    }
    seen.served.push((exit, uri.path().to_string()));
    (
        [(header::CONTENT_TYPE, "text/html")],
        format!("<html><body>page {} for {exit}</body></html>", uri.path()),
    )
        .into_response()
}

/// The operator, a pool of 2 with `recycleAfter: 1`, and `exits` squids the pool's Proxies take
/// in turn (each leaving from 127.0.0.{10+i}), so a replaced proxy has a new exit address.
struct Crawl {
    python: PathBuf,
    world: World,
    operator: OperatorProcess,
    squids: Vec<(IpAddr, Squid)>,
    site: Site,
}

impl Crawl {
    async fn start(prefix: &str, exits: u8) -> Crawl {
        // First, so a missing venv fails at once.
        let python = python();
        let world = World::start(prefix).await;
        let squids = futures_util::future::join_all((0..exits).map(|i| async move {
            let exit = Ipv4Addr::new(127, 0, 0, 10 + i);
            let squid = Squid::start_with(&format!("tcp_outgoing_address {exit}\n"))
                .await
                .unwrap();
            (IpAddr::V4(exit), squid)
        }))
        .await;
        world
            .store
            .state
            .ports
            .lock()
            .unwrap()
            .extend(squids.iter().map(|(_, s)| s.port()));
        let operator = world.operator().await;
        let pool = format!(
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: egress\n  namespace: {}\nspec:\n  replicas: 2\n  recycleAfter: 1\n  template:\n    spec:\n      provider: store\n      port: 3128\n",
            world.ns.name()
        );
        world
            .cp
            .kubectl_run(&["apply", "-f", "-"], Some(&pool))
            .await
            .unwrap();
        let crawl = Crawl {
            python,
            world,
            operator,
            squids,
            site: Site::start().await,
        };
        crawl.wait_ready("the pool Ready").await;
        crawl
    }

    fn pool(&self) -> String {
        format!("{}/egress", self.world.ns.name())
    }

    /// Until the pool is Ready and the API offers both of its proxies, as a user would check
    /// (`kubectl get pp`, `GET /v1/proxies`) before starting a crawl. The API learns of a new
    /// pool up to 2 s after it exists (`404 unknown-pool` meanwhile).
    async fn wait_ready(&self, what: &str) {
        let pools: Api<ProxyPool> = self.world.ns.api();
        self.until(what, || async {
            let pool = pools.get("egress").await.unwrap();
            let (_, body) = self
                .operator
                .call(reqwest::Method::GET, "/v1/proxies", None)
                .await;
            let offered = body["proxies"].as_array().map_or(0, |proxies| {
                proxies
                    .iter()
                    .filter(|p| p["pool"] == self.pool().as_str() && p["state"] == "available")
                    .filter(|p| p["draining"] != true)
                    .count()
            });
            pool.status.is_some_and(|s| s.ready_replicas == 2) && offered >= 2
        })
        .await;
    }

    async fn until<F: Future<Output = bool>>(&self, what: &str, check: impl Fn() -> F) {
        // Generous: a replacement waits for the pool's next look (up to 30 s), on a busy machine.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        while !check().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out: {what}\n{}",
                self.operator.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs an example: `python args...` in `dir`, with the API's address and the pool in the
    /// environment (and `env`), no proxy of the environment. Returns its output.
    async fn run(&self, dir: &Path, args: &[String], env: &[(&str, String)]) -> String {
        let mut cmd = tokio::process::Command::new(&self.python);
        cmd.args(args)
            .current_dir(dir)
            .env(
                "DISCOVERY_URL",
                format!("http://{}", self.operator.discovery),
            )
            .env("PROXY_POOL", self.pool())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .kill_on_drop(true);
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"] {
            cmd.env_remove(var).env_remove(var.to_lowercase());
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
            .await
            .expect("the example finished within 300 s")
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {}\n{text}", out.status);
        text
    }

    /// What every example run must leave behind.
    async fn check_after(&self, output: &str, pages: &[String]) {
        // Every page came from the site through the proxies, none from the test's own address.
        let (served, blocked) = {
            let seen = self.site.seen.lock().unwrap();
            (seen.served.clone(), seen.blocked.clone())
        };
        for url in pages {
            let path = url.trim_start_matches(&format!("http://{}", self.site.addr));
            assert!(
                served.iter().any(|(_, p)| p == path),
                "{path} was never served: {served:?}\n{output}"
            );
        }
        let exits: BTreeSet<IpAddr> = served.iter().map(|(e, _)| *e).collect();
        let ours: BTreeSet<IpAddr> = self.squids.iter().map(|(e, _)| *e).collect();
        assert!(exits.is_subset(&ours), "{exits:?} not all squids' {ours:?}");
        // The site blocked some exits, so the crawl needed more than the pool's first two.
        assert!(exits.len() > 2, "served from {exits:?}\n{output}");
        assert!(!blocked.is_empty(), "the site blocked no exit");

        // Each block was reported (one report per blocked lease at least).
        let reports = self.blocked_reports().await;
        assert!(
            reports >= blocked.len() as f64,
            "{reports} blocked reports for {} blocked exits\n{output}",
            blocked.len()
        );

        // The pool replaced every blocked proxy (recycleAfter: 1) and is whole again.
        let blocked_ports: BTreeSet<u16> = self
            .squids
            .iter()
            .filter(|(exit, _)| blocked.contains(exit))
            .map(|(_, squid)| squid.port())
            .collect();
        let proxies: Api<Proxy> = self.world.ns.api();
        self.until("every blocked proxy replaced", || async {
            let members = proxies
                .list(&ListParams::default().labels(&format!("{POOL_LABEL}=egress")))
                .await
                .unwrap()
                .items;
            members.iter().all(|p| {
                let port = p.status.as_ref().and_then(|s| s.port);
                !port.is_some_and(|port| blocked_ports.contains(&port))
            })
        })
        .await;
        self.wait_ready("the pool Ready again after the recycling")
            .await;

        // Every lease was given back.
        let states = self.operator.states().await;
        assert!(
            states.iter().all(|(_, state)| state != "leased"),
            "{states:?}"
        );

        // The leases' proxyUrl carries the proxy's credentials; the examples print them masked.
        assert!(
            output.contains(":***@127.0.0.1:"),
            "no masked proxy URL\n{output}"
        );
        let printed = printed_passwords(output);
        assert!(printed.is_empty(), "passwords printed: {printed:?}");
        // And the password of every proxy still there (its Secret) is nowhere in the output.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = self.world.ns.api();
        for secret in secrets.list(&ListParams::default()).await.unwrap() {
            if let Some(password) = secret.data.as_ref().and_then(|d| d.get("password")) {
                let password = String::from_utf8_lossy(&password.0);
                assert!(
                    !output.contains(password.as_ref()),
                    "a password was printed"
                );
            }
        }
    }

    /// `proxy_operator_lease_reports_total{outcome="blocked"}` of the pool, from /metrics.
    async fn blocked_reports(&self) -> f64 {
        let text = reqwest::get(format!("http://{}/metrics", self.operator.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
        scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "proxy_operator_lease_reports_total"
                    && s.labels.get("outcome") == Some("blocked")
                    && s.labels.get("pool") == Some(self.pool().as_str())
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                _ => 0.0,
            })
            .sum()
    }
}

/// The `requests` example with the token in a file (as a projected ServiceAccount token is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_example_crawls_through_leases_reports_blocks_and_releases() {
    let crawl = Crawl::start("ex-requests", 8).await;
    let token = crawl.world.dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let urls = crawl.site.urls("requests");
    let mut args: Vec<String> = [
        "crawl.py",
        "--pool",
        &crawl.pool(),
        "--max-retry-after",
        "1",
    ]
    .map(String::from)
    .to_vec();
    args.extend(urls.iter().cloned());
    let env = [("DISCOVERY_TOKEN_FILE", token.display().to_string())];
    let output = crawl
        .run(&examples_dir().join("requests"), &args, &env)
        .await;

    let summary = output
        .lines()
        .find_map(|l| l.strip_prefix("done: "))
        .unwrap_or_else(|| panic!("no summary line\n{output}"));
    let summary: Value = serde_json::from_str(summary).unwrap();
    assert_eq!(summary["pages"], PAGES, "{output}");
    assert!(summary["blocked"].as_u64() >= Some(1), "{output}");
    crawl.check_after(&output, &urls).await;
}

/// The Scrapy middleware, one lease per download slot, with the static token; then the same
/// spider with two sticky sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrapy_middleware_leases_per_slot_and_session_reports_blocks_and_releases() {
    let crawl = Crawl::start("ex-scrapy", 16).await;
    let dir = examples_dir().join("scrapy");
    let items = crawl.world.dir.path().join("items.jsonl");
    let env = [
        ("DISCOVERY_TOKEN", TOKEN.to_string()),
        ("PROXY_LEASES_MAX_RETRY_AFTER", "1".to_string()),
    ];
    let mut output = String::new();
    for (run, sessions) in [("slot", "0"), ("session", "2")] {
        let urls = crawl.site.urls(run);
        let args = [
            "-m".to_string(),
            "scrapy".into(),
            "crawl".into(),
            "pages".into(),
            "-a".into(),
            format!("urls={}", urls.join(",")),
            "-a".into(),
            format!("sessions={sessions}"),
            "-O".into(),
            items.display().to_string(),
        ];
        let out = crawl.run(&dir, &args, &env).await;
        let scraped: Vec<Value> = std::fs::read_to_string(&items)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(scraped.len(), PAGES, "{run}: {out}");
        for item in &scraped {
            assert_eq!(item["status"], 200, "{run}: {item}\n{out}");
            assert!(item["body"].as_str().unwrap().contains("page /"), "{item}");
        }
        for stat in ["'proxy_leases/reports/blocked'", "'proxy_leases/released'"] {
            assert!(out.contains(stat), "{run}: no {stat} in the stats\n{out}");
        }
        if sessions != "0" {
            assert!(out.contains("for session pages-1"), "{out}");
        }
        crawl.check_after(&out, &urls).await;
        output.push_str(&out);
    }
}
