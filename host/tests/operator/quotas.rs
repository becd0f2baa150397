//! ProxyQuotas with the real operator binary and the real API server (docs/tenancy.md, "Quotas
//! per team"): what the platform applies, what a team sees with kubectl, what a crawler is told.

use std::time::Duration;

use kube::api::{Api, ListParams};
use proxy_operator::api::labels::POOL_LABEL;
use proxy_operator::api::{Proxy, ProxyPool, ProxyQuota};
use reqwest::StatusCode;
use serde_json::json;

use super::common::operator_process::OperatorProcess;
use super::world::World;

const ADMISSION: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../deploy/quota-admission.yaml"
);

async fn apply(world: &World, yaml: &str) {
    world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(yaml))
        .await
        .unwrap();
}

fn quota_yaml(ns: &str, spec: &str) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyQuota\nmetadata:\n  name: q1\n  namespace: {ns}\nspec:\n{spec}"
    )
}

fn pool_yaml(ns: &str, replicas: i32, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: web\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: store\n      port: {port}\n"
    )
}

/// Polls `read` until `done` holds of it, for up to 90 s; `what` and the operator's log explain
/// a timeout.
async fn wait_for<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    operator: &OperatorProcess,
    what: &str,
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let seen = read().await;
        if done(&seen) {
            return seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {seen:#?}\n{}",
            operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn condition(pool: &ProxyPool, type_: &str) -> Option<(String, String)> {
    let status = pool.status.as_ref()?;
    let c = status.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.message.clone()))
}

/// A quota of 3 Proxies on `store` and 1 lease: a pool scaled to 5 stops at 3 saying which quota
/// stopped it, a hand-made Proxy past it waits unprovisioned, a second lease is refused with the
/// quota's words and granted after a release, and `kubectl get pxq` shows use against limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_stops_a_pool_a_proxy_and_a_lease_and_shows_its_use() {
    let world = World::start("pxq").await;
    let operator = world.operator().await;
    let ns = world.ns.name().to_string();
    let port = world.squid.port();
    apply(
        &world,
        &quota_yaml(&ns, "  proxies:\n    store: 3\n  leases: 1\n"),
    )
    .await;
    // The leader has read the quota once its status says so (`kubectl get pxq`).
    let quotas: Api<ProxyQuota> = world.ns.api();
    wait_for(
        &operator,
        "the quota read by the leader",
        || quotas.get("q1"),
        |q| {
            let status = q.as_ref().unwrap().status.clone().unwrap_or_default();
            status.observed_generation.is_some() && status.used.leases == Some(0)
        },
    )
    .await
    .unwrap();
    // Made small, then scaled (the scale subresource is not checked at admission: the
    // controllers bound it).
    apply(&world, &pool_yaml(&ns, 1, port)).await;
    world
        .cp
        .kubectl_run(&["scale", "-n", &ns, "pp/web", "--replicas=5"], None)
        .await
        .unwrap();
    let pools: Api<ProxyPool> = world.ns.api();
    let stopped = format!("ProxyQuota {ns}/q1: proxies[store] 3/3 in use");
    let pool = wait_for(
        &operator,
        "the pool stopped at 3 by the quota, 3 Ready",
        || pools.get("web"),
        |p| {
            let p = p.as_ref().unwrap();
            let status = p.status.clone().unwrap_or_default();
            status.ready_replicas == 3
                && condition(p, "QuotaExceeded")
                    .is_some_and(|(s, m)| s == "True" && m.contains(&stopped))
        },
    )
    .await
    .unwrap();
    assert_eq!(pool.status.unwrap().replicas, 3);
    let proxies: Api<Proxy> = world.ns.api();
    let members = proxies
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}=web")))
        .await
        .unwrap();
    assert_eq!(members.items.len(), 3, "no fourth Proxy is made");
    let events = world
        .cp
        .kubectl_run(&["get", "events", "-n", &ns, "-o", "json"], None)
        .await
        .unwrap();
    assert!(
        events.contains("QuotaExceeded") && events.contains(&stopped),
        "the pool's Event names the quota"
    );

    // A Proxy made by hand past the quota: the Proxy controller does not provision it.
    apply(
        &world,
        &format!(
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: extra\n  namespace: {ns}\nspec:\n  provider: store\n  port: {port}\n"
        ),
    )
    .await;
    let extra = wait_for(
        &operator,
        "the extra Proxy waits for its quota",
        || proxies.get("extra"),
        |p| {
            let status = p.as_ref().unwrap().status.clone().unwrap_or_default();
            status.conditions.iter().any(|c| {
                c.type_ == "Provisioned"
                    && c.status == "False"
                    && c.reason == "QuotaExceeded"
                    && c.message.contains(&stopped)
            })
        },
    )
    .await
    .unwrap();
    assert!(extra.status.unwrap().provider_id.is_none());
    // It counts while it exists (the status would say 4/3: one waits); deleted, it is gone.
    world
        .cp
        .kubectl_run(&["delete", "proxy", "extra", "-n", &ns], None)
        .await
        .unwrap();

    // Leases: one at a time, through the discovery API.
    let grant = || async {
        operator
            .call(
                reqwest::Method::POST,
                "/v1/leases",
                Some(json!({"pool": format!("{ns}/web")})),
            )
            .await
    };
    let (status, first) = grant().await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, refused) = grant().await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "{refused}\n{}",
        operator.proc.log_tail(400)
    );
    assert_eq!(refused["type"], "urn:proxy-operator:problem:quota-exceeded");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!("ProxyQuota {ns}/q1: leases 1/1 in use")),
        "{detail}"
    );
    let id = first["id"].as_str().unwrap().to_string();
    let (status, body) = operator
        .call(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, again) = grant().await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "granted after a release: {again}"
    );

    // What the team sees: use against limit.
    wait_for(
        &operator,
        "the quota's status",
        || quotas.get("q1"),
        |q| {
            let status = q.as_ref().unwrap().status.clone().unwrap_or_default();
            status.used.proxies.get("store") == Some(&3)
                && status.used.leases == Some(1)
                && status.observed_generation.is_some()
        },
    )
    .await
    .unwrap();
    let table = world
        .cp
        .kubectl_run(&["get", "pxq", "-n", &ns], None)
        .await
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PROXIES", "LEASES", "GATEWAY", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["q1", "3/3", "1/1"], "{table}");

    // The platform drops the lease bound: the status drops it too, and leases are free again.
    apply(&world, &quota_yaml(&ns, "  proxies:\n    store: 3\n")).await;
    wait_for(
        &operator,
        "the status without leases",
        || quotas.get("q1"),
        |q| {
            let status = q.as_ref().unwrap().status.clone().unwrap_or_default();
            status.used.leases.is_none()
                && status.summary.is_some_and(|s| s.leases.is_none())
                && status.observed_generation == Some(2)
        },
    )
    .await
    .unwrap();
    let (status, body) = grant().await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "no lease bound any more: {body}"
    );
}

/// The admission policy of deploy/ against the real API server: a pool over its namespace's
/// quota is refused at apply with the quota's words, one within it is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_a_pool_over_its_namespaces_quota() {
    let cp = super::control_plane().await;
    let ns = cp.namespace("pxq-admit").await.unwrap();
    cp.kubectl_run(&["apply", "-f", ADMISSION], None)
        .await
        .unwrap();
    let name = ns.name();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&quota_yaml(name, "  proxies:\n    store: 3\n  total: 4\n")),
    )
    .await
    .unwrap();
    // A key that cannot be a provider instance's name is refused, naming the field.
    let typo = cp
        .kubectl_run(
            &["apply", "-f", "-"],
            Some(&quota_yaml(name, "  proxies:\n    Store_1: 3\n").replace("q1", "typo")),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        typo.contains("proxies: each key is a provider instance's name"),
        "{typo}"
    );
    let want = format!(
        "ProxyQuota {name}/q1: proxies[store] is 3, spec.replicas 5 is over it; lower spec.replicas or ask the platform team to raise the quota"
    );
    // The policy and the quota reach the API server's admission caches within a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        match cp
            .kubectl_run(&["apply", "-f", "-"], Some(&pool_yaml(name, 5, 3128)))
            .await
        {
            Err(e) if e.to_string().contains("proxy-operator-quota") => break e.to_string(),
            outcome => {
                let _ = cp
                    .kubectl_run(&["delete", "pp", "web", "-n", name, "--wait=false"], None)
                    .await;
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a pool of 5 under a quota of 3 was not refused: {outcome:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    assert!(refusal.contains(&want), "{refusal}");
    // `total` too, for a provider the quota does not name.
    let other = pool_yaml(name, 5, 3128).replace("provider: store", "provider: other");
    let refusal = cp
        .kubectl_run(&["apply", "-f", "-"], Some(&other))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains(&format!(
            "ProxyQuota {name}/q1: total is 4, spec.replicas 5"
        )),
        "{refusal}"
    );
    // Within the quota: taken (the operator's controllers bound the sum of several pools).
    cp.kubectl_run(&["apply", "-f", "-"], Some(&pool_yaml(name, 3, 3128)))
        .await
        .unwrap();
    let pools: Api<ProxyPool> = ns.api();
    assert_eq!(pools.get("web").await.unwrap().spec.replicas, 3);
    // Another namespace, without a quota, is not checked.
    let free = cp.namespace("pxq-free").await.unwrap();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&pool_yaml(free.name(), 50, 3128)),
    )
    .await
    .unwrap();
}

const GATEWAY_TOKEN: &str = "quotas-gateway-token";

/// A gateway replica's call to the leader's gateway door: `path` with `body`.
async fn gateway_call(
    operator: &OperatorProcess,
    method: reqwest::Method,
    path: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let response = reqwest::Client::new()
        .request(method, format!("http://{}{path}", operator.discovery))
        .bearer_auth(super::common::operator_process::TOKEN)
        .header(
            proxy_operator::leasing::leases::api::GATEWAY_TOKEN_HEADER,
            GATEWAY_TOKEN,
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_default())
}

/// `gatewayConnections: 2`: the leader routes two connections to the namespace's pool, refuses
/// the third with 429 naming the quota (what the gateway hands its client), and routes again
/// once the replica reports its connections closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_at_its_gateway_connections_is_refused_naming_the_quota() {
    let world = World::start("pxq-gw").await;
    let operator = world
        .operator_with(&["--gateway-token", GATEWAY_TOKEN])
        .await;
    let ns = world.ns.name().to_string();
    apply(&world, &quota_yaml(&ns, "  gatewayConnections: 2\n")).await;
    let quotas: Api<ProxyQuota> = world.ns.api();
    wait_for(
        &operator,
        "the quota read by the leader",
        || quotas.get("q1"),
        |q| {
            let status = q.as_ref().unwrap().status.clone().unwrap_or_default();
            status.used.gateway_connections == Some(0)
        },
    )
    .await
    .unwrap();
    apply(&world, &pool_yaml(&ns, 1, world.squid.port())).await;
    let route = || {
        gateway_call(
            &operator,
            reqwest::Method::POST,
            "/v1/gateway/routes",
            json!({"replica": "gw-0", "pool": format!("{ns}/web")}),
        )
    };
    wait_for(
        &operator,
        "a first route once the pool's proxy is Ready",
        route,
        |(status, _)| *status == StatusCode::OK,
    )
    .await;
    let (status, body) = route().await;
    assert_eq!(status, StatusCode::OK, "the second connection: {body}");
    let (status, refused) = route().await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert_eq!(refused["type"], "urn:proxy-operator:problem:quota-exceeded");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "ProxyQuota {ns}/q1: gatewayConnections 2/2 in use"
        )),
        "{detail}"
    );
    // The replica's report: its connections are closed.
    let (status, body) = gateway_call(
        &operator,
        reqwest::Method::PUT,
        "/v1/gateway/replicas/gw-0",
        json!({"connections": {}}),
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = route().await;
    assert_eq!(
        status,
        StatusCode::OK,
        "room again after the report: {body}"
    );
}
