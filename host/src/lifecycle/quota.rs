//! ProxyQuotas (docs/tenancy.md, "Quotas per team"): the namespaces' bounds read from a watch,
//! handed to the lease table (`leases`, `gatewayConnections`) and to the controllers (Proxies),
//! and each quota's use written to its status by the leader. Decisions in `decide` (pure).

pub mod decide;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use self::decide::{NamespaceUse, Queued};
use crate::api::{Proxy, ProxyCounts, ProxyQuota};
use crate::leasing::leases::LeaseStore;

/// How often the leader hands the quotas' bounds to the lease table.
pub const BOUNDS_INTERVAL: Duration = Duration::from_secs(1);
/// How often the leader looks at each quota's use (a status is written only when it changed).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(3);

/// The quotas and the Proxies, as watches keep them: what the controllers count against,
/// without a request per reconcile. Cheap to clone.
#[derive(Clone)]
pub struct QuotaView {
    pub quotas: Store<ProxyQuota>,
    pub proxies: Store<Proxy>,
}

impl Default for QuotaView {
    /// No quota (empty caches that are never filled).
    fn default() -> Self {
        QuotaView {
            quotas: reflector::store().0,
            proxies: reflector::store().0,
        }
    }
}

impl QuotaView {
    /// The ProxyQuotas of `namespace`.
    pub fn of_namespace(&self, namespace: &str) -> Vec<Arc<ProxyQuota>> {
        self.quotas
            .state()
            .into_iter()
            .filter(|q| q.namespace().as_deref() == Some(namespace))
            .collect()
    }

    /// The Proxies of `namespace` not being deleted, per provider instance, leaving out those
    /// `skip` says (a pool's own members, counted from its fresh list instead).
    pub fn counts(&self, namespace: &str, skip: impl Fn(&Proxy) -> bool) -> ProxyCounts {
        let mut counts = ProxyCounts::default();
        for proxy in self.proxies.state() {
            if proxy.namespace().as_deref() == Some(namespace)
                && proxy.metadata.deletion_timestamp.is_none()
                && !skip(&proxy)
            {
                *counts
                    .by_provider
                    .entry(proxy.spec.provider.clone())
                    .or_insert(0) += 1;
            }
        }
        counts
    }

    /// The Proxies not being deleted, per namespace and provider instance, in one pass.
    pub fn counts_by_namespace(&self) -> HashMap<String, ProxyCounts> {
        let mut counts: HashMap<String, ProxyCounts> = HashMap::new();
        for proxy in self.proxies.state() {
            if proxy.metadata.deletion_timestamp.is_none() {
                let namespace = proxy.namespace().unwrap_or_default();
                *counts
                    .entry(namespace)
                    .or_default()
                    .by_provider
                    .entry(proxy.spec.provider.clone())
                    .or_insert(0) += 1;
            }
        }
        counts
    }

    /// The Proxies of `namespace` as the Proxy controller's admission ranks them.
    pub fn queue(&self, namespace: &str) -> Vec<Queued> {
        self.proxies
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(namespace)
                    && p.metadata.deletion_timestamp.is_none()
            })
            .map(|p| Queued {
                name: p.name_any(),
                provider: p.spec.provider.clone(),
                started: p
                    .status
                    .as_ref()
                    .is_some_and(|s| s.provider_id.is_some() || s.placement.is_some()),
                created_ms: crate::api::created_ms(&p.metadata),
            })
            .collect()
    }
}

/// The ProxyQuotas of `namespace` (or all) in a cache, and the watch that fills it (runs until
/// dropped).
pub fn watch(
    client: &Client,
    namespace: Option<&str>,
) -> (
    Store<ProxyQuota>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let api: Api<ProxyQuota> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default().any_semantic())
            .modify(crate::support::kubeclient::trim_for_cache),
    )
    .default_backoff()
    .for_each(|event| {
        if let Err(e) = event {
            tracing::debug!(error = %e, "watching ProxyQuotas");
        }
        std::future::ready(())
    });
    (reader, stream)
}

/// The leader's quota work until dropped: every [`BOUNDS_INTERVAL`] the bounds to the lease
/// table (from the first full read of the quotas on), every [`STATUS_INTERVAL`] each quota's use
/// to its status (when it changed). A quota's status is written after its bounds reached the
/// table: a written status means the table enforces it.
pub async fn run(client: Client, view: QuotaView, leases: Arc<LeaseStore>) {
    if view.quotas.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(BOUNDS_INTERVAL);
    let every = (STATUS_INTERVAL.as_millis() / BOUNDS_INTERVAL.as_millis()).max(1) as u64;
    for round in 0u64.. {
        tick.tick().await;
        let quotas = view.quotas.state();
        leases.set_quota_bounds(decide::namespace_bounds(&quotas));
        if round % every == 0 && !quotas.is_empty() {
            write_statuses(&client, &view, &leases, &quotas).await;
        }
    }
}

/// Each quota's use, written to its status when it changed.
async fn write_statuses(
    client: &Client,
    view: &QuotaView,
    leases: &LeaseStore,
    quotas: &[Arc<ProxyQuota>],
) {
    let held = leases.leases_by_namespace();
    let open = leases.gateway_connections_by_namespace();
    let proxies = view.counts_by_namespace();
    for quota in quotas {
        let namespace = quota.namespace().unwrap_or_default();
        let used = NamespaceUse {
            proxies: proxies.get(&namespace).cloned().unwrap_or_default(),
            leases: held.get(namespace.as_str()).copied().unwrap_or(0),
            gateway_connections: open.get(namespace.as_str()).copied().unwrap_or(0),
        };
        let status = decide::status_of(quota, &used);
        if quota.status.as_ref() == Some(&status) {
            continue;
        }
        let api: Api<ProxyQuota> = Api::namespaced(client.clone(), &namespace);
        let patch = Patch::Merge(decide::status_patch(quota.status.as_ref(), &status));
        if let Err(e) = api
            .patch_status(&quota.name_any(), &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!(quota = %quota.name_any(), %namespace, error = %e, "cannot write a ProxyQuota's status");
        }
    }
}
