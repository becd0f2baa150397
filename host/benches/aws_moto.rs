//! The aws provider against moto (harness::Moto): how long `create` → `running` takes through the
//! real runtime, with the host signing every request, one Proxy at a time and 100 at once, and
//! how many EC2 calls each proxy costs (a counting front between the host and moto). moto answers
//! from memory in Python: the figures are the operator's and the plugin's share plus moto's, not
//! a real region's (where `pending` → `running` takes tens of seconds).
//!
//! `cargo bench -p proxy-operator --profile dev --bench aws_moto` (needs `make plugins` and the
//! moto venv of .ci/install-fixtures.sh); record figures in docs/performance.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proxy_operator::capabilities::Grants;
use proxy_operator::plugins::types::{InstanceSpec, InstanceState, Owner};
use proxy_operator::plugins::{
    EngineOptions, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};

fn plugins_dir() -> PathBuf {
    std::env::var_os("PROXY_OPERATOR_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"))
}

/// A front that relays every request to moto and counts them.
async fn counting_front(moto: String, calls: Arc<AtomicUsize>) -> String {
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (moto, calls, client) = (moto.clone(), calls.clone(), client.clone());
        async move {
            calls.fetch_add(1, Ordering::Relaxed);
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let moto = harness::Moto::start().await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let front = counting_front(moto.url(), calls.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("id"), "AKIDBENCH").unwrap();
    std::fs::write(dir.path().join("secret"), "bench-secret").unwrap();
    let grants: Grants = serde_json::from_value(serde_json::json!({"http": {
        "allow": [front],
        "credentials": [{"url": front, "valueFrom": {"awsCredentials": {
            "region": "eu-west-1",
            "accessKeyIdFrom": {"file": dir.path().join("id")},
            "secretAccessKeyFrom": {"file": dir.path().join("secret")},
        }}}],
    }}))
    .unwrap();
    let config = serde_json::json!({
        "region": "eu-west-1", "amis": {"eu-west-1": "ami-12c6146b"}, "endpoint": front,
        "allowFrom": ["203.0.113.0/24"],
    });
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
