//! What a plugin's Services and NetworkPolicies may be: they reach the plugin's own Pods and
//! nothing else. The host confines both to the Pods carrying the provider instance's label (the
//! label it puts on everything the instance applies), and refuses the Service fields that send
//! traffic somewhere else: `externalIPs` (a ClusterIP Service with an external IP captures that
//! IP's traffic for the whole cluster, CVE-2020-8554), `ExternalName` (a DNS alias to any host),
//! a chosen `clusterIP`, and a Service without a selector (it would take hand-written endpoints).

use serde_json::{Map, Value, json};

/// The label (key, value) every Pod of the plugin's provider instance carries.
pub type OwnLabel<'a> = (&'a str, &'a str);

/// Checks a Service and confines its selector to the Pods with the `own` label (the kind's
/// policy, [`super::object_policy`], calls it). `Err` names the field.
pub fn confine_service(data: &mut Value, own: OwnLabel) -> Result<(), String> {
    let spec = spec_of(data)?;
    if spec.get("type").is_some_and(|t| t == "ExternalName")
        || spec.get("externalName").is_some_and(|n| !n.is_null())
    {
        return Err("spec.type ExternalName is not allowed (a DNS alias to any host)".into());
    }
    if spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|ips| !ips.is_empty())
    {
        return Err(
            "spec.externalIPs is not allowed (it would capture that address's traffic in the whole cluster)"
                .into(),
        );
    }
    let chosen = |ip: &Value| ip.as_str().is_some_and(|ip| ip != "None" && !ip.is_empty());
    if spec.get("clusterIP").is_some_and(chosen)
        || spec
            .get("clusterIPs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(chosen)
    {
        return Err("spec.clusterIP is not allowed; the cluster assigns it (or use None)".into());
    }
    match spec.get_mut("selector") {
        Some(selector) if selector.as_object().is_some_and(|s| !s.is_empty()) => {
            own_pods(selector, "spec.selector", own)
        }
        _ => Err(
            "spec.selector is required: a plugin's Service selects its own Pods (no hand-written endpoints)"
                .into(),
        ),
    }
}

/// Confines a NetworkPolicy's `podSelector` to the Pods with the `own` label.
pub fn confine_network_policy(data: &mut Value, own: OwnLabel) -> Result<(), String> {
    let spec = spec_of(data)?;
    let selector = spec.entry("podSelector").or_insert_with(|| json!({}));
    if selector.is_null() {
        *selector = json!({});
    }
    let Some(selector) = selector.as_object_mut() else {
        return Err(format!(
            "spec.podSelector must be a label selector (a map of matchLabels and matchExpressions), not {}",
            json_kind(selector)
        ));
    };
    let labels = selector
        .entry("matchLabels")
        .or_insert_with(|| Value::Object(Map::new()));
    if labels.is_null() {
        *labels = Value::Object(Map::new());
    }
    own_pods(labels, "spec.podSelector.matchLabels", own)
}

/// The object's `spec`, which must be a map (the shape is checked before anything is rewritten:
/// a plugin's JSON is never indexed as what it does not claim to be).
fn spec_of(data: &mut Value) -> Result<&mut Map<String, Value>, String> {
    match data.get_mut("spec") {
        Some(Value::Object(spec)) => Ok(spec),
        None | Some(Value::Null) => Err("spec is missing".into()),
        Some(other) => Err(format!("spec must be a map, not {}", json_kind(other))),
    }
}

/// What a JSON value is, for messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a map",
    }
}

/// Adds the `own` label to a label map; another value under its key is refused.
fn own_pods(labels: &mut Value, field: &str, (key, own): OwnLabel) -> Result<(), String> {
    let Some(labels) = labels.as_object_mut() else {
        return Err(format!("{field} must be a map of labels"));
    };
    match labels.get(key).and_then(Value::as_str) {
        Some(value) if value != own => Err(format!(
            "{field}.{key} `{value}` selects another provider instance's Pods"
        )),
        _ => {
            labels.insert(key.into(), json!(own));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::labels::PROVIDER_LABEL;

    /// The Service and NetworkPolicy policies by kind, as `object_policy` dispatches them.
    fn confine(_: &str, kind: &str, data: &mut Value, own: OwnLabel) -> Result<(), String> {
        match kind {
            "Service" => confine_service(data, own),
            "NetworkPolicy" => confine_network_policy(data, own),
            other => panic!("{other} is not a traffic kind"),
        }
    }

    fn service(spec: Value) -> Value {
        json!({"spec": spec})
    }

    /// Issue #36: these shapes made the host index an array or a string as a map (a panic).
    #[test]
    fn shapes_that_are_not_maps_are_refused_naming_the_field() {
        let policy = "networking.k8s.io/v1";
        let cases = [
            (
                "v1",
                "Service",
                json!({"spec": []}),
                "spec must be a map, not an array",
            ),
            (
                "v1",
                "Service",
                json!({"spec": "all"}),
                "spec must be a map, not a string",
            ),
            ("v1", "Service", json!({}), "spec is missing"),
            (
                "v1",
                "Service",
                json!({"spec": {"selector": []}}),
                "spec.selector is required",
            ),
            (
                policy,
                "NetworkPolicy",
                json!({"spec": []}),
                "spec must be a map",
            ),
            (
                policy,
                "NetworkPolicy",
                json!({"spec": {"podSelector": []}}),
                "spec.podSelector must be a label selector (a map of matchLabels and matchExpressions), not an array",
            ),
            (
                policy,
                "NetworkPolicy",
                json!({"spec": {"podSelector": "x"}}),
                "not a string",
            ),
            (
                policy,
                "NetworkPolicy",
                json!({"spec": {"podSelector": {"matchLabels": []}}}),
                "spec.podSelector.matchLabels must be a map of labels",
            ),
            (
                policy,
                "NetworkPolicy",
                json!({"spec": {"podSelector": {"matchLabels": 3}}}),
                "spec.podSelector.matchLabels must be a map of labels",
            ),
        ];
        for (api_version, kind, mut object, words) in cases {
            let before = object.clone();
            let error = confine(api_version, kind, &mut object, (PROVIDER_LABEL, "p")).unwrap_err();
            assert!(error.contains(words), "{before}: {error}");
        }
        let mut null_selector = json!({"spec": {"podSelector": null}});
        confine(
            policy,
            "NetworkPolicy",
            &mut null_selector,
            (PROVIDER_LABEL, "p"),
        )
        .unwrap();
        assert_eq!(
            null_selector["spec"]["podSelector"]["matchLabels"][PROVIDER_LABEL],
            "p"
        );
    }

    #[test]
    fn a_service_selects_only_the_plugins_own_pods() {
        let mut ok = service(
            json!({"selector": {"proxy-operator.dev/proxy": "px-1"}, "ports": [{"port": 3128}]}),
        );
        confine("v1", "Service", &mut ok, (PROVIDER_LABEL, "in-cluster")).unwrap();
        assert_eq!(ok["spec"]["selector"][PROVIDER_LABEL], "in-cluster");
        assert_eq!(ok["spec"]["selector"]["proxy-operator.dev/proxy"], "px-1");
        let mut headless = service(json!({"clusterIP": "None", "selector": {"a": "b"}}));
        assert!(confine("v1", "Service", &mut headless, (PROVIDER_LABEL, "p")).is_ok());
        let mut lb = service(json!({"type": "LoadBalancer", "selector": {"a": "b"}}));
        assert!(confine("v1", "Service", &mut lb, (PROVIDER_LABEL, "p")).is_ok());
    }

    #[test]
    fn services_that_send_traffic_elsewhere_are_refused_naming_the_field() {
        let cases = [
            (
                json!({"type": "ExternalName", "externalName": "example.com"}),
                "ExternalName",
            ),
            (
                json!({"selector": {"a": "b"}, "externalIPs": ["1.2.3.4"]}),
                "spec.externalIPs",
            ),
            (
                json!({"selector": {"a": "b"}, "clusterIP": "10.96.0.10"}),
                "spec.clusterIP",
            ),
            (
                json!({"selector": {"a": "b"}, "clusterIPs": ["10.96.0.10"]}),
                "spec.clusterIP",
            ),
            (
                json!({"ports": [{"port": 80}]}),
                "spec.selector is required",
            ),
            (json!({"selector": {}}), "spec.selector is required"),
            (
                json!({"selector": {PROVIDER_LABEL: "someone-else"}}),
                "selects another provider instance's Pods",
            ),
        ];
        for (spec, words) in cases {
            let mut object = service(spec.clone());
            let error = confine("v1", "Service", &mut object, (PROVIDER_LABEL, "p")).unwrap_err();
            assert!(error.contains(words), "{spec}: {error}");
        }
    }

    #[test]
    fn a_network_policy_applies_to_the_plugins_own_pods_only() {
        let mut everything = json!({"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
        confine(
            "networking.k8s.io/v1",
            "NetworkPolicy",
            &mut everything,
            (PROVIDER_LABEL, "p"),
        )
        .unwrap();
        assert_eq!(
            everything["spec"]["podSelector"]["matchLabels"][PROVIDER_LABEL],
            "p"
        );
        let mut foreign = json!({"spec": {"podSelector": {"matchLabels": {PROVIDER_LABEL: "q"}}}});
        assert!(
            confine(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                &mut foreign,
                (PROVIDER_LABEL, "p")
            )
            .unwrap_err()
            .contains("spec.podSelector.matchLabels")
        );
    }
}
