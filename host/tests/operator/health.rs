//! The health engine against real squid (harness) and the real control plane: a Proxy whose
//! address is squid turns Healthy; stopping squid makes it Unhealthy after the threshold; starting
//! squid again brings it back. A Proxy being deleted is never probed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use harness::{FileServer, Squid, TestNamespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxy_operator::api::{Phase, Proxy};
use proxy_operator::leasing::leases::{LeaseMetrics, LeaseOptions, LeaseStore};
use proxy_operator::lifecycle::health::{HealthEngine, HealthOptions, ProbeMetrics};

use super::common::InstanceStore;
use super::reload::until;
use super::{Operator, control_plane, phase, providers_for, store_provider, wait_for};

/// The health engine of one test namespace, probing through to `target` every 100 ms.
pub(crate) struct Engine {
    pub leases: Arc<LeaseStore>,
    pub registry: prometheus::Registry,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Engine {
    pub async fn start(ns: &TestNamespace, store: &InstanceStore, target: &str) -> Engine {
        Engine::start_with(ns, store, target, None).await
    }

    pub async fn start_with(
        ns: &TestNamespace,
        store: &InstanceStore,
        target: &str,
        exit_ip_url: Option<String>,
    ) -> Engine {
        let providers =
            providers_for(&format!("providers:\n{}", store_provider("store", store))).await;
        let registry = prometheus::Registry::new();
        let leases = Arc::new(LeaseStore::new(
            LeaseOptions::default(),
            LeaseMetrics::register(&registry).unwrap(),
            None,
        ));
        leases.restore(Default::default());
        let engine = HealthEngine::new(
            ns.client(),
            providers.into(),
            leases.clone(),
            HealthOptions {
                interval: Duration::from_millis(100),
                workers: 4,
                timeout: Duration::from_millis(500),
                target: target.to_string(),
                failure_threshold: 2,
                success_threshold: 2,
                status_refresh: Duration::from_secs(300),
                exit_ip_url,
            },
            ProbeMetrics::register(&registry).unwrap(),
            Default::default(),
        );
        let (_, suspects) = tokio::sync::mpsc::channel(1);
        let namespace = ns.name().to_string();
        Engine {
            leases,
            registry,
            task: tokio::spawn(engine.run(Some(namespace), suspects)),
        }
    }

    /// Probes finished with `result` so far.
    pub fn probes(&self, result: &str) -> u64 {
        self.registry
            .gather()
            .iter()
            .find(|f| f.name() == "proxy_operator_probe_duration_seconds")
            .and_then(|f| {
                f.get_metric()
                    .iter()
                    .find(|m| m.get_label().iter().any(|l| l.value() == result))
                    .map(|m| m.get_histogram().get_sample_count())
            })
            .unwrap_or(0)
    }

    pub fn lease_state(&self, name: &str) -> Option<&'static str> {
        self.leases
            .proxies()
            .unwrap()
            .into_iter()
            .find(|p| p.name == name)
            .map(|p| p.state)
    }
}

pub(crate) use super::common::proxy_on_port;

pub(crate) fn condition(proxy: Option<&Proxy>, type_: &str) -> Option<(String, String)> {
    proxy?
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn healthy_is(proxy: Option<&Proxy>, status: &str) -> bool {
    condition(proxy, "Healthy").is_some_and(|(s, _)| s == status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_behind_real_squid_turns_healthy_then_unhealthy_then_recovers() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-health").await.unwrap();
    let store = InstanceStore::start().await;
    let target = FileServer::start().await.unwrap();
    let mut squid = Squid::start().await.unwrap();
    let _operator = Operator::start(&ns, &store).await;
    let engine = Engine::start(&ns, &store, &target.addr().to_string()).await;
    let api: Api<Proxy> = ns.api();

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_on_port(ns.name(), "squid", squid.port())),
    )
    .await
    .unwrap();
    // Ready for "Healthy", not "InstanceRunning": the controller judges readiness again once the
    // engine's verdict is written.
    let proxy = wait_for(&api, "squid", "Healthy and Ready for it", |p| {
        healthy_is(p, "True")
            && phase(p) == Some(Phase::Ready)
            && condition(p, "Ready") == Some(("True".into(), "Healthy".into()))
    })
    .await
    .unwrap();
    let status = proxy.status.unwrap();
    assert!(status.last_probe_time.is_some());
    assert!(status.last_probe_latency_ms.is_some());
    assert_eq!(status.port, Some(squid.port()));
    assert!(
        squid
            .access_log()
            .contains(&format!("CONNECT {}", target.addr())),
        "the probe went through squid to the target: {}",
        squid.access_log()
    );
    assert_eq!(engine.lease_state("squid"), Some("available"));

    squid.stop().await.unwrap();
    let proxy = wait_for(&api, "squid", "Unhealthy", |p| {
        healthy_is(p, "False") && phase(p) == Some(Phase::Unhealthy)
    })
    .await
    .unwrap();
    let (ready, reason) = condition(Some(&proxy), "Ready").unwrap();
    assert_eq!((ready.as_str(), reason.as_str()), ("False", "Unhealthy"));
    let message = &proxy
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "Healthy")
        .unwrap()
        .message;
    assert!(message.contains("cannot connect"), "{message}");
    assert_eq!(engine.lease_state("squid"), Some("unhealthy"));

    squid.start_again().await.unwrap();
    wait_for(&api, "squid", "Healthy again", |p| {
        healthy_is(p, "True") && phase(p) == Some(Phase::Ready)
    })
    .await;
    assert_eq!(engine.lease_state("squid"), Some("available"));
}

/// `phase` and the `Ready` condition (status, reason) the controller derives from `healthy`
/// (`conditions::readiness`).
fn readiness_of(healthy: Option<&str>) -> (Phase, &'static str, &'static str) {
    match healthy {
        Some("True") => (Phase::Ready, "True", "Healthy"),
        Some("False") => (Phase::Unhealthy, "False", "Unhealthy"),
        _ => (Phase::Ready, "True", "InstanceRunning"),
    }
}

/// The managers owning `field` of the status in `proxy`'s managedFields (`f:phase`,
/// `k:{"type":"Ready"}`, …).
fn owners_of(proxy: &Proxy, field: &str) -> Vec<String> {
    proxy
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                f.0.pointer("/f:status")
                    .and_then(|s| s.as_object())
                    .is_some_and(|status| {
                        status.contains_key(field)
                            || status
                                .get("f:conditions")
                                .and_then(|c| c.as_object())
                                .is_some_and(|c| c.contains_key(field))
                    })
            })
        })
        .filter_map(|m| m.manager.clone())
        .collect()
}

/// Health flips fast while the controller reconciles each flip: the health engine writes only
/// `Healthy` and the probe fields, the controller alone `phase` and `Ready`, and no status ever
/// shows a `Ready` that neither the current nor the previous verdict means (the old two-writer
/// race left `Ready` "InstanceRunning" beside `Healthy` True until a repair).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_flipping_while_the_controller_reconciles_never_disagrees_with_ready() {
    use futures_util::StreamExt;
    let cp = control_plane().await;
    let ns = cp.namespace("px-flip").await.unwrap();
    let store = InstanceStore::start().await;
    let target = FileServer::start().await.unwrap();
    let mut squid = Squid::start().await.unwrap();
    let _operator = Operator::start(&ns, &store).await;
    let _engine = Engine::start(&ns, &store, &target.addr().to_string()).await;
    let api: Api<Proxy> = ns.api();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_on_port(ns.name(), "flip", squid.port())),
    )
    .await
    .unwrap();
    let settled = |p: Option<&Proxy>| {
        healthy_is(p, "True")
            && phase(p) == Some(Phase::Ready)
            && condition(p, "Ready") == Some(("True".into(), "Healthy".into()))
    };
    wait_for(&api, "flip", "Healthy and Ready", settled).await;

    // Every version of the Proxy from here on.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Proxy>::new()));
    let recorder = {
        let (api, seen) = (api.clone(), seen.clone());
        tokio::spawn(async move {
            let mut versions = std::pin::pin!(kube::runtime::watcher::watch_object(api, "flip"));
            while let Some(Ok(Some(proxy))) = versions.next().await {
                seen.lock().unwrap().push(proxy);
            }
        })
    };
    const FLIPS: usize = 4;
    for _ in 0..FLIPS {
        squid.stop().await.unwrap();
        wait_for(&api, "flip", "Healthy False", |p| healthy_is(p, "False")).await;
        squid.start_again().await.unwrap();
        wait_for(&api, "flip", "Healthy True", |p| healthy_is(p, "True")).await;
    }
    let last = wait_for(&api, "flip", "settled after the flips", settled)
        .await
        .unwrap();
    recorder.abort();

    let versions = seen.lock().unwrap().clone();
    let mut healthy_flips = 0;
    let mut previous_verdict: Option<String> = None;
    let mut current_verdict: Option<String> = None;
    for proxy in &versions {
        let healthy = condition(Some(proxy), "Healthy").map(|(s, _)| s);
        if healthy != current_verdict {
            previous_verdict = current_verdict.take();
            current_verdict = healthy;
            healthy_flips += 1;
        }
        let (ready, reason) = condition(Some(proxy), "Ready").expect("a Ready condition");
        let shown = (
            phase(Some(proxy)).expect("a phase"),
            ready.as_str(),
            reason.as_str(),
        );
        let allowed = [
            readiness_of(current_verdict.as_deref()),
            readiness_of(previous_verdict.as_deref()),
        ];
        assert!(
            allowed.contains(&shown),
            "resourceVersion {:?}: phase/Ready {shown:?} beside Healthy {current_verdict:?} \
             (before: {previous_verdict:?})",
            proxy.metadata.resource_version
        );
    }
    assert!(
        healthy_flips >= 2 * FLIPS,
        "the watch saw {healthy_flips} verdict changes in {} versions",
        versions.len()
    );
    assert!(
        versions
            .iter()
            .any(|p| phase(Some(p)) == Some(Phase::Unhealthy)),
        "the controller followed the verdict to Unhealthy at least once"
    );

    // One writer per field, as the API server records it.
    let live = api.get(&last.metadata.name.unwrap()).await.unwrap();
    let controller = proxy_operator::lifecycle::controller::FIELD_MANAGER;
    let engine = proxy_operator::lifecycle::health::FIELD_MANAGER;
    assert_eq!(owners_of(&live, "f:phase"), [controller]);
    assert_eq!(owners_of(&live, r#"k:{"type":"Ready"}"#), [controller]);
    assert_eq!(owners_of(&live, r#"k:{"type":"Healthy"}"#), [engine]);
    assert_eq!(owners_of(&live, "f:lastProbeTime"), [engine]);
}

/// Accepts connections and counts them, never answering: a proxy that would hang a probe.
async fn counting_listener() -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (port, count, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_being_deleted_is_never_probed() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-health-del").await.unwrap();
    let store = InstanceStore::start().await;
    let target = FileServer::start().await.unwrap();
    let squid = Squid::start().await.unwrap();
    let (port, connections, _listener) = counting_listener().await;
    let _operator = Operator::start(&ns, &store).await;
    let engine = Engine::start(&ns, &store, &target.addr().to_string()).await;
    let api: Api<Proxy> = ns.api();

    for (name, port) in [("steady", squid.port()), ("leaving", port)] {
        cp.kubectl_run(
            &["apply", "-f", "-"],
            Some(&proxy_on_port(ns.name(), name, port)),
        )
        .await
        .unwrap();
    }
    wait_for(&api, "steady", "Healthy", |p| healthy_is(p, "True")).await;
    wait_for(&api, "leaving", "probed", |_| {
        connections.load(Ordering::SeqCst) > 0
    })
    .await;

    // Held by a second finalizer, "leaving" stays in deletion with its address in the status.
    api.patch(
        "leaving",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": ["proxy-operator.dev/cleanup", "test.example.com/hold"]}})),
    )
    .await
    .unwrap();
    api.delete("leaving", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&api, "leaving", "deleting", |p| {
        p.is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    // A full round after the engine saw the deletion, then count from zero.
    let seen = engine.probes("success");
    wait_for(&api, "steady", "one more round", |_| {
        engine.probes("success") >= seen + 2
    })
    .await;
    connections.store(0, Ordering::SeqCst);
    let seen = engine.probes("success");
    wait_for(&api, "steady", "three more rounds", |_| {
        engine.probes("success") >= seen + 3
    })
    .await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a deleting Proxy was probed"
    );
    assert_eq!(
        engine.lease_state("leaving"),
        None,
        "a deleting Proxy is not leasable"
    );

    api.patch(
        "leaving",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// An exit-IP service: answers every request with the address it came from, and counts them.
async fn exit_ip_service() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ip", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let task = tokio::spawn(async move {
        loop {
            let (mut stream, peer) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = peer.ip().to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, requests, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_ip_is_learned_through_the_proxy_and_handed_out_with_leases() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-exit-ip").await.unwrap();
    let store = InstanceStore::start().await;
    let target = FileServer::start().await.unwrap();
    // squid leaves from 127.0.0.2, so the service tells the proxy's exit from the operator's own
    // address (127.0.0.1).
    let squid = Squid::start_with("tcp_outgoing_address 127.0.0.2\n")
        .await
        .unwrap();
    let (url, requests, service) = exit_ip_service().await;
    let _operator = Operator::start(&ns, &store).await;
    let engine =
        Engine::start_with(&ns, &store, &target.addr().to_string(), Some(url.clone())).await;
    let api: Api<Proxy> = ns.api();

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_on_port(ns.name(), "egress", squid.port())),
    )
    .await
    .unwrap();
    let proxy = wait_for(&api, "egress", "exit IP", |p| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.exit_ip.is_some())
    })
    .await
    .unwrap();
    assert_eq!(proxy.status.unwrap().exit_ip.as_deref(), Some("127.0.0.2"));
    assert!(
        squid.access_log().contains(&url),
        "asked through squid: {}",
        squid.access_log()
    );
    // kubectl shows it in the wide view.
    let wide = cp
        .kubectl_run(&["get", "proxies", "-n", ns.name(), "-o", "wide"], None)
        .await
        .unwrap();
    assert!(
        wide.contains("EXIT-IP") && wide.contains("127.0.0.2"),
        "{wide}"
    );

    // The lease pool carries it; the service is not asked again on every probe.
    until("the exit IP in the lease pool", || {
        engine
            .leases
            .proxies()
            .unwrap()
            .iter()
            .any(|p| p.name == "egress" && p.exit_ip.as_deref() == Some("127.0.0.2"))
    })
    .await;
    let probes = engine.probes("success");
    until("five more probes", || {
        engine.probes("success") >= probes + 5
    })
    .await;
    assert_eq!(requests.load(Ordering::SeqCst), 1, "asked once per refresh");
    service.abort();
}
