//! What a Pod made by a plugin may be: an allow-list, checked on every object a plugin applies.
//!
//! A Pod is found wherever it sits in the object (a Pod, the template of any workload, a Pod
//! template inside a custom resource): any JSON object with a `containers` array is held to
//! these rules. The rules are the Pod Security "restricted" profile, plus what a plugin must
//! never reach through a Pod: the node (`nodeName`, host namespaces, host paths and ports, probes
//! that make the kubelet call another host), the API (a ServiceAccount token, projected or
//! mounted), Secrets (volumes, `env`, `envFrom`, image pull Secrets), and ConfigMaps it does not
//! own (their names are returned, so the caller can check ownership against the cluster); and
//! every container runs an image the grant lists (`grants.kube.images`).

use std::collections::BTreeSet;

use serde_json::Value;

pub use crate::provider::capabilities::grants::Toleration;
use crate::provider::capabilities::grants::{ImagePattern, ImageRef};

/// What the Pods of an object reference that only the cluster can vet.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodReferences {
    /// ConfigMaps mounted or read into the environment: each must be the plugin's own.
    pub configmaps: BTreeSet<String>,
}

/// Where the grant lets a plugin's Pods be scheduled.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scheduling {
    /// Node label keys `nodeSelector` may use.
    pub node_selector_keys: Vec<String>,
    /// Tolerations a Pod may carry.
    pub tolerations: Vec<Toleration>,
}

/// What the grant lets a plugin's Pods be: where they run, and from which images.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PodGrant {
    pub scheduling: Scheduling,
    /// `grants.kube.images`: a container's image must be one of these.
    pub images: Vec<ImagePattern>,
}

/// Checks every Pod spec in `object`; `Err` is the first problem, naming the field.
pub fn check(object: &Value, grant: &PodGrant) -> Result<PodReferences, String> {
    let mut references = PodReferences::default();
    let mut specs = Vec::new();
    find_pod_specs(object, String::new(), &mut specs);
    for (path, spec) in specs {
        check_pod_spec(&path, spec, &mut references)?;
        check_scheduling(&path, spec, &grant.scheduling)?;
        check_images(&path, spec, &grant.images)?;
    }
    Ok(references)
}

/// Every container (init containers too) runs an image of `grants.kube.images`.
fn check_images(path: &str, spec: &Value, images: &[ImagePattern]) -> Result<(), String> {
    for list in ["initContainers", "containers"] {
        for (index, container) in items(&spec[list]).enumerate() {
            let at = format!("{path}.{list}[{index}].image");
            let Some(text) = container["image"].as_str() else {
                return Err(format!("{at} is missing; name one of grants.kube.images"));
            };
            let admitted = ImageRef::parse(text)
                .is_ok_and(|image| images.iter().any(|pattern| pattern.admits(&image)));
            if !admitted {
                let granted: Vec<&str> = images.iter().map(|p| p.text.as_str()).collect();
                return Err(format!(
                    "{at} `{}` is not in grants.kube.images ({}); a plugin's Pods run only the images the grant lists",
                    text.escape_debug(),
                    if granted.is_empty() {
                        "none".to_string()
                    } else {
                        granted.join(", ")
                    }
                ));
            }
        }
    }
    Ok(())
}

/// `nodeSelector` by the granted keys only, and only the granted tolerations (a toleration is
/// what lets a Pod onto a tainted node, e.g. the control plane's).
fn check_scheduling(path: &str, spec: &Value, scheduling: &Scheduling) -> Result<(), String> {
    match &spec["nodeSelector"] {
        Value::Null => {}
        Value::Object(selector) => {
            if let Some(key) = selector
                .keys()
                .find(|k| !scheduling.node_selector_keys.contains(k))
            {
                return Err(format!(
                    "{path}.nodeSelector.{key} is not allowed; grants.kube.scheduling.nodeSelectorKeys allows {}",
                    list_or_none(&scheduling.node_selector_keys)
                ));
            }
        }
        other => {
            return Err(format!(
                "{path}.nodeSelector must be a map of node labels, not {}",
                super::traffic_policy::json_kind(other)
            ));
        }
    }
    for (index, toleration) in items(&spec["tolerations"]).enumerate() {
        let text = |field: &str| toleration[field].as_str().unwrap_or_default().to_string();
        let asked = Toleration {
            key: text("key"),
            operator: Some(
                toleration["operator"]
                    .as_str()
                    .unwrap_or("Equal")
                    .to_string(),
            ),
            value: text("value"),
            effect: text("effect"),
        };
        if !scheduling.tolerations.contains(&asked) {
            return Err(format!(
                "{path}.tolerations[{index}] ({}) is not allowed: a toleration lets the Pod onto tainted nodes; grant it in grants.kube.scheduling.tolerations",
                toleration
            ));
        }
    }
    Ok(())
}

fn list_or_none(keys: &[String]) -> String {
    if keys.is_empty() {
        "none".into()
    } else {
        keys.join(", ")
    }
}

/// Every object with a `containers` array, with its path (`spec.template.spec`).
fn find_pod_specs<'a>(value: &'a Value, path: String, found: &mut Vec<(String, &'a Value)>) {
    match value {
        Value::Object(map) => {
            if map.get("containers").is_some_and(Value::is_array) {
                found.push((path.clone(), value));
            }
            for (key, child) in map {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                find_pod_specs(child, at, found);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                find_pod_specs(child, format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

fn check_pod_spec(path: &str, spec: &Value, refs: &mut PodReferences) -> Result<(), String> {
    let at = |field: &str| format!("{path}.{field}");
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            return Err(format!(
                "{} is not allowed (the node's namespaces)",
                at(field)
            ));
        }
    }
    for field in ["nodeName", "runtimeClassName"] {
        if !spec[field].is_null() {
            return Err(format!(
                "{} is not allowed (the scheduler and the cluster's default runtime decide)",
                at(field)
            ));
        }
    }
    if spec["automountServiceAccountToken"] != false {
        return Err(format!(
            "{} must be false (a plugin's Pods get no API token)",
            at("automountServiceAccountToken")
        ));
    }
    for field in ["serviceAccountName", "serviceAccount"] {
        if let Some(account) = spec[field].as_str()
            && account != "default"
        {
            return Err(format!(
                "{} `{account}` is not allowed; a plugin's Pods run as the namespace's default ServiceAccount",
                at(field)
            ));
        }
    }
    if non_empty(&spec["imagePullSecrets"]) {
        return Err(format!(
            "{} is not allowed (a plugin never references a Secret)",
            at("imagePullSecrets")
        ));
    }
    if non_empty(&spec["ephemeralContainers"]) {
        return Err(format!("{} is not allowed", at("ephemeralContainers")));
    }
    if let Some(class) = spec["priorityClassName"].as_str()
        && class.starts_with("system-")
    {
        return Err(format!(
            "{} `{class}` is not allowed (it preempts the cluster's own Pods)",
            at("priorityClassName")
        ));
    }
    let pod_security = &spec["securityContext"];
    check_security_context(&at("securityContext"), pod_security)?;
    if non_empty(&pod_security["sysctls"]) {
        return Err(format!("{} is not allowed", at("securityContext.sysctls")));
    }
    for (index, volume) in items(&spec["volumes"]).enumerate() {
        check_volume(&format!("{path}.volumes[{index}]"), volume, refs)?;
    }
    for list in ["initContainers", "containers"] {
        for (index, container) in items(&spec[list]).enumerate() {
            let at = format!("{path}.{list}[{index}]");
            check_container(&at, container, pod_security, refs)?;
        }
    }
    Ok(())
}

/// The fields of a Pod's or a container's `securityContext` that are refused wherever they are.
fn check_security_context(at: &str, security: &Value) -> Result<(), String> {
    if security["windowsOptions"]["hostProcess"] == true {
        return Err(format!("{at}.windowsOptions.hostProcess is not allowed"));
    }
    if security["seccompProfile"]["type"] == "Unconfined" {
        return Err(format!(
            "{at}.seccompProfile.type Unconfined is not allowed; use RuntimeDefault"
        ));
    }
    // A Localhost profile is whatever file of that name the node has: `unconfined` is a valid
    // name. Only the runtime's default confines for sure.
    match &security["appArmorProfile"]["type"] {
        Value::Null => {}
        Value::String(kind) if kind == "RuntimeDefault" => {}
        other => {
            return Err(format!(
                "{at}.appArmorProfile.type {other} is not allowed; use RuntimeDefault (a Localhost profile is whatever the node has under that name)"
            ));
        }
    }
    let selinux = &security["seLinuxOptions"];
    if !selinux["user"].is_null() || !selinux["role"].is_null() {
        return Err(format!("{at}.seLinuxOptions user and role are not allowed"));
    }
    if let Some(kind) = selinux["type"].as_str()
        && !["container_t", "container_init_t", "container_kvm_t"].contains(&kind)
    {
        return Err(format!("{at}.seLinuxOptions.type `{kind}` is not allowed"));
    }
    // Any JSON form of 0 (`0`, `0.0`, `-0`, `0e5`) is stored by the API server as 0.
    if is_zero(&security["runAsUser"]) {
        return Err(format!("{at}.runAsUser 0 (root) is not allowed"));
    }
    Ok(())
}

fn check_volume(at: &str, volume: &Value, refs: &mut PodReferences) -> Result<(), String> {
    let name = volume["name"].as_str().unwrap_or("?");
    let sources: Vec<&str> = volume
        .as_object()
        .into_iter()
        .flatten()
        .map(|(key, _)| key.as_str())
        .filter(|key| *key != "name")
        .collect();
    match sources.as_slice() {
        ["emptyDir"] | ["downwardAPI"] => Ok(()),
        ["configMap"] => {
            let Some(configmap) = volume["configMap"]["name"].as_str() else {
                return Err(format!("{at}.configMap.name is missing"));
            };
            refs.configmaps.insert(configmap.to_string());
            Ok(())
        }
        [other] => Err(format!(
            "{at} (volume {name}) is a `{other}` volume; a plugin's Pods may use emptyDir, downwardAPI and its own configMap volumes only"
        )),
        _ => Err(format!(
            "{at} (volume {name}) must have exactly one source (emptyDir, downwardAPI or configMap)"
        )),
    }
}

fn check_container(
    at: &str,
    container: &Value,
    pod_security: &Value,
    refs: &mut PodReferences,
) -> Result<(), String> {
    let security = &container["securityContext"];
    let here = |field: &str| format!("{at}.securityContext.{field}");
    check_security_context(&format!("{at}.securityContext"), security)?;
    if security["privileged"] == true {
        return Err(format!("{} is not allowed", here("privileged")));
    }
    if security["allowPrivilegeEscalation"] != false {
        return Err(format!(
            "{} must be false",
            here("allowPrivilegeEscalation")
        ));
    }
    if security["procMount"] == "Unmasked" {
        return Err(format!("{} Unmasked is not allowed", here("procMount")));
    }
    if !items(&security["capabilities"]["drop"]).any(|c| c == "ALL") {
        return Err(format!("{} must include ALL", here("capabilities.drop")));
    }
    if let Some(added) = items(&security["capabilities"]["add"])
        .find(|c| *c != "NET_BIND_SERVICE")
        .map(|c| c.as_str().unwrap_or("?"))
    {
        return Err(format!(
            "{} {added} is not allowed (only NET_BIND_SERVICE)",
            here("capabilities.add")
        ));
    }
    // The container's own setting wins over the Pod's; one of them must say non-root.
    let effective = |field: &str| {
        let own = &security[field];
        if own.is_null() {
            &pod_security[field]
        } else {
            own
        }
    };
    if effective("runAsNonRoot") != true {
        return Err(format!(
            "{} (or the Pod's) must be true",
            here("runAsNonRoot")
        ));
    }
    let seccomp = effective("seccompProfile")["type"].as_str();
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        return Err(format!(
            "{} (or the Pod's) must be RuntimeDefault or Localhost",
            here("seccompProfile.type")
        ));
    }
    if items(&container["ports"]).any(|p| !p["hostPort"].is_null() || !p["hostIP"].is_null()) {
        return Err(format!("{at}.ports: hostPort and hostIP are not allowed"));
    }
    check_environment(at, container, refs)?;
    check_handlers(at, container)
}

/// `env` and `envFrom`: no Secret, and ConfigMaps only the plugin's own.
fn check_environment(at: &str, container: &Value, refs: &mut PodReferences) -> Result<(), String> {
    for (index, variable) in items(&container["env"]).enumerate() {
        let from = &variable["valueFrom"];
        if !from["secretKeyRef"].is_null() {
            return Err(format!(
                "{at}.env[{index}].valueFrom.secretKeyRef is not allowed (a plugin never references a Secret)"
            ));
        }
        if let Some(name) = from["configMapKeyRef"]["name"].as_str() {
            refs.configmaps.insert(name.to_string());
        }
    }
    for (index, source) in items(&container["envFrom"]).enumerate() {
        if !source["secretRef"].is_null() {
            return Err(format!(
                "{at}.envFrom[{index}].secretRef is not allowed (a plugin never references a Secret)"
            ));
        }
        if let Some(name) = source["configMapRef"]["name"].as_str() {
            refs.configmaps.insert(name.to_string());
        }
    }
    Ok(())
}

/// Probes and lifecycle hooks run by the kubelet on the node: they may target the Pod only.
fn check_handlers(at: &str, container: &Value) -> Result<(), String> {
    let handlers = [
        ("livenessProbe", &container["livenessProbe"]),
        ("readinessProbe", &container["readinessProbe"]),
        ("startupProbe", &container["startupProbe"]),
        ("lifecycle.postStart", &container["lifecycle"]["postStart"]),
        ("lifecycle.preStop", &container["lifecycle"]["preStop"]),
    ];
    for (field, handler) in handlers {
        for action in ["httpGet", "tcpSocket"] {
            if !handler[action]["host"].is_null() {
                return Err(format!(
                    "{at}.{field}.{action}.host is not allowed (the kubelet would call another host from the node)"
                ));
            }
        }
    }
    Ok(())
}

/// Whether a JSON number is zero in any of its forms (the API server reads `0.0` as 0).
fn is_zero(value: &Value) -> bool {
    value.as_f64().is_some_and(|n| n == 0.0)
}

fn items(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

fn non_empty(value: &Value) -> bool {
    value.as_array().is_some_and(|a| !a.is_empty())
}

#[cfg(test)]
mod tests;
