use serde_json::{Value, json};

use super::*;

/// The grant of the tests: the image `squid:6` (`docker.io/library/squid:6`) only.
fn squid_only() -> PodGrant {
    PodGrant {
        scheduling: Scheduling::default(),
        images: vec![ImagePattern::parse("squid:6").unwrap()],
    }
}

/// A Pod that passes: the restricted profile, no token, an own ConfigMap and an emptyDir.
fn allowed_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "px"},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 13,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "squid",
                "image": "squid:6",
                "ports": [{"containerPort": 3128}],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-conf", "key": "a"}}}],
                "readinessProbe": {"tcpSocket": {"port": 3128}},
            }],
            "volumes": [
                {"name": "conf", "configMap": {"name": "px-squid"}},
                {"name": "logs", "emptyDir": {}},
                {"name": "info", "downwardAPI": {"items": []}},
            ],
        },
    })
}

/// `allowed_pod` with the JSON pointer `at` set to `value`.
fn with(at: &str, value: Value) -> Value {
    let mut pod = allowed_pod();
    match pod.pointer_mut(at) {
        Some(existing) => *existing = value,
        None => {
            let (parent, key) = at.rsplit_once('/').unwrap();
            pod.pointer_mut(parent)
                .unwrap_or_else(|| panic!("{parent}"))[key] = value;
        }
    }
    pod
}

#[test]
fn the_restricted_pod_passes_and_its_configmaps_are_returned() {
    let refs = check(&allowed_pod(), &squid_only()).unwrap();
    assert_eq!(
        refs.configmaps.into_iter().collect::<Vec<_>>(),
        ["env-conf", "px-squid"]
    );
    // Not a Pod at all.
    assert_eq!(
        check(&json!({"data": {"a": "b"}}), &squid_only()),
        Ok(PodReferences::default())
    );
}

#[rstest::rstest]
#[case::host_network("/spec/hostNetwork", json!(true), "spec.hostNetwork is not allowed")]
#[case::host_pid("/spec/hostPID", json!(true), "spec.hostPID")]
#[case::host_ipc("/spec/hostIPC", json!(true), "spec.hostIPC")]
#[case::node_name("/spec/nodeName", json!("node-1"), "spec.nodeName is not allowed")]
#[case::runtime_class("/spec/runtimeClassName", json!("unsandboxed"), "spec.runtimeClassName")]
#[case::token_automounted("/spec/automountServiceAccountToken", json!(true), "automountServiceAccountToken must be false")]
#[case::token_by_default(
    "/spec/automountServiceAccountToken",
    Value::Null,
    "automountServiceAccountToken must be false"
)]
#[case::service_account("/spec/serviceAccountName", json!("proxy-operator"), "serviceAccountName `proxy-operator`")]
#[case::image_pull_secret("/spec/imagePullSecrets", json!([{"name": "regcred"}]), "imagePullSecrets")]
#[case::ephemeral_container("/spec/ephemeralContainers", json!([{"name": "debug"}]), "ephemeralContainers")]
#[case::system_priority("/spec/priorityClassName", json!("system-node-critical"), "priorityClassName")]
#[case::root_pod("/spec/securityContext/runAsUser", json!(0), "spec.securityContext.runAsUser 0")]
#[case::sysctls("/spec/securityContext/sysctls", json!([{"name": "net.core.somaxconn", "value": "1"}]), "sysctls")]
#[case::seccomp_unconfined("/spec/securityContext/seccompProfile", json!({"type": "Unconfined"}), "Unconfined")]
#[case::no_seccomp(
    "/spec/securityContext/seccompProfile",
    Value::Null,
    "seccompProfile.type (or the Pod's) must be RuntimeDefault"
)]
#[case::not_non_root("/spec/securityContext/runAsNonRoot", json!(false), "runAsNonRoot (or the Pod's) must be true")]
#[case::selinux_type("/spec/securityContext/seLinuxOptions", json!({"type": "spc_t"}), "seLinuxOptions.type `spc_t`")]
#[case::host_process("/spec/securityContext/windowsOptions", json!({"hostProcess": true}), "hostProcess")]
#[case::apparmor_unconfined("/spec/securityContext/appArmorProfile", json!({"type": "Unconfined"}), "appArmorProfile")]
#[case::apparmor_localhost_unconfined("/spec/securityContext/appArmorProfile", json!({"type": "Localhost", "localhostProfile": "unconfined"}), "appArmorProfile.type \"Localhost\" is not allowed")]
#[case::container_apparmor_localhost("/spec/containers/0/securityContext/appArmorProfile", json!({"type": "Localhost", "localhostProfile": "unconfined"}), "containers[0].securityContext.appArmorProfile.type")]
#[case::root_as_a_float("/spec/securityContext/runAsUser", json!(0.0), "spec.securityContext.runAsUser 0 (root)")]
#[case::root_as_negative_zero("/spec/containers/0/securityContext/runAsUser", json!(-0.0), "runAsUser 0 (root)")]
#[case::toleration("/spec/tolerations", json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]), "spec.tolerations[0]")]
#[case::tolerate_everything("/spec/tolerations", json!([{"operator": "Exists"}]), "a toleration lets the Pod onto tainted nodes")]
#[case::node_selector("/spec/nodeSelector", json!({"node-role.kubernetes.io/control-plane": ""}), "spec.nodeSelector.node-role.kubernetes.io/control-plane is not allowed")]
#[case::host_path("/spec/volumes/1", json!({"name": "root", "hostPath": {"path": "/"}}), "volume root) is a `hostPath` volume")]
#[case::secret_volume("/spec/volumes/1", json!({"name": "s", "secret": {"secretName": "kvm-ssh"}}), "is a `secret` volume")]
#[case::projected_token("/spec/volumes/1", json!({"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}), "is a `projected` volume")]
#[case::nfs("/spec/volumes/1", json!({"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}), "is a `nfs` volume")]
#[case::iscsi("/spec/volumes/1", json!({"name": "i", "iscsi": {}}), "is a `iscsi` volume")]
#[case::pvc("/spec/volumes/1", json!({"name": "p", "persistentVolumeClaim": {"claimName": "data"}}), "persistentVolumeClaim")]
#[case::two_sources("/spec/volumes/1", json!({"name": "x", "emptyDir": {}, "hostPath": {"path": "/"}}), "exactly one source")]
#[case::privileged("/spec/containers/0/securityContext/privileged", json!(true), "containers[0].securityContext.privileged is not allowed")]
#[case::escalation("/spec/containers/0/securityContext/allowPrivilegeEscalation", json!(true), "allowPrivilegeEscalation must be false")]
#[case::capabilities_kept("/spec/containers/0/securityContext/capabilities", json!({"drop": ["NET_RAW"]}), "capabilities.drop must include ALL")]
#[case::capability_added("/spec/containers/0/securityContext/capabilities", json!({"drop": ["ALL"], "add": ["SYS_ADMIN"]}), "SYS_ADMIN is not allowed")]
#[case::unmasked_proc("/spec/containers/0/securityContext/procMount", json!("Unmasked"), "procMount")]
#[case::root_container("/spec/containers/0/securityContext/runAsUser", json!(0), "containers[0].securityContext.runAsUser 0")]
#[case::container_not_non_root("/spec/containers/0/securityContext/runAsNonRoot", json!(false), "runAsNonRoot")]
#[case::container_seccomp_unconfined("/spec/containers/0/securityContext/seccompProfile", json!({"type": "Unconfined"}), "Unconfined")]
#[case::host_port("/spec/containers/0/ports", json!([{"containerPort": 80, "hostPort": 80}]), "hostPort")]
#[case::secret_env("/spec/containers/0/env", json!([{"name": "K", "valueFrom": {"secretKeyRef": {"name": "kvm-ssh", "key": "ssh-privatekey"}}}]), "secretKeyRef")]
#[case::secret_env_from("/spec/containers/0/envFrom", json!([{"secretRef": {"name": "kvm-ssh"}}]), "envFrom[0].secretRef")]
#[case::probe_elsewhere("/spec/containers/0/readinessProbe", json!({"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}), "readinessProbe.httpGet.host")]
#[case::hook_elsewhere("/spec/containers/0/lifecycle", json!({"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 22}}}), "lifecycle.preStop.tcpSocket.host")]
#[case::image_not_granted("/spec/containers/0/image", json!("docker.io/library/alpine:3"), "spec.containers[0].image `docker.io/library/alpine:3` is not in grants.kube.images (squid:6)")]
#[case::image_another_tag("/spec/containers/0/image", json!("squid:7"), "containers[0].image `squid:7` is not in grants.kube.images")]
#[case::image_latest("/spec/containers/0/image", json!("squid"), "image `squid` is not in grants.kube.images")]
#[case::image_by_digest("/spec/containers/0/image", json!("squid:6@sha256:0000000000000000000000000000000000000000000000000000000000000000"), "is not in grants.kube.images")]
#[case::image_of_another_registry("/spec/containers/0/image", json!("registry.example/library/squid:6"), "is not in grants.kube.images")]
#[case::image_missing("/spec/containers/0/image", json!(null), "spec.containers[0].image is missing")]
#[case::init_container_image("/spec/initContainers", json!([{"name": "fetch", "image": "curlimages/curl:8", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]), "spec.initContainers[0].image `curlimages/curl:8` is not in grants.kube.images")]
fn every_escape_names_its_field(#[case] at: &str, #[case] value: Value, #[case] says: &str) {
    let problem = check(&with(at, value), &squid_only()).expect_err("refused");
    assert!(problem.contains(says), "{problem}");
}

#[test]
fn init_containers_and_every_workload_template_are_held_to_the_same_rules() {
    let bad_container =
        json!({"name": "init", "image": "busybox", "securityContext": {"privileged": true}});
    let pod = with("/spec/initContainers", json!([bad_container]));
    assert!(
        check(&pod, &squid_only())
            .unwrap_err()
            .contains("spec.initContainers[0]")
    );

    let spec = allowed_pod()["spec"].clone();
    let mut bad_spec = spec.clone();
    bad_spec["hostNetwork"] = json!(true);
    let deployment = json!({"kind": "Deployment", "spec": {"template": {"spec": bad_spec}}});
    assert!(
        check(&deployment, &squid_only())
            .unwrap_err()
            .contains("spec.template.spec.hostNetwork")
    );
    let cronjob = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": bad_spec}}}}});
    assert!(
        check(&cronjob, &squid_only())
            .unwrap_err()
            .contains("spec.jobTemplate.spec.template.spec.hostNetwork")
    );
    // A Pod spec wherever a custom resource keeps it.
    let custom = json!({"kind": "Workflow", "spec": {"steps": [{"pod": bad_spec}]}});
    assert!(
        check(&custom, &squid_only())
            .unwrap_err()
            .contains("spec.steps[0].pod.hostNetwork")
    );
    let fine = json!({"kind": "Deployment", "spec": {"template": {"spec": spec}}});
    assert!(check(&fine, &squid_only()).is_ok());
}

#[test]
fn images_pass_as_the_grant_names_them() {
    let grant = |entries: &[&str]| PodGrant {
        images: entries
            .iter()
            .map(|e| ImagePattern::parse(e).unwrap())
            .collect(),
        ..PodGrant::default()
    };
    let digest = "sha256:0123456789012345678901234567890123456789012345678901234567890123";
    for (image, entries) in [
        ("squid:6", &["docker.io/library/squid:6"][..]),
        ("docker.io/library/squid:6", &["squid:6"][..]),
        ("index.docker.io/library/squid:6", &["squid:6"][..]),
        (
            "ubuntu/squid:6.6-24.04_beta",
            &["docker.io/ubuntu/squid:*"][..],
        ),
        (
            &format!("ubuntu/squid@{digest}"),
            &["docker.io/ubuntu/squid@sha256:*"][..],
        ),
        (
            &format!("ubuntu/squid:6@{digest}"),
            &[&format!("ubuntu/squid@{digest}")[..]][..],
        ),
        (
            "registry.example:5000/squid:6",
            &["registry.example:5000/squid:6"][..],
        ),
    ] {
        let pod = with("/spec/containers/0/image", json!(image));
        assert!(
            check(&pod, &grant(entries)).is_ok(),
            "{image} by {entries:?}"
        );
    }
    for (image, entries) in [
        ("ubuntu/squid:6", &["docker.io/ubuntu/squid@sha256:*"][..]),
        (&format!("ubuntu/squid:6@{digest}"), &["ubuntu/squid:6"][..]),
        ("ubuntu/squid-evil:6", &["docker.io/ubuntu/squid:*"][..]),
        (
            "evil.example/ubuntu/squid:6",
            &["docker.io/ubuntu/squid:*"][..],
        ),
        ("squid:*", &["squid:6"][..]),
        ("squid:6", &[][..]),
    ] {
        let pod = with("/spec/containers/0/image", json!(image));
        assert!(
            check(&pod, &grant(entries)).is_err(),
            "{image} by {entries:?}"
        );
    }
}

#[test]
fn scheduling_fields_pass_only_as_the_grant_configures_them() {
    let granted = PodGrant {
        scheduling: Scheduling {
            node_selector_keys: vec!["topology.kubernetes.io/zone".into(), "egress".into()],
            tolerations: vec![Toleration {
                key: "dedicated".into(),
                operator: Some("Equal".into()),
                value: "proxies".into(),
                effect: "NoSchedule".into(),
            }],
        },
        ..squid_only()
    };
    let pod = with(
        "/spec/nodeSelector",
        json!({"topology.kubernetes.io/zone": "a", "egress": "public"}),
    );
    assert!(check(&pod, &granted).is_ok());
    let pod = with(
        "/spec/tolerations",
        json!([{"key": "dedicated", "value": "proxies", "effect": "NoSchedule", "tolerationSeconds": 5}]),
    );
    assert!(check(&pod, &granted).is_ok(), "operator Equal by default");
    let other = with(
        "/spec/tolerations",
        json!([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]),
    );
    assert!(
        check(&other, &granted)
            .unwrap_err()
            .contains("grants.kube.scheduling.tolerations")
    );
    let not_a_map = with("/spec/nodeSelector", json!(["egress"]));
    assert!(
        check(&not_a_map, &granted)
            .unwrap_err()
            .contains("must be a map of node labels, not an array")
    );
}
