//! The Kubernetes objects of one proxy (a ConfigMap with its squid.conf, the squid Pod, the
//! Service in front of it and the NetworkPolicy that admits only `allowFrom`) and the instance
//! read back from the Pod and its Service. Plain functions over JSON, tested natively.

use proxy_operator_sdk::squid::{self, SquidHost};
use proxy_operator_sdk::{Instance, InstanceSpec, InstanceState, Owner};
use serde_json::{Value, json};

use crate::config::{AddressFrom, Config, ServiceType};

/// The host admits a plugin's labels and annotations under this prefix only (docs/security.md):
/// nothing else in the cluster selects or reads them.
pub const PLUGIN_PREFIX: &str = "plugin.proxy-operator.dev/";
/// On every Pod and ConfigMap of a proxy: which Proxy instance it belongs to.
pub const PROXY_LABEL: &str = "plugin.proxy-operator.dev/proxy";
pub const COMPONENT_LABEL: &str = "plugin.proxy-operator.dev/component";
/// Selects the squid Pods of this provider (the host adds the provider instance's own label).
pub const COMPONENT_SELECTOR: &str = "plugin.proxy-operator.dev/component=egress-proxy";
/// Owner identity, as annotations (no length or character limits, unlike labels).
pub const OWNER_NAMESPACE: &str = "plugin.proxy-operator.dev/owner-namespace";
pub const OWNER_NAME: &str = "plugin.proxy-operator.dev/owner-name";
pub const OWNER_UID: &str = "plugin.proxy-operator.dev/owner-uid";
pub const OPERATOR_ID: &str = "plugin.proxy-operator.dev/operator-id";
/// The node label a Proxy's zone selects.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The ConfigMap holding a proxy's squid.conf.
pub fn configmap_name(pod: &str) -> String {
    format!("{pod}-squid")
}

/// Where the Pod sees the ConfigMap's password file. A directory mount (not `subPath`), so the
/// kubelet updates it when the ConfigMap changes and a rotation reaches squid without a restart.
pub const AUTH_DIR: &str = "/etc/squid/proxy-operator";
pub const PASSWORD_KEY: &str = "passwd";

/// Where the access log goes when `config.accessLog` is on (an emptyDir of the Pod).
pub const LOG_DIR: &str = "/var/log/squid";

/// squid.conf for one proxy (the SDK's, as every provider ships it). squid's own log goes to
/// stderr (opened before squid drops root, so `kubectl logs` shows it); the access log cannot go
/// to stdout, because squid opens it as its unprivileged user, who may not open the container's
/// stdout (real squid refuses with "Cannot open '/dev/stdout' for writing").
pub fn squid_conf(config: &Config, spec: &InstanceSpec) -> String {
    squid::squid_conf(
        &config.squid(),
        &spec.owner,
        spec.port,
        SquidHost::Container { log_dir: LOG_DIR },
        spec.credentials.as_ref().map(|_| squid::BasicAuth {
            helper: squid::DEBIAN_BASIC_AUTH_HELPER,
            password_file: PASSWORD_FILE,
        }),
    )
}

/// The password file's path in the Pod.
pub const PASSWORD_FILE: &str = "/etc/squid/proxy-operator/passwd";

/// The ConfigMap's data: squid.conf, and the password file when the proxy has credentials (a
/// salted hash: Secrets cannot be granted to a plugin, and the password never reaches it).
pub fn configmap_data(config: &Config, spec: &InstanceSpec) -> Value {
    let mut data = json!({"squid.conf": squid_conf(config, spec)});
    if let Some(credentials) = &spec.credentials {
        data[PASSWORD_KEY] = json!(squid::password_file(credentials));
    }
    data
}

pub fn configmap(config: &Config, spec: &InstanceSpec) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(&spec.name),
            "labels": {PROXY_LABEL: spec.name},
        },
        "data": configmap_data(config, spec),
    })
}

/// A ConfigMap read back from the API server, as this provider applies it: its name, labels and
/// data (not the server's fields, which an apply may not set).
pub fn reapplied(configmap: &Value) -> Value {
    // Only this plugin's own labels: the host sets its own again, and refuses any other (one an
    // earlier version set, `proxy-operator.dev/proxy`, included).
    let labels: serde_json::Map<String, Value> = configmap["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with(PLUGIN_PREFIX))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap["metadata"]["name"],
            "labels": labels,
        },
        "data": configmap["data"],
    })
}

/// The Service in front of the squid Pod (same name). It selects the Pod by its proxy label; the
/// host confines it further to this provider instance's Pods.
pub fn service(spec: &InstanceSpec, service_type: ServiceType) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.name,
            "labels": {PROXY_LABEL: spec.name, COMPONENT_LABEL: "egress-proxy"},
        },
        "spec": {
            "type": service_type.as_str(),
            "selector": {PROXY_LABEL: spec.name},
            "ports": [{"name": "proxy", "port": spec.port, "targetPort": "proxy", "protocol": "TCP"}],
        },
    })
}

/// Admits connections to the squid port from `allowFrom` only (squid's own ACL says the same;
/// this stops them before squid where the cluster enforces NetworkPolicies).
pub fn network_policy(config: &Config, spec: &InstanceSpec) -> Value {
    let from: Vec<Value> = config
        .allow_from
        .iter()
        .map(|cidr| json!({"ipBlock": {"cidr": cidr}}))
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": spec.name, "labels": {PROXY_LABEL: spec.name}},
        "spec": {
            "podSelector": {"matchLabels": {PROXY_LABEL: spec.name}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": from, "ports": [{"protocol": "TCP", "port": spec.port}]}],
        },
    })
}

/// The squid Pod. Its name is the instance name, so create is idempotent.
pub fn pod(config: &Config, spec: &InstanceSpec) -> Value {
    // The Proxy's labels, by their name under the plugin's prefix (the only labels the host
    // admits: `team: crawl` and `example.com/team: crawl` both become
    // `plugin.proxy-operator.dev/team: crawl`).
    let mut labels = serde_json::Map::new();
    for (key, value) in &spec.labels {
        let name = key.rsplit('/').next().unwrap_or(key);
        labels.insert(format!("{PLUGIN_PREFIX}{name}"), json!(value));
    }
    labels.insert(PROXY_LABEL.into(), json!(spec.name));
    labels.insert(COMPONENT_LABEL.into(), json!("egress-proxy"));
    let mut node_selector: serde_json::Map<String, Value> = config
        .node_selector
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    if let Some(zone) = &spec.zone {
        node_selector.insert(ZONE_LABEL.into(), json!(zone));
    }
    let port = spec.port;
    let mut mounts = vec![json!({
        "name": "squid-conf",
        "mountPath": config.config_path,
        "subPath": "squid.conf",
        "readOnly": true,
    })];
    let mut volumes =
        vec![json!({"name": "squid-conf", "configMap": {"name": configmap_name(&spec.name)}})];
    if spec.credentials.is_some() {
        mounts.push(json!({"name": "squid-auth", "mountPath": AUTH_DIR, "readOnly": true}));
        volumes.push(json!({"name": "squid-auth", "configMap": {
            "name": configmap_name(&spec.name),
            "items": [{"key": PASSWORD_KEY, "path": PASSWORD_KEY}],
        }}));
    }
    if config.access_log {
        mounts.push(json!({"name": "squid-logs", "mountPath": LOG_DIR}));
        volumes.push(json!({"name": "squid-logs", "emptyDir": {"sizeLimit": "256Mi"}}));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {
                OWNER_NAMESPACE: spec.owner.namespace,
                OWNER_NAME: spec.owner.name,
                OWNER_UID: spec.owner.uid,
                OPERATOR_ID: spec.owner.operator_id,
            },
        },
        "spec": {
            "restartPolicy": "Always",
            // squid needs no Kubernetes API access and no service environment variables.
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            // The Pod Security "restricted" profile, which the host requires of a plugin's Pods.
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": config.run_as_user,
                "runAsGroup": config.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "nodeSelector": node_selector,
            "containers": [{
                "name": "squid",
                "image": config.image,
                "ports": [{"name": "proxy", "containerPort": port, "protocol": "TCP"}],
                "volumeMounts": mounts,
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
                "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 5},
                "livenessProbe": {
                    "tcpSocket": {"port": port},
                    "initialDelaySeconds": 15,
                    "periodSeconds": 20,
                },
                "resources": {
                    "requests": {"cpu": config.resources.cpu, "memory": config.resources.memory},
                    "limits": {"memory": config.resources.memory_limit},
                },
            }],
            "volumes": volumes,
        },
    })
}

/// The address crawlers use: the Service's (its load balancer's once assigned, else its cluster
/// IP) or the Pod's IP, as the config says; `None` until there is one.
pub fn address(pod: &Value, service: Option<&Value>, from: AddressFrom) -> Option<String> {
    let text = |v: &Value| {
        v.as_str()
            .filter(|a| !a.is_empty() && *a != "None")
            .map(str::to_string)
    };
    match (from, service) {
        (AddressFrom::Pod, _) => text(&pod["status"]["podIP"]),
        (AddressFrom::Service, Some(service)) => {
            let ingress = &service["status"]["loadBalancer"]["ingress"][0];
            text(&ingress["ip"])
                .or_else(|| text(&ingress["hostname"]))
                .or_else(|| text(&service["spec"]["clusterIP"]))
        }
        (AddressFrom::Service, None) => None,
    }
}

/// The instance a Pod is (its address from the Pod alone: see [`address`] for the Service's);
/// its owner is `None` for a Pod without the owner annotations.
pub fn instance(pod: &Value) -> Instance {
    let metadata = &pod["metadata"];
    let text = |v: &Value| v.as_str().map(str::to_string);
    // Pods made by earlier versions carry the owner under `proxy-operator.dev/` (no `plugin.`): read both,
    // so the garbage collector still knows them.
    let annotation = |key: &str| {
        text(&metadata["annotations"][key]).or_else(|| {
            key.strip_prefix("plugin.")
                .and_then(|legacy| text(&metadata["annotations"][legacy]))
        })
    };
    let owner = match (
        annotation(OWNER_NAMESPACE),
        annotation(OWNER_NAME),
        annotation(OWNER_UID),
        annotation(OPERATOR_ID),
    ) {
        (Some(namespace), Some(name), Some(uid), Some(operator_id)) => Some(Owner {
            namespace,
            name,
            uid,
            operator_id,
        }),
        _ => None,
    };
    let status = &pod["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let state = if !metadata["deletionTimestamp"].is_null() {
        InstanceState::Stopping
    } else {
        match status["phase"].as_str() {
            None | Some("Pending") => InstanceState::Provisioning,
            Some("Running") if ready => InstanceState::Running,
            Some("Running") => InstanceState::Provisioning,
            Some("Succeeded") => InstanceState::Stopped,
            Some("Failed") => InstanceState::Failed,
            Some(_) => InstanceState::Unknown,
        }
    };
    let port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(3128);
    Instance {
        provider_id: text(&metadata["name"]).unwrap_or_default(),
        name: text(&metadata["name"]).unwrap_or_default(),
        state,
        address: text(&status["podIP"]).filter(|a| !a.is_empty()),
        port,
        zone: text(&pod["spec"]["nodeSelector"][ZONE_LABEL]),
        created_at: metadata["creationTimestamp"]
            .as_str()
            .and_then(proxy_operator_sdk::time::unix_seconds),
        owner,
        message: why_not_running(status),
    }
}

/// What keeps a Pod from running, from its container's waiting or terminated state and the
/// scheduler's condition (`ImagePullBackOff: …`, `Unschedulable: …`).
fn why_not_running(status: &Value) -> Option<String> {
    let container = &status["containerStatuses"][0]["state"];
    for state in ["waiting", "terminated"] {
        if let Some(reason) = container[state]["reason"].as_str() {
            let message = container[state]["message"].as_str().unwrap_or_default();
            return Some(
                format!("{reason}: {message}")
                    .trim_end_matches(": ")
                    .to_string(),
            );
        }
    }
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
        .map(|c| {
            format!(
                "{}: {}",
                c["reason"].as_str().unwrap_or("Unschedulable"),
                c["message"].as_str().unwrap_or_default()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> InstanceSpec {
        InstanceSpec {
            name: "px-0123abcd".into(),
            owner: Owner {
                namespace: "crawlers".into(),
                name: "proxy-a".into(),
                uid: "5f6c".into(),
                operator_id: "op".into(),
            },
            zone: Some("zone-a".into()),
            image: None,
            machine_type: None,
            user_data: Vec::new(),
            vendor_data: Vec::new(),
            install_guest_agent: true,
            port: 3128,
            labels: vec![("team".into(), "crawl".into())],
            options: "{}".into(),
            credentials: None,
        }
    }

    fn config() -> Config {
        serde_json::from_value(json!({"image": "squid:6", "nodeSelector": {"egress": "public"}}))
            .unwrap()
    }

    #[test]
    fn the_pod_carries_identity_zone_and_the_config_mount() {
        let pod = pod(&config(), &spec());
        assert_eq!(pod["metadata"]["name"], "px-0123abcd");
        assert_eq!(
            pod["metadata"]["labels"]["plugin.proxy-operator.dev/team"],
            "crawl"
        );
        // Every label and annotation is under the plugin's prefix (the host admits no other).
        for (key, _) in pod["metadata"]["labels"]
            .as_object()
            .unwrap()
            .iter()
            .chain(pod["metadata"]["annotations"].as_object().unwrap())
        {
            assert!(key.starts_with(PLUGIN_PREFIX), "{key}");
        }
        assert_eq!(pod["metadata"]["annotations"][OWNER_UID], "5f6c");
        assert_eq!(pod["spec"]["nodeSelector"][ZONE_LABEL], "zone-a");
        assert_eq!(pod["spec"]["nodeSelector"]["egress"], "public");
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["volumeMounts"][0]["mountPath"],
            "/etc/squid/squid.conf"
        );
        assert_eq!(
            pod["spec"]["volumes"][0]["configMap"]["name"],
            "px-0123abcd-squid"
        );
        // The restricted profile the host requires: non-root, seccomp, no escalation.
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 13);
        assert_eq!(
            pod["spec"]["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(
            container["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"][0],
            "ALL"
        );
    }

    #[test]
    fn with_credentials_the_password_file_is_mounted_as_a_directory_and_required() {
        let mut spec = spec();
        spec.credentials = Some(proxy_operator_sdk::ProxyCredentials {
            username: "px-a".into(),
            password_hash: "$6$salt$hash".into(),
        });
        let data = configmap_data(&config(), &spec);
        assert_eq!(data[PASSWORD_KEY], "px-a:$6$salt$hash\n");
        let conf = data["squid.conf"].as_str().unwrap();
        assert!(conf.contains(&format!(
            "auth_param basic program /usr/lib/squid/basic_ncsa_auth {PASSWORD_FILE}\n"
        )));
        assert!(conf.contains("http_access allow proxy_users\n"));
        let pod = pod(&config(), &spec);
        let mounts = pod["spec"]["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap();
        let auth = mounts.iter().find(|m| m["name"] == "squid-auth").unwrap();
        // No subPath: the kubelet updates a directory mount when the ConfigMap changes.
        assert_eq!(auth["mountPath"], AUTH_DIR);
        assert!(auth.get("subPath").is_none());
        assert!(PASSWORD_FILE.starts_with(AUTH_DIR));
        // Read back from the server, re-applied with only what the provider owns.
        let mut read_back = configmap(&config(), &spec);
        read_back["metadata"]["resourceVersion"] = json!("42");
        read_back["metadata"]["managedFields"] = json!([]);
        read_back["metadata"]["labels"]["proxy-operator.dev/provider"] = json!("in-cluster");
        read_back["metadata"]["labels"]["proxy-operator.dev/proxy"] =
            json!("by an earlier version");
        assert_eq!(reapplied(&read_back), configmap(&config(), &spec));
        // Without credentials: no password file, no mount.
        assert!(
            configmap_data(&config(), &self::spec())
                .get(PASSWORD_KEY)
                .is_none()
        );
    }

    #[test]
    fn squid_conf_admits_only_the_allowed_ranges() {
        let conf = squid_conf(&config(), &spec());
        assert!(conf.contains("http_port 3128\n"));
        assert!(conf.contains("acl crawlers src 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16\n"));
        assert!(conf.contains("http_access allow crawlers\nhttp_access deny all\n"));
        assert!(conf.contains("max_filedescriptors 1024"));
        assert!(conf.contains("access_log none\n"));
        assert!(conf.contains("acl SSL_ports port 443\n"));
        let mut ports = config();
        ports.connect_ports = vec![443, 8443];
        assert!(squid_conf(&ports, &spec()).contains("acl SSL_ports port 443 8443\n"));
        let mut logging = config();
        logging.access_log = true;
        assert!(
            squid_conf(&logging, &spec())
                .contains("access_log daemon:/var/log/squid/access.log squid\n")
        );
        let pod = pod(&logging, &spec());
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"][1]["mountPath"],
            "/var/log/squid"
        );
        assert!(pod["spec"]["volumes"][1]["emptyDir"].is_object());
    }

    #[test]
    fn a_pod_reads_back_as_an_instance() {
        let mut pod = pod(&config(), &spec());
        pod["metadata"]["creationTimestamp"] = json!("2026-11-30T19:30:00Z");
        let pending = instance(&pod);
        assert_eq!(pending.state, InstanceState::Provisioning);
        assert_eq!(pending.address, None);
        assert_eq!(pending.owner.as_ref().unwrap().name, "proxy-a");
        assert_eq!(pending.zone.as_deref(), Some("zone-a"));
        assert_eq!(pending.created_at, Some(1_796_067_000));
        pod["status"] = json!({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"squid:6\""}}}]});
        assert_eq!(
            instance(&pod).message.as_deref(),
            Some("ImagePullBackOff: Back-off pulling image \"squid:6\"")
        );
        pod["status"] = json!({"phase": "Running", "podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]});
        let running = instance(&pod);
        assert_eq!(running.state, InstanceState::Running);
        assert_eq!(running.address.as_deref(), Some("10.1.2.3"));
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-30T19:31:00Z");
        assert_eq!(instance(&pod).state, InstanceState::Stopping);
        pod["metadata"]["annotations"] = json!({});
        assert!(instance(&pod).owner.is_none());
    }

    #[test]
    fn the_service_gives_the_address_and_a_proxy_may_choose_its_type() {
        use crate::config::ProxyOptions;
        let options = ProxyOptions::parse(r#"{"serviceType": "LoadBalancer"}"#).unwrap();
        let lb = service(&spec(), options.service_type.unwrap());
        assert_eq!(lb["spec"]["type"], "LoadBalancer");
        assert_eq!(lb["spec"]["selector"][PROXY_LABEL], "px-0123abcd");
        assert_eq!(lb["spec"]["ports"][0]["port"], 3128);
        let bad = ProxyOptions::parse(r#"{"serviceType": "Ingress"}"#).unwrap_err();
        assert!(
            format!("{bad:?}").contains("spec.providerOptions"),
            "{bad:?}"
        );
        let mut pod = pod(&config(), &spec());
        pod["status"] = json!({"podIP": "10.244.0.7"});
        let mut svc = service(&spec(), ServiceType::ClusterIP);
        svc["spec"]["clusterIP"] = json!("10.96.0.9");
        assert_eq!(
            address(&pod, Some(&svc), AddressFrom::Service).as_deref(),
            Some("10.96.0.9")
        );
        assert_eq!(
            address(&pod, Some(&svc), AddressFrom::Pod).as_deref(),
            Some("10.244.0.7")
        );
        assert_eq!(address(&pod, None, AddressFrom::Service), None);
        svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}});
        assert_eq!(
            address(&pod, Some(&svc), AddressFrom::Service).as_deref(),
            Some("203.0.113.5")
        );
        let policy = network_policy(&config(), &spec());
        assert_eq!(
            policy["spec"]["ingress"][0]["from"][0]["ipBlock"]["cidr"],
            "10.0.0.0/8"
        );
        assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 3128);
    }
}
