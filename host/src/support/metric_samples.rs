//! Samples read back from a Prometheus registry (the status page's figures, the gateway's report
//! to the leader).

use prometheus::proto::Metric;

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
