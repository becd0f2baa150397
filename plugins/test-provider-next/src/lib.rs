//! A test fixture, not a provider: built against `tests/fixtures/wit-0.1.1` (the 0.1.0 package at
//! version 0.1.1 plus an exported `describe-extended`), so `host/tests/plugin_runtime/versions.rs` can
//! check that the host loads a compatible 0.1.x component through its 0.1.0 bindings. Its
//! instances are synthetic; it imports `log@0.1.1` (called from `list`) so the component also
//! has a versioned host import to match.

wit_bindgen::generate!({
    world: "provider-plugin",
    path: "../../tests/fixtures/wit-0.1.1",
});

use exports::proxy_operator::provider::provider::Guest;
use proxy_operator::provider::log::{self, Level};
use proxy_operator::provider::types::{
    CheckTarget, Instance, InstanceSpec, InstanceState, PluginInfo, ProviderError,
};

// Constructed only by the exports, which a native build leaves out.
#[cfg_attr(not(target_family = "wasm"), allow(dead_code))]
struct NextProvider;

fn instance(name: &str) -> Instance {
    Instance {
        provider_id: format!("next-{name}"),
        name: name.into(),
        state: InstanceState::Running,
        address: Some("192.0.2.1".into()),
        port: 3128,
        zone: None,
        created_at: None,
        owner: None,
        message: Some("built against WIT 0.1.1".into()),
    }
}

impl Guest for NextProvider {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "test-next".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture built against WIT 0.1.1".into(),
            capabilities: Vec::new(),
            config_schema: r#"{"type":"object"}"#.into(),
        }
    }
    fn validate_config(config: String) -> Result<(), ProviderError> {
        if config.trim_start().starts_with('{') {
            Ok(())
        } else {
            Err(ProviderError::InvalidConfig(
                "config: expected a JSON object".into(),
            ))
        }
    }
    fn create(_: String, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        Ok(instance(&spec.name))
    }
    fn get(_: String, provider_id: String) -> Result<Instance, ProviderError> {
        Err(ProviderError::NotFound(format!("{provider_id} not found")))
    }
    fn delete(_: String, _: String) -> Result<(), ProviderError> {
        Ok(())
    }
    fn list(_: String) -> Result<Vec<Instance>, ProviderError> {
        log::log(Level::Info, "listing from a 0.1.1 component", &[]);
        Ok(vec![instance("px-next")])
    }
    fn check(_: String) -> Result<Vec<CheckTarget>, ProviderError> {
        Ok(Vec::new())
    }
    fn describe_extended() -> String {
        "only a 0.1.1 host would call this".into()
    }
}

// Exported symbols exist only in the component: a native build (`cargo build --workspace`) links
// without them (their names are not valid in a native linker's version script).
#[cfg(target_family = "wasm")]
export!(NextProvider);
