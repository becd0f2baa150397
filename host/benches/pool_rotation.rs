//! A full rotation of a 100-proxy `ProxyPool` with `maxUnavailable: 10%` against a real
//! kube-apiserver, reconciled by the real `proxy-operator run` binary with the real test-provider
//! component (`memory:` endpoint). Crawlers hold leases on a few members through the discovery
//! API while the template changes. Checked at every pool status the API server shows: Ready never
//! below 90, and no Proxy is deleted while a crawler holds a lease on it. Reports the rotation's
//! duration and the lowest `readyReplicas` seen.
//!
//! `cargo bench -p proxy-operator --bench pool_rotation` (needs `make plugins` and the fixtures).

#[path = "common/mod.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use harness::ControlPlane;
use harness::process::free_port;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use proxy_operator::api::{Proxy, ProxyPool};

const REPLICAS: i32 = 100;
const FLOOR: i32 = 90;
const HELD: usize = 5;
const TOKEN: &str = "bench-token";

/// Leases a crawler holds now: Proxy name → lease id.
type Held = Arc<Mutex<HashMap<String, String>>>;

struct Discovery {
    client: reqwest::Client,
    base: String,
}

impl Discovery {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or_default()))
    }

    /// Holds a lease on `HELD` members of the pool (long enough to outlast their drain).
    async fn hold(&self, ns: &str, held: &Held) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while held.lock().unwrap().len() < HELD {
            let body = serde_json::json!({"pool": format!("{ns}/rotating"), "ttlSeconds": 60});
            // No answer (the machine busy) is retried until the deadline like a refusal.
            let (status, lease) = match self
                .call(reqwest::Method::POST, "/v1/leases", Some(body))
                .await
            {
                Ok(answer) => answer,
                Err(e) => (0, serde_json::Value::String(format!("no answer: {e}"))),
            };
            if status == 201 {
                let name = lease["proxy"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let id = lease["id"].as_str().unwrap_or_default().to_string();
                held.lock().unwrap().insert(name, id);
            } else {
                anyhow::ensure!(Instant::now() < deadline, "no lease: {status} {lease}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }
}

/// Watches the pool's Proxies; a Proxy deleted (its `deletionTimestamp` set, or gone) while a
/// lease is held on it is a violation.
fn watch_deletions(api: Api<Proxy>, held: Held, violations: Arc<Mutex<Vec<String>>>) {
    tokio::spawn(async move {
        let mut seen = HashSet::new();
        let stream = watcher(api, watcher::Config::default()).touched_objects();
        futures_util::pin_mut!(stream);
        while let Some(Ok(proxy)) = stream.next().await {
            let name = proxy.metadata.name.clone().unwrap_or_default();
            let deleted_now =
                proxy.metadata.deletion_timestamp.is_some() && seen.insert(name.clone());
            if deleted_now && held.lock().unwrap().contains_key(&name) {
                violations.lock().unwrap().push(name);
            }
        }
    });
}

/// The lowest `readyReplicas` of every pool status the API server shows (a watch sees each
/// write, where polling could miss one).
fn watch_lowest_ready(pools: Api<ProxyPool>, lowest: Arc<Mutex<i32>>) {
    tokio::spawn(async move {
        let stream = watcher(pools, watcher::Config::default()).touched_objects();
        futures_util::pin_mut!(stream);
        while let Some(Ok(pool)) = stream.next().await {
            let ready = pool.status.as_ref().map_or(0, |s| s.ready_replicas);
            let mut low = lowest.lock().unwrap();
            *low = (*low).min(ready);
        }
    });
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cp = ControlPlane::start().await?;
    cp.apply_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds"))
        .await?;
    let ns = cp.namespace("rotation").await?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        "providers:\n- {name: mem, type: test, config: {endpoint: \"memory:1\"}, maxConcurrentCalls: 16}\n",
    )?;
    let discovery_addr = format!("127.0.0.1:{}", free_port()?);
    let mut operator = common::operator_run(
        &mut tokio::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator")),
        &config,
        ns.name(),
        &discovery_addr,
    )
    // The synthetic instances have 10.0.x.x addresses: never probe off loopback.
    .args(["--health-interval", "0s"])
    .env("KUBECONFIG", cp.kubeconfig())
    .env("DISCOVERY_TOKEN", TOKEN)
    .env("LOG_LEVEL", "warn")
    .kill_on_drop(true)
    .spawn()?;

    let pools: Api<ProxyPool> = Api::namespaced(cp.client(), ns.name());
    let pool: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": "rotating"},
        "spec": {
            "replicas": REPLICAS,
            "maxUnavailable": "10%",
            "template": {"metadata": {"labels": {"generation": "1"}}, "spec": {"provider": "mem"}},
        },
    }))?;
    pools.create(&PostParams::default(), &pool).await?;
    let ready_of = |p: &ProxyPool| p.status.as_ref().map_or(0, |s| s.ready_replicas);
    let updated_of = |p: &ProxyPool| p.status.as_ref().map_or(0, |s| s.updated_replicas);
    wait_pool(&pools, "all Ready", |p| ready_of(p) == REPLICAS).await?;

    let discovery = Discovery {
        client: reqwest::Client::new(),
        base: format!("http://{discovery_addr}"),
    };
    let held: Held = Arc::default();
    discovery.hold(ns.name(), &held).await?;
    let violations = Arc::new(Mutex::new(Vec::new()));
    watch_deletions(
        Api::namespaced(cp.client(), ns.name()),
        held.clone(),
        violations.clone(),
    );

    // The template changes: every member is replaced.
    let started = Instant::now();
    let patch =
        serde_json::json!({"spec": {"template": {"metadata": {"labels": {"generation": "2"}}}}});
    let generation = pools
        .patch("rotating", &PatchParams::default(), &Patch::Merge(patch))
        .await?
        .metadata
        .generation;
    let lowest = Arc::new(Mutex::new(REPLICAS));
    watch_lowest_ready(pools.clone(), lowest.clone());
    let release_after = Instant::now() + Duration::from_secs(10);
    let mut released = false;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut failed_reads = 0;
    loop {
        // A failed read (the API server busy) is retried until the deadline.
        let now = match pools.get("rotating").await {
            Ok(now) => now,
            Err(e) => {
                failed_reads += 1;
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "the rotation did not finish; the last read failed: {e} ({failed_reads} failed)"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ready = ready_of(&now);
        {
            let mut low = lowest.lock().unwrap();
            *low = (*low).min(ready);
        }
        let status = now.status.clone().unwrap_or_default();
        // Done once the status is of the new template and every member is of it and Ready.
        let current = status.observed_generation >= generation;
        if current
            && updated_of(&now) == REPLICAS
            && ready == REPLICAS
            && status.replicas == REPLICAS
            && status.draining_replicas == 0
        {
            break;
        }
        // The crawlers let go after a while: their proxies are then removed.
        if !released && Instant::now() > release_after {
            let leases: Vec<String> = held.lock().unwrap().values().cloned().collect();
            for id in leases {
                discovery
                    .call(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
                    .await?;
            }
            held.lock().unwrap().clear();
            released = true;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the rotation did not finish: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rotation = started.elapsed();
    operator.kill().await.ok();
    cp.stop().await;

    let lowest = *lowest.lock().unwrap();
    let violations = violations.lock().unwrap().clone();
    println!("pool_rotation: {REPLICAS} proxies, maxUnavailable 10%, {HELD} held by crawlers");
    println!("  full rotation:           {:.1} s", rotation.as_secs_f64());
    println!("  lowest readyReplicas:    {lowest} (floor {FLOOR})");
    println!("  leased proxies deleted:  {}", violations.len());
    anyhow::ensure!(lowest >= FLOOR, "readyReplicas dropped to {lowest}");
    anyhow::ensure!(
        violations.is_empty(),
        "deleted while leased: {violations:?}"
    );
    Ok(())
}

async fn wait_pool(
    pools: &Api<ProxyPool>,
    what: &str,
    done: impl Fn(&ProxyPool) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        // A failed read (the API server busy) is retried until the deadline.
        let seen = pools.get("rotating").await;
        if seen.as_ref().is_ok_and(&done) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "pool never {what}; last seen: {:?}",
            seen.map(|p| p.status)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
