use serde_json::{Value, json};

use super::*;
use crate::provider::capabilities::grants::{KNOWN_KINDS, KindPolicy};

const KEY: &str = crate::api::labels::PROVIDER_LABEL;
const OWN: OwnLabel = (KEY, "p");

fn confined(policy: KindPolicy, mut object: Value) -> Result<Value, String> {
    confine(policy, &mut object, OWN).map(|()| object)
}

/// Every template of every kind carries the instance's label after confining, and every
/// selector selects it: (policy, object, the pointers that must hold `p`).
#[test]
fn every_template_and_selector_of_every_kind_carries_the_instances_label() {
    let pod_template = || json!({"spec": {"containers": []}});
    let cases: Vec<(KindPolicy, Value, Vec<&str>)> = vec![
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {"matchLabels": {"plugin.proxy-operator.dev/app": "squid"}}, "template": pod_template()}}),
            vec![
                "/spec/selector/matchLabels",
                "/spec/template/metadata/labels",
            ],
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}, "template": pod_template()}}),
            vec![
                "/spec/selector/matchLabels",
                "/spec/template/metadata/labels",
            ],
        ),
        (
            KindPolicy::ReplicationController,
            json!({"spec": {"replicas": 0, "template": pod_template()}}),
            vec!["/spec/template/metadata/labels"],
        ),
        (
            KindPolicy::ReplicationController,
            json!({"spec": {"selector": {"plugin.proxy-operator.dev/proxy": "px-1"}, "template": pod_template()}}),
            vec!["/spec/selector", "/spec/template/metadata/labels"],
        ),
        (
            KindPolicy::Job,
            json!({"spec": {"template": pod_template()}}),
            vec!["/spec/template/metadata/labels"],
        ),
        (
            KindPolicy::Job,
            json!({"spec": {"manualSelector": true, "selector": {"matchLabels": {}}, "template": pod_template()}}),
            vec![
                "/spec/selector/matchLabels",
                "/spec/template/metadata/labels",
            ],
        ),
        (
            KindPolicy::CronJob,
            json!({"spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod_template()}}}}),
            vec![
                "/spec/jobTemplate/metadata/labels",
                "/spec/jobTemplate/spec/template/metadata/labels",
            ],
        ),
        (
            KindPolicy::CronJob,
            json!({"spec": {"jobTemplate": {"spec": {"selector": {}, "template": pod_template()}}}}),
            vec![
                "/spec/jobTemplate/metadata/labels",
                "/spec/jobTemplate/spec/selector/matchLabels",
                "/spec/jobTemplate/spec/template/metadata/labels",
            ],
        ),
        (
            KindPolicy::PodTemplate,
            json!({"template": pod_template()}),
            vec!["/template/metadata/labels"],
        ),
        (
            KindPolicy::PodDisruptionBudget,
            json!({"spec": {"maxUnavailable": 0}}),
            vec!["/spec/selector/matchLabels"],
        ),
        (
            KindPolicy::PodDisruptionBudget,
            json!({"spec": {"selector": {}, "maxUnavailable": 0}}),
            vec!["/spec/selector/matchLabels"],
        ),
        (
            KindPolicy::Service,
            json!({"spec": {"selector": {"plugin.proxy-operator.dev/proxy": "px-1"}}}),
            vec!["/spec/selector"],
        ),
        (
            KindPolicy::NetworkPolicy,
            json!({"spec": {"podSelector": {}}}),
            vec!["/spec/podSelector/matchLabels"],
        ),
    ];
    for (policy, object, pointers) in cases {
        let before = object.clone();
        let after = confined(policy, object).unwrap_or_else(|e| panic!("{before}: {e}"));
        for pointer in pointers {
            assert_eq!(
                after.pointer(pointer).and_then(|labels| labels.get(KEY)),
                Some(&json!("p")),
                "{policy:?} {before}: {pointer} in {after}"
            );
        }
    }
}

/// Issue #47: a ReplicationController of `replicas: 0` selecting another instance's squid Pods
/// adopted and deleted them; a Job joined another instance's Service. Another instance's value
/// anywhere a selector or template says who the Pods are is refused, naming the field.
#[test]
fn another_instances_label_in_a_selector_or_template_is_refused_naming_the_field() {
    let other = json!({KEY: "other", "plugin.proxy-operator.dev/component": "egress-proxy"});
    let template = json!({"metadata": {"labels": other}, "spec": {"containers": []}});
    let cases = [
        (
            KindPolicy::ReplicationController,
            json!({"spec": {"replicas": 0, "selector": other, "template": {"spec": {}}}}),
            "spec.selector.proxy-operator.dev/provider \"other\"",
        ),
        (
            KindPolicy::ReplicationController,
            json!({"spec": {"replicas": 0, "template": template}}),
            "spec.template.metadata.labels.proxy-operator.dev/provider \"other\"",
        ),
        (
            KindPolicy::Job,
            json!({"spec": {"template": template}}),
            "spec.template.metadata.labels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::Job,
            json!({"spec": {"manualSelector": true, "selector": {"matchLabels": other}, "template": {}}}),
            "spec.selector.matchLabels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::CronJob,
            json!({"spec": {"jobTemplate": {"spec": {"template": template}}}}),
            "spec.jobTemplate.spec.template.metadata.labels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::CronJob,
            json!({"spec": {"jobTemplate": {"metadata": {"labels": other}, "spec": {}}}}),
            "spec.jobTemplate.metadata.labels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::PodTemplate,
            json!({"template": template}),
            "template.metadata.labels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {"matchLabels": other}, "template": {}}}),
            "spec.selector.matchLabels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {}, "template": template}}),
            "spec.template.metadata.labels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::PodDisruptionBudget,
            json!({"spec": {"selector": {"matchLabels": other}}}),
            "spec.selector.matchLabels.proxy-operator.dev/provider",
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {}, "template": {}, "volumeClaimTemplates": [{"metadata": {"name": "data"}}]}}),
            "spec.volumeClaimTemplates is not allowed",
        ),
    ];
    for (policy, object, says) in cases {
        let error = confined(policy, object.clone()).unwrap_err();
        assert!(error.starts_with(says), "{policy:?} {object}: {error}");
    }
}

#[test]
fn shapes_that_are_not_maps_are_refused_naming_the_field() {
    let cases = [
        (
            KindPolicy::Workload,
            json!({"spec": []}),
            "spec must be a map, not an array",
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": "all"}}),
            "spec.selector must be a map, not a string",
        ),
        (
            KindPolicy::Workload,
            json!({"spec": {"selector": {"matchLabels": []}}}),
            "spec.selector.matchLabels must be a map",
        ),
        (
            KindPolicy::Job,
            json!({"spec": {"template": {"metadata": 3}}}),
            "spec.template.metadata must be a map, not a number",
        ),
        (
            KindPolicy::CronJob,
            json!({"spec": {"jobTemplate": []}}),
            "spec.jobTemplate must be a map",
        ),
        (
            KindPolicy::ReplicationController,
            json!({"spec": {"selector": ["a"]}}),
            "spec.selector must be a map",
        ),
        (
            KindPolicy::PodTemplate,
            json!({"template": {"metadata": {"labels": "x"}}}),
            "template.metadata.labels must be a map",
        ),
        (
            KindPolicy::PodDisruptionBudget,
            json!([]),
            "the object must be a map",
        ),
    ];
    for (policy, object, says) in cases {
        let error = confined(policy, object.clone()).unwrap_err();
        assert!(error.starts_with(says), "{policy:?} {object}: {error}");
    }
}

#[test]
fn data_and_pods_pass_unchanged_and_every_known_kind_has_a_policy() {
    let map = json!({"data": {"squid.conf": "x"}});
    assert_eq!(confined(KindPolicy::Data, map.clone()).unwrap(), map);
    let pod = json!({"spec": {"containers": []}});
    assert_eq!(confined(KindPolicy::Pod, pod.clone()).unwrap(), pod);
    for known in KNOWN_KINDS {
        assert_eq!(
            KindPolicy::of(known.api_version, known.kind),
            Some(known.policy)
        );
    }
    for unknown in [
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("v1", "ServiceAccount"),
        ("networking.k8s.io/v1", "Ingress"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("apps/v1", "DaemonSet"),
        ("v1", "Secret"),
    ] {
        assert_eq!(KindPolicy::of(unknown.0, unknown.1), None, "{unknown:?}");
    }
}
