//! 1000 Proxies against a real kube-apiserver (from the test harness), reconciled by the real
//! `proxy-operator run` binary with the real test-provider component (`memory:` endpoint, so the
//! figure is the operator's and the apiserver's, not a provider's). Reports the time until all are
//! Ready, Proxies reconciled per second and the operator's peak RSS. NextReconcile, in the same run, a
//! `ProxyPool` of 1000 scaled from 0: the time until its `readyReplicas` is 1000 (goal ≤ 60 s).
//!
//! `cargo bench -p proxy-operator --bench operator_scale` (needs `make plugins` and the fixtures).
//!
//! `BENCH_FLEET=10000` runs the fleet phase instead (issue #30): no hand-made Proxies, one
//! ProxyPool of that many from 0, the operator's resident memory read as `readyReplicas` passes
//! 1 000, 5 000 and the whole (goal at 10 000: Ready in ≤ 3 min, ≤ 400 MiB peak).

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::ControlPlane;
use kube::api::{Api, ListParams, PostParams};
use proxy_operator::api::{Phase, Proxy, ProxyPool, ProxySpec};

const PROXIES: usize = 1000;

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The operator's resident memory now (`VmRSS`), KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The API server's requests so far by (verb, resource): count and seconds spent serving them,
/// from its own `/metrics` (`apiserver_request_total`, `apiserver_request_duration_seconds_sum`),
/// largest time first: where a scale-up's API time goes.
async fn api_server_requests(client: &kube::Client) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let text = client
        .request_text(axum::http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))?;
    let mut by: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for sample in &scrape.samples {
        let value = match sample.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        let is_count = sample.metric == "apiserver_request_total";
        if !is_count && sample.metric != "apiserver_request_duration_seconds_sum" {
            continue;
        }
        let label = |name: &str| sample.labels.get(name).unwrap_or_default();
        let key = match label("subresource") {
            "" => format!("{} {}", label("verb"), label("resource")),
            sub => format!("{} {}/{sub}", label("verb"), label("resource")),
        };
        let entry = by.entry(key).or_default();
        if is_count {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    let mut rows: Vec<(String, f64, f64)> = by.into_iter().map(|(k, (n, s))| (k, n, s)).collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    Ok(rows)
}

/// Creates the pool and waits until `readyReplicas` is `replicas` (or `within` passed), reading
/// the operator's memory as the count passes each of `marks`. Returns the last count seen, the
/// time it took and `(mark, seconds, VmRSS KiB)` for each mark passed.
async fn scale_pool_from_zero(
    pools: &Api<ProxyPool>,
    replicas: usize,
    pid: u32,
    marks: &[usize],
    within: Duration,
) -> anyhow::Result<(usize, Duration, Vec<(usize, f64, u64)>)> {
    let started = Instant::now();
    pools
        .create(
            &PostParams::default(),
            &common::pool_of("scale", replicas, "mem")?,
        )
        .await?;
    let deadline = Instant::now() + within;
    let mut seen = 0;
    let mut passed = Vec::new();
    loop {
        // A failed read (the API server busy) is retried; the count is the last one seen.
        match pools.get("scale").await {
            Ok(pool) => seen = pool.status.map_or(0, |s| s.ready_replicas) as usize,
            Err(e) => eprintln!("operator_scale: reading the pool failed, retrying: {e}"),
        }
        for &mark in marks.iter().filter(|&&m| seen >= m) {
            if !passed.iter().any(|(m, _, _)| *m == mark) {
                let at = started.elapsed().as_secs_f64();
                eprintln!("operator_scale: {seen} Ready after {at:.1} s");
                passed.push((mark, at, rss_kib(pid)));
            }
        }
        if seen == replicas || Instant::now() > deadline {
            return Ok((seen, started.elapsed(), passed));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let fleet: Option<usize> = match std::env::var("BENCH_FLEET") {
        Ok(n) => Some(
            n.parse()
                .map_err(|e| anyhow::anyhow!("BENCH_FLEET={n}: {e}"))?,
        ),
        Err(_) => None,
    };
    let cp = ControlPlane::start().await?;
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    cp.apply_crds(crds).await?;
    let ns = cp.namespace("scale").await?;

    let dir = tempfile::tempdir()?;
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        "providers:\n- {name: mem, type: test, config: {endpoint: \"memory:1\"}, maxConcurrentCalls: 16}\n",
    )?;
    // BENCH_OPERATOR_WRAPPER (e.g. `heaptrack`) runs the operator under a profiler; the memory
    // figures are then the wrapper's process's, so read the profile instead.
    let binary = env!("CARGO_BIN_EXE_proxy-operator");
    let mut operator = match std::env::var("BENCH_OPERATOR_WRAPPER") {
        Ok(wrapper) => {
            let mut command = tokio::process::Command::new(wrapper);
            command.arg(binary);
            command
        }
        Err(_) => tokio::process::Command::new(binary),
    };
    let mut operator = common::operator_run(&mut operator, &config, ns.name(), "127.0.0.1:0")
        // The synthetic instances have 10.0.x.x addresses: never probe off loopback.
        .args(["--health-interval", "0s"])
        .env("KUBECONFIG", cp.kubeconfig())
        .env("LOG_LEVEL", "warn")
        .kill_on_drop(true)
        .spawn()?;
    let pid = operator.id().expect("running");
    let pools: Api<ProxyPool> = Api::namespaced(cp.client(), ns.name());

    if let Some(replicas) = fleet {
        let marks: Vec<usize> = [1000, 5000, replicas]
            .into_iter()
            .filter(|&m| m <= replicas)
            .collect();
        let (ready, took, passed) =
            scale_pool_from_zero(&pools, replicas, pid, &marks, Duration::from_secs(1800)).await?;
        let peak = peak_rss_kib(pid);
        let requests = api_server_requests(&cp.client()).await;
        operator.kill().await.ok();
        cp.stop().await;
        println!("operator_scale: a ProxyPool of {replicas} from 0");
        println!("  readyReplicas {ready} after {:.1} s", took.as_secs_f64());
        for (mark, at, rss) in passed {
            println!(
                "  {mark:>6} Ready at {at:>6.1} s: operator RSS {:.1} MiB",
                rss as f64 / 1024.0
            );
        }
        println!("  operator peak RSS: {:.1} MiB", peak as f64 / 1024.0);
        match requests {
            Ok(rows) => {
                println!("  API server requests (verb resource: count, seconds serving them):");
                for (what, count, seconds) in rows.iter().take(12) {
                    println!("    {what:<32} {count:>8.0} {seconds:>9.1} s");
                }
            }
            Err(e) => println!("  API server requests: not read ({e})"),
        }
        anyhow::ensure!(
            ready == replicas,
            "the pool has {ready} of {replicas} Ready"
        );
        return Ok(());
    }

    let api: Api<Proxy> = Api::namespaced(cp.client(), ns.name());
    let started = Instant::now();
    futures_util::stream::iter(0..PROXIES)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let proxy = Proxy::new(
                    &format!("p-{i:04}"),
                    ProxySpec {
                        provider: "mem".into(),
                        placement: None,
                        cloud_init: None,
                        vendor_data: None,
                        install_guest_agent: true,
                        port: 3128,
                        recreate_on_loss: false,
                        provider_options: None,
                    },
                );
                api.create(&PostParams::default(), &proxy)
                    .await
                    .expect("create");
            }
        })
        .await;
    let created = started.elapsed();

    let deadline = Instant::now() + Duration::from_secs(600);
    let mut seen = 0;
    let ready = loop {
        // A failed list (the API server busy) is retried; the count is the last one seen.
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                seen = list
                    .items
                    .iter()
                    .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
                    .count()
            }
            Err(e) => eprintln!("operator_scale: listing the Proxies failed, retrying: {e}"),
        }
        if seen == PROXIES || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let all_ready = started.elapsed();
    // The goal (≤ 150 MB) is for 1000 Proxies: read before the pool doubles them.
    let rss_1000 = peak_rss_kib(pid);

    // A pool of as many, from 0 (its Proxies made by the pool controller).
    let (pool_ready, pool_all_ready, _) =
        scale_pool_from_zero(&pools, PROXIES, pid, &[], Duration::from_secs(600)).await?;
    let rss_2000 = peak_rss_kib(pid);
    operator.kill().await.ok();
    cp.stop().await;

    println!("operator_scale: {PROXIES} proxies");
    println!(
        "  created (16 concurrent clients): {:.1} s",
        created.as_secs_f64()
    );
    println!(
        "  all Ready after:                 {:.1} s ({ready} ready)",
        all_ready.as_secs_f64()
    );
    println!(
        "  proxies reconciled to Ready/s:   {:.0}",
        ready as f64 / all_ready.as_secs_f64()
    );
    println!(
        "  operator peak RSS:               {:.1} MiB",
        rss_1000 as f64 / 1024.0
    );
    println!(
        "  ProxyPool of {PROXIES} from 0:       readyReplicas {pool_ready} after {:.1} s",
        pool_all_ready.as_secs_f64()
    );
    println!(
        "  operator peak RSS, {} Proxies:  {:.1} MiB",
        2 * PROXIES,
        rss_2000 as f64 / 1024.0
    );
    anyhow::ensure!(ready == PROXIES, "only {ready} of {PROXIES} became Ready");
    anyhow::ensure!(
        pool_ready == PROXIES,
        "the pool has {pool_ready} of {PROXIES} Ready"
    );
    Ok(())
}
