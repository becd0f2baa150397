//! What a plugin call costs: a fresh pooled instance + `get`, and `list` of 100 instances, through
//! the real runtime with the real test-provider component, beside the same logic compiled natively;
//! compile and cached-load time of each shipped plugin.
//!
//! Run with `make bench`; record figures in docs/performance.md.

#[path = "common/mod.rs"]
mod common;

use common::plugins_dir;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::{
    EngineOptions, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};

fn shipped_plugins() -> Vec<(String, Vec<u8>)> {
    let mut plugins: Vec<(String, Vec<u8>)> = std::fs::read_dir(plugins_dir())
        .expect("run `make plugins` first")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    plugins.sort();
    plugins
}

const MEMORY_CONFIG: &str = r#"{"endpoint":"memory:100"}"#;

fn calls(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let engine = PluginEngine::new(EngineOptions::default(), &prometheus::Registry::new()).unwrap();
    let bytes = std::fs::read(plugins_dir().join("test.wasm")).expect("run `make plugins` first");
    let plugin = runtime.block_on(engine.load("test.wasm", bytes)).unwrap();
    let provider = Arc::new(
        ProviderInstance::new(
            engine.clone(),
            "bench",
            plugin,
            &serde_json::from_str(MEMORY_CONFIG).unwrap(),
            &Grants::default().validate().unwrap(),
            ProviderInstanceOptions::default(),
        )
        .unwrap(),
    );

    let mut group = c.benchmark_group("plugin_call");
    group.bench_function("wasm/instantiate+get", |b| {
        b.to_async(&runtime).iter(|| {
            let provider = provider.clone();
            async move { provider.get("mem-42").await.unwrap() }
        })
    });
    group.bench_function("native/get", |b| {
        b.iter(|| {
            test_provider::memory_get(native_config(), std::hint::black_box("mem-42")).unwrap()
        })
    });
    group.bench_function("wasm/instantiate+list100", |b| {
        b.to_async(&runtime).iter(|| {
            let provider = provider.clone();
            async move { provider.list().await.unwrap() }
        })
    });
    group.bench_function("native/list100", |b| b.iter(native_list100));
    // The floor of any boundary that copies: the same list built, then copied once more, which is
    // what the host does when it lifts the guest's answer out of the instance's memory.
    group.bench_function("native/list100+copy", |b| {
        b.iter(|| {
            let built = native_list100();
            let copied = built.clone();
            drop(built);
            copied
        })
    });
    group.finish();
}

fn loading(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("plugin_load");
    group.sample_size(10);
    for (name, bytes) in shipped_plugins() {
        let uncached =
            PluginEngine::new(EngineOptions::default(), &prometheus::Registry::new()).unwrap();
        group.bench_function(format!("{name}/compile"), |b| {
            b.to_async(&runtime).iter(|| {
                let (engine, bytes) = (uncached.clone(), bytes.clone());
                async move { engine.load("bench", bytes).await.unwrap() }
            })
        });
        let dir = tempfile::tempdir().unwrap();
        let cached = PluginEngine::new(
            EngineOptions {
                cache_dir: Some(dir.path().join("cache")),
                ..EngineOptions::default()
            },
            &prometheus::Registry::new(),
        )
        .unwrap();
        runtime
            .block_on(cached.load("warm", bytes.clone()))
            .unwrap();
        group.bench_function(format!("{name}/cached-load"), |b| {
            b.to_async(&runtime).iter(|| {
                let (engine, bytes) = (cached.clone(), bytes.clone());
                async move {
                    let plugin = engine.load("bench", bytes).await.unwrap();
                    assert!(plugin.from_cache);
                    plugin
                }
            })
        });
    }
    group.finish();
}

/// What the guest does with its config on every call: parse it, find the instance count.
fn native_config() -> usize {
    let config: test_provider::Config =
        proxy_operator_sdk::parse_config(std::hint::black_box(MEMORY_CONFIG)).unwrap();
    config
        .endpoint
        .strip_prefix("memory:")
        .unwrap()
        .parse()
        .unwrap()
}

fn native_list100() -> Vec<proxy_operator_sdk::Instance> {
    test_provider::memory_list(native_config())
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = calls, loading
}
criterion_main!(benches);
