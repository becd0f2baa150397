//! Bounds on what clients hold open, and the count of connections on each upstream. A token is
//! kept only as its SHA-256 digest, and only while a connection with it is open.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::{IntGauge, IntGaugeVec};
use sha2::{Digest, Sha256};

use super::metrics::GatewayMetrics;

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

/// Open connections to each upstream proxy (`namespace/name`), for the leader to balance on and
/// for `proxy_operator_gateway_connections`.
pub struct UpstreamLoad {
    counts: Mutex<HashMap<String, u32>>,
    gauge: IntGaugeVec,
}

/// One open connection to an upstream; counted until dropped.
pub struct UpstreamGuard<'a> {
    load: &'a UpstreamLoad,
    proxy: String,
}

impl UpstreamLoad {
    pub fn new(metrics: &GatewayMetrics) -> Self {
        UpstreamLoad {
            counts: Mutex::new(HashMap::new()),
            gauge: metrics.connections.clone(),
        }
    }

    /// Counts a connection to `proxy` until the guard drops.
    pub fn acquire(&self, proxy: &str) -> UpstreamGuard<'_> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(proxy.to_string()).or_insert(0);
        *count += 1;
        // Set under the lock, so a series removed at 0 is never set again out of order.
        self.gauge
            .with_label_values(&[proxy])
            .set(i64::from(*count));
        UpstreamGuard {
            load: self,
            proxy: proxy.to_string(),
        }
    }

    /// `(proxy, open connections)` for every upstream with one open, by name.
    pub fn snapshot(&self) -> Vec<(String, u32)> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, u32)> = counts.iter().map(|(p, n)| (p.clone(), *n)).collect();
        all.sort();
        all
    }
}

impl Drop for UpstreamGuard<'_> {
    fn drop(&mut self) {
        let load = self.load;
        let mut counts = load.counts.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = counts.get_mut(&self.proxy) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            counts.remove(&self.proxy);
            // Gone with the last connection: series stay bounded by the fleet in use.
            let _ = load.gauge.remove_label_values(&[&self.proxy]);
        } else {
            load.gauge
                .with_label_values(&[&self.proxy])
                .set(i64::from(*count));
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn upstream_counts_and_series_go_at_zero() {
        let metrics = GatewayMetrics::unregistered().unwrap();
        let load = UpstreamLoad::new(&metrics);
        let a = load.acquire("ns/a");
        let a2 = load.acquire("ns/a");
        let b = load.acquire("ns/b");
        assert_eq!(
            load.snapshot(),
            [("ns/a".to_string(), 2), ("ns/b".to_string(), 1)]
        );
        assert_eq!(metrics.connections.with_label_values(&["ns/a"]).get(), 2);
        drop((a, b));
        assert_eq!(load.snapshot(), [("ns/a".to_string(), 1)]);
        let families = metrics.connections.collect();
        assert_eq!(families[0].get_metric().len(), 1, "ns/b's series is gone");
        drop(a2);
        assert!(load.snapshot().is_empty());
        assert!(metrics.connections.collect()[0].get_metric().is_empty());
    }
}
