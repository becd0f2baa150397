//! WIT versioning with real components: a component built for a later patch version of a
//! supported WIT minor (the test-only 0.1.1 of `tests/fixtures/wit-0.1.1`, built by `make plugins`
//! from `plugins/test-provider-next` into `test-next.wasm`) loads and serves calls through the
//! host's 0.1.0 bindings; any other major or minor version is refused naming the version found
//! and the versions supported.

use crate::common::*;
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::plugins::types::{InstanceState, ProviderError};
use proxy_operator::provider::plugins::{LoadError, ProviderInstance, ProviderInstanceOptions};
use serde_json::json;
use wasmtime::component::{Component, types::ComponentItem};

const NEXT_EXPORT: &str = "proxy-operator:provider/provider@0.1.1";

/// The component with every `@0.1.1` name (imports, exports, nested types) replaced by a version
/// of the same length: strings are length-prefixed, so the binary stays valid.
fn with_version(bytes: &[u8], version: &str) -> Vec<u8> {
    let (from, to) = (b"@0.1.1".as_slice(), format!("@{version}"));
    assert_eq!(to.len(), from.len(), "same length only");
    let mut out = bytes.to_vec();
    let mut replaced = 0;
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to.as_bytes());
            replaced += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    assert!(replaced > 0, "no `@0.1.1` in the component");
    out
}

/// A provider instance of `plugin` with no config and no grants.
fn without_grants(
    engine: &std::sync::Arc<proxy_operator::provider::plugins::PluginEngine>,
    name: &str,
    plugin: std::sync::Arc<proxy_operator::provider::plugins::LoadedPlugin>,
) -> ProviderInstance {
    ProviderInstance::new(
        engine.clone(),
        name,
        plugin,
        &json!({}),
        &Grants::default().validate().unwrap(),
        ProviderInstanceOptions {
            max_concurrent_calls: 1,
            upstream: None,
        },
    )
    .expect("no grants is valid")
}

#[test]
fn the_fixture_really_is_a_0_1_1_component_with_an_extra_function() {
    let engine = wasmtime::Engine::default();
    let component = Component::new(&engine, plugin_bytes("test-next")).expect("compiles");
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(&engine).map(|(n, _)| n.to_string()).collect();
    assert!(
        imports.contains(&"proxy-operator:provider/log@0.1.1".to_string()),
        "{imports:?}"
    );
    let (name, item) = ty.exports(&engine).next().expect("one export");
    assert_eq!(name, NEXT_EXPORT);
    let ComponentItem::ComponentInstance(instance) = item.ty else {
        panic!("{name} is not an instance");
    };
    let functions: Vec<&str> = instance.exports(&engine).map(|(n, _)| n).collect();
    assert!(functions.contains(&"describe-extended"), "{functions:?}");
    assert!(functions.contains(&"describe"), "{functions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_0_1_x_component_runs_through_the_0_1_0_bindings() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = engine
        .load("test-next.wasm", plugin_bytes("test-next"))
        .await
        .expect("a 0.1.1 component loads");
    assert_eq!(plugin.wit_version, "0.1.1");
    assert_eq!(plugin.bindings_version, "0.1.0");
    // `describe` answered through the 0.1.0 bindings.
    assert_eq!(plugin.info.name, "test-next");
    assert_eq!(
        plugin.info.description,
        "Test fixture built against WIT 0.1.1"
    );

    let provider = without_grants(&engine, "next", plugin);
    provider.validate_config().await.expect("valid config");
    // `list` calls the host's `log` through the component's `log@0.1.1` import.
    let listed = provider.list().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].provider_id, "next-px-next");
    assert_eq!(listed[0].state, InstanceState::Running);
    assert_eq!(listed[0].address.as_deref(), Some("192.0.2.1"));
    let created = provider.create(spec("px-1", json!({}))).await.unwrap();
    assert_eq!(created.provider_id, "next-px-1");
    let missing = provider.get("nope").await.unwrap_err();
    assert!(
        matches!(missing.provider_error(), Some(ProviderError::NotFound(m)) if m == "nope not found"),
        "{missing}"
    );

    // Another patch version of the same minor is just as good.
    let plugin = engine
        .load(
            "test-next-0.1.9.wasm",
            with_version(&plugin_bytes("test-next"), "0.1.9"),
        )
        .await
        .expect("a 0.1.9 component loads");
    assert_eq!(
        (plugin.wit_version.as_str(), plugin.bindings_version),
        ("0.1.9", "0.1.0")
    );
}

/// WIT 0.2.0 added proxy credentials; a plugin built for the released 0.1.0 keeps loading and
/// working, and its proxies simply have no credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_component_still_loads_and_works_beside_0_2_0() {
    let (engine, _) = engine_with(test_options()).await;
    let plugin = engine
        .load(
            "test-next-0.1.0.wasm",
            with_version(&plugin_bytes("test-next"), "0.1.0"),
        )
        .await
        .expect("a 0.1.0 component loads");
    assert_eq!(
        (plugin.wit_version.as_str(), plugin.bindings_version),
        ("0.1.0", "0.1.0")
    );
    assert!(!plugin.supports_credentials());
    let provider = without_grants(&engine, "old", plugin);
    let created = provider.create(spec("px-1", json!({}))).await.unwrap();
    assert_eq!(created.provider_id, "next-px-1");
    assert_eq!(provider.list().await.expect("list").len(), 1);
    let refused = provider
        .set_credentials(
            "next-px-1",
            proxy_operator::provider::plugins::types::ProxyCredentials {
                username: "u".into(),
                password_hash: "$6$salt$hash".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused.provider_error(), Some(ProviderError::Permanent(m)) if m.contains("built for WIT 0.1.0") && m.contains("rebuild it for 0.2.0")),
        "{refused}"
    );

    // The providers this repository ships are built for 0.2.0.
    let current = engine
        .load("test.wasm", plugin_bytes("test"))
        .await
        .expect("the test provider loads");
    assert_eq!(
        (current.wit_version.as_str(), current.bindings_version),
        ("0.2.0", "0.2.0")
    );
    assert!(current.supports_credentials());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_major_or_minor_version_is_refused_naming_found_and_supported() {
    let (engine, _) = engine_with(test_options()).await;
    let bytes = plugin_bytes("test-next");
    for version in ["0.3.1", "1.1.1", "0.0.1"] {
        let rewritten = with_version(&bytes, version);
        // Still a valid component, now claiming `version`: refused for its version alone.
        let summary = proxy_operator::provider::plugins::inspect_component(&engine, &rewritten)
            .expect("the rewritten component still validates");
        assert_eq!(summary.wit_version.as_deref(), Some(version));

        let err = engine.load("next.wasm", rewritten).await.unwrap_err();
        let message = err.to_string();
        match &err {
            LoadError::UnsupportedVersion { found, .. } => assert_eq!(found, version),
            other => panic!("{version}: expected UnsupportedVersion, got {other:?}"),
        }
        assert!(
            message.contains(&format!(
                "built for WIT `proxy-operator:provider@{version}`, which this operator does not support"
            )),
            "{message}"
        );
        assert!(
            message.contains(
                "supported versions: 0.1.0 (and any later 0.1.x), 0.2.0 (and any later 0.2.x)"
            ),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_x_component_needing_a_host_function_the_host_lacks_is_incompatible() {
    let (engine, _) = engine_with(test_options()).await;
    let bytes = wat::parse_str(
        r#"(component
            (import "proxy-operator:provider/log@0.1.1" (instance (export "log-extended" (func))))
            (instance $i)
            (export "proxy-operator:provider/provider@0.1.1" (instance $i)))"#,
    )
    .unwrap();
    let err = engine.load("needs-more.wasm", bytes).await.unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, LoadError::Incompatible { ref version, .. } if version == "0.1.1"),
        "{err:?}"
    );
    assert!(message.contains("log-extended"), "{message}");
    assert!(
        message.contains("checked with the host's 0.1.0 bindings"),
        "{message}"
    );
}
