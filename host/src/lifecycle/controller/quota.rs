//! A Proxy is provisioned only within its namespace's ProxyQuotas (docs/tenancy.md, "Quotas per
//! team"): one beyond them waits, `Provisioned` and `Ready` false with reason `QuotaExceeded`
//! naming the quota, the use and the limit, and an Event. Counted from the Proxy cache the
//! operator keeps, never a list per reconcile; the pool controller clips its creates first, so
//! this is the net for hand-made Proxies and for pools that raced one another.

use std::time::Duration;

use kube::ResourceExt;

use super::decide::{Effects, NextReconcile, ProxyEvent};
use crate::api::conditions::{self, Reason};
use crate::api::{Phase, Proxy, ProxyQuota};
use crate::lifecycle::quota::QuotaView;
use crate::lifecycle::quota::decide::admit;
use crate::support::events::EventType;

/// How often a Proxy waiting for its quota looks again.
pub const WAIT_FOR_QUOTA: Duration = Duration::from_secs(5);

/// What to write instead of a create when the Proxy is beyond its namespace's quota; `None`
/// when it may be provisioned (or has started already: a lowered quota stops nothing running).
pub fn beyond_quota(view: &QuotaView, proxy: &Proxy) -> Option<Effects> {
    let started = proxy
        .status
        .as_ref()
        .is_some_and(|s| s.provider_id.is_some() || s.placement.is_some());
    if started {
        return None;
    }
    let namespace = proxy.namespace().unwrap_or_default();
    let quotas = view.of_namespace(&namespace);
    if quotas.is_empty() {
        return None;
    }
    let quotas: Vec<&ProxyQuota> = quotas.iter().map(|q| &**q).collect();
    let stopped = admit(&quotas, &proxy.name_any(), &view.queue(&namespace)).err()?;
    let message = format!(
        "{}; not provisioned until the namespace's Proxies on `{}` are fewer than the quota",
        stopped.message(),
        proxy.spec.provider
    );
    let generation = proxy.metadata.generation;
    let mut status = proxy.status.clone().unwrap_or_default();
    let mut events = Vec::new();
    if status.last_error.as_deref() != Some(&message) {
        events.push(ProxyEvent {
            type_: EventType::Warning,
            reason: "QuotaExceeded",
            message: message.clone(),
        });
    }
    status.phase = Some(Phase::Pending);
    status.observed_generation = generation;
    conditions::not_provisioned(
        &mut status.conditions,
        Reason::QuotaExceeded,
        &message,
        generation,
    );
    status.last_error = Some(message);
    Some(Effects {
        status,
        events,
        next: NextReconcile::Requeue(WAIT_FOR_QUOTA),
    })
}
