//! The host's imports (`log`, `http`, `kube`, `libvirt`), implemented once, for the newest WIT
//! version's traits. They are unchanged since 0.1.0: every older version's `bindgen!` maps them
//! onto the newest's with `with:`, so one implementation serves every version. A version that
//! changes one of them keeps its own bindings for that interface and a delegating impl in its
//! module.

use std::time::Duration;

use wasmtime::component::{HasSelf, Linker, Resource};

use crate::provider::capabilities::libvirt::{self as lv_cap, Hypervisor};
use crate::provider::capabilities::{http as http_cap, kube as kube_cap, log as log_cap};
use crate::provider::plugins::state::HostState;

use super::latest::proxy_operator::provider::{http, kube, libvirt, log};

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String, fields: Vec<(String, String)>) {
        let level = match level {
            log::Level::Trace => log_cap::Level::Trace,
            log::Level::Debug => log_cap::Level::Debug,
            log::Level::Info => log_cap::Level::Info,
            log::Level::Warn => log_cap::Level::Warn,
            log::Level::Error => log_cap::Level::Error,
        };
        log_cap::log(&self.context.log, level, &message, &fields);
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
        match self
            .context
            .http
            .send(&self.context.provider, request)
            .await
        {
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

impl From<kube_cap::KubeError> for kube::KubeError {
    fn from(e: kube_cap::KubeError) -> Self {
        use kube_cap::KubeError as E;
        match e {
            E::Denied(m) => kube::KubeError::Denied(m),
            E::NotFound(m) => kube::KubeError::NotFound(m),
            E::Conflict(m) => kube::KubeError::Conflict(m),
            E::Invalid(m) => kube::KubeError::Invalid(m),
            E::Unauthorized(m) => kube::KubeError::Unauthorized(m),
            E::Transport(m) => kube::KubeError::Transport(m),
        }
    }
}

impl kube::Host for HostState {
    async fn namespace(&mut self) -> String {
        self.context.kube.namespace()
    }
    async fn get(
        &mut self,
        api_version: String,
        kind: String,
        name: String,
    ) -> Result<String, kube::KubeError> {
        Ok(self.context.kube.get(&api_version, &kind, &name).await?)
    }
    async fn apply(&mut self, object: String) -> Result<String, kube::KubeError> {
        Ok(self.context.kube.apply(&object).await?)
    }
    async fn delete(
        &mut self,
        api_version: String,
        kind: String,
        name: String,
    ) -> Result<(), kube::KubeError> {
        Ok(self.context.kube.delete(&api_version, &kind, &name).await?)
    }
    async fn list(
        &mut self,
        api_version: String,
        kind: String,
        label_selector: Option<String>,
    ) -> Result<Vec<String>, kube::KubeError> {
        Ok(self
            .context
            .kube
            .list(&api_version, &kind, label_selector.as_deref())
            .await?)
    }
}

type LvResult<T> = Result<T, libvirt::LibvirtError>;

impl From<lv_cap::LibvirtError> for libvirt::LibvirtError {
    fn from(e: lv_cap::LibvirtError) -> Self {
        use lv_cap::LibvirtError as E;
        match e {
            E::Denied(m) => libvirt::LibvirtError::Denied(m),
            E::NotFound(m) => libvirt::LibvirtError::NotFound(m),
            E::Transport(m) => libvirt::LibvirtError::Transport(m),
            E::SshHandshakeFailed(m) => libvirt::LibvirtError::SshHandshakeFailed(m),
            E::HostKeyMismatch(m) => libvirt::LibvirtError::HostKeyMismatch(m),
            E::AuthFailed(m) => libvirt::LibvirtError::AuthFailed(m),
            E::Timeout(m) => libvirt::LibvirtError::Timeout(m),
            E::Failed(m) => libvirt::LibvirtError::Failed(m),
            E::ChecksumMismatch(m) => libvirt::LibvirtError::ChecksumMismatch(m),
        }
    }
}

impl From<lv_cap::DomainInfo> for libvirt::DomainInfo {
    fn from(d: lv_cap::DomainInfo) -> Self {
        use lv_cap::DomainState as S;
        libvirt::DomainInfo {
            name: d.name,
            uuid: d.uuid,
            state: match d.state {
                S::NoState => libvirt::DomainState::NoState,
                S::Running => libvirt::DomainState::Running,
                S::Blocked => libvirt::DomainState::Blocked,
                S::Paused => libvirt::DomainState::Paused,
                S::Shutdown => libvirt::DomainState::Shutdown,
                S::Shutoff => libvirt::DomainState::Shutoff,
                S::Crashed => libvirt::DomainState::Crashed,
                S::Suspended => libvirt::DomainState::Suspended,
            },
            metadata: d.metadata,
        }
    }
}

impl From<lv_cap::VolumeInfo> for libvirt::VolumeInfo {
    fn from(v: lv_cap::VolumeInfo) -> Self {
        libvirt::VolumeInfo {
            name: v.name,
            path: v.path,
            capacity: v.capacity,
            allocation: v.allocation,
        }
    }
}

/// The hypervisor behind a handle the plugin holds.
fn hypervisor<'a>(state: &'a HostState, handle: &Resource<Hypervisor>) -> LvResult<&'a Hypervisor> {
    state
        .table
        .get(handle)
        .map_err(|e| libvirt::LibvirtError::Failed(format!("invalid hypervisor handle: {e}")))
}

impl libvirt::Host for HostState {}

impl libvirt::HostHypervisor for HostState {
    async fn open(&mut self, host: String) -> LvResult<Resource<Hypervisor>> {
        let hypervisor = self.context.libvirt.open(&host)?;
        self.table
            .push(hypervisor)
            .map_err(|e| libvirt::LibvirtError::Failed(format!("too many hypervisor handles: {e}")))
    }
    async fn probe(
        &mut self,
        h: Resource<Hypervisor>,
        timeout_ms: u32,
    ) -> LvResult<libvirt::ProbeReport> {
        let timeout = Duration::from_millis(timeout_ms.clamp(100, 60_000).into());
        let report = hypervisor(self, &h)?.probe(timeout).await?;
        Ok(libvirt::ProbeReport {
            ssh_ms: report.ssh_ms,
            libvirt_ms: report.libvirt_ms,
            libvirt_version: report.libvirt_version,
        })
    }
    async fn define_domain(
        &mut self,
        h: Resource<Hypervisor>,
        xml: String,
    ) -> LvResult<libvirt::DomainInfo> {
        Ok(hypervisor(self, &h)?.define_domain(xml).await?.into())
    }
    async fn lookup_domain(
        &mut self,
        h: Resource<Hypervisor>,
        name: String,
        metadata_uri: Option<String>,
    ) -> LvResult<libvirt::DomainInfo> {
        Ok(hypervisor(self, &h)?
            .lookup_domain(name, metadata_uri)
            .await?
            .into())
    }
    async fn start_domain(&mut self, h: Resource<Hypervisor>, name: String) -> LvResult<()> {
        Ok(hypervisor(self, &h)?.start_domain(name).await?)
    }
    async fn destroy_domain(&mut self, h: Resource<Hypervisor>, name: String) -> LvResult<()> {
        Ok(hypervisor(self, &h)?.destroy_domain(name).await?)
    }
    async fn undefine_domain(&mut self, h: Resource<Hypervisor>, name: String) -> LvResult<()> {
        Ok(hypervisor(self, &h)?.undefine_domain(name).await?)
    }
    async fn list_domains(
        &mut self,
        h: Resource<Hypervisor>,
        metadata_uri: Option<String>,
    ) -> LvResult<Vec<libvirt::DomainInfo>> {
        let domains = hypervisor(self, &h)?.list_domains(metadata_uri).await?;
        Ok(domains.into_iter().map(Into::into).collect())
    }
    async fn domain_addresses(
        &mut self,
        h: Resource<Hypervisor>,
        name: String,
    ) -> LvResult<Vec<libvirt::InterfaceAddress>> {
        let addresses = hypervisor(self, &h)?.domain_addresses(name).await?;
        Ok(addresses
            .into_iter()
            .map(|a| libvirt::InterfaceAddress {
                name: a.name,
                mac: a.mac,
                address: a.address,
                prefix: a.prefix,
            })
            .collect())
    }
    async fn pool_info(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
    ) -> LvResult<libvirt::PoolInfo> {
        let p = hypervisor(self, &h)?.pool_info(pool).await?;
        Ok(libvirt::PoolInfo {
            name: p.name,
            active: p.active,
            path: p.path,
            capacity: p.capacity,
            allocation: p.allocation,
            available: p.available,
        })
    }
    async fn refresh_pool(&mut self, h: Resource<Hypervisor>, pool: String) -> LvResult<()> {
        Ok(hypervisor(self, &h)?.refresh_pool(pool).await?)
    }
    async fn create_volume(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
        xml: String,
    ) -> LvResult<libvirt::VolumeInfo> {
        Ok(hypervisor(self, &h)?.create_volume(pool, xml).await?.into())
    }
    async fn lookup_volume(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
        name: String,
    ) -> LvResult<libvirt::VolumeInfo> {
        Ok(hypervisor(self, &h)?
            .lookup_volume(pool, name)
            .await?
            .into())
    }
    async fn delete_volume(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
        name: String,
    ) -> LvResult<()> {
        Ok(hypervisor(self, &h)?.delete_volume(pool, name).await?)
    }
    async fn upload_volume(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
        name: String,
        data: Vec<u8>,
    ) -> LvResult<()> {
        Ok(hypervisor(self, &h)?
            .upload_volume(pool, name, data)
            .await?)
    }
    async fn import_image(
        &mut self,
        h: Resource<Hypervisor>,
        pool: String,
        name: String,
        source: libvirt::ImageSource,
    ) -> LvResult<libvirt::VolumeInfo> {
        let source = lv_cap::ImageSource {
            url: source.url,
            sha256: source.sha256,
            format: source.format,
        };
        let context = self.context.clone();
        Ok(hypervisor(self, &h)?
            .import_image(context, pool, name, source)
            .await?
            .into())
    }
    async fn drop(&mut self, rep: Resource<Hypervisor>) -> wasmtime::Result<()> {
        self.table.delete(rep)?;
        Ok(())
    }
}

/// Adds these imports to the linker under `version`'s interface names (`…/log@0.1.0`), for an
/// older version whose `bindgen!` maps them onto these with `with:`: that world's own
/// `add_to_linker` would add them under the newest version's names.
pub(super) fn add_to_linker_as(
    linker: &mut Linker<HostState>,
    version: &str,
) -> wasmtime::Result<()> {
    let name = |interface: &str| format!("proxy-operator:provider/{interface}@{version}");
    log::add_to_linker_instance::<_, HasSelf<_>>(&mut linker.instance(&name("log"))?, |s| s)?;
    http::add_to_linker_instance::<_, HasSelf<_>>(&mut linker.instance(&name("http"))?, |s| s)?;
    kube::add_to_linker_instance::<_, HasSelf<_>>(&mut linker.instance(&name("kube"))?, |s| s)?;
    libvirt::add_to_linker_instance::<_, HasSelf<_>>(&mut linker.instance(&name("libvirt"))?, |s| s)
}
