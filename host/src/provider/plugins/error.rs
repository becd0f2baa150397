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
    #[error("{source_name}: cannot compile the component: {source:#}")]
    Compile {
        source_name: String,
        #[source]
        source: wasmtime::Error,
    },
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
        "plugin `{plugin}` used more than its CPU budget of {} in `{function}` and was stopped; \
         raise it with --plugin-cpu-budget-ms (PLUGIN_CPU_BUDGET_MS) if the plugin needs more",
        human_duration(*budget)
    )]
    CpuDeadline {
        plugin: String,
        function: &'static str,
        budget: Duration,
    },
    #[error(
        "plugin `{plugin}` exceeded its memory limit of {} in `{function}` and was stopped; \
         raise it with --plugin-memory-limit-mib (PLUGIN_MEMORY_LIMIT_MIB) if the plugin needs more",
        human_bytes(*limit)
    )]
    OutOfMemory {
        plugin: String,
        function: &'static str,
        limit: usize,
    },
    #[error(
        "plugin `{plugin}` was stopped in `{function}`: the plugins' memory total of {} is held by \
         the calls in flight; raise it with --plugin-memory-total-mib (PLUGIN_MEMORY_TOTAL_MIB) \
         within the container's memory limit, or run fewer calls at once",
        human_bytes(*total)
    )]
    MemoryTotal {
        plugin: String,
        function: &'static str,
        total: usize,
    },
    #[error(
        "plugin `{plugin}` did not finish `{function}` within {} and was abandoned; raise the \
         limit with --plugin-call-timeout-seconds (PLUGIN_CALL_TIMEOUT_SECONDS) if the provider's \
         API is that slow",
        human_duration(*timeout)
    )]
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
    /// The host's own code panicked serving the call (a bug of the operator's, reached through
    /// what the plugin sent): the call fails, the process goes on.
    #[error(
        "the operator failed serving plugin `{plugin}`'s `{function}` call (a bug in proxy-operator, \
         logged with its details; please report it): {reason}"
    )]
    HostPanic {
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

/// `500 ms`, `2 s`, `1.5 s`: a limit as a person writes it.
fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

/// `128 MiB`, `640 KiB`, `1000 bytes`: the largest unit that divides the size.
fn human_bytes(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

impl CallError {
    /// A bounded label for metrics and status reasons.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::Provider { error, .. } => error.kind(),
            CallError::CpuDeadline { .. } => "cpu_deadline",
            CallError::OutOfMemory { .. } | CallError::MemoryTotal { .. } => "out_of_memory",
            CallError::Timeout { .. } => "timeout",
            CallError::Trap { .. } => "trap",
            CallError::Instantiate { .. } => "instantiate",
            CallError::HostPanic { .. } => "host_panic",
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox limit names itself in human units and the flag (and its variable) that raises it.
    #[test]
    fn limit_errors_name_the_limit_and_the_flag_that_raises_it() {
        let cases = [
            (
                CallError::CpuDeadline {
                    plugin: "kvm".into(),
                    function: "create",
                    budget: Duration::from_millis(2000),
                },
                [
                    "CPU budget of 2 s",
                    "--plugin-cpu-budget-ms",
                    "PLUGIN_CPU_BUDGET_MS",
                ],
            ),
            (
                CallError::CpuDeadline {
                    plugin: "kvm".into(),
                    function: "create",
                    budget: Duration::from_millis(500),
                },
                [
                    "CPU budget of 500 ms",
                    "--plugin-cpu-budget-ms",
                    "PLUGIN_CPU_BUDGET_MS",
                ],
            ),
            (
                CallError::OutOfMemory {
                    plugin: "kvm".into(),
                    function: "list",
                    limit: 128 << 20,
                },
                [
                    "memory limit of 128 MiB",
                    "--plugin-memory-limit-mib",
                    "PLUGIN_MEMORY_LIMIT_MIB",
                ],
            ),
            (
                CallError::MemoryTotal {
                    plugin: "kvm".into(),
                    function: "list",
                    total: 384 << 20,
                },
                [
                    "memory total of 384 MiB",
                    "--plugin-memory-total-mib",
                    "PLUGIN_MEMORY_TOTAL_MIB",
                ],
            ),
            (
                CallError::Timeout {
                    plugin: "gcp".into(),
                    function: "delete",
                    timeout: Duration::from_secs(60),
                },
                [
                    "within 60 s",
                    "--plugin-call-timeout-seconds",
                    "PLUGIN_CALL_TIMEOUT_SECONDS",
                ],
            ),
            (
                CallError::Timeout {
                    plugin: "gcp".into(),
                    function: "delete",
                    timeout: Duration::from_millis(1500),
                },
                [
                    "within 1.5 s",
                    "--plugin-call-timeout-seconds",
                    "PLUGIN_CALL_TIMEOUT_SECONDS",
                ],
            ),
        ];
        for (error, expected) in cases {
            let message = error.to_string();
            for part in expected {
                assert!(message.contains(part), "`{message}` should say `{part}`");
            }
        }
    }
}
