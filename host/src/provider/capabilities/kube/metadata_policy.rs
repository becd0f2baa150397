//! What a plugin may put in the labels and annotations of its objects, and of every object
//! template inside them (a workload's Pod template, a CronJob's Job template): labels select
//! (a Pod labelled like somebody's Service joins it and receives its traffic; one labelled like a
//! ReplicaSet's selector is adopted, and the ReplicaSet deletes one of its own Pods), and
//! annotations steer other controllers and the API server (`pod-deletion-cost`, the AppArmor and
//! seccomp annotations, `kubectl.kubernetes.io/*`). So it is an allow-list: the keys under
//! [`PLUGIN_PREFIX`], which nothing but plugins reads, plus the host's own labels, which the
//! host sets itself.

use serde_json::{Map, Value, json};

use super::traffic_policy::OwnLabel;

/// The label and annotation prefix a plugin owns: nothing else in the cluster reads it.
pub const PLUGIN_PREFIX: &str = "plugin.proxy-operator.dev/";

/// Checks the object's own labels and annotations (`metadata`) and those of every template in
/// `data` (the object without its metadata); `host_labels` are the label keys the host sets.
pub fn check(
    metadata_labels: Option<&std::collections::BTreeMap<String, String>>,
    metadata_annotations: Option<&std::collections::BTreeMap<String, String>>,
    data: &Value,
    host_labels: &[&str],
) -> Result<(), String> {
    for key in metadata_labels.into_iter().flat_map(|l| l.keys()) {
        check_label("metadata.labels", key, host_labels)?;
    }
    for key in metadata_annotations.into_iter().flat_map(|a| a.keys()) {
        check_annotation("metadata.annotations", key)?;
    }
    let mut templates = Vec::new();
    find_templates(data, String::new(), &mut templates);
    for (path, metadata) in templates {
        match metadata.get("labels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for key in labels.keys() {
                    check_label(&format!("{path}.labels"), key, host_labels)?;
                }
            }
            Some(_) => return Err(format!("{path}.labels must be a map of labels")),
        }
        match metadata.get("annotations") {
            None | Some(Value::Null) => {}
            Some(Value::Object(annotations)) => {
                for key in annotations.keys() {
                    check_annotation(&format!("{path}.annotations"), key)?;
                }
            }
            Some(_) => return Err(format!("{path}.annotations must be a map")),
        }
    }
    Ok(())
}

fn check_label(at: &str, key: &str, host_labels: &[&str]) -> Result<(), String> {
    if key.starts_with(PLUGIN_PREFIX) || host_labels.contains(&key) {
        return Ok(());
    }
    Err(format!(
        "{at}: label `{key}` is not allowed; a plugin's labels are under {PLUGIN_PREFIX} (any other label can make somebody's Service, ReplicaSet or NetworkPolicy select the object)"
    ))
}

fn check_annotation(at: &str, key: &str) -> Result<(), String> {
    if key.starts_with(PLUGIN_PREFIX) {
        return Ok(());
    }
    Err(format!(
        "{at}: annotation `{key}` is not allowed; a plugin's annotations are under {PLUGIN_PREFIX} (others change how the API server or other controllers treat the object)"
    ))
}

/// Every `metadata` map inside `data` (a template's), with its path.
fn find_templates<'a>(
    value: &'a Value,
    path: String,
    found: &mut Vec<(String, &'a Map<String, Value>)>,
) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                if key == "metadata"
                    && let Value::Object(metadata) = child
                {
                    found.push((at.clone(), metadata));
                }
                find_templates(child, at, found);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                find_templates(child, format!("{path}[{index}]"), found);
            }
        }
        _ => {}
    }
}

/// A workload (an object with `spec.selector` and `spec.template`) manages the Pods its selector
/// matches: both are confined to the provider instance's label, so its Pods carry it and it never
/// adopts (and deletes) somebody else's Pods.
pub fn confine_workload(data: &mut Value, (key, own): OwnLabel) -> Result<(), String> {
    let Some(spec) = data.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let is_workload = spec.get("template").is_some_and(Value::is_object)
        && spec.get("selector").is_some_and(Value::is_object);
    if !is_workload {
        return Ok(());
    }
    if let Some(Value::Object(selector)) = spec.get_mut("selector") {
        let labels = selector.entry("matchLabels").or_insert_with(|| json!({}));
        if labels.is_null() {
            *labels = json!({});
        }
        let Some(labels) = labels.as_object_mut() else {
            return Err("spec.selector.matchLabels must be a map of labels".into());
        };
        if let Some(other) = labels.get(key).and_then(Value::as_str)
            && other != own
        {
            return Err(format!(
                "spec.selector.matchLabels.{key} `{other}` selects another provider instance's Pods"
            ));
        }
        labels.insert(key.into(), json!(own));
    }
    let Some(Value::Object(template)) = spec.get_mut("template") else {
        return Ok(());
    };
    let metadata = template.entry("metadata").or_insert_with(|| json!({}));
    if metadata.is_null() {
        *metadata = json!({});
    }
    let Some(metadata) = metadata.as_object_mut() else {
        return Err("spec.template.metadata must be a map".into());
    };
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    if labels.is_null() {
        *labels = json!({});
    }
    let Some(labels) = labels.as_object_mut() else {
        return Err("spec.template.metadata.labels must be a map of labels".into());
    };
    labels.insert(key.into(), json!(own));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const HOST: &[&str] = &[
        "proxy-operator.dev/provider",
        "app.kubernetes.io/managed-by",
    ];

    fn map(key: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_string(), "x".to_string())])
    }

    #[test]
    fn only_plugin_owned_and_host_labels_pass() {
        for ok in [
            "plugin.proxy-operator.dev/proxy",
            "proxy-operator.dev/provider",
        ] {
            assert!(
                check(Some(&map(ok)), None, &json!({}), HOST).is_ok(),
                "{ok}"
            );
        }
        for refused in [
            "app",
            "app.kubernetes.io/name",
            "proxy-operator.dev/proxy",
            "plugin.proxy-operator.dev",
            "pod-template-hash",
        ] {
            let error = check(Some(&map(refused)), None, &json!({}), HOST).unwrap_err();
            assert!(
                error.contains(&format!(
                    "metadata.labels: label `{refused}` is not allowed"
                )),
                "{error}"
            );
        }
    }

    #[test]
    fn annotations_that_steer_other_controllers_are_refused_in_objects_and_templates() {
        for refused in [
            "controller.kubernetes.io/pod-deletion-cost",
            "container.apparmor.security.beta.kubernetes.io/squid",
            "seccomp.security.alpha.kubernetes.io/pod",
            "kubectl.kubernetes.io/last-applied-configuration",
            "cluster-autoscaler.kubernetes.io/safe-to-evict",
            "proxy-operator.dev/owner-uid",
        ] {
            let error = check(None, Some(&map(refused)), &json!({}), HOST).unwrap_err();
            assert!(
                error.contains(&format!("annotation `{refused}` is not allowed")),
                "{error}"
            );
            let deployment = json!({"spec": {"template": {"metadata": {"annotations": {refused: "unconfined"}}}}});
            let error = check(None, None, &deployment, HOST).unwrap_err();
            assert!(
                error.starts_with("spec.template.metadata.annotations"),
                "{error}"
            );
            let cronjob = json!({"spec": {"jobTemplate": {"spec": {"template": {"metadata": {"annotations": {refused: "x"}}}}}}});
            let error = check(None, None, &cronjob, HOST).unwrap_err();
            assert!(
                error.starts_with("spec.jobTemplate.spec.template.metadata.annotations"),
                "{error}"
            );
        }
        assert!(
            check(
                None,
                Some(&map("plugin.proxy-operator.dev/owner-uid")),
                &json!({}),
                HOST
            )
            .is_ok()
        );
        let template_label =
            json!({"spec": {"template": {"metadata": {"labels": {"app": "victim"}}}}});
        assert!(
            check(None, None, &template_label, HOST)
                .unwrap_err()
                .contains("spec.template.metadata.labels: label `app`")
        );
        let not_a_map = json!({"spec": {"template": {"metadata": {"labels": ["app"]}}}});
        assert!(
            check(None, None, &not_a_map, HOST)
                .unwrap_err()
                .contains("must be a map")
        );
    }

    #[test]
    fn a_workloads_selector_and_template_carry_the_instances_label() {
        let own = ("proxy-operator.dev/provider", "p");
        let mut deployment = json!({"spec": {"selector": {"matchLabels": {"plugin.proxy-operator.dev/app": "squid"}}, "template": {"spec": {}}}});
        confine_workload(&mut deployment, own).unwrap();
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"]["proxy-operator.dev/provider"],
            "p"
        );
        assert_eq!(
            deployment["spec"]["template"]["metadata"]["labels"]["proxy-operator.dev/provider"],
            "p"
        );
        let mut foreign = json!({"spec": {"selector": {"matchLabels": {"proxy-operator.dev/provider": "q"}}, "template": {}}});
        assert!(
            confine_workload(&mut foreign, own)
                .unwrap_err()
                .contains("another provider instance")
        );
        let mut odd = json!({"spec": {"selector": {"matchLabels": []}, "template": {}}});
        assert!(confine_workload(&mut odd, own).is_err());
        let mut not_a_workload = json!({"spec": {"selector": {"a": "b"}}});
        confine_workload(&mut not_a_workload, own).unwrap();
        assert_eq!(not_a_workload, json!({"spec": {"selector": {"a": "b"}}}));
    }
}
