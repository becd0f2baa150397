//! Bindings for `proxy-operator:provider@0.2.0` (`wit/since_v0.2.0`), the newest version: 0.1.0
//! plus proxy credentials (`instance-spec.credentials`, `set-credentials`). The host's imports
//! are implemented for these bindings' traits (`imports.rs`) and the host's own types convert
//! to and from these bindings' types here; older versions convert into these.

use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::provider::plugins::call::{Call, CallFailure, Output};
use crate::provider::plugins::state::HostState;
use crate::provider::plugins::types;

wasmtime::component::bindgen!({
    world: "provider-plugin",
    path: "../wit/since_v0.2.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "proxy-operator:provider/libvirt.hypervisor": crate::provider::capabilities::libvirt::Hypervisor,
    },
});

pub(crate) use self::proxy_operator::provider::types as wit;

/// The WIT version these bindings serve.
pub const VERSION: &str = "0.2.0";

/// Whether a component of this version can be given proxy credentials (`instance-spec` carries
/// them and `set-credentials` changes them).
pub(crate) const CARRIES_CREDENTIALS: bool = true;

impl wit::Host for HostState {}

/// Adds this version's host imports to the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    ProviderPlugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

/// Instantiates the component in `store` and makes one call through these bindings.
pub(crate) async fn call(
    store: &mut Store<HostState>,
    pre: &ProviderPluginPre<HostState>,
    config: &str,
    call: Call,
) -> Result<Result<Output, types::ProviderError>, CallFailure> {
    let bindings = pre
        .instantiate_async(&mut *store)
        .await
        .map_err(CallFailure::Instantiate)?;
    let api = bindings.proxy_operator_provider_provider();
    let answer = match call {
        Call::Describe => api
            .call_describe(&mut *store)
            .await
            .map(|info| Ok(Output::Info(info.into()))),
        Call::ValidateConfig => api
            .call_validate_config(&mut *store, config)
            .await
            .map(|r| r.map(|()| Output::Unit(())).map_err(Into::into)),
        Call::Create(spec) => api
            .call_create(&mut *store, config, &(*spec).into())
            .await
            .map(|r| r.map(|i| Output::Instance(i.into())).map_err(Into::into)),
        Call::Get(id) => api
            .call_get(&mut *store, config, &id)
            .await
            .map(|r| r.map(|i| Output::Instance(i.into())).map_err(Into::into)),
        Call::Delete(id) => api
            .call_delete(&mut *store, config, &id)
            .await
            .map(|r| r.map(|()| Output::Unit(())).map_err(Into::into)),
        Call::SetCredentials(id, credentials) => api
            .call_set_credentials(&mut *store, config, &id, &(*credentials).into())
            .await
            .map(|r| r.map(|()| Output::Unit(())).map_err(Into::into)),
        Call::List => api.call_list(&mut *store, config).await.map(|r| {
            r.map(|l| Output::Instances(l.into_iter().map(Into::into).collect()))
                .map_err(Into::into)
        }),
        Call::Check => api.call_check(&mut *store, config).await.map(|r| {
            r.map(|l| Output::Checks(l.into_iter().map(Into::into).collect()))
                .map_err(Into::into)
        }),
    };
    answer.map_err(CallFailure::Run)
}

impl From<wit::ProviderError> for types::ProviderError {
    fn from(err: wit::ProviderError) -> Self {
        match err {
            wit::ProviderError::NotFound(m) => types::ProviderError::NotFound(m),
            wit::ProviderError::Transient(t) => types::ProviderError::Transient {
                message: t.message,
                retry_after: t.retry_after_ms.map(Duration::from_millis),
            },
            wit::ProviderError::Permanent(m) => types::ProviderError::Permanent(m),
            wit::ProviderError::InvalidConfig(m) => types::ProviderError::InvalidConfig(m),
            wit::ProviderError::Unauthorized(m) => types::ProviderError::Unauthorized(m),
            wit::ProviderError::Quota(m) => types::ProviderError::Quota(m),
            wit::ProviderError::Denied(m) => types::ProviderError::Denied(m),
        }
    }
}

impl From<wit::Owner> for types::Owner {
    fn from(o: wit::Owner) -> Self {
        types::Owner {
            namespace: o.namespace,
            name: o.name,
            uid: o.uid,
            operator_id: o.operator_id,
        }
    }
}

impl From<types::Owner> for wit::Owner {
    fn from(o: types::Owner) -> Self {
        wit::Owner {
            namespace: o.namespace,
            name: o.name,
            uid: o.uid,
            operator_id: o.operator_id,
        }
    }
}

impl From<wit::InstanceState> for types::InstanceState {
    fn from(s: wit::InstanceState) -> Self {
        match s {
            wit::InstanceState::Pending => types::InstanceState::Pending,
            wit::InstanceState::Provisioning => types::InstanceState::Provisioning,
            wit::InstanceState::Running => types::InstanceState::Running,
            wit::InstanceState::Stopping => types::InstanceState::Stopping,
            wit::InstanceState::Stopped => types::InstanceState::Stopped,
            wit::InstanceState::Failed => types::InstanceState::Failed,
            wit::InstanceState::Unknown => types::InstanceState::Unknown,
        }
    }
}

impl From<wit::Instance> for types::Instance {
    fn from(i: wit::Instance) -> Self {
        types::Instance {
            provider_id: i.provider_id,
            name: i.name,
            state: i.state.into(),
            address: i.address,
            port: i.port,
            zone: i.zone,
            created_at: i.created_at,
            owner: i.owner.map(Into::into),
            message: i.message,
        }
    }
}

impl From<wit::PluginInfo> for types::PluginInfo {
    fn from(p: wit::PluginInfo) -> Self {
        types::PluginInfo {
            name: p.name,
            version: p.version,
            description: p.description,
            capabilities: p
                .capabilities
                .into_iter()
                .map(|c| match c {
                    wit::Capability::Log => types::Capability::Log,
                    wit::Capability::Http => types::Capability::Http,
                    wit::Capability::Kube => types::Capability::Kube,
                    wit::Capability::Libvirt => types::Capability::Libvirt,
                })
                .collect(),
            config_schema: p.config_schema,
        }
    }
}

impl From<wit::CheckTarget> for types::CheckTarget {
    fn from(c: wit::CheckTarget) -> Self {
        types::CheckTarget {
            target: c.target,
            ok: c.ok,
            reason: c.reason,
            message: c.message,
            latency_ms: c.latency_ms,
        }
    }
}

impl From<types::InstanceSpec> for wit::InstanceSpec {
    fn from(spec: types::InstanceSpec) -> Self {
        wit::InstanceSpec {
            name: spec.name,
            owner: spec.owner.into(),
            zone: spec.zone,
            image: spec.image,
            machine_type: spec.machine_type,
            user_data: spec.user_data,
            vendor_data: spec.vendor_data,
            install_guest_agent: spec.install_guest_agent,
            port: spec.port,
            labels: spec.labels,
            options: spec.options.to_string(),
            credentials: spec.credentials.map(Into::into),
        }
    }
}

impl From<types::ProxyCredentials> for wit::ProxyCredentials {
    fn from(c: types::ProxyCredentials) -> Self {
        wit::ProxyCredentials {
            username: c.username,
            password_hash: c.password_hash,
        }
    }
}
