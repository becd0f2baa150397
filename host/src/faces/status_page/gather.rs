//! The snapshot, read from what the operator already keeps in memory: the fleet's caches, the
//! lease table (on the leader), the providers in use and the metrics registry. No call to the
//! API server or a provider: a page view costs a few map reads.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::{ProviderHealth, Proxy, ProxyPool};
use crate::faces::fleet::Fleet;
use crate::leasing::leases::LeaseStore;
use crate::leasing::leases::store::{Lease, ProxyView};
use crate::provider::providers::ProviderSet;
use crate::support::leader::LeaderView;

use super::blocks_json::{RecentBlocks, TargetBlocks};
use super::snapshot::{
    LeaseRow, MAX_ROWS, PluginRow, PoolRow, ProviderRow, ProxyRow, Replica, Snapshot, Usage,
    human_duration,
};
use super::usage::usage_of;
use super::usage_json::UsageReport;

/// What the page reads (cheap to clone).
#[derive(Clone)]
pub struct Sources {
    pub fleet: Fleet,
    pub leases: Arc<LeaseStore>,
    pub providers: ProviderSet,
    pub view: LeaderView,
    pub registry: prometheus::Registry,
    /// The leader's usage book.
    pub usage: crate::faces::usage::UsageLedger,
}

/// Blocks listed per target before the rest are summed as `other`.
const TOP_TARGETS: usize = 20;

impl Sources {
    /// The page's content now.
    pub fn snapshot(&self) -> Snapshot {
        let now = Timestamp::now();
        let leader = self.view.is_serving();
        let table = if leader {
            self.leases.proxies().ok()
        } else {
            None
        };
        let by_key: HashMap<(String, String), &ProxyView> = table
            .iter()
            .flatten()
            .map(|v| ((v.namespace.clone(), v.name.clone()), v))
            .collect();
        let mut proxies: Vec<Arc<Proxy>> = self.fleet.proxies.state();
        proxies.sort_by_key(|p| (p.namespace(), p.name_any()));
        let mut phases: BTreeMap<String, usize> = BTreeMap::new();
        for proxy in &proxies {
            *phases.entry(phase_of(proxy)).or_default() += 1;
        }
        let rows = proxies
            .iter()
            .take(MAX_ROWS)
            .map(|p| proxy_row(p, &by_key, now))
            .collect();
        let leases = leader.then(|| self.leases.live_leases().unwrap_or_default());
        let now_ms = now.as_millisecond().max(0) as u64;
        Snapshot {
            generated_at: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            replica: replica(&self.view, leader),
            pools: pool_rows(&self.fleet.pools.state(), table.as_deref()),
            providers: provider_rows(&self.fleet.providers.state(), now),
            proxies_hidden: proxies.len().saturating_sub(MAX_ROWS),
            proxies: rows,
            phases: phases.into_iter().collect(),
            leases_hidden: leases
                .as_ref()
                .map_or(0, |l| l.len().saturating_sub(MAX_ROWS)),
            leases: leases.map(|l| {
                l.iter()
                    .take(MAX_ROWS)
                    .map(|l| lease_row(l, now_ms))
                    .collect()
            }),
            blocks: self.leases.metrics().blocks.last_hour(now_ms, TOP_TARGETS),
            plugins: self.plugin_rows(),
            usage: Usage {
                gateway_bytes: self
                    .leases
                    .gateway_bytes()
                    .into_iter()
                    .map(|(pool, t)| (pool, t.sent, t.received))
                    .collect(),
                ..usage_of(&self.registry.gather())
            },
        }
    }

    /// The blocks per target of the last hour, for `/status/blocks.json` (the leader's; a
    /// standby names the leader and has none).
    pub fn recent_blocks(&self) -> RecentBlocks {
        let leader = self.view.is_serving();
        let now_ms = Timestamp::now().as_millisecond().max(0) as u64;
        let (replica, leader_id) = replica_answer(&self.view, leader);
        let targets = if leader {
            self.leases.metrics().blocks.last_hour(now_ms, TOP_TARGETS)
        } else {
            Vec::new()
        };
        RecentBlocks {
            replica: replica.to_string(),
            leader: leader_id,
            window_seconds: 3600,
            targets: targets
                .into_iter()
                .map(|(target, blocks)| TargetBlocks { target, blocks })
                .collect(),
        }
    }

    /// The usage book, for `/status/usage.json` (the leader's; a standby names the leader and
    /// has none).
    pub fn usage_report(&self) -> UsageReport {
        let leader = self.view.is_serving();
        let now_ms = Timestamp::now().as_millisecond().max(0) as u64;
        let (replica, leader_id) = replica_answer(&self.view, leader);
        let (since_ms, rows) = if leader {
            self.usage.rows(now_ms)
        } else {
            (0, Vec::new())
        };
        UsageReport {
            replica: replica.to_string(),
            leader: leader_id,
            since_ms,
            now_ms,
            rows,
        }
    }

    fn plugin_rows(&self) -> Vec<PluginRow> {
        let providers = self.providers.current();
        let mut rows: Vec<PluginRow> = providers
            .names()
            .filter_map(|name| providers.get(name))
            .map(|instance| {
                let plugin = instance.plugin();
                PluginRow {
                    provider: instance.name().to_string(),
                    plugin: plugin.info.name.clone(),
                    version: plugin.info.version.clone(),
                    wit_version: plugin.wit_version.clone(),
                    sha256: plugin.sha256.clone(),
                    capabilities: plugin
                        .info
                        .capabilities
                        .iter()
                        .map(|c| format!("{c:?}").to_lowercase())
                        .collect(),
                    description: plugin.info.description.clone(),
                    not_loaded: None,
                }
            })
            .collect();
        rows.extend(providers.not_loaded_all().map(|(name, why)| PluginRow {
            provider: name.to_string(),
            plugin: why.provider_type.clone(),
            not_loaded: Some(why.reason.clone()),
            ..PluginRow::default()
        }));
        rows.sort_by(|a, b| a.provider.cmp(&b.provider));
        rows
    }
}

fn replica(view: &LeaderView, leader: bool) -> Replica {
    if leader {
        return Replica::Leader;
    }
    match view.last_seen() {
        Some((holder, _)) => Replica::Standby { leader: holder },
        None => Replica::Starting,
    }
}

fn phase_of(proxy: &Proxy) -> String {
    proxy
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map_or_else(|| "Pending".to_string(), |p| format!("{p:?}"))
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn age(created: Option<Timestamp>, now: Timestamp) -> String {
    created
        .map(|t| human_duration(now.duration_since(t).as_secs().max(0) as u64))
        .unwrap_or_default()
}

fn proxy_row(
    proxy: &Proxy,
    table: &HashMap<(String, String), &ProxyView>,
    now: Timestamp,
) -> ProxyRow {
    let status = proxy.status.clone().unwrap_or_default();
    let ready = condition(&status.conditions, "Ready");
    let key = (proxy.namespace().unwrap_or_default(), proxy.name_any());
    let view = table.get(&key);
    ProxyRow {
        pool: proxy
            .labels()
            .get(crate::api::labels::POOL_LABEL)
            .cloned()
            .unwrap_or_default(),
        provider: proxy.spec.provider.clone(),
        zone: status.zone.clone().unwrap_or_default(),
        phase: phase_of(proxy),
        ready_reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
        ready_message: ready.map(|c| c.message.clone()).unwrap_or_default(),
        address: match (&status.address, status.port) {
            (Some(address), Some(port)) => format!("{address}:{port}"),
            (Some(address), None) => address.clone(),
            _ => String::new(),
        },
        exit_ip: status.exit_ip.clone().unwrap_or_default(),
        lease_state: view.map(|v| v.state.to_string()).unwrap_or_default(),
        age: age(proxy.creation_timestamp().map(|t| t.0), now),
        namespace: key.0,
        name: key.1,
    }
}

fn pool_rows(pools: &[Arc<ProxyPool>], table: Option<&[ProxyView]>) -> Vec<PoolRow> {
    let mut cooling: HashMap<&str, usize> = HashMap::new();
    for view in table.into_iter().flatten() {
        if let (Some(pool), "coolingDown") = (&view.pool, view.state) {
            *cooling.entry(pool.as_str()).or_default() += 1;
        }
    }
    let mut rows: Vec<PoolRow> = pools
        .iter()
        .map(|pool| {
            let status = pool.status.clone().unwrap_or_default();
            let namespace = pool.namespace().unwrap_or_default();
            let key = format!("{namespace}/{}", pool.name_any());
            PoolRow {
                name: pool.name_any(),
                namespace,
                desired: pool.spec.replicas,
                ready: status.ready_replicas,
                leased: status.leased_replicas,
                cooling: table.map(|_| cooling.get(key.as_str()).copied().unwrap_or(0)),
                draining: status.draining_replicas,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

fn provider_rows(providers: &[Arc<ProviderHealth>], now: Timestamp) -> Vec<ProviderRow> {
    let mut rows: Vec<ProviderRow> = providers
        .iter()
        .map(|health| {
            let status = health.status.clone().unwrap_or_default();
            let ready = condition(&status.conditions, "Ready");
            ProviderRow {
                name: health.name_any(),
                provider_type: health.spec.provider_type.clone(),
                ready: ready.map(|c| c.status == "True"),
                reason: ready.map(|c| c.reason.clone()).unwrap_or_default(),
                message: ready.map(|c| c.message.clone()).unwrap_or_default(),
                targets: status.targets_summary.clone().unwrap_or_default(),
                last_check: status
                    .last_check_time
                    .map(|t| format!("{} ago", age(Some(t.0), now)))
                    .unwrap_or_default(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

fn lease_row(lease: &Lease, now_ms: u64) -> LeaseRow {
    LeaseRow {
        id: lease.id.chars().take(8).collect(),
        proxy: lease.proxy.to_string(),
        pool: lease.pool.as_deref().unwrap_or_default().to_string(),
        holder: lease
            .holder
            .clone()
            .unwrap_or_else(|| "static token".to_string()),
        session: lease.session.is_some(),
        expires_in: human_duration(lease.expires_at_ms.saturating_sub(now_ms) / 1000),
    }
}

/// What `/status/*.json` says of this replica: `leader`, `standby` (and whom it follows) or
/// `starting`.
fn replica_answer(view: &LeaderView, leader: bool) -> (&'static str, Option<String>) {
    match replica(view, leader) {
        Replica::Leader => ("leader", None),
        Replica::Standby { leader } => ("standby", leader),
        Replica::Starting => ("starting", None),
    }
}
