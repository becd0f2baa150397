//! A Proxy of a pool as the pool controller sees it ([`Member`]): its place, template, age,
//! readiness, drain and recycle marks, and what the lease table knows of it.

use std::collections::HashMap;

use kube::ResourceExt;

use super::decide::{Member, Slot};
use crate::api::Proxy;
use crate::api::labels::{DRAINING_ANNOTATION, RECYCLE_ANNOTATION, TEMPLATE_LABEL};
use crate::leasing::leases::ProxyKey;
use crate::leasing::leases::store::ProxyUsage;

pub(super) fn of(proxy: &Proxy, usage: &HashMap<ProxyKey, ProxyUsage>) -> Member {
    let key = ProxyKey {
        namespace: proxy.namespace().unwrap_or_default().into(),
        name: proxy.name_any().into(),
    };
    let usage = usage.get(&key).cloned().unwrap_or_default();
    Member {
        name: key.name.to_string(),
        slot: Slot {
            provider: proxy.spec.provider.clone(),
            zone: proxy.spec.placement.as_ref().and_then(|p| p.zone.clone()),
        },
        template_hash: proxy.labels().get(TEMPLATE_LABEL).cloned(),
        created_ms: crate::api::created_ms(&proxy.metadata),
        ready: proxy
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p == crate::api::Phase::Ready),
        deleting: proxy.metadata.deletion_timestamp.is_some(),
        draining: proxy
            .annotations()
            .get(DRAINING_ANNOTATION)
            .is_some_and(|v| v == "true"),
        lease_ends_ms: usage.lease_expires_at_ms,
        blocked_reports: usage.blocked_reports,
        recycle_requested: proxy
            .annotations()
            .get(RECYCLE_ANNOTATION)
            .is_some_and(|v| v == "true"),
        credentials_stale: proxy.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == crate::lifecycle::controller::credentials::CONDITION
                    && c.status == "False"
                    && c.reason == "RotationFailed"
            })
        }),
    }
}
