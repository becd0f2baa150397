//! Bounds on what clients hold open, and the count of connections on each upstream. A token is
//! kept only as its SHA-256 digest, and only while a connection with it is open.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::IntGauge;
use sha2::{Digest, Sha256};

use super::bytes::NO_POOL;
use super::metrics::{GatewayMetrics, UpstreamCounts};

/// Open client connections: those still in their handshake (no token presented yet) in a
/// room of their own, then those with a token, in all and per token.
pub struct ClientLoad {
    max_total: usize,
    max_per_token: u32,
    max_handshaking: usize,
    handshaking: AtomicUsize,
    open: AtomicUsize,
    per_token: Mutex<HashMap<[u8; 32], u32>>,
    gauge: IntGauge,
}

/// One client connection that has not presented its token yet; counted until dropped.
pub struct HandshakePermit<'a> {
    load: &'a ClientLoad,
}

/// One open client connection; counted until dropped.
pub struct ClientPermit<'a> {
    load: &'a ClientLoad,
}

/// One open client connection with a token; counted until dropped.
pub struct TokenPermit<'a> {
    load: &'a ClientLoad,
    digest: [u8; 32],
}

impl ClientLoad {
    pub fn new(
        max_total: usize,
        max_per_token: u32,
        max_handshaking: usize,
        metrics: &GatewayMetrics,
    ) -> Self {
        ClientLoad {
            max_total,
            max_per_token,
            max_handshaking,
            handshaking: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            per_token: Mutex::new(HashMap::new()),
            gauge: metrics.clients.clone(),
        }
    }

    /// A connection just accepted, until it presents its token (its request head, its SOCKS5
    /// login), or `None` when `max_handshaking` are that far: a client that never finishes its
    /// handshake holds a place of this smaller room, never one of `max_total`.
    pub fn handshake(&self) -> Option<HandshakePermit<'_>> {
        self.handshaking
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_handshaking).then_some(n + 1)
            })
            .ok()?;
        Some(HandshakePermit { load: self })
    }

    /// Connections in their handshake now.
    pub fn handshaking(&self) -> usize {
        self.handshaking.load(Ordering::Acquire)
    }

    /// A client connection that presented its token, or `None` when `max_total` are open.
    pub fn connect(&self) -> Option<ClientPermit<'_>> {
        let counted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_total).then_some(n + 1)
            });
        counted.ok()?;
        self.gauge.inc();
        Some(ClientPermit { load: self })
    }

    /// The connection's token, or `None` when `max_per_token` connections with it are open.
    pub fn token(&self, token: &str) -> Option<TokenPermit<'_>> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut map = self.per_token.lock().unwrap_or_else(|e| e.into_inner());
        let count = map.entry(digest).or_insert(0);
        if *count >= self.max_per_token {
            if *count == 0 {
                map.remove(&digest);
            }
            return None;
        }
        *count += 1;
        Some(TokenPermit { load: self, digest })
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Tokens with a connection open now.
    pub fn tokens(&self) -> usize {
        self.per_token
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl Drop for HandshakePermit<'_> {
    fn drop(&mut self) {
        self.load.handshaking.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ClientPermit<'_> {
    fn drop(&mut self) {
        self.load.open.fetch_sub(1, Ordering::AcqRel);
        self.load.gauge.dec();
    }
}

impl Drop for TokenPermit<'_> {
    fn drop(&mut self) {
        let mut map = self
            .load
            .per_token
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = map.get_mut(&self.digest) {
            *count -= 1;
            if *count == 0 {
                map.remove(&self.digest);
            }
        }
    }
}

/// Open connections to each upstream proxy (`namespace/name`), for the leader to balance on;
/// the metrics sum them per pool when scraped (`proxy_operator_gateway_connections{pool}` and
/// its two siblings), so no series names a proxy.
pub struct UpstreamLoad {
    counts: UpstreamCounts,
}

/// One open connection to an upstream; counted until dropped.
pub struct UpstreamGuard<'a> {
    load: &'a UpstreamLoad,
    proxy: String,
}

impl UpstreamLoad {
    pub fn new(metrics: &GatewayMetrics) -> Self {
        UpstreamLoad {
            counts: metrics.upstreams.counts.clone(),
        }
    }

    /// Counts a connection to `proxy` of `pool` (`namespace/name`; `None`: in no pool) until
    /// the guard drops.
    pub fn acquire(&self, proxy: &str, pool: Option<&str>) -> UpstreamGuard<'_> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let entry = counts
            .entry(proxy.to_string())
            .or_insert_with(|| (pool.unwrap_or(NO_POOL).to_string(), 0));
        entry.1 += 1;
        UpstreamGuard {
            load: self,
            proxy: proxy.to_string(),
        }
    }

    /// `(proxy, open connections)` for every upstream with one open, by name.
    pub fn snapshot(&self) -> Vec<(String, u32)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, u32)> =
            counts.iter().map(|(p, (_, n))| (p.clone(), *n)).collect();
        all.sort();
        all
    }
}

impl Drop for UpstreamGuard<'_> {
    fn drop(&mut self) {
        let mut counts = self.load.counts.lock().unwrap_or_else(|e| e.into_inner());
        let Some((_, count)) = counts.get_mut(&self.proxy) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            // Gone with the last connection: the map holds only the proxies in use.
            counts.remove(&self.proxy);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use prometheus::core::Collector;

    #[test]
    fn client_bounds_in_all_and_per_token() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = ClientLoad::new(3, 2, 1, &metrics);
        let a = load.connect().unwrap();
        let b = load.connect().unwrap();
        let c = load.connect().unwrap();
        assert!(load.connect().is_none(), "a fourth is over the total");
        assert_eq!(metrics.clients.get(), 3);
        drop(c);
        assert!(load.connect().is_some());
        let t1 = load.token("secret").unwrap();
        let t2 = load.token("secret").unwrap();
        assert!(load.token("secret").is_none(), "a third with one token");
        assert!(
            load.token("other").is_some(),
            "another token has its own bound"
        );
        drop(t1);
        let t3 = load.token("secret").unwrap();
        drop((t2, t3));
        assert_eq!(load.tokens(), 0, "no digest outlives its connections");
        drop((a, b));
        assert_eq!(load.open(), 0);
        assert_eq!(metrics.clients.get(), 0);
    }

    /// Connections still in their handshake have a room of their own: filling it leaves every
    /// place of the total to clients that presented a token (docs/security.md, "The gateway").
    #[test]
    fn handshakes_have_a_smaller_room_of_their_own() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = ClientLoad::new(3, 3, 2, &metrics);
        let h1 = load.handshake().unwrap();
        let h2 = load.handshake().unwrap();
        assert!(
            load.handshake().is_none(),
            "a third handshake is over its room"
        );
        assert_eq!(load.handshaking(), 2);
        // Nothing of the total is taken by them.
        assert_eq!(load.open(), 0);
        let clients: Vec<_> = (0..3).map(|_| load.connect().unwrap()).collect();
        assert!(load.connect().is_none());
        // A handshake that ends gives its place back.
        drop(h1);
        let h3 = load.handshake().unwrap();
        drop((h2, h3, clients));
        assert_eq!((load.handshaking(), load.open()), (0, 0));
    }

    #[test]
    fn a_zero_per_token_bound_refuses_and_keeps_nothing() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = ClientLoad::new(10, 0, 1, &metrics);
        assert!(load.token("t").is_none());
        assert_eq!(load.tokens(), 0);
    }

    /// (pool, connections, proxies in use, busiest) as /metrics reads them.
    fn pool_series(metrics: &GatewayMetrics) -> Vec<(String, i64, i64, i64)> {
        let families = metrics.upstreams.collect();
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        assert_eq!(
            names,
            [
                "proxy_operator_gateway_connections",
                "proxy_operator_gateway_proxies_in_use",
                "proxy_operator_gateway_proxy_connections_max"
            ]
        );
        // Each family's values by pool.
        let by_pool = |family: usize| -> BTreeMap<String, i64> {
            families[family]
                .get_metric()
                .iter()
                .map(|m| {
                    let pool = crate::support::metric_samples::label_value(m, "pool");
                    (pool, m.get_gauge().get_value() as i64)
                })
                .collect()
        };
        let (connections, in_use, busiest) = (by_pool(0), by_pool(1), by_pool(2));
        assert_eq!(connections.len(), in_use.len());
        assert_eq!(connections.len(), busiest.len());
        connections
            .into_iter()
            .map(|(pool, n)| (pool.clone(), n, in_use[&pool], busiest[&pool]))
            .collect()
    }
    #[test]
    fn upstream_counts_per_proxy_and_series_per_pool_that_go_at_zero() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = UpstreamLoad::new(&metrics);
        let a = load.acquire("ns/a", Some("ns/crawl"));
        let a2 = load.acquire("ns/a", Some("ns/crawl"));
        let b = load.acquire("ns/b", Some("ns/crawl"));
        let c = load.acquire("ns/c", None);
        assert_eq!(
            load.snapshot(),
            [
                ("ns/a".to_string(), 2),
                ("ns/b".to_string(), 1),
                ("ns/c".to_string(), 1)
            ]
        );
        assert_eq!(
            pool_series(&metrics),
            [
                ("none".to_string(), 1, 1, 1),
                ("ns/crawl".to_string(), 3, 2, 2)
            ]
        );
        drop((a, b, c));
        assert_eq!(load.snapshot(), [("ns/a".to_string(), 1)]);
        assert_eq!(
            pool_series(&metrics),
            [("ns/crawl".to_string(), 1, 1, 1)],
            "the pool `none` has no series once its last connection closed"
        );
        drop(a2);
        assert!(load.snapshot().is_empty());
        assert!(pool_series(&metrics).is_empty());
    }

    /// 10 000 proxies in use (a fleet's worth) make one series per family for their pool.
    #[test]
    fn a_fleet_of_proxies_makes_series_per_pool_not_per_proxy() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = UpstreamLoad::new(&metrics);
        let names: Vec<String> = (0..10_000).map(|i| format!("ns/p{i}")).collect();
        let guards: Vec<_> = names
            .iter()
            .map(|p| load.acquire(p, Some("ns/crawl")))
            .collect();
        let busiest = load.acquire("ns/p7", Some("ns/crawl"));
        assert_eq!(
            pool_series(&metrics),
            [("ns/crawl".to_string(), 10_001, 10_000, 2)]
        );
        drop((guards, busiest));
        assert!(pool_series(&metrics).is_empty());
    }
}
