//! What a Pod made by a plugin may be: an allow-list, checked on every object a plugin applies.
//!
//! A Pod is found wherever it sits in the object (a Pod, the template of any workload, a Pod
//! template inside a custom resource): any JSON object with a `containers` array is held to
//! these rules. The rules are the Pod Security "restricted" profile, plus what a plugin must
//! never reach through a Pod: the node (`nodeName`, host namespaces, host paths and ports, probes
//! that make the kubelet call another host), the API (a ServiceAccount token, projected or
//! mounted), Secrets (volumes, `env`, `envFrom`, image pull Secrets), and ConfigMaps it does not
//! own (their names are returned, so the caller can check ownership against the cluster).

use std::collections::BTreeSet;

use serde_json::Value;

/// What the Pods of an object reference that only the cluster can vet.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodReferences {
    /// ConfigMaps mounted or read into the environment: each must be the plugin's own.
    pub configmaps: BTreeSet<String>,
}

/// Checks every Pod spec in `object`; `Err` is the first problem, naming the field.
pub fn check(object: &Value) -> Result<PodReferences, String> {
    let mut references = PodReferences::default();
    let mut specs = Vec::new();
    find_pod_specs(object, String::new(), &mut specs);
    for (path, spec) in specs {
        check_pod_spec(&path, spec, &mut references)?;
    }
    Ok(references)
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
    if security["appArmorProfile"]["type"] == "Unconfined" {
        return Err(format!(
            "{at}.appArmorProfile.type Unconfined is not allowed"
        ));
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
    if security["runAsUser"] == 0 {
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

fn items(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

fn non_empty(value: &Value) -> bool {
    value.as_array().is_some_and(|a| !a.is_empty())
}

#[cfg(test)]
mod tests;
