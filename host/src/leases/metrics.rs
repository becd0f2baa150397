//! Lease metrics. Labels are fixed sets (reasons, outcomes); never a proxy or lease name.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::store::{EndReason, Outcome};

/// Counters and gauges of the lease table.
#[derive(Clone)]
pub struct LeaseMetrics {
    pub(crate) granted: IntCounter,
    pub(crate) ended: IntCounterVec,
    pub(crate) rejected: IntCounterVec,
    pub(crate) reports: IntCounterVec,
    pub(crate) active: IntGauge,
    pub(crate) cooling_down: IntGauge,
    /// `ended` and `reports` bound to each label once: no label hashing per lease, and every
    /// series is exported from the start (at 0), as Prometheus prefers.
    pub(crate) ended_by_reason: [IntCounter; EndReason::ALL.len()],
    pub(crate) reports_by_outcome: [IntCounter; Outcome::ALL.len()],
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
        Ok(metrics)
    }

    /// The same metrics, not exported anywhere (tests and benchmarks).
    pub fn unregistered() -> prometheus::Result<Self> {
        let ended = IntCounterVec::new(
            Opts::new(
                "proxy_operator_leases_ended_total",
                "Leases ended, by reason: released, expired, blocked, unhealthy, deleted.",
            ),
            &["reason"],
        )?;
        let reports = IntCounterVec::new(
            Opts::new(
                "proxy_operator_lease_reports_total",
                "Crawler reports on leases, by outcome.",
            ),
            &["outcome"],
        )?;
        Ok(LeaseMetrics {
            ended_by_reason: EndReason::ALL.map(|r| ended.with_label_values(&[r.as_str()])),
            reports_by_outcome: Outcome::ALL.map(|o| reports.with_label_values(&[o.as_str()])),
            ended,
            reports,
            granted: IntCounter::new(
                "proxy_operator_leases_granted_total",
                "Leases granted by the discovery API.",
            )?,
            rejected: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_leases_rejected_total",
                    "Lease requests refused, by reason.",
                ),
                &["reason"],
            )?,
            active: IntGauge::new(
                "proxy_operator_leases_active",
                "Leases currently held by crawlers.",
            )?,
            cooling_down: IntGauge::new(
                "proxy_operator_proxies_cooling_down",
                "Proxies cooling down after a crawler reported them blocked.",
            )?,
        })
    }
}
