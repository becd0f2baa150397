//! The ProxyQuota decisions of the controllers, pure (table-tested below): how many of a pool's
//! creates a namespace's quotas let through, whether one Proxy may be provisioned, and what a
//! quota's status says.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{
    Bound, ProxyCounts, ProxyQuota, ProxyQuotaStatus, QuotaSummary, QuotaUse, proxy_headroom,
    tightest,
};
use crate::leasing::leases::store::NamespaceBounds;

/// A bound that stopped something, with the use it was checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub bound: Bound,
    pub used: u32,
}

impl Stopped {
    /// `ProxyQuota team-a/q1: proxies[x] 3/3 in use`.
    pub fn message(&self) -> String {
        self.bound.refusal(self.used)
    }
}

/// Keeps of `creates` (in order, each on the provider instance `provider_of` says) those the
/// namespace's quotas leave room for, `used` being what the namespace has already; the first
/// bound that dropped one is returned. Separate from any other bound on creates (a provider
/// instance's own caps are checked beside it).
pub fn clip_creates<T>(
    quotas: &[&ProxyQuota],
    used: &ProxyCounts,
    creates: &mut Vec<T>,
    provider_of: impl Fn(&T) -> &str,
) -> Option<Stopped> {
    if quotas.is_empty() {
        return None;
    }
    let mut counts = used.clone();
    let mut stopped = None;
    creates.retain(|create| {
        let provider = provider_of(create);
        match proxy_headroom(quotas, provider, &counts) {
            Some((0, bound, in_use)) => {
                stopped.get_or_insert(Stopped {
                    bound,
                    used: in_use,
                });
                false
            }
            _ => {
                *counts.by_provider.entry(provider.to_string()).or_insert(0) += 1;
                true
            }
        }
    });
    stopped
}

/// A Proxy of the namespace, as the Proxy controller's admission sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    pub name: String,
    pub provider: String,
    /// An instance exists or was asked for: it counts first, never stopped.
    pub started: bool,
    pub created_ms: u64,
}

/// Whether the Proxy `name` may be provisioned: the namespace's started Proxies count first,
/// then the waiting ones in the order they were made (then by name), so a quota admits the
/// oldest and a lowered one stops only what has not started.
pub fn admit(quotas: &[&ProxyQuota], name: &str, namespace: &[Queued]) -> Result<(), Stopped> {
    let Some(me) = namespace.iter().find(|q| q.name == name) else {
        return Ok(());
    };
    if me.started || quotas.is_empty() {
        return Ok(());
    }
    let ahead = |q: &&Queued| {
        q.name != me.name
            && (q.started || (q.created_ms, q.name.as_str()) < (me.created_ms, me.name.as_str()))
    };
    let mut counts = ProxyCounts::default();
    for q in namespace.iter().filter(ahead) {
        *counts.by_provider.entry(q.provider.clone()).or_insert(0) += 1;
    }
    match proxy_headroom(quotas, &me.provider, &counts) {
        Some((0, bound, used)) => Err(Stopped { bound, used }),
        _ => Ok(()),
    }
}

/// Each namespace's tightest `leases` and `gatewayConnections` bounds, for the lease table.
pub fn namespace_bounds(quotas: &[Arc<ProxyQuota>]) -> Vec<(String, NamespaceBounds)> {
    let mut by_namespace: BTreeMap<String, Vec<&ProxyQuota>> = BTreeMap::new();
    for quota in quotas {
        let namespace = quota.metadata.namespace.clone().unwrap_or_default();
        by_namespace.entry(namespace).or_default().push(quota);
    }
    by_namespace
        .into_iter()
        .filter_map(|(namespace, quotas)| {
            let bounds = NamespaceBounds {
                leases: tightest(quotas.iter().copied(), "leases", |s| s.leases),
                gateway_connections: tightest(quotas.iter().copied(), "gatewayConnections", |s| {
                    s.gateway_connections
                }),
            };
            (bounds != NamespaceBounds::default()).then_some((namespace, bounds))
        })
        .collect()
}

/// What the namespace uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceUse {
    pub proxies: ProxyCounts,
    pub leases: u32,
    pub gateway_connections: u32,
}

/// A quota's status: the use of each field it bounds, and `used/limit` for the columns (for
/// Proxies, the field with the least room).
pub fn status_of(quota: &ProxyQuota, used: &NamespaceUse) -> ProxyQuotaStatus {
    let spec = &quota.spec;
    let proxies: BTreeMap<String, u32> = spec
        .proxies
        .keys()
        .map(|p| (p.clone(), used.proxies.of(p)))
        .collect();
    let total = used.proxies.total();
    let mut tightest: Option<(u32, u32, u32)> = None;
    for (limit, in_use) in spec
        .proxies
        .iter()
        .map(|(p, limit)| (*limit, used.proxies.of(p)))
        .chain(spec.total.map(|limit| (limit, total)))
    {
        let room = limit.saturating_sub(in_use);
        if tightest.is_none_or(|(r, _, _)| room < r) {
            tightest = Some((room, in_use, limit));
        }
    }
    let ratio = |in_use: u32, limit: Option<u32>| limit.map(|l| format!("{in_use}/{l}"));
    ProxyQuotaStatus {
        used: QuotaUse {
            proxies,
            total: spec.total.map(|_| total),
            leases: spec.leases.map(|_| used.leases),
            gateway_connections: spec.gateway_connections.map(|_| used.gateway_connections),
        },
        summary: Some(QuotaSummary {
            proxies: tightest.map(|(_, in_use, limit)| format!("{in_use}/{limit}")),
            leases: ratio(used.leases, spec.leases),
            gateway_connections: ratio(used.gateway_connections, spec.gateway_connections),
        }),
        observed_generation: quota.metadata.generation,
    }
}

/// The merge patch that makes `old` into `new`: a merge patch leaves what it does not name, so
/// a field the spec no longer bounds (or a provider instance it no longer names) is removed with
/// an explicit `null`.
pub fn status_patch(old: Option<&ProxyQuotaStatus>, new: &ProxyQuotaStatus) -> serde_json::Value {
    let mut patch = serde_json::to_value(new).expect("a status serializes");
    let old = old.map(|o| serde_json::to_value(o).expect("a status serializes"));
    for part in ["used", "summary"] {
        let (Some(before), Some(after)) = (
            old.as_ref().and_then(|o| o[part].as_object()),
            patch[part].as_object_mut(),
        ) else {
            continue;
        };
        for (key, value) in before {
            if !after.contains_key(key) {
                after.insert(key.clone(), serde_json::Value::Null);
            } else if let (Some(was), Some(now)) = (value.as_object(), after[key].as_object_mut()) {
                for gone in was
                    .keys()
                    .filter(|k| !now.contains_key(*k))
                    .cloned()
                    .collect::<Vec<_>>()
                {
                    now.insert(gone, serde_json::Value::Null);
                }
            }
        }
    }
    serde_json::json!({ "status": patch })
}

#[cfg(test)]
mod tests;
