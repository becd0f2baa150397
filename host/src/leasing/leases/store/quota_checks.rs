//! The lease table's ProxyQuota checks (the bounds and counts are in `quotas.rs`): a new lease
//! past the namespace's `leases`, a new gateway route past its `gatewayConnections`.

use std::sync::Arc;

use super::keys::{FastMap, ProxyKey};
use super::quotas::{NamespaceBounds, connection_fits, lease_fits};
use super::{GrantError, Inner, LeaseStore};

impl Inner {
    /// Refuses a new lease on `proxy` when its namespace holds as many as its quota allows.
    pub(super) fn check_lease_quota(&self, proxy: &ProxyKey) -> Result<(), GrantError> {
        let Some(bounds) = self.quotas.bounds.get(&*proxy.namespace) else {
            return Ok(());
        };
        lease_fits(bounds.leases.as_ref(), self.quotas.held(&proxy.namespace))
    }

    /// Refuses a new gateway route to `proxy` when its namespace has as many gateway
    /// connections open (as the replicas reported them, plus routes since) as its quota allows.
    /// Only a namespace with that bound pays for the count.
    pub(super) fn check_connection_quota(&self, proxy: &ProxyKey) -> Result<(), GrantError> {
        let Some(bound) = self
            .quotas
            .bounds
            .get(&*proxy.namespace)
            .and_then(|b| b.gateway_connections.as_ref())
        else {
            return Ok(());
        };
        let open = self
            .shared
            .in_use
            .keys()
            .filter(|k| k.namespace == proxy.namespace)
            .map(|k| self.shared.estimate(k))
            .sum();
        connection_fits(Some(bound), open)
    }
}

impl LeaseStore {
    /// Sets every namespace's bounds (a namespace not named has none), from the leader's quota
    /// task.
    pub fn set_quota_bounds(&self, bounds: Vec<(String, NamespaceBounds)>) {
        let mut inner = self.lock();
        inner.quotas.bounds = bounds
            .into_iter()
            .map(|(namespace, b)| (Arc::from(namespace), b))
            .collect();
    }

    /// Leases held now per namespace of their proxy (for the quotas' status).
    pub fn leases_by_namespace(&self) -> FastMap<Arc<str>, u32> {
        self.lock().quotas.held.clone()
    }

    /// Gateway connections open per namespace of their proxy, as the replicas last reported
    /// them (for the quotas' status).
    pub fn gateway_connections_by_namespace(&self) -> FastMap<Arc<str>, u32> {
        let inner = self.lock();
        let mut open: FastMap<Arc<str>, u32> = FastMap::default();
        for key in inner.shared.in_use.keys() {
            let load = inner.shared.load(key);
            if load > 0 {
                *open.entry(key.namespace.clone()).or_insert(0) += load;
            }
        }
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Bound;

    /// The store tests' `entry`, in `namespace`.
    fn proxy(namespace: &str, name: &str) -> super::super::ProvisionedProxy {
        super::super::ProvisionedProxy {
            key: ProxyKey {
                namespace: namespace.into(),
                name: name.into(),
            },
            ..super::super::tests::entry(name, None)
        }
    }

    /// Through the table's own grant, renew, join and release: the bound counts the
    /// namespace's live leases, refuses only new ones, and frees with a release.
    #[test]
    fn the_table_refuses_a_new_lease_past_the_namespaces_bound_and_nothing_else() {
        use super::super::{LeaseOptions, LeaseRequest, Snapshot};
        let store = LeaseStore::new(
            LeaseOptions::default(),
            crate::leasing::leases::metrics::LeaseMetrics::unregistered().unwrap(),
            None,
        );
        store.restore(Snapshot::default());
        let pooled = |name: &str| super::super::ProvisionedProxy {
            pool: Some("pa".into()),
            ..proxy("team-a", name)
        };
        store.set_provisioned(vec![
            pooled("a1"),
            pooled("a2"),
            pooled("a3"),
            proxy("team-b", "b1"),
        ]);
        let bounds = NamespaceBounds {
            leases: Some(Bound {
                quota: "team-a/q1".into(),
                field: "leases".into(),
                limit: 2,
            }),
            gateway_connections: None,
        };
        store.set_quota_bounds(vec![("team-a".into(), bounds)]);
        let in_ns = |namespace: &str, session: Option<&str>| LeaseRequest {
            reach: super::super::Reach::Namespace(namespace.into()),
            session: session.map(str::to_string),
            ..Default::default()
        };
        let first = store.grant_or_join(&in_ns("team-a", Some("s"))).unwrap();
        store.grant(&in_ns("team-a", None)).unwrap();
        let refused = store.grant(&in_ns("team-a", None)).unwrap_err();
        assert_eq!(
            refused,
            GrantError::QuotaExceeded("ProxyQuota team-a/q1: leases 2/2 in use".into())
        );
        // Another namespace, a renewal and the session's own lease are not refused.
        store.grant(&in_ns("team-b", None)).unwrap();
        store.renew(&first.lease.id, None).unwrap();
        let joined = store.grant_or_join(&in_ns("team-a", Some("s"))).unwrap();
        assert!(joined.joined && joined.lease.id == first.lease.id);
        let held = store.leases_by_namespace();
        assert_eq!((held["team-a"], held["team-b"]), (2, 1));
        // A caller outside team-a learns nothing of its quota: the answer of a pool it may not
        // lease from, or of a proxy that does not exist.
        let outside = |pool: Option<&str>, proxy: Option<&str>| LeaseRequest {
            reach: super::super::Reach::Namespace("team-b".into()),
            pool: pool.map(|name| super::super::PoolKey {
                namespace: "team-a".into(),
                name: name.into(),
            }),
            proxy: proxy.map(|name| ProxyKey {
                namespace: "team-a".into(),
                name: name.into(),
            }),
            ..Default::default()
        };
        assert_eq!(
            store.grant(&outside(Some("pa"), None)).unwrap_err(),
            GrantError::UnknownPool
        );
        assert_eq!(
            store.grant(&outside(None, Some("a3"))).unwrap_err(),
            GrantError::UnknownProxy
        );
        // A release makes room again.
        store.release(&first.lease.id).unwrap();
        store.grant(&in_ns("team-a", None)).unwrap();
        assert!(store.grant(&in_ns("team-a", None)).is_err());
        // A new term keeps the bounds; the counts come back with the restored leases.
        let snapshot = store.snapshot().expect("a restored table has a snapshot");
        store.close();
        store.restore(snapshot);
        store.set_provisioned(vec![
            proxy("team-a", "a1"),
            proxy("team-a", "a2"),
            proxy("team-a", "a3"),
        ]);
        assert_eq!(store.leases_by_namespace()["team-a"], 2);
        assert!(matches!(
            store.grant(&in_ns("team-a", None)),
            Err(GrantError::QuotaExceeded(_))
        ));
    }

    /// A gateway route counts against `gatewayConnections` with the connections the replicas
    /// reported and the routes handed out since; another namespace is not bounded by it.
    #[test]
    fn a_route_past_the_namespaces_gateway_connections_is_refused() {
        use super::super::shared::RouteRequest;
        use super::super::{LeaseOptions, LeaseRequest, Snapshot};
        let store = LeaseStore::new(
            LeaseOptions::default(),
            crate::leasing::leases::metrics::LeaseMetrics::unregistered().unwrap(),
            None,
        );
        store.restore(Snapshot::default());
        store.set_provisioned(vec![proxy("team-a", "a1"), proxy("team-b", "b1")]);
        let bound = Bound {
            quota: "team-a/q1".into(),
            field: "gatewayConnections".into(),
            limit: 2,
        };
        let bounds = NamespaceBounds {
            leases: None,
            gateway_connections: Some(bound),
        };
        store.set_quota_bounds(vec![("team-a".into(), bounds)]);
        let route = |namespace: &str| {
            store.route(&RouteRequest {
                filters: LeaseRequest {
                    reach: super::super::Reach::Namespace(namespace.into()),
                    ..Default::default()
                },
                replica: "gw-1".into(),
                avoid: None,
                max_connections: 100,
            })
        };
        route("team-a").unwrap();
        route("team-a").unwrap();
        let refused = route("team-a").unwrap_err();
        assert_eq!(
            refused,
            GrantError::QuotaExceeded("ProxyQuota team-a/q1: gatewayConnections 2/2 in use".into())
        );
        route("team-b").unwrap();
        // The replica reports one connection left open: room for one more.
        let a1 = ProxyKey {
            namespace: "team-a".into(),
            name: "a1".into(),
        };
        store.report_replica_load("gw-1", vec![(a1, 1)]).unwrap();
        route("team-a").unwrap();
        assert!(route("team-a").is_err());
        assert_eq!(store.gateway_connections_by_namespace()["team-a"], 1);
    }
}
