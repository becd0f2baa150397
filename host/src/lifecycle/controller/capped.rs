//! A Proxy applied directly (not by a pool) and its provider instance's cap
//! (`crate::lifecycle::caps`): it is provisioned only while fewer Proxies than the cap go before
//! it; otherwise it stays `Pending` with `CapReached` and is looked at again until there is
//! room. A pool's members are held to the cap by their pool, so they pass.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::decide::{self, Effects, NextReconcile, ProxyEvent};
use crate::api::conditions::{self, BELOW_CAP, CAP_REACHED, PROVIDER_CAP_REACHED, set_named};
use crate::api::{Phase, Proxy, ProxyStatus};
use crate::lifecycle::caps::{self, Queued};
use crate::provider::limits::ProxyCap;
use crate::provider::plugins::ProviderInstance;

/// How often a Proxy held by a cap looks for room again: other Proxies going away wake no
/// reconcile of this one (a raised cap does, as every providers config change).
pub const CAP_RECHECK: Duration = Duration::from_secs(10);

/// The hold, if the Proxy must wait for room; otherwise `status` (what the create writes) says
/// `CapReached` is over if it said so.
pub(super) async fn hold(
    cache: &Store<Proxy>,
    provider: &ProviderInstance,
    proxy: &Proxy,
    status: &mut ProxyStatus,
) -> Option<Effects> {
    // Asked before: its create may be under way, and it counts already.
    if decide::asked_before(proxy) || caps::made_by_a_pool(proxy) {
        return None;
    }
    let cap = provider.cap()?;
    if cache.wait_until_ready().await.is_err() {
        tracing::warn!("the cache of Proxies is gone; not holding to the cap");
        return None;
    }
    let uid = proxy.uid();
    let others: Vec<Queued> = cache
        .state()
        .iter()
        .filter(|p| caps::counts(p, provider.name()) && p.uid() != uid)
        .map(|p| Queued::of(p))
        .collect();
    let ahead = caps::ahead_of(&Queued::of(proxy), &others);
    if ahead >= cap.proxies {
        return Some(held(proxy, provider.name(), &cap, ahead));
    }
    if status_is(status, "True") {
        let message = format!(
            "provider instance {} has room: {ahead} of its {} Proxies go before this one",
            provider.name(),
            cap.proxies
        );
        let generation = proxy.metadata.generation;
        set_named(
            &mut status.conditions,
            CAP_REACHED,
            false,
            BELOW_CAP,
            &message,
            generation,
        );
    }
    None
}

fn status_is(status: &ProxyStatus, want: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CAP_REACHED && c.status == want)
}

/// A Proxy held by the cap: `Pending`, not provisioned, `CapReached` naming the instance and
/// the figure; a Warning Event when it starts waiting.
pub fn held(proxy: &Proxy, instance: &str, cap: &ProxyCap, ahead: usize) -> Effects {
    let generation = proxy.metadata.generation;
    let mut status = proxy.status.clone().unwrap_or_default();
    let message = format!(
        "provider instance {instance} is at its cap of {} Proxies ({}); {ahead} go before this one, so it is not provisioned until one goes or the cap is raised",
        cap.proxies, cap.source
    );
    let mut events = Vec::new();
    if !status_is(&status, "True") {
        events.push(ProxyEvent {
            type_: kube::runtime::events::EventType::Warning,
            reason: CAP_REACHED,
            message: message.clone(),
        });
    }
    status.phase = Some(Phase::Pending);
    status.observed_generation = generation;
    set_named(
        &mut status.conditions,
        CAP_REACHED,
        true,
        PROVIDER_CAP_REACHED,
        &message,
        generation,
    );
    for type_ in [conditions::Type::Provisioned, conditions::Type::Ready] {
        conditions::set(
            &mut status.conditions,
            type_,
            false,
            PROVIDER_CAP_REACHED,
            &message,
            generation,
        );
    }
    Effects {
        status,
        events,
        next: NextReconcile::Requeue(CAP_RECHECK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_proxy_is_pending_says_why_and_warns_once() {
        let proxy: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "team-a", "generation": 1},
            "spec": {"provider": "gcp-eu"},
        }))
        .unwrap();
        let cap = ProxyCap {
            proxies: 1,
            source: "limits.maxProxies".into(),
        };
        let first = held(&proxy, "gcp-eu", &cap, 1);
        assert_eq!(first.status.phase, Some(Phase::Pending));
        assert_eq!(first.next, NextReconcile::Requeue(CAP_RECHECK));
        assert_eq!(first.events.len(), 1);
        assert_eq!(first.events[0].reason, "CapReached");
        let message = &first.events[0].message;
        assert!(
            message.starts_with(
                "provider instance gcp-eu is at its cap of 1 Proxies (limits.maxProxies); 1 go before this one"
            ),
            "{message}"
        );
        let ready = conditions::status_of(&first.status.conditions, conditions::Type::Ready);
        assert_eq!(ready, Some(false));

        let again = Proxy {
            status: Some(first.status),
            ..proxy
        };
        assert!(held(&again, "gcp-eu", &cap, 1).events.is_empty());
    }
}
