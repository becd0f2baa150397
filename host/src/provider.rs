//! The provider runtime: the providers config, the capabilities a grant gives a plugin, the
//! wasmtime engine and the plugin registry, the provider instances bound to their plugins, their
//! health checks and conformance, the Proxies' credentials, the instances' limits and the upstream provider's settings.
//! Imports only `support` and `api` (docs/architecture.md, "Tiers").

pub mod access;
pub mod capabilities;
pub mod config;
pub mod conformance;
pub mod credentials;
pub mod limits;
pub mod plugins;
pub mod providerhealth;
pub mod providers;
pub mod registry;
pub(crate) mod upstream;
