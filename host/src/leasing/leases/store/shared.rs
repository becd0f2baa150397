//! Shared use of proxies by the gateway (`proxy-operator gateway`, docs/gateway.md): unlike a
//! lease, a route does not hold its proxy alone. A proxy carrying gateway traffic leaves the
//! free order, so the lease API never hands it out exclusively while the gateway uses it, and
//! returns to it once its connections are gone and it has not been routed to for a while.
//!
//! Soft state, never persisted: after a failover the gateway replicas report their open
//! connections again within a report interval, and until then a proxy in gateway use may be
//! leased (docs/architecture.md).

use std::collections::HashMap;
use std::sync::Arc;

use super::keys::FastMap;
use super::outcomes::Outcome;
use super::picking::{
    Fit, Wanted, check_pool, fit_matching, free_in_scope, matches, narrowest_pool, nothing_free,
};
use super::sessions::session_digest;
pub use super::shared_use::{
    MAX_REPLICAS, PoolGateway, REPLICA_SILENCE, ReplicaError, SHARED_HOLD,
};
use super::shared_use::{ReplicaLoad, Use};
use super::{
    GrantError, Inner, LeaseRequest, LeaseStore, PoolKey, ProvisionedProxy, ProxyKey, now_ms,
};

/// What the gateway asks for one request or tunnel.
#[derive(Clone, Debug, Default)]
pub struct RouteRequest {
    /// Pool, provider, zone, session, target (the destination host), holder and reach, as for
    /// a lease; `proxy` and `ttl` are not used.
    pub filters: LeaseRequest,
    /// The gateway replica asking (its open connections are counted under this id).
    pub replica: String,
    /// A proxy not to route to (the one that just failed).
    pub avoid: Option<ProxyKey>,
    /// Open gateway connections a proxy may carry, unless its pool says otherwise.
    pub max_connections: u32,
}

/// A route's answer: the proxy, and its pool's gateway settings if it has its own.
#[derive(Clone, Debug)]
pub struct Routed {
    pub entry: Arc<ProvisionedProxy>,
    pub pool: Option<Arc<PoolGateway>>,
}

impl LeaseStore {
    /// Chooses the proxy for one gateway request or tunnel, by the rules of a lease (pool,
    /// provider, zone, session, cooldowns for the target, health, draining) except that it is
    /// shared: the proxy may carry other gateway connections (up to `max_connections`), never
    /// an exclusive lease's. The session's proxy while it is usable; else the least loaded,
    /// the least recently routed first among equals, so requests rotate over the pool.
    pub fn route(&self, request: &RouteRequest) -> Result<Routed, GrantError> {
        let now = now_ms();
        let filters = &request.filters;
        let wanted = Wanted::of(filters);
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.ready {
            return Err(GrantError::NotReady);
        }
        check_pool(inner, filters)?;
        let chosen = choose(inner, request, &wanted, now)?;
        inner.check_connection_quota(&chosen)?;
        if let Some(session) = wanted.session {
            inner.sessions.bind(session, &chosen);
        }
        if inner.free_seq.contains_key(&chosen) {
            inner.remove_free(&chosen);
        }
        inner.shared.next_route += 1;
        let order = inner.shared.next_route;
        inner.shared.in_use.insert(
            chosen.clone(),
            Use {
                last_ms: now,
                order,
            },
        );
        let replica = inner
            .shared
            .replicas
            .entry(request.replica.clone())
            .or_insert_with(|| ReplicaLoad {
                reported_at_ms: now,
                ..ReplicaLoad::default()
            });
        *replica.routed.entry(chosen.clone()).or_insert(0) += 1;
        let slot = &inner.pool[&chosen];
        let pool = inner.shared.settings_of(slot.pool.as_ref()).cloned();
        Ok(Routed {
            entry: slot.entry.clone(),
            pool,
        })
    }

    /// Sets the pools' own gateway settings (from the pool controller, with the known pools);
    /// a pool not named uses the operator's defaults.
    pub fn set_pool_gateways(&self, pools: Vec<(PoolKey, PoolGateway)>) {
        let mut inner = self.lock();
        let current = &inner.shared.pools;
        let unchanged = current.len() == pools.len()
            && pools
                .iter()
                .all(|(k, g)| current.get(k).is_some_and(|c| **c == *g));
        if !unchanged {
            inner.shared.pools = pools.into_iter().map(|(k, g)| (k, Arc::new(g))).collect();
        }
    }

    /// A gateway replica's open upstream connections per proxy, replacing what it reported
    /// before (and the routes handed to it since).
    pub fn report_replica_load(
        &self,
        replica: &str,
        connections: Vec<(ProxyKey, u32)>,
    ) -> Result<(), ReplicaError> {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let shared = &mut inner.shared;
        if !shared.replicas.contains_key(replica) && shared.replicas.len() >= MAX_REPLICAS {
            return Err(ReplicaError::TooManyReplicas);
        }
        let mut load = FastMap::default();
        // Newly in gateway use (one that was free when a replica reported it after a failover,
        // say): out of the free order.
        let mut taken = Vec::new();
        for (key, count) in connections {
            // Only proxies of the table: a report cannot make the leader hold made-up keys.
            if count > 0 && inner.pool.contains_key(&key) {
                if !shared.in_use.contains_key(&key) {
                    let reported = Use {
                        last_ms: now,
                        order: 0,
                    };
                    shared.in_use.insert(key.clone(), reported);
                    taken.push(key.clone());
                }
                load.insert(key, count);
            }
        }
        shared.replicas.insert(
            replica.to_string(),
            ReplicaLoad {
                connections: load,
                routed: FastMap::default(),
                reported_at_ms: now,
            },
        );
        for key in taken {
            inner.remove_free(&key);
        }
        Ok(())
    }

    /// What the gateway saw on a proxy it routed to: `blocked` for `target` cools it down for
    /// that host (as a lease's report would), `failure` counts towards a probe. No lease ends.
    pub fn report_shared(
        &self,
        proxy: &ProxyKey,
        outcome: Outcome,
        target: Option<&str>,
    ) -> Result<(), GrantError> {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.ready {
            return Err(GrantError::NotReady);
        }
        let Some(slot) = inner.pool.get(proxy) else {
            return Err(GrantError::UnknownProxy);
        };
        let series = slot.series.clone();
        series.reports[outcome as usize].inc();
        self.apply_outcome(inner, proxy, outcome, target, now);
        Ok(())
    }

    /// A gateway client's own report, on the proxy `holder`'s `session` is on, as
    /// [`Self::report_shared`]. `None`: the session is on no proxy.
    pub fn report_session(
        &self,
        holder: Option<&str>,
        session: &str,
        outcome: Outcome,
        target: Option<&str>,
    ) -> Result<Option<ProxyKey>, GrantError> {
        let digest = session_digest(holder, session);
        let found = self.lock().sessions.proxy_of(&digest).cloned();
        let Some(proxy) = found else {
            return Ok(None);
        };
        self.report_shared(&proxy, outcome, target)?;
        Ok(Some(proxy))
    }

    /// Gives proxies whose gateway use ended back to the free order, and forgets replicas that
    /// went silent (with [`LeaseStore::expire`]).
    pub(super) fn expire_shared(inner: &mut Inner, now: u64) {
        let silence = REPLICA_SILENCE.as_millis() as u64;
        inner
            .shared
            .replicas
            .retain(|_, r| now.saturating_sub(r.reported_at_ms) < silence);
        let hold = SHARED_HOLD.as_millis() as u64;
        let ended: Vec<ProxyKey> = inner
            .shared
            .in_use
            .iter()
            .filter(|(k, u)| now.saturating_sub(u.last_ms) >= hold && inner.shared.load(k) == 0)
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            inner.shared.in_use.remove(&key);
            let free_again = inner.pool.get(&key).is_some_and(|s| s.entry.leasable())
                && !inner.leased.contains_key(&key)
                && !inner.free_seq.contains_key(&key);
            if free_again {
                inner.push_free(key);
            }
        }
        let pool = &inner.pool;
        inner.shared.in_use.retain(|k, _| pool.contains_key(k));
    }

    /// Open gateway connections per proxy (for `GET /v1/proxies` and the metrics).
    pub fn shared_loads(&self) -> HashMap<ProxyKey, u32> {
        let inner = self.lock();
        inner
            .shared
            .in_use
            .keys()
            .map(|k| (k.clone(), inner.shared.load(k)))
            .collect()
    }
}

/// The proxy for a route ([`LeaseStore::route`]): the session's while it is usable, else the
/// first fitting free proxy, else the least loaded of those in gateway use.
fn choose(
    inner: &Inner,
    request: &RouteRequest,
    wanted: &Wanted,
    now: u64,
) -> Result<ProxyKey, GrantError> {
    let filters = &request.filters;
    let usable = |inner: &Inner, key: &ProxyKey| -> Result<u32, Option<u64>> {
        let Some(slot) = inner.pool.get(key) else {
            return Err(None);
        };
        if !slot.entry.leasable()
            || inner.leased.contains_key(key)
            || request.avoid.as_ref() == Some(key)
            || !matches(slot, filters)
        {
            return Err(None);
        }
        match fit_matching(inner, key, wanted, now) {
            Fit::Cooling(until_ms) => return Err(Some(until_ms)),
            Fit::Mismatch => return Err(None),
            Fit::Grant(_) => {}
        }
        let max = inner
            .shared
            .settings_of(slot.pool.as_ref())
            .and_then(|g| g.max_connections_per_proxy)
            .unwrap_or(request.max_connections);
        if inner.shared.load(key) >= max {
            return Err(None);
        }
        Ok(inner.shared.estimate(key))
    };
    let bound = wanted
        .session
        .as_ref()
        .and_then(|s| inner.sessions.proxy_of(s))
        .filter(|key| usable(inner, key).is_ok())
        .cloned();
    if let Some(key) = bound {
        return Ok(key);
    }
    // A free proxy that fits has no load and no route: none ranks before it, and
    // the longest free comes first. Only when none fits are the proxies already in
    // gateway use ranked (never a walk over the whole table under the lock).
    let mut soonest: Option<u64> = None;
    let mut free_fit = None;
    for (_, key) in free_in_scope(inner, narrowest_pool(filters)) {
        match usable(inner, key) {
            Ok(_) => {
                free_fit = Some(key);
                break;
            }
            Err(Some(until_ms)) => soonest = Some(soonest.map_or(until_ms, |s| s.min(until_ms))),
            Err(None) => {}
        }
    }
    let ranked = free_fit.is_none().then(|| inner.shared.in_use.keys());
    let mut best: Option<(u32, u64, &ProxyKey)> = free_fit.map(|key| (0, 0, key));
    for key in ranked.into_iter().flatten() {
        match usable(inner, key) {
            Ok(load) => {
                let last = inner.shared.in_use.get(key).map_or(0, |u| u.order);
                if best.is_none_or(|(l, t, _)| (load, last) < (l, t)) {
                    best = Some((load, last, key));
                }
            }
            Err(Some(until_ms)) => soonest = Some(soonest.map_or(until_ms, |s| s.min(until_ms))),
            Err(None) => {}
        }
    }
    match best {
        Some((_, _, key)) => Ok(key.clone()),
        None => Err(nothing_free(inner, filters, soonest, now)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{entry, key, store_of as store_of_entries};
    use super::*;

    fn store_of(names: &[&str]) -> LeaseStore {
        store_of_entries(names.iter().map(|name| entry(name, None)).collect())
    }

    fn route(store: &LeaseStore, session: Option<&str>) -> Result<String, GrantError> {
        store
            .route(&RouteRequest {
                filters: LeaseRequest {
                    session: session.map(str::to_string),
                    ..LeaseRequest::default()
                },
                replica: "gw-0".into(),
                avoid: None,
                max_connections: 2,
            })
            .map(|r| r.entry.key.name.to_string())
    }

    #[test]
    fn routes_rotate_share_and_keep_proxies_from_exclusive_leases_until_their_use_ends() {
        let store = store_of(&["a", "b"]);
        let first = route(&store, None).unwrap();
        let second = route(&store, None).unwrap();
        assert_ne!(first, second, "requests without a session rotate");
        // Both carry gateway traffic: no exclusive lease, not even by name.
        assert!(matches!(
            store.grant(&LeaseRequest::default()),
            Err(GrantError::NoProxy { .. })
        ));
        assert!(matches!(
            store.grant(&LeaseRequest {
                proxy: Some(key("a")),
                ..LeaseRequest::default()
            }),
            Err(GrantError::Leased { .. })
        ));
        // The bound (2) is checked against what the replicas report: both full, nothing.
        store
            .report_replica_load("gw-0", vec![(key("a"), 2), (key("b"), 2)])
            .unwrap();
        assert!(matches!(
            route(&store, None),
            Err(GrantError::NoProxy { .. })
        ));
        store
            .report_replica_load("gw-0", vec![(key("a"), 1)])
            .unwrap();
        assert_eq!(route(&store, None).unwrap(), "b", "the least loaded");
        // Routes since the report count in the ranking: a burst spreads.
        assert_eq!(route(&store, None).unwrap(), "a");
        assert_eq!(store.shared_loads()[&key("a")], 1);

        // No connection left and the hold over: back to the lease API.
        store.report_replica_load("gw-0", vec![]).unwrap();
        let later = now_ms() + SHARED_HOLD.as_millis() as u64 + 1;
        LeaseStore::expire_shared(&mut store.lock(), later);
        assert!(store.shared_loads().is_empty());
        store.grant(&LeaseRequest::default()).unwrap();
        store.grant(&LeaseRequest::default()).unwrap();
        // Both leased: the gateway never shares an exclusive lease's proxy.
        assert!(matches!(
            route(&store, None),
            Err(GrantError::NoProxy { .. })
        ));
    }

    #[test]
    fn a_session_keeps_its_proxy_and_a_silent_replica_stops_counting() {
        let store = store_of(&["a", "b", "c"]);
        let bound = route(&store, Some("s")).unwrap();
        // Routes alone do not move a session (they may have closed); a full report does.
        for _ in 0..5 {
            assert_eq!(route(&store, Some("s")).unwrap(), bound);
        }
        store
            .report_replica_load("gw-0", vec![(key(&bound), 2)])
            .unwrap();
        assert_ne!(route(&store, Some("s")).unwrap(), bound, "full: moves on");
        assert_eq!(store.shared_loads().values().sum::<u32>(), 2);
        let silent = now_ms() + REPLICA_SILENCE.as_millis() as u64 + 1;
        LeaseStore::expire_shared(&mut store.lock(), silent);
        assert_eq!(store.shared_loads().values().sum::<u32>(), 0);
    }

    #[test]
    fn a_pools_own_bound_holds_and_a_pool_of_zero_is_for_leases_only() {
        let store = store_of_entries(vec![
            entry("shared-1", Some("shared")),
            entry("shared-2", Some("shared")),
            entry("leases-only", Some("exclusive")),
        ]);
        let settings = |max| PoolGateway {
            max_connections_per_proxy: Some(max),
            block_statuses: Some(vec![451]),
            block_body_patterns: vec!["captcha".into()],
        };
        store.set_pool_gateways(vec![
            (key("shared"), settings(1)),
            (key("exclusive"), settings(0)),
        ]);
        let routed = store
            .route(&RouteRequest {
                replica: "gw-0".into(),
                max_connections: 100,
                ..RouteRequest::default()
            })
            .unwrap();
        assert_eq!(
            routed.pool.as_deref(),
            Some(&settings(1)),
            "the pool's settings"
        );
        assert!(routed.entry.key.name.starts_with("shared-"));
        // One connection each fills the pool's own bound of 1, whatever the request's default.
        store
            .report_replica_load("gw-0", vec![(key("shared-1"), 1), (key("shared-2"), 1)])
            .unwrap();
        assert!(matches!(
            route(&store, None),
            Err(GrantError::NoProxy { .. })
        ));
        // The pool kept for leases was never routed to: a lease gets it.
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        assert_eq!(&*lease.proxy.name, "leases-only");
        // Reports of a session land on its proxy; a session on none is told so.
        store.report_replica_load("gw-0", vec![]).unwrap();
        let bound = route(&store, Some("s")).unwrap();
        assert_eq!(
            store.report_session(None, "s", Outcome::Blocked, Some("shop.example")),
            Ok(Some(key(&bound)))
        );
        assert_eq!(
            store.report_session(Some("someone-else"), "s", Outcome::Blocked, None),
            Ok(None),
            "sessions are the holder's own"
        );
    }

    #[test]
    fn replica_reports_are_bounded_and_name_only_known_proxies() {
        let store = store_of(&["a"]);
        store
            .report_replica_load("gw-x", vec![(key("made-up"), 7), (key("a"), 1)])
            .unwrap();
        assert_eq!(
            store.shared_loads(),
            std::collections::HashMap::from([(key("a"), 1)])
        );
        for i in 1..MAX_REPLICAS {
            store
                .report_replica_load(&format!("gw-{i}"), vec![])
                .unwrap();
        }
        assert_eq!(
            store.report_replica_load("one-too-many", vec![]),
            Err(ReplicaError::TooManyReplicas)
        );
        // A known replica still reports.
        store.report_replica_load("gw-x", vec![]).unwrap();
    }
}
