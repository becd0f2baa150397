//! The `kube` capability's allow-list against a plugin applying whatever it likes (the test
//! provider's `kubeApply`), through the real runtime and the real API server: every Pod field
//! that would reach the node, the API, a Secret or somebody else's ConfigMap is refused, naming
//! the field, and nothing is made; the operator's own objects are out of reach.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, PostParams};
use proxy_operator::capabilities::kube::OperatorObjects;
use proxy_operator::plugins::types::ProviderError;
use proxy_operator::plugins::{EngineOptions, ProviderInstance};
use rstest::rstest;
use serde_json::{Value, json};

use super::common::{spec, test_options};
use super::{bound_provider, control_plane, refused};

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
        json!({"kube": {"namespace": namespace, "kinds": kinds}}),
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
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "escape"},
        "spec": {
            "selector": {"matchLabels": {"app": "escape"}},
            "template": {"metadata": {"labels": {"app": "escape"}}, "spec": escape["spec"]},
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

#[rstest]
#[case::plugins_configmap("v1", "ConfigMap", "provider-plugins")]
#[case::providers_config("v1", "ConfigMap", "providers-config")]
#[case::lease_table("v1", "ConfigMap", "po-leases")]
#[case::abandoned_record("v1", "ConfigMap", "po-abandoned")]
#[case::leader_lease("coordination.k8s.io/v1", "Lease", "po-leader")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_own_objects_are_out_of_reach_in_its_namespace(
    #[case] api_version: &str,
    #[case] kind: &str,
    #[case] name: &str,
) {
    let cp = control_plane().await;
    // The grant names the operator's own namespace: still, its objects are not the plugin's.
    let ns = cp.namespace("px-kube-own").await.unwrap();
    let objects = OperatorObjects::of(
        "po",
        ns.name(),
        "providers-config",
        Some((ns.name(), "provider-plugins")),
    );
    let provider = kube_plugin(
        ns.client(),
        ns.name(),
        &["v1/ConfigMap", "coordination.k8s.io/v1/Lease"],
        objects,
    )
    .await;
    let object = match kind {
        "Lease" => {
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": {"holderIdentity": "the-plugin"}})
        }
        _ => {
            json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "binaryData": {"kvm.wasm": "AGFzbQ=="}})
        }
    };
    match apply(&provider, &object).await {
        Err(ProviderError::Denied(m)) => {
            assert!(m.contains("one of the operator's own objects"), "{m}")
        }
        other => panic!("{name}: expected a denial, got {other:?}"),
    }
    let exists = if kind == "Lease" {
        let leases: Api<Lease> = Api::namespaced(ns.client(), ns.name());
        leases.get_opt(name).await.unwrap().is_some()
    } else {
        let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
        maps.get_opt(name).await.unwrap().is_some()
    };
    assert!(!exists, "{name} was not created");
    // Deleting one is refused the same way (the test provider deletes ConfigMaps by id).
    if kind == "ConfigMap" {
        match refused(provider.delete(name).await) {
            ProviderError::Denied(m) => {
                assert!(m.contains("one of the operator's own objects"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
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
