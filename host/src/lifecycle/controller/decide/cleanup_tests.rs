//! The cleanup of a deleted Proxy's instance, as tables: delete, wait or abandon, and never
//! another Proxy's instance.

use std::time::Duration;

use rstest::rstest;

use super::tests::{instance, loaded, not_loaded, provider_error, proxy, unknown, with};
use super::*;
use crate::api::Phase;
use crate::provider::plugins::types::{Instance, InstanceState, Owner};

fn cleanup_summary(step: &CleanupStep) -> String {
    match step {
        CleanupStep::Abandon(note) => format!("abandon {}", note.reason),
        CleanupStep::LeaveRunning(note) => format!("leave {}", note.reason),
        CleanupStep::WaitForPlugin { .. } => "wait".into(),
        CleanupStep::Delete { recorded, deleting } => format!(
            "delete {} {}",
            recorded.as_deref().unwrap_or("by-uid"),
            if deleting.is_some() { "mark" } else { "marked" }
        ),
    }
}

#[rstest]
#[case::recorded_instance_is_deleted(
    Some(with(Some(Phase::Ready), Some("vm-1"), None)),
    false,
    loaded(),
    "delete vm-1 mark"
)]
#[case::none_recorded_is_found_by_uid(None, false, loaded(), "delete by-uid mark")]
#[case::already_deleting_is_not_marked_again(
    Some(with(Some(Phase::Deleting), Some("vm-1"), None)),
    false,
    loaded(),
    "delete vm-1 marked"
)]
#[case::skip_cleanup_leaves_it_running(
    Some(with(Some(Phase::Ready), Some("vm-1"), None)),
    true,
    loaded(),
    "leave Abandoned"
)]
#[case::plugin_not_loaded_waits(None, false, not_loaded(), "wait")]
#[case::unknown_provider_abandons(None, false, unknown(), "abandon Abandoned")]
fn deletion_deletes_waits_or_abandons(
    #[case] status: Option<ProxyStatus>,
    #[case] skip_cleanup: bool,
    #[case] lookup: ProviderLookup,
    #[case] expected: &str,
) {
    let mut p = proxy(1, status);
    if skip_cleanup {
        p.metadata.annotations =
            Some([(SKIP_CLEANUP_ANNOTATION.to_string(), "true".to_string())].into());
    }
    assert_eq!(cleanup_summary(&decide_cleanup(&p, &lookup)), expected);
}

#[test]
fn only_this_proxys_instances_are_deleted_by_uid() {
    let owned = |uid: &str, id: &str| Instance {
        provider_id: id.into(),
        owner: Some(Owner {
            namespace: "crawlers".into(),
            name: "egress-1".into(),
            uid: uid.into(),
            operator_id: "op".into(),
        }),
        ..instance(InstanceState::Running, None)
    };
    let instances = vec![
        owned("u-1", "a"),
        owned("u-2", "b"),
        instance(InstanceState::Running, None),
        owned("u-1", "c"),
    ];
    assert_eq!(owned_by(instances, "u-1"), ["a", "c"]);
}

#[test]
fn a_failed_delete_is_retried_slowly_when_permanent() {
    let (note, then) = delete_failed(
        "vm-1",
        &provider_error(ProviderError::Permanent("stuck".into())),
    );
    assert_eq!(note.reason, "DeleteFailed");
    assert_eq!(
        then,
        NextReconcile::Retry {
            message: "delete vm-1: stuck".into(),
            after: Some(Duration::from_secs(60))
        }
    );
}

#[test]
fn an_instance_listed_as_another_proxys_is_never_deleted() {
    let owner = |uid: &str| Owner {
        namespace: "crawlers".into(),
        name: "victim".into(),
        uid: uid.into(),
        operator_id: "op".into(),
    };
    let with_owner = |o: Option<Owner>| Instance {
        owner: o,
        ..instance(InstanceState::Running, None)
    };
    let p = proxy(1, None);
    let refused = refuse_foreign_delete(&p, &with_owner(Some(owner("u-victim")))).unwrap();
    assert_eq!(refused.reason, "DeleteRefused");
    assert!(
        refused.message.contains("crawlers/victim"),
        "{}",
        refused.message
    );
    assert_eq!(
        refuse_foreign_delete(&p, &with_owner(Some(owner("u-1")))),
        None
    );
    // A provider that reports no owner cannot be checked: the delete goes ahead.
    assert_eq!(refuse_foreign_delete(&p, &with_owner(None)), None);
}

#[test]
fn a_delete_that_finds_nothing_lets_the_proxy_go_and_says_why() {
    let note = delete_found_nothing(
        "europe-west1-b/victim",
        "gcp-eu",
        "instance victim has no label proxy-operator-managed=true",
    );
    assert_eq!(note.type_, EventType::Normal);
    assert_eq!(note.reason, "NothingDeleted");
    assert_eq!(
        note.message,
        "provider gcp-eu deleted nothing at europe-west1-b/victim: instance victim has no label proxy-operator-managed=true"
    );
}
