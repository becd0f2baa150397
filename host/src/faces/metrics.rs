//! Prometheus metrics. One registry for the operator, names prefixed `proxy_operator_`, labels
//! bounded: plugin and provider-instance names come from the operator's own config, functions and
//! error kinds from fixed sets.

use prometheus::{IntGaugeVec, Opts, Registry};

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
    /// The leader gauge and the pools' gauges, read at scrape time once attached.
    pub fleet: crate::faces::fleet_metrics::FleetMetrics,
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
            fleet: crate::faces::fleet_metrics::FleetMetrics::register(&registry)?,
            registry: with_build_info(registry)?,
        })
    }
}

/// `proxy_operator_build_info{version, commit}` = 1 (support/version.rs), registered in
/// `registry`.
fn with_build_info(registry: Registry) -> prometheus::Result<Registry> {
    let info = IntGaugeVec::new(
        Opts::new(
            "proxy_operator_build_info",
            "Always 1: the operator's version and the git commit it was built from.",
        ),
        &["version", "commit"],
    )?;
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), crate::support::version::REVISION])
        .set(1);
    registry.register(Box::new(info))?;
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_says_which_build_and_whether_this_replica_leads() {
        let metrics = Metrics::register().unwrap();
        let families = metrics.registry.gather();
        let family = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .unwrap_or_else(|| panic!("{name} registered"))
        };
        let info = &family("proxy_operator_build_info").get_metric()[0];
        let label = crate::support::metric_samples::label_value;
        assert_eq!(label(info, "version"), env!("CARGO_PKG_VERSION"));
        assert_eq!(label(info, "commit"), crate::support::version::REVISION);
        assert!(!label(info, "commit").is_empty());
        assert_eq!(info.get_gauge().get_value(), 1.0);
        // A standby's figure until the operator attaches its leader view.
        let leader = &family("proxy_operator_leader").get_metric()[0];
        assert_eq!(leader.get_gauge().get_value(), 0.0);
    }
}
