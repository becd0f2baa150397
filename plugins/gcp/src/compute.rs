//! Compute Engine REST shapes: the insert body of a proxy VM, the instance read back from a
//! resource, and Google's error bodies mapped to provider errors. Plain functions over JSON,
//! tested natively.

use proxy_operator_sdk::squid;
use proxy_operator_sdk::{
    Instance, InstanceSpec, InstanceState, Owner, ProviderError, retried_as_transient, transient,
};
use serde_json::{Value, json};

use crate::config::Config;

/// On every VM: what `list` filters on.
pub const MANAGED_LABEL: &str = "proxy-operator-managed";
pub const OWNER_UID_LABEL: &str = "proxy-operator-owner-uid";
/// The metadata item with the whole owner identity (labels are too short for it).
pub const OWNER_ITEM: &str = "proxy-operator-owner";
pub const PORT_ITEM: &str = "proxy-operator-port";

/// `<zone>/<name>`: what `get` and `delete` need to find the VM.
pub fn provider_id(zone: &str, name: &str) -> String {
    format!("{zone}/{name}")
}

pub fn parse_provider_id(id: &str) -> Result<(&str, &str), ProviderError> {
    id.split_once('/')
        .filter(|(zone, name)| !zone.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| {
            ProviderError::Permanent(format!(
                "provider id `{id}` is not <zone>/<instance>; it was not made by the gcp provider"
            ))
        })
}

/// A label value: lowercase letters, digits, `_` and `-`, at most 63.
pub fn label_value(value: &str) -> String {
    value
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect()
}

/// The metadata item Google's guest environment runs as root at every boot.
pub const STARTUP_SCRIPT_ITEM: &str = "startup-script";

/// The `instances.insert` body of a proxy VM. `managed_squid`: configure squid with a startup
/// script (Google's images run it at every boot, whatever the user-data does).
pub fn insert_body(
    config: &Config,
    spec: &InstanceSpec,
    zone: &str,
    managed_squid: bool,
) -> Result<Value, ProviderError> {
    let machine_type = spec.machine_type.as_deref().unwrap_or(&config.machine_type);
    let image = spec.image.as_deref().unwrap_or(&config.image);
    let owner = json!({
        "namespace": spec.owner.namespace,
        "name": spec.owner.name,
        "uid": spec.owner.uid,
        "operatorId": spec.owner.operator_id,
    });
    let mut items = vec![
        json!({"key": OWNER_ITEM, "value": owner.to_string()}),
        json!({"key": PORT_ITEM, "value": spec.port.to_string()}),
    ];
    // cloud-init on Google's images reads `user-data` (and `vendor-data`) from the metadata server.
    if !spec.user_data.is_empty() {
        items.push(json!({"key": "user-data", "value": String::from_utf8_lossy(&spec.user_data)}));
    }
    if !spec.vendor_data.is_empty() {
        items.push(
            json!({"key": "vendor-data", "value": String::from_utf8_lossy(&spec.vendor_data)}),
        );
    }
    if managed_squid {
        let script = squid::vm_setup(&config.squid(), spec, spec.port, &[])?;
        items.push(json!({"key": STARTUP_SCRIPT_ITEM, "value": script}));
    }
    let mut labels = serde_json::Map::new();
    for (key, value) in &spec.labels {
        labels.insert(label_value(key), json!(label_value(value)));
    }
    labels.insert(MANAGED_LABEL.into(), json!("true"));
    labels.insert(OWNER_UID_LABEL.into(), json!(label_value(&spec.owner.uid)));
    let mut nic = json!({
        "network": config.network,
        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
    });
    if let Some(subnetwork) = &config.subnetwork {
        nic["subnetwork"] = json!(subnetwork);
    }
    let mut body = json!({
        "name": spec.name,
        "machineType": format!("zones/{zone}/machineTypes/{machine_type}"),
        "labels": labels,
        "metadata": {"items": items},
        "tags": {"items": config.network_tags},
        "disks": [{
            "boot": true,
            "autoDelete": true,
            "initializeParams": {"sourceImage": image, "diskSizeGb": config.disk_gib.to_string()},
        }],
        "networkInterfaces": [nic],
    });
    if config.spot {
        body["scheduling"] = json!({
            "provisioningModel": "SPOT",
            "instanceTerminationAction": "DELETE",
        });
    }
    Ok(body)
}

/// Why a VM must not be deleted by this provider: it was not made by proxy-operator (a
/// `providerID` edited to point at somebody's own VM in the project). `None`: it may go.
pub fn not_ours(vm: &Value) -> Option<String> {
    if vm["labels"][MANAGED_LABEL] == "true" {
        return None;
    }
    Some(format!(
        "instance {} has no label {MANAGED_LABEL}=true: proxy-operator did not make it, so it is not deleted",
        vm["name"].as_str().unwrap_or("?")
    ))
}

/// The instance a VM resource is; its owner is `None` for VMs without the owner metadata.
pub fn instance(zone: &str, vm: &Value) -> Instance {
    let name = vm["name"].as_str().unwrap_or_default().to_string();
    let item = |key: &str| {
        vm["metadata"]["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i["key"] == key)
            .and_then(|i| i["value"].as_str())
            .map(str::to_string)
    };
    let owner = item(OWNER_ITEM)
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|o| {
            Some(Owner {
                namespace: o["namespace"].as_str()?.into(),
                name: o["name"].as_str()?.into(),
                uid: o["uid"].as_str()?.into(),
                operator_id: o["operatorId"].as_str()?.into(),
            })
        });
    let state = match vm["status"].as_str() {
        Some("PROVISIONING") | Some("STAGING") | Some("REPAIRING") => InstanceState::Provisioning,
        Some("RUNNING") => InstanceState::Running,
        Some("STOPPING") | Some("SUSPENDING") => InstanceState::Stopping,
        Some("STOPPED") | Some("SUSPENDED") | Some("TERMINATED") => InstanceState::Stopped,
        _ => InstanceState::Unknown,
    };
    let nic = &vm["networkInterfaces"][0];
    let address = nic["accessConfigs"][0]["natIP"]
        .as_str()
        .or_else(|| nic["networkIP"].as_str())
        .map(str::to_string);
    Instance {
        provider_id: provider_id(zone, &name),
        name,
        state,
        address,
        port: item(PORT_ITEM).and_then(|p| p.parse().ok()).unwrap_or(3128),
        zone: Some(zone.to_string()),
        created_at: vm["creationTimestamp"]
            .as_str()
            .and_then(proxy_operator_sdk::time::unix_seconds),
        owner,
        message: vm["statusMessage"].as_str().map(str::to_string),
    }
}

/// How long a failed insert operation answers for its VM: a create within this time gets the
/// operation's error instead of inserting again; after it, the insert is tried again (the quota,
/// image or permission may have been fixed).
pub const FAILED_INSERT_ANSWERS_FOR_SECONDS: i64 = 60;

/// The error of a finished zone operation (`status: DONE` with `error.errors`), as the provider
/// error the operator acts on: quota-like codes are retried slowly, a permission is the
/// credentials' (`unauthorized`), anything else (an image not found, a bad machine type) fails
/// the Proxy. `None`: not finished, or finished without error.
pub fn operation_error(operation: &Value) -> Option<ProviderError> {
    if operation["status"] != "DONE" {
        return None;
    }
    let first = operation["error"]["errors"].as_array()?.first()?;
    let code = first["code"].as_str().unwrap_or("UNKNOWN");
    let message = format!(
        "the insert operation {} failed: {code}: {}",
        operation["name"].as_str().unwrap_or("?"),
        first["message"].as_str().unwrap_or("(no message)")
    );
    Some(
        if code.contains("QUOTA")
            || code.contains("RESOURCE_POOL_EXHAUSTED")
            || code == "RESOURCE_EXHAUSTED"
        {
            ProviderError::Quota(message)
        } else if code.contains("PERMISSION") || code == "FORBIDDEN" {
            ProviderError::Unauthorized(format!(
                "{message}; the service account needs compute.instances.create in the project"
            ))
        } else {
            ProviderError::Permanent(message)
        },
    )
}

/// The latest failed insert among `operations` (the zone operations of one VM) still answering
/// for it at `now` (unix seconds), as its provider error.
pub fn recent_failed_insert(operations: &[Value], now: i64) -> Option<ProviderError> {
    let latest = operations
        .iter()
        .filter(|op| op["operationType"] == "insert")
        .filter_map(|op| Some((time_of(op)?, op)))
        .max_by_key(|(at, _)| *at)?;
    let (at, operation) = latest;
    if now - at > FAILED_INSERT_ANSWERS_FOR_SECONDS {
        return None;
    }
    operation_error(operation)
}

fn time_of(operation: &Value) -> Option<i64> {
    proxy_operator_sdk::time::unix_seconds(operation["insertTime"].as_str()?)
}

/// A Google API error answer as a provider error: the `reason` of its first error decides.
/// The zones `create` looks in for a VM named like the one it is asked for, before inserting
/// one: the zone it would insert into first (where a retry almost always finds it), then every
/// other configured zone. An earlier try may have inserted the VM where the config pointed
/// then; the contract says create returns that VM instead of making a second one.
pub fn search_order<'a>(zones: &'a [String], chosen: &'a str) -> Vec<&'a str> {
    std::iter::once(chosen)
        .chain(zones.iter().map(String::as_str).filter(|z| *z != chosen))
        .collect()
}

/// What `create` answers when `zone` could not be searched for VM `name`: always transient.
/// The VM of an earlier try may be in that zone, so inserting one elsewhere could make a second
/// VM; waiting for the zone to answer cannot. An error that would not go away by itself (a
/// permission on that zone) is retried slowly rather than failing the Proxy for good, because
/// the Proxy's own zone is fine and the fix is outside its spec.
pub fn search_failed(zone: &str, name: &str, error: ProviderError) -> ProviderError {
    retried_as_transient(error, 30_000, |message| {
        format!(
            "zone {zone} could not be searched for an existing instance {name} ({message}); not inserting one elsewhere until it answers"
        )
    })
}

pub fn api_error(what: &str, status: u16, body: &[u8]) -> ProviderError {
    let parsed: Value = serde_json::from_slice(body).unwrap_or_default();
    let message = parsed["error"]["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned());
    let reason = parsed["error"]["errors"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    let message = format!("{what}: HTTP {status} {reason}: {message}");
    match (status, reason) {
        (_, "quotaExceeded" | "rateLimitExceeded" | "ZONE_RESOURCE_POOL_EXHAUSTED") | (429, _) => {
            ProviderError::Quota(message)
        }
        (404, _) => ProviderError::NotFound(message),
        (401, _) | (403, _) => ProviderError::Unauthorized(message),
        (408, _) | (500..=599, _) => transient(message, None),
        _ => ProviderError::Permanent(message),
    }
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
                uid: "5f6c0000-aaaa".into(),
                operator_id: "Prod/Operator".into(),
            },
            zone: None,
            image: None,
            machine_type: Some("e2-medium".into()),
            user_data: b"#cloud-config\npackages: [squid]\n".to_vec(),
            vendor_data: Vec::new(),
            install_guest_agent: true,
            port: 3128,
            labels: vec![("Team".into(), "Crawl Ops".into())],
            options: "{}".into(),
            credentials: None,
        }
    }

    fn config() -> Config {
        serde_json::from_value(
            json!({"project": "crawl-proxies", "zones": ["europe-west1-b"], "spot": true}),
        )
        .unwrap()
    }

    #[test]
    fn the_insert_body_carries_identity_cloud_init_and_labels() {
        let body = insert_body(&config(), &spec(), "europe-west1-b", true).unwrap();
        assert_eq!(
            body["machineType"],
            "zones/europe-west1-b/machineTypes/e2-medium"
        );
        assert_eq!(body["labels"][MANAGED_LABEL], "true");
        assert_eq!(body["labels"]["team"], "crawl-ops");
        assert_eq!(body["metadata"]["items"][2]["key"], "user-data");
        assert_eq!(
            body["metadata"]["items"][2]["value"],
            "#cloud-config\npackages: [squid]\n"
        );
        // The managed squid: a startup script writing squid.conf for the spec's port.
        let startup = &body["metadata"]["items"][3];
        assert_eq!(startup["key"], STARTUP_SCRIPT_ITEM);
        let script = startup["value"].as_str().unwrap();
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(
            script.contains("\nhttp_port 3128\n")
                && script.contains("visible_hostname px-0123abcd")
        );
        let unmanaged = insert_body(&config(), &spec(), "europe-west1-b", false).unwrap();
        assert_eq!(unmanaged["metadata"]["items"].as_array().unwrap().len(), 3);
        assert_eq!(body["scheduling"]["provisioningModel"], "SPOT");
        assert_eq!(
            body["networkInterfaces"][0]["accessConfigs"][0]["type"],
            "ONE_TO_ONE_NAT"
        );
        // Read back, the owner is whole (the label alone would have lost "Prod/Operator").
        let mut vm = body.clone();
        vm["status"] = json!("RUNNING");
        vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = json!("203.0.113.9");
        vm["creationTimestamp"] = json!("2026-11-30T11:22:33.123-08:00");
        let instance = instance("europe-west1-b", &vm);
        assert_eq!(instance.provider_id, "europe-west1-b/px-0123abcd");
        assert_eq!(instance.state, InstanceState::Running);
        assert_eq!(instance.address.as_deref(), Some("203.0.113.9"));
        assert_eq!(instance.owner.unwrap().operator_id, "Prod/Operator");
        assert_eq!(instance.created_at, Some(1_796_066_553));
    }

    #[test]
    fn create_searches_the_chosen_zone_first_then_every_other() {
        let zones: Vec<String> = ["z2", "z1", "z3"].map(String::from).to_vec();
        let cases: [(&str, &[&str]); 3] = [
            ("z2", &["z2", "z1", "z3"]),
            ("z1", &["z1", "z2", "z3"]),
            ("z3", &["z3", "z2", "z1"]),
        ];
        for (chosen, want) in cases {
            assert_eq!(search_order(&zones, chosen), want, "chosen {chosen}");
        }
        let one = vec!["z1".to_string()];
        assert_eq!(search_order(&one, "z1"), ["z1"]);
    }

    #[test]
    fn a_zone_that_cannot_be_searched_makes_create_wait_not_insert_elsewhere() {
        let cases = [
            (transient("HTTP 503", Some(1000)), Some(1000)),
            (transient("connection refused", None), None),
            (ProviderError::Unauthorized("HTTP 403".into()), Some(30_000)),
            (ProviderError::Permanent("HTTP 400".into()), Some(30_000)),
            (ProviderError::Quota("HTTP 429".into()), Some(30_000)),
            (ProviderError::Denied("not granted".into()), Some(30_000)),
        ];
        for (error, after) in cases {
            match search_failed("z1", "px-1", error.clone()) {
                ProviderError::Transient(t) => {
                    assert_eq!(t.retry_after_ms, after, "{error:?}");
                    assert!(
                        t.message.starts_with(
                            "zone z1 could not be searched for an existing instance px-1"
                        ) && t
                            .message
                            .ends_with("not inserting one elsewhere until it answers"),
                        "{}",
                        t.message
                    );
                }
                other => panic!("{error:?} -> {other:?}"),
            }
        }
    }

    #[test]
    fn google_errors_map_by_reason() {
        let body = |code: u16, reason: &str| {
            json!({"error": {"code": code, "message": "m", "errors": [{"reason": reason}]}})
                .to_string()
                .into_bytes()
        };
        assert!(matches!(
            api_error("insert", 403, &body(403, "quotaExceeded")),
            ProviderError::Quota(_)
        ));
        assert!(matches!(
            api_error("get", 404, &body(404, "notFound")),
            ProviderError::NotFound(_)
        ));
        assert!(matches!(
            api_error("get", 401, &body(401, "required")),
            ProviderError::Unauthorized(_)
        ));
        assert!(matches!(
            api_error("get", 503, b"oops"),
            ProviderError::Transient(_)
        ));
        assert!(matches!(
            api_error("insert", 400, &body(400, "invalid")),
            ProviderError::Permanent(_)
        ));
        match api_error("insert", 403, &body(403, "quotaExceeded")) {
            ProviderError::Quota(m) => assert_eq!(m, "insert: HTTP 403 quotaExceeded: m"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_insert_operation_answers_for_its_vm_for_a_minute() {
        let op = |at: &str, code: Option<&str>| {
            let mut op = json!({"name": "operation-1", "operationType": "insert", "status": "DONE", "insertTime": at});
            if let Some(code) = code {
                op["error"] = json!({"errors": [{"code": code, "message": "it went wrong"}]});
            }
            op
        };
        let now = proxy_operator_sdk::time::unix_seconds("2026-12-01T10:00:30Z").unwrap();
        let failed =
            |code: &str| recent_failed_insert(&[op("2026-12-01T10:00:00Z", Some(code))], now);
        assert!(matches!(
            failed("QUOTA_EXCEEDED"),
            Some(ProviderError::Quota(_))
        ));
        assert!(matches!(
            failed("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
            Some(ProviderError::Quota(_))
        ));
        assert!(matches!(
            failed("PERMISSION_DENIED"),
            Some(ProviderError::Unauthorized(_))
        ));
        match failed("RESOURCE_NOT_FOUND") {
            Some(ProviderError::Permanent(m)) => assert_eq!(
                m,
                "the insert operation operation-1 failed: RESOURCE_NOT_FOUND: it went wrong"
            ),
            other => panic!("{other:?}"),
        }
        // A minute on, the insert is tried again; a later success or a running one says nothing.
        let later = now + FAILED_INSERT_ANSWERS_FOR_SECONDS + 1;
        assert!(
            recent_failed_insert(&[op("2026-12-01T10:00:00Z", Some("QUOTA_EXCEEDED"))], later)
                .is_none()
        );
        assert!(
            recent_failed_insert(
                &[
                    op("2026-12-01T10:00:00Z", Some("QUOTA_EXCEEDED")),
                    op("2026-12-01T10:00:20Z", None)
                ],
                now
            )
            .is_none()
        );
        let mut running = op("2026-12-01T10:00:00Z", Some("QUOTA_EXCEEDED"));
        running["status"] = json!("RUNNING");
        assert!(recent_failed_insert(&[running], now).is_none());
    }

    #[test]
    fn only_vms_proxy_operator_made_may_be_deleted() {
        assert_eq!(
            not_ours(&json!({"name": "px-1", "labels": {MANAGED_LABEL: "true"}})),
            None
        );
        for vm in [
            json!({"name": "victim"}),
            json!({"name": "victim", "labels": {"team": "web"}}),
            json!({"name": "victim", "labels": {MANAGED_LABEL: "false"}}),
        ] {
            let refusal = not_ours(&vm).expect("refused");
            assert!(refusal.contains("instance victim has no label proxy-operator-managed=true"));
        }
    }

    #[test]
    fn provider_ids_and_labels() {
        assert_eq!(
            parse_provider_id("europe-west1-b/px-1").unwrap(),
            ("europe-west1-b", "px-1")
        );
        assert!(parse_provider_id("px-1").is_err());
        assert_eq!(label_value("Prod/Operator"), "prod-operator");
    }
}
