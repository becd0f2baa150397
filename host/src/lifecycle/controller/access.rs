//! The Proxy controller's side of provider access: a Proxy its instance's `access` refuses is
//! never created (the guarantee where the admission policy is missing or was changed), and an
//! existing one whose namespace lost its access is told so by a condition, never deleted.

use kube::ResourceExt;

use super::decide::{Effects, NextReconcile, ProviderLookup, ProxyEvent, RECHECK_OUTSIDE_SPEC};
use crate::api::conditions::{self, Reason, Type};
use crate::api::{Phase, Proxy, ProxyStatus};
use crate::provider::access::{self, Refusal};
use crate::provider::providers::Providers;

/// Whether the Proxy's instance, when loaded, refuses it (reads the namespace's labels if a
/// selector needs them).
pub async fn refusal(
    client: &kube::Client,
    providers: &Providers,
    proxy: &Proxy,
    found: &ProviderLookup,
) -> Result<Option<Refusal>, kube::Error> {
    if !matches!(found, ProviderLookup::Loaded { .. }) {
        return Ok(None);
    }
    let rules = providers.access(&proxy.spec.provider);
    let namespace = proxy.namespace().unwrap_or_default();
    let labels =
        crate::lifecycle::access::labels_for(client, &namespace, std::iter::once(rules)).await?;
    Ok(access::check(
        rules,
        &namespace,
        &labels,
        "spec.provider",
        "spec.",
        &proxy.spec,
    )
    .err())
}

/// Instead of a create: `Pending`, `Provisioned`/`Ready`/`AccessAllowed` false with reason
/// `AccessDenied` and the refusal's message, an event when it is new; looked at again slowly
/// (a providers-config change looks at once).
pub fn refused_create(proxy: &Proxy, refusal: &Refusal) -> Effects {
    let generation = proxy.metadata.generation;
    let mut status = proxy.status.clone().unwrap_or_default();
    let message = refusal.to_string();
    let events = new_refusal(&status, &message);
    status.phase = Some(Phase::Pending);
    status.last_error = Some(message.clone());
    status.observed_generation = generation;
    conditions::not_provisioned(
        &mut status.conditions,
        Reason::AccessDenied,
        &message,
        generation,
    );
    set_denied(&mut status, &message, generation);
    Effects {
        status,
        events,
        next: NextReconcile::Requeue(RECHECK_OUTSIDE_SPEC),
    }
}

/// On any other decision: the `AccessAllowed` condition while the instance refuses the Proxy
/// (it keeps running: a refusal new to an existing Proxy is never a deletion), gone once it
/// allows it again; and it is looked at again no later than a refused one.
pub fn mark(proxy: &Proxy, effects: &mut Effects, refusal: Option<&Refusal>) {
    match refusal {
        Some(refusal) => {
            let message = format!(
                "{refusal}; the proxy keeps running, but no new Proxy of this spec is made here"
            );
            let events = new_refusal(&effects.status, &message);
            effects.events.extend(events);
            set_denied(&mut effects.status, &message, proxy.metadata.generation);
            if !matches!(effects.next, NextReconcile::Requeue(after) if after <= RECHECK_OUTSIDE_SPEC)
                && !matches!(effects.next, NextReconcile::Retry { .. })
            {
                effects.next = NextReconcile::Requeue(RECHECK_OUTSIDE_SPEC);
            }
        }
        None => effects
            .status
            .conditions
            .retain(|c| c.type_ != Type::AccessAllowed.as_str()),
    }
}

fn set_denied(status: &mut ProxyStatus, message: &str, generation: Option<i64>) {
    conditions::set(
        &mut status.conditions,
        Type::AccessAllowed,
        false,
        Reason::AccessDenied,
        message,
        generation,
    );
}

/// A warning event when the refusal is not the one the status already says.
fn new_refusal(status: &ProxyStatus, message: &str) -> Vec<ProxyEvent> {
    let said = status
        .conditions
        .iter()
        .any(|c| c.type_ == Type::AccessAllowed.as_str() && c.message == message);
    if said {
        Vec::new()
    } else {
        vec![ProxyEvent::warning("AccessDenied", message.to_string())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(status: Option<serde_json::Value>) -> Proxy {
        let mut value = serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "team-b", "generation": 1},
            "spec": {"provider": "kvm"},
        });
        if let Some(status) = status {
            value["status"] = status;
        }
        serde_json::from_value(value).unwrap()
    }

    fn refusal() -> Refusal {
        Refusal {
            field: "spec.provider".into(),
            rule: "namespace `team-b` may not use provider instance `kvm`".into(),
            fix: "ask the platform team".into(),
        }
    }

    fn condition<'a>(status: &'a ProxyStatus, type_: &str) -> Option<(&'a str, &'a str)> {
        let c = status.conditions.iter().find(|c| c.type_ == type_)?;
        Some((c.status.as_str(), c.reason.as_str()))
    }

    #[test]
    fn a_refused_create_says_why_once() {
        let first = refused_create(&proxy(None), &refusal());
        assert_eq!(first.status.phase, Some(Phase::Pending));
        for type_ in ["Provisioned", "Ready", "AccessAllowed"] {
            assert_eq!(
                condition(&first.status, type_),
                Some(("False", "AccessDenied")),
                "{type_}"
            );
        }
        assert_eq!(
            first.status.last_error.as_deref(),
            Some(
                "spec.provider: namespace `team-b` may not use provider instance `kvm`; ask the platform team"
            )
        );
        assert_eq!(first.events.len(), 1);
        assert_eq!(first.events[0].reason, "AccessDenied");
        let status = serde_json::to_value(&first.status).unwrap();
        let again = refused_create(&proxy(Some(status)), &refusal());
        assert!(again.events.is_empty(), "said once: {:?}", again.events);
    }

    #[test]
    fn an_existing_proxy_is_marked_never_stopped_and_unmarked_when_allowed() {
        let running = serde_json::json!({"phase": "Ready", "providerID": "px-1", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Healthy", "message": "ok",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        let proxy = proxy(Some(running));
        let mut effects = Effects {
            status: proxy.status.clone().unwrap(),
            events: Vec::new(),
            next: NextReconcile::AwaitChange,
        };
        mark(&proxy, &mut effects, Some(&refusal()));
        assert_eq!(effects.status.phase, Some(Phase::Ready));
        assert_eq!(
            condition(&effects.status, "Ready"),
            Some(("True", "Healthy"))
        );
        assert_eq!(
            condition(&effects.status, "AccessAllowed"),
            Some(("False", "AccessDenied"))
        );
        assert_eq!(effects.events.len(), 1);
        assert_eq!(effects.next, NextReconcile::Requeue(RECHECK_OUTSIDE_SPEC));
        mark(&proxy, &mut effects, None);
        assert_eq!(condition(&effects.status, "AccessAllowed"), None);
    }
}
