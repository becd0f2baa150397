//! The calls into a provider and their outputs, as the host sees them whatever the WIT version.

use super::types::{CheckTarget, Instance, InstanceSpec, PluginInfo, ProxyCredentials};

/// A call into a provider, independent of the WIT version serving it.
pub(crate) enum Call {
    Describe,
    ValidateConfig,
    Create(Box<InstanceSpec>),
    Get(String),
    Delete(String),
    /// New in WIT 0.2.0: the provider id and the credentials squid must now require.
    SetCredentials(String, Box<ProxyCredentials>),
    List,
    Check,
}

impl Call {
    /// The WIT function's name, for metrics and errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Call::Describe => "describe",
            Call::ValidateConfig => "validate-config",
            Call::Create(_) => "create",
            Call::Get(_) => "get",
            Call::Delete(_) => "delete",
            Call::SetCredentials(..) => "set-credentials",
            Call::List => "list",
            Call::Check => "check",
        }
    }
}

/// What a call returned, by kind.
pub(crate) enum Output {
    Info(PluginInfo),
    Unit(()),
    Instance(Instance),
    Instances(Vec<Instance>),
    Checks(Vec<CheckTarget>),
}

/// Why a call produced no answer from the provider.
pub(crate) enum CallFailure {
    /// The component could not be instantiated in the store.
    Instantiate(wasmtime::Error),
    /// The call trapped or was interrupted.
    Run(wasmtime::Error),
}
