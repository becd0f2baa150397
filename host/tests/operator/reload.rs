//! Plugins from a watched ConfigMap, hot-loaded on the real control plane: put one in, replace it
//! under load, replace it with garbage, delete it; digest pins; URL plugins downloaded once; the
//! providers config reloaded with the same validate-then-swap rule.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{FileServer, TestNamespace};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use proxy_operator::api::{ProviderHealth, Proxy};
use proxy_operator::lifecycle::controller::{self, Context};
use proxy_operator::provider::providerhealth::{ProviderCheckMetrics, pass};
use proxy_operator::provider::registry::{
    PackedPlugin, PluginRegistry, RegistryMetrics, RegistryOptions,
};
use sha2::{Digest, Sha256};

use super::common::{InstanceStore, engine_with, plugin_bytes, test_options};
use super::{control_plane, wait_for};

/// The test plugin with a custom section appended: another version (digest), same behaviour.
fn version(n: u8) -> Vec<u8> {
    let mut bytes = plugin_bytes("test");
    let name = b"proxy-operator-test-version";
    let payload_len = 1 + name.len() + 1;
    bytes.push(0); // custom section
    bytes.push(payload_len as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.push(n);
    bytes
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn config_entry(name: &str, plugin_type: &str, store: &InstanceStore, extra: &str) -> String {
    format!(
        "- name: {name}\n  type: {plugin_type}\n  config: {{endpoint: \"{}\"}}\n  grants: {{http: {{allow: [\"http://{}\"]}}}}\n{extra}",
        store.url(),
        store.addr
    )
}

struct Setup {
    registry: Arc<PluginRegistry>,
    metrics: prometheus::Registry,
    maps: Api<ConfigMap>,
    _dir: tempfile::TempDir,
    watch: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(watch) = &self.watch {
            watch.abort();
        }
    }
}

impl Setup {
    /// A registry reading plugins from ConfigMap `plugins` of `ns` only (empty plugins dir).
    async fn start(ns: &TestNamespace, config: &str, download_dir: Option<&Path>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("providers.yaml");
        std::fs::write(&config_file, config).unwrap();
        let (engine, _) = engine_with(test_options()).await;
        let metrics = prometheus::Registry::new();
        let registry = PluginRegistry::start(
            engine,
            RegistryOptions {
                plugins_dir: dir.path().join("no-builtins"),
                configmap: Some((ns.name().to_string(), "plugins".into())),
                download_dir: download_dir.map(Path::to_path_buf),
            },
            &config_file,
            Some(ns.client()),
            RegistryMetrics::register(&metrics).unwrap(),
        )
        .await
        .unwrap();
        Setup {
            registry,
            metrics,
            maps: ns.api(),
            _dir: dir,
            watch: None,
        }
    }

    fn watch(&mut self, ns: &TestNamespace) {
        self.watch = Some(tokio::spawn(self.registry.clone().watch_configmap(
            ns.client(),
            proxy_operator::support::leader::LeaderView::always_serving(),
        )));
    }

    fn config_file(&self) -> std::path::PathBuf {
        self._dir.path().join("providers.yaml")
    }

    async fn put(&self, key: &str, bytes: Vec<u8>) {
        let map = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("plugins".into()),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(key.to_string(), ByteString(bytes))])),
            ..Default::default()
        };
        self.maps
            .patch(
                "plugins",
                &PatchParams::apply("test").force(),
                &Patch::Apply(&map),
            )
            .await
            .unwrap();
    }

    fn serving_sha(&self, provider: &str) -> Option<String> {
        self.registry
            .providers()
            .current()
            .get(provider)
            .map(|p| p.plugin().sha256.clone())
    }

    fn load_errors(&self, plugin: &str) -> u64 {
        self.metrics
            .gather()
            .iter()
            .find(|f| f.name() == "proxy_operator_plugin_load_errors_total")
            .and_then(|f| {
                f.get_metric()
                    .iter()
                    .find(|m| m.get_label().iter().any(|l| l.value() == plugin))
                    .map(|m| m.get_counter().get_value() as u64)
            })
            .unwrap_or(0)
    }
}

/// Polls `check` every 20 ms for up to 60 s.
pub(crate) async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn provider_health(name: &str) -> ProviderHealth {
    let cp = control_plane().await;
    let api: Api<ProviderHealth> = Api::all(cp.client());
    api.get(name).await.unwrap()
}

fn condition(ph: &ProviderHealth, type_: &str) -> (String, String, String) {
    let c = ph
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition: {ph:?}"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_in_the_configmap_is_hot_loaded_replaced_under_load_and_survives_garbage() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-hot").await.unwrap();
    let store = InstanceStore::start().await;
    let provider = format!("{}-hot", ns.name());
    let mut setup = Setup::start(
        &ns,
        &format!("providers:\n{}", config_entry(&provider, "hot", &store, "")),
        None,
    )
    .await;
    // Not uploaded yet: configured, not loaded, nothing crashes.
    let providers = setup.registry.providers().current();
    let missing = providers.not_loaded(&provider).expect("not loaded yet");
    assert!(missing.reason.contains("no plugin `hot`"), "{missing:?}");
    setup.watch(&ns);

    // Put it in (gzipped): it serves.
    let (v1, v2) = (version(1), version(2));
    setup.put("hot.wasm.gz", gzip(&v1)).await;
    until("v1 serving", || {
        setup.serving_sha(&provider) == Some(sha(&v1))
    })
    .await;
    let instance = setup
        .registry
        .providers()
        .current()
        .get(&provider)
        .unwrap()
        .clone();
    instance
        .list()
        .await
        .expect("the hot-loaded plugin answers");

    // Replace it under load: no call fails, the old version finishes what it started.
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (providers, stop) = (setup.registry.providers(), stop.clone());
            let (calls, failures, name) = (calls.clone(), failures.clone(), provider.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let instance = providers.current().get(&name).cloned();
                    match instance {
                        Some(instance) if instance.list().await.is_ok() => {}
                        _ => {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    calls.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    until("calls before the swap", || {
        calls.load(Ordering::SeqCst) > 20
    })
    .await;
    setup.put("hot.wasm", v2.clone()).await;
    until("v2 serving", || {
        setup.serving_sha(&provider) == Some(sha(&v2))
    })
    .await;
    let at_swap = calls.load(Ordering::SeqCst);
    until("calls after the swap", || {
        calls.load(Ordering::SeqCst) > at_swap + 20
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "calls failed during the swap"
    );

    // Garbage: refused, v2 keeps serving; metric, event and ProviderHealth say why.
    setup
        .put("hot.wasm", b"this is not a component".to_vec())
        .await;
    until("the refusal", || {
        setup
            .registry
            .providers()
            .current()
            .problem(&provider)
            .is_some()
    })
    .await;
    assert_eq!(setup.load_errors("hot"), 1);
    assert_eq!(setup.serving_sha(&provider), Some(sha(&v2)));
    let current = setup.registry.providers().current();
    let problem = current.problem(&provider).unwrap();
    assert!(problem.contains("not a WebAssembly"), "{problem}");
    current
        .get(&provider)
        .unwrap()
        .list()
        .await
        .expect("v2 still answers");
    let events = cp
        .kubectl_run(
            &["get", "events.events.k8s.io", "-n", ns.name(), "-o", "json"],
            None,
        )
        .await
        .unwrap();
    assert!(events.contains("PluginLoadFailed"), "{events}");
    let health = ProviderCheckMetrics::register(&prometheus::Registry::new()).unwrap();
    pass(
        &cp.client(),
        &current,
        "reload-test",
        Duration::from_secs(5),
        &health,
    )
    .await
    .unwrap();
    let ph = provider_health(&provider).await;
    let (status, reason, message) = condition(&ph, "PluginLoaded");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PluginNotLoaded")
    );
    assert!(message.contains("still serving"), "{message}");
    assert_eq!(
        condition(&ph, "Ready").0,
        "True",
        "the old version still works"
    );

    // Deleted: the instance reports PluginNotLoaded, nothing crashes.
    setup
        .maps
        .delete("plugins", &DeleteParams::default())
        .await
        .unwrap();
    until("not loaded", || {
        setup
            .registry
            .providers()
            .current()
            .not_loaded(&provider)
            .is_some()
    })
    .await;
    let current = setup.registry.providers().current();
    pass(
        &cp.client(),
        &current,
        "reload-test",
        Duration::from_secs(5),
        &health,
    )
    .await
    .unwrap();
    let ph = provider_health(&provider).await;
    let (status, reason, _) = condition(&ph, "Ready");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PluginNotLoaded")
    );
}

/// An upload swaps for every instance of its type or for none: when one instance refuses the
/// new version, the other keeps the old one too, and both say why, in ProviderHealth's
/// `PluginLoaded` at once (the check interval here is an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_one_instance_refuses_is_swapped_in_for_none() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-swap-whole").await.unwrap();
    let (fits, odd) = (format!("{}-fits", ns.name()), format!("{}-odd", ns.name()));
    // `test-next` takes any object as config; `test` only its own schema: `odd` refuses it.
    let config = format!(
        "providers:\n- {{name: {fits}, type: x, config: {{endpoint: \"memory:1\"}}}}\n- {{name: {odd}, type: x, config: {{colour: blue}}}}\n"
    );
    let mut setup = Setup::start(&ns, &config, None).await;
    setup.watch(&ns);
    let health = tokio::spawn(proxy_operator::provider::providerhealth::run(
        cp.client(),
        setup.registry.providers(),
        "po-swap".into(),
        Duration::from_secs(3600),
        Duration::from_secs(5),
        ProviderCheckMetrics::register(&prometheus::Registry::new()).unwrap(),
    ));
    let old = plugin_bytes("test-next");
    setup.put("x.wasm", old.clone()).await;
    until("the old version serving both", || {
        setup.serving_sha(&fits) == Some(sha(&old)) && setup.serving_sha(&odd) == Some(sha(&old))
    })
    .await;

    setup.put("x.wasm", plugin_bytes("test")).await;
    until("the refusal", || {
        setup.registry.providers().current().problem(&odd).is_some()
    })
    .await;
    let current = setup.registry.providers().current();
    assert_eq!(
        setup.serving_sha(&fits),
        Some(sha(&old)),
        "the instance that would take the new version keeps the old one"
    );
    assert_eq!(setup.serving_sha(&odd), Some(sha(&old)));
    let why = current
        .problem(&fits)
        .expect("it says why it was not swapped");
    assert!(
        why.contains("not swapped in for any of its instances")
            && why.contains(&format!("provider instance {odd} refused it")),
        "{why}"
    );
    let refused = current.problem(&odd).unwrap();
    assert!(
        refused.contains("the new plugin version rejected the config"),
        "{refused}"
    );

    // ProviderHealth follows the swap, not the hourly check.
    let api: Api<ProviderHealth> = Api::all(cp.client());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // A failed read (the API server busy) is retried until the deadline.
        let object = api.get_opt(&fits).await.map_err(|e| e.to_string());
        let plugin_loaded = object
            .as_ref()
            .map(|o| o.as_ref().map(|ph| condition(ph, "PluginLoaded")));
        if let Ok(Some((status, _, message))) = &plugin_loaded
            && status == "False"
            && message.contains("not swapped in")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "PluginLoaded did not follow the swap: {plugin_loaded:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    health.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_waits_while_its_plugin_is_missing_and_is_made_when_it_arrives() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-hot-proxy").await.unwrap();
    let store = InstanceStore::start().await;
    let mut setup = Setup::start(
        &ns,
        &format!("providers:\n{}", config_entry("store", "late", &store, "")),
        None,
    )
    .await;
    setup.watch(&ns);
    let ctx = Arc::new(Context::new(
        ns.client(),
        setup.registry.providers(),
        "test-operator",
        Default::default(),
    ));
    let namespace = ns.name().to_string();
    let controller = tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await });
    let api: Api<Proxy> = ns.api();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&super::proxy_yaml(ns.name(), "patient", "store", "")),
    )
    .await
    .unwrap();
    wait_for(&api, "patient", "PluginNotLoaded", |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.last_error.as_deref())
            .is_some_and(|e| e.contains("is not loaded"))
    })
    .await;
    setup.put("late.wasm", version(1)).await;
    wait_for(&api, "patient", "Ready", |p| {
        super::phase(p) == Some(proxy_operator::api::Phase::Ready)
    })
    .await;
    assert_eq!(store.state.instances.lock().unwrap().len(), 1);
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_pin_refuses_other_bytes() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-pin").await.unwrap();
    let store = InstanceStore::start().await;
    let (v1, v2) = (version(1), version(2));
    let pinned = format!("  plugin: {{sha256: {}}}\n", sha(&v1));
    let setup = Setup::start(
        &ns,
        &format!(
            "providers:\n{}",
            config_entry("pinned", "pin", &store, &pinned)
        ),
        None,
    )
    .await;
    let changes = setup
        .registry
        .apply_configmap(BTreeMap::from([(
            "pin".to_string(),
            PackedPlugin::plain(v2.clone()),
        )]))
        .await;
    assert_eq!(changes.len(), 1, "{changes:?}");
    let current = setup.registry.providers().current();
    let refused = current.not_loaded("pinned").expect("refused");
    assert!(
        refused.reason.contains(&format!("pins {}", sha(&v1)))
            && refused.reason.contains(&sha(&v2)),
        "{refused:?}"
    );
    setup
        .registry
        .apply_configmap(BTreeMap::from([(
            "pin".to_string(),
            PackedPlugin::plain(v1.clone()),
        )]))
        .await;
    assert_eq!(setup.serving_sha("pinned"), Some(sha(&v1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_plugin_is_downloaded_once_and_cached_across_restarts() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-url").await.unwrap();
    let store = InstanceStore::start().await;
    let files = FileServer::start().await.unwrap();
    let bytes = version(7);
    files.serve("/provider.wasm", bytes.clone());
    let downloads = tempfile::tempdir().unwrap();
    let entry = |digest: &str| {
        format!(
            "providers:\n{}",
            config_entry(
                "remote",
                "remote",
                &store,
                &format!(
                    "  plugin: {{url: \"{}\", sha256: {digest}}}\n",
                    files.url("/provider.wasm")
                ),
            )
        )
    };
    for restart in 0..2 {
        let setup = Setup::start(&ns, &entry(&sha(&bytes)), Some(downloads.path())).await;
        assert_eq!(
            setup.serving_sha("remote"),
            Some(sha(&bytes)),
            "start {restart}"
        );
        let providers = setup.registry.providers().current();
        providers.get("remote").unwrap().list().await.unwrap();
        assert_eq!(
            files.requests("/provider.wasm"),
            1,
            "downloaded once (start {restart})"
        );
    }
    // Other bytes under the URL than the pin: refused, never run.
    let wrong = "0".repeat(64);
    let setup = Setup::start(&ns, &entry(&wrong), Some(downloads.path())).await;
    let current = setup.registry.providers().current();
    let refused = current.not_loaded("remote").expect("refused");
    assert!(
        refused.reason.contains("refusing to load it"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_config_is_reloaded_only_when_valid() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-cfg").await.unwrap();
    let store = InstanceStore::start().await;
    let setup = Setup::start(
        &ns,
        &format!("providers:\n{}", config_entry("first", "cfg", &store, "")),
        None,
    )
    .await;
    setup
        .registry
        .apply_configmap(BTreeMap::from([(
            "cfg".to_string(),
            PackedPlugin::plain(version(1)),
        )]))
        .await;
    assert!(setup.serving_sha("first").is_some());

    // A syntax error, and a config the plugin rejects: both refused, "first" keeps serving.
    for (bad, mentions) in [
        (
            "providers:\n- name: first\n  type: cfg\n  confg: {}\n".to_string(),
            "unknown field `confg`",
        ),
        (
            format!(
                "providers:\n- name: first\n  type: cfg\n  config: {{endpoint: \"gopher://x\"}}\n  grants: {{http: {{allow: [\"http://{}\"]}}}}\n",
                store.addr
            ),
            "rejected its config",
        ),
    ] {
        std::fs::write(setup.config_file(), &bad).unwrap();
        let error = setup.registry.reload_config().await.unwrap_err();
        assert!(error.contains(mentions), "{error}");
        assert!(setup.serving_sha("first").is_some());
    }
    // A valid one replaces it as a whole.
    std::fs::write(
        setup.config_file(),
        format!("providers:\n{}", config_entry("second", "cfg", &store, "")),
    )
    .unwrap();
    setup.registry.reload_config().await.unwrap();
    let current = setup.registry.providers().current();
    assert!(current.get("first").is_none() && current.get("second").is_some());
}
