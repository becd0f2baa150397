//! The lease table as `GET /v1/proxies` shows it.

use super::{LeaseError, LeaseStore, ProxyView, now_ms};

impl LeaseStore {
    /// Every provisioned proxy with its lease state, sorted by namespace and name.
    pub fn proxies(&self) -> Result<Vec<ProxyView>, LeaseError> {
        let now = now_ms();
        let inner = self.lock();
        if !inner.ready {
            return Err(LeaseError::NotReady);
        }
        let mut views: Vec<ProxyView> = inner
            .pool
            .values()
            .map(|slot| {
                let e = &slot.entry;
                let cooldown = inner.cooldowns.get(&e.key).copied().filter(|u| *u > now);
                let lease = inner.leased.get(&e.key).map(|id| &inner.leases[id].lease);
                let state = if !e.healthy {
                    "unhealthy"
                } else if lease.is_some() {
                    "leased"
                } else if cooldown.is_some() {
                    "coolingDown"
                } else {
                    "available"
                };
                ProxyView {
                    namespace: e.key.namespace.to_string(),
                    name: e.key.name.to_string(),
                    provider: e.provider.clone(),
                    zone: e.zone.clone(),
                    address: e.address.clone(),
                    port: e.port,
                    exit_ip: e.exit_ip.clone(),
                    state,
                    cooldown_until_ms: cooldown,
                    lease_expires_at_ms: lease.map(|l| l.expires_at_ms),
                    pool: slot.pool.as_ref().map(|k| k.to_string()),
                    draining: e.draining,
                    gateway_connections: inner
                        .shared
                        .is_in_use(&e.key)
                        .then(|| inner.shared.load(&e.key)),
                    protocol: e.protocol,
                }
            })
            .collect();
        views.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(views)
    }
}

impl LeaseStore {
    /// Every live lease (not expired), soonest to expire first: the status page's view.
    pub fn live_leases(&self) -> Result<Vec<super::Lease>, LeaseError> {
        let now = now_ms();
        let inner = self.lock();
        if !inner.ready {
            return Err(LeaseError::NotReady);
        }
        let mut leases: Vec<super::Lease> = inner
            .leases
            .values()
            .map(|held| held.lease.clone())
            .filter(|lease| lease.expires_at_ms > now)
            .collect();
        leases.sort_by(|a, b| (a.expires_at_ms, &a.id).cmp(&(b.expires_at_ms, &b.id)));
        Ok(leases)
    }
}
