//! Errors of loading a plugin and of calling one. Each names the plugin and says what was
//! expected and what was found.

use std::time::Duration;

use super::types::ProviderError;

/// A plugin that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{source_name}: not a WebAssembly file (no `\\0asm` header)")]
    NotWasm { source_name: String },
    #[error(
        "{source_name}: this is a core WebAssembly module, not a component; build the provider with \
         `cargo build --target wasm32-wasip2` (which emits a component) or wrap the module with \
         `wasm-tools component new`"
    )]
    CoreModule { source_name: String },
    #[error("{source_name}: cannot compile the component: {reason}")]
    Compile { source_name: String, reason: String },
    #[error(
        "{source_name}: not a proxy-operator provider: it exports no `proxy-operator:provider/provider` \
         interface (it exports: {found}); expected `proxy-operator:provider/provider@{supported}`"
    )]
    NotAProvider {
        source_name: String,
        found: String,
        supported: String,
    },
    #[error(
        "{source_name}: built for WIT `proxy-operator:provider@{found}`, which this operator does not \
         support; supported versions: {supported}. Rebuild the plugin against a supported version of \
         the WIT (see docs/plugin-authoring.md)"
    )]
    UnsupportedVersion {
        source_name: String,
        found: String,
        supported: String,
    },
    #[error(
        "{source_name}: does not match WIT `proxy-operator:provider@{version}`: {reason}. A provider \
         must export every function of the `provider` interface and import only the host's interfaces"
    )]
    Incompatible {
        source_name: String,
        version: String,
        reason: String,
    },
    #[error("{source_name}: `describe` failed: {source}")]
    Describe {
        source_name: String,
        #[source]
        source: Box<CallError>,
    },
    #[error("{source_name}: {reason}")]
    Io { source_name: String, reason: String },
}

/// A call into a plugin that did not return a result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The provider answered with an error it classified itself.
    #[error("provider `{provider}` ({function}): {error}")]
    Provider {
        provider: String,
        function: &'static str,
        error: ProviderError,
    },
    #[error(
        "plugin `{plugin}` used more than its CPU budget of {budget:?} in `{function}` and was stopped"
    )]
    CpuDeadline {
        plugin: String,
        function: &'static str,
        budget: Duration,
    },
    #[error(
        "plugin `{plugin}` exceeded its memory limit of {limit} bytes in `{function}` and was stopped"
    )]
    OutOfMemory {
        plugin: String,
        function: &'static str,
        limit: usize,
    },
    #[error("plugin `{plugin}` did not finish `{function}` within {timeout:?} and was abandoned")]
    Timeout {
        plugin: String,
        function: &'static str,
        timeout: Duration,
    },
    #[error("plugin `{plugin}` trapped in `{function}`: {reason}")]
    Trap {
        plugin: String,
        function: &'static str,
        reason: String,
    },
    #[error("plugin `{plugin}` could not be instantiated for `{function}`: {reason}")]
    Instantiate {
        plugin: String,
        function: &'static str,
        reason: String,
    },
}

impl CallError {
    /// A bounded label for metrics and status reasons.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::Provider { error, .. } => error.kind(),
            CallError::CpuDeadline { .. } => "cpu_deadline",
            CallError::OutOfMemory { .. } => "out_of_memory",
            CallError::Timeout { .. } => "timeout",
            CallError::Trap { .. } => "trap",
            CallError::Instantiate { .. } => "instantiate",
        }
    }

    /// The provider's own classification, when the call got that far.
    pub fn provider_error(&self) -> Option<&ProviderError> {
        match self {
            CallError::Provider { error, .. } => Some(error),
            _ => None,
        }
    }
}
