//! A pool's creates under its namespace's ProxyQuotas (docs/tenancy.md, "Quotas per team"): a
//! step makes no Proxy past a quota's `proxies` or `total`, and the pool says which quota
//! stopped it (its `QuotaExceeded` condition and an Event). Kept apart from any other bound on
//! a pool's creates: each is its own step over the plan.

use kube::{Resource, ResourceExt};

use super::decide::{Member, Plan};
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
