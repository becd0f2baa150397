//! What a plugin may put in the labels and annotations of its objects, and of every object
//! template inside them (a workload's Pod template, a CronJob's Job template): labels select
//! (a Pod labelled like somebody's Service joins it and receives its traffic; one labelled like a
//! ReplicaSet's selector is adopted, and the ReplicaSet deletes one of its own Pods), and
//! annotations steer other controllers and the API server (`pod-deletion-cost`, the AppArmor and
//! seccomp annotations, `kubectl.kubernetes.io/*`). So it is an allow-list: the keys under
//! [`PLUGIN_PREFIX`], which nothing but plugins reads, plus the host's own labels, which the
//! host sets itself and which may carry only the instance's own values (in the object and in
//! every template inside it: a template labelled as another provider instance's would make Pods
//! that its Services and selectors take for theirs).

use serde_json::{Map, Value};

/// The label and annotation prefix a plugin owns: nothing else in the cluster reads it.
pub const PLUGIN_PREFIX: &str = "plugin.proxy-operator.dev/";

/// Checks the object's own labels and annotations (`metadata`) and those of every template in
/// `data` (the object without its metadata); `host_labels` are the labels the host sets, each
/// with the only value it may have here.
pub fn check(
    metadata_labels: Option<&std::collections::BTreeMap<String, String>>,
    metadata_annotations: Option<&std::collections::BTreeMap<String, String>>,
    data: &Value,
    host_labels: &[HostLabel],
) -> Result<(), String> {
    for (key, value) in metadata_labels.into_iter().flatten() {
        check_label(
            "metadata.labels",
            key,
            &Value::from(value.as_str()),
            host_labels,
        )?;
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
                for (key, value) in labels {
                    check_label(&format!("{path}.labels"), key, value, host_labels)?;
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

/// A label the host sets, and its value for this provider instance.
pub type HostLabel<'a> = (&'a str, &'a str);

fn check_label(
    at: &str,
    key: &str,
    value: &Value,
    host_labels: &[HostLabel],
) -> Result<(), String> {
    if key.starts_with(PLUGIN_PREFIX) {
        return Ok(());
    }
    if let Some((_, own)) = host_labels.iter().find(|(host, _)| *host == key) {
        if value.as_str() == Some(own) || value.is_null() {
            return Ok(());
        }
        return Err(format!(
            "{at}: label `{key}` {value} is not this provider instance's (`{own}`); the host sets it, and a template labelled as another instance's would make Pods its Services and controllers take for theirs"
        ));
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    const HOST: &[HostLabel] = &[
        ("proxy-operator.dev/provider", "p"),
        ("app.kubernetes.io/managed-by", "proxy-operator"),
    ];

    fn map(key: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(key.to_string(), "x".to_string())])
    }

    #[test]
    fn only_plugin_owned_and_host_labels_pass() {
        let own = BTreeMap::from([
            (
                "plugin.proxy-operator.dev/proxy".to_string(),
                "x".to_string(),
            ),
            ("proxy-operator.dev/provider".to_string(), "p".to_string()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "proxy-operator".to_string(),
            ),
        ]);
        assert!(check(Some(&own), None, &json!({}), HOST).is_ok());
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

    /// Issue #47: a template (a Job's, a CronJob's, a ReplicationController's, a PodTemplate's)
    /// labelled as another provider instance's made Pods that instance's Service and selectors
    /// took for theirs. Host labels carry the instance's own values, at every depth.
    #[test]
    fn host_labels_carry_only_the_instances_own_values_at_every_depth() {
        let foreign = json!({"proxy-operator.dev/provider": "other", "plugin.proxy-operator.dev/component": "egress-proxy"});
        let cases = [
            (
                json!({"spec": {"template": {"metadata": {"labels": foreign}}}}),
                "spec.template.metadata.labels",
            ),
            (
                json!({"spec": {"jobTemplate": {"metadata": {"labels": foreign}}}}),
                "spec.jobTemplate.metadata.labels",
            ),
            (
                json!({"spec": {"jobTemplate": {"spec": {"template": {"metadata": {"labels": foreign}}}}}}),
                "spec.jobTemplate.spec.template.metadata.labels",
            ),
            (
                json!({"template": {"metadata": {"labels": foreign}}}),
                "template.metadata.labels",
            ),
            (
                json!({"spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "helm"}}}}}),
                "spec.template.metadata.labels: label `app.kubernetes.io/managed-by` \"helm\"",
            ),
            (
                json!({"spec": {"template": {"metadata": {"labels": {"proxy-operator.dev/provider": 7}}}}}),
                "spec.template.metadata.labels: label `proxy-operator.dev/provider` 7",
            ),
        ];
        for (object, says) in cases {
            let error = check(None, None, &object, HOST).unwrap_err();
            assert!(error.starts_with(says), "{object}: {error}");
        }
        let top = map("proxy-operator.dev/provider");
        assert!(
            check(Some(&top), None, &json!({}), HOST)
                .unwrap_err()
                .contains("label `proxy-operator.dev/provider` \"x\" is not this provider instance's (`p`)")
        );
        let own = json!({"spec": {"template": {"metadata": {"labels": {"proxy-operator.dev/provider": "p", "app.kubernetes.io/managed-by": "proxy-operator"}}}}});
        assert!(check(None, None, &own, HOST).is_ok());
    }
}
