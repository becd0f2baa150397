//! A pool's creates under its namespace's ProxyQuotas (docs/tenancy.md, "Quotas per team"): a
//! step makes no Proxy past a quota's `proxies` or `total`, and the pool says which quota
//! stopped it (its `QuotaExceeded` condition and an Event). Kept apart from any other bound on
//! a pool's creates: each is its own step over the plan.

use kube::{Resource, ResourceExt};

use super::decide::{BUSY_REQUEUE, Member, Plan};
use crate::api::conditions::set_named;
use crate::api::labels::POOL_LABEL;
use crate::api::{ProxyPool, ProxyPoolStatus, ProxyQuota};
use crate::lifecycle::quota::QuotaView;
use crate::lifecycle::quota::decide::{Stopped, clip_creates};
use crate::support::events::{self, EventType, Recorder};

/// The pool's condition type naming the quota that stops its creates.
pub const CONDITION: &str = "QuotaExceeded";

/// Drops the plan's creates the namespace's quotas leave no room for, counting the pool's own
/// members from its fresh list and the namespace's other Proxies from the cache.
pub(super) fn clip_to_quota(
    view: &QuotaView,
    pool: &ProxyPool,
    members: &[Member],
    plan: &mut Plan,
) -> Option<Stopped> {
    let namespace = pool.namespace().unwrap_or_default();
    let quotas = view.of_namespace(&namespace);
    if quotas.is_empty() || plan.create.is_empty() {
        return None;
    }
    let name = pool.name_any();
    let mut used = view.counts(&namespace, |p| p.labels().get(POOL_LABEL) == Some(&name));
    for member in members.iter().filter(|m| !m.deleting) {
        *used
            .by_provider
            .entry(member.slot.provider.clone())
            .or_insert(0) += 1;
    }
    let quotas: Vec<&ProxyQuota> = quotas.iter().map(|q| &**q).collect();
    let asked = plan.create.len();
    let stopped = clip_creates(&quotas, &used, &mut plan.create, |s| &s.provider)?;
    let dropped = asked - plan.create.len();
    plan.counts.replicas -= dropped;
    plan.counts.updated -= dropped;
    // Not the quick next step of a large scale-up: nothing more fits until the quota has room,
    // which the usual busy look notices.
    plan.requeue_after = Some(BUSY_REQUEUE);
    Some(stopped)
}

/// The pool's `QuotaExceeded` condition: `True` naming the quota while it stops creates,
/// `False` once it does not (absent on a pool no quota ever stopped); a Warning Event when it
/// becomes `True`. `status.replicas` is what the step leaves made.
pub(super) async fn note(
    pool: &ProxyPool,
    recorder: &Recorder,
    status: &mut ProxyPoolStatus,
    stopped: Option<&Stopped>,
    wanted: usize,
) {
    let generation = pool.metadata.generation;
    let conditions = &mut status.conditions;
    let was = conditions
        .iter()
        .any(|c| c.type_ == CONDITION && c.status == "True");
    let Some(stopped) = stopped else {
        if conditions.iter().any(|c| c.type_ == CONDITION) {
            let message = "no ProxyQuota stops the pool's creates";
            set_named(
                conditions,
                CONDITION,
                false,
                "WithinQuota",
                message,
                generation,
            );
        }
        return;
    };
    let message = format!(
        "{}: {} of {wanted} Proxies made; more once the quota has room",
        stopped.message(),
        status.replicas
    );
    set_named(conditions, CONDITION, true, CONDITION, &message, generation);
    if !was {
        let reference = pool.object_ref(&());
        let warning = EventType::Warning;
        events::publish(recorder, &reference, warning, CONDITION, "Create", message).await;
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;
    use crate::api::Proxy;
    use crate::lifecycle::pool::decide::{CREATES_PER_STEP, NEXT_STEP, Slot};

    fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> K {
        serde_json::from_value(value).unwrap()
    }

    fn member(name: &str) -> Member {
        Member {
            name: name.into(),
            slot: Slot {
                provider: "x".into(),
                zone: None,
            },
            template_hash: None,
            created_ms: 0,
            ready: true,
            deleting: false,
            draining: false,
            lease_ends_ms: None,
            blocked_reports: 0,
            credentials_stale: false,
            recycle_requested: false,
        }
    }

    /// A pool of the namespace `team-a` asking for a full step of creates on `x`, one member
    /// made, another pool's Proxy beside it and a quota of 4 on `x`: 2 are made, the counts say
    /// so, and the pool looks again at the busy pace, not the next step's.
    #[test]
    fn a_full_step_of_creates_is_clipped_to_the_headroom_and_waits_at_the_busy_pace() {
        let (quotas, mut quota_writer) = reflector::store::<ProxyQuota>();
        let (proxies, mut proxy_writer) = reflector::store::<Proxy>();
        quota_writer.apply_watcher_event(&Event::Apply(object(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyQuota",
            "metadata": {"name": "q1", "namespace": "team-a"},
            "spec": {"proxies": {"x": 4}},
        }))));
        for (name, pool) in [("mine", "web"), ("theirs", "other")] {
            proxy_writer.apply_watcher_event(&Event::Apply(object(serde_json::json!({
                "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
                "metadata": {"name": name, "namespace": "team-a", "labels": {POOL_LABEL: pool}},
                "spec": {"provider": "x"},
            }))));
        }
        let view = QuotaView { quotas, proxies };
        let pool: ProxyPool = object(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"replicas": 1000, "template": {"spec": {"provider": "x"}}},
        }));
        let mut plan = Plan {
            create: vec![member("m").slot; CREATES_PER_STEP],
            requeue_after: Some(NEXT_STEP),
            ..Default::default()
        };
        plan.counts.replicas = 1 + CREATES_PER_STEP;
        plan.counts.updated = 1 + CREATES_PER_STEP;
        let stopped = clip_to_quota(&view, &pool, &[member("mine")], &mut plan).unwrap();
        assert_eq!(
            stopped.message(),
            "ProxyQuota team-a/q1: proxies[x] 4/4 in use"
        );
        assert_eq!(plan.create.len(), 2);
        assert_eq!((plan.counts.replicas, plan.counts.updated), (3, 3));
        assert_eq!(plan.requeue_after, Some(BUSY_REQUEUE));
        // Another namespace's pool is not bounded by it.
        let mut elsewhere = pool.clone();
        elsewhere.metadata.namespace = Some("team-b".into());
        let mut plan = Plan {
            create: vec![member("m").slot; 3],
            ..Default::default()
        };
        assert_eq!(clip_to_quota(&view, &elsewhere, &[], &mut plan), None);
        assert_eq!(plan.create.len(), 3);
    }
}
