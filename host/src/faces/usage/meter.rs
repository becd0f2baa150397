//! What the fleet costs, as figures a fleet owner can bill from: instance-seconds per team
//! (the Proxy's namespace), provider instance and zone (every Proxy with an instance at its
//! provider, advanced by the leader every [`METER_INTERVAL`]), and how long proxies last before a site first blocks them. Proxies
//! created and deleted are counted by the controller (`metrics.rs`), leases and blocks by the
//! lease table (`leases/metrics.rs`, `leases/blocks.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus::{CounterVec, HistogramOpts, HistogramVec, Opts, Registry};
use tokio::sync::mpsc;

use super::book::{Billed, RowKey};
use super::ledger::{GrantedCounts, PoolBytes, UsageLedger};
use crate::api::Proxy;
use crate::api::labels::POOL_LABEL;
use crate::leasing::leases::metrics::NO_POOL;
use crate::leasing::leases::{FirstBlock, LeaseStore};
use crate::support::namespace_label::namespace_label;

/// How often the leader adds the instance-seconds of the proxies that exist.
pub const METER_INTERVAL: Duration = Duration::from_secs(5);
/// The `zone` label of a proxy whose provider names no zone.
pub const NO_ZONE: &str = "none";

/// The usage families.
#[derive(Clone)]
pub struct UsageMetrics {
    pub(crate) instance_seconds: CounterVec,
    /// Instance-seconds at the provider instance's stated `limits.pricePerHour`.
    pub(crate) spend: CounterVec,
    pub(crate) first_block: HistogramVec,
}

impl UsageMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = UsageMetrics {
            instance_seconds: CounterVec::new(
                Opts::new(
                    "proxy_operator_instance_seconds_total",
                    "Seconds of proxy instances existing at their provider (a Proxy with a providerID), by the Proxy's namespace, provider instance and zone.",
                ),
                &["namespace", "provider", "zone"],
            )?,
            spend: CounterVec::new(
                Opts::new(
                    "proxy_operator_instance_spend_total",
                    "Spend on proxy instances at their provider instance's stated price (limits.pricePerHour, per instance-hour, in the platform's currency), by the Proxy's namespace, provider instance and zone.",
                ),
                &["namespace", "provider", "zone"],
            )?,
            first_block: HistogramVec::new(
                HistogramOpts::new(
                    "proxy_operator_proxy_lifetime_to_first_block_seconds",
                    "Age of a proxy (from its Proxy's creation) at its first `blocked` report, by provider instance.",
                )
                .buckets(vec![
                    60.0, 300.0, 900.0, 1800.0, 3600.0, 10800.0, 21600.0, 43200.0, 86400.0,
                    259200.0, 604800.0,
                ]),
                &["provider"],
            )?,
        };
        registry.register(Box::new(metrics.instance_seconds.clone()))?;
        registry.register(Box::new(metrics.spend.clone()))?;
        registry.register(Box::new(metrics.first_block.clone()))?;
        Ok(metrics)
    }
}

/// Instance-seconds between ticks (no I/O: table-tested).
#[derive(Default)]
pub struct Meter {
    last_ms: Option<u64>,
}

impl Meter {
    /// The seconds to add per group (whom an instance is billed to) for the instances that exist at `now_ms`: the
    /// time since the last tick for each (so a proxy is counted to within one tick). The first
    /// tick of a term only starts the clock.
    pub fn advance<G: Ord>(
        &mut self,
        now_ms: u64,
        existing: impl IntoIterator<Item = G>,
    ) -> BTreeMap<G, f64> {
        let Some(last) = self.last_ms.replace(now_ms) else {
            return BTreeMap::new();
        };
        let seconds = now_ms.saturating_sub(last) as f64 / 1000.0;
        let mut added = BTreeMap::new();
        for group in existing {
            *added.entry(group).or_insert(0.0) += seconds;
        }
        added.retain(|_, s| *s > 0.0);
        added
    }
}

/// A Proxy's group when it has an instance at its provider.
pub fn billed(proxy: &Proxy) -> Option<Billed> {
    let status = proxy.status.as_ref()?;
    status.provider_id.as_ref()?;
    Some(Billed {
        namespace: namespace_label(&proxy.namespace().unwrap_or_default()).to_string(),
        pool: proxy
            .labels()
            .get(POOL_LABEL)
            .cloned()
            .unwrap_or_else(|| NO_POOL.into()),
        provider: proxy.spec.provider.clone(),
        zone: status.zone.clone().unwrap_or_else(|| NO_ZONE.into()),
    })
}

/// The age in seconds of a Proxy created at `created_ms` when it was first blocked at `at_ms`.
pub fn age_at(created_ms: i64, at_ms: u64) -> f64 {
    (at_ms as i64).saturating_sub(created_ms).max(0) as f64 / 1000.0
}

/// The leader's meter: instance-seconds every [`METER_INTERVAL`] (to the metric and, with
/// the leases and gateway bytes of the same look, to the usage book), and the age of each proxy
/// at its first block, until dropped.
pub async fn run(
    proxies: Store<Proxy>,
    leases: Arc<LeaseStore>,
    mut first_blocks: mpsc::Receiver<FirstBlock>,
    metrics: UsageMetrics,
    ledger: UsageLedger,
    price_per_hour: impl Fn(&str) -> Option<f64>,
) {
    let mut meter = Meter::default();
    let mut tick = tokio::time::interval(METER_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = crate::leasing::leases::store::now_ms();
                let existing = proxies.state().into_iter().filter_map(|p| billed(&p));
                let added = meter.advance(now, existing);
                for (billed, seconds) in &added {
                    let labels = [&billed.namespace, &billed.provider, &billed.zone];
                    metrics.instance_seconds.with_label_values(&labels).inc_by(*seconds);
                    if let Some(price) = price_per_hour(&billed.provider) {
                        metrics.spend.with_label_values(&labels).inc_by(price * seconds / 3600.0);
                    }
                }
                ledger.record(now, &added, &price_per_hour, granted_counts(&leases), pool_bytes(&leases));
            }
            Some(block) = first_blocks.recv() => {
                let key = ObjectRef::new(&block.proxy.name).within(&block.proxy.namespace);
                let created = proxies
                    .get(&key)
                    .and_then(|p| p.creation_timestamp())
                    .map(|t| t.0.as_millisecond());
                if let Some(created) = created {
                    metrics
                        .first_block
                        .with_label_values(&[&block.provider])
                        .observe(age_at(created, block.at_ms));
                }
            }
        }
    }
}

/// The lease table's grants counter, per row (its series are namespace, pool, provider).
fn granted_counts(leases: &LeaseStore) -> GrantedCounts {
    use prometheus::core::Collector;
    let mut counts = Vec::new();
    for family in leases.metrics().granted.collect() {
        for metric in family.get_metric() {
            let label = |name: &str| crate::support::metric_samples::label_value(metric, name);
            let pool = label("pool");
            let pool = pool.split_once('/').map_or(pool.as_str(), |(_, name)| name);
            counts.push((
                RowKey::new(&label("namespace"), pool, &label("provider")),
                metric.get_counter().get_value(),
            ));
        }
    }
    counts
}

/// The gateway's bytes per pool, as its replicas reported them to this leader.
fn pool_bytes(leases: &LeaseStore) -> PoolBytes {
    leases
        .gateway_bytes()
        .into_iter()
        .map(|(pool, traffic)| (pool, traffic.sent, traffic.received))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Group = Billed;
    /// (now ms, instances, seconds added per group)
    type Case = (u64, Vec<Group>, Vec<(Group, f64)>);

    fn group(provider: &str, zone: &str) -> Group {
        Billed {
            namespace: "n".into(),
            pool: NO_POOL.into(),
            provider: provider.into(),
            zone: zone.into(),
        }
    }

    #[test]
    fn each_existing_instance_adds_the_time_since_the_last_tick() {
        let mut meter = Meter::default();
        // (now ms, instances, seconds added per group)
        let cases: Vec<Case> = vec![
            (1_000, vec![group("gcp", "a")], vec![]),
            (
                6_000,
                vec![group("gcp", "a"), group("gcp", "a"), group("kvm", NO_ZONE)],
                vec![(group("gcp", "a"), 10.0), (group("kvm", NO_ZONE), 5.0)],
            ),
            (6_500, vec![], vec![]),
            (
                7_000,
                vec![group("kvm", NO_ZONE)],
                vec![(group("kvm", NO_ZONE), 0.5)],
            ),
            // A clock going back adds nothing.
            (6_000, vec![group("kvm", NO_ZONE)], vec![]),
        ];
        for (now, existing, added) in cases {
            let got: Vec<_> = meter.advance(now, existing).into_iter().collect();
            assert_eq!(got, added, "at {now}");
        }
    }

    #[test]
    fn only_proxies_with_an_instance_are_billed_and_ages_are_never_negative() {
        let mut proxy: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"provider": "gcp-eu"}
        }))
        .unwrap();
        assert_eq!(billed(&proxy), None);
        proxy.status = Some(Default::default());
        assert_eq!(billed(&proxy), None);
        let status = proxy.status.as_mut().unwrap();
        status.provider_id = Some("px-1".into());
        assert_eq!(billed(&proxy), Some(group("gcp-eu", NO_ZONE)));
        proxy.status.as_mut().unwrap().zone = Some("europe-west1-b".into());
        assert_eq!(billed(&proxy), Some(group("gcp-eu", "europe-west1-b")));
        // A pool's member is billed to its pool.
        proxy.labels_mut().insert(POOL_LABEL.into(), "crawl".into());
        let in_pool = billed(&proxy).unwrap();
        assert_eq!(
            (in_pool.namespace.as_str(), in_pool.pool.as_str()),
            ("n", "crawl")
        );
        assert_eq!(age_at(1_000, 61_000), 60.0);
        assert_eq!(age_at(61_000, 1_000), 0.0);
    }
}
