//! The chart's values a platform team sets instead of forking the chart (issue 53): a cloud
//! identity on the ServiceAccount (IRSA's annotation) and a cloud key mounted from a Secret (the
//! gcp provider's) through values only, rendered and installed in a real API server; the
//! ServiceAccount's name, priority, spread, affinity and the security contexts (OpenShift's
//! assigned uid); `replicaCount` and the old `replicas`; NOTES.txt; the provider namespaces
//! left in place by `helm uninstall`; the monitoring objects' labels (kube-prometheus-stack's
//! `release` selector), more metrics readers and the runbooks' address.

use serde_json::{Value, json};

use super::helm::{chart, helm_against, key, on_the_chart, template};
use super::yaml_objects;

/// IRSA's annotation, the gcp provider's key from the Secret `gcp-key` (docs/providers/gcp.md),
/// and the scheduling values; a kubernetes provider instance beside it, whose namespace the
/// chart makes.
const CLOUD_VALUES: &str = r#"
serviceAccount:
  annotations:
    eks.amazonaws.com/role-arn: arn:aws:iam::123456789012:role/proxy-operator
extraVolumes:
  - name: gcp-key
    secret: {secretName: gcp-key}
extraVolumeMounts:
  - {name: gcp-key, mountPath: /var/run/secrets/gcp, readOnly: true}
extraEnv:
  - {name: HEALTH_INTERVAL, value: 10s}
priorityClassName: system-cluster-critical
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector: {matchLabels: {app.kubernetes.io/name: proxy-operator}}
providers:
  - name: in-cluster
    type: kubernetes
    grants: {kube: {namespace: proxies, kinds: ["v1/Pod"]}}
  - name: gcp-europe
    type: gcp
    config: {project: my-project, zones: [europe-west1-b]}
    grants:
      http:
        allow: ["https://compute.googleapis.com"]
        credentials:
          - url: https://compute.googleapis.com
            header: Authorization
            prefix: "Bearer "
            valueFrom:
              gcpServiceAccountKey: /var/run/secrets/gcp/key.json
"#;

fn values_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

fn object<'a>(objects: &'a [Value], k: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| key(o) == k)
        .unwrap_or_else(|| panic!("{k} not rendered"))
}

/// What CLOUD_VALUES must give, in objects as rendered or as the API server returns them.
fn check_cloud_identity(service_account: &Value, deployment: &Value) {
    assert_eq!(
        service_account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::123456789012:role/proxy-operator",
        "{service_account:#}"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "proxy-operator");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let volumes = pod["volumes"].as_array().unwrap();
    let names: Vec<&str> = volumes
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["config", "tmp", "discovery-tls", "gcp-key"]);
    assert_eq!(volumes[3]["secret"]["secretName"], "gcp-key");
    let container = &pod["containers"][0];
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "gcp-key")
        .unwrap_or_else(|| panic!("no gcp-key mount: {container:#}"));
    assert_eq!(mount["mountPath"], "/var/run/secrets/gcp");
    assert_eq!(mount["readOnly"], true);
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "HEALTH_INTERVAL", "value": "10s"})),
        "{container:#}"
    );
    // The defaults the values left alone.
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "kubernetes.io/hostname"
    );
}

#[test]
fn a_cloud_identity_and_a_mounted_gcp_key_come_from_values_only() {
    let file = values_file(CLOUD_VALUES);
    let objects = template(&["-f", file.path().to_str().unwrap()]);
    check_cloud_identity(
        object(&objects, "ServiceAccount/proxy-operator/proxy-operator"),
        object(&objects, "Deployment/proxy-operator/proxy-operator"),
    );
    // The providers config names the key where the volume is mounted.
    let config = object(&objects, "ConfigMap/proxy-operator/providers-config");
    let providers = yaml_objects(config["data"]["providers.yaml"].as_str().unwrap()).remove(0);
    assert_eq!(
        providers["providers"][1]["grants"]["http"]["credentials"][0]["valueFrom"]["gcpServiceAccountKey"],
        "/var/run/secrets/gcp/key.json"
    );
}

#[test]
fn the_service_account_can_be_one_made_elsewhere_and_every_binding_names_it() {
    let objects = template(&[
        "--set",
        "serviceAccount.create=false,serviceAccount.name=platform-operator",
    ]);
    assert!(
        !objects.iter().any(|o| o["kind"] == "ServiceAccount"),
        "no ServiceAccount made"
    );
    let deployment = object(&objects, "Deployment/proxy-operator/proxy-operator");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "platform-operator"
    );
    for k in [
        "ClusterRoleBinding/proxy-operator",
        "RoleBinding/proxy-operator/proxy-operator",
        "RoleBinding/proxies/proxy-operator-plugin-objects",
    ] {
        assert_eq!(
            object(&objects, k)["subjects"],
            json!([{"kind": "ServiceAccount", "name": "platform-operator", "namespace": "proxy-operator"}]),
            "{k}"
        );
    }
    let flow = object(&objects, "FlowSchema/proxy-operator-leader-election");
    assert_eq!(
        flow["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"],
        "platform-operator"
    );
}

#[test]
fn the_security_contexts_keep_restricted_and_drop_the_fixed_uid_for_openshift() {
    let pod = |args: &[&str]| {
        let objects = template(args);
        object(&objects, "Deployment/proxy-operator/proxy-operator")["spec"]["template"]["spec"]
            .clone()
    };
    let default = pod(&[]);
    assert_eq!(
        default["securityContext"],
        json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
               "seccompProfile": {"type": "RuntimeDefault"}})
    );
    // OpenShift's restricted-v2 assigns the uid: the fixed one removed, the rest kept.
    let openshift = pod(&[
        "--set",
        "podSecurityContext.runAsUser=null,podSecurityContext.runAsGroup=null",
    ]);
    assert_eq!(
        openshift["securityContext"],
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    assert_eq!(
        openshift["containers"][0]["securityContext"],
        json!({"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
               "capabilities": {"drop": ["ALL"]}})
    );
    // Affinity is merged; the default anti-affinity can be removed.
    let no_anti = pod(&["--set", "affinity.podAntiAffinity=null"]);
    assert!(no_anti.get("affinity").is_none(), "{no_anti:#}");
}

/// `helm install --dry-run=client` (no cluster): the rendered manifest and NOTES.txt.
fn dry_run(args: &[&str]) -> String {
    let mut all = vec!["--dry-run=client"];
    all.extend_from_slice(args);
    on_the_chart("install", &all)
}

fn notes(output: &str) -> &str {
    output
        .split_once("NOTES:\n")
        .unwrap_or_else(|| panic!("no NOTES in:\n{output}"))
        .1
}

#[test]
fn replica_count_and_the_old_replicas_key_which_notes_warn_about() {
    let replicas = |args: &[&str]| {
        object(&template(args), "Deployment/proxy-operator/proxy-operator")["spec"]["replicas"]
            .clone()
    };
    assert_eq!(replicas(&[]), 2);
    assert_eq!(replicas(&["--set", "replicaCount=3"]), 3);
    assert_eq!(
        replicas(&["--set", "replicas=1"]),
        1,
        "the old key still works"
    );

    let plain = dry_run(&[]);
    let said = notes(&plain);
    assert!(!said.contains("WARNING"), "{said}");
    for next in [
        "kubectl -n proxy-operator rollout status deployment/proxy-operator",
        "kubectl get providerhealths",
        "proxy-operator-discovery-tls",
        "kubectl apply -f deploy/samples/proxy_kubernetes.yaml",
        "kubectl px status --operator-namespace proxy-operator",
        "kubectl px lease",
        "provider namespaces this chart made (proxies)",
    ] {
        assert!(said.contains(next), "NOTES.txt says {next:?}:\n{said}");
    }
    let old = dry_run(&["--set", "replicas=1"]);
    let said = notes(&old);
    assert!(
        said.contains("WARNING: the value `replicas` is deprecated; rename it `replicaCount`"),
        "{said}"
    );
}

/// `kubectl ARGS -o json` against `cp`.
async fn get(cp: &harness::ControlPlane, args: &[&str]) -> Value {
    let text = cp
        .kubectl_run(&[args, &["-o", "json"]].concat(), None)
        .await
        .unwrap_or_else(|e| panic!("kubectl {}: {e:#}", args.join(" ")));
    serde_json::from_str(&text).unwrap()
}

/// `helm install` with CLOUD_VALUES into a real API server (its own: the chart's cluster-wide
/// objects have fixed names), read back; then `helm uninstall` leaves the namespace the chart
/// made for the kubernetes provider (`providerNamespaces.keep`) and the CRDs (`crds.keep`). No
/// Pod runs (no kubelet): what is checked is what the API server accepted and stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_with_cloud_values_and_uninstalled_leaving_the_namespaces() {
    let cp = harness::ControlPlane::start().await.expect("control plane");
    let home = tempfile::tempdir().unwrap();
    let file = values_file(CLOUD_VALUES);
    let chart = chart();
    let run = |args: &[&str]| {
        let out = helm_against(&cp, home.path(), args);
        assert!(
            out.status.success(),
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&[
        "install",
        "proxy-operator",
        chart.to_str().unwrap(),
        "--namespace",
        "proxy-operator",
        "--create-namespace",
        "-f",
        file.path().to_str().unwrap(),
    ]);
    check_cloud_identity(
        &get(
            &cp,
            &[
                "-n",
                "proxy-operator",
                "get",
                "serviceaccount/proxy-operator",
            ],
        )
        .await,
        &get(
            &cp,
            &["-n", "proxy-operator", "get", "deployment/proxy-operator"],
        )
        .await,
    );

    run(&[
        "uninstall",
        "proxy-operator",
        "--namespace",
        "proxy-operator",
    ]);
    let namespace = get(&cp, &["get", "namespace/proxies"]).await;
    assert!(
        namespace["metadata"].get("deletionTimestamp").is_none(),
        "helm uninstall deleted the namespace proxies: {namespace:#}"
    );
    assert_eq!(
        namespace["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let crds = get(&cp, &["get", "crd"]).await;
    let every = proxy_operator::api::crd_manifests().len();
    assert_eq!(
        crds["items"].as_array().unwrap().len(),
        every,
        "the CRDs kept"
    );
    let deployments = get(&cp, &["-n", "proxy-operator", "get", "deployments"]).await;
    assert_eq!(
        deployments["items"],
        json!([]),
        "the release's objects gone"
    );
    cp.stop().await;
}

#[test]
fn monitoring_labels_readers_and_runbooks_come_from_values() {
    let file = values_file(
        r#"
monitoring:
  enabled: true
  labels: {release: kube-prometheus-stack}
  metricsReaders:
    - {kind: ServiceAccount, name: prometheus-k8s, namespace: monitoring}
  runbookBaseUrl: https://runbooks.example/proxy-operator/
"#,
    );
    let objects = template(&["-f", file.path().to_str().unwrap()]);
    let monitoring: Vec<&Value> = objects
        .iter()
        .filter(|o| ["ServiceMonitor", "PrometheusRule"].contains(&o["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        monitoring.len(),
        3,
        "two ServiceMonitors and the PrometheusRule"
    );
    for o in &monitoring {
        assert_eq!(
            o["metadata"]["labels"]["release"],
            "kube-prometheus-stack",
            "{}",
            key(o)
        );
    }
    for o in objects.iter().filter(|o| !monitoring.contains(o)) {
        assert!(
            o["metadata"]["labels"].get("release").is_none(),
            "{} labelled",
            key(o)
        );
    }
    assert_eq!(
        object(&objects, "ClusterRoleBinding/proxy-operator-metrics-reader")["subjects"],
        json!([
            {"kind": "ServiceAccount", "name": "proxy-operator-metrics-scraper", "namespace": "proxy-operator"},
            {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"},
        ])
    );
    assert_eq!(
        object(
            &objects,
            "Secret/proxy-operator/proxy-operator-metrics-scraper-token"
        )["type"],
        "kubernetes.io/service-account-token"
    );
    let rule = object(&objects, "PrometheusRule/proxy-operator/proxy-operator");
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        assert_eq!(
            r["annotations"]["runbook_url"],
            format!(
                "https://runbooks.example/proxy-operator/{}.md",
                r["alert"].as_str().unwrap()
            )
        );
    }
    // By default the chart's runbooks are the kustomization's.
    let objects = template(&["--set", "monitoring.enabled=true"]);
    let rule = object(&objects, "PrometheusRule/proxy-operator/proxy-operator");
    let url = rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"]
        .as_str()
        .unwrap();
    assert!(url.starts_with(crate::RUNBOOKS), "{url}");
}
