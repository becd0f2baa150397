//! The usage figures on the page, read from the registry's own families: the page and
//! Prometheus can never disagree.

use std::collections::BTreeMap;

use prometheus::proto::MetricFamily;

use super::snapshot::Usage;

/// The usage figures in `families` (a registry's `gather()`).
pub fn usage_of(families: &[MetricFamily]) -> Usage {
    let mut usage = Usage::default();
    let mut created_deleted: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut granted: BTreeMap<String, f64> = BTreeMap::new();
    let mut instance_seconds: BTreeMap<(String, String), f64> = BTreeMap::new();
    for family in families {
        for metric in family.get_metric() {
            let label = |name: &str| crate::support::metric_samples::label_value(metric, name);
            let counter = metric.get_counter().get_value();
            match family.name() {
                "proxy_operator_instance_seconds_total" => {
                    *instance_seconds
                        .entry((label("provider"), label("zone")))
                        .or_default() += counter;
                    usage
                        .by_namespace
                        .entry(label("namespace"))
                        .or_default()
                        .instance_seconds += counter;
                }
                "proxy_operator_proxies_created_total" => {
                    created_deleted.entry(label("provider")).or_default().0 += counter;
                }
                "proxy_operator_proxies_deleted_total" => {
                    created_deleted.entry(label("provider")).or_default().1 += counter;
                }
                "proxy_operator_leases_granted_total" => {
                    *granted.entry(label("pool")).or_default() += counter;
                    usage
                        .by_namespace
                        .entry(label("namespace"))
                        .or_default()
                        .leases_granted += counter;
                }
                "proxy_operator_proxy_lifetime_to_first_block_seconds" => {
                    let histogram = metric.get_histogram();
                    let count = histogram.get_sample_count();
                    let mean = if count == 0 {
                        0.0
                    } else {
                        histogram.get_sample_sum() / count as f64
                    };
                    usage.first_block.push((label("provider"), count, mean));
                }
                _ => {}
            }
        }
    }
    usage.instance_seconds = instance_seconds
        .into_iter()
        .map(|((provider, zone), seconds)| (provider, zone, seconds))
        .collect();
    usage.created_deleted = created_deleted
        .into_iter()
        .map(|(provider, (c, d))| (provider, c, d))
        .collect();
    usage.leases_granted = granted.into_iter().filter(|(_, n)| *n > 0.0).collect();
    usage.first_block.sort_by(|a, b| a.0.cmp(&b.0));
    usage
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faces::metrics::Metrics;

    #[test]
    fn the_figures_are_the_registrys_own() {
        let metrics = Metrics::register().unwrap();
        metrics
            .usage
            .instance_seconds
            .with_label_values(&["team-a", "gcp-eu", "europe-west1-b"])
            .inc_by(7200.0);
        metrics
            .usage
            .instance_seconds
            .with_label_values(&["team-b", "gcp-eu", "europe-west1-b"])
            .inc_by(1800.0);
        metrics
            .usage
            .first_block
            .with_label_values(&["gcp-eu"])
            .observe(600.0);
        metrics
            .usage
            .first_block
            .with_label_values(&["gcp-eu"])
            .observe(1800.0);
        metrics
            .leases
            .granted
            .with_label_values(&["crawlers", "crawlers/fleet", "gcp-eu"])
            .inc_by(3);
        metrics
            .leases
            .granted
            .with_label_values(&["crawlers", "crawlers/fleet", "kvm-home"])
            .inc_by(2);
        let usage = usage_of(&metrics.registry.gather());
        assert_eq!(
            usage.instance_seconds,
            vec![("gcp-eu".into(), "europe-west1-b".into(), 9000.0)]
        );
        // Per team, the fleet's figures split by namespace: they add up to the fleet's.
        let team = |ns: &str| usage.by_namespace.get(ns).cloned().unwrap_or_default();
        assert_eq!(team("team-a").instance_seconds, 7200.0);
        assert_eq!(team("team-b").instance_seconds, 1800.0);
        assert_eq!(team("crawlers").leases_granted, 5.0);
        assert_eq!(usage.first_block, vec![("gcp-eu".into(), 2, 1200.0)]);
        assert_eq!(usage.leases_granted, vec![("crawlers/fleet".into(), 5.0)]);
        assert_eq!(usage.created_deleted, vec![]);
    }
}
