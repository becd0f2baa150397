//! The release manifest installed the way the README says ("With a release manifest"), in the
//! same real single-node cluster, one install at a time with the others: `make release`
//! (.ci/release.sh, with the test image as the release's image instead of a full Dockerfile
//! build) writes dist/; its image archive is imported into the node under its digest only (as
//! a registry or `kind load` holds it) → `kubectl apply -f dist/install.yaml` → the providers
//! config for this cluster, the discovery API's TLS Secret and the token → both replicas Ready,
//! running the image by that digest → a kubernetes-provider Proxy `Ready`, leased through the
//! discovery Service, a page fetched through it → `kubectl delete -f dist/install.yaml` removes
//! the install, CRDs included.

use std::path::Path;
use std::time::Instant;

use harness::node::Cluster;
use harness::stack::Phases;
use serde_json::json;

use super::release_parts::{manifest_digest, released};
use super::{
    TOKEN, create_token_secret, install_discovery_tls, kubectl, kubectl_stdin,
    operator_image_archive, operator_pods, repo, rollout_status, start_web_server,
};

const CRAWLERS: &str = "release-crawlers";
const PROXY: &str = "release-egress-1";

/// The providers config a user of this cluster writes into the installed ConfigMap: the squid
/// image the node has, allowed to reach the health target inside the cluster (as in the Helm
/// test's values).
async fn configure_providers(cluster: &Cluster, health_target: &str) {
    let squid = cluster.images().squid.clone();
    let providers = super::helm::values(&squid, health_target, false, 2)["providers"].clone();
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "providers-config", "namespace": "proxy-operator"},
        // JSON is YAML: providers.yaml as the operator reads it.
        "data": {"providers.yaml": json!({"providers": providers}).to_string()},
    });
    kubectl_stdin(cluster, &["apply", "-f", "-"], &config_map.to_string()).await;
    // The node has no uplink: health probes go to a site in the cluster.
    kubectl(
        cluster,
        &[
            "-n",
            "proxy-operator",
            "set",
            "env",
            "deployment/proxy-operator",
            &format!("HEALTH_TARGET={health_target}"),
            "HEALTH_INTERVAL=2s",
        ],
    )
    .await;
}

/// Every operator Pod runs `image` (`NAME@DIGEST`), and the kubelet reports that digest as
/// the image it runs (`kubectl get pod -o jsonpath='{..imageID}'`).
async fn pods_run_the_pinned_image(cluster: &Cluster, image: &str, digest: &str) {
    let pods = operator_pods(cluster).await;
    assert_eq!(pods.len(), 2, "two replicas");
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(spec.image.as_deref(), Some(image), "{name}'s image");
        let status = &pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert!(
            status.image_id.ends_with(digest),
            "{name} runs {} ({}), not {digest}",
            status.image,
            status.image_id
        );
    }
}

pub(super) async fn apply_and_delete(cluster: &Cluster, phases: &mut Phases) {
    let archive = operator_image_archive();
    let scratch = repo().join("target/e2e-cluster/release");
    std::fs::create_dir_all(&scratch).unwrap();
    let dist = tempfile::tempdir_in(&scratch).unwrap();
    let released_in = Instant::now();
    released(dist.path(), &archive, &[]);
    let version = env!("CARGO_PKG_VERSION");
    let image_archive = dist
        .path()
        .join(format!("proxy-operator-{version}.oci.tar"));
    let digest = manifest_digest(&image_archive);
    let install = dist.path().join("install.yaml");
    let pinned = format!("proxy-operator@{digest}");
    let text = std::fs::read_to_string(&install).unwrap();
    assert!(text.contains(&format!("image: {pinned}\n")), "{text:.2000}");
    phases.done(&format!(
        "make release (test image): dist/install.yaml pins {pinned} ({:.1} s)",
        released_in.elapsed().as_secs_f64()
    ));
    cluster
        .import_image(
            &image_archive,
            &format!("docker.io/library/proxy-operator@{digest}"),
        )
        .await
        .expect("importing the release's image into the node");
    let web_ip = start_web_server(cluster).await;
    phases.done("the release's image imported under its digest, web server Pod ready");

    // As the README says: apply, then the Secrets and the providers config (a restart).
    let applied = Instant::now();
    kubectl(cluster, &["apply", "-f", install.to_str().unwrap()]).await;
    create_token_secret(cluster, "proxy-operator-discovery", TOKEN).await;
    install_discovery_tls(cluster, dist.path()).await;
    configure_providers(cluster, &format!("{web_ip}:8080")).await;
    rollout_status(cluster).await;
    pods_run_the_pinned_image(cluster, &pinned, &digest).await;
    phases.done(&format!(
        "kubectl apply -f dist/install.yaml: 2 replicas Ready on {pinned} in {:.1} s",
        applied.elapsed().as_secs_f64()
    ));

    super::helm::apply_proxy(cluster, CRAWLERS, PROXY).await;
    super::helm::proxy_ready(cluster, CRAWLERS, PROXY).await;
    super::helm::lease_and_fetch(cluster, &web_ip, PROXY).await;
    phases.done("a Proxy Ready, leased through the discovery Service, a page fetched through it");

    remove(cluster, &install).await;
    phases.done("kubectl delete -f dist/install.yaml: the install removed");
}

/// The Proxy first (its finalizer is the operator's), then everything install.yaml made.
async fn remove(cluster: &Cluster, install: &Path) {
    let proxy_ref = format!("proxy/{PROXY}");
    let wait = ["--wait=true", "--timeout=180s"];
    kubectl(
        cluster,
        &[&["-n", CRAWLERS, "delete", &proxy_ref][..], &wait].concat(),
    )
    .await;
    kubectl(
        cluster,
        &[&["delete", "-f", install.to_str().unwrap()][..], &wait].concat(),
    )
    .await;
    kubectl(
        cluster,
        &[&["delete", "namespace", CRAWLERS][..], &wait].concat(),
    )
    .await;
    for crd in ["proxies", "proxypools", "providerhealths"] {
        let args = [
            "get",
            "--ignore-not-found",
            "-o",
            "name",
            &format!("crd/{crd}.proxy-operator.dev"),
        ]
        .map(String::from);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert!(
            kubectl(cluster, &args).await.trim().is_empty(),
            "crd/{crd} after kubectl delete -f install.yaml"
        );
    }
}
