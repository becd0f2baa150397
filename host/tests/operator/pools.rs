//! ProxyPools with the real operator binary, the real API server, real squid and the real test
//! provider: what a platform engineer does with kubectl, and what a crawler sees.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use proxy_operator::api::labels::{DRAINING_ANNOTATION, POOL_LABEL};
use proxy_operator::api::{Proxy, ProxyPool};
use reqwest::StatusCode;

use super::common::operator_process::OperatorProcess;
use super::world::World;

struct Setup {
    world: World,
    operator: OperatorProcess,
}

async fn setup(prefix: &str) -> Setup {
    let world = World::start(prefix).await;
    let operator = world.operator().await;
    Setup { world, operator }
}

fn pool_yaml(ns: &str, name: &str, replicas: i32, port: u16, extra: &str) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n{extra}  template:\n    metadata:\n      labels: {{team: crawl}}\n    spec:\n      provider: store\n      port: {port}\n"
    )
}

impl Setup {
    async fn apply(&self, yaml: &str) {
        self.world
            .cp
            .kubectl_run(&["apply", "-f", "-"], Some(yaml))
            .await
            .unwrap();
    }

    async fn pool(&self, name: &str) -> ProxyPool {
        self.world.ns.api::<ProxyPool>().get(name).await.unwrap()
    }

    async fn members(&self, pool: &str) -> Vec<Proxy> {
        let api: Api<Proxy> = self.world.ns.api();
        api.list(&kube::api::ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
            .await
            .unwrap()
            .items
    }

    /// Waits until the pool's status satisfies `done`, calling `each` on every status seen.
    async fn wait_pool(
        &self,
        name: &str,
        what: &str,
        mut each: impl FnMut(&ProxyPool),
        done: impl Fn(&ProxyPool) -> bool,
    ) -> ProxyPool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let pool = self.pool(name).await;
            each(&pool);
            if done(&pool) {
                return pool;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {:#?}\n{}",
                pool.status,
                self.operator.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Setup {
    /// `proxy_operator_pool_replicas` of `pool` in this world's namespace on the operator's
    /// /metrics, as (desired, ready, leased); `None` when the pool has no series.
    async fn pool_series(&self, pool: &str) -> Option<(f64, f64, f64)> {
        let text = reqwest::get(format!("http://{}/metrics", self.operator.metrics))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("the Prometheus text format");
        let value = |state: &str| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == "proxy_operator_pool_replicas"
                        && s.labels.get("namespace") == Some(self.world.ns.name())
                        && s.labels.get("pool") == Some(pool)
                        && s.labels.get("state") == Some(state)
                })
                .map(|s| match s.value {
                    prometheus_parse::Value::Gauge(v) => v,
                    ref other => panic!("{other:?}"),
                })
        };
        Some((value("desired")?, value("ready")?, value("leased")?))
    }

    /// Waits until [`Self::pool_series`] of `pool` is `want`.
    async fn wait_pool_series(&self, pool: &str, want: Option<(f64, f64, f64)>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self.pool_series(pool).await;
            if seen == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "proxy_operator_pool_replicas of {pool}: {seen:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn counts(pool: &ProxyPool) -> (i32, i32, i32, i32) {
    let status = pool.status.clone().unwrap_or_default();
    (
        status.replicas,
        status.ready_replicas,
        status.leased_replicas,
        status.draining_replicas,
    )
}

/// A pool made, scaled with `kubectl scale`, rolled by a template change within its budget
/// (never fewer Ready than asked), a leased Proxy drained but kept until its lease ends, and
/// deleted with its Proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_scales_rolls_within_its_budget_and_drains_a_leased_proxy_only_after_its_lease() {
    let mut s = setup("pp-roll").await;
    let ns = s.world.ns.name().to_string();
    let port = s.world.squid.port();
    s.apply(&pool_yaml(&ns, "web", 2, port, "")).await;
    let pool = s
        .wait_pool("web", "2 Ready", |_| {}, |p| counts(p).1 == 2)
        .await;
    let status = pool.status.clone().unwrap();
    assert_eq!(
        status.selector.as_deref(),
        Some("proxy-operator.dev/pool=web")
    );
    let members = s.members("web").await;
    assert_eq!(members.len(), 2);
    for proxy in &members {
        let owner = &proxy.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("ProxyPool", "web")
        );
        assert_eq!(proxy.metadata.labels.as_ref().unwrap()["team"], "crawl");
    }
    let table = s
        .world
        .cp
        .kubectl_run(&["get", "pp", "-n", &ns], None)
        .await
        .unwrap();
    assert!(
        table.contains("DESIRED") && table.contains("READY") && table.contains("LEASED"),
        "{table}"
    );
    let both = s
        .world
        .cp
        .kubectl_run(&["get", "crawl", "-n", &ns, "-o", "name"], None)
        .await
        .unwrap();
    assert!(
        both.contains("proxypool.proxy-operator.dev/web")
            && both.contains("proxy.proxy-operator.dev/web-"),
        "the `crawl` category lists pools and Proxies: {both}"
    );

    // The scale subresource, as an HPA or `kubectl scale` uses it.
    s.world
        .cp
        .kubectl_run(&["scale", "-n", &ns, "pp/web", "--replicas=3"], None)
        .await
        .unwrap();
    s.wait_pool(
        "web",
        "3 Ready after kubectl scale",
        |_| {},
        |p| counts(p).1 == 3,
    )
    .await;

    // A crawler holds one of them.
    let held = s.members("web").await[0].name_any();
    let lease = s.operator.lease(&format!("{ns}/{held}")).await;

    // A template change rolls the pool: default budget (maxSurge 25% → 1, maxUnavailable 0).
    let rolled = pool_yaml(&ns, "web", 3, port, "").replace("team: crawl", "team: crawl2");
    s.world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(&rolled))
        .await
        .unwrap();
    let generation = s.pool("web").await.metadata.generation;
    let mut fewest_ready = i32::MAX;
    let pool = s
        .wait_pool(
            "web",
            "every member replaced by one from the new template",
            |p| fewest_ready = fewest_ready.min(counts(p).1),
            |p| {
                let status = p.status.clone().unwrap_or_default();
                status.observed_generation == generation
                    && status.updated_replicas == 3
                    && status.ready_replicas == 3
                    && status.replicas == 3
            },
        )
        .await;
    assert!(
        fewest_ready >= 3,
        "Ready dropped to {fewest_ready} during the roll"
    );
    // /metrics says the same per pool: 3 desired, 3 Ready, 1 leased.
    s.wait_pool_series("web", Some((3.0, 3.0, 1.0))).await;
    assert_eq!(
        counts(&pool).2,
        1,
        "the held proxy still counts as leased: {:?}\n{}",
        s.operator.states().await,
        s.operator.proc.log_tail(30)
    );
    // The unleased old ones are deleted; the held one stays, draining, while its lease lasts.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let members = s.members("web").await;
        let draining: Vec<String> = members
            .iter()
            .filter(|p| p.annotations().get(DRAINING_ANNOTATION).is_some())
            .map(|p| p.name_any())
            .collect();
        if draining == [held.clone()] && members.len() == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected only {held} left draining, beside 3 new ones: {draining:?} of {}\n{}",
            members.len(),
            s.operator.proc.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.wait_pool("web", "drainingReplicas 1", |_| {}, |p| counts(p).3 == 1)
        .await;

    // Its lease ends: the pool removes it.
    let (status, body) = s
        .operator
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/leases/{lease}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    s.wait_pool(
        "web",
        "the drained proxy removed",
        |_| {},
        |p| counts(p).3 == 0,
    )
    .await;
    let api: Api<Proxy> = s.world.ns.api();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        // A failed read (the API server busy) is retried until the deadline.
        let seen = api.get_opt(&held).await;
        if matches!(seen, Ok(None)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{held} still exists: {:?}",
            seen.map(|p| p.map(|p| p.status))
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Deleting the pool deletes its Proxies (through their finalizers).
    s.world
        .cp
        .kubectl_run(&["delete", "pp", "web", "-n", &ns, "--wait=true"], None)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !s.members("web").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Proxies left after the pool was deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And its series are gone from /metrics.
    s.wait_pool_series("web", None).await;
}

/// Bad input: refused by the API server where a schema can say it, a condition naming the field
/// otherwise; nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_pool_is_refused_or_says_why_and_makes_nothing() {
    let s = setup("pp-bad").await;
    let ns = s.world.ns.name().to_string();
    for (extra, replicas, expected) in [
        ("", -1, "spec.replicas"),
        ("", 10001, "spec.replicas"),
        ("  expireAfter: 10s\n", 1, "expireAfter must be at least 1m"),
        ("  expireAfter: soon\n", 1, "spec.expireAfter"),
        ("  recycleAfter: 0\n", 1, "spec.recycleAfter"),
        (
            "  gateway:\n    blockStatuses: [700]\n",
            1,
            "spec.gateway.blockStatuses[0]",
        ),
        (
            "  gateway:\n    blockBodyPatterns: ['']\n",
            1,
            "spec.gateway.blockBodyPatterns[0]",
        ),
        (
            "  gateway:\n    maxConnectionsPerProxy: -1\n",
            1,
            "spec.gateway.maxConnectionsPerProxy",
        ),
    ] {
        let error = s
            .world
            .cp
            .kubectl_run(
                &["apply", "-f", "-"],
                Some(&pool_yaml(&ns, "bad", replicas, 3128, extra)),
            )
            .await
            .expect_err("the API server refuses it");
        assert!(
            format!("{error:#}").contains(expected),
            "{extra} {replicas}: {error:#}"
        );
    }

    // An unknown provider: the API server cannot know the providers config; the pool says it.
    let unknown =
        pool_yaml(&ns, "lost", 2, 3128, "").replace("provider: store", "provider: nowhere");
    s.apply(&unknown).await;
    let pool = s
        .wait_pool(
            "lost",
            "the pool says its provider is unknown",
            |_| {},
            |p| {
                p.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "UnknownProvider")
                })
            },
        )
        .await;
    let ready = pool
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        ready.message.contains("spec.template.spec.provider") && ready.message.contains("store"),
        "names the field and the providers there are: {}",
        ready.message
    );
    assert!(s.members("lost").await.is_empty(), "nothing half-made");

    // A bad budget: a condition naming the field.
    let budget = pool_yaml(&ns, "budget", 2, 3128, "  maxSurge: lots\n");
    s.apply(&budget).await;
    s.wait_pool(
        "budget",
        "the pool says maxSurge is wrong",
        |_| {},
        |p| {
            p.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "Ready"
                        && c.reason == "InvalidSpec"
                        && c.message.contains("spec.maxSurge")
                })
            })
        },
    )
    .await;
    assert!(s.members("budget").await.is_empty());
}

const GATEWAY_TOKEN: &str = "pools-gateway-token";

/// `POST /v1/gateway/routes` as a gateway replica asks it for a client of `pool`.
async fn route(operator: &OperatorProcess, pool: &str) -> (StatusCode, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/gateway/routes", operator.discovery))
        .bearer_auth(super::common::operator_process::TOKEN)
        .header(
            proxy_operator::leasing::leases::api::GATEWAY_TOKEN_HEADER,
            GATEWAY_TOKEN,
        )
        .body(serde_json::json!({"replica": "gw-0", "pool": pool}).to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body = response.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or_default())
}

/// Routes `pool` until `done` holds for an answer (the pool's settings reach the leader from
/// the pool controller's cache within seconds).
async fn route_until(
    s: &Setup,
    pool: &str,
    what: &str,
    done: impl Fn(StatusCode, &serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = route(&s.operator, pool).await;
        if done(status, &body) {
            return body;
        }
        if tokio::time::Instant::now() >= deadline {
            let name = pool.rsplit('/').next().unwrap();
            panic!(
                "{what}: last {status} {body}\nthe pool's spec: {:?}\n{}",
                s.pool(name).await.spec.gateway,
                s.operator.proc.log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pool's `spec.gateway` reaches the leader: its own block rules go to the gateway with each
/// route, and `maxConnectionsPerProxy: 0` keeps it for leases; a change applies without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_gateway_settings_decide_its_routes() {
    let world = World::start("pp-gw").await;
    let operator = world
        .operator_with(&["--gateway-token", GATEWAY_TOKEN])
        .await;
    let s = Setup { world, operator };
    let ns = s.world.ns.name().to_string();
    let shared = "  gateway:\n    maxConnectionsPerProxy: 4\n    blockStatuses: [451]\n    blockBodyPatterns: [captcha]\n";
    s.apply(&pool_yaml(&ns, "crawl", 1, s.world.squid.port(), shared))
        .await;
    let pool = format!("{ns}/crawl");
    let body = route_until(
        &s,
        &pool,
        "a route with the pool's rules",
        |status, body| {
            status == StatusCode::OK && body["blockStatuses"] == serde_json::json!([451])
        },
    )
    .await;
    assert_eq!(
        body["blockBodyPatterns"],
        serde_json::json!(["captcha"]),
        "{body}"
    );
    assert_eq!(body["proxy"]["namespace"], ns.as_str());

    let leases_only = "  gateway:\n    maxConnectionsPerProxy: 0\n";
    s.apply(&pool_yaml(
        &ns,
        "crawl",
        1,
        s.world.squid.port(),
        leases_only,
    ))
    .await;
    let body = route_until(
        &s,
        &pool,
        "no route to a pool kept for leases",
        |status, _| status == StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    assert_eq!(
        body["type"],
        "urn:proxy-operator:problem:no-proxy-available"
    );
}
