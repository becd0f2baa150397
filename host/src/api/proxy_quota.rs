//! `ProxyQuota`: what one namespace (a team) may take of the fleet, applied by the platform in
//! the team's namespace, as a ResourceQuota is (docs/tenancy.md, "Quotas per team"). Several in
//! one namespace all apply: the tightest bound wins. The pure reading of the bounds is here; the
//! controllers, the lease table and the gateway each enforce their part.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Bounds on what the namespace's Proxies, pools and leases take of the fleet; every field is
/// optional (absent: no bound).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "proxy-operator.dev",
    version = "v1alpha1",
    kind = "ProxyQuota",
    plural = "proxyquotas",
    shortname = "pxq",
    category = "crawl",
    namespaced,
    status = "ProxyQuotaStatus",
    doc = "What one namespace (a team) may take of the fleet: Proxies per provider instance and in all, leases held at once, gateway connections at once. Applied by the platform in the team's namespace; several in one namespace all apply (the tightest wins).",
    printcolumn = r#"{"name":"Proxies","type":"string","jsonPath":".status.summary.proxies"}"#,
    printcolumn = r#"{"name":"Leases","type":"string","jsonPath":".status.summary.leases"}"#,
    printcolumn = r#"{"name":"Gateway","type":"string","jsonPath":".status.summary.gatewayConnections"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProxyQuotaSpec {
    /// Proxies the namespace may have on each provider instance (its name in the providers
    /// config), counting every Proxy not being deleted, pooled or not.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 64,
        "x-kubernetes-validations" = [{
            "rule": "self.all(k, size(k) <= 63 && k.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))",
            "message": "proxies: each key is a provider instance's name of the providers config (lowercase letters, digits and '-', at most 63)"
        }]
    ))]
    pub proxies: BTreeMap<String, u32>,
    /// Proxies the namespace may have on all provider instances together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1000000))]
    pub total: Option<u32>,
    /// Leases held at once on the namespace's Proxies (its pools' and its own), whoever holds
    /// them. A renewal or a session's join is never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1000000))]
    pub leases: Option<u32>,
    /// Gateway connections open at once to the namespace's Proxies, over every gateway replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10000000))]
    pub gateway_connections: Option<u32>,
}

/// Use against the bounds, written by the leader every few seconds when it changed.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ProxyQuotaStatus {
    /// What the namespace uses of each bounded field (the spec's names; `proxies` per provider
    /// instance).
    #[serde(default)]
    pub used: QuotaUse,
    /// `used/limit` of each kind, for `kubectl get pxq` (the tightest of `proxies` and `total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<QuotaSummary>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// What the namespace uses.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct QuotaUse {
    /// Proxies per provider instance named in the spec.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxies: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_connections: Option<u32>,
}

/// `used/limit` texts for the printer columns.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxies: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_connections: Option<String>,
}

/// The bound that decides, and where it comes from: what a refusal names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// `namespace/name` of the ProxyQuota.
    pub quota: String,
    /// The field, as the spec names it (`proxies[x]`, `total`, `leases`, `gatewayConnections`).
    pub field: String,
    pub limit: u32,
}

impl Bound {
    /// How a refusal says it: `ProxyQuota team-a/q1: leases 5/5 in use`.
    pub fn refusal(&self, used: u32) -> String {
        format!(
            "ProxyQuota {}: {} {used}/{} in use",
            self.quota, self.field, self.limit
        )
    }
}

fn named(quota: &ProxyQuota) -> String {
    format!(
        "{}/{}",
        quota.metadata.namespace.as_deref().unwrap_or_default(),
        quota.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The lowest of one field over a namespace's quotas (the first by name on a tie), if any sets
/// it.
pub fn tightest<'a>(
    quotas: impl IntoIterator<Item = &'a ProxyQuota>,
    field: &str,
    of: impl Fn(&ProxyQuotaSpec) -> Option<u32>,
) -> Option<Bound> {
    let mut bounds: Vec<Bound> = quotas
        .into_iter()
        .filter_map(|q| {
            of(&q.spec).map(|limit| Bound {
                quota: named(q),
                field: field.to_string(),
                limit,
            })
        })
        .collect();
    bounds.sort_by(|a, b| (a.limit, &a.quota).cmp(&(b.limit, &b.quota)));
    bounds.into_iter().next()
}

/// How many Proxies a namespace has, per provider instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    pub by_provider: BTreeMap<String, u32>,
}

impl ProxyCounts {
    pub fn of(&self, provider: &str) -> u32 {
        self.by_provider.get(provider).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u32 {
        self.by_provider.values().sum()
    }
}

/// How many more Proxies on `provider` the namespace may have, with the bound that leaves the
/// least room (`None`: no quota bounds it). Over a bound (a lowered quota) the room is 0.
pub fn proxy_headroom(
    quotas: &[&ProxyQuota],
    provider: &str,
    used: &ProxyCounts,
) -> Option<(u32, Bound, u32)> {
    let mut best: Option<(u32, Bound, u32)> = None;
    for quota in quotas {
        let per_provider = tightest([*quota], &format!("proxies[{provider}]"), |s| {
            s.proxies.get(provider).copied()
        })
        .map(|b| (b, used.of(provider)));
        let total = tightest([*quota], "total", |s| s.total).map(|b| (b, used.total()));
        for (bound, in_use) in per_provider.into_iter().chain(total) {
            let room = bound.limit.saturating_sub(in_use);
            if best.as_ref().is_none_or(|(r, _, _)| room < *r) {
                best = Some((room, bound, in_use));
            }
        }
    }
    best
}
