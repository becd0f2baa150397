//! The operator installed the way the README says, in a real single-node cluster (kubelet,
//! containerd, kube-proxy in a network namespace with no uplink): its image built from the
//! Dockerfile is imported into the node, `kubectl apply -k` of an overlay of `deploy/` (the local
//! squid image, a health target inside the cluster), the token Secret, both replicas Ready →
//! a kubernetes-provider Proxy → a real squid Pod runs → the in-cluster operator probes it →
//! `Ready` → leased through the discovery Service → a request through the proxy returns a page
//! from a server in the cluster → `kubectl rollout restart` finishes and the lease is still held →
//! evictions respect the PodDisruptionBudget → deleting the Proxy removes its Pod, Service,
//! ConfigMap and NetworkPolicy. The gateway (the `deploy/gateway` component, the same image)
//! carries a `curl -x` through its Service and the squid Pod. Each phase is printed with its time
//! (`make e2e-cluster`). `helm.rs`: the Helm chart installed, upgraded and uninstalled in the same
//! cluster, one install at a time with this one (each removes its own at the end).
//! `install_yaml.rs`: `make release`'s dist/install.yaml applied there, the image pinned by
//! digest.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::node::{Cluster, WEB_BODY};
use harness::stack::Phases;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const TOKEN: &str = "e2e-cluster-token";
/// The gateway's own token (its Secret, read by it and by the operator).
const GATEWAY_TOKEN: &str = "e2e-cluster-gateway-token";
const OPERATOR_IMAGE: &str = "docker.io/library/proxy-operator:dev";
/// The plugin's objects carry this label with the provider instance's name.
const PROVIDER_SELECTOR: &str = "proxy-operator.dev/provider=in-cluster";

#[path = "cluster_e2e/gateway.rs"]
mod gateway;
#[path = "cluster_e2e/helm.rs"]
mod helm;
#[path = "cluster_e2e/install_yaml.rs"]
mod install_yaml;
#[path = "common/release.rs"]
#[allow(dead_code)]
mod release_parts;

/// The tests share one cluster, and the installs (kustomize, Helm, install.yaml) have the same
/// cluster-wide objects (CRDs, ClusterRoles, the namespaces): one install at a time, each
/// removing its own at the end.
static ONE_INSTALL_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
#[path = "common/test_ca.rs"]
#[allow(dead_code)]
mod test_ca;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The operator's image as an OCI archive, built from the Dockerfile's `prebuilt` target with
/// the operator binary cargo built for this test (common/release.rs; docs/image.md).
fn operator_image_archive() -> PathBuf {
    release_parts::operator_image_archive(env!("CARGO_BIN_EXE_proxy-operator"))
}

async fn kubectl(cluster: &Cluster, args: &[&str]) -> String {
    cluster
        .kubectl_run(args, None)
        .await
        .unwrap_or_else(|e| panic!("kubectl {}: {e:#}", args.join(" ")))
}

async fn kubectl_stdin(cluster: &Cluster, args: &[&str], stdin: &str) -> String {
    cluster
        .kubectl_run(args, Some(stdin))
        .await
        .unwrap_or_else(|e| panic!("kubectl {}: {e:#}\n{stdin}", args.join(" ")))
}

/// `curl` from inside the node's network namespace (where the ClusterIPs are): status and body.
async fn curl(cluster: &Cluster, args: &[&str]) -> (u16, String) {
    let out = cluster
        .netns_command("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .await
        .expect("curl in the node's network namespace");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The discovery Service's name in its certificate (the node has no cluster DNS: curl is told
/// the address, `--resolve`).
const DISCOVERY_HOST: &str = "proxy-operator-discovery.proxy-operator.svc";
/// The CA file the current install's discovery API certificate was made with
/// (`create_discovery_tls`): each install (kustomize, Helm) makes its own, one at a time.
static DISCOVERY_CA: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// The discovery API at `ip` (its Service's or a Pod's) over TLS, trusting the test's CA, with
/// the token.
async fn discovery(cluster: &Cluster, ip: &str, method: &str, path: &str) -> (u16, Value) {
    let url = format!("https://{DISCOVERY_HOST}:8090{path}");
    let resolve = format!("{DISCOVERY_HOST}:8090:{ip}");
    let ca = DISCOVERY_CA
        .lock()
        .unwrap()
        .clone()
        .expect("the discovery API's TLS Secret made first");
    let auth = format!("Authorization: Bearer {TOKEN}");
    let (status, body) = curl(
        cluster,
        &[
            "--cacert",
            ca.to_str().unwrap(),
            "--resolve",
            &resolve,
            "-X",
            method,
            "-H",
            &auth,
            &url,
        ],
    )
    .await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Polls `check` every 200 ms until it returns `Some`, for at most `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cluster_ip(cluster: &Cluster, namespace: &str, service: &str) -> String {
    let services: Api<Service> = Api::namespaced(cluster.client(), namespace);
    services
        .get(service)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP")
}

/// A busybox web server and its Service in `e2e-web`: the site crawlers fetch and the health
/// probes' CONNECT target. Returns its ClusterIP.
async fn start_web_server(cluster: &Cluster) -> String {
    let web = cluster.images().web.clone();
    let manifest = format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: e2e-web}}
---
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: e2e-web, labels: {{app: web}}}}
spec:
  containers:
    - name: web
      image: {web}
      imagePullPolicy: Never
      ports: [{{containerPort: 8080}}]
      readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: e2e-web}}
spec:
  selector: {{app: web}}
  ports: [{{port: 8080, targetPort: 8080}}]
"#
    );
    kubectl_stdin(cluster, &["apply", "-f", "-"], &manifest).await;
    kubectl(
        cluster,
        &[
            "-n",
            "e2e-web",
            "wait",
            "--for=condition=Ready",
            "pod/web",
            "--timeout=120s",
        ],
    )
    .await;
    cluster_ip(cluster, "e2e-web", "web").await
}

/// An overlay of `deploy/` as a user writes one: the squid image the node has, and a health
/// target inside the cluster (it has no uplink), which squid must be allowed to reach (it
/// refuses the cluster's addresses by default): exactly that address. With the gateway
/// component, allowed to reach that address too (the gateway refuses private ones by default),
/// and squid's access log kept (to see which squid carried a request).
fn write_overlay(squid_image: &str, health_target: &str) -> PathBuf {
    let (target_ip, _) = health_target.rsplit_once(':').unwrap();
    let dir = repo().join("target/e2e-cluster/overlay");
    std::fs::create_dir_all(&dir).unwrap();
    let providers = format!(
        r#"providers:
  - name: in-cluster
    type: kubernetes
    config:
      image: {squid_image}
      allowFrom: ["10.0.0.0/8"]
      connectPorts: [443, 8080]
      allowDestinations: ["{target_ip}/32"]
      accessLog: true
    grants:
      kube:
        namespace: proxies
        kinds: ["v1/Pod", "v1/ConfigMap", "v1/Service", "networking.k8s.io/v1/NetworkPolicy"]
        images: ["{squid_image}"]
"#
    );
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../../../deploy"],
        "components": ["../../../deploy/gateway"],
        "patches": [
            {"patch": serde_json::to_string(&json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "providers-config", "namespace": "proxy-operator"},
                "data": {"providers.yaml": providers},
            })).unwrap()},
            {"patch": serde_json::to_string(&json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "proxy-operator", "namespace": "proxy-operator"},
                "spec": {"template": {"spec": {"containers": [{
                    "name": "operator",
                    "imagePullPolicy": "Never",
                    "env": [
                        {"name": "HEALTH_TARGET", "value": health_target},
                        {"name": "HEALTH_INTERVAL", "value": "2s"},
                    ],
                }]}}},
            })).unwrap()},
            {"patch": serde_json::to_string(&json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "proxy-operator-gateway", "namespace": "proxy-operator"},
                "spec": {"template": {"spec": {"containers": [{
                    "name": "gateway",
                    "imagePullPolicy": "Never",
                    "env": [
                        {"name": "GATEWAY_ALLOWED_PORTS", "value": "8080"},
                        {"name": "GATEWAY_ALLOWED_NETWORKS", "value": format!("{target_ip}/32")},
                        // The node has no cluster DNS: the discovery Service's address from
                        // the variables the kubelet gives every Pod.
                        {"name": "DISCOVERY_URL", "value": "https://$(PROXY_OPERATOR_DISCOVERY_SERVICE_HOST):8090"},
                    ],
                }]}}},
            })).unwrap()},
        ],
    });
    std::fs::write(
        dir.join("kustomization.yaml"),
        serde_json::to_string_pretty(&kustomization).unwrap(),
    )
    .unwrap();
    dir
}

async fn operator_pods(cluster: &Cluster) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "proxy-operator");
    pods.list(&ListParams::default().labels("app.kubernetes.io/name=proxy-operator"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Pods of the Deployment that carry the leader label.
async fn labelled_leaders(cluster: &Cluster) -> Vec<String> {
    operator_pods(cluster)
        .await
        .into_iter()
        .filter(|p| {
            p.metadata.labels.as_ref().is_some_and(|l| {
                l.get("proxy-operator.dev/leader")
                    .is_some_and(|v| v == "true")
            })
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}

async fn rollout_status(cluster: &Cluster) {
    deployment_rolled_out(cluster, "proxy-operator", "240s").await;
    // `rollout status` returns while the old replicas still terminate, and one of them may
    // still lead: a Proxy made now could be reconciled with the old settings (seen once: a
    // squid Pod made from the providers config before the one the test had just written).
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "proxy-operator");
    let terminating: Vec<Pod> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=proxy-operator"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .collect();
    for pod in terminating {
        let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
        let gone = kube::runtime::wait::await_condition(
            pods.clone(),
            &name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(Duration::from_secs(120), gone)
            .await
            .unwrap_or_else(|_| panic!("the old operator Pod {name} still terminates after 120 s"))
            .unwrap();
    }
}

/// `kubectl rollout status` of a Deployment in the operator's namespace, for at most `timeout`.
async fn deployment_rolled_out(cluster: &Cluster, deployment: &str, timeout: &str) {
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            &format!("--timeout={timeout}"),
        ],
    )
    .await;
}

/// The discovery API's TLS Secret as cert-manager would write it (deploy/samples/
/// discovery-certificate.yaml), from a CA of the test's own, for the Service's name and its
/// address (the gateway's Pods reach it by address: no cluster DNS on the node).
async fn install_discovery_tls(cluster: &Cluster, dir: &Path) {
    let service_ip = cluster_ip(cluster, "proxy-operator", "proxy-operator-discovery").await;
    create_discovery_tls(cluster, dir, &[DISCOVERY_HOST, &service_ip]).await;
}

/// That Secret for `names`, in the namespace proxy-operator (which must exist), and its CA the
/// one `discovery` trusts from then on.
async fn create_discovery_tls(cluster: &Cluster, dir: &Path, names: &[&str]) {
    let ca = test_ca::TestCa::new("e2e discovery CA");
    let files = ca.write(dir, names);
    let from = |key: &str, path: &Path| format!("--from-file={key}={}", path.display());
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "create",
            "secret",
            "generic",
            "proxy-operator-discovery-tls",
            "--type=kubernetes.io/tls",
            &from("tls.crt", &files.cert),
            &from("tls.key", &files.key),
            &from("ca.crt", &files.ca),
        ],
    )
    .await;
    *DISCOVERY_CA.lock().unwrap() = Some(files.ca);
}

/// A Secret in the operator's namespace with one key, `token`.
async fn create_token_secret(cluster: &Cluster, name: &str, token: &str) {
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "create",
            "secret",
            "generic",
            name,
            &format!("--from-literal=token={token}"),
        ],
    )
    .await;
}

/// Waits until the PodDisruptionBudget counts two healthy replicas and allows one disruption
/// (right after a rollout it still counts a terminating Pod and allows more).
async fn pdb_allows_one(cluster: &Cluster) {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(cluster.client(), "proxy-operator");
    until(
        "the PodDisruptionBudget: 2 healthy, 1 disruption allowed",
        Duration::from_secs(120),
        || async {
            let pdb = budgets.get("proxy-operator").await.ok()?;
            let status = pdb.status?;
            let settled = status.observed_generation == pdb.metadata.generation
                && status.current_healthy == Some(2)
                && status.disruptions_allowed == Some(1)
                && operator_pods(cluster).await.len() == 2;
            settled.then_some(())
        },
    )
    .await;
}

/// One eviction, as `kubectl drain` asks for it (once, no client-side retry: kube-rs retries a
/// 429 by itself, which would hide the budget's refusal).
async fn evict(cluster: &Cluster, pod: &str) -> Result<String, String> {
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "proxy-operator"},
    });
    let path = format!("/api/v1/namespaces/proxy-operator/pods/{pod}/eviction");
    cluster
        .kubectl_run(
            &["create", "--raw", &path, "-f", "-"],
            Some(&body.to_string()),
        )
        .await
        .map_err(|e| format!("{e:#}"))
}

/// What a crawler sees of one proxy in `GET /v1/proxies`.
async fn proxy_view(cluster: &Cluster, discovery_ip: &str, name: &str) -> Option<Value> {
    let (status, body) = discovery(cluster, discovery_ip, "GET", "/v1/proxies").await;
    if status != 200 {
        return None;
    }
    body["proxies"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_from_its_image_the_operator_serves_a_real_squid_pod_and_rolls_out() {
    let mut phases = Phases::new();
    let cluster = Cluster::shared().await;
    let _turn = ONE_INSTALL_AT_A_TIME.lock().await;
    phases.done("single-node cluster ready");
    let archive = operator_image_archive();
    phases.done("operator image built (or cached)");
    cluster
        .import_image(&archive, OPERATOR_IMAGE)
        .await
        .expect("importing the operator image into the node");
    phases.done("operator image imported into containerd");
    let web_ip = start_web_server(cluster).await;
    phases.done("web server Pod ready");

    // Install as the README says: apply -k, the token Secret, a restart.
    let overlay = write_overlay(&cluster.images().squid, &format!("{web_ip}:8080"));
    kubectl(cluster, &["apply", "-k", overlay.to_str().unwrap()]).await;
    create_token_secret(cluster, "proxy-operator-discovery", TOKEN).await;
    // The discovery API's certificate (cert-manager's part in a real cluster), which the
    // gateway's Pods wait for.
    install_discovery_tls(cluster, &overlay).await;
    // The gateway's Secret, which its Pods and (with the component) the operator's wait for.
    create_token_secret(cluster, "proxy-operator-gateway", GATEWAY_TOKEN).await;
    // The discovery Secret is optional (the operator starts without it), and read at start: a
    // restart; the gateway's Pods start at once rather than at the kubelet's next retry.
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "rollout",
            "restart",
            "deployment/proxy-operator",
            "deployment/proxy-operator-gateway",
        ],
    )
    .await;
    rollout_status(cluster).await;
    let ready = operator_pods(cluster).await;
    assert_eq!(ready.len(), 2, "two replicas");
    let leader = until(
        "one replica labelled the leader",
        Duration::from_secs(60),
        || async {
            let leaders = labelled_leaders(cluster).await;
            (leaders.len() == 1).then(|| leaders[0].clone())
        },
    )
    .await;
    phases.done(&format!(
        "operator installed: 2 replicas Ready, {leader} leads"
    ));

    // A kubernetes-provider Proxy: a real squid Pod, probed by the operator in the cluster.
    kubectl(cluster, &["create", "namespace", "crawlers"]).await;
    let sample = repo().join("deploy/samples/proxy_kubernetes.yaml");
    kubectl(cluster, &["apply", "-f", sample.to_str().unwrap()]).await;
    let applied = Instant::now();
    kubectl(
        cluster,
        &[
            "-n",
            "crawlers",
            "wait",
            "--for=jsonpath={.status.phase}=Ready",
            "proxy/egress-pod-1",
            "--timeout=180s",
        ],
    )
    .await;
    let apply_to_ready = applied.elapsed();
    phases.done(&format!(
        "Proxy Ready {:.1} s after kubectl apply (squid Pod running, probed through its Service)",
        apply_to_ready.as_secs_f64()
    ));
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "proxies");
    let squid_pods = pods
        .list(&ListParams::default().labels(PROVIDER_SELECTOR))
        .await
        .unwrap()
        .items;
    assert_eq!(squid_pods.len(), 1, "one squid Pod");
    assert_eq!(
        squid_pods[0].metadata.labels.as_ref().unwrap()["plugin.proxy-operator.dev/team"],
        "crawl",
        "the Proxy's labels reach its Pod (under the plugins' prefix)"
    );

    // Lease it through the discovery Service and fetch a page through it.
    let discovery_ip = cluster_ip(cluster, "proxy-operator", "proxy-operator-discovery").await;
    let (status, lease) = until("a lease", Duration::from_secs(60), || async {
        let (status, body) = discovery(cluster, &discovery_ip, "POST", "/v1/leases").await;
        (status == 201).then_some((status, body))
    })
    .await;
    assert_eq!(status, 201);
    let proxy_url = lease["proxyUrl"].as_str().unwrap().to_string();
    let lease_id = lease["id"].as_str().unwrap().to_string();
    let squid_service_ip = cluster_ip(
        cluster,
        "proxies",
        squid_pods[0].metadata.name.as_ref().unwrap(),
    )
    .await;
    assert_eq!(
        lease["proxy"]["address"], squid_service_ip,
        "the Proxy's address is its Service's"
    );
    let (status, page) = curl(
        cluster,
        &["-x", &proxy_url, &format!("http://{web_ip}:8080/")],
    )
    .await;
    assert_eq!(
        (status, page.trim()),
        (200, WEB_BODY.trim()),
        "through {proxy_url}"
    );
    // The proxy requires its credentials: the lease's URL carries them, the bare address gets
    // squid's 407.
    let bare = harness::stack::without_credentials(&proxy_url);
    assert_ne!(bare, proxy_url, "the lease's proxyUrl carries credentials");
    let (status, _) = curl(cluster, &["-x", &bare, &format!("http://{web_ip}:8080/")]).await;
    assert_eq!(status, 407, "through {bare}, without credentials");
    phases.done("leased through the discovery Service; a page fetched through the proxy with its credentials, 407 without");

    // The proxy is no way into the cluster: with the lease's credentials, squid refuses (403,
    // before connecting) a CONNECT to the API server's Service and a GET of another Pod's port.
    let api_ip = cluster_ip(cluster, "default", "kubernetes").await;
    let (status, _) = curl(
        cluster,
        &[
            "-p",
            "-x",
            &proxy_url,
            "-w",
            "\n%{http_connect}",
            &format!("http://{api_ip}:443/version"),
        ],
    )
    .await;
    assert_eq!(
        status, 403,
        "CONNECT {api_ip}:443 (the kubernetes Service) through {bare}"
    );

    // A standby answers crawlers with the leader's name, never a grant.
    let standby = ready
        .iter()
        .find(|p| p.metadata.name.as_deref() != Some(leader.as_str()))
        .unwrap();
    let standby_ip = standby.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let (status, _) = curl(
        cluster,
        &[
            "-x",
            &proxy_url,
            &format!("http://{standby_ip}:8090/v1/leases"),
        ],
    )
    .await;
    assert_eq!(
        status, 403,
        "another Pod's port ({standby_ip}:8090) through {bare}"
    );
    phases.done("through the proxy: the API server's Service and another Pod's port refused (403)");
    let (status, body) = discovery(cluster, &standby_ip, "POST", "/v1/leases").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["type"], "urn:proxy-operator:problem:not-leader",
        "{body}"
    );
    assert_eq!(body["leader"], leader.as_str(), "{body}");

    // A rolling restart finishes, and the lease is still held afterwards.
    let held_until = proxy_view(cluster, &discovery_ip, "egress-pod-1")
        .await
        .unwrap()["leaseExpiresAt"]
        .clone();
    let restart = Instant::now();
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "rollout",
            "restart",
            "deployment/proxy-operator",
        ],
    )
    .await;
    rollout_status(cluster).await;
    let rolled_out = restart.elapsed();
    eprintln!("rolled out");
    phases.done(&format!(
        "rollout restart of 2 replicas finished in {:.1} s",
        rolled_out.as_secs_f64()
    ));
    let view = until(
        "the lease table served by the new leader",
        Duration::from_secs(90),
        || async { proxy_view(cluster, &discovery_ip, "egress-pod-1").await },
    )
    .await;
    assert_eq!(view["state"], "leased", "{view}");
    assert_eq!(view["leaseExpiresAt"], held_until, "the same lease: {view}");
    // Right after a rollout the Service may still be moving to the leader (no answer, or a
    // standby's 503): the release is retried; a retry after an answer that was lost finds the
    // lease already ended (410).
    let path = format!("/v1/leases/{lease_id}");
    let unanswered = std::cell::Cell::new(false);
    until(
        "the lease from before the rollout released",
        Duration::from_secs(60),
        || {
            let (path, ip, unanswered) = (path.clone(), discovery_ip.clone(), &unanswered);
            async move {
                match discovery(cluster, &ip, "DELETE", &path).await.0 {
                    204 => Some(()),
                    410 if unanswered.get() => Some(()),
                    0 => {
                        unanswered.set(true);
                        None
                    }
                    502 | 503 => None,
                    other => panic!("releasing the lease from before the rollout: {other}"),
                }
            }
        },
    )
    .await;
    phases.done("the lease survived the rollout");

    // The released proxy carries gateway traffic.
    let squid_pod = squid_pods[0].metadata.name.clone().unwrap();
    let fleet_user = url::Url::parse(&proxy_url).unwrap().username().to_string();
    gateway::through_the_gateway(cluster, &web_ip, &squid_pod, &fleet_user).await;
    phases.done("through the gateway's Service: the page, carried by the squid Pod");

    // Evictions (as `kubectl drain` makes them) respect the PodDisruptionBudget.
    // As `kubectl get pdb` shows it once the restart has settled: 2 healthy, 1 disruption allowed.
    pdb_allows_one(cluster).await;
    let names: Vec<String> = operator_pods(cluster)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names.len(), 2);
    evict(cluster, &names[0])
        .await
        .expect("the first eviction is allowed");
    match evict(cluster, &names[1]).await {
        Err(e) if e.contains("TooManyRequests") && e.contains("disruption budget") => {}
        other => panic!("the second eviction, with one replica down, must be refused: {other:?}"),
    }
    rollout_status(cluster).await;
    until(
        "the replacement Ready and counted by the budget",
        Duration::from_secs(120),
        || async { evict(cluster, &names[1]).await.ok() },
    )
    .await;
    rollout_status(cluster).await;
    phases.done("evictions respected the PodDisruptionBudget");

    // Deleting the Proxy removes everything the provider made.
    kubectl(
        cluster,
        &[
            "-n",
            "crawlers",
            "delete",
            "proxy",
            "egress-pod-1",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    let by_label = ListParams::default().labels(PROVIDER_SELECTOR);
    let services: Api<Service> = Api::namespaced(cluster.client(), "proxies");
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client(), "proxies");
    let policies: Api<NetworkPolicy> = Api::namespaced(cluster.client(), "proxies");
    until("the squid Pod gone", Duration::from_secs(60), || async {
        pods.list(&by_label)
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(services.list(&by_label).await.unwrap().items.is_empty());
    assert!(maps.list(&by_label).await.unwrap().items.is_empty());
    assert!(policies.list(&by_label).await.unwrap().items.is_empty());
    phases.done("Proxy deleted: its Pod, Service, ConfigMap and NetworkPolicy are gone");

    // The ProxyPool sample, at 2: two squid Pods made, probed and Ready; deleting the pool
    // removes them.
    let sample = std::fs::read_to_string(repo().join("deploy/samples/proxypool.yaml")).unwrap();
    let two = sample.replace("  replicas: 10\n", "  replicas: 2\n");
    assert_ne!(two, sample, "the sample sets replicas: 10");
    let applied = Instant::now();
    kubectl_stdin(cluster, &["apply", "-f", "-"], &two).await;
    kubectl(
        cluster,
        &[
            "-n",
            "crawlers",
            "wait",
            "--for=jsonpath={.status.readyReplicas}=2",
            "proxypool/egress",
            "--timeout=180s",
        ],
    )
    .await;
    phases.done(&format!(
        "ProxyPool sample at 2: both Ready {:.1} s after kubectl apply",
        applied.elapsed().as_secs_f64()
    ));
    kubectl(
        cluster,
        &[
            "-n",
            "crawlers",
            "delete",
            "proxypool",
            "egress",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    until(
        "the pool's squid Pods gone",
        Duration::from_secs(120),
        || async {
            pods.list(&by_label)
                .await
                .unwrap()
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
    phases.done("ProxyPool deleted: its Proxies and their squid Pods are gone");

    // Leave the cluster as found, for the Helm install (helm.rs).
    kubectl(
        cluster,
        &[
            "delete",
            "-k",
            overlay.to_str().unwrap(),
            "--wait=true",
            "--timeout=180s",
        ],
    )
    .await;
    kubectl(
        cluster,
        &[
            "delete",
            "namespace",
            "crawlers",
            "--wait=true",
            "--timeout=120s",
        ],
    )
    .await;
    phases.done("kubectl delete -k: the install removed");
    print_phases(&phases);
}

fn print_phases(phases: &Phases) {
    for (what, step, total) in phases.all() {
        eprintln!("e2e-cluster phase: {what}: {step:.1} s (at {total:.1} s)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_helm_the_operator_serves_upgrades_and_uninstalls() {
    let mut phases = Phases::new();
    let cluster = Cluster::shared().await;
    let _turn = ONE_INSTALL_AT_A_TIME.lock().await;
    phases.done("single-node cluster ready, the kustomize install (if first) removed");
    helm::install_upgrade_uninstall(cluster, &mut phases).await;
    print_phases(&phases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_from_the_release_manifest_the_operator_serves_the_pinned_image() {
    let mut phases = Phases::new();
    let cluster = Cluster::shared().await;
    let _turn = ONE_INSTALL_AT_A_TIME.lock().await;
    phases.done("single-node cluster ready, the other installs (if first) removed");
    install_yaml::apply_and_delete(cluster, &mut phases).await;
    print_phases(&phases);
}
