//! The plugin runtime: one wasmtime engine, loading and type-checking provider components, and
//! sandboxed calls into them (a fresh instance per call, CPU, memory and wall-clock limits).

pub mod bindings;
mod cache;
mod engine;
mod error;
mod instance;
mod load;
mod state;
pub mod types;

pub use engine::{AllocatorKind, EngineOptions, PluginEngine};
pub use error::{CallError, LoadError};
pub use instance::{ProviderInstance, ProviderInstanceOptions};
pub use load::{ComponentSummary, LoadedPlugin, SUPPORTED_WIT_VERSIONS, inspect_component};
pub use state::HostState;
