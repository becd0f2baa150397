//! Lease metrics. Labels are fixed sets (reasons, outcomes) and the pools and provider instances
//! the cluster has; never a proxy, lease, session or target.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::blocks::BlockMetrics;
use super::store::{EndReason, Outcome};

/// The `pool` label of a lease on a proxy no ProxyPool made, or of a request naming no pool.
pub const NO_POOL: &str = "none";
/// The `pool` or `provider` label of a rejected request naming one the operator does not know
/// (its own value would let any crawler make new series).
pub const UNKNOWN: &str = "unknown";
/// The `provider` label of a rejected request naming no provider.
pub const ANY_PROVIDER: &str = "any";

/// Counters and gauges of the lease table.
#[derive(Clone)]
pub struct LeaseMetrics {
    pub(crate) granted: IntCounterVec,
    pub(crate) ended: IntCounterVec,
    pub(crate) rejected: IntCounterVec,
    pub(crate) reports: IntCounterVec,
    pub(crate) active: IntGaugeVec,
    pub(crate) cooling_down: IntGauge,
    pub(crate) target_cooldowns: IntGauge,
    pub(crate) sessions: IntGauge,
    /// Objects written into the cluster by the lease table's writer, by `object` (`journal`,
    /// `checkpoint`, `manifest`), and their data's bytes.
    pub(crate) table_writes: IntCounterVec,
    pub(crate) table_written_bytes: IntCounterVec,
    /// `blocked` reports by target host (bounded; the status page reads its last hour).
    pub(crate) blocks: BlockMetrics,
}

/// The labels of one set of lease series: the proxy's namespace (as
/// `support::namespace_label` bounds it), its pool (`namespace/name` or `none`) and provider.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SeriesKey {
    pub(crate) namespace: std::sync::Arc<str>,
    pub(crate) pool: String,
    pub(crate) provider: String,
}

impl SeriesKey {
    /// The labels of a proxy in `namespace`, of `pool` (its label) and `provider`.
    pub(crate) fn new(namespace: &str, pool: String, provider: &str) -> Self {
        SeriesKey {
            namespace: crate::support::namespace_label::namespace_label(namespace),
            pool,
            provider: provider.to_string(),
        }
    }
}

/// The series of one pool and provider, bound once (when the pool is read, not per lease): no
/// label hashing on the grant path.
pub(crate) struct Series {
    pub(crate) granted: IntCounter,
    pub(crate) active: IntGauge,
    pub(crate) ended: [IntCounter; EndReason::ALL.len()],
    pub(crate) reports: [IntCounter; Outcome::ALL.len()],
}

impl LeaseMetrics {
    /// Creates and registers the lease metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.granted.clone()))?;
        registry.register(Box::new(metrics.ended.clone()))?;
        registry.register(Box::new(metrics.rejected.clone()))?;
        registry.register(Box::new(metrics.reports.clone()))?;
        registry.register(Box::new(metrics.active.clone()))?;
        registry.register(Box::new(metrics.cooling_down.clone()))?;
        registry.register(Box::new(metrics.target_cooldowns.clone()))?;
        registry.register(Box::new(metrics.sessions.clone()))?;
        registry.register(Box::new(metrics.table_writes.clone()))?;
        registry.register(Box::new(metrics.table_written_bytes.clone()))?;
        metrics.blocks.register(registry)?;
        Ok(metrics)
    }

    /// The same metrics, not exported anywhere (tests and benchmarks).
    pub fn unregistered() -> prometheus::Result<Self> {
        let by_pool = ["namespace", "pool", "provider"];
        Ok(LeaseMetrics {
            granted: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_leases_granted_total",
                    "Leases granted by the discovery API, by the proxy's namespace, pool and provider instance.",
                ),
                &by_pool,
            )?,
            ended: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_leases_ended_total",
                    "Leases ended, by reason (released, expired, blocked, unhealthy, deleted), the proxy's namespace, pool and provider instance.",
                ),
                &["reason", "namespace", "pool", "provider"],
            )?,
            rejected: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_leases_rejected_total",
                    "Lease requests refused, by reason and the pool and provider instance asked for.",
                ),
                &["reason", "pool", "provider"],
            )?,
            reports: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_lease_reports_total",
                    "Crawler reports on leases, by outcome, the proxy's namespace, pool and provider instance.",
                ),
                &["outcome", "namespace", "pool", "provider"],
            )?,
            active: IntGaugeVec::new(
                Opts::new(
                    "proxy_operator_leases_active",
                    "Leases currently held by crawlers, by the proxy's namespace, pool and provider instance.",
                ),
                &by_pool,
            )?,
            cooling_down: IntGauge::new(
                "proxy_operator_proxies_cooling_down",
                "Proxies cooling down after a crawler reported them blocked (for every target).",
            )?,
            target_cooldowns: IntGauge::new(
                "proxy_operator_target_cooldowns",
                "Cooldowns of a proxy for one target host, after a blocked report naming it.",
            )?,
            sessions: IntGauge::new(
                "proxy_operator_lease_sessions",
                "Sticky sessions remembered (session key to proxy).",
            )?,
            table_writes: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_lease_table_writes_total",
                    "Objects the lease table's writer wrote into the cluster, by object (journal, checkpoint, manifest).",
                ),
                &["object"],
            )?,
            table_written_bytes: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_lease_table_written_bytes_total",
                    "Bytes of data the lease table's writer wrote into the cluster, by object (journal, checkpoint, manifest).",
                ),
                &["object"],
            )?,
            blocks: BlockMetrics::unregistered()?,
        })
    }

    /// The series of one label set, bound.
    pub(crate) fn series(&self, key: &SeriesKey) -> Series {
        let SeriesKey {
            namespace,
            pool,
            provider,
        } = key;
        let labels = [namespace.as_ref(), pool.as_str(), provider.as_str()];
        Series {
            granted: self.granted.with_label_values(&labels),
            active: self.active.with_label_values(&labels),
            ended: EndReason::ALL.map(|r| {
                self.ended
                    .with_label_values(&[r.as_str(), labels[0], labels[1], labels[2]])
            }),
            reports: Outcome::ALL.map(|o| {
                self.reports
                    .with_label_values(&[o.as_str(), labels[0], labels[1], labels[2]])
            }),
        }
    }

    /// Drops the series of a label set that no proxy or lease has any more.
    pub(crate) fn remove_series(&self, key: &SeriesKey) {
        let labels = [
            key.namespace.as_ref(),
            key.pool.as_str(),
            key.provider.as_str(),
        ];
        let _ = self.granted.remove_label_values(&labels);
        let _ = self.active.remove_label_values(&labels);
        for reason in EndReason::ALL {
            let _ =
                self.ended
                    .remove_label_values(&[reason.as_str(), labels[0], labels[1], labels[2]]);
        }
        for outcome in Outcome::ALL {
            let _ = self.reports.remove_label_values(&[
                outcome.as_str(),
                labels[0],
                labels[1],
                labels[2],
            ]);
        }
    }
}
