//! Bytes the gateway carried per pool, as its replicas report them with their loads (what each
//! counted since its previous report): the leader's running total for the status page. Soft
//! state like the rest of the gateway's use: it starts again at zero with a new leader, and a
//! report the leader took but whose answer was lost is counted again by the replica's next.
//! The counter to bill from is each replica's `proxy_operator_gateway_bytes_total`.

use super::shared_use::{NO_POOL, PoolTraffic};
use super::{LeaseStore, PoolKey};

impl LeaseStore {
    /// Adds a replica's bytes since its last report: `None` is [`NO_POOL`]. Only pools the
    /// table knows (a report cannot make the leader hold made-up keys).
    pub fn add_gateway_bytes(&self, bytes: Vec<(Option<PoolKey>, PoolTraffic)>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        for (pool, traffic) in bytes {
            let name = match &pool {
                Some(key) if inner.is_known(key) => key.to_string(),
                Some(_) => continue,
                None => NO_POOL.to_string(),
            };
            let total = inner.shared.bytes.entry(name).or_default();
            total.sent = total.sent.saturating_add(traffic.sent);
            total.received = total.received.saturating_add(traffic.received);
        }
    }

    /// The bytes the gateway carried per pool since this leader started, by pool name.
    pub fn gateway_bytes(&self) -> Vec<(String, PoolTraffic)> {
        let inner = self.lock();
        inner
            .shared
            .bytes
            .iter()
            .map(|(pool, traffic)| (pool.clone(), traffic.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{entry, key, store_of};
    use super::*;

    fn traffic(sent: u64, received: u64) -> PoolTraffic {
        PoolTraffic { sent, received }
    }

    #[test]
    fn reports_add_up_per_known_pool_and_unknown_pools_are_dropped() {
        let store = store_of(vec![entry("a", Some("egress"))]);
        let egress = PoolKey {
            namespace: key("a").namespace,
            name: "egress".into(),
        };
        let made_up = PoolKey {
            namespace: "x".into(),
            name: "made-up".into(),
        };
        store.add_gateway_bytes(vec![
            (Some(egress.clone()), traffic(100, 2000)),
            (None, traffic(1, 2)),
            (Some(made_up), traffic(5, 5)),
        ]);
        store.add_gateway_bytes(vec![(Some(egress.clone()), traffic(10, 20))]);
        assert_eq!(
            store.gateway_bytes(),
            vec![
                (NO_POOL.to_string(), traffic(1, 2)),
                (egress.to_string(), traffic(110, 2020)),
            ]
        );
    }
}
