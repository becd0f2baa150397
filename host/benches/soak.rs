//! A soak of the whole operator: two `proxy-operator run` replicas (leader election, leases
//! stored before answered) against a real kube-apiserver + etcd, with the real test provider
//! keeping its instances in a loopback store. For `SOAK_SECONDS` (default 600):
//! - `SOAK_PROXIES` Proxies (default 1000) with churn: one deleted and one created every 500 ms;
//! - lease traffic from 64 crawlers (grant, hold up to 300 ms, release), sent to whichever
//!   replica is Ready, as the discovery Service would;
//! - the test plugin hot-swapped (a new digest in the plugins ConfigMap) every 30 s;
//! - the leader killed with SIGKILL every 60 s and started again under a new identity (a Pod
//!   replaced), so the standby takes over after the Lease expires (15 s).
//!
//! (With `SOAK_SECONDS` under 300, the kill and the swap come every half and quarter of it.)
//! NextReconcile, once the churn stops, it checks: no leaked instance (the store's instances are exactly
//! the live Proxies' `providerID`s), no proxy ever held by two crawlers at once, every Proxy
//! `Ready` or with a condition saying why, and the replicas' RSS not growing from life to life.
//! It prints the figures and exits non-zero if an invariant is broken.
//!
//! `SOAK_SECONDS=60 cargo bench -p proxy-operator --bench soak` (needs `make plugins` and the
//! fixtures); `make test` runs the 60-second version in the dev profile
//! (`cargo test -p proxy-operator --bench soak`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::operator_process::{OperatorProcess, OperatorSetup, TOKEN};
use common::{InstanceStore, plugin_bytes};
use futures_util::StreamExt;
use harness::ControlPlane;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use proxy_operator::api::{Phase, Proxy, ProxySpec};

const CRAWLERS: usize = 64;
const LEASE_TTL: Duration = Duration::from_secs(30);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The test plugin with a custom section appended: another digest, the same behaviour.
fn plugin_version(n: u32) -> Vec<u8> {
    let mut bytes = plugin_bytes("test");
    let name = b"proxy-operator-soak-version";
    let payload = [&[name.len() as u8][..], name, &n.to_le_bytes()].concat();
    bytes.push(0);
    bytes.push(payload.len() as u8);
    bytes.extend_from_slice(&payload);
    bytes
}

fn proxy(name: &str) -> Proxy {
    Proxy::new(
        name,
        ProxySpec {
            provider: "store".into(),
            placement: None,
            cloud_init: None,
            vendor_data: None,
            install_guest_agent: true,
            port: 3128,
            recreate_on_loss: false,
            provider_options: None,
        },
    )
}

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One replica slot and its lives: each start is a new life with a new identity, as a Pod
/// replaced by its Deployment, so a kill makes the standby take over.
struct Replica {
    slot: &'static str,
    process: OperatorProcess,
    life: usize,
}

/// What crawlers saw: every holding of a proxy, from the grant's request to the release's.
#[derive(Default)]
struct Ledger {
    /// (proxy, grant answered, held until)
    holdings: Mutex<Vec<(String, Instant, Instant)>>,
    grants: AtomicUsize,
    refusals: Mutex<BTreeMap<String, usize>>,
    forgotten: AtomicUsize,
    first_grant_after: Mutex<Option<Instant>>,
}

async fn crawler(
    discovery: Arc<Mutex<Option<SocketAddr>>>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        let Some(addr) = *discovery.lock().unwrap() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let asked = Instant::now();
        let answer = client
            .post(format!("http://{addr}/v1/leases"))
            .bearer_auth(TOKEN)
            .body(format!("{{\"ttlSeconds\": {}}}", LEASE_TTL.as_secs()))
            .send()
            .await;
        let Ok(answer) = answer else {
            *ledger
                .refusals
                .lock()
                .unwrap()
                .entry("no answer".into())
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = answer.status().as_u16();
        let body: serde_json::Value =
            serde_json::from_str(&answer.text().await.unwrap_or_default()).unwrap_or_default();
        if status != 201 {
            let kind = body["type"]
                .as_str()
                .unwrap_or("?")
                .rsplit(':')
                .next()
                .unwrap_or("?");
            *ledger
                .refusals
                .lock()
                .unwrap()
                .entry(format!("{status} {kind}"))
                .or_default() += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let answered = Instant::now();
        ledger.grants.fetch_add(1, Ordering::Relaxed);
        ledger
            .first_grant_after
            .lock()
            .unwrap()
            .get_or_insert(Instant::now());
        let id = body["id"].as_str().unwrap().to_string();
        let proxy = format!(
            "{}/{}",
            body["proxy"]["namespace"].as_str().unwrap(),
            body["proxy"]["name"].as_str().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 300)).await;
        // Released once the replica that serves answers; a lease nobody can release is held by
        // the server until its expiry, which is no earlier than `asked + LEASE_TTL`.
        let held_until = loop {
            let released = Instant::now();
            if released > asked + LEASE_TTL {
                break asked + LEASE_TTL;
            }
            let addr = discovery.lock().unwrap().unwrap_or(addr);
            match client
                .delete(format!("http://{addr}/v1/leases/{id}"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .map(|r| r.status().as_u16())
            {
                Ok(204 | 410) => break released,
                Ok(404) => {
                    // The serving replica does not know a lease it granted: forgotten.
                    ledger.forgotten.fetch_add(1, Ordering::Relaxed);
                    break released;
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        ledger
            .holdings
            .lock()
            .unwrap()
            .push((proxy, answered, held_until));
    }
}

/// Proxies granted to a crawler while another still held them. A holding runs from the grant's
/// answer to the moment its holder let go (the release was sent) or, unreleased, to the
/// earliest the server could expire it. A right server grants again only after it processed
/// the release, so a second grant *answered* before the first holding ended is a double grant:
/// the check cannot accuse a correct server.
fn double_holdings(holdings: &[(String, Instant, Instant)]) -> Vec<String> {
    let mut by_proxy: HashMap<&str, Vec<(Instant, Instant)>> = HashMap::new();
    for (proxy, answered, until) in holdings {
        by_proxy.entry(proxy).or_default().push((*answered, *until));
    }
    let mut doubles = Vec::new();
    for (proxy, mut spans) in by_proxy {
        spans.sort();
        let mut held_until = None::<Instant>;
        for (answered, until) in spans {
            if held_until.is_some_and(|h| answered < h) {
                doubles.push(proxy.to_string());
            }
            held_until = Some(held_until.map_or(until, |h| h.max(until)));
        }
    }
    doubles
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds = env_number("SOAK_SECONDS", 600);
    let proxies = env_number("SOAK_PROXIES", 1000) as usize;
    let length = Duration::from_secs(seconds);
    let kill_every = if seconds >= 300 {
        Duration::from_secs(60)
    } else {
        length / 2
    };
    let swap_every = if seconds >= 300 {
        Duration::from_secs(30)
    } else {
        length / 4
    };

    let cp = ControlPlane::start().await?;
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    cp.apply_crds(crds).await?;
    let ns = cp.namespace("soak").await?;
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n{}  maxConcurrentCalls: 16\n",
            store.provider_entry("store")
        ),
    )?;
    let config = config.to_str().unwrap().to_string();
    let no_plugins = dir.path().join("no-plugins");
    std::fs::create_dir(&no_plugins)?;
    let maps: Api<ConfigMap> = Api::namespaced(cp.client(), ns.name());
    let put_plugin = |n: u32| {
        let maps = maps.clone();
        async move {
            let map = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plugins"},
                "binaryData": {"test.wasm": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, plugin_version(n))},
            });
            maps.patch(
                "plugins",
                &PatchParams::apply("soak").force(),
                &Patch::Apply(map),
            )
            .await
            .map(|_| ())
        }
    };
    put_plugin(0).await?;

    let start = |slot: &'static str, life: usize| {
        let identity = format!("replica-{slot}-{life}");
        let process = OperatorProcess::start_with(OperatorSetup {
            kubeconfig: cp.kubeconfig().to_path_buf(),
            namespace: ns.name(),
            own_namespace: None,
            dir: dir.path(),
            providers_config: &config,
            health_target: "127.0.0.1:9",
            operator_id: "soak".into(),
            health_interval: "0s",
            plugins_dir: no_plugins.clone(),
            extra: [
                "--leader-election",
                "--leader-election-identity",
                identity.as_str(),
                "--leader-election-lease-seconds",
                "15",
                "--plugins-configmap",
                "plugins",
                "--gc-interval",
                "10s",
                "--gc-min-age",
                "5s",
            ]
            .map(String::from)
            .to_vec(),
            log: &format!("{identity}.log"),
            discovery_tls: None,
            metrics_insecure: true,
        });
        Replica {
            slot,
            process,
            life,
        }
    };
    let mut replicas = vec![start("a", 0)];
    replicas[0].process.wait_leading().await;
    replicas.push(start("b", 0));

    let api: Api<Proxy> = Api::namespaced(cp.client(), ns.name());
    let created = Instant::now();
    futures_util::stream::iter(0..proxies)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &proxy(&format!("p-{i:05}")))
                    .await
                    .expect("create");
            }
        })
        .await;
    let ready_count = || async {
        api.list(&ListParams::default()).await.map(|l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready))
                .count()
        })
    };
    // A list that fails (the API server busy: a cut chunked body, a timeout) is retried until
    // the deadline, which then says what the last try saw.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let seen = match ready_count().await {
            Ok(ready) if ready >= proxies => break,
            Ok(ready) => format!("{ready} Ready"),
            Err(e) => format!("listing the Proxies failed: {e}"),
        };
        anyhow::ensure!(
            Instant::now() < deadline,
            "{proxies} Proxies not Ready in 600 s; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_ready = created.elapsed();

    // The "Service": the replica whose /leaderz answers 200 (the one the leader label selects).
    let serving: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let crawlers: Vec<_> = (0..CRAWLERS)
        .map(|_| tokio::spawn(crawler(serving.clone(), ledger.clone(), stop.clone())))
        .collect();
    let churn = {
        let (api, stop) = (api.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut next, mut oldest, mut made, mut removed) = (proxies, 0usize, 0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                if api
                    .delete(&format!("p-{oldest:05}"), &DeleteParams::default())
                    .await
                    .is_ok()
                {
                    removed += 1;
                }
                oldest += 1;
                if api
                    .create(&PostParams::default(), &proxy(&format!("p-{next:05}")))
                    .await
                    .is_ok()
                {
                    made += 1;
                }
                next += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (made, removed)
        })
    };

    let began = Instant::now();
    let (mut next_kill, mut next_swap) = (began + kill_every, began + swap_every);
    let (mut swaps, mut kills) = (0u32, Vec::new());
    let mut rss: BTreeMap<(&'static str, usize), Vec<u64>> = BTreeMap::new();
    let mut last_rss = Instant::now();
    while began.elapsed() < length {
        let mut leader = None;
        for (i, replica) in replicas.iter_mut().enumerate() {
            if replica.process.proc.try_exited().is_some() {
                anyhow::bail!(
                    "{} exited by itself:\n{}",
                    replica.slot,
                    replica.process.proc.log_tail(40)
                );
            }
            if let Some((reqwest::StatusCode::OK, _)) = replica.process.leaderz().await {
                leader = Some(i);
            }
        }
        *serving.lock().unwrap() = leader.map(|i| replicas[i].process.discovery);
        if last_rss.elapsed() >= Duration::from_secs(5) {
            last_rss = Instant::now();
            for replica in &replicas {
                if let Some(kib) = rss_kib(replica.process.proc.pid()) {
                    rss.entry((replica.slot, replica.life))
                        .or_default()
                        .push(kib);
                }
            }
        }
        if Instant::now() >= next_swap {
            swaps += 1;
            put_plugin(swaps).await?;
            next_swap += swap_every;
        }
        if Instant::now() >= next_kill
            && let Some(i) = leader
        {
            next_kill += kill_every;
            let (slot, life) = (replicas[i].slot, replicas[i].life + 1);
            replicas[i].process.proc.kill();
            *serving.lock().unwrap() = None;
            *ledger.first_grant_after.lock().unwrap() = None;
            let killed = Instant::now();
            replicas[i] = start(slot, life);
            // Failover: from the kill to the first grant any replica answers.
            let deadline = killed + Duration::from_secs(90);
            loop {
                for replica in replicas.iter() {
                    if let Some((reqwest::StatusCode::OK, _)) = replica.process.leaderz().await {
                        *serving.lock().unwrap() = Some(replica.process.discovery);
                    }
                }
                if let Some(at) = *ledger.first_grant_after.lock().unwrap() {
                    kills.push(at - killed);
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "no grant within 90 s of killing replica {slot}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (made, removed) = churn.await?;
    for crawler in crawlers {
        crawler.await?;
    }

    // Settle: deletions finish, late instances are collected.
    let settled = Instant::now();
    let (leaked, missing, unexplained) = loop {
        let live = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) if settled.elapsed() <= Duration::from_secs(120) => {
                eprintln!("soak: listing the Proxies failed, retrying: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => anyhow::bail!("listing the Proxies failed until the settle deadline: {e}"),
        };
        let recorded: BTreeSet<String> = live
            .iter()
            .filter_map(|p| p.status.as_ref()?.provider_id.clone())
            .collect();
        let instances: BTreeSet<String> = store.ids().into_iter().collect();
        let leaked: Vec<String> = instances.difference(&recorded).cloned().collect();
        let missing: Vec<String> = recorded.difference(&instances).cloned().collect();
        let unexplained: Vec<String> = live
            .iter()
            .filter(|p| {
                let status = p.status.as_ref();
                status.and_then(|s| s.phase) != Some(Phase::Ready)
                    && !status.is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.status == "False" && !c.message.is_empty())
                    })
            })
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        let all_ready = live
            .iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Ready));
        if (leaked.is_empty() && missing.is_empty() && all_ready)
            || settled.elapsed() > Duration::from_secs(120)
        {
            break (leaked, missing, unexplained);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let holdings = ledger.holdings.lock().unwrap().clone();
    let doubles = double_holdings(&holdings);
    let forgotten = ledger.forgotten.load(Ordering::Relaxed);
    for replica in &mut replicas {
        replica.process.proc.kill();
    }
    cp.stop().await;

    println!(
        "soak: {seconds} s, {proxies} Proxies, {CRAWLERS} crawlers, kill every {kill_every:?}, swap every {swap_every:?}"
    );
    println!(
        "  all {proxies} Ready after            {:.1} s",
        all_ready.as_secs_f64()
    );
    println!("  churn:                       {made} created, {removed} deleted");
    println!(
        "  grants:                      {} ({:.0}/s), refusals {:?}",
        ledger.grants.load(Ordering::Relaxed),
        ledger.grants.load(Ordering::Relaxed) as f64 / length.as_secs_f64(),
        ledger.refusals.lock().unwrap()
    );
    println!("  plugin swaps:                {swaps}");
    println!(
        "  kills → first grant:         {:?}",
        kills
            .iter()
            .map(|d| format!("{:.1} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
    );
    println!(
        "  settled after:               {:.1} s",
        settled.elapsed().as_secs_f64()
    );
    for ((slot, life), samples) in &rss {
        println!(
            "  RSS replica {slot} life {life}:         first {:.1} MiB, max {:.1} MiB, last {:.1} MiB ({} samples)",
            samples[0] as f64 / 1024.0,
            *samples.iter().max().unwrap() as f64 / 1024.0,
            *samples.last().unwrap() as f64 / 1024.0,
            samples.len()
        );
    }
    let mut broken = Vec::new();
    if !leaked.is_empty() {
        broken.push(format!("leaked instances: {leaked:?}"));
    }
    if !missing.is_empty() {
        broken.push(format!("Proxies whose instance is gone: {missing:?}"));
    }
    if !doubles.is_empty() {
        broken.push(format!("proxies held by two crawlers at once: {doubles:?}"));
    }
    if forgotten > 0 {
        broken.push(format!(
            "{forgotten} granted leases unknown to the serving replica"
        ));
    }
    if !unexplained.is_empty() {
        broken.push(format!(
            "Proxies neither Ready nor saying why: {unexplained:?}"
        ));
    }
    // Flat: no life of a replica holds much more than the first one did.
    let peaks: Vec<u64> = rss.values().map(|s| *s.iter().max().unwrap()).collect();
    if let (Some(first), Some(max)) = (peaks.first(), peaks.iter().max())
        && *max > first * 3 / 2
    {
        broken.push(format!("operator RSS grew: peaks {peaks:?} KiB"));
    }
    if broken.is_empty() {
        println!(
            "  invariants:                  all held ({} holdings checked)",
            holdings.len()
        );
        Ok(())
    } else {
        anyhow::bail!("soak invariants broken:\n  {}", broken.join("\n  "))
    }
}
