//! The Proxy reconciler against a real kube-apiserver (from the harness), with the real test
//! provider component and its loopback instance store. Each test has its own namespace and its
//! own controller watching it; they share one control plane.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use harness::{ControlPlane, TestNamespace};
use kube::api::{Api, DeleteParams};
use proxy_operator::api::{Phase, Proxy};
use proxy_operator::config::{Providers, ProvidersConfig};
use proxy_operator::controller::{self, Context, instance_name};
use tokio::sync::OnceCell;

static CRDS: OnceCell<()> = OnceCell::const_new();

async fn control_plane() -> &'static ControlPlane {
    // RUST_LOG=proxy_operator=debug shows what the operator under test does.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cp = ControlPlane::shared().await;
    CRDS.get_or_init(|| async {
        let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
        cp.kubectl_run(&["apply", "-f", crds], None)
            .await
            .expect("applying the CRDs");
        let rbac = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml");
        cp.kubectl_run(&["apply", "-f", rbac], None)
            .await
            .expect("applying deploy/rbac.yaml");
        cp.kubectl_run(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/proxies.crawl.example.com",
            ],
            None,
        )
        .await
        .expect("CRDs established");
    })
    .await;
    cp
}

/// A controller for one namespace, with the test provider named `store` bound to `store`.
struct Operator {
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    async fn start(ns: &TestNamespace, store: &InstanceStore) -> Operator {
        Self::start_with(ns.client(), ns, store).await
    }

    async fn start_with(
        client: kube::Client,
        ns: &TestNamespace,
        store: &InstanceStore,
    ) -> Operator {
        Self::start_named(client, ns, store, "store").await
    }

    /// An operator whose one provider instance is called `provider_name`.
    async fn start_named(
        client: kube::Client,
        ns: &TestNamespace,
        store: &InstanceStore,
        provider_name: &str,
    ) -> Operator {
        let (engine, _) = engine_with(test_options()).await;
        let config = ProvidersConfig::parse(&format!(
            "providers:\n- name: {provider_name}\n  type: test\n  config: {{endpoint: \"{}\"}}\n  grants: {{http: {{allow: [\"http://{}\"]}}}}\n",
            store.url(),
            store.addr
        ))
        .unwrap();
        let providers = Providers::build(
            &engine,
            &plugins_dir(),
            &config,
            std::path::Path::new("test"),
        )
        .await
        .unwrap();
        let ctx = Arc::new(Context::new(client, Arc::new(providers), "test-operator"));
        let namespace = ns.name().to_string();
        Operator {
            task: tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await }),
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn proxy_yaml(ns: &str, name: &str, provider: &str, extra: &str) -> String {
    format!(
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\n{extra}spec:\n  provider: {provider}\n  placement: {{zone: zone-a}}\n  cloudInit: \"#cloud-config\\n\"\n"
    )
}

/// Polls until `check` holds for the Proxy (or it is gone, when `check` accepts `None`).
async fn wait_for(
    api: &Api<Proxy>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&Proxy>) -> bool,
) -> Option<Proxy> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let proxy = api.get_opt(name).await.unwrap();
        if check(proxy.as_ref()) {
            return proxy;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {name}: {what}; last: {proxy:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(p: Option<&Proxy>) -> Option<Phase> {
    p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_applied_with_kubectl_becomes_ready_and_deleting_it_deletes_the_instance() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-ready").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "alpha", "store", "")),
    )
    .await
    .unwrap();
    let proxy = wait_for(&api, "alpha", "Ready", |p| phase(p) == Some(Phase::Ready))
        .await
        .unwrap();
    let status = proxy.status.unwrap();
    let uid = proxy.metadata.uid.unwrap();
    assert_eq!(
        status.provider_id.as_deref(),
        Some(instance_name(&uid).as_str())
    );
    assert_eq!(status.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.zone.as_deref(), Some("zone-a"));
    assert_eq!(status.observed_generation, proxy.metadata.generation);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Provisioned" && c.status == "True")
    );
    assert!(
        proxy
            .metadata
            .finalizers
            .unwrap()
            .contains(&controller::FINALIZER.to_string())
    );

    let stored = store
        .state
        .instances
        .lock()
        .unwrap()
        .get(&instance_name(&uid))
        .cloned()
        .unwrap();
    assert_eq!(stored["owner"]["uid"], uid.as_str());
    assert_eq!(stored["owner"]["operatorId"], "test-operator");

    let table = cp
        .kubectl_run(&["get", "px", "-n", ns.name()], None)
        .await
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "PROVIDER", "ADDRESS", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..4],
        ["alpha", "Ready", "store", "127.0.0.1"],
        "{table}"
    );

    let described = cp
        .kubectl_run(&["describe", "px", "alpha", "-n", ns.name()], None)
        .await
        .unwrap();
    assert!(
        described.contains("Provisioned") && described.contains("running at 127.0.0.1"),
        "{described}"
    );

    api.delete("alpha", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "alpha", "gone", |p| p.is_none()).await;
    assert!(
        store.state.instances.lock().unwrap().is_empty(),
        "the instance was deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_rejects_invalid_proxies_with_a_readable_message() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-invalid").await.unwrap();
    let cases = [
        (
            "bad-port",
            "spec:\n  provider: store\n  port: 70000\n",
            "spec.port",
        ),
        (
            "unknown-field",
            "spec:\n  provider: store\n  prot: 1\n",
            "unknown field \"spec.prot\"",
        ),
        (
            "bad-provider-name",
            "spec:\n  provider: Store_1\n",
            "spec.provider",
        ),
        (
            "no-provider",
            "spec:\n  port: 3128\n",
            "spec.provider: Required value",
        ),
    ];
    for (name, spec, expected) in cases {
        let yaml = format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {}\n{spec}",
            ns.name()
        );
        let err = cp
            .kubectl_run(&["apply", "-f", "-"], Some(&yaml))
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains(expected), "{name}: {message}");
    }

    // provider is immutable once set.
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "fixed", "store", "")),
    )
    .await
    .unwrap();
    let err = cp
        .kubectl_run(
            &[
                "patch",
                "px",
                "fixed",
                "-n",
                ns.name(),
                "--type=merge",
                "-p",
                r#"{"spec":{"provider":"other"}}"#,
            ],
            None,
        )
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("provider is immutable"),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_provider_is_reported_in_the_status() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-unknown").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "lost", "nowhere", "")),
    )
    .await
    .unwrap();
    let proxy = wait_for(&api, "lost", "UnknownProvider", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UnknownProvider"))
    })
    .await
    .unwrap();
    let status = proxy.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Pending));
    assert!(
        status
            .last_error
            .unwrap()
            .contains("no provider instance `nowhere` in the providers config (configured: store)")
    );
    // A Proxy whose provider is not configured can still be deleted.
    api.delete("lost", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "lost", "gone", |p| p.is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixing_the_providers_config_recovers_a_proxy_with_an_unknown_provider() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-fixed").await.unwrap();
    let store = InstanceStore::start().await;
    let api: Api<Proxy> = ns.api();
    let operator = Operator::start(&ns, &store).await;
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "later", "kvm-home", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "later", "UnknownProvider", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UnknownProvider"))
    })
    .await;
    // The platform engineer adds `kvm-home` to the providers config; the operator restarts.
    drop(operator);
    let _fixed = Operator::start_named(ns.client(), &ns, &store, "kvm-home").await;
    let proxy = wait_for(&api, "later", "Ready", |p| phase(p) == Some(Phase::Ready))
        .await
        .unwrap();
    let status = proxy.status.unwrap();
    assert_eq!(status.last_error, None);
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.reason != "UnknownProvider"),
        "{:?}",
        status.conditions
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_during_create_makes_exactly_one_instance_after_restart() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-restart").await.unwrap();
    let store = InstanceStore::start().await;
    store.set_delay(Duration::from_millis(1500));
    let operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "once", "store", "")),
    )
    .await
    .unwrap();
    // Wait until the create request is at the provider, then kill the operator mid-call.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.state.requests.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the create never reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(operator);
    store.set_delay(Duration::ZERO);

    let _restarted = Operator::start(&ns, &store).await;
    let proxy = wait_for(&api, "once", "Ready", |p| phase(p) == Some(Phase::Ready))
        .await
        .unwrap();
    let uid = proxy.metadata.uid.unwrap();
    let owned: Vec<_> = store
        .state
        .instances
        .lock()
        .unwrap()
        .values()
        .filter(|i| i["owner"]["uid"] == uid.as_str())
        .cloned()
        .collect();
    assert_eq!(owned.len(), 1, "{owned:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_finishes_when_get_fails_and_skip_cleanup_leaves_the_instance() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-delete").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "broken", "store", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "broken", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    store.state.fail_get.store(true, Ordering::SeqCst);
    // A spec change makes the operator look again; get now fails permanently.
    cp.kubectl_run(
        &[
            "patch",
            "px",
            "broken",
            "-n",
            ns.name(),
            "--type=merge",
            "-p",
            r#"{"spec":{"port":3129}}"#,
        ],
        None,
    )
    .await
    .unwrap();
    let failed = wait_for(&api, "broken", "Failed", |p| {
        phase(p) == Some(Phase::Failed)
    })
    .await
    .unwrap();
    assert!(
        failed
            .status
            .unwrap()
            .last_error
            .unwrap()
            .contains("Get failed")
    );
    api.delete("broken", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&api, "broken", "gone", |p| p.is_none()).await;
    assert!(
        store.state.instances.lock().unwrap().is_empty(),
        "deleted despite get failing"
    );
    store.state.fail_get.store(false, Ordering::SeqCst);

    let annotation = format!(
        "  annotations:\n    {}: \"true\"\n",
        controller::SKIP_CLEANUP_ANNOTATION
    );
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "kept", "store", &annotation)),
    )
    .await
    .unwrap();
    wait_for(&api, "kept", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    api.delete("kept", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "kept", "gone", |p| p.is_none()).await;
    assert_eq!(
        store.state.instances.lock().unwrap().len(),
        1,
        "skip-cleanup left the instance"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_one_replica_reconciles_and_a_standby_takes_over() {
    use proxy_operator::leader::{LeaderElection, lead};
    use std::sync::atomic::AtomicBool;

    let cp = control_plane().await;
    let ns = cp.namespace("px-leader").await.unwrap();
    let store = InstanceStore::start().await;
    let api: Api<Proxy> = ns.api();

    let replica = |identity: &str| {
        let (client, namespace, identity) =
            (ns.client(), ns.name().to_string(), identity.to_string());
        let ready = Arc::new(AtomicBool::new(false));
        let url = store.url();
        let addr = store.addr;
        let flag = ready.clone();
        let task = tokio::spawn(async move {
            let (engine, _) = engine_with(test_options()).await;
            let config = ProvidersConfig::parse(&format!(
                "providers:\n- name: store\n  type: test\n  config: {{endpoint: \"{url}\"}}\n  grants: {{http: {{allow: [\"http://{addr}\"]}}}}\n"
            ))
            .unwrap();
            let providers = Providers::build(
                &engine,
                &plugins_dir(),
                &config,
                std::path::Path::new("test"),
            )
            .await
            .unwrap();
            let ctx = Arc::new(Context::new(
                client.clone(),
                Arc::new(providers),
                "test-operator",
            ));
            let election = LeaderElection {
                namespace: namespace.clone(),
                lease_name: "proxy-operator-leader".into(),
                identity,
                lease_seconds: 3,
                renew_before_seconds: 1,
            };
            let ns = namespace.clone();
            lead(client, &election, flag, || async move {
                controller::run(ctx, Some(&ns)).await
            })
            .await
            .unwrap();
        });
        (task, ready)
    };

    let (first, first_ready) = replica("replica-a");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !first_ready.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "replica-a never became the leader"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (second, second_ready) = replica("replica-b");

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "led-1", "store", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "led-1", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    assert!(
        !second_ready.load(Ordering::SeqCst),
        "the standby reports not ready"
    );

    // The leader dies without releasing its lease; the standby takes over after it expires.
    first.abort();
    let killed_at = Instant::now();
    while !second_ready.load(Ordering::SeqCst) {
        assert!(
            killed_at.elapsed() < Duration::from_secs(20),
            "replica-b never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("failover took {:?} (lease 3 s)", killed_at.elapsed());
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "led-2", "store", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "led-2", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    second.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_works_with_only_the_permissions_of_deploy_rbac() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-rbac").await.unwrap();
    let store = InstanceStore::start().await;
    let service_account = cp.client_as(
        "system:serviceaccount:proxy-operator:proxy-operator",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:proxy-operator",
            "system:authenticated",
        ],
    );
    // The account cannot do what the role does not grant.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(service_account.clone(), ns.name());
    let denied = secrets.list(&Default::default()).await.unwrap_err();
    assert!(denied.to_string().contains("forbidden"), "{denied}");

    let _operator = Operator::start_with(service_account, &ns, &store).await;
    let api: Api<Proxy> = ns.api();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "least", "store", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "least", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    let events = cp
        .kubectl_run(&["get", "events.events.k8s.io", "-n", ns.name()], None)
        .await
        .unwrap();
    assert!(
        events.contains("Provisioned"),
        "events were published: {events}"
    );
    api.delete("least", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "least", "gone", |p| p.is_none()).await;
    assert!(store.state.instances.lock().unwrap().is_empty());
}
