//! Leases that outlive a restart, and the operator binary end to end: real control plane, real
//! squid, real test provider; a crawler's view (discovery API) and Prometheus' view (/metrics).

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use proxy_operator::leasing::leases::store::GrantError;
use proxy_operator::leasing::leases::{
    LeaseMetrics, LeaseOptions, LeasePersistence, LeaseRequest, LeaseStore, Outcome,
    ProvisionedProxy, ProxyKey,
};
use reqwest::StatusCode;
use serde_json::json;

use super::common::InstanceStore;
use super::common::operator_process::{OperatorProcess, OperatorSetup};
use super::control_plane;
use super::health::proxy_on_port;
use super::world::World;

/// A healthy proxy of the `store` provider, not pooled.
fn entry(ns: &str, name: &str) -> ProvisionedProxy {
    ProvisionedProxy {
        key: ProxyKey {
            namespace: ns.into(),
            name: name.into(),
        },
        provider: "store".into(),
        zone: None,
        labels: Default::default(),
        address: "127.0.0.1".into(),
        port: 3128,
        exit_ip: None,
        healthy: true,
        pool: None,
        draining: false,
        login: None,
        protocol: Default::default(),
    }
}

fn pool(ns: &str) -> Vec<ProvisionedProxy> {
    ["one", "two"].iter().map(|name| entry(ns, name)).collect()
}

fn store() -> LeaseStore {
    LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    )
}

#[tokio::test]
async fn leases_and_cooldowns_survive_a_restart_through_the_cluster() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-leases").await.unwrap();
    let persistence = LeasePersistence::new(ns.client(), ns.name(), "test-leases");

    let before = store();
    persistence.restore_into(&before).await.unwrap();
    before.set_provisioned(pool(ns.name()));
    let (held, _) = before.grant(&LeaseRequest::default()).unwrap();
    let (blocked, _) = before.grant(&LeaseRequest::default()).unwrap();
    before.report(&blocked.id, Outcome::Blocked).unwrap();
    persistence.flush(&before).await.unwrap();
    assert!(!before.is_dirty());
    // Restored from the journal alone first, then from a checkpoint (below).
    let journal_only = store();
    LeasePersistence::new(ns.client(), ns.name(), "test-leases")
        .restore_into(&journal_only)
        .await
        .unwrap();
    assert_eq!(
        journal_only.snapshot().unwrap().leases.len(),
        before.snapshot().unwrap().leases.len()
    );
    persistence.checkpoint(&before).await.unwrap();
    drop(before);

    let after = store();
    persistence.restore_into(&after).await.unwrap();
    after.set_provisioned(pool(ns.name()));
    let states: Vec<(String, &str)> = after
        .proxies()
        .unwrap()
        .into_iter()
        .map(|p| (p.name, p.state))
        .collect();
    let held_name = held.proxy.name.clone();
    for (name, state) in &states {
        let expected = if **name == *held_name {
            "leased"
        } else {
            "coolingDown"
        };
        assert_eq!(*state, expected, "{name}: {states:?}");
    }
    assert_eq!(
        after.report(&held.id, Outcome::Success).unwrap().id,
        held.id
    );
    assert!(matches!(
        after.grant(&LeaseRequest {
            proxy: Some(blocked.proxy.clone()),
            ..Default::default()
        }),
        Err(GrantError::CoolingDown { .. })
    ));

    // A damaged table is replaced, never a crash or a refusal to serve.
    let maps: Api<ConfigMap> = ns.api();
    maps.patch(
        "test-leases",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"manifest.json": "{not json"}})),
    )
    .await
    .unwrap();
    let fresh = store();
    persistence.restore_into(&fresh).await.unwrap();
    fresh.set_provisioned(pool(ns.name()));
    assert!(fresh.grant(&LeaseRequest::default()).is_ok());
}

/// Metric families named in docs/metrics.md's table.
fn documented_families() -> HashSet<String> {
    let doc = include_str!("../../../docs/metrics.md");
    doc.lines()
        .filter_map(|line| line.strip_prefix("| `proxy_operator_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("proxy_operator_{name}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_binary_serves_leases_and_metrics_and_keeps_leases_across_a_restart() {
    let world = World::start("px-e2e").await;
    let (cp, ns, squid) = (world.cp, &world.ns, &world.squid);
    let mut operator = world.operator().await;

    for name in ["held", "blocked"] {
        cp.kubectl_run(
            &["apply", "-f", "-"],
            Some(&proxy_on_port(ns.name(), name, squid.port())),
        )
        .await
        .unwrap();
    }
    let held = operator.lease(&format!("{}/held", ns.name())).await;
    let blocked = operator.lease(&format!("{}/blocked", ns.name())).await;
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            &format!("/v1/leases/{blocked}/report"),
            Some(json!({"outcome": "blocked"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Prometheus' view: the text format parses, every family is documented, and what this test
    // made happen is there.
    let text = reqwest::get(format!("http://{}/metrics", operator.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("the metrics endpoint speaks the Prometheus text format");
    let documented = documented_families();
    let scraped: HashSet<String> = scrape
        .samples
        .iter()
        .map(|s| {
            let name = s.metric.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| documented.contains(*base))
                })
                .unwrap_or(name)
                .to_string()
        })
        .filter(|name| name.starts_with("proxy_operator_"))
        .collect();
    for family in &scraped {
        assert!(
            documented.contains(family),
            "{family} is not in docs/metrics.md"
        );
    }
    for family in [
        "proxy_operator_build_info",
        "proxy_operator_leader",
        "proxy_operator_proxies",
        "proxy_operator_probe_duration_seconds",
        "proxy_operator_leases_granted_total",
        "proxy_operator_leases_ended_total",
        "proxy_operator_leases_active",
        "proxy_operator_proxies_cooling_down",
        "proxy_operator_lease_reports_total",
        "proxy_operator_reconcile_total",
        "proxy_operator_reconcile_duration_seconds",
        "proxy_operator_plugin_calls_total",
        "proxy_operator_plugin_call_duration_seconds",
    ] {
        assert!(
            scraped.contains(family),
            "{family} missing from /metrics:\n{text}"
        );
    }
    // This replica leads, and says which build it is.
    let gauge = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) => (v, s.labels.clone()),
                ref other => panic!("{other:?}"),
            })
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    assert_eq!(gauge("proxy_operator_leader").0, 1.0);
    let (info, labels) = gauge("proxy_operator_build_info");
    assert_eq!(info, 1.0);
    assert_eq!(labels.get("version"), Some(env!("CARGO_PKG_VERSION")));
    assert!(labels.get("commit").is_some_and(|c| !c.is_empty()));
    // Labelled by pool and provider since pools came; one lease held in all.
    let active: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "proxy_operator_leases_active")
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) => v,
            ref other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(active, 1.0);

    // A graceful restart (SIGTERM, as Kubernetes stops a Pod) keeps the lease and the cooldown.
    let exit = operator.proc.stop(Duration::from_secs(30)).await;
    assert!(
        exit.success(),
        "graceful stop failed: {exit:?}\n{}",
        operator.proc.log_tail(40)
    );
    let mut operator = OperatorProcess::start(
        cp,
        ns,
        world.dir.path(),
        &world.config,
        &world.target.addr().to_string(),
    );
    operator.wait_leading().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let states = operator.states().await;
        let expected = vec![
            ("blocked".to_string(), "coolingDown".to_string()),
            ("held".to_string(), "leased".to_string()),
        ];
        if states == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after restart: {states:?}\n{}",
            operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            &format!("/v1/leases/{held}/report"),
            Some(json!({"outcome": "success"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the lease from before the restart: {body}"
    );
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({"proxy": format!("{}/blocked", ns.name())})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "still cooling down: {body}");
}

/// The operator binary with its defaults (ServiceAccount tokens accepted, audience
/// `proxy-operator`): a crawler's real ServiceAccount token leases from the pool its Role names,
/// and from no other. A team's gateway credential (a labelled Secret, watched by the operator)
/// leases from the pool its Secret names, and from no other, until the Secret is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_binary_lets_rbac_decide_who_leases_from_a_pool() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-auth").await.unwrap();
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!("providers:\n{}", super::store_provider("store", &store)),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let mut operator = OperatorProcess::start_with(OperatorSetup {
        kubeconfig: cp.kubeconfig().to_path_buf(),
        namespace: ns.name(),
        own_namespace: None,
        dir: dir.path(),
        providers_config: &config,
        health_target: "127.0.0.1:9",
        operator_id: format!("e2e-{}", ns.name()),
        health_interval: "0s",
        plugins_dir: super::common::plugins_dir(),
        extra: vec!["--discovery-auth-cache-ttl".into(), "2s".into()],
        log: "operator.log",
        discovery_tls: None,
        metrics_insecure: true,
    });
    operator.wait_leading().await;
    let manifest = |name: &str, pool: &str| {
        format!(
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {}\n  labels: {{proxy-operator.dev/pool: {pool}}}\nspec:\n  provider: store\n  port: 3128\n",
            ns.name()
        )
    };
    let rbac = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: crawler, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: lease-pool-a, namespace: {ns}}}\n\
         rules: [{{apiGroups: [proxy-operator.dev], resources: [proxypools/lease], resourceNames: [pool-a], verbs: [create]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: lease-pool-a, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: lease-pool-a}}\n\
         subjects: [{{kind: ServiceAccount, name: crawler, namespace: {ns}}}]\n",
        ns = ns.name()
    );
    let objects = [manifest("px-a", "pool-a"), manifest("px-b", "pool-b"), rbac].join("---\n");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&objects))
        .await
        .unwrap();
    let token = ns
        .service_account_token("crawler", "proxy-operator", 600)
        .await
        .unwrap();
    let grant = |pool: &str| {
        reqwest::Client::new()
            .post(format!("http://{}/v1/leases", operator.discovery))
            .bearer_auth(&token)
            .body(json!({ "pool": format!("{}/{pool}", ns.name()) }).to_string())
            .send()
    };
    // Allowed once the proxy is provisioned (503 no-proxy-available until then).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let lease = loop {
        // No answer (the machine busy) is retried until the deadline like a 503.
        let response = match grant("pool-a").await {
            Ok(response) => response,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "no lease: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let status = response.status();
        let body: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap_or_default();
        if status == StatusCode::CREATED {
            break body;
        }
        // The discovery API learns of a new pool when the pool controller first sees it:
        // `unknown-pool` until then, `no-proxy-available` until it has a proxy.
        let new_pool = status == StatusCode::NOT_FOUND
            && body["type"] == "urn:proxy-operator:problem:unknown-pool";
        assert!(
            new_pool || status == StatusCode::SERVICE_UNAVAILABLE,
            "{status} {body}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease: {body}\n{}",
            operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lease["proxy"]["name"], "px-a");
    let denied = grant("pool-b").await.unwrap();
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);
    let body: serde_json::Value =
        serde_json::from_str(&denied.text().await.unwrap()).unwrap_or_default();
    assert_eq!(
        body["type"], "urn:proxy-operator:problem:forbidden",
        "{body}"
    );
    // The static token still works beside it, and a wrong token is 401.
    let (status, body) = operator
        .call(reqwest::Method::GET, "/v1/proxies", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let wrong = reqwest::Client::new()
        .post(format!("http://{}/v1/leases", operator.discovery))
        .bearer_auth(format!("{token}x"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let credential = "9b1e3c7a5d2f4e6a8c0b1d3f5a7c9e2b4d6f8a0c1e3b5d7f";
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: crawlers\n  namespace: {}\n  labels: {{proxy-operator.dev/gateway-credential: \"true\"}}\ntype: proxy-operator.dev/gateway-credential\nstringData: {{credential: {credential}, pools: pool-b}}\n",
        ns.name()
    );
    cp.kubectl_run(&["apply", "-f", "-"], Some(&secret))
        .await
        .unwrap();
    let with_credential = |pool: &str| {
        reqwest::Client::new()
            .post(format!("http://{}/v1/leases", operator.discovery))
            .bearer_auth(credential)
            .body(json!({ "pool": format!("{}/{pool}", ns.name()) }).to_string())
            .send()
    };
    let status_until = |want: StatusCode, pool: &'static str| {
        let with_credential = &with_credential;
        let operator = &operator;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let status = with_credential(pool).await.unwrap().status();
                if status == want {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{pool}: {status}, not {want}\n{}",
                    operator.proc.log_tail(40)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Once the watch has seen the Secret.
    status_until(StatusCode::CREATED, "pool-b").await;
    let denied = with_credential("pool-a").await.unwrap();
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);
    cp.kubectl_run(&["-n", ns.name(), "delete", "secret", "crawlers"], None)
        .await
        .unwrap();
    status_until(StatusCode::UNAUTHORIZED, "pool-b").await;
    let log = operator.proc.log_tail(400);
    assert!(!log.contains(&token), "a token reached the log");
    assert!(!log.contains(credential), "a credential reached the log");
    assert!(log.contains("gateway team credential accepted"), "{log}");
}

/// A Proxy of the test provider on `port` in ProxyPool `pool` (as the pool controller labels the
/// Proxies it makes).
fn pooled_proxy(ns: &str, name: &str, pool: &str, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    proxy-operator.dev/pool: {pool}\nspec:\n  provider: store\n  port: {port}\n"
    )
}

/// Asks for a lease until one is granted (the proxies become healthy), within 60 s.
async fn grant_when_ready(
    operator: &OperatorProcess,
    body: serde_json::Value,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, reply) = operator
            .call(reqwest::Method::POST, "/v1/leases", Some(body.clone()))
            .await;
        if status == StatusCode::CREATED {
            return reply;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no lease for {body}: {status} {reply}\n{}",
            operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The crawler-fleet API against the operator binary: pool membership read from the Proxies'
/// labels, a session sticking across grants, a block for one target leaving the proxy leasable
/// for another, a renewal, and the lease read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_binary_serves_pools_sessions_targets_and_renewals() {
    let world = World::start("px-fleet").await;
    let (cp, ns, squid) = (world.cp, &world.ns, &world.squid);
    let operator = world.operator().await;
    for (name, pool) in [("fast-1", "fast"), ("fast-2", "fast"), ("slow-1", "slow")] {
        cp.kubectl_run(
            &["apply", "-f", "-"],
            Some(&pooled_proxy(ns.name(), name, pool, squid.port())),
        )
        .await
        .unwrap();
    }
    let fast = format!("{}/fast", ns.name());
    let ask = json!({ "pool": fast, "session": "jar-1" });

    // Wait until the whole pool is healthy, so the choices below are between both proxies.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while operator
        .states()
        .await
        .iter()
        .filter(|(_, state)| state == "available")
        .count()
        < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}\n{}",
            operator.states().await,
            operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = grant_when_ready(&operator, ask.clone()).await;
    let proxy = first["proxy"]["name"].as_str().unwrap().to_string();
    assert!(proxy.starts_with("fast-"), "{first}");
    assert_eq!(first["pool"], fast.as_str());
    let id = first["id"].as_str().unwrap().to_string();
    let (status, body) = operator
        .call(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // The session comes back to its proxy, though the other one has been free longer.
    let second = grant_when_ready(&operator, ask.clone()).await;
    assert_eq!(second["proxy"]["name"], proxy.as_str(), "{second}");
    let id = second["id"].as_str().unwrap().to_string();

    // GET and renew the lease.
    let (status, shown) = operator
        .call(reqwest::Method::GET, &format!("/v1/leases/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["session"], "jar-1");
    assert_eq!(shown["pool"], fast.as_str());
    assert_eq!(shown["proxyUrl"], second["proxyUrl"]);
    let (status, renewed) = operator
        .call(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/renew"),
            Some(json!({ "ttlSeconds": 900 })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["ttlSeconds"], 900);
    assert!(renewed["expiresAt"].as_str() > shown["expiresAt"].as_str());

    // The site shop.example blocks it: still leasable for another site, not for that one.
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/report"),
            Some(json!({ "outcome": "blocked", "target": "shop.example" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let named = format!("{}/{proxy}", ns.name());
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({ "proxy": named, "target": "shop.example" })),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        body["type"],
        "urn:proxy-operator:problem:proxy-cooling-down"
    );
    let (status, other) = operator
        .call(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({ "proxy": named, "target": "news.example" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");

    // Unknown pool and unmatchable requests say so.
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({ "pool": format!("{}/nope", ns.name()) })),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = operator
        .call(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({ "pool": fast, "selector": { "tier": "gold" } })),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Prometheus sees the pool.
    let text = reqwest::get(format!("http://{}/metrics", operator.metrics))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Labelled by the team's namespace too, so a platform team can bill each team.
    let line = format!(
        "proxy_operator_leases_granted_total{{namespace=\"{}\",pool=\"{fast}\",provider=\"store\"}} 3",
        ns.name()
    );
    assert!(text.contains(&line), "no `{line}` in\n{text}");
}

/// An etcd metric's value from its `/metrics` (a plain, unlabelled series).
async fn etcd_metric(cp: &harness::ControlPlane, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", cp.etcd_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("etcd exports no {name}"))
}

/// etcd's alarms (NOSPACE is the one a flood raises), from its JSON gateway.
async fn etcd_alarms(cp: &harness::ControlPlane) -> serde_json::Value {
    let text = reqwest::Client::new()
        .post(format!("{}/v3/maintenance/alarm", cp.etcd_url()))
        .body(r#"{"action": "GET"}"#)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    answer.get("alarms").cloned().unwrap_or(json!([]))
}

/// A grant as the discovery API makes it in sync mode: answered once a write holding it is in
/// the cluster.
async fn grant_stored(store: &LeaseStore) -> proxy_operator::leasing::leases::store::Lease {
    let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
    store
        .wait_stored(store.version(), Duration::from_secs(30))
        .await
        .unwrap();
    lease
}

/// Issue #30's cliff at a smaller size. Before the journal, every grant rewrote the whole table
/// (~200 bytes a lease) into etcd: holding N leases had written ~100·N² bytes, so a 64 MiB
/// etcd raised NOSPACE — refusing every write of the whole cluster — at about 800 held
/// leases. Now 10 000 leases are granted by 64 crawlers, then 12 800 more grant/release
/// cycles: etcd raises no alarm and stays far under its quota, no object of the table nears the
/// object limit, each grant costs etcd under 2 KiB, and a failover keeps every lease, none
/// doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_never_fill_a_small_etcd_and_all_survive_a_failover() {
    use std::sync::Arc;

    use proxy_operator::api::labels::TABLE_LABEL;
    use proxy_operator::leasing::leases::persist::{Durability, maintain};

    const QUOTA: u64 = 64 << 20;
    const LEASES: usize = 10_000;
    const CRAWLERS: usize = 64;
    const CYCLES_EACH: usize = 200;
    let cp = harness::ControlPlane::start_with(harness::ControlPlaneOptions {
        etcd_args: vec![format!("--quota-backend-bytes={QUOTA}")],
        ..Default::default()
    })
    .await
    .unwrap();
    let ns = cp.namespace("px-etcd-quota").await.unwrap();
    let proxies: Vec<ProvisionedProxy> = (0..LEASES)
        .map(|i| entry(ns.name(), &format!("proxy-{i:05}")))
        .collect();
    let persistence = LeasePersistence::new(ns.client(), ns.name(), "quota-leases");
    let store = Arc::new(store());
    persistence.restore_into(&store).await.unwrap();
    store.set_provisioned(proxies.clone());
    let writer = tokio::spawn(maintain(
        store.clone(),
        persistence.clone(),
        Durability::Sync,
        Duration::from_secs(5),
    ));

    let puts = "etcd_debugging_mvcc_total_put_size_in_bytes";
    let before = etcd_metric(&cp, puts).await;
    let crawlers: Vec<_> = (0..CRAWLERS)
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut held = Vec::new();
                for _ in (c..LEASES).step_by(CRAWLERS) {
                    held.push(grant_stored(&store).await);
                }
                held
            })
        })
        .collect();
    let mut held = Vec::new();
    for crawler in crawlers {
        held.push(crawler.await.unwrap());
    }
    assert_eq!(held.iter().map(Vec::len).sum::<usize>(), LEASES);
    let per_grant = (etcd_metric(&cp, puts).await - before) / LEASES as f64;
    eprintln!(
        "10 000 leases held: {per_grant:.0} bytes put into etcd per grant, {} bytes of data written by the table",
        persistence.written_bytes()
    );
    assert!(per_grant < 2048.0, "{per_grant} bytes per grant");

    // Crawlers at work: each releases its oldest lease and is granted another.
    let cycling: Vec<_> = held
        .into_iter()
        .map(|mut mine| {
            let store = store.clone();
            tokio::spawn(async move {
                for _ in 0..CYCLES_EACH {
                    let oldest = mine.remove(0);
                    store.release(&oldest.id).unwrap();
                    mine.push(grant_stored(&store).await);
                }
                mine
            })
        })
        .collect();
    let mut held: Vec<proxy_operator::leasing::leases::store::Lease> = Vec::new();
    for crawler in cycling {
        held.extend(crawler.await.unwrap());
    }
    store
        .wait_stored(store.version(), Duration::from_secs(30))
        .await
        .unwrap();
    let cycles = (CRAWLERS * CYCLES_EACH) as f64;
    let total = etcd_metric(&cp, puts).await - before;
    eprintln!(
        "after {cycles} more cycles: {:.0} bytes put into etcd per grant overall, database {:.1} MiB",
        total / (LEASES as f64 + cycles),
        etcd_metric(&cp, "etcd_mvcc_db_total_size_in_bytes").await / 1048576.0
    );
    assert_eq!(etcd_alarms(&cp).await, json!([]), "etcd raised an alarm");
    let db = etcd_metric(&cp, "etcd_mvcc_db_total_size_in_bytes").await;
    assert!(db < QUOTA as f64 / 2.0, "etcd's database is {db} bytes");
    let maps: Api<ConfigMap> = ns.api();
    let table = maps
        .list(&kube::api::ListParams::default().labels(&format!("{TABLE_LABEL}=quota-leases")))
        .await
        .unwrap();
    let largest = table
        .items
        .iter()
        .map(|m| {
            m.data
                .iter()
                .flatten()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
        })
        .max()
        .unwrap();
    assert!(
        largest <= 600 * 1024,
        "an object of the table holds {largest} bytes"
    );

    // A failover: a new leader restores from the cluster alone.
    writer.abort();
    let successor = LeasePersistence::new(ns.client(), ns.name(), "quota-leases");
    let after = self::store();
    successor.restore_into(&after).await.unwrap();
    after.set_provisioned(proxies);
    let want: HashSet<(String, String)> = held
        .iter()
        .map(|l| (l.id.clone(), l.proxy.name.to_string()))
        .collect();
    assert_eq!(want.len(), LEASES);
    let restored: HashSet<(String, String)> = after
        .snapshot()
        .unwrap()
        .leases
        .into_iter()
        .map(|l| (l.id, l.proxy.name.to_string()))
        .collect();
    assert_eq!(
        restored.len(),
        LEASES,
        "leases lost or added by the failover"
    );
    assert_eq!(restored, want);
    // None doubled: every proxy is still held, so nothing can be granted.
    assert!(matches!(
        after.grant(&LeaseRequest::default()),
        Err(GrantError::NoProxy { .. })
    ));
}
