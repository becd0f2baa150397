//! Bindings for `proxy-operator:provider@0.1.0` (`wit/since_v0.1.0`).

use std::time::Duration;

use wasmtime::component::Resource;

use crate::capabilities::{http as http_cap, libvirt::Hypervisor, log as log_cap};
use crate::plugins::state::HostState;
use crate::plugins::types;

wasmtime::component::bindgen!({
    world: "provider-plugin",
    path: "../wit/since_v0.1.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "proxy-operator:provider/libvirt.hypervisor": crate::capabilities::libvirt::Hypervisor,
    },
});

use self::proxy_operator::provider::types as wit;
use self::proxy_operator::provider::{http, kube, libvirt, log};

/// The interface name a component must export for this version.
pub const PROVIDER_EXPORT: &str = "proxy-operator:provider/provider@0.1.0";

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

impl From<types::InstanceSpec> for wit::InstanceSpec {
    fn from(s: types::InstanceSpec) -> Self {
        wit::InstanceSpec {
            name: s.name,
            owner: s.owner.into(),
            zone: s.zone,
            image: s.image,
            machine_type: s.machine_type,
            user_data: s.user_data,
            vendor_data: s.vendor_data,
            install_guest_agent: s.install_guest_agent,
            port: s.port,
            labels: s.labels,
            options: s.options.to_string(),
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

impl wit::Host for HostState {}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String, fields: Vec<(String, String)>) {
        let level = match level {
            log::Level::Trace => log_cap::Level::Trace,
            log::Level::Debug => log_cap::Level::Debug,
            log::Level::Info => log_cap::Level::Info,
            log::Level::Warn => log_cap::Level::Warn,
            log::Level::Error => log_cap::Level::Error,
        };
        log_cap::log(&self.context, level, &message, &fields);
    }
}

impl http::Host for HostState {
    async fn send(&mut self, request: http::Request) -> Result<http::Response, http::HttpError> {
        let request = http_cap::HttpRequest {
            method: request.method,
            url: request.url,
            headers: request.headers,
            body: request.body,
            timeout: request
                .timeout_ms
                .map(|ms| Duration::from_millis(ms.into())),
        };
        match self.context.http.send(&self.context, request).await {
            Ok(r) => Ok(http::Response {
                status: r.status,
                headers: r.headers,
                body: r.body,
            }),
            Err(e) => Err(match e {
                http_cap::HttpError::Denied(m) => http::HttpError::Denied(m),
                http_cap::HttpError::InvalidRequest(m) => http::HttpError::InvalidRequest(m),
                http_cap::HttpError::Timeout(m) => http::HttpError::Timeout(m),
                http_cap::HttpError::Transport(m) => http::HttpError::Transport(m),
                http_cap::HttpError::TooLarge(m) => http::HttpError::TooLarge(m),
            }),
        }
    }
}

fn kube_denied() -> kube::KubeError {
    kube::KubeError::Denied(
        "the kube capability is not available in this operator version yet".into(),
    )
}

impl kube::Host for HostState {
    async fn namespace(&mut self) -> String {
        String::new()
    }
    async fn get(&mut self, _: String, _: String, _: String) -> Result<String, kube::KubeError> {
        Err(kube_denied())
    }
    async fn apply(&mut self, _: String) -> Result<String, kube::KubeError> {
        Err(kube_denied())
    }
    async fn delete(&mut self, _: String, _: String, _: String) -> Result<(), kube::KubeError> {
        Err(kube_denied())
    }
    async fn list(
        &mut self,
        _: String,
        _: String,
        _: Option<String>,
    ) -> Result<Vec<String>, kube::KubeError> {
        Err(kube_denied())
    }
}

fn libvirt_denied() -> libvirt::LibvirtError {
    libvirt::LibvirtError::Denied(
        "the libvirt capability is not available in this operator version yet".into(),
    )
}

type LvResult<T> = Result<T, libvirt::LibvirtError>;

impl libvirt::Host for HostState {}

impl libvirt::HostHypervisor for HostState {
    async fn open(&mut self, _host: String) -> LvResult<Resource<Hypervisor>> {
        Err(libvirt_denied())
    }
    async fn probe(&mut self, _: Resource<Hypervisor>, _: u32) -> LvResult<libvirt::ProbeReport> {
        Err(libvirt_denied())
    }
    async fn define_domain(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
    ) -> LvResult<libvirt::DomainInfo> {
        Err(libvirt_denied())
    }
    async fn lookup_domain(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: Option<String>,
    ) -> LvResult<libvirt::DomainInfo> {
        Err(libvirt_denied())
    }
    async fn start_domain(&mut self, _: Resource<Hypervisor>, _: String) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn destroy_domain(&mut self, _: Resource<Hypervisor>, _: String) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn undefine_domain(&mut self, _: Resource<Hypervisor>, _: String) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn list_domains(
        &mut self,
        _: Resource<Hypervisor>,
        _: Option<String>,
    ) -> LvResult<Vec<libvirt::DomainInfo>> {
        Err(libvirt_denied())
    }
    async fn domain_addresses(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
    ) -> LvResult<Vec<libvirt::InterfaceAddress>> {
        Err(libvirt_denied())
    }
    async fn pool_info(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
    ) -> LvResult<libvirt::PoolInfo> {
        Err(libvirt_denied())
    }
    async fn refresh_pool(&mut self, _: Resource<Hypervisor>, _: String) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn create_volume(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: String,
    ) -> LvResult<libvirt::VolumeInfo> {
        Err(libvirt_denied())
    }
    async fn lookup_volume(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: String,
    ) -> LvResult<libvirt::VolumeInfo> {
        Err(libvirt_denied())
    }
    async fn delete_volume(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: String,
    ) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn upload_volume(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: String,
        _: Vec<u8>,
    ) -> LvResult<()> {
        Err(libvirt_denied())
    }
    async fn import_image(
        &mut self,
        _: Resource<Hypervisor>,
        _: String,
        _: String,
        _: libvirt::ImageSource,
    ) -> LvResult<libvirt::VolumeInfo> {
        Err(libvirt_denied())
    }
    async fn drop(&mut self, rep: Resource<Hypervisor>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}
