//! The plugin runtime with real components built from `plugins/`: lifecycle round trips, the
//! sandbox (CPU, memory, panics, HTTP grants, credentials), rejections, concurrency, the compile
//! cache and metrics.

mod common;
// WIT versions with real components (one test binary with the runtime's: one link fewer).
#[path = "plugin_runtime/versions.rs"]
mod versions;
// SigV4 signing of `valueFrom.awsCredentials` (issue #34).
#[path = "plugin_runtime/aws_signing.rs"]
mod aws_signing;
// Keyless GCP: the metadata server's tokens (issue #53).
#[path = "plugin_runtime/gcp_metadata.rs"]
mod gcp_metadata;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::types::{InstanceState, ProviderError};
use proxy_operator::provider::plugins::{
    AllocatorKind, CallError, EngineOptions, LoadError, ProviderInstance, ProviderInstanceOptions,
};
use serde_json::json;
use sha2::Digest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_provider_round_trips_every_function() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    assert_eq!(plugin.info.name, "test");
    assert_eq!(plugin.wit_version, "0.2.0");
    let schema: serde_json::Value = serde_json::from_str(&plugin.info.config_schema).unwrap();
    assert_eq!(schema["required"], json!(["endpoint"]));

    let store = InstanceStore::start().await;
    let provider = instance_for(&engine, &plugin, &store, 4);
    lifecycle(&provider, &store).await;

    // 0.2.0: the credentials reach the plugin with the spec, and `set-credentials` replaces them.
    let credentials = |hash: &str| proxy_operator::provider::plugins::types::ProxyCredentials {
        username: "egress-1".into(),
        password_hash: hash.into(),
    };
    let mut with = spec("px-creds", json!({}));
    with.credentials = Some(credentials("$6$rounds=5000$salt$first"));
    let created = provider.create(with).await.unwrap();
    let stored = |id: &str| store.state.instances.lock().unwrap()[id]["credentials"].clone();
    assert_eq!(
        stored(&created.provider_id),
        json!({"username": "egress-1", "passwordHash": "$6$rounds=5000$salt$first"})
    );
    provider
        .set_credentials(
            &created.provider_id,
            credentials("$6$rounds=5000$salt$second"),
        )
        .await
        .unwrap();
    assert_eq!(
        stored(&created.provider_id)["passwordHash"],
        "$6$rounds=5000$salt$second"
    );
}

/// What every provider must do against the instance store: the Rust test provider and the
/// non-Rust examples pass the same round trip.
async fn lifecycle(provider: &ProviderInstance, store: &InstanceStore) {
    provider.validate_config().await.expect("valid config");

    let created = provider.create(spec("px-1", json!({}))).await.unwrap();
    assert_eq!(created.provider_id, "px-1");
    assert_eq!(created.state, InstanceState::Running);
    assert_eq!(created.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(created.owner.as_ref().unwrap().uid, "uid-px-1");

    // Same name again: the existing instance, not a second one.
    let again = provider.create(spec("px-1", json!({}))).await.unwrap();
    assert_eq!(again, created);
    assert_eq!(store.state.instances.lock().unwrap().len(), 1);

    assert_eq!(provider.get("px-1").await.unwrap(), created);
    let listed = provider.list().await.unwrap();
    assert_eq!(listed, vec![created.clone()]);

    let checks = provider.check().await.unwrap();
    assert_eq!(checks.len(), 1);
    assert!(checks[0].ok, "{checks:?}");

    provider.delete("px-1").await.unwrap();
    let gone = provider.get("px-1").await.unwrap_err();
    assert!(
        matches!(gone.provider_error(), Some(ProviderError::NotFound(_))),
        "{gone}"
    );
    // Delete is idempotent.
    provider.delete("px-1").await.unwrap();
    assert!(provider.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_config_names_the_field() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let cases = [
        (json!({}), "config: missing field `endpoint`"),
        (json!({"endpoint": 7}), "config.endpoint: invalid type"),
        (
            json!({"endpoint": "ftp://x"}),
            "config.endpoint: `ftp://x` must start with",
        ),
        (
            json!({"endpoint": "http://x", "extra": 1}),
            "unknown field `extra`",
        ),
    ];
    for (config, expected) in cases {
        let provider = ProviderInstance::new(
            engine.clone(),
            "bad",
            plugin.clone(),
            &config,
            &Grants::default().validate().unwrap(),
            ProviderInstanceOptions::default(),
        )
        .unwrap();
        let err = provider.validate_config().await.unwrap_err();
        match err.provider_error() {
            Some(ProviderError::InvalidConfig(message)) => {
                assert!(message.contains(expected), "{config}: {message}")
            }
            other => panic!("{config}: expected invalid-config, got {other:?} ({err})"),
        }
    }
}

async fn misbehaving(what: &str) -> (CallError, ProviderInstance, InstanceStore) {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    let provider = instance_for(&engine, &plugin, &store, 2);
    let err = provider
        .create(spec("bad", json!({ "misbehave": what })))
        .await
        .unwrap_err();
    (err, provider, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_loop_is_stopped_at_its_cpu_budget_and_the_next_call_works() {
    let (err, provider, _store) = misbehaving("loop").await;
    assert!(matches!(err, CallError::CpuDeadline { .. }), "{err}");
    assert!(err.to_string().contains("CPU budget"), "{err}");
    provider
        .create(spec("good", json!({})))
        .await
        .expect("the next call works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_allocation_is_stopped_at_the_memory_cap() {
    let (err, provider, _store) = misbehaving("alloc").await;
    assert!(
        matches!(err, CallError::OutOfMemory { limit, .. } if limit == 64 << 20),
        "{err}"
    );
    provider
        .create(spec("good", json!({})))
        .await
        .expect("the next call works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_an_error_with_the_panic_message() {
    let (err, provider, _store) = misbehaving("panic").await;
    match &err {
        CallError::Trap { plugin, reason, .. } => {
            assert_eq!(plugin, "test");
            assert!(reason.contains("panicked"), "{reason}");
            assert!(
                reason.contains("the test provider panics on request"),
                "{reason}"
            );
        }
        other => panic!("expected a trap, got {other}"),
    }
    provider
        .create(spec("good", json!({})))
        .await
        .expect("the next call works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_waits_too_long_in_the_host_is_abandoned() {
    let options = EngineOptions {
        call_timeout: Duration::from_millis(300),
        ..test_options()
    };
    let (engine, _) = engine_with(options).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    store.set_delay(Duration::from_secs(5));
    let provider = instance_for(&engine, &plugin, &store, 2);
    let err = provider.list().await.unwrap_err();
    assert!(matches!(err, CallError::Timeout { .. }), "{err}");
    store.set_delay(Duration::ZERO);
    provider.list().await.expect("the next call works");
}

/// A loopback listener that counts connections, to prove a denied request never left the host.
async fn counting_listener(ip: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_outside_the_grant_is_denied_and_never_sent() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    let provider = instance_for(&engine, &plugin, &store, 2);
    let (other, connections) = counting_listener("127.0.0.2").await;
    let (same_ip_other_port, connections_2) = counting_listener("127.0.0.1").await;

    for url in [
        format!("http://{other}/"),
        format!("http://{same_ip_other_port}/"),
        format!("https://{}/", store.addr),
        format!("http://localhost:{}/", store.addr.port()),
    ] {
        let err = provider
            .create(spec("x", json!({ "fetch": url })))
            .await
            .unwrap_err();
        match err.provider_error() {
            Some(ProviderError::Denied(message)) => {
                assert!(message.contains("grants.http.allow"), "{url}: {message}")
            }
            other => panic!("{url}: expected denied, got {other:?}"),
        }
    }
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    assert_eq!(connections_2.load(Ordering::SeqCst), 0);

    // The granted address itself works.
    let ok = provider
        .create(spec(
            "x",
            json!({ "fetch": format!("{}/healthz", store.url()) }),
        ))
        .await
        .unwrap();
    assert_eq!(ok.message.as_deref(), Some("HTTP 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_grant_does_not_reach_loopback_through_dns() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let (addr, connections) = counting_listener("127.0.0.1").await;
    let grants: Grants =
        serde_json::from_value(json!({"http": {"allow": ["http://*:*"]}})).unwrap();
    let provider = ProviderInstance::new(
        engine.clone(),
        "wild",
        plugin,
        &json!({"endpoint": "memory:1"}),
        &grants.validate().unwrap(),
        ProviderInstanceOptions::default(),
    )
    .unwrap();
    for url in [
        format!("http://localhost:{}/", addr.port()),
        format!("http://127.0.0.1:{}/", addr.port()),
    ] {
        let err = provider
            .create(spec("x", json!({ "fetch": url })))
            .await
            .unwrap_err();
        assert!(
            matches!(err.provider_error(), Some(ProviderError::Denied(_))),
            "{url}: {err}"
        );
    }
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_credentials_reach_the_server_but_never_the_plugin() {
    const SECRET: &str = "s3cr3t-token-value-8c1f";
    let secret_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret_file.path(), format!("{SECRET}\n")).unwrap();

    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    let grants: Grants = serde_json::from_value(json!({
        "http": {
            "allow": [format!("http://{}", store.addr)],
            "credentials": [{
                "url": format!("http://{}", store.addr),
                "header": "X-Api-Key",
                "valueFrom": { "file": secret_file.path() },
            }],
        }
    }))
    .unwrap();
    let provider = ProviderInstance::new(
        engine.clone(),
        "creds",
        plugin,
        &json!({ "endpoint": store.url() }),
        &grants.validate().unwrap(),
        ProviderInstanceOptions::default(),
    )
    .unwrap();

    let echoed = provider
        .create(spec("x", json!({ "misbehave": "echo" })))
        .await
        .unwrap();
    let seen = store.state.echo_headers.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0]["x-api-key"], SECRET,
        "the host injected the credential"
    );
    let plugin_view = echoed.message.unwrap();
    assert!(
        plugin_view.contains(r#"receivedApiKey\":true"#),
        "{plugin_view}"
    );
    assert!(!plugin_view.contains(SECRET), "{plugin_view}");

    let introspected = provider
        .create(spec("x", json!({ "misbehave": "introspect" })))
        .await
        .unwrap();
    let everything = introspected.message.unwrap();
    assert!(!everything.contains(SECRET), "{everything}");
    let parsed: serde_json::Value = serde_json::from_str(&everything).unwrap();
    assert_eq!(parsed["env"], json!([]), "no environment reaches a plugin");
    assert!(
        parsed["rootListing"].get("Err").is_some(),
        "no filesystem reaches a plugin: {parsed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parallel_calls_respect_the_bound_and_all_complete() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    store.set_delay(Duration::from_millis(50));
    let provider = Arc::new(instance_for(&engine, &plugin, &store, 3));
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let provider = provider.clone();
            tokio::spawn(async move { provider.create(spec(&format!("px-{i}"), json!({}))).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().expect("every call completes");
    }
    assert_eq!(store.state.instances.lock().unwrap().len(), 24);
    let max = store.state.max_in_flight.load(Ordering::SeqCst);
    assert!(max <= 3, "at most 3 calls at once, saw {max}");
    assert!(max >= 2, "calls did run in parallel (saw {max})");
}

fn component(wat: &str) -> Vec<u8> {
    wat::parse_str(wat).expect("valid WAT")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_what_is_not_a_supported_provider() {
    let (engine, _) = engine_with(test_options()).await;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "not wasm",
            b"#!/bin/sh\necho hi\n".to_vec(),
            "not a WebAssembly file",
        ),
        (
            "core module",
            component("(module)"),
            "core WebAssembly module, not a component",
        ),
        (
            "exports nothing",
            component("(component)"),
            "exports no `proxy-operator:provider/provider` interface (it exports: nothing)",
        ),
        (
            "another WIT version",
            component(
                r#"(component (instance $i) (export "proxy-operator:provider/provider@0.3.0" (instance $i)))"#,
            ),
            "built for WIT `proxy-operator:provider@0.3.0`, which this operator does not support; supported versions: 0.1.0 (and any later 0.1.x), 0.2.0",
        ),
        (
            "missing exports",
            component(
                r#"(component (instance $i) (export "proxy-operator:provider/provider@0.1.0" (instance $i)))"#,
            ),
            "does not match WIT `proxy-operator:provider@0.1.0`",
        ),
    ];
    for (case, bytes, expected) in cases {
        let err = engine.load(case, bytes).await.unwrap_err();
        let message = err.to_string();
        assert!(message.contains(expected), "{case}: {message}");
        match (case, &err) {
            ("core module", LoadError::CoreModule { .. })
            | ("not wasm", LoadError::NotWasm { .. })
            | ("exports nothing", LoadError::NotAProvider { .. })
            | ("another WIT version", LoadError::UnsupportedVersion { .. })
            | ("missing exports", LoadError::Incompatible { .. }) => {}
            _ => panic!("{case}: unexpected error kind {err:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_large_for_the_address_space_falls_back_to_on_demand() {
    let options = EngineOptions {
        pool_instances: 50_000_000,
        ..test_options()
    };
    let (engine, _) = engine_with(options).await;
    match engine.allocator() {
        AllocatorKind::OnDemand {
            reason: Some(reason),
        } => assert!(!reason.is_empty()),
        other => panic!("expected the on-demand fallback, got {other:?}"),
    }
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    instance_for(&engine, &plugin, &store, 1)
        .list()
        .await
        .unwrap();

    let (pooled, _) = engine_with(test_options()).await;
    assert_eq!(
        pooled.allocator(),
        &AllocatorKind::Pooling { instances: 16 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_and_a_corrupt_entry_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let options = EngineOptions {
        cache_dir: Some(cache_dir.clone()),
        ..test_options()
    };
    let (engine, _) = engine_with(options.clone()).await;
    let first = load_test_plugin(&engine).await;
    assert!(!first.from_cache);
    let second = load_test_plugin(&engine).await;
    assert!(second.from_cache, "second load uses the cache");

    // A new engine (a restart) with the same configuration uses it too.
    let (restarted, _) = engine_with(options.clone()).await;
    assert!(load_test_plugin(&restarted).await.from_cache);

    let cwasm = std::fs::read_dir(&cache_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("a .cwasm file");
    let mut bytes = std::fs::read(&cwasm).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&cwasm, bytes).unwrap();
    let reloaded = load_test_plugin(&restarted).await;
    assert!(
        !reloaded.from_cache,
        "a corrupt entry is never deserialized"
    );
    let store = InstanceStore::start().await;
    instance_for(&restarted, &reloaded, &store, 1)
        .list()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_dir_others_can_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let options = EngineOptions {
        cache_dir: Some(dir.path().to_path_buf()),
        ..test_options()
    };
    let (engine, _) = engine_with(options).await;
    load_test_plugin(&engine).await;
    assert!(!load_test_plugin(&engine).await.from_cache);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_counted_by_plugin_function_and_error_kind() {
    let (engine, registry) = engine_with(test_options()).await;
    let plugin = load_test_plugin(&engine).await;
    let store = InstanceStore::start().await;
    let provider = instance_for(&engine, &plugin, &store, 2);
    provider.list().await.unwrap();
    provider.get("missing").await.unwrap_err();

    let families = registry.gather();
    let family = |name: &str| {
        families
            .iter()
            .find(|f| f.name() == name)
            .unwrap_or_else(|| panic!("metric {name} is missing"))
    };
    let count = |name: &str, labels: &[(&str, &str)]| -> f64 {
        family(name)
            .get_metric()
            .iter()
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().get_value())
            .sum()
    };
    assert_eq!(
        count(
            "proxy_operator_plugin_calls_total",
            &[
                ("plugin", "test"),
                ("provider", "test-store"),
                ("function", "list"),
                ("result", "ok")
            ]
        ),
        1.0
    );
    assert_eq!(
        count(
            "proxy_operator_plugin_call_errors_total",
            &[("function", "get"), ("kind", "not_found")]
        ),
        1.0
    );
    let histogram = family("proxy_operator_plugin_call_duration_seconds");
    assert!(
        histogram
            .get_metric()
            .iter()
            .any(|m| m.get_histogram().get_sample_count() >= 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_config_binds_plugins_and_reports_what_they_reject() {
    use proxy_operator::provider::config::ProvidersConfig;
    use proxy_operator::provider::registry::load_providers;
    let (engine, _) = engine_with(test_options()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("providers.yaml");
    let build = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let engine = engine.clone();
        let file = file.clone();
        async move {
            let config = ProvidersConfig::load(&file).map_err(|e| e.to_string())?;
            load_providers(&engine, &plugins_dir(), &config, &file)
                .await
                .map_err(|e| e.to_string())
        }
    };

    let providers =
        build("providers:\n- {name: store-a, type: test, config: {endpoint: \"memory:3\"}}\n")
            .await
            .unwrap();
    let instance = providers.get("store-a").expect("bound");
    assert_eq!(instance.list().await.unwrap().len(), 3);
    assert!(providers.get("store-b").is_none());

    let unknown_type = build("providers:\n- {name: a, type: hetzner}\n")
        .await
        .err()
        .unwrap();
    assert!(
        unknown_type
            .contains("providers[0] (a).type: no plugin `hetzner` in the plugins directory")
            && unknown_type.contains("available: ")
            && unknown_type.contains("test"),
        "{unknown_type}"
    );
    assert!(
        unknown_type.starts_with(&file.display().to_string()),
        "names the file: {unknown_type}"
    );

    let rejected =
        build("providers:\n- {name: a, type: test, config: {endpoint: \"gopher://x\"}}\n")
            .await
            .err()
            .unwrap();
    assert!(
        rejected.contains("providers[0] (a): the `test` plugin rejected its config: config.endpoint: `gopher://x` must start with"),
        "{rejected}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_providers_config_loads() {
    use proxy_operator::provider::config::ProvidersConfig;
    use proxy_operator::provider::registry::load_providers;
    let (engine, _) = engine_with(test_options()).await;
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/samples/providers-config.yaml");
    let config = ProvidersConfig::load(&file).unwrap();
    let providers = load_providers(&engine, &plugins_dir(), &config, &file)
        .await
        .unwrap();
    let instance = providers
        .get("dev-store")
        .expect("the sample names dev-store");
    assert!(instance.check().await.unwrap()[0].ok);
}

/// The Python example (componentize-py), published by URL + sha256 as a plugin author would:
/// downloaded once, compiled once (the compiled artefact is cached), and as good as the Rust one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_loaded_by_url_passes_the_same_lifecycle() {
    example_loaded_by_url_passes_the_same_lifecycle("python-example").await;
}

/// The JavaScript example (componentize-js), the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_example_loaded_by_url_passes_the_same_lifecycle() {
    example_loaded_by_url_passes_the_same_lifecycle("js-example").await;
}

async fn example_loaded_by_url_passes_the_same_lifecycle(provider_type: &str) {
    use proxy_operator::provider::registry::{PluginRegistry, RegistryMetrics, RegistryOptions};
    let file = format!("/{provider_type}.wasm");
    let path = plugins_dir().join(&file[1..]);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it with `make examples` (part of `make test`)",
            path.display()
        )
    });
    let digest = hex::encode(sha2::Sha256::digest(&bytes));
    let files = harness::FileServer::start().await.unwrap();
    files.serve(&file, bytes);
    let store = InstanceStore::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n- name: example\n  type: {provider_type}\n  plugin: {{url: \"{}\", sha256: {digest}}}\n  config: {{endpoint: \"{}\"}}\n  grants: {{http: {{allow: [\"http://{}\"]}}}}\n",
            files.url(&file),
            store.url(),
            store.addr
        ),
    )
    .unwrap();
    for restart in [false, true] {
        let (engine, _) = engine_with(EngineOptions {
            // CPython's heap and start-up need more than the Rust provider's small limits (the
            // JavaScript example fits the operator's defaults; see plugin_cli.rs).
            memory_limit: 256 << 20,
            cpu_budget: Duration::from_secs(10),
            cache_dir: Some(dir.path().join("compiled")),
            ..test_options()
        })
        .await;
        let registry = PluginRegistry::start(
            engine,
            RegistryOptions {
                plugins_dir: dir.path().join("no-builtins"),
                configmap: None,
                download_dir: Some(dir.path().join("downloads")),
            },
            &config,
            None,
            RegistryMetrics::unregistered().unwrap(),
        )
        .await
        .unwrap();
        let providers = registry.providers().current();
        let provider = providers.get("example").expect("loaded");
        assert_eq!(provider.plugin().info.name, provider_type);
        assert_eq!(
            provider.plugin().from_cache,
            restart,
            "compiled once, then cached"
        );
        lifecycle(provider, &store).await;
        assert_eq!(files.requests(&file), 1, "downloaded once");
    }
}
