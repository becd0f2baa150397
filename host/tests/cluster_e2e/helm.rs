//! The chart (deploy/helm/proxy-operator) installed the way the README says, in the same real
//! single-node cluster, one install at a time with the kustomize test: the discovery API's TLS
//! Secret as cert-manager would write it, `helm install` → both replicas Ready, their /metrics
//! refused without a token and served to one bound to the chart's metrics-reader ClusterRole →
//! a kubernetes-provider Proxy `Ready`, leased through the discovery Service over https (trusting
//! the Secret's CA), a page fetched through it → `helm upgrade` with another providers entry (its ProviderHealth
//! appears: the operator reloads the config) and one replica (the Deployment follows) → leased
//! and fetched again → `helm uninstall` removes the release's objects and keeps the CRDs and the
//! provider namespace (`crds.keep`, `providerNamespaces.keep`). The helm is the fixture built from
//! its Go module (tests/fixtures/helm).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::node::{Cluster, WEB_BODY};
use harness::stack::Phases;
use serde_json::{Value, json};

use super::{
    DISCOVERY_HOST, OPERATOR_IMAGE, TOKEN, create_discovery_tls, create_token_secret, curl,
    discovery, kubectl, kubectl_stdin, operator_image_archive, operator_pods, repo,
    start_web_server, until,
};

/// The ServiceAccount and ClusterRoleBinding of the test's metrics reader.
const SCRAPER: &str = "helm-scraper";

const CRAWLERS: &str = "helm-crawlers";
const PROXY: &str = "helm-egress-1";

/// `helm ARGS` against the cluster, with Helm's own state in a scratch directory (never the
/// user's ~/.cache/helm): stdout, or a panic with stderr.
async fn helm(cluster: &Cluster, home: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(harness::bins::helm_binary())
        .args(args)
        .env("KUBECONFIG", cluster.kubeconfig())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .await
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm {}:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespace `namespace` and in it the Proxy `name` of the `in-cluster` provider, applied.
pub(super) async fn apply_proxy(cluster: &Cluster, namespace: &str, name: &str) {
    let proxy = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n---\n\
         apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\n\
         metadata: {{name: {name}, namespace: {namespace}}}\n\
         spec: {{provider: in-cluster, port: 3128}}\n"
    );
    kubectl_stdin(cluster, &["apply", "-f", "-"], &proxy).await;
}

/// Values as a user writes them for this cluster (the same as the kustomize test's overlay):
/// the squid image the node has, a health target inside the cluster (no uplink) that squid may
/// reach, the image imported into the node. `second_provider`: one more providers entry.
pub(super) fn values(
    squid_image: &str,
    health_target: &str,
    second_provider: bool,
    replicas: u32,
) -> Value {
    let (target_ip, _) = health_target.rsplit_once(':').unwrap();
    let entry = |name: &str| {
        json!({
            "name": name,
            "type": "kubernetes",
            "config": {
                "image": squid_image,
                "allowFrom": ["10.0.0.0/8"],
                "connectPorts": [443, 8080],
                "allowDestinations": [format!("{target_ip}/32")],
            },
            "grants": {"kube": {
                "namespace": "proxies",
                "kinds": ["v1/Pod", "v1/ConfigMap", "v1/Service", "networking.k8s.io/v1/NetworkPolicy"],
                "images": [squid_image],
            }},
        })
    };
    let mut providers = vec![entry("in-cluster")];
    if second_provider {
        providers.push(entry("in-cluster-b"));
    }
    json!({
        // The tag the node's imported image has (the chart's default is its release's).
        "image": {"tag": "dev", "pullPolicy": "Never"},
        "replicaCount": replicas,
        "providers": providers,
        "extraEnv": [
            {"name": "HEALTH_TARGET", "value": health_target},
            {"name": "HEALTH_INTERVAL", "value": "2s"},
        ],
    })
}

/// Writes `values` as a values file (JSON is YAML) and returns its path.
fn values_file(dir: &Path, name: &str, values: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_string_pretty(values).unwrap()).unwrap();
    path
}

/// A lease through the discovery Service (of the Proxy `proxy`, the only one), then a page
/// through the leased proxy; the lease is released afterwards.
pub(super) async fn lease_and_fetch(cluster: &Cluster, web_ip: &str, proxy: &str) {
    let discovery_ip =
        super::cluster_ip(cluster, "proxy-operator", "proxy-operator-discovery").await;
    let lease = until("a lease", Duration::from_secs(90), || async {
        let (status, body) = discovery(cluster, &discovery_ip, "POST", "/v1/leases").await;
        (status == 201).then_some(body)
    })
    .await;
    assert_eq!(lease["proxy"]["name"], proxy, "{lease}");
    let proxy_url = lease["proxyUrl"].as_str().unwrap();
    let (status, page) = curl(
        cluster,
        &["-x", proxy_url, &format!("http://{web_ip}:8080/")],
    )
    .await;
    assert_eq!(
        (status, page.trim()),
        (200, WEB_BODY.trim()),
        "through {proxy_url}"
    );
    let path = format!("/v1/leases/{}", lease["id"].as_str().unwrap());
    let (status, body) = discovery(cluster, &discovery_ip, "DELETE", &path).await;
    assert_eq!(status, 204, "releasing the lease: {body}");
}

/// Each operator replica's /metrics: 401 without a token, 200 with one RBAC lets read it (the
/// chart's ClusterRole proxy-operator-metrics-reader, as Prometheus's binding would).
async fn metrics_need_a_reader_token(cluster: &Cluster) {
    let token = super::gateway::metrics_reader_token(cluster, SCRAPER).await;
    let auth = format!("Authorization: Bearer {token}");
    for ip in operator_pods(cluster)
        .await
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
    {
        let url = format!("http://{ip}:9090/metrics");
        let (status, _) = curl(cluster, &[&url]).await;
        assert_eq!(status, 401, "{url} without a token");
        let (status, metrics) = curl(cluster, &["-H", &auth, &url]).await;
        assert_eq!(status, 200, "{url} with the metrics reader's token");
        assert!(
            metrics.contains("# TYPE"),
            "{url}: Prometheus text, got {metrics:.200}"
        );
    }
}

/// `kubectl wait` for the Proxy `namespace/name` to be Ready; when it times out, what a user
/// would look at next (the Proxy, the Pods and the recent events) goes into the failure.
pub(super) async fn proxy_ready(cluster: &Cluster, namespace: &str, name: &str) {
    let proxy_ref = format!("proxy/{name}");
    let wait_ready = [
        "-n",
        namespace,
        "wait",
        "--for=jsonpath={.status.phase}=Ready",
        &proxy_ref,
        "--timeout=180s",
    ];
    let Err(e) = cluster.kubectl_run(&wait_ready, None).await else {
        return;
    };
    let mut seen = String::new();
    for args in [
        &["-n", namespace, "get", "proxy", name, "-o", "yaml"][..],
        &["get", "pods", "-A", "-o", "wide"],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"],
        &[
            "-n",
            "proxy-operator",
            "logs",
            "-l",
            "app.kubernetes.io/name=proxy-operator",
            "--tail=40",
        ],
    ] {
        let out = cluster.kubectl_run(args, None).await;
        seen.push_str(&format!("\n$ kubectl {}\n{out:#?}\n", args.join(" ")));
    }
    panic!("kubectl {}: {e:#}{seen}", wait_ready.join(" "));
}

/// Whether `kubectl get ARGS` finds the object (`--ignore-not-found` prints nothing otherwise).
async fn exists(cluster: &Cluster, args: &[&str]) -> bool {
    let all = [&["get", "--ignore-not-found", "-o", "name"][..], args].concat();
    !kubectl(cluster, &all).await.trim().is_empty()
}

pub(super) async fn install_upgrade_uninstall(cluster: &Cluster, phases: &mut Phases) {
    let archive = operator_image_archive();
    cluster
        .import_image(&archive, OPERATOR_IMAGE)
        .await
        .expect("importing the operator image into the node");
    let web_ip = start_web_server(cluster).await;
    phases.done("operator image imported, web server Pod ready");

    let scratch = repo().join("target/e2e-cluster/helm");
    std::fs::create_dir_all(&scratch).unwrap();
    let home = tempfile::tempdir_in(&scratch).unwrap();
    let chart = repo().join("deploy/helm/proxy-operator");
    let chart = chart.to_str().unwrap();
    let health_target = format!("{web_ip}:8080");
    let squid = cluster.images().squid.clone();

    // As the README says: the namespace, labelled for Pod Security; the optional token Secret;
    // helm install.
    kubectl(cluster, &["create", "namespace", "proxy-operator"]).await;
    kubectl(
        cluster,
        &[
            "label",
            "namespace",
            "proxy-operator",
            "pod-security.kubernetes.io/enforce=restricted",
        ],
    )
    .await;
    create_token_secret(cluster, "proxy-operator-discovery", TOKEN).await;
    // The discovery API's certificate (cert-manager's part in a real cluster: README applies
    // deploy/samples/discovery-certificate.yaml before helm install), for the Service's name.
    create_discovery_tls(cluster, home.path(), &[DISCOVERY_HOST]).await;
    let first = values_file(
        home.path(),
        "values.yaml",
        &values(&squid, &health_target, false, 2),
    );
    let installed = Instant::now();
    helm(
        cluster,
        home.path(),
        &[
            "install",
            "proxy-operator",
            chart,
            "--namespace",
            "proxy-operator",
            "-f",
            first.to_str().unwrap(),
            "--wait",
            "--timeout",
            "240s",
        ],
    )
    .await;
    assert_eq!(operator_pods(cluster).await.len(), 2, "two replicas");
    phases.done(&format!(
        "helm install: 2 replicas Ready in {:.1} s",
        installed.elapsed().as_secs_f64()
    ));
    metrics_need_a_reader_token(cluster).await;
    phases.done("their /metrics: 401 without a token, 200 with a metrics reader's");

    // A Proxy served by the installed operator.
    apply_proxy(cluster, CRAWLERS, PROXY).await;
    let proxy_ref = format!("proxy/{PROXY}");
    proxy_ready(cluster, CRAWLERS, PROXY).await;
    lease_and_fetch(cluster, &web_ip, PROXY).await;
    phases.done(
        "a Proxy Ready, leased through the discovery Service over https, a page fetched through it",
    );

    // helm upgrade: another provider instance (the operator reloads its config: a
    // ProviderHealth for it) and one replica.
    let second = values_file(
        home.path(),
        "values-2.yaml",
        &values(&squid, &health_target, true, 1),
    );
    let upgraded = Instant::now();
    helm(
        cluster,
        home.path(),
        &[
            "upgrade",
            "proxy-operator",
            chart,
            "--namespace",
            "proxy-operator",
            "-f",
            second.to_str().unwrap(),
            "--wait",
            "--timeout",
            "240s",
        ],
    )
    .await;
    phases.done("helm upgrade --wait returned");
    kubectl(
        cluster,
        &[
            "wait",
            "--for=create",
            "providerhealth/in-cluster-b",
            "--timeout=90s",
        ],
    )
    .await;
    phases.done("the new provider's ProviderHealth made (the config reloaded)");
    until("one operator replica", Duration::from_secs(90), || async {
        (operator_pods(cluster).await.len() == 1).then_some(())
    })
    .await;
    proxy_ready(cluster, CRAWLERS, PROXY).await;
    phases.done("one operator replica, the Proxy Ready");
    lease_and_fetch(cluster, &web_ip, PROXY).await;
    phases.done(&format!(
        "leased and fetched again ({:.1} s after helm upgrade)",
        upgraded.elapsed().as_secs_f64()
    ));

    // helm uninstall, once the Proxy is gone (its finalizer is the operator's): the release's
    // objects go, the CRDs and the provider namespace the chart made stay (crds.keep,
    // providerNamespaces.keep).
    kubectl(
        cluster,
        &[
            "-n",
            CRAWLERS,
            "delete",
            &proxy_ref,
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    let uninstalled = Instant::now();
    helm(
        cluster,
        home.path(),
        &[
            "uninstall",
            "proxy-operator",
            "--namespace",
            "proxy-operator",
            "--wait",
            "--timeout",
            "180s",
        ],
    )
    .await;
    for gone in [
        &["-n", "proxy-operator", "deployment/proxy-operator"][..],
        &["-n", "proxy-operator", "configmap/providers-config"],
        &["clusterrole/proxy-operator"],
        &["clusterrole/proxy-operator-metrics-reader"],
        &["flowschema/proxy-operator-leader-election"],
    ] {
        assert!(
            !exists(cluster, gone).await,
            "{gone:?} after helm uninstall"
        );
    }
    for kept in ["proxies", "proxypools", "proxyquotas", "providerhealths"] {
        let crd = format!("crd/{kept}.proxy-operator.dev");
        assert!(exists(cluster, &[&crd]).await, "{crd} kept (crds.keep)");
    }
    assert!(
        exists(cluster, &["namespace/proxies"]).await,
        "namespace/proxies kept (providerNamespaces.keep)"
    );
    phases.done(&format!(
        "helm uninstall in {:.1} s: the release's objects gone, the CRDs and namespace kept",
        uninstalled.elapsed().as_secs_f64()
    ));

    // Leave the cluster as found, for the kustomize install.
    kubectl(cluster, &["delete", "clusterrolebinding", SCRAPER]).await;
    kubectl(
        cluster,
        &[
            "delete",
            "crd",
            "proxies.proxy-operator.dev",
            "proxypools.proxy-operator.dev",
            "proxyquotas.proxy-operator.dev",
            "providerhealths.proxy-operator.dev",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    kubectl(
        cluster,
        &[
            "delete",
            "namespace",
            CRAWLERS,
            "proxy-operator",
            "proxies",
            "--wait=true",
            "--timeout=180s",
        ],
    )
    .await;
    phases.done("CRDs and namespaces removed");
}
