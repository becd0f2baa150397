//! What each check concludes from what the plugin answered (pure: the runner makes the calls).
//! `Ok(detail)` passes, `Err(detail)` fails; a detail says what was seen and, on failure, what
//! the contract in docs/plugin-authoring.md asks for.

use super::reasons::{HOST_ONLY_REASONS, is_check_reason};
use crate::provider::plugins::CallError;
use crate::provider::plugins::types::{CheckTarget, Instance, Owner, ProviderError};

pub type Verdict = Result<String, String>;

/// The error a call ended with, as the suite shows it.
fn describe_error(error: &CallError) -> String {
    match error.provider_error() {
        Some(e) => format!("{} ({e})", e.kind().replace('_', "-")),
        None => format!("the sandbox stopped the call: {error}"),
    }
}

/// A call that must succeed.
pub fn succeeded<T>(result: &Result<T, CallError>, what: &str) -> Verdict {
    match result {
        Ok(_) => Ok(what.to_string()),
        Err(e) => Err(format!("{what} failed: {}", describe_error(e))),
    }
}

/// A config the schema refuses must be refused by `validate-config` with `invalid-config`.
pub fn bad_config_refused(case: &str, validate: &Result<(), CallError>) -> Verdict {
    match validate {
        Ok(()) => Err(format!(
            "{case}: the schema refuses this config but validate-config accepts it; make them agree"
        )),
        Err(CallError::Provider {
            error: ProviderError::InvalidConfig(message),
            ..
        }) => Ok(format!("{case}: invalid-config ({message})")),
        Err(e) => Err(format!(
            "{case}: expected invalid-config, got {}",
            describe_error(e)
        )),
    }
}

/// `create` returned an instance with an id.
pub fn created(instance: &Instance) -> Verdict {
    if instance.provider_id.is_empty() {
        return Err("create returned an empty provider id".into());
    }
    Ok(format!(
        "provider id {}, state {:?}",
        instance.provider_id, instance.state
    ))
}

/// A second `create` with the same spec returns the same instance.
pub fn idempotent(first: &Instance, again: &Instance) -> Verdict {
    if first.provider_id == again.provider_id {
        Ok(format!("same provider id {}", again.provider_id))
    } else {
        Err(format!(
            "a second create of the same spec.name returned provider id {} (first {}); return the existing instance",
            again.provider_id, first.provider_id
        ))
    }
}

fn owner_differs(owner: &Option<Owner>, expected: &Owner) -> Option<String> {
    match owner {
        Some(o) if o == expected => None,
        Some(o) => Some(format!("owner {o:?}, expected {expected:?}")),
        None => Some(format!(
            "no owner; store spec.owner on the instance (labels, metadata) and return it, expected {expected:?}"
        )),
    }
}

/// `get` after `create` finds the same id and the owner of the spec.
pub fn got_same(id: &str, owner: &Owner, got: &Instance) -> Verdict {
    if got.provider_id != id {
        return Err(format!(
            "get({id}) returned provider id {}",
            got.provider_id
        ));
    }
    match owner_differs(&got.owner, owner) {
        None => Ok(format!(
            "provider id {id}, owner {}/{}",
            owner.namespace, owner.name
        )),
        Some(why) => Err(format!("get({id}): {why}")),
    }
}

/// `list` shows the instance with its owner.
pub fn listed(id: &str, owner: &Owner, list: &[Instance]) -> Verdict {
    let Some(found) = list.iter().find(|i| i.provider_id == id) else {
        return Err(format!(
            "{id} is not among the {} listed instances; list must return every instance with an owner",
            list.len()
        ));
    };
    match owner_differs(&found.owner, owner) {
        None => Ok(format!(
            "{id} listed with its owner ({} instances)",
            list.len()
        )),
        Some(why) => Err(format!("list: {id} has {why}")),
    }
}

/// `list` no longer shows a deleted instance.
pub fn not_listed(id: &str, list: &[Instance]) -> Verdict {
    if list.iter().any(|i| i.provider_id == id) {
        Err(format!("{id} is still listed after delete"))
    } else {
        Ok(format!("{id} gone ({} instances)", list.len()))
    }
}

/// `get` of a deleted instance answers `not-found` (the operator then knows it is gone).
pub fn not_found(id: &str, result: &Result<Instance, CallError>) -> Verdict {
    match result {
        Err(CallError::Provider {
            error: ProviderError::NotFound(message),
            ..
        }) => Ok(format!("not-found ({message})")),
        Ok(i) => Err(format!(
            "get({id}) still returns an instance in state {:?}",
            i.state
        )),
        Err(e) => Err(format!(
            "get({id}): expected not-found, got {}",
            describe_error(e)
        )),
    }
}

/// Every target has a documented reason, `Ok` exactly when it is ok.
pub fn reasons(targets: &[CheckTarget]) -> Verdict {
    if targets.is_empty() {
        return Err(
            "check returned no target; return one per thing the provider depends on".into(),
        );
    }
    let wrong: Vec<String> = targets
        .iter()
        .filter_map(|t| {
            if HOST_ONLY_REASONS.contains(&t.reason.as_str()) {
                Some(format!("{}: `{}` is the operator's own reason", t.target, t.reason))
            } else if !is_check_reason(&t.reason) {
                Some(format!(
                    "{}: `{}` is not a documented reason (docs/plugin-authoring.md, \"Check reasons\")",
                    t.target, t.reason
                ))
            } else if t.ok != (t.reason == "Ok") {
                Some(format!(
                    "{}: ok={} with reason `{}`; `Ok` is the reason of ok targets only",
                    t.target, t.ok, t.reason
                ))
            } else {
                None
            }
        })
        .collect();
    if wrong.is_empty() {
        let seen: Vec<&str> = targets.iter().map(|t| t.reason.as_str()).collect();
        Ok(format!(
            "{} targets, reasons {}",
            targets.len(),
            seen.join(", ")
        ))
    } else {
        Err(wrong.join("; "))
    }
}

/// Every target is ok: what the provider depends on is there (the lifecycle checks need it).
pub fn healthy(targets: &[CheckTarget]) -> Verdict {
    let failing: Vec<String> = targets
        .iter()
        .filter(|t| !t.ok)
        .map(|t| format!("{}: {} ({})", t.target, t.reason, t.message))
        .collect();
    if failing.is_empty() {
        let names: Vec<&str> = targets.iter().map(|t| t.target.as_str()).collect();
        Ok(names.join(", "))
    } else {
        Err(failing.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::plugins::types::InstanceState;

    fn owner(uid: &str) -> Owner {
        Owner {
            namespace: "ns".into(),
            name: "p".into(),
            uid: uid.into(),
            operator_id: "op".into(),
        }
    }

    fn instance(id: &str, owner: Option<Owner>) -> Instance {
        Instance {
            provider_id: id.into(),
            name: id.into(),
            state: InstanceState::Running,
            address: None,
            port: 3128,
            zone: None,
            created_at: None,
            owner,
            message: None,
        }
    }

    fn provider_error(error: ProviderError) -> CallError {
        CallError::Provider {
            provider: "p".into(),
            function: "get",
            error,
        }
    }

    fn target(ok: bool, reason: &str) -> CheckTarget {
        CheckTarget {
            target: "t".into(),
            ok,
            reason: reason.into(),
            message: String::new(),
            latency_ms: 0,
        }
    }

    #[rstest::rstest]
    #[case::ok_targets_say_ok(vec![target(true, "Ok"), target(false, "PoolInactive")], None)]
    #[case::no_targets(vec![], Some("no target"))]
    #[case::an_undocumented_reason(vec![target(false, "Broken")], Some("not a documented reason"))]
    #[case::the_hosts_reason(vec![target(false, "PluginError")], Some("the operator's own"))]
    #[case::ok_with_a_failure_reason(vec![target(true, "Unreachable")], Some("ok=true"))]
    #[case::failed_with_ok(vec![target(false, "Ok")], Some("ok=false"))]
    fn check_reasons(#[case] targets: Vec<CheckTarget>, #[case] failure: Option<&str>) {
        match (reasons(&targets), failure) {
            (Ok(_), None) => {}
            (Err(e), Some(expected)) => assert!(e.contains(expected), "{e}"),
            (other, expected) => panic!("{other:?}, expected failure {expected:?}"),
        }
    }

    #[rstest::rstest]
    #[case::same_id_and_owner(instance("a", Some(owner("u"))), None)]
    #[case::another_id(instance("b", Some(owner("u"))), Some("returned provider id b"))]
    #[case::no_owner(instance("a", None), Some("no owner"))]
    #[case::another_owner(instance("a", Some(owner("v"))), Some("expected"))]
    fn get_after_create(#[case] got: Instance, #[case] failure: Option<&str>) {
        match (got_same("a", &owner("u"), &got), failure) {
            (Ok(_), None) => {}
            (Err(e), Some(expected)) => assert!(e.contains(expected), "{e}"),
            (other, expected) => panic!("{other:?}, expected failure {expected:?}"),
        }
    }

    #[test]
    fn list_must_show_the_instance_with_its_owner_and_drop_it_after_delete() {
        let list = vec![
            instance("x", Some(owner("o"))),
            instance("a", Some(owner("u"))),
        ];
        assert!(listed("a", &owner("u"), &list).is_ok());
        assert!(
            listed("a", &owner("w"), &list)
                .unwrap_err()
                .contains("list: a has owner")
        );
        assert!(
            listed("z", &owner("u"), &list)
                .unwrap_err()
                .contains("not among the 2")
        );
        assert!(not_listed("z", &list).is_ok());
        assert!(not_listed("a", &list).is_err());
    }

    #[test]
    fn idempotent_create_returns_the_same_id() {
        let a = instance("a", None);
        assert!(idempotent(&a, &a.clone()).is_ok());
        assert!(
            idempotent(&a, &instance("b", None))
                .unwrap_err()
                .contains("return the existing")
        );
        assert!(created(&instance("", None)).is_err());
    }

    #[rstest::rstest]
    #[case::not_found(Err(provider_error(ProviderError::NotFound("gone".into()))), None)]
    #[case::still_there(Ok(instance("a", None)), Some("still returns"))]
    #[case::permanent(Err(provider_error(ProviderError::Permanent("x".into()))), Some("got permanent"))]
    #[case::sandbox(Err(CallError::Trap { plugin: "p".into(), function: "get", reason: "boom".into() }), Some("sandbox stopped"))]
    fn get_after_delete(
        #[case] result: Result<Instance, CallError>,
        #[case] failure: Option<&str>,
    ) {
        match (not_found("a", &result), failure) {
            (Ok(_), None) => {}
            (Err(e), Some(expected)) => assert!(e.contains(expected), "{e}"),
            (other, expected) => panic!("{other:?}, expected failure {expected:?}"),
        }
    }

    #[rstest::rstest]
    #[case::invalid_config(Err(provider_error(ProviderError::InvalidConfig("config.x: bad".into()))), None)]
    #[case::accepted(Ok(()), Some("make them agree"))]
    #[case::wrong_variant(Err(provider_error(ProviderError::Permanent("x".into()))), Some("expected invalid-config, got permanent"))]
    fn bad_configs_are_invalid_config(
        #[case] result: Result<(), CallError>,
        #[case] failure: Option<&str>,
    ) {
        match (bad_config_refused("missing-x", &result), failure) {
            (Ok(_), None) => {}
            (Err(e), Some(expected)) => assert!(e.contains(expected), "{e}"),
            (other, expected) => panic!("{other:?}, expected failure {expected:?}"),
        }
    }

    #[test]
    fn healthy_names_the_failing_targets() {
        assert!(healthy(&[target(true, "Ok")]).is_ok());
        let e = healthy(&[target(false, "Unreachable")]).unwrap_err();
        assert!(e.contains("t: Unreachable"), "{e}");
    }
}
