//! Gateway metrics. Labels are fixed sets (protocol, outcome, direction), the fleet's proxies,
//! whose series go when no connection is open on them, and its pools (as the leader's route
//! names them, or `none`), so the series stay bounded by the fleet; never a client, token,
//! session or destination.

use std::collections::BTreeMap;

use prometheus::core::Collector;
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

/// Counters and gauges of the gateway.
#[derive(Clone)]
pub struct GatewayMetrics {
    pub(crate) connections: IntGaugeVec,
    pub(crate) requests: IntCounterVec,
    pub(crate) clients: IntGauge,
    bytes: IntCounterVec,
}

impl GatewayMetrics {
    /// Creates and registers the gateway metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.connections.clone()))?;
        registry.register(Box::new(metrics.requests.clone()))?;
        registry.register(Box::new(metrics.clients.clone()))?;
        registry.register(Box::new(metrics.bytes.clone()))?;
        Ok(metrics)
    }

    /// The same metrics, not exported anywhere (tests).
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(GatewayMetrics {
            connections: IntGaugeVec::new(
                Opts::new(
                    "proxy_operator_gateway_connections",
                    "Connections the gateway has open to each upstream proxy (namespace/name).",
                ),
                &["proxy"],
            )?,
            requests: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_gateway_requests_total",
                    "Client requests and tunnels through the gateway, by protocol (http, connect, socks5) and outcome (ok, blocked, upstream_failed, refused, unauthenticated, no_proxy).",
                ),
                &["protocol", "outcome"],
            )?,
            clients: IntGauge::new(
                "proxy_operator_gateway_clients",
                "Client connections open to the gateway.",
            )?,
            bytes: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_gateway_bytes_total",
                    "Bytes the gateway carried, by the upstream's ProxyPool (namespace/name, or none) and direction as the client sees it: sent (client to site, written to the upstream) or received (site to client, written to the client).",
                ),
                &["pool", "direction"],
            )?,
        })
    }

    /// Counts one finished request or tunnel.
    pub fn request(&self, protocol: Protocol, outcome: Outcome) {
        self.requests
            .with_label_values(&[protocol.label(), outcome.label()])
            .inc();
    }

    /// The byte meters of one request or tunnel through an upstream of `pool`
    /// (`namespace/name`; `None`: the upstream is in no pool).
    pub fn pool_bytes(&self, pool: Option<&str>) -> PoolBytes {
        let pool = pool.unwrap_or(NO_POOL);
        PoolBytes {
            sent: ByteMeter::new(self.bytes.with_label_values(&[pool, "sent"])),
            received: ByteMeter::new(self.bytes.with_label_values(&[pool, "received"])),
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
