//! Leases that outlive a restart, and the operator binary end to end: real control plane, real
//! squid, real test provider; a crawler's view (discovery API) and Prometheus' view (/metrics).

use std::collections::HashSet;
use std::time::Duration;

use harness::{FileServer, Squid};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use proxy_operator::leases::store::GrantError;
use proxy_operator::leases::{
    LeaseMetrics, LeaseOptions, LeasePersistence, LeaseRequest, LeaseStore, Outcome, PoolEntry,
    ProxyKey,
};
use reqwest::StatusCode;
use serde_json::json;

use super::common::InstanceStore;
use super::common::operator_process::OperatorProcess;
use super::control_plane;
use super::health::proxy_on_port;

fn pool(ns: &str) -> Vec<PoolEntry> {
    ["one", "two"]
        .iter()
        .map(|name| PoolEntry {
            key: ProxyKey {
                namespace: ns.into(),
                name: (*name).into(),
            },
            provider: "store".into(),
            zone: None,
            labels: Default::default(),
            address: "127.0.0.1".into(),
            port: 3128,
            exit_ip: None,
            healthy: true,
        })
        .collect()
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
    before.set_pool(pool(ns.name()));
    let (held, _) = before.grant(&LeaseRequest::default()).unwrap();
    let (blocked, _) = before.grant(&LeaseRequest::default()).unwrap();
    before.report(&blocked.id, Outcome::Blocked).unwrap();
    persistence.flush(&before).await.unwrap();
    assert!(!before.is_dirty());
    drop(before);

    let after = store();
    persistence.restore_into(&after).await.unwrap();
    after.set_pool(pool(ns.name()));
    let states: Vec<(String, &str)> = after
        .proxies()
        .unwrap()
        .into_iter()
        .map(|p| (p.name, p.state))
        .collect();
    let held_name = held.proxy.name.clone();
    for (name, state) in &states {
        let expected = if *name == held_name {
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
        &Patch::Merge(json!({"data": {"leases.json": "{not json"}})),
    )
    .await
    .unwrap();
    let fresh = store();
    persistence.restore_into(&fresh).await.unwrap();
    fresh.set_pool(pool(ns.name()));
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
    let cp = control_plane().await;
    let ns = cp.namespace("px-e2e").await.unwrap();
    let store = InstanceStore::start().await;
    let target = FileServer::start().await.unwrap();
    let squid = Squid::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!("providers:\n{}", super::store_provider("store", &store)),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let target = target.addr().to_string();
    let mut operator = OperatorProcess::start(cp, &ns, dir.path(), &config, &target);
    operator.wait_leading().await;

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
    let active = scrape
        .samples
        .iter()
        .find(|s| s.metric == "proxy_operator_leases_active")
        .unwrap();
    assert!(
        matches!(active.value, prometheus_parse::Value::Gauge(v) if v == 1.0),
        "{active:?}"
    );

    // A graceful restart (SIGTERM, as Kubernetes stops a Pod) keeps the lease and the cooldown.
    let exit = operator.proc.stop(Duration::from_secs(30)).await;
    assert!(
        exit.success(),
        "graceful stop failed: {exit:?}\n{}",
        operator.proc.log_tail(40)
    );
    let mut operator = OperatorProcess::start(cp, &ns, dir.path(), &config, &target);
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
