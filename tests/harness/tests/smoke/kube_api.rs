use std::time::Duration;

use anyhow::{Context, Result};
use harness::{ControlPlane, TestNamespace};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.harness.test
spec:
  group: smoke.harness.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
"#;

/// kubectl (the real binary) applies a namespace, a CRD and a custom object;
/// kube::Client reads them back.
#[tokio::test]
async fn kubectl_apply_then_read_back_with_kube_client() -> Result<()> {
    let t = std::time::Instant::now();
    let cp = ControlPlane::shared().await;
    eprintln!(
        "shared control plane after {:?} (start took {:?})",
        t.elapsed(),
        cp.started_in()
    );
    let ns = "smoke-kubectl";
    let manifest = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---{CRD}");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&manifest))
        .await?;
    cp.kubectl_run(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/widgets.smoke.harness.test",
        ],
        None,
    )
    .await?;
    let widget = format!(
        "apiVersion: smoke.harness.test/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: {ns}\nspec:\n  size: 3\n"
    );
    cp.kubectl_run(&["apply", "-f", "-"], Some(&widget)).await?;

    let client = cp.client();
    let got = Api::<Namespace>::all(client.clone()).get(ns).await?;
    assert_eq!(got.metadata.name.as_deref(), Some(ns));
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("widgets.smoke.harness.test")
        .await?;
    assert_eq!(crd.spec.names.kind, "Widget");

    let gvk = GroupVersionKind::gvk("smoke.harness.test", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    let w1 = widgets.get("w1").await?;
    assert_eq!(w1.data["spec"]["size"], 3);
    let listed = widgets.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);

    // And kubectl sees what it wrote.
    let out = cp
        .kubectl_run(
            &[
                "get",
                "widgets",
                "-n",
                ns,
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ],
            None,
        )
        .await?;
    assert_eq!(out.trim(), "w1");
    Ok(())
}

/// Namespace per test, and RBAC is enforced for non-admin identities.
#[tokio::test]
async fn test_namespace_and_rbac() -> Result<()> {
    let cp = ControlPlane::shared().await;
    let a = TestNamespace::create(cp, "Smoke RBAC").await?;
    let b = TestNamespace::create(cp, "Smoke RBAC").await?;
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with("smoke-rbac-"), "{}", a.name());

    let sa = format!("system:serviceaccount:{}:default", a.name());
    let as_sa = cp.client_as(&sa, &["system:serviceaccounts", "system:authenticated"]);
    let err = Api::<Secret>::namespaced(as_sa, a.name())
        .list(&ListParams::default())
        .await
        .expect_err("a service account without a RoleBinding must not list secrets");
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
    let admin: Api<Secret> = a.api();
    admin
        .list(&ListParams::default())
        .await
        .context("admin lists secrets")?;
    a.delete().await?;
    b.delete().await?;
    Ok(())
}

/// The second user of the shared instance gets it without a new start.
#[tokio::test]
async fn shared_control_plane_is_shared() -> Result<()> {
    let first = ControlPlane::shared().await as *const ControlPlane;
    let t = std::time::Instant::now();
    let second = ControlPlane::shared().await as *const ControlPlane;
    assert_eq!(first, second);
    assert!(t.elapsed() < Duration::from_secs(1));
    Ok(())
}
