//! Families read at scrape time from what every replica already holds: whether this replica
//! leads ([`LeaderView`]) and each ProxyPool's desired, ready and leased Proxies (the fleet
//! cache, [`Fleet`]). Read when Prometheus asks, so a pool's series go with the pool and no
//! update can be missed; before the operator runs (no view, no cache yet) the leader gauge is 0
//! and no pool has a series.

use std::sync::{Arc, OnceLock};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};

use crate::api::ProxyPool;
use crate::faces::fleet::Fleet;
use crate::support::leader::LeaderView;

/// The `state` label of `proxy_operator_pool_replicas`.
pub const POOL_STATES: [&str; 3] = ["desired", "ready", "leased"];

/// What the collector reads, attached once the operator runs.
struct Sources {
    pools: Store<ProxyPool>,
    view: LeaderView,
}

/// `proxy_operator_leader` and `proxy_operator_pool_replicas` (cheap to clone: one collector).
#[derive(Clone)]
pub struct FleetMetrics {
    sources: Arc<OnceLock<Sources>>,
    leader: IntGauge,
    pools: IntGaugeVec,
}

impl FleetMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = FleetMetrics {
            sources: Arc::default(),
            leader: leader_gauge()?,
            pools: pool_gauges()?,
        };
        registry.register(Box::new(metrics.clone()))?;
        Ok(metrics)
    }

    /// From here on, scrapes read `fleet`'s pools and `view`'s leadership (the first call wins).
    pub fn attach(&self, fleet: &Fleet, view: &LeaderView) {
        let _ = self.sources.set(Sources {
            pools: fleet.pools.clone(),
            view: view.clone(),
        });
    }
}

fn leader_gauge() -> prometheus::Result<IntGauge> {
    IntGauge::with_opts(Opts::new(
        "proxy_operator_leader",
        "1 on the replica that leads (reconciles, serves leases), 0 on a standby.",
    ))
}

fn pool_gauges() -> prometheus::Result<IntGaugeVec> {
    IntGaugeVec::new(
        Opts::new(
            "proxy_operator_pool_replicas",
            "Proxies of each ProxyPool: desired (spec.replicas), ready and leased (its status).",
        ),
        &["namespace", "pool", "state"],
    )
}

/// A pool's (namespace, name) and its desired, ready and leased Proxies, in [`POOL_STATES`]'
/// order.
pub fn pool_figures(pool: &ProxyPool) -> (String, String, [i64; 3]) {
    let status = pool.status.clone().unwrap_or_default();
    (
        pool.namespace().unwrap_or_default(),
        pool.name_any(),
        [
            i64::from(pool.spec.replicas),
            i64::from(status.ready_replicas),
            i64::from(status.leased_replicas),
        ],
    )
}

impl Collector for FleetMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.leader.desc();
        descs.extend(self.pools.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Fresh gauges on every scrape: only what exists now has a series.
        let (Ok(leader), Ok(pools)) = (leader_gauge(), pool_gauges()) else {
            return Vec::new();
        };
        if let Some(sources) = self.sources.get() {
            leader.set(i64::from(sources.view.is_serving()));
            for pool in sources.pools.state() {
                let (namespace, name, figures) = pool_figures(&pool);
                for (state, value) in POOL_STATES.iter().zip(figures) {
                    pools
                        .with_label_values(&[namespace.as_str(), name.as_str(), state])
                        .set(value);
                }
            }
        }
        let mut families = leader.collect();
        families.extend(pools.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use prometheus::Encoder;

    use super::*;

    fn pool(namespace: &str, name: &str, replicas: i32, ready: i32, leased: i32) -> ProxyPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1",
            "kind": "ProxyPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "template": {"spec": {"provider": "kvm-home"}}},
            "status": {"replicas": ready, "readyReplicas": ready, "leasedReplicas": leased},
        }))
        .unwrap()
    }

    fn scrape(registry: &Registry) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    fn fleet(pools: Store<ProxyPool>) -> Fleet {
        Fleet {
            proxies: reflector::store().0,
            pools,
            providers: reflector::store().0,
        }
    }

    #[test]
    fn pool_series_follow_the_pools_that_exist_and_the_leader_gauge_follows_the_view() {
        let registry = Registry::new();
        let metrics = FleetMetrics::register(&registry).unwrap();
        // Before the operator attaches its caches: a standby's 0, no pool.
        let text = scrape(&registry);
        assert!(text.contains("\nproxy_operator_leader 0\n"), "{text}");
        assert!(!text.contains("proxy_operator_pool_replicas{"), "{text}");

        let (pools, mut writer) = reflector::store();
        let view = LeaderView::default();
        metrics.attach(&fleet(pools), &view);
        let team_a = pool("team-a", "crawl", 3, 2, 1);
        writer.apply_watcher_event(&Event::Apply(team_a.clone()));
        writer.apply_watcher_event(&Event::Apply(pool("team-b", "crawl", 5, 0, 0)));
        let text = scrape(&registry);
        for line in [
            r#"proxy_operator_pool_replicas{namespace="team-a",pool="crawl",state="desired"} 3"#,
            r#"proxy_operator_pool_replicas{namespace="team-a",pool="crawl",state="ready"} 2"#,
            r#"proxy_operator_pool_replicas{namespace="team-a",pool="crawl",state="leased"} 1"#,
            r#"proxy_operator_pool_replicas{namespace="team-b",pool="crawl",state="desired"} 5"#,
            r#"proxy_operator_pool_replicas{namespace="team-b",pool="crawl",state="ready"} 0"#,
            "proxy_operator_leader 0",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "{line} in\n{text}");
        }

        // Leading, and team A's pool deleted: its series are gone at the next scrape.
        view.set_serving(true);
        writer.apply_watcher_event(&Event::Delete(team_a));
        let text = scrape(&registry);
        assert!(text.contains("\nproxy_operator_leader 1\n"), "{text}");
        assert!(!text.contains(r#"namespace="team-a""#), "{text}");
        assert_eq!(text.matches("proxy_operator_pool_replicas{").count(), 3);
    }

    #[test]
    fn a_pool_without_status_is_desired_only() {
        let mut p = pool("ns", "p", 4, 0, 0);
        p.status = None;
        assert_eq!(pool_figures(&p), ("ns".into(), "p".into(), [4, 0, 0]));
    }
}
