//! The `kube` capability through the real runtime, the real test-provider component and the real
//! API server: a provider keeps its instances as ConfigMaps in its granted namespace, labelled
//! with its name; every way out of the grant is refused.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use proxy_operator::provider::plugins::types::ProviderError;
use proxy_operator::provider::plugins::{EngineOptions, ProviderInstance};

use super::common::{spec, test_options};
use super::{bound_provider, control_plane, listed_ids, operator_account, refused};

/// The test provider keeping its instances as ConfigMaps, calling the API server as `client`.
async fn kube_provider(
    client: kube::Client,
    name: &str,
    grants: serde_json::Value,
) -> Result<ProviderInstance, String> {
    let options = EngineOptions {
        kube: Some(client),
        ..test_options()
    };
    bound_provider(
        options,
        "test",
        name,
        &serde_json::json!({ "endpoint": "kube:" }),
        grants,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_keeps_objects_in_its_namespace_and_nothing_else() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-cap").await.unwrap();
    let other = cp.namespace("px-kube-other").await.unwrap();
    let grant =
        serde_json::json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap", "v1/Pod"]}});
    let provider = kube_provider(ns.client(), "kube-store", grant.clone())
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());

    // A whole life: create, get, list, delete.
    let created = provider
        .create(spec("px-one", serde_json::json!({})))
        .await
        .unwrap();
    assert_eq!(created.provider_id, "px-one");
    let stored = maps.get("px-one").await.unwrap();
    let labels = stored.metadata.labels.unwrap();
    assert_eq!(labels["proxy-operator.dev/provider"], "kube-store");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "proxy-operator");
    assert_eq!(
        stored.metadata.managed_fields.unwrap()[0]
            .manager
            .as_deref(),
        Some("proxy-operator.kube-store"),
        "server-side apply under the provider instance's field manager"
    );
    let got = provider.get("px-one").await.unwrap();
    assert_eq!(got.owner.unwrap().uid, "uid-px-one");
    assert_eq!(listed_ids(&provider).await, ["px-one"]);
    let checked = provider.check().await.unwrap();
    assert!(checked[0].ok, "{checked:?}");

    // Somebody else's ConfigMap in the same namespace: invisible, and never taken over.
    let mut foreign = ConfigMap::default();
    foreign.metadata.name = Some("someone-elses".into());
    foreign.data = Some([("owner".to_string(), "a person".to_string())].into());
    maps.create(&PostParams::default(), &foreign).await.unwrap();
    assert_eq!(
        listed_ids(&provider).await,
        ["px-one"],
        "only its own objects are listed"
    );
    let read = provider
        .create(spec(
            "x",
            serde_json::json!({"kubeGet": {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-elses"}}),
        ))
        .await;
    assert!(matches!(refused(read), ProviderError::NotFound(_)));
    let takeover = provider
        .create(spec(
            "x",
            serde_json::json!({"kubeApply": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-elses"}, "data": {"owner": "the plugin"}}}),
        ))
        .await;
    match refused(takeover) {
        ProviderError::Denied(m) => assert!(
            m.contains("not managed by provider instance kube-store"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        maps.get("someone-elses").await.unwrap().data.unwrap()["owner"],
        "a person"
    );
    provider.delete("someone-elses").await.unwrap();
    assert!(
        maps.get_opt("someone-elses").await.unwrap().is_some(),
        "not deleted"
    );

    // A cluster-scoped kind cannot even be granted: no kind of the host's list is (#47).
    let cluster_scoped = serde_json::json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap", "rbac.authorization.k8s.io/v1/ClusterRole"]}});
    let Err(error) = kube_provider(ns.client(), "kube-cluster", cluster_scoped).await else {
        panic!("a ClusterRole grant was bound");
    };
    assert!(
        error.contains(
            "`rbac.authorization.k8s.io/v1/ClusterRole` is not a kind the host has a policy for"
        ),
        "{error}"
    );

    // Another namespace, a kind not granted (a cluster-scoped one too): refused.
    let refusals = [
        (
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": other.name()}}),
            "is not granted",
        ),
        (
            serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}}),
            "not in grants.kube.kinds",
        ),
        (
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            }}),
            "(volume root) is a `hostPath` volume",
        ),
        (
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "a"}}),
            "not in grants.kube.kinds",
        ),
    ];
    for (object, why) in refusals {
        match refused(
            provider
                .create(spec(
                    "x",
                    serde_json::json!({ "kubeApply": object.clone() }),
                ))
                .await,
        ) {
            ProviderError::Denied(m) => assert!(m.contains(why), "{m}"),
            other => panic!("{object}: {other:?}"),
        }
    }
    let other_maps: Api<ConfigMap> = Api::namespaced(ns.client(), other.name());
    assert!(other_maps.get_opt("a").await.unwrap().is_none());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ns.client(), ns.name());
    assert!(
        pods.get_opt("a").await.unwrap().is_none(),
        "no Pod with the node's disk"
    );

    provider.delete("px-one").await.unwrap();
    assert!(maps.get_opt("px-one").await.unwrap().is_none());
    assert!(matches!(
        refused(provider.get("px-one").await),
        ProviderError::NotFound(_)
    ));
    provider
        .delete("px-one")
        .await
        .expect("deleting again is fine");

    // Without a grant every call is denied; Secrets cannot be granted at all.
    let ungranted = kube_provider(ns.client(), "no-kube", serde_json::json!({}))
        .await
        .unwrap();
    match refused(ungranted.list().await) {
        ProviderError::Denied(m) => assert!(m.contains("grants.kube"), "{m}"),
        other => panic!("{other:?}"),
    }
    let secrets = kube_provider(
        ns.client(),
        "secrets",
        serde_json::json!({"kube": {"namespace": ns.name(), "kinds": ["v1/Secret"]}}),
    )
    .await
    .unwrap_err();
    assert!(
        secrets.contains("grants.kube.kinds[0]: Secrets cannot be granted"),
        "{secrets}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_account_needs_the_sample_role_in_the_granted_namespace() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kube-rbac").await.unwrap();
    let service_account = operator_account(cp);
    let grant = serde_json::json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap"]}});
    let provider = kube_provider(service_account, "rbac-store", grant)
        .await
        .unwrap();
    match refused(
        provider
            .create(spec("px-rbac", serde_json::json!({})))
            .await,
    ) {
        ProviderError::Unauthorized(m) => assert!(m.contains("needs a Role"), "{m}"),
        other => panic!("{other:?}"),
    }
    let sample = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/samples/kube-grant-role.yaml"
    ))
    .unwrap()
    .replace("namespace: proxies", &format!("namespace: {}", ns.name()));
    cp.kubectl_run(&["apply", "-f", "-"], Some(&sample))
        .await
        .unwrap();
    // The API server's authorizer learns the Role from its informer: await it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let created = loop {
        match provider
            .create(spec("px-rbac", serde_json::json!({})))
            .await
        {
            Ok(created) => break created,
            Err(e)
                if matches!(e.provider_error(), Some(ProviderError::Unauthorized(_)))
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(created.provider_id, "px-rbac");
    provider.delete("px-rbac").await.unwrap();
}
