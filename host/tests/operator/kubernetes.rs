//! The kubernetes provider component through the real runtime, its `kube` capability and the real
//! API server: a Proxy's squid Pod, ConfigMap, Service and NetworkPolicy are made, read back,
//! listed and removed. The test control plane has no kubelet, so the test writes the Pod status a
//! kubelet would (phase, IP, readiness). The squid.conf the provider writes is run by real squid
//! and used as a proxy. (host/tests/cluster_e2e.rs runs the same provider on a real node.)

use std::time::Duration;

use harness::process::{Check, Proc, Scratch, free_port, wait_for};
use harness::{FileServer, TestNamespace};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use proxy_operator::provider::plugins::types::InstanceState;
use proxy_operator::provider::plugins::{EngineOptions, ProviderInstance};

use super::common::{spec, test_options};
use super::{
    Operator, bound_provider, control_plane, listed_ids, phase, providers_with, proxy_yaml,
    wait_for as wait_for_proxy,
};

async fn kubernetes_provider(ns: &TestNamespace, config: serde_json::Value) -> ProviderInstance {
    let options = EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    };
    let grants = serde_json::json!({
        "kube": {"namespace": ns.name(), "kinds": ["v1/Pod", "v1/ConfigMap", "v1/Service", "networking.k8s.io/v1/NetworkPolicy"], "images": [config["image"]]}
    });
    bound_provider(options, "kubernetes", "in-cluster", &config, grants)
        .await
        .unwrap()
}

/// What the kubelet writes once the container is up and its readiness probe passes.
async fn kubelet_reports_ready(pods: &Api<Pod>, name: &str, ip: &str) {
    let status = serde_json::json!({"status": {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_is_a_squid_pod_whose_config_real_squid_serves() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-k8s-provider").await.unwrap();
    let port = free_port().unwrap();
    let provider = kubernetes_provider(
        &ns,
        serde_json::json!({"image": "registry.example/squid:6", "allowFrom": ["127.0.0.0/8"], "allowDestinations": ["127.0.0.1/32"]}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let services: Api<Service> = Api::namespaced(ns.client(), ns.name());
    let policies: Api<NetworkPolicy> = Api::namespaced(ns.client(), ns.name());
    let mut want = spec("px-k8s-one", serde_json::json!({}));
    want.port = port;
    want.labels = vec![("team".into(), "crawl".into())];

    let created = provider.create(want.clone()).await.unwrap();
    assert_eq!(created.provider_id, "px-k8s-one");
    assert_eq!(created.state, InstanceState::Provisioning);
    // The Service's cluster IP is the address from the start (the Pod is not running yet).
    let created_address = created.address.clone().expect("the Service's address");
    let pod = pods.get("px-k8s-one").await.unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["plugin.proxy-operator.dev/owner-uid"],
        "uid-px-k8s-one"
    );
    let pod_spec = pod.spec.clone().unwrap();
    assert_eq!(
        pod_spec.containers[0].image.as_deref(),
        Some("registry.example/squid:6")
    );
    assert_eq!(
        pod_spec.node_selector.unwrap()["topology.kubernetes.io/zone"],
        "zone-a"
    );
    assert_eq!(pod_spec.automount_service_account_token, Some(false));
    // The Proxy's labels, under the only prefix the host admits for a plugin's labels.
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()["plugin.proxy-operator.dev/team"],
        "crawl"
    );
    // The Service in front of it (confined by the host to this instance's Pods) gives the
    // address; the NetworkPolicy admits allowFrom on the squid port.
    let service = services.get("px-k8s-one").await.unwrap();
    let service_spec = service.spec.unwrap();
    assert_eq!(service_spec.type_.as_deref(), Some("ClusterIP"));
    let selector = service_spec.selector.unwrap();
    assert_eq!(selector["plugin.proxy-operator.dev/proxy"], "px-k8s-one");
    assert_eq!(selector["proxy-operator.dev/provider"], "in-cluster");
    assert_eq!(service_spec.ports.unwrap()[0].port, i32::from(port));
    let cluster_ip = service_spec.cluster_ip.unwrap();
    assert_eq!(created_address, cluster_ip);
    let policy = policies.get("px-k8s-one").await.unwrap().spec.unwrap();
    let ingress = &policy.ingress.unwrap()[0];
    assert_eq!(
        ingress.from.as_ref().unwrap()[0]
            .ip_block
            .as_ref()
            .unwrap()
            .cidr,
        "127.0.0.0/8"
    );
    assert_eq!(
        policy.pod_selector.unwrap().match_labels.unwrap()["plugin.proxy-operator.dev/proxy"],
        "px-k8s-one"
    );
    // Idempotent: the same instance again, no second Pod.
    let again = provider.create(want.clone()).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);

    kubelet_reports_ready(&pods, "px-k8s-one", "127.0.0.1").await;
    let running = provider.get("px-k8s-one").await.unwrap();
    assert_eq!(running.state, InstanceState::Running);
    assert_eq!(running.address.as_deref(), Some(cluster_ip.as_str()));
    assert_eq!(running.port, port);
    assert_eq!(running.owner.unwrap().name, "proxy-px-k8s-one");
    assert_eq!(listed_ids(&provider).await, ["px-k8s-one"]);
    assert!(provider.check().await.unwrap()[0].ok);

    // The squid.conf in the ConfigMap, run by real squid: a crawler on loopback (in allowFrom)
    // fetches through it; CONNECT to a port other than 443 is refused; so is every destination
    // in the cluster's and the node's network but the one site in allowDestinations.
    let conf = maps.get("px-k8s-one-squid").await.unwrap().data.unwrap()["squid.conf"].clone();
    super::common::own_network::assert_squid_parses(&conf);
    super::common::own_network::assert_refuses_its_own_network(&conf).await;
    let (mut squid, _scratch) = run_squid(&conf, port).await;
    let files = FileServer::start().await.unwrap();
    files.serve("/page", b"through squid".to_vec());
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://127.0.0.1:{port}")).unwrap())
        .build()
        .unwrap();
    let page = client.get(files.url("/page")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.text().await.unwrap(), "through squid");
    let refused = proxy_operator::lifecycle::health::probe(
        "127.0.0.1",
        port,
        proxy_operator::support::socks::ProxyProtocol::Http,
        &files.addr().to_string(),
        None,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        refused,
        Err(proxy_operator::lifecycle::health::ProbeFailure::Status(403))
    );
    squid.kill();

    provider.delete("px-k8s-one").await.unwrap();
    assert!(pods.get_opt("px-k8s-one").await.unwrap().is_none());
    assert!(maps.get_opt("px-k8s-one-squid").await.unwrap().is_none());
    assert!(services.get_opt("px-k8s-one").await.unwrap().is_none());
    assert!(policies.get_opt("px-k8s-one").await.unwrap().is_none());
    provider
        .delete("px-k8s-one")
        .await
        .expect("deleting again is fine");
    assert!(listed_ids(&provider).await.is_empty());
}

/// Credentials: the ConfigMap's squid.conf requires basic auth against the password file the
/// provider wrote from the hash (never the password), real squid with its real helper checks it,
/// and `set-credentials` rewrites the file in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_with_credentials_requires_them_and_set_credentials_rotates_them() {
    use proxy_operator::lifecycle::health::{ProbeFailure, probe};
    use proxy_operator::provider::credentials::ProxyLogin;

    let cp = control_plane().await;
    let ns = cp.namespace("px-k8s-creds").await.unwrap();
    let port = free_port().unwrap();
    let provider = kubernetes_provider(
        &ns,
        serde_json::json!({"image": "registry.example/squid:6", "allowFrom": ["127.0.0.0/8"], "allowDestinations": ["127.0.0.1/32"]}),
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let login = ProxyLogin::generate("egress-creds");
    let mut want = spec("px-k8s-creds", serde_json::json!({}));
    want.port = port;
    want.credentials = Some(login.hashed());
    provider.create(want).await.unwrap();
    let pod = pods.get("px-k8s-creds").await.unwrap().spec.unwrap();
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "squid-auth")
        .expect("the password file's mount")
        .clone();
    assert_eq!(mount.mount_path, "/etc/squid/proxy-operator");
    assert_eq!(
        mount.sub_path, None,
        "a directory mount, which the kubelet updates"
    );

    // squid as the Pod runs it, the password file where the Pod would see it.
    let data = maps.get("px-k8s-creds-squid").await.unwrap().data.unwrap();
    assert!(!data["passwd"].contains(login.password()));
    let mut squid = PodSquid::start(&data, port).await;
    let files = FileServer::start().await.unwrap();
    files.serve("/page", b"through squid".to_vec());
    let client = |login: Option<&ProxyLogin>| {
        let url = match login {
            Some(login) => login.proxy_url(
                proxy_operator::support::socks::ProxyProtocol::Http,
                "127.0.0.1",
                port,
            ),
            None => format!("http://127.0.0.1:{port}"),
        };
        reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(url).unwrap())
            .build()
            .unwrap()
    };
    let status_with = |login: Option<ProxyLogin>| {
        let (request, url) = (client(login.as_ref()), files.url("/page"));
        async move { request.get(url).send().await.unwrap().status() }
    };
    assert_eq!(status_with(None).await, 407);
    let stranger = ProxyLogin::generate("egress-creds");
    assert_eq!(status_with(Some(stranger)).await, 407);
    assert_eq!(status_with(Some(login.clone())).await, 200);
    // CONNECT outside connectPorts stays refused, credentials or not.
    let target = files.addr().to_string();
    let connect = probe(
        "127.0.0.1",
        port,
        proxy_operator::support::socks::ProxyProtocol::Http,
        &target,
        Some(&login),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(connect, Err(ProbeFailure::Status(403)));

    // Rotation: the provider rewrites the ConfigMap's password file (the kubelet brings it into
    // the Pod; here the test does), and squid's helper reads it again.
    let new = ProxyLogin::generate("egress-creds");
    provider
        .set_credentials("px-k8s-creds", new.hashed())
        .await
        .unwrap();
    let data = maps.get("px-k8s-creds-squid").await.unwrap().data.unwrap();
    assert!(data["squid.conf"].contains("auth_param basic program"));
    squid.set_passwords(&data["passwd"]);
    assert_eq!(status_with(Some(new.clone())).await, 200);
    wait_for(
        "the old password refused",
        Duration::from_secs(30),
        || async {
            match status_with(Some(login.clone())).await.as_u16() {
                407 => Check::Ready(()),
                other => Check::NotYet(other.to_string()),
            }
        },
    )
    .await
    .unwrap();
    squid.proc.kill();

    // A proxy made without credentials cannot be given some: the provider says why.
    let mut open = spec("px-k8s-open", serde_json::json!({}));
    open.port = port;
    provider.create(open).await.unwrap();
    let refused = provider
        .set_credentials("px-k8s-open", new.hashed())
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("made without credentials"),
        "{refused}"
    );
}

/// What the kubelet and the squid image make of the provider's ConfigMap: squid runs its
/// squid.conf, and finds the password file (when the proxy has credentials) where the Pod's
/// directory mount would put it, here a scratch directory.
struct PodSquid {
    proc: Proc,
    _run: Scratch,
    auth: Scratch,
}

impl PodSquid {
    async fn start(data: &std::collections::BTreeMap<String, String>, port: u16) -> PodSquid {
        let auth = Scratch::new("k8s-squid-auth").unwrap();
        let passwd = auth.path().join("passwd");
        let mut conf = data["squid.conf"].clone();
        if let Some(lines) = data.get("passwd") {
            std::fs::write(&passwd, lines).unwrap();
            Self::readable_by_squid(auth.path(), &passwd);
            conf = conf.replace("/etc/squid/proxy-operator/passwd", passwd.to_str().unwrap());
        }
        let (proc, run) = run_squid(&conf, port).await;
        PodSquid {
            proc,
            _run: run,
            auth,
        }
    }

    /// The kubelet's update of the mounted ConfigMap after the provider rewrote it.
    fn set_passwords(&self, lines: &str) {
        let passwd = self.auth.path().join("passwd");
        harness::squid::replace_password_file(&passwd, lines).unwrap();
        Self::readable_by_squid(self.auth.path(), &passwd);
    }

    /// squid's helper runs as `proxy`: it must read the password file.
    fn readable_by_squid(dir: &std::path::Path, file: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        for path in [dir, file] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}

/// Runs real squid with `conf` until dropped; returns when it accepts connections on `port`.
async fn run_squid(conf: &str, port: u16) -> (Proc, Scratch) {
    let scratch = Scratch::new("k8s-squid").unwrap();
    let conf_path = scratch.path().join("squid.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut run = std::process::Command::new("/usr/sbin/squid");
    run.args(["-N", "-f"]).arg(&conf_path);
    // As the Pod runs it: as the non-root user of its securityContext (13, `proxy`), from start.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let (uid, gid) = harness::squid::user_ids("proxy").expect("user proxy (Debian squid)");
        assert_eq!(uid, 13, "the kubernetes provider's default runAsUser");
        for path in [scratch.path(), conf_path.as_path()] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        run.uid(uid).gid(gid);
    }
    let squid = Proc::spawn("squid", run, &scratch.path().join("squid.log")).unwrap();
    wait_for(
        "squid from the provider's config",
        Duration::from_secs(30),
        || async {
            match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                Ok(_) => Check::Ready(()),
                Err(e) => Check::NotYet(e.to_string()),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", squid.log_tail(20)));
    (squid, scratch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_of_the_kubernetes_provider_becomes_healthy_through_its_own_squid_conf() {
    use proxy_operator::api::{Phase, Proxy};
    use proxy_operator::leasing::leases::{LeaseMetrics, LeaseOptions, LeaseStore};
    use proxy_operator::lifecycle::health::{HealthEngine, HealthOptions, ProbeMetrics};

    let cp = control_plane().await;
    let ns = cp.namespace("px-k8s-e2e").await.unwrap();
    let target = FileServer::start().await.unwrap();
    let port = free_port().unwrap();
    let providers = providers_with(
        EngineOptions {
            kube: Some(ns.client()),
            ..test_options()
        },
        &format!(
        "providers:\n- name: in-cluster\n  type: kubernetes\n  config: {{image: \"registry.example/squid:6\", allowFrom: [127.0.0.0/8], connectPorts: [{}], allowDestinations: [127.0.0.1/32], address: Pod}}\n  grants: {{kube: {{namespace: {}, kinds: [v1/Pod, v1/ConfigMap, v1/Service, networking.k8s.io/v1/NetworkPolicy], images: [\"registry.example/squid:6\"]}}}}\n",
        target.addr().port(),
        ns.name(),
        ),
    )
    .await;
    let providers = proxy_operator::provider::providers::ProviderSet::new(providers);
    let operator = Operator::with_providers(ns.client(), &ns, providers.clone());
    let registry = prometheus::Registry::new();
    let leases = std::sync::Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::register(&registry).unwrap(),
        None,
    ));
    leases.restore(Default::default());
    let health = HealthEngine::new(
        ns.client(),
        providers,
        leases.clone(),
        HealthOptions {
            interval: Duration::from_millis(200),
            timeout: Duration::from_secs(2),
            target: target.addr().to_string(),
            ..HealthOptions::default()
        },
        ProbeMetrics::register(&registry).unwrap(),
        operator.credentials.clone(),
    );
    let (_suspects_tx, suspects) = tokio::sync::mpsc::channel(1);
    let health = tokio::spawn(health.run(Some(ns.name().to_string()), suspects));

    let yaml = proxy_yaml(ns.name(), "in-cluster-1", "in-cluster", "")
        .replace(
            "placement: {zone: zone-a}",
            "placement: {zone: zone-a}\n  port: PORT",
        )
        .replace("PORT", &port.to_string());
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: Api<Proxy> = ns.api();
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let provisioning = wait_for_proxy(&proxies, "in-cluster-1", "the Pod made", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.provider_id.is_some())
    })
    .await
    .unwrap();
    let pod_name = provisioning.status.unwrap().provider_id.unwrap();
    // The kubelet's part: the container runs (real squid, from the ConfigMap) and is ready.
    let data = maps
        .get(&format!("{pod_name}-squid"))
        .await
        .unwrap()
        .data
        .unwrap();
    let _squid = PodSquid::start(&data, port).await;
    kubelet_reports_ready(&pods, &pod_name, "127.0.0.1").await;

    let ready = wait_for_proxy(&proxies, "in-cluster-1", "Ready and Healthy", |p| {
        phase(p) == Some(Phase::Ready)
            && p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Healthy" && c.status == "True")
            })
    })
    .await
    .unwrap();
    let status = ready.status.unwrap();
    assert_eq!(status.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.port, Some(port));

    cp.kubectl_run(
        &[
            "delete",
            "proxy",
            "in-cluster-1",
            "-n",
            ns.name(),
            "--wait=true",
        ],
        None,
    )
    .await
    .unwrap();
    assert!(pods.get_opt(&pod_name).await.unwrap().is_none());
    assert!(
        maps.get_opt(&format!("{pod_name}-squid"))
            .await
            .unwrap()
            .is_none()
    );
    health.abort();
}

/// The conformance suite of `proxy-operator plugin test` (as a library) against the kubernetes
/// provider on the real API server: Pod and ConfigMap made, read, listed and deleted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_provider_is_conformant() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-k8s-conformance").await.unwrap();
    let (engine, _) = super::common::engine_with(EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    })
    .await;
    let grants = serde_json::from_value(serde_json::json!({
        "kube": {"namespace": ns.name(), "kinds": ["v1/Pod", "v1/ConfigMap", "v1/Service", "networking.k8s.io/v1/NetworkPolicy"], "images": ["registry.example/squid:6"]}
    }))
    .unwrap();
    let config =
        serde_json::json!({"image": "registry.example/squid:6", "allowFrom": ["127.0.0.0/8"]});
    super::common::assert_conformant(&engine, "kubernetes", config, grants, None).await;
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let left = pods.list(&Default::default()).await.unwrap();
    assert!(left.items.is_empty(), "nothing left behind");
}
