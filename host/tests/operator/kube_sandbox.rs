//! The `kube` capability's allow-list against a plugin applying whatever it likes (the test
//! provider's `kubeApply`), through the real runtime and the real API server: every Pod field
//! that would reach the node, the API, a Secret or somebody else's ConfigMap is refused, naming
//! the field, and nothing is made; the operator's own objects are out of reach.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use harness::{ControlPlane, TestNamespace};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, PostParams};
use proxy_operator::api::{Phase, Proxy};
use proxy_operator::provider::capabilities::kube::OperatorObjects;
use proxy_operator::provider::plugins::types::ProviderError;
use proxy_operator::provider::plugins::{EngineOptions, ProviderInstance};
use rstest::rstest;
use serde_json::{Value, json};

use super::common::InstanceStore;
use super::common::operator_process::{OperatorProcess, OperatorSetup};
use super::common::{spec, test_options};
use super::{bound_provider, control_plane, refused, store_provider};

/// A Pod the host admits: the restricted profile, no token, its own ConfigMap.
fn restricted_pod(name: &str, configmap: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 13, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "squid",
                "image": "squid:6",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/squid"}],
            }],
            "volumes": [{"name": "conf", "configMap": {"name": configmap}}],
        },
    })
}

async fn kube_plugin(
    client: kube::Client,
    namespace: &str,
    kinds: &[&str],
    operator_objects: OperatorObjects,
) -> ProviderInstance {
    let options = EngineOptions {
        kube: Some(client),
        operator_objects: Arc::new(operator_objects),
        ..test_options()
    };
    bound_provider(
        options,
        "test",
        "kube-sandbox",
        &json!({ "endpoint": "kube:" }),
        json!({"kube": {"namespace": namespace, "kinds": kinds, "images": ["squid:6"]}}),
    )
    .await
    .unwrap()
}

async fn apply(provider: &ProviderInstance, object: &Value) -> Result<String, ProviderError> {
    match provider
        .create(spec("x", json!({ "kubeApply": object })))
        .await
    {
        Ok(instance) => Ok(instance.message.unwrap_or_default()),
        Err(e) => Err(e.provider_error().cloned().expect("a provider error")),
    }
}

/// Sets the JSON pointer `at` of `object` to `value`.
fn with(mut object: Value, at: &str, value: Value) -> Value {
    match object.pointer_mut(at) {
        Some(existing) => *existing = value,
        None => {
            let (parent, key) = at.rsplit_once('/').unwrap();
            object.pointer_mut(parent).unwrap()[key] = value;
        }
    }
    object
}

#[rstest]
#[case::host_path("/spec/volumes/0", json!({"name": "root", "hostPath": {"path": "/"}}), "is a `hostPath` volume")]
#[case::secret_volume_into_the_termination_message("/spec/volumes/0", json!({"name": "conf", "secret": {"secretName": "victim"}}), "is a `secret` volume")]
#[case::projected_token("/spec/volumes/0", json!({"name": "conf", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}), "is a `projected` volume")]
#[case::nfs("/spec/volumes/0", json!({"name": "conf", "nfs": {"server": "127.0.0.1", "path": "/"}}), "is a `nfs` volume")]
#[case::pvc("/spec/volumes/0", json!({"name": "conf", "persistentVolumeClaim": {"claimName": "data"}}), "persistentVolumeClaim")]
#[case::foreign_configmap("/spec/volumes/0", json!({"name": "conf", "configMap": {"name": "someone-elses"}}), "references ConfigMap someone-elses, which provider instance kube-sandbox did not apply")]
#[case::secret_env("/spec/containers/0/env", json!([{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "victim", "key": "password"}}}]), "secretKeyRef is not allowed")]
#[case::secret_env_from("/spec/containers/0/envFrom", json!([{"secretRef": {"name": "victim"}}]), "envFrom[0].secretRef")]
#[case::foreign_configmap_env("/spec/containers/0/envFrom", json!([{"configMapRef": {"name": "someone-elses"}}]), "references ConfigMap someone-elses")]
#[case::service_account("/spec/serviceAccountName", json!("proxy-operator"), "serviceAccountName `proxy-operator`")]
#[case::token_automounted("/spec/automountServiceAccountToken", json!(true), "automountServiceAccountToken must be false")]
#[case::node_name("/spec/nodeName", json!("node-1"), "spec.nodeName is not allowed")]
#[case::host_network("/spec/hostNetwork", json!(true), "spec.hostNetwork")]
#[case::root("/spec/securityContext/runAsUser", json!(0), "runAsUser 0 (root)")]
#[case::seccomp_unconfined("/spec/securityContext/seccompProfile", json!({"type": "Unconfined"}), "Unconfined")]
#[case::privileged("/spec/containers/0/securityContext/privileged", json!(true), "privileged is not allowed")]
#[case::capability_added("/spec/containers/0/securityContext/capabilities", json!({"drop": ["ALL"], "add": ["NET_ADMIN"]}), "NET_ADMIN is not allowed")]
#[case::probe_to_another_host("/spec/containers/0/livenessProbe", json!({"httpGet": {"host": "127.0.0.1", "port": 6443, "path": "/"}}), "livenessProbe.httpGet.host")]
#[case::legacy_apparmor_annotation("/metadata/annotations", json!({"container.apparmor.security.beta.kubernetes.io/squid": "unconfined"}), "annotation `container.apparmor.security.beta.kubernetes.io/squid` is not allowed")]
#[case::apparmor_localhost_unconfined("/spec/securityContext/appArmorProfile", json!({"type": "Localhost", "localhostProfile": "unconfined"}), "appArmorProfile.type \"Localhost\" is not allowed")]
#[case::root_as_a_float("/spec/securityContext/runAsUser", json!(0.0), "runAsUser 0 (root)")]
#[case::control_plane_toleration("/spec/tolerations", json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]), "tolerations[0]")]
#[case::control_plane_node_selector("/spec/nodeSelector", json!({"node-role.kubernetes.io/control-plane": ""}), "nodeSelector.node-role.kubernetes.io/control-plane is not allowed")]
#[case::deletion_cost("/metadata/annotations", json!({"controller.kubernetes.io/pod-deletion-cost": "-1000"}), "annotation `controller.kubernetes.io/pod-deletion-cost` is not allowed")]
#[case::seccomp_annotation("/metadata/annotations", json!({"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}), "annotation `seccomp.security.alpha.kubernetes.io/pod`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_field_that_escapes_is_refused_and_nothing_is_made(
    #[case] at: &str,
    #[case] value: Value,
    #[case] says: &str,
) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-pod").await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(ns.client(), ns.name());
    let mut victim = Secret::default();
    victim.metadata.name = Some("victim".into());
    victim.data = Some(BTreeMap::from([(
        "password".to_string(),
        ByteString(b"hunter2".to_vec()),
    )]));
    secrets
        .create(&PostParams::default(), &victim)
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let mut foreign = ConfigMap::default();
    foreign.metadata.name = Some("someone-elses".into());
    maps.create(&PostParams::default(), &foreign).await.unwrap();
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/Pod", "v1/ConfigMap", "apps/v1/Deployment"],
        OperatorObjects::default(),
    )
    .await;
    let own = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "own-conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &own).await.unwrap();

    let escape = with(restricted_pod("escape", "own-conf"), at, value);
    match apply(&provider, &escape).await {
        Err(ProviderError::Denied(m)) => assert!(m.contains(says), "{m}"),
        other => panic!("{at}: expected a denial, got {other:?}"),
    }
    // The same Pod as a Deployment's template is refused for the same field.
    let mut template_metadata = escape["metadata"].clone();
    template_metadata.as_object_mut().unwrap().remove("name");
    template_metadata["labels"] = json!({"plugin.proxy-operator.dev/app": "escape"});
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "escape"},
        "spec": {
            "selector": {"matchLabels": {"plugin.proxy-operator.dev/app": "escape"}},
            "template": {"metadata": template_metadata, "spec": escape["spec"]},
        },
    });
    match apply(&provider, &deployment).await {
        Err(ProviderError::Denied(m)) => assert!(m.contains(says), "{m}"),
        other => panic!("{at} in a Deployment: expected a denial, got {other:?}"),
    }

    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    assert!(
        pods.get_opt("escape").await.unwrap().is_none(),
        "no Pod made"
    );
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(ns.client(), ns.name());
    assert!(deployments.get_opt("escape").await.unwrap().is_none());
    assert_eq!(
        secrets.get("victim").await.unwrap().data.unwrap()["password"].0,
        b"hunter2",
        "the victim Secret is intact"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_pod_with_its_own_configmap_is_made() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-pod-ok").await.unwrap();
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/Pod", "v1/ConfigMap"],
        OperatorObjects::default(),
    )
    .await;
    // Before its ConfigMap exists, the Pod is refused (a ConfigMap made later by someone else
    // would otherwise be mounted).
    let pod = restricted_pod("squid", "squid-conf");
    match apply(&provider, &pod).await {
        Err(ProviderError::Denied(m)) => {
            assert!(m.contains("references ConfigMap squid-conf"), "{m}")
        }
        other => panic!("{other:?}"),
    }
    let conf = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "squid-conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &conf).await.unwrap();
    apply(&provider, &pod)
        .await
        .expect("the restricted Pod is admitted");
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let made = pods.get("squid").await.unwrap();
    assert_eq!(
        made.spec.unwrap().security_context.unwrap().run_as_non_root,
        Some(true)
    );
}

/// Issue #36: with the operator's namespace granted, a plugin's Pod labelled like the operator's
/// joined the discovery Service (and received crawlers' bearer tokens). No grant may name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_of_the_operators_own_namespace_is_refused() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-own").await.unwrap();
    let objects = OperatorObjects::of(
        "po",
        ns.name(),
        "providers-config",
        Some((ns.name(), "provider-plugins")),
    );
    let options = EngineOptions {
        kube: Some(ns.client()),
        operator_objects: Arc::new(objects),
        ..test_options()
    };
    let error = bound_provider(
        options,
        "test",
        "kube-sandbox",
        &json!({ "endpoint": "kube:" }),
        json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap", "v1/Pod"]}}),
    )
    .await
    .unwrap_err();
    assert!(
        error.contains(&format!(
            "grants.kube.namespace: `{}` is the operator's own namespace",
            ns.name()
        )),
        "{error}"
    );
}

/// A plugin's Services and NetworkPolicies reach its own Pods only: the fields that send traffic
/// elsewhere are refused (and nothing is made), and the selectors it sends are confined to its
/// provider instance's label, so a Service "selecting everything" never reaches someone else's Pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_network_policies_reach_only_the_plugins_own_pods() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-traffic").await.unwrap();
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/Service", "networking.k8s.io/v1/NetworkPolicy"],
        OperatorObjects::default(),
    )
    .await;
    let services: Api<Service> = Api::namespaced(ns.client(), ns.name());
    let policies: Api<NetworkPolicy> = Api::namespaced(ns.client(), ns.name());
    let service = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec});
    let ports = json!([{"port": 3128}]);
    for (name, spec, words) in [
        (
            "hijack",
            json!({"selector": {"app": "victim"}, "ports": ports, "externalIPs": ["127.0.0.53"]}),
            "spec.externalIPs is not allowed",
        ),
        (
            "alias",
            json!({"type": "ExternalName", "externalName": "kubernetes.default"}),
            "ExternalName is not allowed",
        ),
        (
            "by-hand",
            json!({"ports": ports}),
            "spec.selector is required",
        ),
        (
            "squat",
            json!({"selector": {"app": "x"}, "ports": ports, "clusterIP": "10.0.0.200"}),
            "spec.clusterIP is not allowed",
        ),
    ] {
        match apply(&provider, &service(name, spec)).await {
            Err(ProviderError::Denied(m)) => assert!(m.contains(words), "{name}: {m}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(
            services.get_opt(name).await.unwrap().is_none(),
            "{name} was made"
        );
    }
    // Selecting the victim's Pods by their labels still selects only this instance's Pods.
    apply(
        &provider,
        &service(
            "front",
            json!({"selector": {"app": "victim"}, "ports": ports}),
        ),
    )
    .await
    .unwrap();
    let selector = services
        .get("front")
        .await
        .unwrap()
        .spec
        .unwrap()
        .selector
        .unwrap();
    assert_eq!(selector["app"], "victim");
    assert_eq!(selector["proxy-operator.dev/provider"], "kube-sandbox");
    // A policy for "every Pod" (which would cut everyone else's traffic) covers its own only.
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    });
    apply(&provider, &policy).await.unwrap();
    let made = policies.get("deny-all").await.unwrap().spec.unwrap();
    assert_eq!(
        made.pod_selector.unwrap().match_labels.unwrap()["proxy-operator.dev/provider"],
        "kube-sandbox"
    );
}

/// A Proxy whose provider's `create` applies `object` through the test provider's `kubeApply`.
fn proxy_applying(ns: &str, name: &str, provider: &str, object: &Value) -> String {
    json!({
        "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"provider": provider, "providerOptions": {"kubeApply": object}},
    })
    .to_string()
}

/// The operator binary with two provider instances: `store` (the test provider's loopback store)
/// and `kube-plugin` (the test provider, granted `kinds` in `ns`), its own objects in `home`.
fn operator_beside(
    cp: &ControlPlane,
    ns: &TestNamespace,
    home: &TestNamespace,
    store: &InstanceStore,
    dir: &std::path::Path,
    kinds: &[&str],
) -> OperatorProcess {
    let config = dir.join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n{}- name: kube-plugin\n  type: test\n  config: {{endpoint: \"kube:\"}}\n  grants: {{kube: {{namespace: {}, kinds: {}}}}}\n",
            store_provider("store", store),
            ns.name(),
            serde_json::to_string(kinds).unwrap(),
        ),
    )
    .unwrap();
    OperatorProcess::start_with(OperatorSetup {
        kubeconfig: cp.kubeconfig().to_path_buf(),
        namespace: ns.name(),
        own_namespace: Some(home.name()),
        dir,
        providers_config: config.to_str().unwrap(),
        health_target: "127.0.0.1:9",
        operator_id: format!("e2e-{}", ns.name()),
        health_interval: "0s",
        plugins_dir: super::common::plugins_dir(),
        extra: Vec::new(),
        log: "operator.log",
        discovery_tls: None,
        metrics_insecure: true,
    })
}

/// Polls the Proxy until `check` holds, failing at once if the operator process has exited.
async fn await_proxy(
    operator: &mut OperatorProcess,
    api: &Api<Proxy>,
    name: &str,
    what: &str,
    check: impl Fn(&Proxy) -> bool,
) -> Proxy {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(exit) = operator.proc.try_exited() {
            panic!(
                "the operator exited ({exit:?}) while waiting for {name}: {what}\n{}",
                operator.proc.log_tail(30)
            );
        }
        let proxy = api.get_opt(name).await.unwrap();
        if let Some(proxy) = proxy.as_ref().filter(|p| check(p)) {
            return proxy.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name}: {what}; last: {:?}",
            proxy.and_then(|p| p.status)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue #36: a NetworkPolicy whose `podSelector` is an array made the host index a JSON array
/// as an object; the panic ended the process (exit 101), and every restart died again on the same
/// Proxy. A malformed object now fails its own Proxy, naming the field, and the operator goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_object_fails_its_own_proxy_and_the_operator_goes_on_serving() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-crash").await.unwrap();
    let home = cp.namespace("px-kube-crash-home").await.unwrap();
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut operator = operator_beside(
        cp,
        &ns,
        &home,
        &store,
        dir.path(),
        &["v1/Service", "networking.k8s.io/v1/NetworkPolicy"],
    );
    operator.wait_leading().await;
    let policy = |name: &str, spec: Value| json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name}, "spec": spec});
    let service = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec});
    let malformed = [
        (
            "selector-array",
            policy("selector-array", json!({"podSelector": []})),
            "spec.podSelector must be a label selector",
        ),
        (
            "match-labels-array",
            policy(
                "match-labels-array",
                json!({"podSelector": {"matchLabels": []}}),
            ),
            "spec.podSelector.matchLabels must be a map of labels",
        ),
        (
            "spec-array",
            policy("spec-array", json!([])),
            "spec must be a map",
        ),
        (
            "service-spec-text",
            service("service-spec-text", json!("all")),
            "spec must be a map",
        ),
    ];
    for (name, object, _) in &malformed {
        cp.kubectl_run(
            &["apply", "-f", "-"],
            Some(&proxy_applying(ns.name(), name, "kube-plugin", object)),
        )
        .await
        .unwrap();
    }
    let api: Api<Proxy> = ns.api();
    for (name, _, says) in &malformed {
        let failed = await_proxy(&mut operator, &api, name, says, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.last_error.as_deref())
                .is_some_and(|e| e.contains(says))
        })
        .await;
        assert_eq!(
            failed.status.unwrap().phase,
            Some(Phase::Failed),
            "{name}: refused for good, not retried"
        );
    }
    // Another provider instance's Proxy still reconciles, and the process still serves.
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(
            &json!({
                "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
                "metadata": {"name": "alive", "namespace": ns.name()},
                "spec": {"provider": "store"},
            })
            .to_string(),
        ),
    )
    .await
    .unwrap();
    await_proxy(&mut operator, &api, "alive", "Ready", |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready)
    })
    .await;
    let (status, body) = operator.readyz().await.expect("/readyz answers");
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert!(operator.proc.try_exited().is_none());
}

/// Somebody's Service selecting `app: people`, its Pod, and somebody's ReplicaSet owning a Pod.
async fn peoples_objects(ns: &TestNamespace) {
    let manifest = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: people, namespace: {ns}}}\nspec: {{selector: {{app: people}}, ports: [{{port: 80}}]}}\n---\n\
         apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: people-rs, namespace: {ns}}}\n\
         spec: {{replicas: 1, selector: {{matchLabels: {{app: people-rs}}}}, template: {{metadata: {{labels: {{app: people-rs}}}}, spec: {{containers: [{{name: web, image: nginx}}]}}}}}}\n",
        ns = ns.name()
    );
    control_plane()
        .await
        .kubectl_run(&["apply", "-f", "-"], Some(&manifest))
        .await
        .unwrap();
    let replicasets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(ns.client(), ns.name());
    let rs = replicasets.get("people-rs").await.unwrap();
    // The ReplicaSet's Pod, as its controller makes it (owned, labelled by the template).
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "people-rs-0", "labels": {"app": "people-rs"}, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "people-rs",
            "uid": rs.metadata.uid.unwrap(), "controller": true,
        }]},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

/// The EndpointSlices of the Service `people` and the Pods with label `selector`, by name.
async fn selected(ns: &TestNamespace, selector: &str) -> (Vec<String>, Vec<String>) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices: Api<EndpointSlice> = Api::namespaced(ns.client(), ns.name());
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let names = |items: Vec<Option<String>>| items.into_iter().flatten().collect::<Vec<_>>();
    let listed = slices
        .list(&kube::api::ListParams::default().labels("kubernetes.io/service-name=people"))
        .await
        .unwrap();
    let selected_pods = pods
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .unwrap();
    (
        names(listed.items.into_iter().map(|s| s.metadata.name).collect()),
        names(
            selected_pods
                .items
                .into_iter()
                .map(|p| p.metadata.name)
                .collect(),
        ),
    )
}

/// Issue #36: a plugin's Pod labelled like somebody's Service's selector joined that Service
/// (10 of 16 requests answered by the plugin); relabelled like somebody's ReplicaSet's, it was
/// adopted and the ReplicaSet deleted its own Pod. A plugin's labels are its own prefix only.
#[rstest]
#[case::joins_a_service(json!({"app": "people"}), "app=people", "label `app` is not allowed")]
#[case::adopted_by_a_replicaset(json!({"app": "people-rs"}), "app=people-rs", "label `app` is not allowed")]
#[case::joins_the_operators_service(json!({"app.kubernetes.io/name": "proxy-operator"}), "app.kubernetes.io/name=proxy-operator", "label `app.kubernetes.io/name`")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_labelled_like_somebody_elses_selector_is_refused_and_their_objects_are_unchanged(
    #[case] labels: Value,
    #[case] selector: &str,
    #[case] says: &str,
) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-labels").await.unwrap();
    peoples_objects(&ns).await;
    let before = selected(&ns, selector).await;
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/Pod", "v1/ConfigMap"],
        OperatorObjects::default(),
    )
    .await;
    let conf = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &conf).await.unwrap();
    // Made with a label of its own (allowed), then relabelled like the victim's selector.
    let own = with(
        restricted_pod("plugin-pod", "conf"),
        "/metadata/labels",
        json!({"plugin.proxy-operator.dev/app": "squid"}),
    );
    apply(&provider, &own)
        .await
        .expect("a plugin-owned label is admitted");
    for object in [
        with(
            restricted_pod("plugin-pod", "conf"),
            "/metadata/labels",
            labels.clone(),
        ),
        with(
            restricted_pod("new-pod", "conf"),
            "/metadata/labels",
            labels.clone(),
        ),
    ] {
        match apply(&provider, &object).await {
            Err(ProviderError::Denied(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{labels}: expected a denial, got {other:?}"),
        }
    }
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    assert!(
        pods.get_opt("new-pod").await.unwrap().is_none(),
        "no Pod made"
    );
    let kept = pods
        .get("plugin-pod")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(
        kept.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "app.kubernetes.io/managed-by",
            "plugin.proxy-operator.dev/app",
            "proxy-operator.dev/provider"
        ],
        "the plugin's Pod keeps its own labels"
    );
    assert_eq!(
        selected(&ns, selector).await,
        before,
        "the Service's endpoints and the selected Pods are unchanged"
    );
    let victim = pods.get("people-rs-0").await.unwrap();
    assert!(
        victim.metadata.deletion_timestamp.is_none(),
        "the ReplicaSet still has its Pod"
    );
}

/// Issue #36: one `list` of ConfigMaps the plugin made (190 MiB) took the operator from 108 MiB
/// to 729 MiB before the plugin's own limit trapped. The host pages the list and stops at half
/// the plugin's memory limit, with an answer that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_larger_than_the_plugin_can_take_is_refused_not_buffered() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-list").await.unwrap();
    let options = EngineOptions {
        kube: Some(ns.client()),
        memory_limit: 16 << 20,
        ..test_options()
    };
    let provider = bound_provider(
        options,
        "test",
        "kube-sandbox",
        &json!({ "endpoint": "kube:" }),
        json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap"]}}),
    )
    .await
    .unwrap();
    // 12 ConfigMaps of 900 KB with the instance's label: 10.5 MiB, over the 8 MiB answer bound.
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    for i in 0..12 {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("big-{i}"), "labels": {"proxy-operator.dev/provider": "kube-sandbox"}},
            "data": {"blob": "x".repeat(900_000)},
        }))
        .unwrap();
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
    match refused(provider.list().await) {
        ProviderError::Denied(m) => assert!(
            m.contains("the list of ConfigMap passes 8 MiB")
                && m.contains("more than this plugin's answers may hold (8 MiB"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
}

/// Issue #36: 200 ConfigMaps of 1 MB each took etcd from 4 to 212 MiB in 33 s. Each kind has a
/// quota per provider instance (objects and bytes), with defaults, set in the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_past_the_instances_quota_are_refused() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-quota").await.unwrap();
    let options = EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    };
    let provider = bound_provider(
        options,
        "test",
        "kube-sandbox",
        &json!({ "endpoint": "kube:" }),
        json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap"], "quota": {"objects": 3, "mebibytes": 2}}}),
    )
    .await
    .unwrap();
    let map = |name: &str, size: usize| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"blob": "x".repeat(size)}});
    apply(&provider, &map("big-0", 900_000)).await.unwrap();
    apply(&provider, &map("big-1", 900_000)).await.unwrap();
    match apply(&provider, &map("big-2", 900_000)).await {
        Err(ProviderError::Denied(m)) => assert!(
            m.contains("quota") && m.contains("grants.kube.quota.mebibytes allows (2 MiB)"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    apply(&provider, &map("small-0", 10)).await.unwrap();
    match apply(&provider, &map("small-1", 10)).await {
        Err(ProviderError::Denied(m)) => {
            assert!(
                m.contains(
                    "has 3 ConfigMap objects, the most grants.kube.quota.objects allows (3)"
                ),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Changing an object it has is no create: still allowed.
    apply(&provider, &map("small-0", 20)).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    assert!(maps.get_opt("big-2").await.unwrap().is_none());
    assert!(maps.get_opt("small-1").await.unwrap().is_none());
}

/// Issue #47: the grant passed every kind but three through unchanged, so a platform granting a
/// RoleBinding, a ServiceAccount, an Ingress or a Gateway route let a plugin make one that no
/// policy of the host looked at. A grant names kinds the host has a policy for, or the provider
/// instance is not bound (and the providers config is refused: `config.rs`), naming the kind
/// and the list.
#[rstest]
#[case::role_binding("rbac.authorization.k8s.io/v1/RoleBinding")]
#[case::service_account("v1/ServiceAccount")]
#[case::ingress("networking.k8s.io/v1/Ingress")]
#[case::gateway_route("gateway.networking.k8s.io/v1/HTTPRoute")]
#[case::daemon_set("apps/v1/DaemonSet")]
#[case::persistent_volume_claim("v1/PersistentVolumeClaim")]
#[case::lease("coordination.k8s.io/v1/Lease")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_without_a_policy_of_the_host_cannot_be_granted(#[case] kind: &str) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-kinds").await.unwrap();
    let options = EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    };
    let Err(error) = bound_provider(
        options,
        "test",
        "kube-sandbox",
        &json!({ "endpoint": "kube:" }),
        json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap", kind]}}),
    )
    .await
    else {
        panic!("{kind} was granted");
    };
    assert!(
        error.starts_with(&format!(
            "grants.kube.kinds[1]: `{kind}` is not a kind the host has a policy for"
        )) && error.contains("grant only kinds of this list: v1/Pod, v1/ConfigMap"),
        "{error}"
    );
}

/// Another provider instance's squid Pod (`victim`), as the kubernetes provider makes it, and
/// its Service: what a hostile instance's objects must not adopt, delete, join or shield.
async fn another_instances_squid(ns: &TestNamespace) {
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: victim-squid\n  namespace: {ns}\n  labels: {{proxy-operator.dev/provider: victim, plugin.proxy-operator.dev/proxy: px-1, plugin.proxy-operator.dev/component: egress-proxy}}\n\
         spec: {{containers: [{{name: squid, image: squid:6}}]}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {{name: victim-squid, namespace: {ns}}}\n\
         spec: {{selector: {{proxy-operator.dev/provider: victim, plugin.proxy-operator.dev/proxy: px-1}}, ports: [{{port: 3128}}]}}\n",
        ns = ns.name()
    );
    control_plane()
        .await
        .kubectl_run(&["apply", "-f", "-"], Some(&manifest))
        .await
        .unwrap();
}

/// The victim's labels, as a template or selector of the hostile instance would carry them.
fn victims_labels() -> Value {
    json!({
        "proxy-operator.dev/provider": "victim",
        "plugin.proxy-operator.dev/proxy": "px-1",
        "plugin.proxy-operator.dev/component": "egress-proxy",
    })
}

/// A Pod template of the hostile instance: restricted, its own ConfigMap, labelled `labels`.
fn template_labelled(labels: Value) -> Value {
    let pod = restricted_pod("x", "own-conf");
    json!({"metadata": {"labels": labels}, "spec": pod["spec"]})
}

/// Issue #47: templates were confined only in objects with both `spec.template` and
/// `spec.selector`, so a ReplicationController of `replicas: 0` whose template (and so its
/// default selector) carried another instance's labels adopted and deleted that instance's squid
/// Pods; a Job's Pods joined its Service; a PodDisruptionBudget could hold its Pods from
/// eviction. Each is refused naming the field, nothing is made, and the victim's Pod, Service
/// and endpoints are unchanged.
#[rstest]
#[case::replication_controller_adopts_by_its_template("v1", "ReplicationController", json!({"replicas": 0, "template": template_labelled(victims_labels())}), "spec.template.metadata.labels: label `proxy-operator.dev/provider` \"victim\"")]
#[case::replication_controller_adopts_by_its_selector("v1", "ReplicationController", json!({"replicas": 0, "selector": victims_labels(), "template": template_labelled(json!({"plugin.proxy-operator.dev/proxy": "px-1"}))}), "spec.selector.proxy-operator.dev/provider \"victim\"")]
#[case::job_joins_its_service("batch/v1", "Job", json!({"template": with(template_labelled(victims_labels()), "/spec/restartPolicy", json!("Never"))}), "spec.template.metadata.labels: label `proxy-operator.dev/provider` \"victim\"")]
#[case::cronjob_joins_its_service("batch/v1", "CronJob", json!({"schedule": "* * * * *", "jobTemplate": {"spec": {"template": with(template_labelled(victims_labels()), "/spec/restartPolicy", json!("Never"))}}}), "spec.jobTemplate.spec.template.metadata.labels: label `proxy-operator.dev/provider` \"victim\"")]
#[case::pod_template_of_the_victim("v1", "PodTemplate", json!(null), "template.metadata.labels: label `proxy-operator.dev/provider` \"victim\"")]
#[case::deployment_template_of_the_victim("apps/v1", "Deployment", json!({"replicas": 0, "selector": {"matchLabels": {"plugin.proxy-operator.dev/proxy": "px-1"}}, "template": template_labelled(victims_labels())}), "spec.template.metadata.labels: label `proxy-operator.dev/provider` \"victim\"")]
#[case::disruption_budget_shields_its_pods("policy/v1", "PodDisruptionBudget", json!({"maxUnavailable": 0, "selector": {"matchLabels": victims_labels()}}), "spec.selector.matchLabels.proxy-operator.dev/provider \"victim\"")]
#[case::statefulset_claims_storage("apps/v1", "StatefulSet", json!({"replicas": 0, "serviceName": "x", "selector": {"matchLabels": {"plugin.proxy-operator.dev/app": "x"}}, "template": template_labelled(json!({"plugin.proxy-operator.dev/app": "x"})), "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}), "spec.volumeClaimTemplates is not allowed")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_reaching_another_instances_pods_is_refused_and_they_are_unchanged(
    #[case] api_version: &str,
    #[case] kind: &str,
    #[case] spec: Value,
    #[case] says: &str,
) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-nested").await.unwrap();
    another_instances_squid(&ns).await;
    let before = selected_by(&ns, "victim-squid").await;
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/ConfigMap", &format!("{api_version}/{kind}")],
        OperatorObjects::default(),
    )
    .await;
    let own = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "own-conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &own).await.unwrap();
    let mut object =
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "hostile"}});
    if kind == "PodTemplate" {
        object["template"] = template_labelled(victims_labels());
    } else {
        object["spec"] = spec;
    }
    match apply(&provider, &object).await {
        Err(ProviderError::Denied(m)) => assert!(m.contains(says), "{m}"),
        other => panic!("{kind}: expected a denial, got {other:?}"),
    }
    assert_not_made(cp, &ns, kind, "hostile").await;
    assert_eq!(
        selected_by(&ns, "victim-squid").await,
        before,
        "the victim's Pod and its Service's endpoints are unchanged"
    );
}

/// The victim Pod's labels, owner references and deletion mark, and its Service's endpoints.
async fn selected_by(ns: &TestNamespace, name: &str) -> (Value, Vec<String>) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let pods: Api<Pod> = Api::namespaced(ns.client(), ns.name());
    let pod = pods.get(name).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(ns.client(), ns.name());
    let listed = slices
        .list(
            &kube::api::ListParams::default().labels(&format!("kubernetes.io/service-name={name}")),
        )
        .await
        .unwrap();
    (
        json!({
            "labels": pod.metadata.labels,
            "ownerReferences": pod.metadata.owner_references,
            "deletionTimestamp": pod.metadata.deletion_timestamp,
        }),
        listed
            .items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect(),
    )
}

/// Issue #47: each kind of the list, applied by the instance, keeps to its own Pods: every
/// template carries its label (the API server's stored object says so) and every selector
/// selects by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_the_list_is_made_confined_to_the_instance() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-confined").await.unwrap();
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &[
            "v1/ConfigMap",
            "v1/ReplicationController",
            "batch/v1/Job",
            "batch/v1/CronJob",
            "v1/PodTemplate",
            "policy/v1/PodDisruptionBudget",
            "apps/v1/Deployment",
        ],
        OperatorObjects::default(),
    )
    .await;
    let own = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "own-conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &own).await.unwrap();
    let mine = json!({"plugin.proxy-operator.dev/app": "squid"});
    let job_template = with(
        template_labelled(mine.clone()),
        "/spec/restartPolicy",
        json!("Never"),
    );
    let objects = [
        (
            json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"}, "spec": {"replicas": 0, "template": template_labelled(mine.clone())}}),
            vec![".spec.template.metadata.labels", ".spec.selector"],
        ),
        (
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"}, "spec": {"suspend": true, "template": job_template}}),
            vec![".spec.template.metadata.labels"],
        ),
        (
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cron"}, "spec": {"schedule": "* * * * *", "suspend": true, "jobTemplate": {"spec": {"template": job_template}}}}),
            vec![
                ".spec.jobTemplate.metadata.labels",
                ".spec.jobTemplate.spec.template.metadata.labels",
            ],
        ),
        (
            json!({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tpl"}, "template": template_labelled(mine.clone())}),
            vec![".template.metadata.labels"],
        ),
        (
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb"}, "spec": {"maxUnavailable": 1, "selector": {}}}),
            vec![".spec.selector.matchLabels"],
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "deploy"}, "spec": {"replicas": 0, "selector": {"matchLabels": mine}, "template": template_labelled(json!({"plugin.proxy-operator.dev/app": "squid"}))}}),
            vec![
                ".spec.selector.matchLabels",
                ".spec.template.metadata.labels",
            ],
        ),
    ];
    for (object, paths) in objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        apply(&provider, &object)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e:?}"));
        for path in paths {
            let jsonpath = format!("jsonpath={{{path}.proxy-operator\\.dev/provider}}");
            let value = cp
                .kubectl_run(&["get", kind, name, "-n", ns.name(), "-o", &jsonpath], None)
                .await
                .unwrap();
            assert_eq!(value.trim(), "kube-sandbox", "{kind} {path}");
        }
    }
}

/// Issue #47: a plugin's Pods ran any image. Every container, at every depth, runs an image of
/// `grants.kube.images` (here `squid:6`); nothing is made otherwise.
#[rstest]
#[case::pod("/spec/containers/0/image", "docker.io/library/alpine:3", false)]
#[case::another_tag_of_the_granted_image("/spec/containers/0/image", "squid:latest", false)]
#[case::another_registry("/spec/containers/0/image", "registry.example/library/squid:6", false)]
#[case::init_container("/spec/initContainers", "curlimages/curl:8", false)]
#[case::in_a_cronjob("/spec/containers/0/image", "docker.io/library/alpine:3", true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_an_image_the_grant_does_not_list_is_refused(
    #[case] at: &str,
    #[case] image: &str,
    #[case] in_a_cronjob: bool,
) {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-images").await.unwrap();
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/Pod", "v1/ConfigMap", "batch/v1/CronJob"],
        OperatorObjects::default(),
    )
    .await;
    let own = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "own-conf"}, "data": {"squid.conf": ""}});
    apply(&provider, &own).await.unwrap();
    let value = if at.ends_with("initContainers") {
        json!([{"name": "fetch", "image": image, "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}])
    } else {
        json!(image)
    };
    let pod = with(restricted_pod("imaged", "own-conf"), at, value);
    let (object, field) = if in_a_cronjob {
        let template = with(
            json!({"spec": pod["spec"]}),
            "/spec/restartPolicy",
            json!("Never"),
        );
        (
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "imaged"}, "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}}),
            "spec.jobTemplate.spec.template.spec.containers[0].image",
        )
    } else if at.ends_with("initContainers") {
        (pod, "spec.initContainers[0].image")
    } else {
        (pod, "spec.containers[0].image")
    };
    match apply(&provider, &object).await {
        Err(ProviderError::Denied(m)) => assert!(
            m.contains(&format!(
                "{field} `{image}` is not in grants.kube.images (squid:6)"
            )),
            "{m}"
        ),
        other => panic!("{image}: expected a denial, got {other:?}"),
    }
    let kind = object["kind"].as_str().unwrap();
    assert_not_made(cp, &ns, kind, "imaged").await;
    apply(&provider, &restricted_pod("imaged", "own-conf"))
        .await
        .expect("the granted image is admitted");
}

/// No object `kind`/`name` exists in `ns` (a refused create made nothing), as kubectl sees it.
async fn assert_not_made(cp: &ControlPlane, ns: &TestNamespace, kind: &str, name: &str) {
    let made = cp
        .kubectl_run(
            &[
                "get",
                kind,
                name,
                "-n",
                ns.name(),
                "--ignore-not-found",
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert!(made.trim().is_empty(), "{kind} {name} was made: {made}");
}
