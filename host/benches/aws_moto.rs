//! The aws provider against moto (harness::Moto): how long `create` → `running` takes through the
//! real runtime, with the host signing every request, one Proxy at a time and 100 at once, and
//! how many EC2 calls each proxy costs (a counting front between the host and moto). moto answers
//! from memory in Python: the figures are the operator's and the plugin's share plus moto's, not
//! a real region's (where `pending` → `running` takes tens of seconds).
//!
//! Then (issue #34) a ProxyPool of 100 aws Proxies from 0 to Ready through the real
//! `proxy-operator run` binary and a real kube-apiserver (harness), against a fresh moto behind
//! the counting front: the time until `readyReplicas` is 100 and the EC2 calls per proxy, by
//! action. Health probing is off (`--health-interval 0s`), as in the aws operator tests: moto's
//! instances have addresses where nothing answers, so Ready is "running with an address".
//!
//! `cargo bench -p proxy-operator --profile dev --bench aws_moto` (needs `make plugins` and the
//! moto venv of .ci/install-fixtures.sh); `BENCH_POOL_ONLY=1` runs the pool phase alone; record
//! figures in docs/performance.md.

#[path = "common/mod.rs"]
mod common;

use common::plugins_dir;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use proxy_operator::api::ProxyPool;

use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::types::{InstanceSpec, InstanceState, Owner};
use proxy_operator::provider::plugins::{
    EngineOptions, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};

/// EC2 calls by `Action`.
type ByAction = Arc<Mutex<BTreeMap<String, usize>>>;

/// A front that relays every request to moto and counts them (in all, and by action).
async fn counting_front(moto: String, calls: Arc<AtomicUsize>, by_action: ByAction) -> String {
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (moto, calls, client) = (moto.clone(), calls.clone(), client.clone());
        let by_action = by_action.clone();
        async move {
            calls.fetch_add(1, Ordering::Relaxed);
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let action = url::form_urlencoded::parse(&body)
                .find(|(k, _)| k == "Action")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_else(|| "(other)".into());
            *by_action.lock().unwrap().entry(action).or_default() += 1;
            let mut forwarded = client.post(moto).body(body);
            for (name, value) in parts.headers.iter().filter(|(n, _)| *n != "host") {
                forwarded = forwarded.header(name, value);
            }
            let answer = forwarded.send().await.unwrap();
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap();
            (axum::http::StatusCode::from_u16(status).unwrap(), text)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn spec(name: &str) -> InstanceSpec {
    InstanceSpec {
        name: name.into(),
        owner: Owner {
            namespace: "bench".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            operator_id: "bench".into(),
        },
        zone: None,
        image: None,
        machine_type: None,
        user_data: b"#cloud-config\n".to_vec(),
        vendor_data: Vec::new(),
        install_guest_agent: false,
        port: 3128,
        labels: Vec::new(),
        options: serde_json::json!({}),
        credentials: None,
    }
}

/// `create`, then `get` until running; the time it took.
async fn to_running(provider: &ProviderInstance, name: &str) -> Duration {
    let started = Instant::now();
    let made = provider.create(spec(name)).await.unwrap();
    let mut state = made.state;
    while state != InstanceState::Running {
        state = provider.get(&made.provider_id).await.unwrap().state;
    }
    started.elapsed()
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The grants and config of an aws provider instance against `front`, with static keys in files
/// of `dir`.
fn aws_entry(front: &str, dir: &std::path::Path) -> (serde_json::Value, serde_json::Value) {
    std::fs::write(dir.join("id"), "AKIDBENCH").unwrap();
    std::fs::write(dir.join("secret"), "bench-secret").unwrap();
    let grants = serde_json::json!({"http": {
        "allow": [front],
        "credentials": [{"url": front, "valueFrom": {"awsCredentials": {
            "region": "eu-west-1",
            "accessKeyIdFrom": {"file": dir.join("id")},
            "secretAccessKeyFrom": {"file": dir.join("secret")},
        }}}],
    }});
    let config = serde_json::json!({
        "region": "eu-west-1", "amis": {"eu-west-1": "ami-12c6146b"}, "endpoint": front,
        "allowFrom": ["203.0.113.0/24"],
    });
    (grants, config)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var_os("BENCH_POOL_ONLY").is_none() {
        calls_through_the_runtime().await;
    }
    pool_from_zero(100).await.unwrap();
}

/// `create` → running through the runtime: the first, 20 one at a time, 100 at once.
async fn calls_through_the_runtime() {
    let moto = harness::Moto::start().await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let front = counting_front(moto.url(), calls.clone(), ByAction::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (grants, config) = aws_entry(&front, dir.path());
    let grants: Grants = serde_json::from_value(grants).unwrap();
    let engine = PluginEngine::new(EngineOptions::default(), &prometheus::Registry::new()).unwrap();
    let bytes = std::fs::read(plugins_dir().join("aws.wasm")).expect("run `make plugins` first");
    let plugin = engine.load("aws.wasm", bytes).await.unwrap();
    let provider = Arc::new(
        ProviderInstance::new(
            engine,
            "aws-bench",
            plugin,
            &config,
            &grants.validate().unwrap(),
            ProviderInstanceOptions::default(),
        )
        .unwrap(),
    );

    // The first create also makes the security group.
    let first = to_running(&provider, "px-bench-first").await;
    println!("first create → running (security group made): {first:?}");

    let before = calls.load(Ordering::Relaxed);
    let mut one_at_a_time = Vec::new();
    for n in 0..20 {
        one_at_a_time.push(to_running(&provider, &format!("px-bench-seq-{n}")).await);
    }
    one_at_a_time.sort();
    let per_proxy = (calls.load(Ordering::Relaxed) - before) as f64 / 20.0;
    println!(
        "one at a time ×20: create → running median {:?}, p90 {:?}; {per_proxy:.1} EC2 calls a proxy",
        quantile(&one_at_a_time, 0.5),
        quantile(&one_at_a_time, 0.9)
    );

    let before = calls.load(Ordering::Relaxed);
    let started = Instant::now();
    let all: Vec<_> = (0..100)
        .map(|n| {
            let provider = provider.clone();
            tokio::spawn(async move { to_running(&provider, &format!("px-bench-par-{n}")).await })
        })
        .collect();
    let mut each = Vec::new();
    for task in all {
        each.push(task.await.unwrap());
    }
    let total = started.elapsed();
    each.sort();
    let per_proxy = (calls.load(Ordering::Relaxed) - before) as f64 / 100.0;
    println!(
        "100 at once: all running after {total:?}; each median {:?}, p90 {:?}; {per_proxy:.1} EC2 calls a proxy",
        quantile(&each, 0.5),
        quantile(&each, 0.9)
    );
}

/// A ProxyPool of `replicas` aws Proxies from 0 to `readyReplicas == replicas`, through the
/// operator binary against a fresh moto; prints the time and the EC2 calls per proxy by action.
async fn pool_from_zero(replicas: usize) -> anyhow::Result<()> {
    let moto = harness::Moto::start().await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let by_action = ByAction::default();
    let front = counting_front(moto.url(), calls.clone(), by_action.clone()).await;
    let cp = harness::ControlPlane::start().await?;
    cp.apply_crds(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds"))
        .await?;
    let ns = cp.namespace("aws-pool").await?;
    let dir = tempfile::tempdir()?;
    let (grants, config) = aws_entry(&front, dir.path());
    let providers = serde_json::json!({"providers": [{
        "name": "aws-eu", "type": "aws", "config": config, "grants": grants,
    }]});
    let providers_file = dir.path().join("providers.yaml");
    std::fs::write(&providers_file, providers.to_string())?;
    let mut operator = common::operator_run(
        &mut tokio::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator")),
        &providers_file,
        ns.name(),
        "127.0.0.1:0",
    )
    .args(["--health-interval", "0s"])
    .env("KUBECONFIG", cp.kubeconfig())
    .env("LOG_LEVEL", "warn")
    .kill_on_drop(true)
    .spawn()?;
    let pools: Api<ProxyPool> = Api::namespaced(cp.client(), ns.name());
    let pool = common::pool_of("aws", replicas, "aws-eu")?;
    // The operator's start-up calls (the provider check, the GC's first list) are not the pool's.
    let before = calls.load(Ordering::Relaxed);
    let actions_before = by_action.lock().unwrap().clone();
    let started = Instant::now();
    pools.create(&PostParams::default(), &pool).await?;
    let deadline = started + Duration::from_secs(600);
    let mut ready = 0;
    while ready < replicas && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match pools.get("aws").await {
            Ok(pool) => ready = pool.status.map_or(0, |s| s.ready_replicas) as usize,
            Err(e) => eprintln!("aws_moto: reading the pool failed, retrying: {e}"),
        }
    }
    let took = started.elapsed();
    let made = calls.load(Ordering::Relaxed) - before;
    operator.kill().await.ok();
    cp.stop().await;
    println!(
        "a ProxyPool of {replicas} from 0: readyReplicas {ready} after {took:.2?}; {:.2} EC2 calls a proxy ({made} in all)",
        made as f64 / replicas as f64
    );
    for (action, n) in by_action.lock().unwrap().iter() {
        let n = n - actions_before.get(action).copied().unwrap_or(0);
        if n > 0 {
            println!(
                "  {action}: {n} ({:.2} a proxy)",
                n as f64 / replicas as f64
            );
        }
    }
    anyhow::ensure!(ready == replicas, "{ready} of {replicas} Ready");
    Ok(())
}
