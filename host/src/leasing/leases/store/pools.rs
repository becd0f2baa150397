//! Which proxies are provisioned (from the health engine) and which pools exist (from the pool
//! controller); what the table keeps about a proxy goes when the proxy does.

use std::collections::HashSet;
use std::sync::Arc;

use super::keys::FastMap;
use super::series::series_for;
use super::{EndReason, Inner, LeaseStore, PoolKey, ProvisionedProxy, ProxyKey, Slot};
use crate::leasing::leases::metrics::{NO_POOL, SeriesKey};

impl LeaseStore {
    /// Sets the pools that exist (every ProxyPool, from the pool controller). A pool is known if
    /// it is here or a provisioned proxy names it; a grant naming any other is `UnknownPool`.
    pub fn set_known_pools<I>(&self, pools: I)
    where
        I: IntoIterator,
        I::Item: Into<PoolKey>,
    {
        let mut inner = self.lock();
        inner.known_pools = pools.into_iter().map(Into::into).collect();
        self.prune_rejected(&mut inner);
    }

    /// Adds one pool to the known ones at once (the pool controller, as it first sees a pool), so
    /// a new pool is not `unknown-pool` until the next [`Self::set_known_pools`].
    pub fn add_known_pool(&self, pool: PoolKey) {
        self.lock().known_pools.insert(pool);
    }

    /// Replaces the set of provisioned proxies. Leases on proxies that are gone or unhealthy end.
    pub fn set_provisioned(&self, entries: Vec<ProvisionedProxy>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut pool = FastMap::default();
        let mut pooled: FastMap<PoolKey, u32> = FastMap::default();
        let mut providers = HashSet::new();
        for entry in entries {
            let pool_key = entry.pool.as_ref().map(|name| PoolKey {
                namespace: entry.key.namespace.clone(),
                name: name.as_str().into(),
            });
            let label = pool_key
                .as_ref()
                .map_or_else(|| NO_POOL.to_string(), |k| k.to_string());
            let series = series_for(
                &mut inner.series,
                SeriesKey::new(&entry.key.namespace, label, &entry.provider),
                &self.metrics,
            );
            if let Some(key) = &pool_key {
                *pooled.entry(key.clone()).or_default() += 1;
            }
            if !providers.contains(&entry.provider) {
                providers.insert(entry.provider.clone());
            }
            pool.insert(
                entry.key.clone(),
                Slot {
                    entry: Arc::new(entry),
                    pool: pool_key,
                    series,
                },
            );
        }
        let removed_any = inner.pool.keys().any(|k| !pool.contains_key(k));
        // The old slots go first: what they alone held is unused below.
        drop(std::mem::replace(&mut inner.pool, pool));
        inner.pooled = pooled;
        inner.providers = providers;

        let ended: Vec<(String, EndReason)> = inner
            .leases
            .iter()
            .filter_map(|(id, held)| match inner.pool.get(&held.lease.proxy) {
                None => Some((id.clone(), EndReason::Deleted)),
                Some(slot) if !slot.entry.healthy => Some((id.clone(), EndReason::Unhealthy)),
                Some(_) => None,
            })
            .collect();
        let mut changed = !ended.is_empty();
        for (id, reason) in ended {
            inner.end(&id, reason);
        }
        let stale: Vec<ProxyKey> = inner
            .free_seq
            .keys()
            .filter(|k| !inner.pool.get(*k).is_some_and(|s| s.entry.leasable()))
            .cloned()
            .collect();
        for key in stale {
            inner.remove_free(&key);
        }
        let fresh: Vec<ProxyKey> = inner
            .pool
            .iter()
            .filter(|(k, s)| {
                s.entry.leasable()
                    && !inner.leased.contains_key(*k)
                    && !inner.free_seq.contains_key(*k)
                    && !inner.shared.is_in_use(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in fresh {
            inner.push_free(key);
        }
        inner.rebuild_free_by_pool();

        changed |= inner.forget_gone_proxies(removed_any);

        inner.series.retain(|key, series| {
            let used = Arc::strong_count(series) > 1;
            if !used {
                self.metrics.remove_series(key);
            }
            used
        });
        self.prune_rejected(inner);
        if changed {
            self.mark_dirty(inner);
        }
    }
}

impl Inner {
    /// What the table keeps about proxies that are gone goes with them; whether anything did.
    /// At a million sessions or cooldowns their pass costs milliseconds under the lock: only
    /// when a proxy went (`removed_any`).
    fn forget_gone_proxies(&mut self, removed_any: bool) -> bool {
        let before = (self.cooldowns.len(), self.blocked_reports.len());
        let pool = &self.pool;
        self.cooldowns.retain(|k, _| pool.contains_key(k));
        self.failures.retain(|k, _| pool.contains_key(k));
        self.blocked_reports.retain(|k, _| pool.contains_key(k));
        let mut changed = before != (self.cooldowns.len(), self.blocked_reports.len());
        if removed_any {
            changed |= self.targets.retain_proxies(|k| pool.contains_key(k));
            changed |= self.sessions.retain_proxies(|k| pool.contains_key(k));
        }
        changed
    }

    /// Whether a grant may name `pool`: a ProxyPool, or named by a provisioned proxy.
    pub(super) fn is_known(&self, pool: &PoolKey) -> bool {
        self.pooled.contains_key(pool) || self.known_pools.contains(pool)
    }
}
