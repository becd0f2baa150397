//! The plugin runtime: one wasmtime engine, loading and type-checking provider components, and
//! sandboxed calls into them (a fresh instance per call, CPU, memory and wall-clock limits).

pub mod bindings;
pub mod bounds;
mod cache;
mod call;
mod engine;
mod error;
mod instance;
mod load;
pub mod memory;
mod metrics;
mod state;
pub mod types;

pub use bindings::{SUPPORTED_WIT_VERSIONS, WitVersion};
pub use engine::{AllocatorKind, EngineOptions, PluginEngine};
pub use error::{CallError, LoadError};
pub use instance::{Deletion, ProviderInstance, ProviderInstanceOptions};
pub use load::{ComponentSummary, LoadedPlugin, inspect_component};
pub use metrics::PluginMetrics;
pub use state::HostState;
