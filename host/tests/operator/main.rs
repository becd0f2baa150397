//! The Proxy reconciler against a real kube-apiserver (from the harness), with the real test
//! provider component and its loopback instance store. Each test has its own namespace and its
//! own controller watching it; they share one control plane.

mod access;
mod aws;
mod caps;
#[path = "../common/mod.rs"]
mod common;
mod crawler_examples;

mod credentials;
mod events;
mod gcp;
mod health;
mod kube_capability;
mod kube_sandbox;
mod kubernetes;
mod kvm;
mod leases;
mod pools;
mod quotas;
mod reload;
mod status_page;
mod tls_metrics;
mod upstream;
mod upstream_socks5;
mod world;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use harness::{ControlPlane, TestNamespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxy_operator::api::{Phase, Proxy};
use proxy_operator::lifecycle::abandoned::AbandonedRecord;
use proxy_operator::lifecycle::controller::{self, Context, instance_name};
use proxy_operator::provider::config::ProvidersConfig;
use proxy_operator::provider::providers::Providers;
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
        let namespaces = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/namespace.yaml");
        cp.kubectl_run(&["apply", "-f", namespaces], None)
            .await
            .expect("applying deploy/namespace.yaml");
        let rbac = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml");
        cp.kubectl_run(&["apply", "-f", rbac], None)
            .await
            .expect("applying deploy/rbac.yaml");
        cp.kubectl_run(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/proxies.proxy-operator.dev",
                "crd/proxypools.proxy-operator.dev",
                "crd/proxyquotas.proxy-operator.dev",
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
    /// The proxies' credentials, as the controller keeps them (for a health engine beside it).
    credentials: proxy_operator::provider::credentials::CredentialsBook,
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
        let providers = providers_for(&format!(
            "providers:\n{}",
            store_provider(provider_name, store)
        ))
        .await;
        Self::with_providers(client, ns, providers)
    }

    /// The controller of `ns` with these providers.
    fn with_providers(
        client: kube::Client,
        ns: &TestNamespace,
        providers: impl Into<proxy_operator::provider::providers::ProviderSet>,
    ) -> Operator {
        // As `proxy-operator run` does, with the test namespace as the operator's.
        let credentials = proxy_operator::provider::credentials::CredentialsBook::default();
        let ctx = Arc::new(
            Context::new(client, providers, "test-operator", credentials.clone())
                .with_abandoned(AbandonedRecord::new(ns.name(), "test-operator")),
        );
        let namespace = ns.name().to_string();
        Operator {
            task: tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await }),
            credentials,
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
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\n{extra}spec:\n  provider: {provider}\n  placement: {{zone: zone-a}}\n  cloudInit: \"#cloud-config\\n\"\n"
    )
}

/// `kubectl apply`s the Proxy of [`proxy_yaml`], as a user would.
async fn apply_proxy(cp: &ControlPlane, ns: &str, name: &str, provider: &str, extra: &str) {
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns, name, provider, extra)),
    )
    .await
    .unwrap();
}

/// Polls until `check` holds for the Proxy (or it is gone, when `check` accepts `None`).
async fn wait_for(
    api: &Api<Proxy>,
    name: &str,
    what: &str,
    check: impl Fn(Option<&Proxy>) -> bool,
) -> Option<Proxy> {
    wait_for_within(api, name, what, Duration::from_secs(60), check).await
}

/// [`wait_for`] with its own deadline, for a step whose time is the machine's (a VM's image
/// copied over SSH on a busy runner) more than the operator's.
async fn wait_for_within(
    api: &Api<Proxy>,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(Option<&Proxy>) -> bool,
) -> Option<Proxy> {
    let deadline = Instant::now() + within;
    loop {
        // A failed read (the API server busy) is retried until the deadline.
        let proxy = match api.get_opt(name).await {
            Ok(proxy) => proxy,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {name}: {what}; last: reading it failed: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
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

/// Applies a Proxy of provider `store` with kubectl and waits until it is Ready.
async fn apply_ready(cp: &ControlPlane, ns: &TestNamespace, api: &Api<Proxy>, name: &str) -> Proxy {
    apply_proxy(cp, ns.name(), name, "store", "").await;
    wait_for(api, name, "Ready", |p| phase(p) == Some(Phase::Ready))
        .await
        .unwrap()
}

/// The events of `ns`, as the API returns them (`events.k8s.io/v1`).
async fn events_of(cp: &ControlPlane, ns: &TestNamespace) -> Vec<serde_json::Value> {
    let text = cp
        .kubectl_run(
            &["get", "events.events.k8s.io", "-n", ns.name(), "-o", "json"],
            None,
        )
        .await
        .unwrap();
    let list: serde_json::Value = serde_json::from_str(&text).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
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

    let proxy = apply_ready(cp, &ns, &api, "alpha").await;
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
            .contains(&proxy_operator::api::labels::FINALIZER.to_string())
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
        ["NAME", "PHASE", "REASON", "PROVIDER", "ADDRESS", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..5],
        ["alpha", "Ready", "InstanceRunning", "store", "127.0.0.1"],
        "{table}"
    );
    // `spec.provider` is a field selector (selectableFields).
    let selected = cp
        .kubectl_run(
            &[
                "get",
                "px",
                "-n",
                ns.name(),
                "--field-selector",
                "spec.provider=store",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(
        selected.contains("proxy.proxy-operator.dev/alpha"),
        "{selected}"
    );
    let none = cp
        .kubectl_run(
            &[
                "get",
                "px",
                "-n",
                ns.name(),
                "--field-selector",
                "spec.provider=other",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(
        none.trim().is_empty() || none.contains("No resources"),
        "{none}"
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

/// A deletion is cleaned up once: the status write that marks the Proxy `Deleting` triggers a
/// second reconcile, which used to see the stale object (finalizer still there) and call the
/// provider's `delete` again, publish `Deleted` again and fail on the finalizer with NotFound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_deletion_calls_the_providers_delete_once() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-delete-once").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let name = format!("once-{round}");
        apply_ready(cp, &ns, &api, &name).await;
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        wait_for(&api, &name, "gone", |p| p.is_none()).await;
    }
    // A second cleanup would come right after the first: give it the time to happen.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        store.state.deletes.load(Ordering::SeqCst),
        ROUNDS,
        "one provider delete per deleted Proxy"
    );
    assert!(store.ids().is_empty(), "{:?}", store.ids());
    let events = events_of(cp, &ns).await;
    let deleted: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["reason"] == "Deleted").collect();
    assert_eq!(deleted.len(), ROUNDS, "{deleted:#?}");
    for event in deleted {
        assert!(
            event["series"].is_null(),
            "`Deleted` published more than once: {event:#}"
        );
    }
}

/// The controller writes a status only over the version it decided from: a decision made before
/// the health engine's verdict landed must not put back `Ready` "InstanceRunning" (or anything
/// else that verdict replaced). The refused write is `Stale`, and the decision is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_decided_from_an_older_view_is_not_written_over_a_newer_one() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-stale-view").await.unwrap();
    let api: Api<Proxy> = ns.api();
    apply_proxy(cp, ns.name(), "viewed", "store", "").await;
    let older = api.get("viewed").await.unwrap();
    // Someone else (the health engine) writes after that read.
    let verdict = serde_json::json!({
        "status": {"phase": "Ready", "conditions": [{
            "type": "Healthy", "status": "True", "reason": "ProbeSucceeded",
            "message": "CONNECT through the proxy passed", "lastTransitionTime": "2026-12-02T00:00:00Z",
        }]}
    });
    api.patch_status("viewed", &PatchParams::default(), &Patch::Merge(&verdict))
        .await
        .unwrap();
    let decided = proxy_operator::api::ProxyStatus {
        phase: Some(Phase::Provisioning),
        ..Default::default()
    };
    let written = controller::write_status(&api, &older, decided.clone())
        .await
        .unwrap();
    assert!(
        matches!(written, controller::StatusWrite::Stale),
        "written over a newer version"
    );
    let now = api.get("viewed").await.unwrap();
    assert_eq!(
        phase(Some(&now)),
        Some(Phase::Ready),
        "the newer status stays"
    );

    // Decided from the current version, the same status is written, and the Proxy as stored
    // comes back for what the reconcile writes next.
    let written = controller::write_status(&api, &now, decided).await.unwrap();
    let controller::StatusWrite::Stored(stored) = written else {
        panic!("a write over the current version was not stored");
    };
    assert_eq!(phase(Some(&stored)), Some(Phase::Provisioning));
    assert_ne!(
        stored.metadata.resource_version,
        now.metadata.resource_version
    );
    assert_eq!(
        phase(api.get("viewed").await.ok().as_ref()),
        Some(Phase::Provisioning)
    );
}

/// With `--health-interval 0s` nothing will ever probe the proxy: `Ready` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_probing_off_ready_says_so() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-noprobe").await.unwrap();
    let store = InstanceStore::start().await;
    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let ctx = Arc::new(
        Context::new(ns.client(), providers, "test-operator", Default::default())
            .with_health_probing(false),
    );
    let namespace = ns.name().to_string();
    let _operator = Operator {
        task: tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await }),
        credentials: Default::default(),
    };
    let api: Api<Proxy> = ns.api();
    let proxy = apply_ready(cp, &ns, &api, "unprobed").await;
    let ready = proxy
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert!(
        ready
            .message
            .contains("health probing is off (--health-interval 0s)"),
        "{}",
        ready.message
    );
}

/// A leader that loses and regains leadership runs the controller again on the same context:
/// the second run watches the credentials Secrets too, so a rotated password still reaches the
/// proxy (the first run's watch once took the only writer, and a second run had none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_run_again_after_a_stop_still_rotates_credentials() {
    use k8s_openapi::api::core::v1::Secret;
    use sha_crypt::{PasswordVerifier, ShaCrypt};
    use tokio_util::sync::CancellationToken;

    let cp = control_plane().await;
    let ns = cp.namespace("px-rerun").await.unwrap();
    let store = InstanceStore::start().await;
    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let ctx = Arc::new(Context::new(
        ns.client(),
        providers,
        "test-operator",
        Default::default(),
    ));
    let run = |stop: &CancellationToken| {
        let (ctx, namespace, stop) = (ctx.clone(), ns.name().to_string(), stop.clone());
        tokio::spawn(async move {
            controller::run_until(ctx, Some(&namespace), stop.cancelled_owned()).await
        })
    };
    // The password hash the provider was last given for the Proxy `uid`.
    let given_hash = |uid: &str| {
        let instances = store.state.instances.lock().unwrap();
        instances
            .values()
            .find(|i| i["owner"]["uid"] == uid)
            .and_then(|i| {
                i["credentials"]["passwordHash"]
                    .as_str()
                    .map(str::to_string)
            })
    };

    let first_stop = CancellationToken::new();
    let first = run(&first_stop);
    let api: Api<Proxy> = ns.api();
    let uid = apply_ready(cp, &ns, &api, "rerun")
        .await
        .metadata
        .uid
        .unwrap();
    first_stop.cancel();
    first.await.unwrap();

    let second_stop = CancellationToken::new();
    let _second = run(&second_stop);
    let _stop_second_at_the_end = second_stop.drop_guard();
    let rotated = "r0tated-after-a-second-run";
    let secrets: Api<Secret> = ns.api();
    secrets
        .patch(
            "rerun-proxy-credentials",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"password": rotated}})),
        )
        .await
        .unwrap();
    harness::process::wait_for(
        "the rotated password given to the provider",
        Duration::from_secs(60),
        || async {
            match given_hash(&uid) {
                Some(hash)
                    if ShaCrypt::SHA512
                        .verify_password(
                            rotated.as_bytes(),
                            &sha_crypt::PasswordHash::new(&hash).unwrap(),
                        )
                        .is_ok() =>
                {
                    harness::process::Check::Ready(())
                }
                other => harness::process::Check::NotYet(format!("hash {other:?}")),
            }
        },
    )
    .await
    .unwrap();
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
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {}\n{spec}",
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
    apply_proxy(cp, ns.name(), "fixed", "store", "").await;
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

/// cloudInit and vendorData are bounded in the CRD (256 KiB each, docs/architecture.md), so the
/// API server refuses a larger value naming the field, instead of etcd refusing the whole
/// request without saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_cloud_init_is_refused_naming_the_field() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-big").await.unwrap();
    let api: Api<Proxy> = ns.api();
    const LIMIT: usize = 256 * 1024;
    let proxy = |name: &str, field: &str, len: usize| -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": name},
            "spec": {"provider": "store", field: "#".repeat(len)},
        }))
        .unwrap()
    };
    let create = kube::api::PostParams::default();
    for (field, len) in [
        ("cloudInit", 2 << 20),
        ("cloudInit", LIMIT + 1),
        ("vendorData", LIMIT + 1),
    ] {
        let err = api
            .create(&create, &proxy("big", field, len))
            .await
            .expect_err("too large");
        let message = err.to_string();
        assert!(
            message.contains(&format!("spec.{field}")) && message.contains("262144"),
            "{field} of {len}: {message}"
        );
    }
    // At the limit, both at once: accepted.
    let mut at_limit = proxy("at-limit", "cloudInit", LIMIT);
    at_limit.spec.vendor_data = Some("#".repeat(LIMIT));
    api.create(&create, &at_limit).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_provider_is_reported_in_the_status() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-unknown").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    apply_proxy(cp, ns.name(), "lost", "nowhere", "").await;
    let proxy = wait_for(&api, "lost", "UnknownProvider", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UnknownProvider"))
    })
    .await
    .unwrap();
    let status = proxy.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Pending));
    let message = status.last_error.unwrap();
    assert!(
        message
            .contains("no provider instance `nowhere` in the providers config (configured: store)"),
        "{message}"
    );
    // spec.provider is immutable: the advice must be what works.
    assert!(
        message.contains("add `nowhere` to the providers config")
            && message.contains("recreate the Proxy"),
        "{message}"
    );
    assert!(!message.contains("fix spec.provider"), "{message}");
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
    apply_proxy(cp, ns.name(), "later", "kvm-home", "").await;
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
    apply_proxy(cp, ns.name(), "once", "store", "").await;
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

/// `status.placement` is written before the create call, and that write wakes the controller
/// again while the cache may not show the create's result yet: each Proxy is still created with
/// one create call (the retry path reads the live Proxy). A race: without the live read, about
/// one run in two of this test saw a sixth create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_placement_written_before_a_create_does_not_make_a_second_create_call() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-one-create").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let names = ["one", "two", "three", "four", "five"];
    for name in names {
        let proxy = apply_ready(cp, &ns, &api, name).await;
        let placement = proxy.status.unwrap().placement.unwrap();
        assert_eq!(placement.provider, "store");
        assert_eq!(placement.zone.as_deref(), Some("zone-a"));
    }
    assert_eq!(store.state.puts.load(Ordering::SeqCst), names.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_finishes_when_get_fails_and_skip_cleanup_leaves_the_instance() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-delete").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();

    apply_ready(cp, &ns, &api, "broken").await;
    store.state.fail_get.store(true, Ordering::SeqCst);
    // A spec change (the one field that may change) makes the operator look again; get now
    // fails permanently.
    cp.kubectl_run(
        &[
            "patch",
            "px",
            "broken",
            "-n",
            ns.name(),
            "--type=merge",
            "-p",
            r#"{"spec":{"recreateOnLoss":true}}"#,
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
        proxy_operator::api::labels::SKIP_CLEANUP_ANNOTATION
    );
    apply_proxy(cp, ns.name(), "kept", "store", &annotation).await;
    wait_for(&api, "kept", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    api.delete("kept", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "kept", "gone", |p| p.is_none()).await;
    assert_eq!(
        store.state.instances.lock().unwrap().len(),
        1,
        "skip-cleanup left the instance"
    );
    // The orphan GC, however eager, leaves it: the Proxy recorded that it was left on purpose.
    let gc_options = proxy_operator::lifecycle::gc::GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::ZERO,
        dry_run: false,
        namespace: Some(ns.name().to_string()),
        allow_namespaced: false,
        parallelism: 2,
        abandoned: Some(AbandonedRecord::new(ns.name(), "test-operator")),
    };
    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let metrics =
        proxy_operator::lifecycle::gc::GcMetrics::register(&prometheus::Registry::new()).unwrap();
    let reports = proxy_operator::lifecycle::gc::pass(
        &ns.client(),
        &providers,
        "test-operator",
        &gc_options,
        &metrics,
    )
    .await
    .unwrap();
    assert!(reports[0].1.found.is_empty(), "{:?}", reports[0].1);
    assert_eq!(
        store.state.instances.lock().unwrap().len(),
        1,
        "the GC deleted it"
    );
    // Without the record it would have been collected.
    let unrecorded = proxy_operator::lifecycle::gc::GcOptions {
        abandoned: None,
        dry_run: true,
        ..gc_options
    };
    let reports = proxy_operator::lifecycle::gc::pass(
        &ns.client(),
        &providers,
        "test-operator",
        &unrecorded,
        &metrics,
    )
    .await
    .unwrap();
    assert_eq!(reports[0].1.found.len(), 1, "{:?}", reports[0].1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_one_replica_reconciles_and_a_standby_takes_over() {
    use proxy_operator::support::leader::{LeaderElection, lead};
    use std::sync::atomic::AtomicBool;

    let cp = control_plane().await;
    let ns = cp.namespace("px-leader").await.unwrap();
    let store = InstanceStore::start().await;
    let api: Api<Proxy> = ns.api();

    let replica = |identity: &str| {
        let (client, namespace, identity) =
            (ns.client(), ns.name().to_string(), identity.to_string());
        let ready = Arc::new(AtomicBool::new(false));
        let providers_text = format!("providers:\n{}", store_provider("store", &store));
        let flag = ready.clone();
        let task = tokio::spawn(async move {
            let providers = providers_for(&providers_text).await;
            let ctx = Arc::new(Context::new(
                client.clone(),
                providers,
                "test-operator",
                Default::default(),
            ));
            let election = LeaderElection {
                namespace: namespace.clone(),
                lease_name: "proxy-operator-leader".into(),
                identity,
                lease_seconds: 3,
                renew_before_seconds: 1,
            };
            let ns = namespace.clone();
            let stop = tokio_util::sync::CancellationToken::new();
            let step_down = || flag.store(false, Ordering::SeqCst);
            lead(client, &election, &stop, step_down, || async {
                flag.store(true, Ordering::SeqCst);
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

    apply_ready(cp, &ns, &api, "led-1").await;
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
    apply_ready(cp, &ns, &api, "led-2").await;
    second.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_works_with_only_the_permissions_of_deploy_rbac() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-rbac").await.unwrap();
    let store = InstanceStore::start().await;
    let service_account = operator_account(cp);
    // The account cannot do what the role does not grant.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(service_account.clone(), ns.name());
    // It makes, reads and patches each Proxy's credentials Secret, but never deletes a Secret.
    let denied = secrets
        .delete("anything", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("forbidden"), "{denied}");

    let _operator = Operator::start_with(service_account.clone(), &ns, &store).await;
    let api: Api<Proxy> = ns.api();
    apply_ready(cp, &ns, &api, "least").await;
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

    // The lease table is written into and read back from the operator's own namespace.
    use proxy_operator::leasing::leases::{
        LeaseMetrics, LeaseOptions, LeasePersistence, LeaseStore,
    };
    // Only the names of the default operator id are granted (deploy/rbac.yaml says so).
    let foreign = LeasePersistence::new(
        service_account.clone(),
        "proxy-operator",
        &format!("{}-leases", ns.name()),
    );
    let refused = foreign.load().await.unwrap_err().to_string();
    assert!(refused.contains("forbidden"), "{refused}");
    let persistence = LeasePersistence::new(
        service_account.clone(),
        "proxy-operator",
        "proxy-operator-leases",
    );
    let table = LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    );
    persistence.restore_into(&table).await.unwrap();
    // A journal segment (create), two checkpoints (create parts, patch the manifest, delete
    // what they cover by label), and a restore (get the manifest, list parts and segments).
    table.set_provisioned(vec![proxy_operator::leasing::leases::ProvisionedProxy {
        key: ("crawl".to_string(), "rbac-proxy".to_string()).into(),
        provider: "memory".into(),
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
    }]);
    table
        .grant(&proxy_operator::leasing::leases::LeaseRequest::default())
        .unwrap();
    persistence.flush(&table).await.unwrap();
    persistence.checkpoint(&table).await.unwrap();
    persistence.checkpoint(&table).await.unwrap();
    let snapshot = table.snapshot().unwrap();
    assert_eq!(persistence.load().await.unwrap(), snapshot);

    // The kvm SSH Secret can be read. (Since each Proxy has a credentials Secret in its own
    // namespace, the operator may read Secrets everywhere; it may not delete or replace one.)
    let admin: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(cp.client(), "proxy-operator");
    for name in ["kvm-ssh", "unrelated"] {
        let secret = k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match admin.create(&Default::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("{e}"),
        }
    }
    let own: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(service_account, "proxy-operator");
    own.get("kvm-ssh").await.unwrap();
    let denied = own
        .delete("unrelated", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("forbidden"), "{denied}");
    let mut unrelated = own.get("unrelated").await.unwrap();
    unrelated.metadata.managed_fields = None;
    let denied = own
        .replace("unrelated", &Default::default(), &unrelated)
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("forbidden"), "{denied}");
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

async fn providers_for(text: &str) -> Providers {
    providers_with(test_options(), text).await
}

/// The providers of a providers config, on an engine with `options` (e.g. a kube client).
async fn providers_with(
    options: proxy_operator::provider::plugins::EngineOptions,
    text: &str,
) -> Providers {
    let (engine, _) = engine_with(options).await;
    let config = ProvidersConfig::parse(text).unwrap();
    proxy_operator::provider::registry::load_providers(
        &engine,
        &plugins_dir(),
        &config,
        std::path::Path::new("test"),
    )
    .await
    .unwrap()
}

/// A client with the identity of the operator's ServiceAccount (`deploy/rbac.yaml`): RBAC applies
/// to it as in a cluster.
fn operator_account(cp: &ControlPlane) -> kube::Client {
    cp.client_as(
        "system:serviceaccount:proxy-operator:proxy-operator",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:proxy-operator",
            "system:authenticated",
        ],
    )
}

/// One provider instance of the built plugin `plugin_type`, bound outside any providers config;
/// `Err` is the grant error.
async fn bound_provider(
    options: proxy_operator::provider::plugins::EngineOptions,
    plugin_type: &str,
    name: &str,
    config: &serde_json::Value,
    grants: serde_json::Value,
) -> Result<proxy_operator::provider::plugins::ProviderInstance, String> {
    let (engine, _) = engine_with(options).await;
    let plugin = engine
        .load(&format!("{plugin_type}.wasm"), plugin_bytes(plugin_type))
        .await
        .unwrap();
    let grants: proxy_operator::provider::capabilities::Grants =
        serde_json::from_value(grants).unwrap();
    proxy_operator::provider::plugins::ProviderInstance::new(
        engine,
        name,
        plugin,
        config,
        &grants.validate().map_err(|e| e.to_string())?,
        proxy_operator::provider::plugins::ProviderInstanceOptions::default(),
    )
    .map_err(|e| e.to_string())
}

/// The provider error a call that must fail failed with.
fn refused<T: std::fmt::Debug>(
    result: Result<T, proxy_operator::provider::plugins::CallError>,
) -> proxy_operator::provider::plugins::types::ProviderError {
    match result {
        Err(e) => e
            .provider_error()
            .cloned()
            .unwrap_or_else(|| panic!("not a provider error: {e}")),
        Ok(value) => panic!("succeeded: {value:?}"),
    }
}

/// The provider ids a provider instance's `list` answers.
async fn listed_ids(provider: &proxy_operator::provider::plugins::ProviderInstance) -> Vec<String> {
    provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.provider_id)
        .collect()
}

fn store_provider(name: &str, store: &InstanceStore) -> String {
    store.provider_entry(name)
}

/// `make run` with the sample providers config: the memory store's synthetic instance is made by
/// no operator, so the GC never takes it for an orphan (it used to log `gc: orphaned instance
/// mem-0` on every pass of an empty cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_finds_no_orphans_with_the_sample_providers_config() {
    use proxy_operator::lifecycle::gc::{GcMetrics, GcOptions, pass};
    let cp = control_plane().await;
    let sample = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/samples/providers-config.yaml"
    );
    let providers = providers_for(&std::fs::read_to_string(sample).unwrap()).await;
    let registry = prometheus::Registry::new();
    let options = GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::from_secs(900),
        dry_run: true,
        namespace: None,
        allow_namespaced: false,
        parallelism: 4,
        abandoned: None,
    };
    // The operator's default --operator-id, as `make run` uses it.
    let reports = pass(
        &cp.client(),
        &providers,
        "proxy-operator",
        &options,
        &GcMetrics::register(&registry).unwrap(),
    )
    .await
    .unwrap();
    assert!(!reports.is_empty());
    for (provider, report) in reports {
        assert!(report.found.is_empty(), "{provider}: {report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_only_old_orphans_with_this_operators_identity() {
    use proxy_operator::lifecycle::gc::{GcMetrics, GcOptions, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-gc").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let alive = apply_ready(cp, &ns, &api, "alive").await;
    let alive_id = alive.status.unwrap().provider_id.unwrap();

    let owner = |operator: &str, namespace: &str, uid: &str| serde_json::json!({"namespace": namespace, "name": "gone", "uid": uid, "operatorId": operator});
    let hour_ago = now_seconds() - 3600;
    store.insert(
        "orphan-old",
        owner("test-operator", ns.name(), "gone-1"),
        hour_ago,
    );
    store.insert(
        "orphan-young",
        owner("test-operator", ns.name(), "gone-2"),
        now_seconds(),
    );
    store.insert(
        "other-operator",
        owner("someone-else", ns.name(), "gone-3"),
        hour_ago,
    );
    store.insert("unowned", serde_json::Value::Null, hour_ago);
    store.insert(
        "other-namespace",
        owner("test-operator", "elsewhere", "gone-4"),
        hour_ago,
    );

    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let registry = prometheus::Registry::new();
    let metrics = GcMetrics::register(&registry).unwrap();
    let mut options = GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::from_secs(600),
        dry_run: true,
        namespace: Some(ns.name().to_string()),
        allow_namespaced: false,
        parallelism: 2,
        abandoned: None,
    };
    let client = ns.client();

    let dry = pass(&client, &providers, "test-operator", &options, &metrics)
        .await
        .unwrap();
    assert_eq!(dry[0].1.found, vec!["orphan-old".to_string()]);
    assert!(dry[0].1.deleted.is_empty());
    assert!(
        store.ids().contains(&"orphan-old".to_string()),
        "dry-run deletes nothing"
    );

    options.dry_run = false;
    let real = pass(&client, &providers, "test-operator", &options, &metrics)
        .await
        .unwrap();
    assert_eq!(real[0].1.deleted, vec!["orphan-old".to_string()]);
    let mut expected = vec![
        alive_id.clone(),
        "orphan-young".into(),
        "other-namespace".into(),
        "other-operator".into(),
        "unowned".into(),
    ];
    expected.sort();
    assert_eq!(store.ids(), expected);

    // Other namespaces' instances are collected only when allowed.
    options.allow_namespaced = true;
    let wide = pass(&client, &providers, "test-operator", &options, &metrics)
        .await
        .unwrap();
    assert_eq!(wide[0].1.deleted, vec!["other-namespace".to_string()]);
    assert!(
        store.ids().contains(&alive_id),
        "the live Proxy's instance stays"
    );

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains("proxy_operator_gc_orphans_found_total{provider=\"store\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("proxy_operator_gc_orphans_deleted_total{provider=\"store\"} 2"),
        "{text}"
    );
}

/// Issue #17 item 3: an instance of a live Proxy that is not the one its `status.providerID`
/// names (a create cut off, then asked again elsewhere) is a duplicate: counted in dry-run,
/// deleted once older than `min_age`; the Proxy's own instance stays and the Proxy stays Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_a_live_proxys_duplicate_and_keeps_its_instance() {
    use proxy_operator::lifecycle::gc::{GcMetrics, GcOptions, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-gc-dup").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let alive = apply_ready(cp, &ns, &api, "alive").await;
    let uid = alive.metadata.uid.clone().unwrap();
    let kept = alive.status.unwrap().provider_id.unwrap();
    let its = serde_json::json!({"namespace": ns.name(), "name": "alive", "uid": uid, "operatorId": "test-operator"});
    store.insert("alive-copy", its.clone(), now_seconds() - 3600);
    store.insert("alive-copy-young", its, now_seconds());

    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let registry = prometheus::Registry::new();
    let metrics = GcMetrics::register(&registry).unwrap();
    let mut options = GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::from_secs(600),
        dry_run: true,
        namespace: Some(ns.name().to_string()),
        allow_namespaced: false,
        parallelism: 2,
        abandoned: None,
    };
    let client = ns.client();
    let dry = pass(&client, &providers, "test-operator", &options, &metrics)
        .await
        .unwrap();
    assert_eq!(dry[0].1.duplicates, ["alive-copy"]);
    assert!(dry[0].1.found.is_empty(), "not an orphan: {dry:?}");
    assert!(dry[0].1.deleted.is_empty());
    assert_eq!(store.ids().len(), 3, "dry-run deletes nothing");

    options.dry_run = false;
    let real = pass(&client, &providers, "test-operator", &options, &metrics)
        .await
        .unwrap();
    assert_eq!(real[0].1.deleted, ["alive-copy"]);
    let mut left = vec![kept.clone(), "alive-copy-young".to_string()];
    left.sort();
    assert_eq!(
        store.ids(),
        left,
        "its own instance and the young copy stay"
    );
    let proxy = api.get("alive").await.unwrap();
    assert_eq!(phase(Some(&proxy)), Some(Phase::Ready));
    assert_eq!(proxy.status.unwrap().provider_id, Some(kept));

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains("proxy_operator_gc_duplicates_found_total{provider=\"store\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("proxy_operator_gc_duplicates_deleted_total{provider=\"store\"} 1"),
        "{text}"
    );
    assert!(
        !text.contains("proxy_operator_gc_orphans_deleted_total{provider=\"store\"} 1"),
        "a duplicate is not counted as an orphan: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_created_during_a_gc_pass_is_not_collected() {
    use proxy_operator::lifecycle::gc::{GcMetrics, GcOptions, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-gc-race").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let providers =
        providers_for(&format!("providers:\n{}", store_provider("store", &store))).await;
    let options = GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::ZERO,
        dry_run: false,
        namespace: Some(ns.name().to_string()),
        allow_namespaced: false,
        parallelism: 2,
        abandoned: None,
    };
    // The provider's list answers slowly, so the Proxy and its instance appear mid-pass.
    *store.state.list_delay.lock().unwrap() = Duration::from_secs(3);
    let client = ns.client();
    let metrics = GcMetrics::register(&prometheus::Registry::new()).unwrap();
    let started = Instant::now();
    let gc = tokio::spawn(async move {
        pass(&client, &providers, "test-operator", &options, &metrics).await
    });
    apply_proxy(cp, ns.name(), "newborn", "store", "").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.ids().is_empty() {
        assert!(Instant::now() < deadline, "the instance was never created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let created_after = started.elapsed();
    let report = gc.await.unwrap().unwrap();
    assert!(
        created_after < started.elapsed() && created_after < Duration::from_secs(3),
        "the instance appeared during the pass ({created_after:?})"
    );
    assert!(report[0].1.found.is_empty(), "{report:?}");
    assert_eq!(store.ids().len(), 1);
    *store.state.list_delay.lock().unwrap() = Duration::ZERO;
    wait_for(&api, "newborn", "Ready", |p| phase(p) == Some(Phase::Ready)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_health_shows_each_provider_and_forgets_removed_ones() {
    use proxy_operator::api::ProviderHealth;
    use proxy_operator::provider::providerhealth::{ProviderCheckMetrics, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-ph").await.unwrap();
    let store = InstanceStore::start().await;
    // ProviderHealth is cluster-scoped: names unique to this test.
    let healthy = format!("{}-healthy", ns.name());
    let failing = format!("{}-failing", ns.name());
    let both = providers_for(&format!(
        "providers:\n{}- name: {failing}\n  type: test\n  config: {{endpoint: \"memory:1\", checkFailsWith: PoolNotFound}}\n",
        store_provider(&healthy, &store)
    ))
    .await;
    let registry = prometheus::Registry::new();
    let metrics = ProviderCheckMetrics::register(&registry).unwrap();
    let client = ns.client();
    pass(&client, &both, "ph-test", Duration::from_secs(5), &metrics)
        .await
        .unwrap();

    let api: Api<ProviderHealth> = Api::all(client.clone());
    let good = api.get(&healthy).await.unwrap();
    let status = good.status.unwrap();
    assert_eq!(good.spec.provider_type, "test");
    assert_eq!(status.conditions[0].status, "True");
    assert_eq!(status.conditions[0].reason, "Ok");
    assert_eq!(status.targets_summary.as_deref(), Some("1/1"));
    assert!(status.last_check_time.is_some());
    let bad = api.get(&failing).await.unwrap().status.unwrap();
    assert_eq!(bad.conditions[0].status, "False");
    assert_eq!(bad.conditions[0].reason, "PoolNotFound");
    assert_eq!(bad.targets[0].reason, "PoolNotFound");
    assert!(!bad.targets[0].ok);

    let table = cp
        .kubectl_run(&["get", "ph", &healthy, &failing], None)
        .await
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "REASON", "TARGETS", "AGE"],
        "{table}"
    );
    assert!(table.contains("False   PoolNotFound   0/1"), "{table}");

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains(&format!(
            "proxy_operator_provider_target_up{{provider=\"{healthy}\",target=\"store\"}} 1"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "proxy_operator_provider_target_up{{provider=\"{failing}\",target=\"store\"}} 0"
        )),
        "{text}"
    );
    assert!(text.contains("proxy_operator_provider_check_timestamp_seconds"));

    // The failing instance is removed from the config: its ProviderHealth goes.
    let one = providers_for(&format!("providers:\n{}", store_provider(&healthy, &store))).await;
    pass(&client, &one, "ph-test", Duration::from_secs(5), &metrics)
        .await
        .unwrap();
    assert!(api.get_opt(&failing).await.unwrap().is_none());
    assert!(api.get_opt(&healthy).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_check_reports_timeout_and_does_not_slow_reconciles() {
    use proxy_operator::provider::providerhealth::{ProviderCheckMetrics, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-hung").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();

    // Baseline: a reconcile to Ready with nothing else going on.
    let started = Instant::now();
    apply_ready(cp, &ns, &api, "before").await;
    let baseline = started.elapsed();

    *store.state.health_delay.lock().unwrap() = Duration::from_secs(30);
    let name = format!("{}-hung", ns.name());
    let providers = providers_for(&format!("providers:\n{}", store_provider(&name, &store))).await;
    let client = ns.client();
    let metrics = ProviderCheckMetrics::register(&prometheus::Registry::new()).unwrap();
    let check_timeout = Duration::from_secs(8);
    let check = tokio::spawn(async move {
        pass(&client, &providers, "hung-test", check_timeout, &metrics).await
    });

    let started = Instant::now();
    apply_ready(cp, &ns, &api, "during").await;
    let during = started.elapsed();
    eprintln!("reconcile to Ready: {baseline:?} alone, {during:?} while a check hangs");
    assert!(
        during < check_timeout,
        "a hung check held up a reconcile ({during:?})"
    );

    check.await.unwrap().unwrap();
    let ph: Api<proxy_operator::api::ProviderHealth> = Api::all(ns.client());
    let status = ph.get(&name).await.unwrap().status.unwrap();
    assert_eq!(status.conditions[0].reason, "Timeout");
    *store.state.health_delay.lock().unwrap() = Duration::ZERO;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_deleted_behind_the_operators_back_is_reported_or_recreated() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-lost").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let recreate = "spec:\n  provider: store\n  recreateOnLoss: true\n";
    for (name, yaml) in [
        (
            "kept-failed",
            proxy_yaml(ns.name(), "kept-failed", "store", ""),
        ),
        (
            "recreated",
            format!(
                "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: recreated\n  namespace: {}\n{recreate}",
                ns.name()
            ),
        ),
    ] {
        cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
            .await
            .unwrap();
        wait_for(&api, name, "Ready", |p| phase(p) == Some(Phase::Ready)).await;
    }
    store.state.instances.lock().unwrap().clear();
    // Any change makes the operator look again (otherwise it looks every few minutes).
    for name in ["kept-failed", "recreated"] {
        cp.kubectl_run(&["annotate", "px", name, "-n", ns.name(), "poke=1"], None)
            .await
            .unwrap();
    }
    let failed = wait_for(&api, "kept-failed", "Failed", |p| {
        phase(p) == Some(Phase::Failed)
    })
    .await
    .unwrap();
    let status = failed.status.unwrap();
    assert!(
        status.conditions.iter().any(|c| c.reason == "InstanceLost"),
        "{:?}",
        status.conditions
    );
    assert!(status.last_error.unwrap().contains("no longer exists"));

    let deadline = Instant::now() + Duration::from_secs(60);
    while store.ids().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the lost instance was never re-created"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(&api, "recreated", "Ready again", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(
        store.ids().len(),
        1,
        "a new instance for the Proxy that asked for it"
    );
}

/// A `providerID` edited to point at another Proxy's instance: deleting the edited Proxy does not
/// delete the victim's instance (the owner the provider lists decides), and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_id_patched_to_another_proxys_instance_is_not_deleted() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-foreign-delete").await.unwrap();
    let store = InstanceStore::start().await;
    let _operator = Operator::start(&ns, &store).await;
    let api: Api<Proxy> = ns.api();
    let victim = apply_ready(cp, &ns, &api, "victim").await;
    let victim_id = victim.status.unwrap().provider_id.unwrap();
    apply_ready(cp, &ns, &api, "attacker").await;
    let patch = serde_json::json!({ "status": { "providerID": victim_id } });
    api.patch_status("attacker", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, "attacker", "pointing at the victim", |p| {
        p.and_then(|p| p.status.as_ref()?.provider_id.clone()) == Some(victim_id.clone())
    })
    .await;
    api.delete("attacker", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&api, "attacker", "gone", |p| p.is_none()).await;
    assert!(
        store.ids().contains(&victim_id),
        "the victim's instance was deleted"
    );
    let victim = api.get("victim").await.unwrap();
    assert_eq!(
        victim.status.unwrap().phase,
        Some(proxy_operator::api::Phase::Ready)
    );
    let refused = events_of(cp, &ns)
        .await
        .into_iter()
        .find(|e| e["reason"] == "DeleteRefused")
        .expect("a DeleteRefused event");
    let note = refused["note"].as_str().unwrap();
    assert!(note.contains(&format!("{}/victim", ns.name())), "{note}");
}

/// A Proxy deleted while its create is still in flight (the operator's call timed out; the
/// provider finishes the create later): the deletion finds nothing to delete, and the instance
/// that appears afterwards is an orphan the next GC pass removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_created_after_its_proxy_was_deleted_is_collected() {
    use proxy_operator::lifecycle::gc::{GcMetrics, GcOptions, pass};
    let cp = control_plane().await;
    let ns = cp.namespace("px-inflight").await.unwrap();
    let store = InstanceStore::start().await;
    // The operator gives up on a call after 1 s; the store completes creates after 3 s.
    *store.state.create_lag.lock().unwrap() = Duration::from_secs(3);
    let options = proxy_operator::provider::plugins::EngineOptions {
        call_timeout: Duration::from_secs(1),
        ..test_options()
    };
    let providers = providers_with(
        options,
        &format!("providers:\n{}", store_provider("store", &store)),
    )
    .await;
    let set = proxy_operator::provider::providers::ProviderSet::new(providers);
    let _operator = Operator::with_providers(ns.client(), &ns, set.clone());
    let api: Api<Proxy> = ns.api();
    apply_proxy(cp, ns.name(), "doomed", "store", "").await;
    let timed_out = wait_for(&api, "doomed", "the create timed out", |p| {
        p.and_then(|p| p.status.as_ref()?.last_error.clone())
            .is_some_and(|e| e.contains("did not finish"))
    })
    .await
    .unwrap();
    assert!(timed_out.status.unwrap().provider_id.is_none());
    api.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&api, "doomed", "gone", |p| p.is_none()).await;

    // The provider finishes the create after the Proxy is gone: an orphan.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.ids().is_empty() {
        assert!(Instant::now() < deadline, "the late create never completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let options = GcOptions {
        interval: Duration::from_secs(60),
        min_age: Duration::ZERO,
        dry_run: false,
        namespace: Some(ns.name().to_string()),
        allow_namespaced: false,
        parallelism: 4,
        abandoned: None,
    };
    let metrics = GcMetrics::register(&prometheus::Registry::new()).unwrap();
    pass(
        &ns.client(),
        &set.current(),
        "test-operator",
        &options,
        &metrics,
    )
    .await
    .unwrap();
    assert!(store.ids().is_empty(), "left: {:?}", store.ids());
}

/// A Proxy that failed for a reason outside its spec (here the provider instance's grant does not
/// allow its store) recovers once the providers config is fixed, with no edit to the Proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_outside_the_spec_recovers_when_it_is_fixed() {
    use proxy_operator::provider::registry::{PluginRegistry, RegistryMetrics, RegistryOptions};
    let cp = control_plane().await;
    let ns = cp.namespace("px-recover").await.unwrap();
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("providers.yaml");
    let wrong_grant = format!(
        "providers:\n- name: store\n  type: test\n  config: {{endpoint: \"{}\"}}\n  grants: {{http: {{allow: [\"http://127.0.0.1:1\"]}}}}\n",
        store.url()
    );
    std::fs::write(&config_file, &wrong_grant).unwrap();
    let (engine, _) = engine_with(test_options()).await;
    let registry = PluginRegistry::start(
        engine,
        RegistryOptions {
            plugins_dir: plugins_dir(),
            configmap: None,
            download_dir: None,
        },
        &config_file,
        None,
        RegistryMetrics::unregistered().unwrap(),
    )
    .await
    .unwrap();
    let _operator = Operator::with_providers(ns.client(), &ns, registry.providers());
    let api: Api<Proxy> = ns.api();
    apply_proxy(cp, ns.name(), "blocked", "store", "").await;
    let failed = wait_for(&api, "blocked", "Failed: denied", |p| {
        phase(p) == Some(Phase::Failed)
    })
    .await
    .unwrap();
    let generation = failed.metadata.generation;
    let error = failed.status.unwrap().last_error.unwrap();
    assert!(
        error.contains("is not in this provider instance's grants.http.allow"),
        "{error}"
    );

    // The platform engineer fixes the grant; the Proxy is not touched.
    std::fs::write(
        &config_file,
        format!("providers:\n{}", store_provider("store", &store)),
    )
    .unwrap();
    registry
        .reload_config()
        .await
        .expect("the fixed config is valid");
    let ready = wait_for(&api, "blocked", "Ready after the fix", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    assert_eq!(
        ready.metadata.generation, generation,
        "no spec edit was needed"
    );
}

/// Edits to what an instance was made from are refused by the API server, naming the field and
/// the way out, so `observedGeneration` never moves for an edit the operator did not apply;
/// `recreateOnLoss` stays editable.
#[rstest::rstest]
#[case::port(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "  cloudInit: \"#cloud-config\\n\"\n  port: 8080\n",
    "spec.port is immutable"
)]
#[case::placement(
    "  placement: {zone: zone-a}\n",
    "  placement: {zone: zone-b}\n",
    "spec.placement is immutable"
)]
#[case::cloud_init(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "  cloudInit: \"#cloud-config\\npackages: [squid]\\n\"\n",
    "spec.cloudInit is immutable"
)]
#[case::cloud_init_removed(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "",
    "spec.cloudInit is immutable"
)]
#[case::vendor_data_added(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "  cloudInit: \"#cloud-config\\n\"\n  vendorData: \"#cloud-config\\n\"\n",
    "spec.vendorData is immutable"
)]
#[case::provider_options(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "  cloudInit: \"#cloud-config\\n\"\n  providerOptions: {size: large}\n",
    "spec.providerOptions is immutable"
)]
#[case::guest_agent(
    "  cloudInit: \"#cloud-config\\n\"\n",
    "  cloudInit: \"#cloud-config\\n\"\n  installGuestAgent: false\n",
    "spec.installGuestAgent is immutable"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_the_instance_cannot_follow_are_refused_by_the_api_server(
    #[case] before: &str,
    #[case] after: &str,
    #[case] says: &str,
) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-immutable").await.unwrap();
    let original = proxy_yaml(ns.name(), "fixed", "store", "");
    assert!(original.contains(before), "{original}");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&original))
        .await
        .unwrap();
    let edited = original.replace(before, after);
    let refused = cp
        .kubectl_run(&["apply", "-f", "-"], Some(&edited))
        .await
        .expect_err("the edit is refused");
    assert!(refused.to_string().contains(says), "{refused:#}");
    assert!(
        refused
            .to_string()
            .contains("delete the Proxy and apply it again"),
        "{refused:#}"
    );
    // What the operator reads when the instance is lost stays editable.
    let recreate = original.replace(
        "  provider: store\n",
        "  provider: store\n  recreateOnLoss: true\n",
    );
    cp.kubectl_run(&["apply", "-f", "-"], Some(&recreate))
        .await
        .expect("recreateOnLoss is editable");
}

/// A CRD newer than the operator (a field this operator does not know, set on one Proxy) does
/// not stop it from listing and reconciling every Proxy: the CRD's schema validates, the
/// operator ignores what it does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_from_a_newer_crd_does_not_stop_the_operator() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let cp = control_plane().await;
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    let mut crd =
        serde_json::to_value(crds.get("proxies.proxy-operator.dev").await.unwrap()).unwrap();
    for version in crd["spec"]["versions"].as_array_mut().unwrap() {
        version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["futureField"] =
            serde_json::json!({"type": "string", "description": "added by a newer operator"});
    }
    let crd: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    crds.replace("proxies.proxy-operator.dev", &Default::default(), &crd)
        .await
        .unwrap();

    let ns = cp.namespace("px-newer-crd").await.unwrap();
    let store = InstanceStore::start().await;
    let api: Api<Proxy> = ns.api();
    let newer = proxy_yaml(ns.name(), "newer", "store", "").replace(
        "  provider: store\n",
        "  provider: store\n  futureField: from-a-newer-operator\n",
    );
    assert!(newer.contains("futureField"), "{newer}");
    // The API server keeps the field (it is in the CRD's schema now).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // kubectl failing (the API server busy) is retried until the deadline like a pruned field.
        let raw = match cp.kubectl_run(&["apply", "-f", "-"], Some(&newer)).await {
            Ok(_) => cp
                .kubectl_run(
                    &["get", "proxy", "newer", "-n", ns.name(), "-o", "json"],
                    None,
                )
                .await
                .unwrap_or_else(|e| format!("kubectl get failed: {e:#}")),
            Err(e) => format!("kubectl apply failed: {e:#}"),
        };
        if raw.contains("from-a-newer-operator") {
            break;
        }
        assert!(Instant::now() < deadline, "the field was pruned: {raw}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _operator = Operator::start(&ns, &store).await;
    apply_ready(cp, &ns, &api, "older").await;
    wait_for(&api, "newer", "Ready", |p| phase(p) == Some(Phase::Ready))
        .await
        .unwrap();
}

/// A hostile provider's retry hints of 0 and 2^64 − 1 ms (a hot loop, an overflowing deadline)
/// do not stop the controller: a Proxy of another provider still becomes Ready, and the hostile
/// Proxies say why they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_retry_hints_do_not_stop_other_proxies() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-hostile-retry").await.unwrap();
    let store = InstanceStore::start().await;
    let providers = providers_for(&format!(
        "providers:\n{}- {{name: zero, type: hostile, config: {{attempt: retry-after-zero}}}}\n- {{name: huge, type: hostile, config: {{attempt: retry-after-huge}}}}\n",
        store_provider("store", &store)
    ))
    .await;
    let _operator = Operator::with_providers(ns.client(), &ns, providers);
    let api: Api<Proxy> = ns.api();
    for (name, provider) in [("hot", "zero"), ("far", "huge")] {
        apply_proxy(cp, ns.name(), name, provider, "").await;
    }
    for name in ["hot", "far"] {
        wait_for(&api, name, "waiting with the provider's message", |p| {
            p.and_then(|p| p.status.as_ref()?.last_error.clone())
                .is_some_and(|e| e.contains("try again"))
        })
        .await;
    }
    apply_ready(cp, &ns, &api, "innocent").await;
}
