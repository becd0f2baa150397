//! The Proxy controller's metrics: reconciles by result and duration, instances created and
//! deleted at their provider.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Metrics of Proxy reconciles.
#[derive(Clone)]
pub struct ReconcileMetrics {
    total: IntCounterVec,
    duration: HistogramVec,
    created: IntCounterVec,
    deleted: IntCounterVec,
}

impl ReconcileMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let total = IntCounterVec::new(
            Opts::new(
                "proxy_operator_reconcile_total",
                "Proxy reconciles, by result: success or error (retried with backoff).",
            ),
            &["result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "proxy_operator_reconcile_duration_seconds",
                "Duration of Proxy reconciles, including provider calls, by result.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0,
            ]),
            &["result"],
        )?;
        let created = IntCounterVec::new(
            Opts::new(
                "proxy_operator_proxies_created_total",
                "Instances created at their provider for a Proxy, by provider instance.",
            ),
            &["provider"],
        )?;
        let deleted = IntCounterVec::new(
            Opts::new(
                "proxy_operator_proxies_deleted_total",
                "Instances of deleted Proxies deleted at their provider, by provider instance.",
            ),
            &["provider"],
        )?;
        for family in [&total, &created, &deleted] {
            registry.register(Box::new(family.clone()))?;
        }
        registry.register(Box::new(duration.clone()))?;
        Ok(ReconcileMetrics {
            total,
            duration,
            created,
            deleted,
        })
    }

    /// Counts an instance created at `provider`.
    pub(crate) fn created(metrics: &Option<Self>, provider: &str) {
        if let Some(m) = metrics {
            m.created.with_label_values(&[provider]).inc();
        }
    }

    /// Counts an instance deleted at `provider`.
    pub(crate) fn deleted(metrics: &Option<Self>, provider: &str) {
        if let Some(m) = metrics {
            m.deleted.with_label_values(&[provider]).inc();
        }
    }

    pub(crate) fn observe(&self, elapsed: Duration, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.total.with_label_values(&[result]).inc();
        self.duration
            .with_label_values(&[result])
            .observe(elapsed.as_secs_f64());
    }
}
