//! Bindings for `proxy-operator:provider@0.1.0` (`wit/since_v0.1.0`), written as what differs
//! from the newest version: the capability interfaces are the newest's (`with:`, one host
//! implementation in `imports.rs`); the `types` interface is this version's own (its
//! `instance-spec` has no credentials), converted into the newest's types here; `set-credentials`
//! does not exist.

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::provider::plugins::call::{Call, CallFailure, Output};
use crate::provider::plugins::state::HostState;
use crate::provider::plugins::types;

use super::latest::wit as newest;

wasmtime::component::bindgen!({
    world: "provider-plugin",
    path: "../wit/since_v0.1.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "proxy-operator:provider/log": super::latest::proxy_operator::provider::log,
        "proxy-operator:provider/http": super::latest::proxy_operator::provider::http,
        "proxy-operator:provider/kube": super::latest::proxy_operator::provider::kube,
        "proxy-operator:provider/libvirt": super::latest::proxy_operator::provider::libvirt,
    },
});

use self::proxy_operator::provider::types as wit;

/// The WIT version these bindings serve.
pub const VERSION: &str = "0.1.0";

/// 0.1.0's `instance-spec` has no credentials and it has no `set-credentials`: the host gives
/// its plugins none.
pub(crate) const CARRIES_CREDENTIALS: bool = false;

impl wit::Host for HostState {}

/// Adds this version's host imports to the linker: its own `types`, and the newest version's
/// capability interfaces under this version's names.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    super::imports::add_to_linker_as(linker, VERSION)
}

/// Instantiates the component in `store` and makes one call through these bindings; answers
/// become the newest version's types, then the host's.
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
            .map(|info| Ok(Output::Info(newest::PluginInfo::from(info).into()))),
        Call::ValidateConfig => api
            .call_validate_config(&mut *store, config)
            .await
            .map(|r| r.map(|()| Output::Unit(())).map_err(host_error)),
        Call::Create(spec) => api
            .call_create(&mut *store, config, &newest::InstanceSpec::from(*spec).into())
            .await
            .map(|r| r.map(host_instance).map(Output::Instance).map_err(host_error)),
        Call::Get(id) => api
            .call_get(&mut *store, config, &id)
            .await
            .map(|r| r.map(host_instance).map(Output::Instance).map_err(host_error)),
        Call::Delete(id) => api
            .call_delete(&mut *store, config, &id)
            .await
            .map(|r| r.map(|()| Output::Unit(())).map_err(host_error)),
        Call::SetCredentials(..) => Ok(Err(types::ProviderError::Permanent(
            "this plugin is built for WIT 0.1.0, which cannot change a proxy's credentials; rebuild it for 0.2.0".into(),
        ))),
        Call::List => api.call_list(&mut *store, config).await.map(|r| {
            r.map(|l| Output::Instances(l.into_iter().map(host_instance).collect()))
                .map_err(host_error)
        }),
        Call::Check => api.call_check(&mut *store, config).await.map(|r| {
            r.map(|l| {
                Output::Checks(
                    l.into_iter()
                        .map(|c| newest::CheckTarget::from(c).into())
                        .collect(),
                )
            })
            .map_err(host_error)
        }),
    };
    answer.map_err(CallFailure::Run)
}

fn host_error(err: wit::ProviderError) -> types::ProviderError {
    newest::ProviderError::from(err).into()
}

fn host_instance(instance: wit::Instance) -> types::Instance {
    newest::Instance::from(instance).into()
}

// This version's `types` in the newest version's: the records are the same but for
// `instance-spec` (no credentials).

impl From<newest::InstanceSpec> for wit::InstanceSpec {
    fn from(spec: newest::InstanceSpec) -> Self {
        // `spec.credentials` is dropped: 0.1.0 cannot carry them (the host gives such plugins
        // none, see CARRIES_CREDENTIALS).
        wit::InstanceSpec {
            name: spec.name,
            owner: newest_owner_to_this(spec.owner),
            zone: spec.zone,
            image: spec.image,
            machine_type: spec.machine_type,
            user_data: spec.user_data,
            vendor_data: spec.vendor_data,
            install_guest_agent: spec.install_guest_agent,
            port: spec.port,
            labels: spec.labels,
            options: spec.options,
        }
    }
}

fn newest_owner_to_this(o: newest::Owner) -> wit::Owner {
    wit::Owner {
        namespace: o.namespace,
        name: o.name,
        uid: o.uid,
        operator_id: o.operator_id,
    }
}

impl From<wit::Owner> for newest::Owner {
    fn from(o: wit::Owner) -> Self {
        newest::Owner {
            namespace: o.namespace,
            name: o.name,
            uid: o.uid,
            operator_id: o.operator_id,
        }
    }
}

impl From<wit::ProviderError> for newest::ProviderError {
    fn from(err: wit::ProviderError) -> Self {
        use newest::ProviderError as E;
        match err {
            wit::ProviderError::NotFound(m) => E::NotFound(m),
            wit::ProviderError::Transient(t) => E::Transient(newest::TransientError {
                message: t.message,
                retry_after_ms: t.retry_after_ms,
            }),
            wit::ProviderError::Permanent(m) => E::Permanent(m),
            wit::ProviderError::InvalidConfig(m) => E::InvalidConfig(m),
            wit::ProviderError::Unauthorized(m) => E::Unauthorized(m),
            wit::ProviderError::Quota(m) => E::Quota(m),
            wit::ProviderError::Denied(m) => E::Denied(m),
        }
    }
}

impl From<wit::Instance> for newest::Instance {
    fn from(i: wit::Instance) -> Self {
        use newest::InstanceState as S;
        newest::Instance {
            provider_id: i.provider_id,
            name: i.name,
            state: match i.state {
                wit::InstanceState::Pending => S::Pending,
                wit::InstanceState::Provisioning => S::Provisioning,
                wit::InstanceState::Running => S::Running,
                wit::InstanceState::Stopping => S::Stopping,
                wit::InstanceState::Stopped => S::Stopped,
                wit::InstanceState::Failed => S::Failed,
                wit::InstanceState::Unknown => S::Unknown,
            },
            address: i.address,
            port: i.port,
            zone: i.zone,
            created_at: i.created_at,
            owner: i.owner.map(Into::into),
            message: i.message,
        }
    }
}

impl From<wit::PluginInfo> for newest::PluginInfo {
    fn from(p: wit::PluginInfo) -> Self {
        use newest::Capability as C;
        newest::PluginInfo {
            name: p.name,
            version: p.version,
            description: p.description,
            capabilities: p
                .capabilities
                .into_iter()
                .map(|c| match c {
                    wit::Capability::Log => C::Log,
                    wit::Capability::Http => C::Http,
                    wit::Capability::Kube => C::Kube,
                    wit::Capability::Libvirt => C::Libvirt,
                })
                .collect(),
            config_schema: p.config_schema,
        }
    }
}

impl From<wit::CheckTarget> for newest::CheckTarget {
    fn from(c: wit::CheckTarget) -> Self {
        newest::CheckTarget {
            target: c.target,
            ok: c.ok,
            reason: c.reason,
            message: c.message,
            latency_ms: c.latency_ms,
        }
    }
}
