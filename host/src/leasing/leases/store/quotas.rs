//! The namespaces' `leases` and `gatewayConnections` bounds (ProxyQuota, docs/tenancy.md
//! "Quotas per team"), as the leader last read them, and the counts they are checked against
//! (the checks on the table are in `quota_checks.rs`).
//!
//! A lease counts against the namespace of its proxy (a pool's proxies are in the pool's
//! namespace): that is what the table knows for every lease, whoever holds it. A grant that
//! would pass the bound is refused; a renewal or a session's join never is. The check runs on
//! the proxy a grant picked, which is inside the caller's reach by then: a refusal never tells
//! a caller anything of a namespace it may not lease from.

use std::sync::Arc;

use super::keys::{FastMap, ProxyKey};
use super::requests::GrantError;
use crate::api::Bound;

/// The bounds of every namespace that has one, and the leases held per namespace.
#[derive(Default)]
pub(super) struct Quotas {
    /// Bounds by namespace, kept across terms (the leader's quota task sets them every few
    /// seconds).
    pub(super) bounds: FastMap<Arc<str>, NamespaceBounds>,
    /// Live leases per namespace of their proxy, kept with every grant and end.
    pub(super) held: FastMap<Arc<str>, u32>,
}

/// A namespace's tightest bounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceBounds {
    pub leases: Option<Bound>,
    pub gateway_connections: Option<Bound>,
}

/// Whether one more lease fits under `bound` with `held` already held: the refusal names the
/// quota, the use and the limit.
pub fn lease_fits(bound: Option<&Bound>, held: u32) -> Result<(), GrantError> {
    match bound {
        Some(bound) if held >= bound.limit => Err(GrantError::QuotaExceeded(bound.refusal(held))),
        _ => Ok(()),
    }
}

/// Whether one more gateway connection fits under `bound` with `open` already open.
pub fn connection_fits(bound: Option<&Bound>, open: u32) -> Result<(), GrantError> {
    lease_fits(bound, open)
}

impl Quotas {
    pub(super) fn held(&self, namespace: &str) -> u32 {
        self.held.get(namespace).copied().unwrap_or(0)
    }

    /// One more (or one less) lease on `proxy`.
    pub(super) fn count(&mut self, proxy: &ProxyKey, up: bool) {
        if up {
            *self.held.entry(proxy.namespace.clone()).or_insert(0) += 1;
        } else if let Some(n) = self.held.get_mut(&*proxy.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(&*proxy.namespace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(limit: u32) -> Bound {
        Bound {
            quota: "team-a/q1".into(),
            field: "leases".into(),
            limit,
        }
    }

    #[test]
    fn a_lease_fits_below_the_bound_and_the_refusal_names_quota_use_and_limit() {
        // (bound, held, refusal)
        let cases = [
            (None, 1000, None),
            (Some(bound(5)), 0, None),
            (Some(bound(5)), 4, None),
            (
                Some(bound(5)),
                5,
                Some("ProxyQuota team-a/q1: leases 5/5 in use"),
            ),
            // A quota lowered below the use: still refused, saying so.
            (
                Some(bound(2)),
                5,
                Some("ProxyQuota team-a/q1: leases 5/2 in use"),
            ),
            (
                Some(bound(0)),
                0,
                Some("ProxyQuota team-a/q1: leases 0/0 in use"),
            ),
        ];
        for (bound, held, refusal) in cases {
            let got = lease_fits(bound.as_ref(), held);
            let want = refusal.map(|r| GrantError::QuotaExceeded(r.to_string()));
            assert_eq!(got, want.map_or(Ok(()), Err), "{bound:?} with {held} held");
        }
    }

    #[test]
    fn the_held_count_follows_grants_and_ends_per_namespace() {
        let mut quotas = Quotas::default();
        let a = ProxyKey {
            namespace: "team-a".into(),
            name: "p1".into(),
        };
        let b = ProxyKey {
            namespace: "team-b".into(),
            name: "p1".into(),
        };
        quotas.count(&a, true);
        quotas.count(&a, true);
        quotas.count(&b, true);
        quotas.count(&a, false);
        assert_eq!((quotas.held("team-a"), quotas.held("team-b")), (1, 1));
        quotas.count(&b, false);
        quotas.count(&b, false);
        assert_eq!(quotas.held("team-b"), 0);
        assert!(!quotas.held.contains_key("team-b"), "no empty entries kept");
    }
}
