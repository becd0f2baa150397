//! 1000 Proxies against a real kube-apiserver (from the test harness), reconciled by the real
//! `proxy-operator run` binary with the real test-provider component (`memory:` endpoint, so the
//! figure is the operator's and the apiserver's, not a provider's). Reports the time until all are
//! Ready, Proxies reconciled per second and the operator's peak RSS. Then, in the same run, a
//! `ProxyPool` of 1000 scaled from 0: the time until its `readyReplicas` is 1000 (goal ≤ 60 s).
//!
//! `cargo bench -p proxy-operator --bench operator_scale` (needs `make plugins` and the fixtures).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::ControlPlane;
use kube::api::{Api, ListParams, PostParams};
use proxy_operator::api::{Phase, Proxy, ProxyPool, ProxySpec};

const PROXIES: usize = 1000;

fn plugins_dir() -> PathBuf {
    std::env::var_os("PROXY_OPERATOR_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"))
}

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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
    let mut operator = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["run", "--providers-config"])
        .arg(&config)
        .arg("--plugins-dir")
        .arg(plugins_dir())
        .args([
            "--proxy-namespace",
            ns.name(),
            "--metrics-addr",
            "127.0.0.1:0",
            // The synthetic instances have 10.0.x.x addresses: never probe off loopback.
            "--health-interval",
            "0s",
        ])
        .env("KUBECONFIG", cp.kubeconfig())
        .env("LOG_LEVEL", "warn")
        .kill_on_drop(true)
        .spawn()?;
    let pid = operator.id().expect("running");

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
    let pools: Api<ProxyPool> = Api::namespaced(cp.client(), ns.name());
    let pool: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "scale"},
        "spec": {"replicas": PROXIES, "template": {"spec": {"provider": "mem"}}},
    }))?;
    let pool_started = Instant::now();
    pools.create(&PostParams::default(), &pool).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut seen = 0;
    let pool_ready = loop {
        // A failed read (the API server busy) is retried; the count is the last one seen.
        match pools.get("scale").await {
            Ok(pool) => seen = pool.status.map_or(0, |s| s.ready_replicas),
            Err(e) => eprintln!("operator_scale: reading the pool failed, retrying: {e}"),
        }
        if seen as usize == PROXIES || Instant::now() > deadline {
            break seen as usize;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let pool_all_ready = pool_started.elapsed();
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
