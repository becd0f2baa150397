//! The Helm chart (deploy/helm/proxy-operator) held to the kustomization: `helm template` with the
//! default values renders the objects `kubectl kustomize deploy/` does, field for field (and with
//! `monitoring.enabled` / `gateway.enabled`, those of an overlay with the component), so the two
//! never drift; `helm lint --strict` passes; values.schema.json refuses what the operator would
//! refuse, naming the field. The helm is the fixture built from its Go module
//! (tests/fixtures/helm/build.sh). cluster_e2e/helm.rs installs the chart in a real cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

use super::{kustomize, repo, with_component, yaml_objects};

/// Labels and annotations the chart adds to every object and the kustomization has no
/// counterpart for: Helm's usual labels, and the CRDs' keep policy (`crds.keep`).
const HELM_ONLY_LABELS: [&str; 4] = [
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];
const HELM_ONLY_ANNOTATIONS: [&str; 1] = ["helm.sh/resource-policy"];

pub(super) fn chart() -> PathBuf {
    repo().join("deploy/helm/proxy-operator")
}

/// Runs the helm fixture with `args`.
pub(super) fn helm(args: &[&str]) -> Output {
    let helm = harness::bins::helm_binary();
    std::process::Command::new(&helm)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", helm.display()))
}

/// `helm COMMAND proxy-operator CHART --namespace proxy-operator` with more `args`: its output,
/// the command having succeeded.
pub(super) fn on_the_chart(command: &str, args: &[&str]) -> String {
    let chart = chart();
    let mut all = vec![
        command,
        "proxy-operator",
        chart.to_str().unwrap(),
        "--namespace",
        "proxy-operator",
    ];
    all.extend_from_slice(args);
    let out = helm(&all);
    assert!(
        out.status.success(),
        "helm {}: {}",
        all.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `helm template proxy-operator CHART --namespace proxy-operator` with more `args`, as objects.
pub(super) fn template(args: &[&str]) -> Vec<Value> {
    // An empty document (a template that renders nothing) is left out.
    yaml_objects(&on_the_chart("template", args))
}

/// An object's identity: `Kind/name`, or `Kind/namespace/name` for a namespaced one.
pub(super) fn key(object: &Value) -> String {
    let meta = &object["metadata"];
    let kind = object["kind"].as_str().unwrap_or("?");
    let name = meta["name"].as_str().unwrap_or("?");
    match meta["namespace"].as_str() {
        Some(namespace) => format!("{kind}/{namespace}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The objects by key, without what only Helm adds, and with the providers config parsed (the
/// kustomization's has comments, the chart's is the values rendered as YAML).
fn normalized(objects: Vec<Value>) -> BTreeMap<String, Value> {
    let mut by_key = BTreeMap::new();
    for mut object in objects {
        let meta = object["metadata"].as_object_mut().expect("metadata");
        for (field, helm_only) in [
            ("labels", &HELM_ONLY_LABELS[..]),
            ("annotations", &HELM_ONLY_ANNOTATIONS[..]),
        ] {
            if let Some(map) = meta.get_mut(field).and_then(Value::as_object_mut) {
                map.retain(|k, _| !helm_only.contains(&k.as_str()));
                if map.is_empty() {
                    meta.remove(field);
                }
            }
        }
        if key(&object) == "ConfigMap/proxy-operator/providers-config" {
            let text = object["data"]["providers.yaml"]
                .as_str()
                .unwrap()
                .to_owned();
            object["data"]["providers.yaml"] =
                proxy_operator::support::yaml::from_str(&text).unwrap();
        }
        let previous = by_key.insert(key(&object), object);
        assert!(previous.is_none(), "{:?} twice", previous.map(|o| key(&o)));
    }
    by_key
}

/// Where `a` (the kustomization's) and `b` (the chart's) differ, one line per field:
/// `spec.template.spec.containers[0].image: kustomize "x", chart "y"`. Numbers compare by value
/// (the CRDs say `maximum: 65535.0`, Helm's YAML writes 65535).
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    let at = |sub: &str| {
        if path.is_empty() {
            sub.to_owned()
        } else if sub.starts_with('[') {
            format!("{path}{sub}")
        } else {
            format!("{path}.{sub}")
        }
    };
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let missing = Value::String("<absent>".into());
                let (x, y) = (a.get(k).unwrap_or(&missing), b.get(k).unwrap_or(&missing));
                differences(&at(k), x, y, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                differences(&at(&format!("[{i}]")), x, y, out);
            }
        }
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => {}
        (x, y) if x == y => {}
        (x, y) => out.push(format!(
            "{}: kustomize {x}, chart {y}",
            if path.is_empty() { "." } else { path }
        )),
    }
}

/// Every difference between the kustomization's objects and the chart's, named by object and
/// field. An object only one side has is one line.
fn compare(kustomized: Vec<Value>, rendered: Vec<Value>) -> Vec<String> {
    let (a, b) = (normalized(kustomized), normalized(rendered));
    let mut out = Vec::new();
    for k in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
        match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => {
                let mut fields = Vec::new();
                differences("", x, y, &mut fields);
                out.extend(fields.into_iter().map(|f| format!("{k}: {f}")));
            }
            (Some(_), None) => out.push(format!("{k}: only in the kustomization")),
            (None, Some(_)) => out.push(format!("{k}: only in the chart")),
            (None, None) => unreachable!(),
        }
    }
    out
}

/// A difference by design: the operator's own Namespace is Helm's (`helm install --namespace`,
/// labelled by the user: README), not an object of the release.
const BY_DESIGN: &str = "Namespace/proxy-operator: only in the kustomization";

/// The chart's appVersion (Chart.yaml).
fn app_version() -> String {
    let text = std::fs::read_to_string(chart().join("Chart.yaml")).unwrap();
    let chart = yaml_objects(&text).remove(0);
    chart["appVersion"].as_str().unwrap().to_owned()
}

/// The other difference by design, in the operator's and the gateway's Deployment: the image's
/// tag. The chart's default is its release's, `v<appVersion>` (the tag `make release` gives
/// the image), the kustomization's `dev` (`make image`'s; install.yaml pins the release's
/// digest); `image.tag=dev` renders the kustomization's.
fn image_tag_by_design(deployment: &str) -> String {
    format!(
        "Deployment/proxy-operator/{deployment}: spec.template.spec.containers[0].image: \
         kustomize \"proxy-operator:dev\", chart \"proxy-operator:v{}\"",
        app_version()
    )
}

fn assert_same(what: &str, kustomized: Vec<Value>, rendered: Vec<Value>) {
    let by_design = [
        BY_DESIGN.to_owned(),
        image_tag_by_design("proxy-operator"),
        image_tag_by_design("proxy-operator-gateway"),
    ];
    let differ: Vec<String> = compare(kustomized, rendered)
        .into_iter()
        .filter(|d| !by_design.contains(d))
        .collect();
    assert!(
        differ.is_empty(),
        "{what}: the chart and the kustomization differ (change both, deploy/ and \
         deploy/helm/proxy-operator):\n  {}",
        differ.join("\n  ")
    );
}

#[test]
fn helm_template_renders_what_kubectl_kustomize_deploy_does() {
    let kustomized = kustomize(&repo().join("deploy"));
    let rendered = template(&[]);
    // The comparison itself tells a difference, by object and field.
    let mut changed = rendered.clone();
    let deployment = changed
        .iter_mut()
        .find(|o| key(o) == "Deployment/proxy-operator/proxy-operator")
        .expect("the chart renders the operator's Deployment");
    deployment["spec"]["replicas"] = 3.into();
    assert_eq!(
        compare(kustomized.clone(), changed),
        [
            "Deployment/proxy-operator/proxy-operator: spec.replicas: kustomize 2, chart 3".into(),
            image_tag_by_design("proxy-operator"),
            BY_DESIGN.to_owned(),
        ]
    );
    assert_same("default values", kustomized.clone(), rendered);
    // With the kustomization's tag, the Namespace is the only difference.
    assert_eq!(
        compare(kustomized, template(&["--set", "image.tag=dev"])),
        [BY_DESIGN]
    );
}

#[test]
fn with_monitoring_on_the_chart_renders_the_monitoring_component() {
    assert_same(
        "monitoring.enabled=true",
        with_component("deploy/monitoring"),
        template(&["--set", "monitoring.enabled=true"]),
    );
}

#[test]
fn with_the_gateway_on_the_chart_renders_the_gateway_component() {
    assert_same(
        "gateway.enabled=true",
        with_component("deploy/gateway"),
        template(&["--set", "gateway.enabled=true"]),
    );
}

#[test]
fn helm_lint_strict_passes_with_every_switch() {
    let chart = chart();
    for switches in [
        &[][..],
        &["--set", "monitoring.enabled=true,gateway.enabled=true"][..],
        &[
            "--set",
            "crds.install=false,providerNamespaces.create=false",
        ][..],
    ] {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend_from_slice(switches);
        let out = helm(&args);
        assert!(
            out.status.success(),
            "helm {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_crd_and_image_switches_do_what_values_yaml_says() {
    let crds = |objects: &[Value]| -> Vec<Value> {
        objects
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .cloned()
            .collect()
    };
    // By default the CRDs are installed and kept when the release is uninstalled.
    let every = proxy_operator::api::crd_manifests().len();
    let kept = crds(&template(&[]));
    assert_eq!(kept.len(), every);
    for crd in &kept {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep",
            "{}",
            key(crd)
        );
    }
    let not_kept = crds(&template(&["--set", "crds.keep=false"]));
    assert_eq!(not_kept.len(), every);
    assert!(
        not_kept
            .iter()
            .all(|c| c["metadata"].get("annotations").is_none())
    );
    assert!(crds(&template(&["--set", "crds.install=false"])).is_empty());

    // A digest pins the image of the operator and the gateway alike.
    let digest = format!("sha256:{}", "ab".repeat(32));
    let objects = template(&[
        "--set",
        &format!(
            "image.repository=registry.example/proxy-operator,image.digest={digest},gateway.enabled=true"
        ),
    ]);
    for deployment in ["proxy-operator", "proxy-operator-gateway"] {
        let object = objects
            .iter()
            .find(|o| key(o) == format!("Deployment/proxy-operator/{deployment}"))
            .unwrap();
        assert_eq!(
            object["spec"]["template"]["spec"]["containers"][0]["image"],
            format!("registry.example/proxy-operator@{digest}")
        );
    }
}

#[test]
fn a_second_granted_namespace_gets_its_namespace_and_role() {
    let values = r#"
providers:
  - name: in-cluster
    type: kubernetes
    grants: {kube: {namespace: proxies, kinds: ["v1/Pod"]}}
  - name: team-b
    type: kubernetes
    grants: {kube: {namespace: proxies-b, kinds: ["v1/Pod"]}}
  - name: vendor
    type: upstream
"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), values).unwrap();
    let keys: BTreeSet<String> = template(&["-f", file.path().to_str().unwrap()])
        .iter()
        .map(key)
        .collect();
    for namespace in ["proxies", "proxies-b"] {
        for expected in [
            format!("Namespace/{namespace}"),
            format!("Role/{namespace}/proxy-operator-plugin-objects"),
            format!("RoleBinding/{namespace}/proxy-operator-plugin-objects"),
        ] {
            assert!(keys.contains(&expected), "{expected} in {keys:?}");
        }
    }
}

/// `helm template` with a values file: the error text when refused.
fn refusal(values: &str) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), values).unwrap();
    let chart = chart();
    let out = helm(&[
        "template",
        "x",
        chart.to_str().unwrap(),
        "-f",
        file.path().to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "accepted:\n{values}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_values_schema_refuses_unknown_keys_and_wrong_types_naming_the_field() {
    for (values, names) in [
        ("replicas: two\n", &["'/replicas'", "want integer"][..]),
        (
            "replicaCount: two\n",
            &["'/replicaCount'", "want integer"][..],
        ),
        (
            "serviceAccount: {anotations: {}}\n",
            &["'/serviceAccount'", "'anotations'"][..],
        ),
        (
            "providerNamespaces: {kep: true}\n",
            &["'/providerNamespaces'", "'kep'"][..],
        ),
        ("image: {repositry: x}\n", &["'/image'", "'repositry'"][..]),
        ("replica: 3\n", &["'replica'"][..]),
        (
            "gateway: {enabled: yes-please}\n",
            &["'/gateway/enabled'"][..],
        ),
        (
            "gateway: {discoveryUrl: \"http://proxy-operator-discovery:8090\"}\n",
            &["'/gateway/discoveryUrl'", "does not match pattern"][..],
        ),
        (
            "image: {digest: latest}\n",
            &["'/image/digest'", "does not match pattern"][..],
        ),
        (
            "providers:\n  - {name: a, type: kubernetes, grants: {kube: {namespace: p, kinds: [], quota: {objcts: 1}}}}\n",
            &["'/providers/0/grants/kube/quota'", "'objcts'"][..],
        ),
        (
            "providers:\n  - {name: Not_A_Label, type: kubernetes}\n",
            &["'/providers/0/name'"][..],
        ),
    ] {
        let error = refusal(values);
        for name in names {
            assert!(
                error.contains(name),
                "refusing\n{values}the error names {name}:\n{error}"
            );
        }
    }
}

/// The fields values.schema.json takes in a `providers` entry, as paths (`grants.http.allow`);
/// and every object in the schema refuses unknown keys, but the places Kubernetes or a plugin
/// define.
fn schema_fields(schema: &Value, prefix: &str, fields: &mut BTreeSet<String>) {
    let Some(properties) = schema["properties"].as_object() else {
        return;
    };
    assert_eq!(
        schema["additionalProperties"], false,
        "values.schema.json at `{prefix}`: unknown keys must be refused"
    );
    for (name, sub) in properties {
        let path = format!("{prefix}{name}");
        fields.insert(path.clone());
        schema_fields(sub, &format!("{path}."), fields);
        schema_fields(&sub["items"], &format!("{path}[]."), fields);
    }
}

#[test]
fn the_values_schema_takes_exactly_the_providers_config_fields_the_operator_does() {
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .expect("values.schema.json is JSON");
    let mut all = BTreeSet::new();
    schema_fields(&schema, "", &mut all);
    let mut in_schema = BTreeSet::new();
    schema_fields(
        &schema["properties"]["providers"]["items"],
        "",
        &mut in_schema,
    );
    let mut accepted = super::cli::accepted_fields();
    assert!(accepted.remove("providers"), "{accepted:?}");
    let missing: Vec<&String> = accepted.difference(&in_schema).collect();
    let unknown: Vec<&String> = in_schema.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "values.schema.json, providers[]: the fields the operator's parser takes \
         (host/src/provider/config.rs, host/src/provider/capabilities/grants/).\n  missing: {missing:?}\n  \
         not taken by the operator: {unknown:?}"
    );
}

/// `helm ARGS` against the shared control plane, Helm's own state in `home`.
pub(super) fn helm_against(
    cp: &harness::ControlPlane,
    home: &std::path::Path,
    args: &[&str],
) -> Output {
    std::process::Command::new(harness::bins::helm_binary())
        .args(args)
        .env("KUBECONFIG", cp.kubeconfig())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm")
}

/// docs/upgrade.md, "Moving from kustomize to Helm", against a real API server: `helm install`
/// over a kustomize install is refused (its objects are not the release's), and with
/// `--take-ownership --force-conflicts` takes them over (the API server alone: what Helm checks
/// and writes are objects, no Pod runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_takes_over_a_kustomize_install_as_docs_upgrade_md_says() {
    let cp = harness::ControlPlane::shared().await;
    let kubectl = |args: Vec<String>, stdin: Option<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cp.kubectl_run(&args, stdin.as_deref())
            .await
            .unwrap_or_else(|e| panic!("kubectl {}: {e:#}", args.join(" ")))
    };
    let deploy = repo().join("deploy").to_string_lossy().into_owned();
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    kubectl(owned(&["apply", "-k", &deploy]), None).await;

    let home = tempfile::tempdir().unwrap();
    let chart = chart();
    let install = [
        "install",
        "proxy-operator",
        chart.to_str().unwrap(),
        "--namespace",
        "proxy-operator",
    ];
    let refused = helm_against(cp, home.path(), &install);
    assert!(
        !refused.status.success(),
        "helm install over kustomize's objects"
    );
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("invalid ownership metadata"), "{why}");

    // As the doc says: Helm takes the objects over, and the fields kubectl's apply wrote.
    let install = [&install[..], &["--take-ownership", "--force-conflicts"]].concat();
    let adopted = helm_against(cp, home.path(), &install);
    assert!(
        adopted.status.success(),
        "helm install after the objects were marked: {}",
        String::from_utf8_lossy(&adopted.stderr)
    );
    let chart_label = kubectl(
        owned(&[
            "-n",
            "proxy-operator",
            "get",
            "configmap/providers-config",
            "-o",
            "jsonpath={.metadata.labels.helm\\.sh/chart}",
        ]),
        None,
    )
    .await;
    assert!(
        chart_label.starts_with("proxy-operator-"),
        "the chart's labels on the adopted ConfigMap: {chart_label:?}"
    );
}
