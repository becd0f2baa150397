//! What a crawler may lease from, decided (by RBAC, or the static token's pools) for everything
//! its request names before the table is asked anything (docs/security.md, "What one team can
//! learn of another"). The table looks only inside it: a proxy outside a request's reach is
//! neither granted, joined, routed to nor described, and every refusal about it is the one a
//! proxy that does not exist gets.

use std::sync::Arc;

use super::keys::{PoolKey, ProxyKey};

/// The proxies a request may lease from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Reach {
    /// The proxies of one ProxyPool (`create` on `proxypools/lease` named for it).
    Pool(PoolKey),
    /// Every proxy of one namespace, pooled or not (the right for every pool of it).
    Namespace(Arc<str>),
    /// Every proxy: a cluster-wide right, or the static token without
    /// `--discovery-token-pools`. The default of a [`LeaseRequest`](super::LeaseRequest) made
    /// in code (tests, benchmarks); the discovery API always sets the caller's own.
    #[default]
    Everywhere,
    /// No proxy: a request of the discovery API before its caller is authorized (so one that
    /// skipped it is granted nothing).
    Nowhere,
}

impl Reach {
    /// Whether the proxy `proxy` of the pool `pool` (in its namespace) is inside.
    pub fn covers(&self, proxy: &ProxyKey, pool: Option<&PoolKey>) -> bool {
        match self {
            Reach::Pool(reach) => pool == Some(reach),
            Reach::Namespace(namespace) => *proxy.namespace == **namespace,
            Reach::Everywhere => true,
            Reach::Nowhere => false,
        }
    }

    /// Whether every proxy of `pool` is inside.
    pub fn covers_pool(&self, pool: &PoolKey) -> bool {
        match self {
            Reach::Pool(reach) => reach == pool,
            Reach::Namespace(namespace) => *pool.namespace == **namespace,
            Reach::Everywhere => true,
            Reach::Nowhere => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, name: &str) -> ProxyKey {
        ProxyKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_reach_covers_its_pool_its_namespace_or_everything() {
        let (pool_a, pool_b) = (key("team-a", "pool-a"), key("team-b", "pool-b"));
        let a_pooled = (key("team-a", "px-a"), Some(&pool_a));
        let a_loose = (key("team-a", "loose"), None);
        let b_pooled = (key("team-b", "px-b"), Some(&pool_b));
        let reaches = [
            Reach::Pool(pool_b.clone()),
            Reach::Namespace("team-b".into()),
            Reach::Everywhere,
            Reach::Nowhere,
        ];
        // (reach, a's pooled proxy, a's loose one, b's pooled one, pool a, pool b)
        let expected = [
            [false, false, true, false, true],
            [false, false, true, false, true],
            [true, true, true, true, true],
            [false, false, false, false, false],
        ];
        for (reach, want) in reaches.iter().zip(expected) {
            let got = [
                reach.covers(&a_pooled.0, a_pooled.1),
                reach.covers(&a_loose.0, a_loose.1),
                reach.covers(&b_pooled.0, b_pooled.1),
                reach.covers_pool(&pool_a),
                reach.covers_pool(&pool_b),
            ];
            assert_eq!(got, want, "{reach:?}");
        }
        // A proxy named like the pool, in no pool, is not the pool's.
        assert!(!Reach::Pool(pool_b.clone()).covers(&key("team-b", "pool-b"), None));
    }
}
