//! The status page and the usage figures, with the real operator binary against the real API
//! server, the test provider's store and a real squid: a pool of proxies in several states
//! (ready, leased, cooling after a block, failing its probes, waiting for an unknown provider),
//! the figures a fleet owner bills from as Prometheus scrapes them after those real actions,
//! and the page in Debian's real headless Chromium (in a network namespace with no uplink), with
//! its screenshot kept as an artifact.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::netns::Netns;
use harness::process::free_port;
use reqwest::StatusCode;
use serde_json::json;
use tokio::task::JoinHandle;

use super::common::operator_process::OperatorProcess;
use super::common::proxy_on_port;
use super::world::World;

/// The operator's metrics port as Chromium reaches it: a listener inside the browser's
/// namespace relaying each connection to the operator on the host's loopback.
struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    async fn start(netns: &Netns, to: SocketAddr) -> Relay {
        let listener = netns.listen(([127, 0, 0, 1], 0).into()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        Relay { addr, task }
    }
}

/// Runs Chromium on `url` with `args` in `netns` until it exits; its stdout.
async fn chromium(netns: &Netns, args: &[&str], url: &str) -> String {
    harness::chromium::run(netns, args, url, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn pool_yaml(ns: &str, name: &str, replicas: i32, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: store\n      port: {port}\n"
    )
}

/// The operator's `/metrics`, parsed.
async fn scrape(operator: &OperatorProcess) -> prometheus_parse::Scrape {
    let text = reqwest::get(format!("http://{}/metrics", operator.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// The value of the sample `name` whose labels include `labels`, summed over the others.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref h) => {
                h.iter().map(|b| b.count).fold(0.0, f64::max)
            }
            _ => 0.0,
        })
        .sum()
}

/// Polls the operator's metrics until `done` holds.
async fn metrics_until(
    operator: &OperatorProcess,
    what: &str,
    done: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let scrape = scrape(operator).await;
        if done(&scrape) {
            return scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {:?}\n{}",
            scrape
                .samples
                .iter()
                .filter(|s| s.metric.contains("created")
                    || s.metric.contains("instance_seconds")
                    || s.metric.contains("blocks")
                    || s.metric.contains("first_block"))
                .map(|s| format!("{} {:?} {:?}", s.metric, s.labels, s.value))
                .collect::<Vec<_>>(),
            operator.proc.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET path` on the metrics port until its body has every one of `wanted`.
async fn page_until(operator: &OperatorProcess, path: &str, wanted: &[String]) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let response = reqwest::get(format!("http://{}{path}", operator.metrics))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let html = response.text().await.unwrap();
        let missing: Vec<&String> = wanted.iter().filter(|w| !html.contains(*w)).collect();
        if missing.is_empty() {
            return html;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} lacks {missing:?}:\n{html}\n{}",
            operator.proc.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every place the page could load something from: none may name another origin.
fn external_resources(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut found = Vec::new();
    for marker in [
        "src=", "href=", "@import", "url(", "http://", "https://", "//",
    ] {
        let mut rest = lower.as_str();
        while let Some(at) = rest.find(marker) {
            let context: String = rest[at..].chars().take(60).collect();
            found.push(context);
            rest = &rest[at + marker.len()..];
        }
    }
    found
}

/// A screenshot of `url` into `target/artifacts/NAME`; its size in bytes.
async fn screenshot(netns: &Netns, url: &str, name: &str, args: &[&str]) -> usize {
    let png = artifact(name);
    let _ = std::fs::remove_file(&png);
    let shot = format!("--screenshot={}", png.display());
    let mut all = vec![shot.as_str(), "--window-size=1100,1000"];
    all.extend_from_slice(args);
    chromium(netns, &all, url).await;
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{name} is not a PNG"
    );
    bytes.len()
}

fn artifact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_fleet_in_a_real_browser_and_usage_counts_real_actions() {
    let world = World::start("status").await;
    let (cp, ns) = (world.cp, world.ns.name());
    // The platform states what an instance-hour of `store` costs: its spend is counted.
    let priced = format!(
        "providers:\n{}  limits: {{pricePerHour: 0.36}}\n",
        world.store.provider_entry("store")
    );
    std::fs::write(&world.config, priced).unwrap();
    let mut operator = world.operator().await;
    let apply = |yaml: String| async move {
        cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
            .await
            .unwrap();
    };
    // A pool of three on the real squid, one Proxy whose squid never answers (its probes fail),
    // and one naming a provider the config does not have.
    apply(pool_yaml(ns, "crawlers", 3, world.squid.port())).await;
    let closed = free_port().unwrap();
    apply(proxy_on_port(ns, "broken", closed)).await;
    apply(
        proxy_on_port(ns, "lost", world.squid.port())
            .replace("provider: store", "provider: nowhere"),
    )
    .await;

    // Three leases from the pool: one held, one blocked for every site (its proxy cools down),
    // one blocked by one site (its proxy cools down for that site only).
    let pool = format!("{ns}/crawlers");
    let mut leases = Vec::new();
    while leases.len() < 3 {
        let (status, body) = operator
            .call(
                reqwest::Method::POST,
                "/v1/leases",
                Some(json!({"pool": pool})),
            )
            .await;
        if status == StatusCode::CREATED {
            leases.push(body["id"].as_str().unwrap().to_string());
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for (lease, report) in [
        (&leases[1], json!({"outcome": "blocked"})),
        (
            &leases[2],
            json!({"outcome": "blocked", "target": "shop.example"}),
        ),
    ] {
        let (status, body) = operator
            .call(
                reqwest::Method::POST,
                &format!("/v1/leases/{lease}/report"),
                Some(report),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    // The figures a fleet owner bills from, as Prometheus scrapes them.
    let store = [("provider", "store")];
    let scrape = metrics_until(&operator, "usage after the actions", |s| {
        value(s, "proxy_operator_instance_seconds_total", &store) > 0.0
            && value(s, "proxy_operator_proxies_created_total", &store) == 4.0
            && value(
                s,
                "proxy_operator_proxy_lifetime_to_first_block_seconds_count",
                &store,
            ) == 2.0
    })
    .await;
    assert_eq!(
        value(
            &scrape,
            "proxy_operator_target_blocks_total",
            &[("target", "shop.example")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &scrape,
            "proxy_operator_target_blocks_total",
            &[("target", "none")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &scrape,
            "proxy_operator_leases_granted_total",
            &[("pool", &pool)]
        ),
        3.0
    );
    assert_eq!(
        value(&scrape, "proxy_operator_proxies_deleted_total", &store),
        0.0
    );
    // Each usage family splits by team (the namespace) and the team's share is the fleet's
    // whole here: one team. Every series carries the label, so `sum by (namespace)` adds up.
    for family in [
        "proxy_operator_instance_seconds_total",
        "proxy_operator_instance_spend_total",
        "proxy_operator_leases_granted_total",
        "proxy_operator_lease_reports_total",
        "proxy_operator_leases_active",
    ] {
        let team = value(&scrape, family, &[("namespace", ns)]);
        assert_eq!(team, value(&scrape, family, &[]), "{family} by namespace");
        if family != "proxy_operator_leases_active" {
            assert!(team > 0.0, "{family} of {ns}: {team}");
        }
    }
    // Spend is instance-hours at the stated price: 0.36 an hour is 0.0001 a second.
    let seconds = value(&scrape, "proxy_operator_instance_seconds_total", &store);
    let spend = value(
        &scrape,
        "proxy_operator_instance_spend_total",
        &[("namespace", ns)],
    );
    assert!(
        (spend - seconds * 0.0001).abs() < 1e-9,
        "spend {spend} for {seconds} instance-seconds"
    );
    // Only instances that exist are billed: "lost" has none.
    assert_eq!(
        value(
            &scrape,
            "proxy_operator_instance_seconds_total",
            &[("provider", "nowhere")]
        ),
        0.0
    );
    let first_block = value(
        &scrape,
        "proxy_operator_proxy_lifetime_to_first_block_seconds_sum",
        &store,
    );
    assert!(first_block > 0.0 && first_block < 240.0, "{first_block}");

    // The page as served (all a browser without scripting shows): the states and counts it
    // must show once the pool's status caught up.
    let wanted: Vec<String> = [
        format!("<td>{pool}</td><td>3</td><td>3</td><td>1</td><td>1</td><td>0</td>"),
        "<b id=\"replica\">the leader</b>".into(),
        "<b id=\"proxies-total\">5</b>".into(),
        "<b data-phase=\"Ready\">3</b>".into(),
        "<b data-phase=\"Unhealthy\">1</b>".into(),
        "<b data-phase=\"Pending\">1</b>".into(),
        "<span class=\"badge busy\">leased</span>".into(),
        "<span class=\"badge warn\">coolingDown</span>".into(),
        "<span class=\"badge bad\">Unhealthy</span>".into(),
        ">UnknownProvider</span>".into(),
        "<td>static token</td>".into(),
        "<td>shop.example</td><td><span class=\"bar\" style=\"width:100%\"></span>1</td>".into(),
        "<td>none</td><td><span class=\"bar\" style=\"width:100%\"></span>1</td>".into(),
        "<td>store</td><td>none</td>".into(),
        "<td>store</td><td>4</td><td>0</td>".into(),
        format!("<td>{pool}</td><td>3</td>"),
        "<td>store</td><td>2</td>".into(),
        // The team's row: its namespace, then instance-hours (some), then its 3 leases.
        format!("<td>{ns}</td><td>"),
    ]
    .into_iter()
    .collect();
    let html = page_until(&operator, "/status", &wanted).await;
    assert_eq!(external_resources(&html), Vec::<String>::new());
    assert_eq!(html.matches("<script").count(), 1);
    let fragment = page_until(&operator, "/status/fragment", &wanted).await;
    assert!(!fragment.contains("<script"));

    // Chromium, with no way out of its namespace but the relay to the operator.
    let netns = Netns::create("status-page").expect("the browser's namespace, no uplink");
    let relay = Relay::start(&netns, operator.metrics).await;
    let url = format!("http://{}/status", relay.addr);
    // Virtual time runs the page's timers: it refreshes itself (a fetch of the fragment) twice.
    let dom = chromium(&netns, &["--virtual-time-budget=12000", "--dump-dom"], &url).await;
    for w in &wanted {
        assert!(
            dom.contains(w.as_str()),
            "{w} not in the rendered page:\n{dom}"
        );
    }
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no refresh count:\n{dom}"));
    assert!(refreshes >= 1, "the page never refreshed itself:\n{dom}");
    assert!(dom.contains("live: refreshed"), "{dom}");
    // The screenshot, kept as the test run's artifact (docs/images/status-page.png is one).
    // (Without scripting the page is the HTML served, checked above: Chromium's headless mode
    // prints no DOM and takes no screenshot with `--blink-settings=scriptEnabled=false`.)
    let png = screenshot(&netns, &url, "status-page.png", &[]).await;
    assert!(png > 20_000, "{png} bytes: a blank page?");
    drop(relay);

    // Deleting the failing Proxy deletes its instance, and the count follows.
    cp.kubectl_run(
        &["delete", "proxy", "broken", "-n", ns, "--wait=true"],
        None,
    )
    .await
    .unwrap();
    metrics_until(&operator, "the deletion counted", |s| {
        value(s, "proxy_operator_proxies_deleted_total", &store) == 1.0
    })
    .await;
    page_until(
        &operator,
        "/status/fragment",
        &["<td>store</td><td>4</td><td>1</td>".to_string()],
    )
    .await;
    let _ = operator.proc.stop(Duration::from_secs(30)).await;
}
