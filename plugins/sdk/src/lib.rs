//! The guest SDK for proxy-operator providers.
//!
//! A provider is a type implementing [`Provider`] plus one [`export_provider!`] call:
//!
//! ```ignore
//! use proxy_operator_sdk::{export_provider, Provider, ProviderError, Instance, InstanceSpec};
//!
//! struct Hetzner;
//! impl Provider for Hetzner {
//!     type Config = HetznerConfig; // serde::Deserialize
//!     fn info() -> PluginInfo { ... }
//!     fn create(config: Self::Config, spec: InstanceSpec) -> Result<Instance, ProviderError> { ... }
//!     ...
//! }
//! export_provider!(Hetzner);
//! ```
//!
//! The config arrives as JSON on every call (plugins are stateless) and is parsed into
//! `Provider::Config`; a parse error names the field path, e.g. `config.hosts[0].zone: missing field`.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "provider-plugin",
        path: "../../wit/since_v0.2.0",
        pub_export_macro: true,
        export_macro_name: "__export_provider_bindings",
        default_bindings_module: "::proxy_operator_sdk::bindings",
        generate_all,
    });
}

pub mod capabilities;
pub mod cloudinit;
mod config;
pub mod hash;
pub mod squid;
pub mod time;

pub use bindings::exports::proxy_operator::provider::provider::Guest as __Guest;
pub use bindings::proxy_operator::provider::types::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, Owner, PluginInfo,
    ProviderError, ProxyCredentials, TransientError,
};
pub use config::parse_config;
pub use serde_json;

/// The WIT package version this SDK builds against.
pub const WIT_VERSION: &str = "0.2.0";

/// A provider implementation. Every method gets the parsed config of the provider instance.
pub trait Provider {
    /// The provider instance's config, parsed from JSON.
    type Config: serde::de::DeserializeOwned;

    /// Name, version, capabilities and config schema.
    fn info() -> PluginInfo;

    /// Checks beyond what `Config`'s types enforce (ranges, names). Default: accept.
    fn validate(_config: &Self::Config) -> Result<(), ProviderError> {
        Ok(())
    }

    /// Create an instance, or return the existing one named `spec.name`.
    fn create(config: Self::Config, spec: InstanceSpec) -> Result<Instance, ProviderError>;
    /// Look up an instance by provider id.
    fn get(config: Self::Config, provider_id: String) -> Result<Instance, ProviderError>;
    /// Make a running instance's squid require `credentials` (the Proxy's credentials were
    /// rotated). Default: `permanent`, for a provider that cannot reach a running instance (a
    /// VM): the operator says so on the Proxy, and a ProxyPool replaces the proxy.
    fn set_credentials(
        _config: Self::Config,
        _provider_id: String,
        _credentials: ProxyCredentials,
    ) -> Result<(), ProviderError> {
        Err(ProviderError::Permanent(format!(
            "the {} provider cannot change a running proxy's credentials; delete the Proxy to get one with the new credentials (a ProxyPool replaces it by itself)",
            Self::info().name
        )))
    }
    /// Delete an instance; an instance already gone is success.
    fn delete(config: Self::Config, provider_id: String) -> Result<(), ProviderError>;
    /// Every instance carrying an owner identity.
    fn list(config: Self::Config) -> Result<Vec<Instance>, ProviderError>;
    /// Health of the provider's dependencies.
    fn check(config: Self::Config) -> Result<Vec<CheckTarget>, ProviderError>;
}

/// Builds a `transient` error, optionally with a retry hint.
pub fn transient(message: impl Into<String>, retry_after_ms: Option<u64>) -> ProviderError {
    ProviderError::Transient(TransientError {
        message: message.into(),
        retry_after_ms,
    })
}

/// Any error as a `transient` one, for a step that must be waited out rather than acted on;
/// `describe` gets the original message. A transient error keeps its own retry hint; any other
/// kind (one that would not clear by itself) is retried after `slow_retry_ms`.
pub fn retried_as_transient(
    error: ProviderError,
    slow_retry_ms: u64,
    describe: impl FnOnce(String) -> String,
) -> ProviderError {
    let (message, retry_after_ms) = match error {
        ProviderError::Transient(t) => (t.message, t.retry_after_ms),
        ProviderError::NotFound(m)
        | ProviderError::Permanent(m)
        | ProviderError::InvalidConfig(m)
        | ProviderError::Unauthorized(m)
        | ProviderError::Quota(m)
        | ProviderError::Denied(m) => (m, Some(slow_retry_ms)),
    };
    transient(describe(message), retry_after_ms)
}

/// Exports a [`Provider`] implementation as the component's `provider` interface.
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        #[doc(hidden)]
        pub struct __ProxyOperatorExport;

        impl $crate::__Guest for __ProxyOperatorExport {
            fn describe() -> $crate::PluginInfo {
                <$provider as $crate::Provider>::info()
            }
            fn validate_config(config: String) -> Result<(), $crate::ProviderError> {
                let config = $crate::parse_config::<<$provider as $crate::Provider>::Config>(&config)?;
                <$provider as $crate::Provider>::validate(&config)
            }
            fn create(
                config: String,
                spec: $crate::InstanceSpec,
            ) -> Result<$crate::Instance, $crate::ProviderError> {
                let config = $crate::parse_config(&config)?;
                <$provider as $crate::Provider>::validate(&config)?;
                <$provider as $crate::Provider>::create(config, spec)
            }
            fn get(
                config: String,
                provider_id: String,
            ) -> Result<$crate::Instance, $crate::ProviderError> {
                <$provider as $crate::Provider>::get($crate::parse_config(&config)?, provider_id)
            }
            fn set_credentials(
                config: String,
                provider_id: String,
                credentials: $crate::ProxyCredentials,
            ) -> Result<(), $crate::ProviderError> {
                <$provider as $crate::Provider>::set_credentials(
                    $crate::parse_config(&config)?,
                    provider_id,
                    credentials,
                )
            }
            fn delete(config: String, provider_id: String) -> Result<(), $crate::ProviderError> {
                <$provider as $crate::Provider>::delete($crate::parse_config(&config)?, provider_id)
            }
            fn list(config: String) -> Result<Vec<$crate::Instance>, $crate::ProviderError> {
                <$provider as $crate::Provider>::list($crate::parse_config(&config)?)
            }
            fn check(config: String) -> Result<Vec<$crate::CheckTarget>, $crate::ProviderError> {
                <$provider as $crate::Provider>::check($crate::parse_config(&config)?)
            }
        }

        // Exported symbols exist only in the component: a native build (tests, benchmarks) of
        // the same crate links without them.
        #[cfg(target_family = "wasm")]
        $crate::bindings::__export_provider_bindings!(__ProxyOperatorExport with_types_in $crate::bindings);
    };
}
