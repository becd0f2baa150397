//! Gateway metrics. Labels are fixed sets (protocol, outcome, direction) and the fleet's pools
//! (as the leader's route names them, or `none`), so the series stay bounded by the pools, not
//! the proxies; never a proxy, client, token, session or destination. The load on upstream
//! proxies is summed per pool at scrape time (connections, proxies in use, the busiest one's
//! connections), and a pool's series go when no connection is open on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::bytes::{ByteMeter, NO_POOL, PoolBytes};

/// How a client spoke to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// A plain request in absolute form (`GET http://…`).
    Http,
    /// An HTTP `CONNECT` tunnel.
    Connect,
    Socks5,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Connect => "connect",
            Protocol::Socks5 => "socks5",
        }
    }
}

/// How a client's request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Carried (whatever the destination answered, but a block status).
    Ok,
    /// The destination answered one of the route's block statuses.
    Blocked,
    /// The upstream (and the one tried after it) failed.
    UpstreamFailed,
    /// Refused by the gateway: bad request, policy, a bound, `Forbidden`, an upstream's ACL.
    Refused,
    /// No or a bad token, or a malformed username.
    Unauthenticated,
    /// No upstream to carry it (`NoProxy`, `Unavailable`).
    NoProxy,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Blocked => "blocked",
            Outcome::UpstreamFailed => "upstream_failed",
            Outcome::Refused => "refused",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::NoProxy => "no_proxy",
        }
    }
}

/// Open connections per upstream proxy (`namespace/name`): its pool's label and the count.
/// Shared by the gateway's [`super::load::UpstreamLoad`] and read at scrape time.
pub(crate) type UpstreamCounts = Arc<Mutex<HashMap<String, (String, u32)>>>;

/// The per-pool load families, computed from [`UpstreamCounts`] when Prometheus asks.
#[derive(Clone)]
pub(crate) struct UpstreamGauges {
    pub(crate) counts: UpstreamCounts,
    templates: [IntGaugeVec; 3],
}

fn upstream_gauges() -> prometheus::Result<[IntGaugeVec; 3]> {
    let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["pool"]);
    Ok([
        gauge(
            "proxy_operator_gateway_connections",
            "Connections the gateway has open to the upstream proxies of each pool (namespace/name, or none).",
        )?,
        gauge(
            "proxy_operator_gateway_proxies_in_use",
            "Upstream proxies of each pool with at least one gateway connection open.",
        )?,
        gauge(
            "proxy_operator_gateway_proxy_connections_max",
            "Connections open to the busiest upstream proxy of each pool.",
        )?,
    ])
}

/// Per pool: (connections, proxies in use, the most on one proxy).
pub(crate) fn pool_load(counts: &HashMap<String, (String, u32)>) -> BTreeMap<String, [u32; 3]> {
    let mut pools: BTreeMap<String, [u32; 3]> = BTreeMap::new();
    for (pool, count) in counts.values().filter(|(_, n)| *n > 0) {
        let entry = pools.entry(pool.clone()).or_default();
        entry[0] += count;
        entry[1] += 1;
        entry[2] = entry[2].max(*count);
    }
    pools
}

impl Collector for UpstreamGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.templates.iter().flat_map(|g| g.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(gauges) = upstream_gauges() else {
            return Vec::new();
        };
        let load = pool_load(&self.counts.lock().unwrap_or_else(|e| e.into_inner()));
        for (pool, figures) in load {
            for (gauge, value) in gauges.iter().zip(figures) {
                gauge.with_label_values(&[&pool]).set(i64::from(value));
            }
        }
        gauges.iter().flat_map(|g| g.collect()).collect()
    }
}

/// Counters and gauges of the gateway.
#[derive(Clone)]
pub struct GatewayMetrics {
    pub(crate) upstreams: UpstreamGauges,
    pub(crate) requests: IntCounterVec,
    pub(crate) clients: IntGauge,
    bytes: IntCounterVec,
}

impl GatewayMetrics {
    /// Creates and registers the gateway metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.upstreams.clone()))?;
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.clients.clone()))?;
        registry.register(Box::new(metrics.bytes.clone()))?;
        Ok(metrics)
    }

    /// The same metrics, not exported anywhere (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(GatewayMetrics {
            upstreams: UpstreamGauges {
                counts: UpstreamCounts::default(),
                templates: upstream_gauges()?,
            },
            requests: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_gateway_requests_total",
                    "Client requests and tunnels through the gateway, by protocol (http, connect, socks5), outcome (ok, blocked, upstream_failed, refused, unauthenticated, no_proxy), and the ProxyPool (namespace/name) and namespace of the proxy it was routed to (none: not routed, or a proxy of no pool).",
                ),
                &["protocol", "outcome", "namespace", "pool"],
            )?,
            clients: IntGauge::new(
                "proxy_operator_gateway_clients",
                "Client connections open to the gateway.",
            )?,
            bytes: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_gateway_bytes_total",
                    "Bytes the gateway carried, by the upstream's ProxyPool (namespace/name, or none), its namespace (the team to bill; none) and direction as the client sees it: sent (client to site, written to the upstream) or received (site to client, written to the client).",
                ),
                &["namespace", "pool", "direction"],
            )?,
        })
    }

    /// Counts one finished request or tunnel, routed to a proxy of `pool` (`namespace/name`;
    /// `None`: not routed, or to a proxy of no pool).
    pub fn request(&self, protocol: Protocol, outcome: Outcome, pool: Option<&str>) {
        let namespace = pool_namespace(pool);
        let pool = pool.unwrap_or(NO_POOL);
        self.requests
            .with_label_values(&[protocol.label(), outcome.label(), &namespace, pool])
            .inc();
    }

    /// The byte meters of one request or tunnel through an upstream of `pool`
    /// (`namespace/name`; `None`: the upstream is in no pool).
    pub fn pool_bytes(&self, pool: Option<&str>) -> PoolBytes {
        let namespace = pool
            .and_then(crate::support::namespace_label::namespace_of)
            .map_or_else(
                || NO_POOL.into(),
                crate::support::namespace_label::namespace_label,
            );
        let pool = pool.unwrap_or(NO_POOL);
        let meter = |direction| {
            ByteMeter::new(
                self.bytes
                    .with_label_values(&[namespace.as_ref(), pool, direction]),
            )
        };
        PoolBytes {
            sent: meter("sent"),
            received: meter("received"),
        }
    }

    /// Bytes counted so far per pool: (sent, received).
    pub fn bytes_by_pool(&self) -> BTreeMap<String, (u64, u64)> {
        let mut totals: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for family in self.bytes.collect() {
            for metric in family.get_metric() {
                let label = |name: &str| crate::support::metric_samples::label_value(metric, name);
                let value = metric.get_counter().get_value() as u64;
                let entry = totals.entry(label("pool")).or_default();
                match label("direction").as_str() {
                    "sent" => entry.0 += value,
                    _ => entry.1 += value,
                }
            }
        }
        totals
    }
}

/// The `namespace` label of a pool's series: the team its use is billed to (bounded).
fn pool_namespace(pool: Option<&str>) -> std::sync::Arc<str> {
    pool.and_then(crate::support::namespace_label::namespace_of)
        .map_or_else(
            || NO_POOL.into(),
            crate::support::namespace_label::namespace_label,
        )
}
