//! The gateway in the cluster: the `deploy/gateway` component of the overlay, used as a client
//! uses it, through its Service.

use std::time::{Duration, Instant};

use harness::node::{Cluster, WEB_BODY};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{TOKEN, cluster_ip, curl, deployment_rolled_out, kubectl};

/// squid's access log in `squid_pod` (`accessLog: true` in the providers config).
async fn squid_access_log(cluster: &Cluster, squid_pod: &str) -> String {
    let cat = ["cat", "/var/log/squid/access.log"];
    let args = [&["-n", "proxies", "exec", squid_pod, "--"][..], &cat].concat();
    kubectl(cluster, &args).await
}

/// `curl -x` through the gateway's Service (`deploy/gateway`, the operator's image) as a
/// client uses it, the routing username and a token the discovery API accepts as its login:
/// the page, counted by a gateway replica, and one more `GET` of it in `squid_pod`'s access log
/// with the proxy's own login (`fleet_user`, which only the gateway has), never the client's
/// token. (squid sees every client as the bridge's address: kube-proxy masquerades all.)
pub(super) async fn through_the_gateway(
    cluster: &Cluster,
    web_ip: &str,
    squid_pod: &str,
    fleet_user: &str,
) {
    deployment_rolled_out(cluster, "proxy-operator-gateway", "120s").await;
    let page = format!("http://{web_ip}:8080/");
    let logged = format!(" GET {page} {fleet_user} ");
    let before = squid_access_log(cluster, squid_pod)
        .await
        .matches(&logged)
        .count();
    let gateway_ip = cluster_ip(cluster, "proxy-operator", "proxy-operator-gateway").await;
    let proxy = format!("http://session-e2e:{TOKEN}@{gateway_ip}:8080");
    let (status, body) = curl(cluster, &["-x", &proxy, &page]).await;
    assert_eq!(
        (status, body.trim()),
        (200, WEB_BODY.trim()),
        "through the gateway at {gateway_ip}"
    );

    // Which replica carried it: the one whose metrics count an HTTP request.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "proxy-operator");
    let replicas = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=proxy-operator-gateway"))
        .await
        .unwrap()
        .items;
    // Their /metrics answer a token RBAC allows (deploy/metrics-rbac.yaml), as Prometheus's.
    let token = metrics_reader_token(cluster, "e2e-scraper").await;
    let auth = format!("Authorization: Bearer {token}");
    let mut carried = 0;
    // Replicas of an earlier rollout may still be listed while they terminate.
    let serving = replicas.into_iter().filter(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    for ip in serving.filter_map(|p| p.status?.pod_ip) {
        let url = format!("http://{ip}:9090/metrics");
        let (status, _) = curl(cluster, &[&url]).await;
        assert_eq!(status, 401, "{url} without a token");
        let (status, metrics) = curl(cluster, &["-H", &auth, &url]).await;
        assert_eq!(status, 200, "{url} with the metrics reader's token");
        carried += metrics
            .lines()
            // Whatever pool and namespace the request was counted for.
            .filter(|l| {
                l.starts_with("proxy_operator_gateway_requests_total{")
                    && l.contains("outcome=\"ok\"")
                    && l.contains("protocol=\"http\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    assert_eq!(carried, 1, "requests the gateway replicas carried");

    // squid's logging daemon writes the line shortly after the request.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = squid_access_log(cluster, squid_pod).await;
        if log.matches(&logged).count() == before + 1 {
            assert!(!log.contains(TOKEN), "{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not one more `{logged}` in the squid Pod's access log in 30 s:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A token of a ServiceAccount `name` (in proxy-operator) bound to
/// proxy-operator-metrics-reader by a ClusterRoleBinding `name`, for the API server's own
/// audience (what Prometheus's ServiceMonitor sends).
pub(super) async fn metrics_reader_token(cluster: &Cluster, name: &str) -> String {
    let ns = ["-n", "proxy-operator"];
    cluster
        .kubectl_run(&[ns[0], ns[1], "create", "serviceaccount", name], None)
        .await
        .unwrap();
    cluster
        .kubectl_run(
            &[
                "create",
                "clusterrolebinding",
                name,
                "--clusterrole=proxy-operator-metrics-reader",
                &format!("--serviceaccount=proxy-operator:{name}"),
            ],
            None,
        )
        .await
        .unwrap();
    let token = cluster
        .kubectl_run(&[ns[0], ns[1], "create", "token", name], None)
        .await
        .unwrap();
    token.trim().to_string()
}
