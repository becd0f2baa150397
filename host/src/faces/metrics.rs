//! Prometheus metrics. One registry for the operator, names prefixed `proxy_operator_`, labels
//! bounded: plugin and provider-instance names come from the operator's own config, functions and
//! error kinds from fixed sets.

use prometheus::Registry;

use crate::lifecycle::controller::ReconcileMetrics;

/// Every part's metrics, registered once in the operator's one registry.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub reconcile: ReconcileMetrics,
    pub leases: crate::leasing::leases::LeaseMetrics,
    pub plugins: crate::provider::registry::RegistryMetrics,
    pub probes: crate::lifecycle::health::ProbeMetrics,
    pub gc: crate::lifecycle::gc::GcMetrics,
    pub provider_checks: crate::provider::providerhealth::ProviderCheckMetrics,
    pub usage: crate::faces::usage::UsageMetrics,
}

impl Metrics {
    /// A fresh registry with every family registered (plugin-call metrics are the engine's).
    pub fn register() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Metrics {
            reconcile: ReconcileMetrics::register(&registry)?,
            leases: crate::leasing::leases::LeaseMetrics::register(&registry)?,
            plugins: crate::provider::registry::RegistryMetrics::register(&registry)?,
            probes: crate::lifecycle::health::ProbeMetrics::register(&registry)?,
            gc: crate::lifecycle::gc::GcMetrics::register(&registry)?,
            provider_checks: crate::provider::providerhealth::ProviderCheckMetrics::register(
                &registry,
            )?,
            usage: crate::faces::usage::UsageMetrics::register(&registry)?,
            registry,
        })
    }
}
