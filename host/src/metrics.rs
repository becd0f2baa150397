//! Prometheus metrics. One registry for the operator, names prefixed `proxy_operator_`, labels
//! bounded: plugin and provider-instance names come from the operator's own config, functions and
//! error kinds from fixed sets.

use std::time::Duration;

use prometheus::proto::Metric;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The value of the label `name` of a gathered sample, empty when it has none (for the figures
/// read back from the registry: the status page's, the gateway's report to the leader).
pub fn label_value(metric: &Metric, name: &str) -> String {
    metric
        .get_label()
        .iter()
        .find(|l| l.name() == name)
        .map(|l| l.value().to_string())
        .unwrap_or_default()
}

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

/// Every part's metrics, registered once in the operator's one registry.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub reconcile: ReconcileMetrics,
    pub leases: crate::leases::LeaseMetrics,
    pub plugins: crate::registry::RegistryMetrics,
    pub probes: crate::health::ProbeMetrics,
    pub gc: crate::gc::GcMetrics,
    pub provider_checks: crate::providerhealth::HealthMetrics,
    pub usage: crate::usage::UsageMetrics,
}

impl Metrics {
    /// A fresh registry with every family registered (plugin-call metrics are the engine's).
    pub fn register() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Metrics {
            reconcile: ReconcileMetrics::register(&registry)?,
            leases: crate::leases::LeaseMetrics::register(&registry)?,
            plugins: crate::registry::RegistryMetrics::register(&registry)?,
            probes: crate::health::ProbeMetrics::register(&registry)?,
            gc: crate::gc::GcMetrics::register(&registry)?,
            provider_checks: crate::providerhealth::HealthMetrics::register(&registry)?,
            usage: crate::usage::UsageMetrics::register(&registry)?,
            registry,
        })
    }
}
