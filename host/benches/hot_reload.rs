//! How long a plugin put into the watched ConfigMap takes to serve: from the ConfigMap write
//! returning to the new version answering calls (watch event, decode, compile, describe,
//! validate-config, swap), against the real kube-apiserver of the test harness.
//!
//! `cargo bench -p proxy-operator --bench hot_reload` (needs `make plugins` and the fixtures).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use proxy_operator::provider::plugins::{EngineOptions, PluginEngine};
use proxy_operator::provider::registry::{PluginRegistry, RegistryMetrics, RegistryOptions};
use sha2::{Digest, Sha256};

const ROUNDS: u8 = 10;

fn test_plugin() -> Vec<u8> {
    let dir = std::env::var_os("PROXY_OPERATOR_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"));
    std::fs::read(dir.join("test.wasm")).expect("target/plugins/test.wasm (make plugins)")
}

/// The test plugin with a custom section appended: a new version (digest), same behaviour.
fn version(base: &[u8], n: u8) -> Vec<u8> {
    let mut bytes = base.to_vec();
    let name = b"bench-version";
    bytes.extend_from_slice(&[0, (name.len() + 2) as u8, name.len() as u8]);
    bytes.extend_from_slice(name);
    bytes.push(n);
    bytes
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let cp = ControlPlane::shared().await;
        let ns = cp.namespace("bench-reload").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("providers.yaml");
        std::fs::write(
            &config,
            "providers:\n- {name: hot, type: hot, config: {endpoint: \"memory:1\"}}\n",
        )
        .unwrap();
        let registry = prometheus::Registry::new();
        let engine = PluginEngine::new(EngineOptions::default(), &registry).unwrap();
        let plugins = PluginRegistry::start(
            engine,
            RegistryOptions {
                plugins_dir: dir.path().join("none"),
                configmap: Some((ns.name().to_string(), "plugins".into())),
                download_dir: None,
            },
            &config,
            Some(ns.client()),
            RegistryMetrics::unregistered().unwrap(),
        )
        .await
        .unwrap();
        let watch = tokio::spawn(
            plugins
                .clone()
                .watch_configmap(ns.client(), proxy_operator::support::leader::LeaderView::default()),
        );
        let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
        let base = test_plugin();
        let mut samples = Vec::new();
        for n in 0..ROUNDS {
            let bytes = version(&base, n);
            let digest = hex::encode(Sha256::digest(&bytes));
            let map = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("plugins".into()),
                    ..Default::default()
                },
                binary_data: Some(BTreeMap::from([("hot.wasm".into(), ByteString(bytes))])),
                ..Default::default()
            };
            maps.patch("plugins", &PatchParams::apply("bench").force(), &Patch::Apply(&map))
                .await
                .unwrap();
            let written = Instant::now();
            loop {
                let providers = plugins.providers().current();
                if let Some(p) = providers.get("hot")
                    && p.plugin().sha256 == digest
                    && p.list().await.is_ok()
                {
                    break;
                }
                assert!(written.elapsed() < Duration::from_secs(60), "never served");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples.push(written.elapsed());
        }
        watch.abort();
        samples.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "ConfigMap write -> new plugin serving ({ROUNDS} new versions, {} KiB each, compiled each time): median {:.0} ms, max {:.0} ms, min {:.0} ms",
            base.len() / 1024,
            ms(samples[samples.len() / 2]),
            ms(samples[samples.len() - 1]),
            ms(samples[0])
        );
    });
}
