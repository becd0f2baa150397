//! What `deploy/` installs, read the way kubectl reads it (`kubectl kustomize`, the kubectl built
//! for the tests): the objects of `kubectl apply -k deploy/`, a providers config that is no test
//! stand-in, and the monitoring component, whose alerts and dashboard may only query metrics the
//! operator documents (docs/metrics.md). The cluster test (cluster_e2e.rs) applies all of it to a
//! real cluster; this one also covers the monitoring objects, whose CRDs no test cluster has.
//! `cli.rs`: docs/configuration.md held to the command line and the providers config parser, and
//! the shell completion script. `helm.rs`: the Helm chart renders the same objects, its lint and
//! its values schema; `helm_values.rs`: the values a platform team sets (cloud identity, extra
//! volumes, security contexts, replicaCount, NOTES.txt, namespaces kept on uninstall).
//! `alerts.rs`: `promtool check rules` and `promtool test rules` on the alerts.
//! `release.rs`: `make release`'s artifacts (install.yaml, the chart, the image archive, the
//! SBOM, the LICENSE, their sums) and `--version`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "deploy/alerts.rs"]
mod alerts;
#[path = "deploy/cli.rs"]
mod cli;
#[path = "deploy/helm.rs"]
mod helm;
#[path = "deploy/helm_values.rs"]
mod helm_values;
#[path = "deploy/release.rs"]
mod release;
#[path = "common/release.rs"]
#[allow(dead_code)]
mod release_parts;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize DIR`, as objects.
fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = harness::bins::k8s_binary("kubectl");
    let out = std::process::Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_objects(&String::from_utf8(out.stdout).unwrap())
}

/// The objects of a multi-document YAML stream (what kubectl, Helm and `make release` print),
/// read as the operator reads YAML; empty documents are left out.
fn yaml_objects(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple_with_options(text, proxy_operator::support::yaml::options())
        .expect("YAML objects")
}

fn kind_and_name(object: &Value) -> String {
    format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[test]
fn apply_k_deploy_installs_the_operator_and_a_real_providers_config() {
    let objects = kustomize(&repo().join("deploy"));
    let names: BTreeSet<String> = objects.iter().map(kind_and_name).collect();
    for expected in [
        "Namespace/proxy-operator",
        "Namespace/proxies",
        "CustomResourceDefinition/proxies.proxy-operator.dev",
        "CustomResourceDefinition/providerhealths.proxy-operator.dev",
        "CustomResourceDefinition/proxyquotas.proxy-operator.dev",
        "ValidatingAdmissionPolicy/proxy-operator-quota",
        "ValidatingAdmissionPolicyBinding/proxy-operator-quota",
        "ServiceAccount/proxy-operator",
        "ClusterRole/proxy-operator",
        "ClusterRole/proxy-operator-view",
        "ClusterRole/proxy-operator-edit",
        "Role/proxy-operator",
        "Role/proxy-operator-plugin-objects",
        "Deployment/proxy-operator",
        "Service/proxy-operator-discovery",
        "Service/proxy-operator-metrics",
        "PodDisruptionBudget/proxy-operator",
        "NetworkPolicy/proxy-operator",
        "ConfigMap/providers-config",
    ] {
        assert!(
            names.contains(expected),
            "{expected} missing from {names:?}"
        );
    }
    let find = |name: &str| objects.iter().find(|o| kind_and_name(o) == name).unwrap();
    let deployment = find("Deployment/proxy-operator");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "proxy-operator:dev");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    // The operator starts before (or without) the static token's Secret: the README makes it
    // after `apply -k`, and crawlers in the cluster need none (ServiceAccount tokens).
    for env in container["env"].as_array().unwrap() {
        if let Some(secret) = env["valueFrom"].get("secretKeyRef") {
            assert_eq!(
                secret["optional"], true,
                "{env}: the Pod would wait for the Secret"
            );
        }
    }
    // The discovery API over TLS from the Secret's files, mounted optional: the Pod starts
    // before the Secret exists (docs/security.md, "TLS").
    let env = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not set"))["value"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "discovery-tls")
        .expect("the TLS Secret mounted");
    let dir = mount["mountPath"].as_str().unwrap();
    assert_eq!(env("DISCOVERY_TLS_CERT_FILE"), format!("{dir}/tls.crt"));
    assert_eq!(env("DISCOVERY_TLS_KEY_FILE"), format!("{dir}/tls.key"));
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "discovery-tls")
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"],
        "proxy-operator-discovery-tls"
    );
    assert_eq!(volume["secret"]["optional"], true);
    // Who may read the metrics port: kubebuilder's non-resource URL rules.
    for (role, url) in [
        ("ClusterRole/proxy-operator-metrics-reader", "/metrics"),
        ("ClusterRole/proxy-operator-status-reader", "/status"),
    ] {
        let rules = &find(role)["rules"][0];
        assert!(
            rules["nonResourceURLs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u == url)
                && rules["verbs"] == serde_json::json!(["get"]),
            "{role}: {rules}"
        );
    }
    // The discovery Service follows the leader's label; the PDB lets one replica go at a time.
    let discovery = find("Service/proxy-operator-discovery");
    assert_eq!(
        discovery["spec"]["selector"]["proxy-operator.dev/leader"],
        "true"
    );
    assert_eq!(
        find("PodDisruptionBudget/proxy-operator")["spec"]["maxUnavailable"],
        1
    );
    // The discovery API reviews ServiceAccount tokens and asks RBAC; `edit` may lease.
    let grants = |role: &str, group: &str, resource: &str, verb: &str| {
        find(role)["rules"].as_array().unwrap().iter().any(|rule| {
            let has = |field: &str, value: &str| {
                rule[field]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == value))
            };
            has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
        })
    };
    for (role, group, resource) in [
        (
            "ClusterRole/proxy-operator",
            "authentication.k8s.io",
            "tokenreviews",
        ),
        (
            "ClusterRole/proxy-operator",
            "authorization.k8s.io",
            "subjectaccessreviews",
        ),
        (
            "ClusterRole/proxy-operator-edit",
            "proxy-operator.dev",
            "proxypools/lease",
        ),
    ] {
        assert!(
            grants(role, group, resource, "create"),
            "{role}: create {resource}"
        );
    }
    // ProxyQuotas: the operator reads them and writes their status; teams read them only.
    for (role, resource, verb, granted) in [
        ("ClusterRole/proxy-operator", "proxyquotas", "watch", true),
        (
            "ClusterRole/proxy-operator",
            "proxyquotas/status",
            "patch",
            true,
        ),
        ("ClusterRole/proxy-operator", "proxyquotas", "patch", false),
        (
            "ClusterRole/proxy-operator-view",
            "proxyquotas",
            "list",
            true,
        ),
        (
            "ClusterRole/proxy-operator-edit",
            "proxyquotas",
            "update",
            false,
        ),
    ] {
        assert_eq!(
            grants(role, "proxy-operator.dev", resource, verb),
            granted,
            "{role}: {verb} {resource}"
        );
    }
    let providers = find("ConfigMap/providers-config")["data"]["providers.yaml"]
        .as_str()
        .unwrap()
        .to_string();
    let parsed: Value = proxy_operator::support::yaml::from_str(&providers).unwrap();
    for entry in parsed["providers"].as_array().unwrap() {
        assert_ne!(
            entry["type"], "test",
            "the installed config is no test stand-in"
        );
    }
}

/// Metric names a PromQL expression reads (`proxy_operator_…` and `up`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("proxy_operator_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// Metric names documented in docs/metrics.md's table (histograms with their series suffixes).
fn documented_metrics() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/metrics.md")).unwrap();
    let mut names = BTreeSet::new();
    for line in doc.lines().filter(|l| l.starts_with("| `proxy_operator_")) {
        let name = line[3..].split('`').next().unwrap().to_string();
        for suffix in ["", "_bucket", "_count", "_sum"] {
            names.insert(format!("{name}{suffix}"));
        }
    }
    names
}

/// Where the alerts' runbook_url point (the Helm chart: monitoring.runbookBaseUrl).
pub(crate) const RUNBOOKS: &str =
    "https://github.com/proxy-operator/proxy-operator/blob/main/docs/runbooks/";

#[test]
fn the_monitoring_component_alerts_and_charts_only_documented_metrics() {
    let objects = with_component("deploy/monitoring");
    let named = |k: &str| {
        objects
            .iter()
            .find(|o| kind_and_name(o) == k)
            .unwrap_or_else(|| panic!("{k} in deploy/monitoring"))
    };
    // Each ServiceMonitor hands Prometheus the token of the scraper ServiceAccount from its
    // Secret (`authorization`, not the deprecated bearerTokenFile), which the binding lets read
    // /metrics: any Prometheus scrapes with it.
    for monitor in objects.iter().filter(|o| o["kind"] == "ServiceMonitor") {
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(
            endpoint["authorization"],
            serde_json::json!({"type": "Bearer", "credentials":
                {"name": "proxy-operator-metrics-scraper-token", "key": "token"}}),
            "{monitor}"
        );
        assert!(endpoint.get("bearerTokenFile").is_none(), "{monitor}");
    }
    let token = named("Secret/proxy-operator-metrics-scraper-token");
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "proxy-operator-metrics-scraper"
    );
    named("ServiceAccount/proxy-operator-metrics-scraper");
    let binding = named("ClusterRoleBinding/proxy-operator-metrics-reader");
    assert_eq!(binding["roleRef"]["name"], "proxy-operator-metrics-reader");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "proxy-operator-metrics-scraper",
                            "namespace": "proxy-operator"}])
    );
    let documented = documented_metrics();
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let mut alerts = BTreeSet::new();
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = r["expr"].as_str().unwrap();
        for name in metric_names(expr) {
            assert!(
                documented.contains(&name),
                "alert {}: {name} is not a metric of the operator",
                r["alert"]
            );
        }
        assert!(r["annotations"]["description"].is_string());
        // Every alert links its runbook, a page of docs/runbooks/ that exists.
        let alert = r["alert"].as_str().unwrap();
        assert_eq!(
            r["annotations"]["runbook_url"],
            format!("{RUNBOOKS}{alert}.md"),
            "alert {alert}"
        );
        let page = std::fs::read_to_string(repo().join(format!("docs/runbooks/{alert}.md")))
            .unwrap_or_else(|e| panic!("docs/runbooks/{alert}.md: {e}"));
        assert!(
            page.starts_with(&format!("# {alert}\n")),
            "docs/runbooks/{alert}.md"
        );
        alerts.insert(alert.to_string());
    }
    // Capacity (the fleet's and each pool's), provider health, reconcile errors, plugin load
    // failures.
    for wanted in [
        "ProxyOperatorNoLeasableCapacity",
        "ProxyOperatorPoolExhausted",
        "ProxyOperatorProviderUnhealthy",
        "ProxyOperatorReconcileErrors",
        "ProxyOperatorPluginLoadFailed",
    ] {
        assert!(alerts.contains(wanted), "{wanted} in {alerts:?}");
    }
    assert!(objects.iter().any(|o| o["kind"] == "ServiceMonitor"));
    let dashboard = objects
        .iter()
        .find(|o| kind_and_name(o) == "ConfigMap/proxy-operator-dashboard")
        .expect("the Grafana dashboard ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(
        dashboard["data"]["grafana-dashboard.json"]
            .as_str()
            .unwrap(),
    )
    .expect("the dashboard is JSON");
    let text = json.to_string();
    let charted = metric_names(&text);
    assert!(!charted.is_empty());
    for name in charted {
        assert!(
            documented.contains(&name),
            "the dashboard charts {name}, which is not a metric of the operator"
        );
    }
}

/// `kubectl kustomize` of an overlay as a user writes one: `deploy/` and the `component` (a
/// path under the repository; kustomize takes relative paths).
fn with_component(component: &str) -> Vec<Value> {
    let scratch = repo().join("target");
    std::fs::create_dir_all(&scratch).unwrap();
    let overlay = tempfile::tempdir_in(scratch).unwrap();
    let relative = |p: &str| pathdiff(&repo().join(p), overlay.path());
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{}]\ncomponents: [{}]\n",
            relative("deploy"),
            relative(component)
        ),
    )
    .unwrap();
    kustomize(overlay.path())
}

/// `to` relative to `from` (both under the repository), for kustomize's relative paths.
fn pathdiff(to: &Path, from: &Path) -> String {
    let to = to.canonicalize().unwrap();
    let from = from.canonicalize().unwrap();
    let common = to
        .components()
        .zip(from.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = from.components().count() - common;
    let mut path = PathBuf::new();
    for _ in 0..ups {
        path.push("..");
    }
    for part in to.components().skip(common) {
        path.push(part);
    }
    path.to_string_lossy().into_owned()
}

#[test]
fn the_gateway_component_runs_the_gateway_and_opens_the_leaders_door() {
    let objects = with_component("deploy/gateway");
    let find = |kind_name: &str| {
        objects
            .iter()
            .find(|o| kind_and_name(o) == kind_name)
            .unwrap_or_else(|| panic!("{kind_name} in the overlay"))
    };
    let env_of = |deployment: &Value| -> BTreeMap<String, Value> {
        deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    };
    // The leader reads the gateway's token from the same Secret as the gateway.
    let operator = env_of(find("Deployment/proxy-operator"));
    let gateway_deployment = find("Deployment/proxy-operator-gateway");
    let gateway = env_of(gateway_deployment);
    for env in [&operator, &gateway] {
        assert_eq!(
            env["GATEWAY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"],
            "proxy-operator-gateway"
        );
    }
    let container = &gateway_deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["args"], serde_json::json!(["gateway"]));
    // The operator's image, as the base names it (its `images:` does not reach a component).
    assert_eq!(
        container["image"],
        find("Deployment/proxy-operator")["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    // Every variable the gateway Deployment sets is a flag of `proxy-operator gateway`.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["gateway", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for name in gateway.keys() {
        if name != "LOG_FORMAT" {
            assert!(
                help.contains(&format!("[env: {name}")),
                "{name} in:\n{help}"
            );
        }
    }
    assert_eq!(gateway_deployment["spec"]["replicas"], 2);
    // Its ServiceAccount only reviews the tokens of /metrics readers.
    assert_eq!(
        gateway_deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "proxy-operator-gateway"
    );
    assert_eq!(
        find("ClusterRoleBinding/proxy-operator-gateway-metrics-auth")["subjects"][0]["name"],
        "proxy-operator-gateway"
    );
    // Its token is mounted because it is used (the /metrics reviews, `MetricsAuth::kubernetes`
    // in `cli/gateway.rs`), by the gateway's Pod only: the ServiceAccount mounts it nowhere
    // else, the only rights bound to it are the two reviews, and no other binding names it
    // (docs/security.md, "The gateway"; docs/gateway.md says the same).
    assert_eq!(
        gateway_deployment["spec"]["template"]["spec"]["automountServiceAccountToken"],
        true
    );
    assert_eq!(
        find("ServiceAccount/proxy-operator-gateway")["automountServiceAccountToken"],
        false
    );
    assert_eq!(
        find("ClusterRoleBinding/proxy-operator-gateway-metrics-auth")["roleRef"]["name"],
        "proxy-operator-gateway-metrics-auth"
    );
    let rules = &find("ClusterRole/proxy-operator-gateway-metrics-auth")["rules"];
    assert_eq!(
        rules,
        &serde_json::json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ])
    );
    let bound_to_the_gateway: Vec<String> = objects
        .iter()
        .filter(|o| {
            o["subjects"].as_array().is_some_and(|subjects| {
                subjects
                    .iter()
                    .any(|s| s["name"] == "proxy-operator-gateway" && s["kind"] == "ServiceAccount")
            })
        })
        .map(kind_and_name)
        .collect();
    assert_eq!(
        bound_to_the_gateway,
        ["ClusterRoleBinding/proxy-operator-gateway-metrics-auth"]
    );
    for doc in ["docs/security.md", "docs/gateway.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        assert!(
            !text.contains("mount no ServiceAccount token"),
            "{doc} says the gateway mounts no token, but it mounts one"
        );
        assert!(
            text.contains("automountServiceAccountToken"),
            "{doc} says which token the gateway mounts"
        );
    }
    // It calls the leader over TLS, trusting the CA of the discovery API's Secret.
    let value = |name: &str| gateway[name]["value"].as_str().unwrap().to_string();
    assert!(value("DISCOVERY_URL").starts_with("https://proxy-operator-discovery."));
    let ca_volume = &gateway_deployment["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(
        ca_volume["secret"]["secretName"],
        "proxy-operator-discovery-tls"
    );
    let ca_mount = &container["volumeMounts"][0];
    assert_eq!(ca_mount["name"], ca_volume["name"]);
    assert_eq!(
        value("DISCOVERY_CA_FILE"),
        format!("{}/ca.crt", ca_mount["mountPath"].as_str().unwrap())
    );
    let service = find("Service/proxy-operator-gateway");
    let ports: BTreeSet<i64> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, BTreeSet::from([8080, 1080, 9090]));
    assert_eq!(
        find("PodDisruptionBudget/proxy-operator-gateway")["spec"]["minAvailable"],
        1
    );
    assert_eq!(
        find("HorizontalPodAutoscaler/proxy-operator-gateway")["spec"]["minReplicas"],
        2
    );
    // Only labelled crawlers reach the proxy ports.
    let policy = find("NetworkPolicy/proxy-operator-gateway");
    assert_eq!(
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["proxy-operator.dev/gateway-client"],
        "true"
    );
}
