//! The lease table at fleet size (issue #30).
//!
//! 1. **Held state**: fleet grants (a sticky session and a target) and releases on the lease
//!    table, from 2 threads, with an empty table and with 1 000 000 sessions and 1 000 000
//!    per-target cooldowns held, in alternating rounds (ABBA); the median ratio of the rounds,
//!    p50/p99 of a grant, and the memory the held state takes (RSS before and after loading
//!    it, per entry).
//! 2. **Bytes into etcd** (`BENCH_ETCD=1`, needs the Go-built etcd and kube-apiserver): 1000
//!    proxies, 900 leases held, 64 crawlers cycling grant → release with `sync` durability for
//!    `BENCH_SECONDS`, once with the journal (this release) and once with a writer of the whole
//!    table at every group commit (the earlier design, rebuilt here as it was), same client, same
//!    run: grants/s, bytes put into etcd per second and per grant (etcd's own counter); then a
//!    restore of 10 000 held leases (what a failover reads before it grants).
//!
//! `cargo bench -p proxy-operator --bench lease_state`; `BENCH_SECONDS` (default 5, fractions
//! too) sets each round's length, `BENCH_ROUNDS` (default 4) the rounds of part 1.

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxy_operator::leasing::leases::persist::{Durability, maintain};
use proxy_operator::leasing::leases::{
    LeaseMetrics, LeaseOptions, LeasePersistence, LeaseRequest, LeaseStore, ProvisionedProxy,
    ProxyKey,
};

fn seconds() -> Duration {
    Duration::from_secs_f64(
        std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5.0),
    )
}

fn rounds() -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

fn proxies(namespace: &str, count: usize) -> Vec<ProvisionedProxy> {
    (0..count)
        .map(|i| ProvisionedProxy {
            key: ProxyKey {
                namespace: namespace.into(),
                name: format!("proxy-{i:05}").into(),
            },
            provider: "memory".into(),
            zone: None,
            labels: BTreeMap::new(),
            address: "127.0.0.1".into(),
            port: 3128,
            exit_ip: None,
            healthy: true,
            pool: None,
            draining: false,
            login: None,
            protocol: Default::default(),
        })
        .collect()
}

fn store_of(count: usize) -> Arc<LeaseStore> {
    let store = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.restore(Default::default());
    store.set_provisioned(proxies("crawl", count));
    store
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Fleet cycles for `length`, from 2 threads: grant with one of 1000 sessions and one of 1000
/// targets, release. Returns cycles/s and each grant's latency (ns).
fn fleet_cycles(store: &Arc<LeaseStore>, length: Duration) -> (f64, Vec<u64>) {
    let started = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                let mut i = t * 7919;
                while started.elapsed() < length {
                    i += 1;
                    let request = LeaseRequest {
                        session: Some(format!("jar-{}", i % 1000)),
                        target: Some(format!("site-{}.example", i % 997)),
                        ..Default::default()
                    };
                    let at = Instant::now();
                    let granted = store.grant_or_join(&request);
                    latencies.push(at.elapsed().as_nanos() as u64);
                    if let Ok(grant) = granted
                        && !grant.joined
                    {
                        store.release(&grant.lease.id).unwrap();
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    (rate, latencies)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1000.0
}

fn held_state() {
    let empty = store_of(10_000);
    let before = rss_bytes();
    let held = store_of(10_000);
    let loading = Instant::now();
    common::hold_state(&held, 1_000_000, 0);
    let with_sessions = rss_bytes();
    common::hold_state(&held, 0, 1_000_000);
    let after = rss_bytes();
    println!(
        "held: 1 000 000 sessions + 1 000 000 target cooldowns loaded in {:.1} s; RSS +{:.1} MiB \
         ({:.0} B/session, {:.0} B/cooldown)",
        loading.elapsed().as_secs_f64(),
        (after - before) as f64 / 1048576.0,
        (with_sessions - before) as f64 / 1e6,
        (after - with_sessions) as f64 / 1e6,
    );
    let length = seconds();
    // BENCH_HELD_ONLY: the held rounds alone, to profile them (`perf record`).
    let held_only = std::env::var_os("BENCH_HELD_ONLY").is_some();
    let mut ratios = Vec::new();
    let (mut all_empty, mut all_held) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        let order: [(&str, &Arc<LeaseStore>); 2] = if round % 2 == 0 {
            [("empty", &empty), ("held", &held)]
        } else {
            [("held", &held), ("empty", &empty)]
        };
        let mut rates = BTreeMap::new();
        for (name, store) in order {
            if held_only && name == "empty" {
                rates.insert(name, f64::NAN);
                continue;
            }
            let (rate, latencies) = fleet_cycles(store, length);
            rates.insert(name, rate);
            if name == "empty" {
                all_empty.extend(latencies);
            } else {
                all_held.extend(latencies);
            }
        }
        println!(
            "round {round}: empty {:.0} cycles/s, held {:.0} cycles/s ({:.1} %)",
            rates["empty"],
            rates["held"],
            100.0 * rates["held"] / rates["empty"]
        );
        ratios.push(rates["held"] / rates["empty"]);
    }
    ratios.sort_by(f64::total_cmp);
    all_empty.sort_unstable();
    all_held.sort_unstable();
    println!(
        "held/empty median {:.1} %; grant p50/p99 empty {:.1}/{:.1} µs, held {:.1}/{:.1} µs",
        100.0 * ratios[ratios.len() / 2],
        percentile(&all_empty, 0.5),
        percentile(&all_empty, 0.99),
        percentile(&all_held, 0.5),
        percentile(&all_held, 0.99),
    );
}

async fn etcd_put_bytes(cp: &harness::ControlPlane) -> f64 {
    let text = reqwest::get(format!("{}/metrics", cp.etcd_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix("etcd_debugging_mvcc_total_put_size_in_bytes ")?
                .parse()
                .ok()
        })
        .expect("etcd exports its put bytes")
}

/// The earlier design, as it was: the whole table as one ConfigMap key, applied at every group
/// commit.
async fn whole_table_writer(
    store: Arc<LeaseStore>,
    api: kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
) {
    loop {
        if !store.is_dirty() {
            let _ = tokio::time::timeout(Duration::from_secs(1), store.changed()).await;
            continue;
        }
        let Some(pending) = store.take_changes() else {
            continue;
        };
        let version = pending.version;
        let snapshot = store.snapshot().unwrap();
        let patch = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "whole-table"},
            "data": {"leases.json": serde_json::to_string(&snapshot).unwrap()},
        });
        api.patch(
            "whole-table",
            &kube::api::PatchParams::apply("bench").force(),
            &kube::api::Patch::Apply(patch),
        )
        .await
        .unwrap();
        store.mark_stored(version);
    }
}

/// 900 of 1000 proxies held, 64 crawlers cycling grant (answered once stored) → release.
async fn cycle_stored(store: &Arc<LeaseStore>, length: Duration) -> usize {
    for _ in 0..900 {
        store.grant(&LeaseRequest::default()).unwrap();
    }
    let started = Instant::now();
    let crawlers: Vec<_> = (0..64)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut cycles = 0;
                while started.elapsed() < length {
                    let Ok((lease, _)) = store.grant(&LeaseRequest::default()) else {
                        tokio::task::yield_now().await;
                        continue;
                    };
                    store
                        .wait_stored(store.version(), Duration::from_secs(10))
                        .await
                        .unwrap();
                    store.release(&lease.id).unwrap();
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut cycles = 0;
    for crawler in crawlers {
        cycles += crawler.await.unwrap();
    }
    cycles
}

async fn bytes_into_etcd() {
    let cp = harness::ControlPlane::start().await.unwrap();
    let ns = cp.namespace("bench-etcd").await.unwrap();
    let length = seconds();
    for design in ["journal", "whole table"] {
        let store = store_of(1000);
        let writer = if design == "journal" {
            let persistence = LeasePersistence::new(ns.client(), ns.name(), "bench-leases");
            tokio::spawn(maintain(
                store.clone(),
                persistence,
                Durability::Sync,
                Duration::from_secs(5),
            ))
        } else {
            tokio::spawn(whole_table_writer(store.clone(), ns.api()))
        };
        let before = etcd_put_bytes(&cp).await;
        let started = Instant::now();
        let cycles = cycle_stored(&store, length).await;
        let elapsed = started.elapsed().as_secs_f64();
        let bytes = etcd_put_bytes(&cp).await - before;
        writer.abort();
        println!(
            "{design}: {:.0} grants/s (sync), {:.2} MiB/s into etcd, {:.0} B per grant",
            cycles as f64 / elapsed,
            bytes / elapsed / 1048576.0,
            bytes / (cycles + 900) as f64
        );
    }

    // A failover's read: 10 000 held leases restored by a new leader.
    let store = store_of(10_000);
    let persistence = LeasePersistence::new(ns.client(), ns.name(), "bench-failover");
    persistence.restore_into(&store).await.unwrap();
    store.set_provisioned(proxies("crawl", 10_000));
    let writer = tokio::spawn(maintain(
        store.clone(),
        persistence.clone(),
        Durability::Sync,
        Duration::from_secs(5),
    ));
    for _ in 0..10_000 {
        store.grant(&LeaseRequest::default()).unwrap();
    }
    store
        .wait_stored(store.version(), Duration::from_secs(30))
        .await
        .unwrap();
    writer.abort();
    let successor = store_of(0);
    successor.close();
    let started = Instant::now();
    LeasePersistence::new(ns.client(), ns.name(), "bench-failover")
        .restore_into(&successor)
        .await
        .unwrap();
    println!(
        "failover read: 10 000 leases restored in {:.0} ms ({} leases)",
        started.elapsed().as_secs_f64() * 1000.0,
        successor.snapshot().unwrap().leases.len()
    );
}

fn main() {
    held_state();
    if std::env::var_os("BENCH_ETCD").is_some() {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(bytes_into_etcd());
    }
}
