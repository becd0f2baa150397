//! What every WIT version's bindings share, as macros expanded inside each version module (the
//! generated types differ by version, the conversions and host imports do not): one copy of the
//! code, type-checked against each version's types. Expanded where `wit`, `types`, `log`,
//! `http`, `kube`, `libvirt`, `lv_cap`, `HostState` and friends are in scope (see `v0_1_0`).

/// Conversions of the records every version has unchanged.
macro_rules! unchanged_conversions {
    () => {
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
    };
}
pub(crate) use unchanged_conversions;

/// `instance-spec` from the host's, with the fields a version added after 0.1.0's (`$spec` names
/// the host's spec in them).
macro_rules! instance_spec_conversion {
    (|$spec:ident| $($field:ident: $value:expr),* $(,)?) => {
        impl From<types::InstanceSpec> for wit::InstanceSpec {
            fn from($spec: types::InstanceSpec) -> Self {
                wit::InstanceSpec {
                    $($field: $value,)*
                    name: $spec.name,
                    owner: $spec.owner.into(),
                    zone: $spec.zone,
                    image: $spec.image,
                    machine_type: $spec.machine_type,
                    user_data: $spec.user_data,
                    vendor_data: $spec.vendor_data,
                    install_guest_agent: $spec.install_guest_agent,
                    port: $spec.port,
                    labels: $spec.labels,
                    options: $spec.options.to_string(),
                }
            }
        }
    };
}
pub(crate) use instance_spec_conversion;

/// The host's imports (`log`, `http`, `kube`, `libvirt`), unchanged since 0.1.0.
macro_rules! host_imports {
    () => {
        impl wit::Host for HostState {}

        impl log::Host for HostState {
            async fn log(
                &mut self,
                level: log::Level,
                message: String,
                fields: Vec<(String, String)>,
            ) {
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
            async fn send(
                &mut self,
                request: http::Request,
            ) -> Result<http::Response, http::HttpError> {
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
                        http_cap::HttpError::InvalidRequest(m) => {
                            http::HttpError::InvalidRequest(m)
                        }
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
        fn hypervisor<'a>(
            state: &'a HostState,
            handle: &Resource<Hypervisor>,
        ) -> LvResult<&'a Hypervisor> {
            state.table.get(handle).map_err(|e| {
                libvirt::LibvirtError::Failed(format!("invalid hypervisor handle: {e}"))
            })
        }

        impl libvirt::Host for HostState {}

        impl libvirt::HostHypervisor for HostState {
            async fn open(&mut self, host: String) -> LvResult<Resource<Hypervisor>> {
                let hypervisor = self.context.libvirt.open(&host)?;
                self.table.push(hypervisor).map_err(|e| {
                    libvirt::LibvirtError::Failed(format!("too many hypervisor handles: {e}"))
                })
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
            async fn start_domain(
                &mut self,
                h: Resource<Hypervisor>,
                name: String,
            ) -> LvResult<()> {
                Ok(hypervisor(self, &h)?.start_domain(name).await?)
            }
            async fn destroy_domain(
                &mut self,
                h: Resource<Hypervisor>,
                name: String,
            ) -> LvResult<()> {
                Ok(hypervisor(self, &h)?.destroy_domain(name).await?)
            }
            async fn undefine_domain(
                &mut self,
                h: Resource<Hypervisor>,
                name: String,
            ) -> LvResult<()> {
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
            async fn refresh_pool(
                &mut self,
                h: Resource<Hypervisor>,
                pool: String,
            ) -> LvResult<()> {
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
    };
}
pub(crate) use host_imports;

/// `call`: instantiates the component in `store` and makes one call through the version's
/// bindings. `$set_credentials` answers `Call::SetCredentials` (0.1.0 has no such function).
macro_rules! call_through_bindings {
    (|$api:ident, $store:ident, $config:ident, $id:ident, $credentials:ident| $set_credentials:expr) => {
        /// Instantiates the component in `store` and makes one call through these bindings.
        pub(crate) async fn call(
            $store: &mut Store<HostState>,
            pre: &ProviderPluginPre<HostState>,
            $config: &str,
            call: Call,
        ) -> Result<Result<Output, types::ProviderError>, CallFailure> {
            let bindings = pre
                .instantiate_async(&mut *$store)
                .await
                .map_err(CallFailure::Instantiate)?;
            let $api = bindings.proxy_operator_provider_provider();
            let answer = match call {
                Call::Describe => $api
                    .call_describe(&mut *$store)
                    .await
                    .map(|info| Ok(Output::Info(info.into()))),
                Call::ValidateConfig => $api
                    .call_validate_config(&mut *$store, $config)
                    .await
                    .map(|r| r.map(|()| Output::Unit(())).map_err(Into::into)),
                Call::Create(spec) => $api
                    .call_create(&mut *$store, $config, &(*spec).into())
                    .await
                    .map(|r| r.map(|i| Output::Instance(i.into())).map_err(Into::into)),
                Call::Get(id) => $api
                    .call_get(&mut *$store, $config, &id)
                    .await
                    .map(|r| r.map(|i| Output::Instance(i.into())).map_err(Into::into)),
                Call::Delete(id) => $api
                    .call_delete(&mut *$store, $config, &id)
                    .await
                    .map(|r| r.map(|()| Output::Unit(())).map_err(Into::into)),
                Call::SetCredentials($id, $credentials) => $set_credentials,
                Call::List => $api.call_list(&mut *$store, $config).await.map(|r| {
                    r.map(|l| Output::Instances(l.into_iter().map(Into::into).collect()))
                        .map_err(Into::into)
                }),
                Call::Check => $api.call_check(&mut *$store, $config).await.map(|r| {
                    r.map(|l| Output::Checks(l.into_iter().map(Into::into).collect()))
                        .map_err(Into::into)
                }),
            };
            answer.map_err(CallFailure::Run)
        }
    };
}
pub(crate) use call_through_bindings;
