//! Every branch of the reconciler's decisions, as tables.

use std::time::Duration;

use rstest::rstest;

use super::*;
use crate::api::conditions::{Type, status_of};
use crate::api::{Phase, PlacementRecord, Proxy, ProxyStatus};
use crate::provider::plugins::types::{Instance, InstanceState};

pub(super) fn proxy(generation: i64, status: Option<ProxyStatus>) -> Proxy {
    let mut proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": "egress-1", "namespace": "crawlers", "uid": "u-1", "generation": generation},
        "spec": {"provider": "kvm-home"},
    }))
    .unwrap();
    proxy.status = status;
    proxy
}

pub(super) fn loaded() -> ProviderLookup {
    ProviderLookup::Loaded {
        name: "kvm-home".into(),
    }
}

pub(super) fn not_loaded() -> ProviderLookup {
    ProviderLookup::NotLoaded {
        provider_type: "kvm".into(),
        reason: "removed from the ConfigMap".into(),
    }
}

pub(super) fn unknown() -> ProviderLookup {
    ProviderLookup::Unknown {
        configured: vec!["b".into(), "a".into()],
    }
}

pub(super) fn with(
    phase: Option<Phase>,
    provider_id: Option<&str>,
    observed: Option<i64>,
) -> ProxyStatus {
    ProxyStatus {
        phase,
        provider_id: provider_id.map(String::from),
        observed_generation: observed,
        ..Default::default()
    }
}

pub(super) fn instance(state: InstanceState, address: Option<&str>) -> Instance {
    Instance {
        provider_id: "vm-1".into(),
        name: "px-1".into(),
        state,
        address: address.map(String::from),
        port: 3128,
        zone: Some("home".into()),
        created_at: None,
        owner: None,
        message: None,
    }
}

/// What a first step comes to, in a few words, for the table.
fn summary(step: &Decision) -> String {
    match step {
        Decision::Done(e) => format!("done {:?} {:?}", e.status.phase, e.next),
        Decision::Create { name, zone, status } => {
            format!("create {name} in {zone:?} {:?}", status.phase)
        }
        Decision::Get {
            provider_id,
            status,
        } => format!("get {provider_id} {:?}", status.phase),
    }
}

#[rstest]
#[case::new_proxy_is_created(None, loaded(), "create px-1 in None Some(Pending)")]
#[case::recorded_instance_is_looked_at(
    Some(with(Some(Phase::Provisioning), Some("vm-1"), Some(1))),
    loaded(),
    "get vm-1 Some(Provisioning)"
)]
#[case::failed_for_this_generation_waits(
    Some(with(Some(Phase::Failed), None, Some(2))),
    loaded(),
    "done Some(Failed) AwaitChange"
)]
#[case::failed_for_an_older_generation_tries_again(
    Some(with(Some(Phase::Failed), None, Some(1))),
    loaded(),
    "create px-1 in None Some(Failed)"
)]
#[case::plugin_not_loaded_waits(None, not_loaded(), "done Some(Pending) Requeue(300s)")]
#[case::unknown_provider_waits_for_the_config(None, unknown(), "done Some(Pending) Requeue(300s)")]
fn the_first_step_follows_the_lifecycle(
    #[case] status: Option<ProxyStatus>,
    #[case] lookup: ProviderLookup,
    #[case] expected: &str,
) {
    let step = decide(&proxy(2, status), &lookup, "px-1");
    assert_eq!(summary(&step), expected);
}

fn record(provider: &str, zone: Option<&str>) -> PlacementRecord {
    PlacementRecord {
        provider: provider.into(),
        zone: zone.map(String::from),
    }
}

fn placed(zone: Option<&str>) -> Proxy {
    let mut p = proxy(1, None);
    p.spec.placement = Some(crate::api::Placement {
        zone: zone.map(String::from),
        ..Default::default()
    });
    p
}

/// What a create asks for: the spec's zone the first time; on a retry, what the first try
/// recorded (so a changed providers config cannot move it).
#[rstest]
#[case::first_try_without_a_zone(placed(None), None, record("kvm-home", None))]
#[case::first_try_in_the_spec_zone(placed(Some("z1")), None, record("kvm-home", Some("z1")))]
#[case::retry_keeps_the_recorded_zone(
    placed(None),
    Some(record("kvm-home", Some("z1"))),
    record("kvm-home", Some("z1"))
)]
#[case::retry_without_a_recorded_zone_asks_the_spec_again(
    placed(Some("z1")),
    Some(record("kvm-home", None)),
    record("kvm-home", Some("z1"))
)]
#[case::retry_of_a_provider_choice_stays_a_provider_choice(
    placed(None),
    Some(record("kvm-home", None)),
    record("kvm-home", None)
)]
#[case::a_record_of_another_provider_is_decided_afresh(
    placed(Some("z1")),
    Some(record("gcp-eu", Some("europe-west1-b"))),
    record("kvm-home", Some("z1"))
)]
fn a_create_asks_for_the_recorded_placement(
    #[case] proxy: Proxy,
    #[case] recorded: Option<PlacementRecord>,
    #[case] expected: PlacementRecord,
) {
    assert_eq!(placement(&proxy, recorded.as_ref()), expected);
}

#[test]
fn the_placement_is_recorded_in_the_status_the_create_writes_first() {
    let mut retried = placed(None);
    retried.status = Some(ProxyStatus {
        phase: Some(Phase::Pending),
        placement: Some(record("kvm-home", Some("z1"))),
        ..Default::default()
    });
    assert!(asked_before(&retried));
    let Decision::Create { zone, status, .. } = decide(&retried, &loaded(), "px-1") else {
        panic!("a retried create")
    };
    assert_eq!(zone.as_deref(), Some("z1"));
    assert_eq!(status.placement, Some(record("kvm-home", Some("z1"))));
    assert_eq!(
        Some(status),
        retried.status,
        "nothing new to write before the retry"
    );

    let first = placed(Some("z2"));
    assert!(!asked_before(&first));
    let Decision::Create { zone, status, .. } = decide(&first, &loaded(), "px-1") else {
        panic!("a first create")
    };
    assert_eq!(zone.as_deref(), Some("z2"));
    assert_eq!(status.placement, Some(record("kvm-home", Some("z2"))));

    // Once the instance is recorded, the placement is history, not a create to come.
    let mut made = retried.clone();
    made.status.as_mut().unwrap().provider_id = Some("vm-1".into());
    assert!(!asked_before(&made));
}

#[test]
fn an_unknown_provider_names_what_is_configured_and_is_said_once() {
    let Decision::Done(first) = decide(&proxy(1, None), &unknown(), "px-1") else {
        panic!("no provider call for an unknown provider")
    };
    let message = first.status.last_error.clone().unwrap();
    assert!(message.contains("(configured: a, b)"), "{message}");
    assert_eq!(first.events.len(), 1);
    assert_eq!(first.events[0].reason, "UnknownProvider");
    assert_eq!(
        status_of(&first.status.conditions, Type::Ready),
        Some(false)
    );
    // The same answer again: no second event.
    let Decision::Done(again) = decide(&proxy(1, Some(first.status)), &unknown(), "px-1") else {
        panic!()
    };
    assert!(again.events.is_empty());
}

#[test]
fn a_plugin_that_is_not_loaded_keeps_an_existing_phase() {
    let status = with(Some(Phase::Ready), Some("vm-1"), Some(1));
    let Decision::Done(effects) = decide(&proxy(1, Some(status)), &not_loaded(), "px-1") else {
        panic!()
    };
    assert_eq!(effects.status.phase, Some(Phase::Ready));
    assert!(effects.status.last_error.unwrap().contains("is not loaded"));
    assert_eq!(effects.events[0].reason, "PluginNotLoaded");
}

#[rstest]
#[case::running_with_an_address_is_ready(
    InstanceState::Running,
    Some("10.0.0.5"),
    Some(Phase::Ready),
    RESYNC,
    Some(true)
)]
#[case::running_without_an_address_waits(
    InstanceState::Running,
    None,
    Some(Phase::Provisioning),
    POLL_PROVISIONING,
    Some(false)
)]
#[case::pending_waits(
    InstanceState::Pending,
    Some("10.0.0.5"),
    Some(Phase::Provisioning),
    POLL_PROVISIONING,
    Some(false)
)]
fn what_the_provider_says_becomes_the_status(
    #[case] state: InstanceState,
    #[case] address: Option<&str>,
    #[case] phase: Option<Phase>,
    #[case] requeue: Duration,
    #[case] provisioned: Option<bool>,
) {
    let effects = observed(
        &proxy(3, None),
        ProxyStatus::default(),
        &instance(state, address),
        true,
    );
    assert_eq!(effects.status.phase, phase);
    assert_eq!(effects.next, NextReconcile::Requeue(requeue));
    assert_eq!(
        status_of(&effects.status.conditions, Type::Provisioned),
        provisioned
    );
    assert_eq!(effects.status.provider_id.as_deref(), Some("vm-1"));
    assert_eq!(effects.status.observed_generation, Some(3));
}

#[test]
fn a_created_instance_is_announced_then_provisioned_once() {
    let effects = created(
        &proxy(1, None),
        ProxyStatus::default(),
        "kvm-home",
        &instance(InstanceState::Running, Some("10.0.0.5")),
        true,
    );
    let reasons: Vec<_> = effects.events.iter().map(|n| n.reason).collect();
    assert_eq!(reasons, ["Created", "Provisioned"]);
    // Already Ready: no second Provisioned event.
    let again = observed(
        &proxy(1, Some(effects.status)),
        with(Some(Phase::Ready), Some("vm-1"), Some(1)),
        &instance(InstanceState::Running, Some("10.0.0.5")),
        true,
    );
    assert!(again.events.is_empty());
}

pub(super) fn provider_error(error: ProviderError) -> CallError {
    CallError::Provider {
        provider: "kvm-home".into(),
        function: "create",
        error,
    }
}

#[rstest]
#[case::transient_retries_when_the_provider_says(
    ProviderError::Transient { message: "busy".into(), retry_after: Some(Duration::from_secs(7)) },
    None,
    NextReconcile::Retry { message: "kvm-home Create: busy".into(), after: Some(Duration::from_secs(7)) }
)]
#[case::quota_retries_in_a_minute(
    ProviderError::Quota("no ports".into()),
    None,
    NextReconcile::Retry { message: "kvm-home Create: quota: no ports".into(), after: Some(Duration::from_secs(60)) }
)]
#[case::a_provider_error_fails_until_the_spec_changes(
    ProviderError::Permanent("no such image".into()),
    Some(Phase::Failed),
    NextReconcile::AwaitChange
)]
#[case::invalid_provider_config_fails_and_is_rechecked(
    ProviderError::InvalidConfig("zone".into()),
    Some(Phase::Failed),
    NextReconcile::Retry { message: "kvm-home Create: zone".into(), after: Some(RECHECK_OUTSIDE_SPEC) }
)]
#[case::unauthorized_fails_and_is_rechecked(
    ProviderError::Unauthorized("key".into()),
    Some(Phase::Failed),
    NextReconcile::Retry { message: "kvm-home Create: key".into(), after: Some(RECHECK_OUTSIDE_SPEC) }
)]
#[case::denied_fails_and_is_rechecked(
    ProviderError::Denied("grant".into()),
    Some(Phase::Failed),
    NextReconcile::Retry { message: "kvm-home Create: grant".into(), after: Some(RECHECK_OUTSIDE_SPEC) }
)]
fn a_failed_call_is_retried_or_failed(
    #[case] error: ProviderError,
    #[case] phase: Option<Phase>,
    #[case] next: NextReconcile,
) {
    let effects = call_failed(
        &proxy(4, None),
        ProxyStatus::default(),
        "kvm-home",
        "Create",
        &provider_error(error),
    );
    assert_eq!(effects.status.phase, phase);
    assert_eq!(effects.next, next);
    assert!(effects.status.last_error.unwrap().starts_with("Create"));
    if phase == Some(Phase::Failed) {
        assert_eq!(effects.status.observed_generation, Some(4));
        assert_eq!(effects.events.len(), 1);
    }
}

#[test]
fn a_sandbox_failure_is_retried() {
    let error = CallError::Timeout {
        plugin: "kvm".into(),
        function: "create",
        timeout: Duration::from_secs(60),
    };
    assert!(matches!(
        classify(&error),
        Failure::Retry { after: None, .. }
    ));
}

/// Issue #36: a plugin over its own memory limit was retried three times as transient.
#[test]
fn out_of_its_own_memory_or_a_host_panic_is_not_retried() {
    for error in [
        CallError::OutOfMemory {
            plugin: "test".into(),
            function: "create",
            limit: 128 << 20,
        },
        CallError::HostPanic {
            plugin: "test".into(),
            function: "create",
            reason: "index out of bounds".into(),
        },
    ] {
        assert!(
            matches!(
                classify(&error),
                Failure::Permanent {
                    reason: Reason::ProviderError,
                    ..
                }
            ),
            "{error}"
        );
    }
    let contention = CallError::MemoryTotal {
        plugin: "test".into(),
        function: "create",
        total: 256 << 20,
    };
    assert!(matches!(classify(&contention), Failure::Retry { .. }));
}

#[rstest]
#[case::recreated_when_asked(
    true,
    Some(Phase::Pending),
    None,
    NextReconcile::Requeue(Duration::from_millis(100))
)]
#[case::failed_otherwise(false, Some(Phase::Failed), Some("vm-1"), NextReconcile::AwaitChange)]
fn a_lost_instance_is_recreated_only_when_the_spec_asks(
    #[case] recreate: bool,
    #[case] phase: Option<Phase>,
    #[case] provider_id: Option<&str>,
    #[case] next: NextReconcile,
) {
    let mut p = proxy(1, None);
    p.spec.recreate_on_loss = recreate;
    let mut status = with(Some(Phase::Ready), Some("vm-1"), Some(1));
    status.placement = Some(record("kvm-home", Some("home")));
    let effects = lost(&p, status, "kvm-home", "vm-1", "gone");
    assert_eq!(effects.status.phase, phase);
    // A new instance is placed afresh; a failed Proxy keeps the record of what it asked for.
    assert_eq!(effects.status.placement.is_none(), recreate);
    assert_eq!(effects.status.provider_id.as_deref(), provider_id);
    assert_eq!(effects.status.address, None);
    assert_eq!(effects.next, next);
    assert_eq!(effects.events[0].reason, "InstanceLost");
}

/// A `quota` (or `transient`) answer to a create is not only `lastError`: the conditions say it,
/// and one event per new answer (not per retry of the same answer).
#[test]
fn a_retried_create_says_why_in_a_condition_and_one_event() {
    let quota = provider_error(ProviderError::Quota(
        "CPUS in europe-west1: 24 of 24".into(),
    ));
    let first = call_failed(
        &proxy(2, None),
        ProxyStatus::default(),
        "gcp-eu",
        "Create",
        &quota,
    );
    let condition = |status: &ProxyStatus, type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (status, reason, message) = condition(&first.status, "Provisioned").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Quota"));
    assert_eq!(
        message,
        "Create at provider gcp-eu: quota: CPUS in europe-west1: 24 of 24; retrying"
    );
    assert_eq!(condition(&first.status, "Ready").unwrap().1, "Quota");
    assert_eq!(first.events.len(), 1);
    assert_eq!(first.events[0].reason, "Quota");
    assert_eq!(first.events[0].type_, EventType::Warning);
    assert_eq!(
        first.status.observed_generation, None,
        "the spec is not acted on yet"
    );

    // The same answer at the next retry: no second event.
    let again = call_failed(
        &proxy(2, None),
        first.status.clone(),
        "gcp-eu",
        "Create",
        &quota,
    );
    assert!(again.events.is_empty());
    // Another answer: its own event, reason Retrying.
    let busy = provider_error(ProviderError::Transient {
        message: "busy".into(),
        retry_after: None,
    });
    let other = call_failed(&proxy(2, None), again.status, "gcp-eu", "Create", &busy);
    assert_eq!(other.events[0].reason, "Retrying");
    // A failed `get` of a running instance leaves its conditions alone.
    let running = with(Some(Phase::Ready), Some("vm-1"), Some(2));
    let got = call_failed(
        &proxy(2, Some(running.clone())),
        running.clone(),
        "gcp-eu",
        "Get",
        &busy,
    );
    assert_eq!(got.status.conditions, running.conditions);
}

/// A Proxy that failed for a reason outside its spec (a credential, a grant, the provider's
/// config) is tried again without a spec edit; one that failed for its spec waits for an edit.
#[rstest]
#[case::unauthorized(ProviderError::Unauthorized("the SSH key was refused".into()), true)]
#[case::denied(ProviderError::Denied("not in grants.http.allow".into()), true)]
#[case::invalid_provider_config(ProviderError::InvalidConfig("config.hosts: empty".into()), true)]
#[case::spec_problem(ProviderError::Permanent("no zone zone-x".into()), false)]
fn a_failure_from_outside_the_spec_is_tried_again(
    #[case] error: ProviderError,
    #[case] tried_again: bool,
) {
    let failed = call_failed(
        &proxy(3, None),
        ProxyStatus::default(),
        "kvm-home",
        "Create",
        &provider_error(error.clone()),
    );
    assert_eq!(failed.status.phase, Some(Phase::Failed));
    let step = decide(
        &proxy(3, Some(failed.status.clone())),
        &ProviderLookup::Loaded {
            name: "kvm-home".into(),
        },
        "px-1",
    );
    assert_eq!(
        matches!(step, Decision::Create { .. }),
        tried_again,
        "{step:?}"
    );
    // The same answer again: the status stays, no second event.
    let again = call_failed(
        &proxy(3, None),
        failed.status.clone(),
        "kvm-home",
        "Create",
        &provider_error(error),
    );
    assert_eq!(again.status, failed.status);
    assert!(again.events.is_empty());
}
