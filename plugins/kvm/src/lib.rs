//! The `kvm` provider: a proxy is a VM on a libvirt hypervisor the host reaches over SSH.
//!
//! Per VM, in the host's storage pool: the base image (`base-<key>-<12 hex of its sha256>.<format>`, downloaded and
//! verified by the host on first use, shared), a qcow2 overlay `<domain>-root.qcow2` over it and
//! a NoCloud seed ISO `<domain>-seed.iso` built here. The domain carries the owner identity in its
//! `<metadata>` (namespace [`names::METADATA_URI`]), which `get` and `list` read back. Provider ids
//! are `<host>/<domain>`; the domain is named `spec.name`, so create is idempotent.
//!
//! Everything that decides something is a plain function in a module (tested natively); this file
//! only sequences the libvirt calls.

pub mod config;
pub mod names;
pub mod outcome;
pub mod ports;
pub mod seed;
pub mod spec;
pub mod xml;

#[cfg(test)]
mod testing;

use proxy_operator_sdk::capabilities::libvirt::{DomainInfo, Hypervisor, ImageSource, VolumeInfo};
use proxy_operator_sdk::capabilities::{self, Level};
use proxy_operator_sdk::squid;
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, Owner, PluginInfo, Provider,
    ProviderError, export_provider, transient,
};

use crate::config::{Config, HostConfig};
use crate::names::{METADATA_URI, ProviderId};
use crate::outcome::{is_not_found, libvirt_error, open_error};
use crate::spec::{BootVolume, ImageChoice, Size};
use crate::xml::{Boot, DomainSpec, OwnerMeta};

/// The provider type in the providers config.
pub const PROVIDER_TYPE: &str = "kvm";

/// How long `check` gives one hypervisor to answer a probe.
pub const PROBE_TIMEOUT_MS: u32 = 5000;

/// The `kvm` provider.
pub struct KvmProvider;

/// An open hypervisor and its config entry.
struct Host<'a> {
    config: &'a HostConfig,
    hv: Hypervisor,
}

impl<'a> Host<'a> {
    fn open(config: &'a HostConfig) -> Result<Self, ProviderError> {
        let hv = Hypervisor::open(&config.name).map_err(|e| open_error(&config.name, e))?;
        Ok(Host { config, hv })
    }

    /// `hv1: <call> <name>`, the context of an error message.
    fn context(&self, call: &str, name: &str) -> String {
        format!("{}: {call} {name}", self.config.name)
    }

    fn pool(&self) -> &str {
        &self.config.pool
    }

    /// The volume `name` in the pool, `None` when it does not exist.
    fn find_volume(&self, name: &str) -> Result<Option<VolumeInfo>, ProviderError> {
        match self.hv.lookup_volume(self.pool(), name) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(libvirt_error(&self.context("lookup-volume", name), e)),
        }
    }

    /// Deletes volume `name`; already gone is fine.
    fn delete_volume(&self, name: &str) -> Result<(), ProviderError> {
        match self.hv.delete_volume(self.pool(), name) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(libvirt_error(&self.context("delete-volume", name), e)),
        }
    }

    fn create_volume(&self, name: &str, xml: &str) -> Result<VolumeInfo, ProviderError> {
        self.hv
            .create_volume(self.pool(), xml)
            .map_err(|e| libvirt_error(&self.context("create-volume", name), e))
    }

    /// The base image volume, imported by the host on first use in this pool.
    fn ensure_base(&self, image: &ImageChoice) -> Result<VolumeInfo, ProviderError> {
        if let Some(volume) = self.find_volume(&image.base_volume)? {
            return Ok(volume);
        }
        log(
            Level::Info,
            "importing base image",
            &[("host", &self.config.name), ("volume", &image.base_volume)],
        );
        let source = ImageSource {
            url: image.url.clone(),
            sha256: image.sha256.clone(),
            format: image.format.as_str().to_string(),
        };
        self.hv
            .import_image(self.pool(), &image.base_volume, &source)
            .map_err(|e| libvirt_error(&self.context("import-image", &image.base_volume), e))
    }

    /// A direct-kernel-boot file, imported like the base image on first use.
    fn ensure_boot_file(&self, file: &BootVolume) -> Result<VolumeInfo, ProviderError> {
        if let Some(volume) = self.find_volume(&file.volume)? {
            return Ok(volume);
        }
        let source = ImageSource {
            url: file.url.clone(),
            sha256: file.sha256.clone(),
            format: "raw".into(),
        };
        self.hv
            .import_image(self.pool(), &file.volume, &source)
            .map_err(|e| libvirt_error(&self.context("import-image", &file.volume), e))
    }

    /// The kernel and initrd paths of a direct kernel boot (imported on first use).
    fn ensure_kernel_boot(
        &self,
        image: &ImageChoice,
    ) -> Result<Option<(String, Option<String>)>, ProviderError> {
        let Some(boot) = &image.kernel_boot else {
            return Ok(None);
        };
        let kernel = self.ensure_boot_file(&boot.kernel)?.path;
        let initrd = match &boot.initrd {
            Some(initrd) => Some(self.ensure_boot_file(initrd)?.path),
            None => None,
        };
        Ok(Some((kernel, initrd)))
    }

    /// The published ports of the host's VMs (from their metadata), and whether each runs.
    fn published_ports(&self) -> Result<Vec<(String, u16, bool)>, ProviderError> {
        let domains = self
            .hv
            .list_domains(Some(METADATA_URI))
            .map_err(|e| libvirt_error(&format!("{}: list-domains", self.config.name), e))?;
        Ok(domains
            .into_iter()
            .filter_map(|d| {
                let port = d
                    .metadata
                    .as_deref()
                    .and_then(xml::parse_owner)?
                    .publish_port?;
                Some((d.name, port, outcome::is_up(d.state)))
            })
            .collect())
    }

    /// A free port of the host's user-mode network for a new VM; `None` on other networks.
    fn allocate_port(&self, owner_uid: &str) -> Result<Option<u16>, ProviderError> {
        let Some((_, range)) = self.config.user_network() else {
            return Ok(None);
        };
        let used = self
            .published_ports()?
            .into_iter()
            .map(|(_, p, _)| p)
            .collect();
        match ports::choose(range, &used, owner_uid) {
            Some(port) => Ok(Some(port)),
            None => Err(ProviderError::Quota(ports::exhausted_message(
                &self.config.name,
                range,
            ))),
        }
    }

    /// After defining `domain` with `port`: gives the port up (undefines the domain, a transient
    /// error retries the create) when another VM claims it too, see [`ports::must_yield`].
    fn settle_port(&self, domain: &str, port: u16) -> Result<(), ProviderError> {
        let published = self.published_ports()?;
        let claims: Vec<ports::Claim<'_>> = published
            .iter()
            .map(|(name, port, running)| ports::Claim {
                domain: name,
                port: *port,
                running: *running,
            })
            .collect();
        if !ports::must_yield(domain, port, &claims) {
            return Ok(());
        }
        match self.hv.undefine_domain(domain) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(libvirt_error(&self.context("undefine-domain", domain), e)),
        }
        Err(transient(
            format!(
                "{}: port {port} was chosen by another VM at the same time; choosing again",
                self.config.name
            ),
            Some(1000),
        ))
    }

    /// The VM's qcow2 overlay over `base`; reused when it exists.
    fn ensure_overlay(
        &self,
        domain: &str,
        base: &VolumeInfo,
        image: &ImageChoice,
        size: &Size,
    ) -> Result<VolumeInfo, ProviderError> {
        let name = names::root_volume(domain);
        if let Some(volume) = self.find_volume(&name)? {
            return Ok(volume);
        }
        // Never smaller than the image itself, or the guest would see a truncated disk.
        let capacity = (size.disk_gib << 30).max(base.capacity);
        let xml = xml::overlay_volume_xml(&name, capacity, &base.path, image.format);
        self.create_volume(&name, &xml)
    }

    /// The VM's seed ISO, (re)written with `iso`.
    fn ensure_seed(&self, domain: &str, iso: &[u8]) -> Result<VolumeInfo, ProviderError> {
        let name = names::seed_volume(domain);
        let length = iso.len() as u64;
        let volume = match self.find_volume(&name)? {
            Some(volume) if volume.capacity == length => volume,
            Some(_) => {
                // Left by an earlier attempt with other cloud-init: make it the right size.
                self.delete_volume(&name)?;
                self.create_volume(&name, &xml::raw_volume_xml(&name, length))?
            }
            None => self.create_volume(&name, &xml::raw_volume_xml(&name, length))?,
        };
        self.hv
            .upload_volume(self.pool(), &name, iso)
            .map_err(|e| libvirt_error(&self.context("upload-volume", &name), e))?;
        Ok(volume)
    }

    fn start(&self, domain: &str) -> Result<(), ProviderError> {
        self.hv
            .start_domain(domain)
            .map_err(|e| libvirt_error(&self.context("start-domain", domain), e))
    }

    /// The instance for a domain. With `with_address`, a running domain's addresses are asked
    /// for; failing to get them (guest agent not up yet) only means no address yet.
    fn instance(&self, info: DomainInfo, with_address: bool) -> Instance {
        let meta = info.metadata.as_deref().and_then(xml::parse_owner);
        let up = outcome::is_up(info.state);
        let guest_address = if with_address && up {
            self.hv
                .domain_addresses(&info.name)
                .ok()
                .and_then(|a| outcome::first_usable_ipv4(&a))
        } else {
            None
        };
        // `list` does not ask for addresses (one round trip per VM); it reports a running VM as
        // running.
        let (state, mut message) =
            outcome::instance_state(info.state, guest_address.is_some() || !with_address);
        if with_address && up && guest_address.is_none() {
            let age = meta
                .as_ref()
                .and_then(|m| m.created_at)
                .zip(now_unix())
                .map(|(c, n)| n - c);
            message = Some(outcome::waiting_for_address(&info.name, age));
        }
        let squid_port = meta
            .as_ref()
            .and_then(|m| m.port)
            .unwrap_or(spec::DEFAULT_PORT);
        // On a user-mode network the guest's own address is reachable only by the hypervisor:
        // the proxy is at the published port, once the guest is up.
        let published = self
            .config
            .user_network()
            .zip(meta.as_ref().and_then(|m| m.publish_port));
        let (address, port) = match published {
            Some(((publish_address, _), publish_port)) => (
                guest_address.map(|_| publish_address.to_string()),
                publish_port,
            ),
            None => (guest_address, squid_port),
        };
        Instance {
            provider_id: names::provider_id(&self.config.name, &info.name),
            state,
            address,
            port,
            zone: self.config.zone.clone(),
            created_at: meta.as_ref().and_then(|m| m.created_at),
            owner: meta.map(|m| Owner {
                namespace: m.namespace,
                name: m.name,
                uid: m.uid,
                operator_id: m.operator_id,
            }),
            message,
            name: info.name,
        }
    }
}

fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    capabilities::log(level, message, fields);
}

/// Seconds since the Unix epoch, when the clock is usable.
fn now_unix() -> Option<i64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs() as i64)
        .filter(|s| *s > 0)
}

fn configured_host<'a>(config: &'a Config, name: &str) -> Option<&'a HostConfig> {
    config.hosts.iter().find(|h| h.name == name)
}

/// Everything `create` decides before touching a hypervisor.
#[derive(Debug)]
struct Plan<'a> {
    host: &'a HostConfig,
    image: ImageChoice,
    size: Size,
    port: u16,
    seed_files: Vec<(&'static str, Vec<u8>)>,
}

fn plan<'a>(config: &'a Config, spec: &InstanceSpec) -> Result<Plan<'a>, ProviderError> {
    names::check_domain_name(&spec.name)?;
    let host = spec::choose_host(config, spec.zone.as_deref(), &spec.owner.uid)?;
    let image = spec::resolve_image(config, spec.image.as_deref(), &spec.options)?;
    let size = spec::parse_machine_type(spec.machine_type.as_deref(), &config.defaults)?;
    let port = spec::port(spec.port);
    let squid_setup = if spec::managed_squid(config, &spec.options)? {
        Some(squid::vm_setup(
            &config.squid(),
            spec,
            port,
            &config.dns_nameservers,
        )?)
    } else {
        None
    };
    let vendor_data = seed::vendor_data(
        config.install_guest_agent || spec.install_guest_agent,
        squid_setup.as_deref(),
        config.vendor_data.as_deref(),
        &spec.vendor_data,
    );
    Ok(Plan {
        host,
        image,
        size,
        port,
        seed_files: seed::seed_files(&spec.name, &spec.user_data, vendor_data),
    })
}

/// `create` when the domain already exists: it must be this Proxy's; a shut-off one is started.
fn existing(host: &Host<'_>, info: DomainInfo, owner: &Owner) -> Result<Instance, ProviderError> {
    let meta = info.metadata.as_deref().and_then(xml::parse_owner);
    if meta.as_ref().map(|m| m.uid.as_str()) != Some(owner.uid.as_str()) {
        return Err(ProviderError::Permanent(format!(
            "a domain named {} already exists on host {} and was not made for this Proxy (uid {}); remove or rename it",
            info.name, host.config.name, owner.uid
        )));
    }
    if info.state == capabilities::libvirt::DomainState::Shutoff {
        log(
            Level::Info,
            "starting existing domain",
            &[("host", &host.config.name), ("domain", &info.name)],
        );
        host.start(&info.name)?;
        let mut instance = host.instance(info, false);
        instance.state = InstanceState::Provisioning;
        instance.message = Some("started; waiting for an address".into());
        return Ok(instance);
    }
    Ok(host.instance(info, true))
}

/// This Proxy's domain `name` on a host `create` did not choose, if it is there. The host shows
/// only this provider instance's domains; one that was not made for this Proxy is not the one
/// asked for, and is left for the chosen host's own check.
fn elsewhere(
    config: &HostConfig,
    name: &str,
    owner: &Owner,
) -> Result<Option<Instance>, ProviderError> {
    let host = Host::open(config)?;
    let info = match host.hv.lookup_domain(name, Some(METADATA_URI)) {
        Ok(info) => info,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(libvirt_error(&host.context("lookup-domain", name), e)),
    };
    let uid = info
        .metadata
        .as_deref()
        .and_then(xml::parse_owner)
        .map(|m| m.uid);
    if uid.as_deref() != Some(owner.uid.as_str()) {
        return Ok(None);
    }
    log(
        Level::Info,
        "found the domain on another host",
        &[("host", &config.name), ("domain", name)],
    );
    existing(&host, info, owner).map(Some)
}

impl Provider for KvmProvider {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: PROVIDER_TYPE.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "VMs on libvirt hypervisors over SSH: base image + qcow2 overlay, NoCloud seed, guest agent".into(),
            capabilities: vec![Capability::Log, Capability::Libvirt],
            config_schema: config::SCHEMA.to_string(),
        }
    }

    fn validate(config: &Config) -> Result<(), ProviderError> {
        config::validate(config)
    }

    fn create(config: Config, spec: InstanceSpec) -> Result<Instance, ProviderError> {
        let plan = plan(&config, &spec)?;
        let host = Host::open(plan.host)?;
        let domain = spec.name.as_str();
        match host.hv.lookup_domain(domain, Some(METADATA_URI)) {
            Ok(info) => return existing(&host, info, &spec.owner),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(libvirt_error(&host.context("lookup-domain", domain), e)),
        }
        // Then on every other host: a try that was cut off (a restart, a timeout) may have made
        // the domain where the config pointed then (see `spec::search_order`).
        for other in spec::search_order(&config, plan.host).into_iter().skip(1) {
            if let Some(found) = elsewhere(other, domain, &spec.owner)
                .map_err(|e| outcome::search_failed(&other.name, domain, e))?
            {
                return Ok(found);
            }
        }
        log(
            Level::Info,
            "creating domain",
            &[("host", &plan.host.name), ("domain", domain)],
        );
        // First, so that a full port range leaves nothing behind.
        let publish_port = host.allocate_port(&spec.owner.uid)?;
        let base = host.ensure_base(&plan.image)?;
        let kernel_boot = host.ensure_kernel_boot(&plan.image)?;
        let root = host.ensure_overlay(domain, &base, &plan.image, &plan.size)?;
        let iso = seed::build_iso(&plan.seed_files)?;
        let seed = host.ensure_seed(domain, &iso)?;
        let owner = OwnerMeta {
            namespace: spec.owner.namespace.clone(),
            name: spec.owner.name.clone(),
            uid: spec.owner.uid.clone(),
            operator_id: spec.owner.operator_id.clone(),
            port: Some(plan.port),
            publish_port,
            created_at: now_unix(),
        };
        let boot = match (&kernel_boot, &plan.image.kernel_boot) {
            (Some((kernel, initrd)), Some(choice)) => Boot::Kernel {
                kernel_path: kernel,
                initrd_path: initrd.as_deref(),
                cmdline: &choice.cmdline,
            },
            _ => Boot::Disk,
        };
        let xml = xml::domain_xml(&DomainSpec {
            domain_type: config.domain_type,
            name: domain,
            vcpus: plan.size.vcpus,
            memory_mib: plan.size.memory_mib,
            firmware: plan.image.firmware,
            root_path: &root.path,
            seed_path: &seed.path,
            nic: plan.host.nic(publish_port),
            boot,
            guest_port: plan.port,
            owner: &owner,
        });
        host.hv
            .define_domain(&xml)
            .map_err(|e| libvirt_error(&host.context("define-domain", domain), e))?;
        if let Some(port) = publish_port {
            host.settle_port(domain, port)?;
        }
        host.start(domain)
            .map_err(|e| outcome::start_error(&plan.host.name, e))?;
        Ok(Instance {
            provider_id: names::provider_id(&plan.host.name, domain),
            name: domain.to_string(),
            state: InstanceState::Provisioning,
            address: None,
            port: publish_port.unwrap_or(plan.port),
            zone: plan.host.zone.clone(),
            created_at: owner.created_at,
            owner: Some(spec.owner),
            message: Some("started; waiting for an address".into()),
        })
    }

    fn get(config: Config, provider_id: String) -> Result<Instance, ProviderError> {
        let id = ProviderId::parse(&provider_id)?;
        let host_config = configured_host(&config, id.host).ok_or_else(|| {
            ProviderError::Permanent(format!(
                "host {} is not in config.hosts (provider id {provider_id}); add it back or delete the Proxy",
                id.host
            ))
        })?;
        let host = Host::open(host_config)?;
        let info = host
            .hv
            .lookup_domain(id.domain, Some(METADATA_URI))
            .map_err(|e| libvirt_error(&host.context("lookup-domain", id.domain), e))?;
        Ok(host.instance(info, true))
    }

    fn delete(config: Config, provider_id: String) -> Result<(), ProviderError> {
        let Ok(id) = ProviderId::parse(&provider_id) else {
            // Not an id this provider makes: nothing of ours can be behind it.
            log(
                Level::Warn,
                "delete: provider id is not <host>/<domain>; nothing to delete",
                &[("providerId", &provider_id)],
            );
            return Ok(());
        };
        let Some(host_config) = configured_host(&config, id.host) else {
            log(
                Level::Info,
                "delete: host is not in config.hosts; nothing to delete",
                &[("host", id.host), ("domain", id.domain)],
            );
            return Ok(());
        };
        let host = Host::open(host_config)?;
        // Only a proxy VM this provider made (its owner identity in <metadata>) is deleted. The
        // host already answers not-found for other owners' domains; this also spares a domain
        // of the same provider instance that was not made for a Proxy. Like an id this provider
        // never makes, it is "nothing to delete", so the Proxy's deletion still finishes.
        match host.hv.lookup_domain(id.domain, Some(METADATA_URI)) {
            Ok(info)
                if info
                    .metadata
                    .as_deref()
                    .and_then(xml::parse_owner)
                    .is_none() =>
            {
                log(
                    Level::Warn,
                    "delete: the domain carries no owner identity of the kvm provider; not deleting it",
                    &[("host", id.host), ("domain", id.domain)],
                );
                return Ok(());
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(libvirt_error(&host.context("lookup-domain", id.domain), e)),
        }
        match host.hv.destroy_domain(id.domain) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) || outcome::is_not_running(&e) => {}
            Err(e) => return Err(libvirt_error(&host.context("destroy-domain", id.domain), e)),
        }
        match host.hv.undefine_domain(id.domain) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                return Err(libvirt_error(
                    &host.context("undefine-domain", id.domain),
                    e,
                ));
            }
        }
        host.delete_volume(&names::root_volume(id.domain))?;
        host.delete_volume(&names::seed_volume(id.domain))?;
        log(
            Level::Info,
            "deleted domain",
            &[("host", id.host), ("domain", id.domain)],
        );
        Ok(())
    }

    fn list(config: Config) -> Result<Vec<Instance>, ProviderError> {
        // A host that cannot be listed is skipped (logged): garbage collection only deletes what
        // is listed, so a partial list is safe. When no host answers, the first error is returned.
        let mut instances = Vec::new();
        let mut first_error = None;
        let mut answered = false;
        for host_config in &config.hosts {
            let listed = Host::open(host_config).and_then(|host| {
                let domains = host.hv.list_domains(Some(METADATA_URI)).map_err(|e| {
                    libvirt_error(&format!("{}: list-domains", host_config.name), e)
                })?;
                Ok(domains
                    .into_iter()
                    .map(|info| host.instance(info, false))
                    .filter(|i| i.owner.is_some())
                    .collect::<Vec<_>>())
            });
            match listed {
                Ok(found) => {
                    answered = true;
                    instances.extend(found);
                }
                Err(e) => {
                    log(
                        Level::Warn,
                        "list: skipping host",
                        &[("host", &host_config.name), ("error", &format!("{e:?}"))],
                    );
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if !answered => Err(e),
            _ => Ok(instances),
        }
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        config::validate(&config)?;
        Ok(config.hosts.iter().map(check_host).collect())
    }
}

/// One hypervisor's verdict: SSH + libvirt answer within [`PROBE_TIMEOUT_MS`], the pool exists
/// and is active.
fn check_host(host: &HostConfig) -> CheckTarget {
    let target = format!("{PROVIDER_TYPE}/{}", host.name);
    let fail = |reason: &str, message: String, latency_ms: u32| CheckTarget {
        target: target.clone(),
        ok: false,
        reason: reason.to_string(),
        message,
        latency_ms,
    };
    let hv = match Hypervisor::open(&host.name) {
        Ok(hv) => hv,
        Err(e) => {
            return fail(
                outcome::check_reason(&e),
                outcome::check_message(&host.name, &e),
                0,
            );
        }
    };
    let report = match hv.probe(PROBE_TIMEOUT_MS) {
        Ok(report) => report,
        Err(e) => {
            return fail(
                outcome::check_reason(&e),
                outcome::check_message(&host.name, &e),
                0,
            );
        }
    };
    let latency_ms = report.ssh_ms.saturating_add(report.libvirt_ms);
    match hv.pool_info(&host.pool) {
        Ok(pool) if !pool.active => fail(
            "PoolInactive",
            format!(
                "storage pool {} on {} is not active; start it (virsh pool-start {0}; virsh pool-autostart {0})",
                host.pool, host.name
            ),
            latency_ms,
        ),
        Ok(pool) => CheckTarget {
            target: target.clone(),
            ok: true,
            reason: "Ok".into(),
            message: format!(
                "libvirt {}; pool {}: {} free of {}",
                report.libvirt_version,
                host.pool,
                outcome::human_bytes(pool.available),
                outcome::human_bytes(pool.capacity)
            ),
            latency_ms,
        },
        Err(e) if is_not_found(&e) => fail(
            "PoolNotFound",
            format!(
                "storage pool {} does not exist on {}; create it or fix the host's pool in the provider config",
                host.pool, host.name
            ),
            latency_ms,
        ),
        Err(e) => fail(
            outcome::check_reason(&e),
            outcome::check_message(&host.name, &e),
            latency_ms,
        ),
    }
}

export_provider!(KvmProvider);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{owner, permanent, sample};

    fn instance_spec() -> InstanceSpec {
        InstanceSpec {
            name: "px-0123456789abcdef".into(),
            owner: owner(),
            zone: Some("home-b".into()),
            image: None,
            machine_type: Some("2x2048".into()),
            user_data: b"#cloud-config\npackages: [squid]\n".to_vec(),
            vendor_data: Vec::new(),
            install_guest_agent: false,
            port: 0,
            labels: Vec::new(),
            options: "{}".into(),
            credentials: None,
        }
    }

    #[test]
    fn plan_resolves_everything_before_any_call() {
        let mut config = sample();
        config.install_guest_agent = false;
        config.managed_squid = false;
        let spec = instance_spec();
        let plan = plan(&config, &spec).unwrap();
        assert_eq!(plan.host.name, "hv2");
        assert_eq!(plan.image.base_volume, "base-debian-12-0123456789ab.qcow2");
        assert_eq!(
            plan.size,
            Size {
                vcpus: 2,
                memory_mib: 2048,
                disk_gib: 10
            }
        );
        assert_eq!(plan.port, 3128);
        let names: Vec<&str> = plan.seed_files.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["meta-data", "user-data"],
            "no vendor-data when nothing asks for it"
        );
        assert_eq!(plan.seed_files[1].1, spec.user_data);
    }

    #[test]
    fn guest_agent_is_on_when_config_or_spec_says_so() {
        let mut config = sample();
        config.install_guest_agent = false;
        config.managed_squid = false;
        let mut spec = instance_spec();
        spec.install_guest_agent = true;
        let plan_spec = plan(&config, &spec).unwrap();
        assert_eq!(plan_spec.seed_files[2].0, "vendor-data");
        assert_eq!(
            plan_spec.seed_files[2].1,
            seed::GUEST_AGENT_SCRIPT.as_bytes()
        );

        config.install_guest_agent = true;
        spec.install_guest_agent = false;
        spec.vendor_data = b"#cloud-config\ntimezone: UTC\n".to_vec();
        let plan_config = plan(&config, &spec).unwrap();
        let vendor = String::from_utf8(plan_config.seed_files[2].1.clone()).unwrap();
        assert!(
            vendor.starts_with("Content-Type: multipart/mixed;"),
            "{vendor}"
        );
        assert!(vendor.contains("#cloud-config\ntimezone: UTC\n"));
        assert!(vendor.contains("qemu-guest-agent"));
    }

    #[test]
    fn the_managed_squid_rides_in_the_vendor_data_unless_the_proxy_opts_out() {
        let mut config = sample();
        config.install_guest_agent = false;
        config.allow_from = vec!["192.0.2.1/32".into()];
        config.connect_ports = vec![443, 8443];
        let mut spec = instance_spec();
        spec.port = 3129;
        let plan_managed = plan(&config, &spec).unwrap();
        assert_eq!(plan_managed.seed_files[2].0, "vendor-data");
        let vendor = String::from_utf8(plan_managed.seed_files[2].1.clone()).unwrap();
        assert!(
            vendor.starts_with("#!/bin/sh\n# proxy-operator: the managed squid"),
            "{vendor}"
        );
        for line in [
            "http_port 3129",
            "acl crawlers src 192.0.2.1/32",
            "acl SSL_ports port 443 8443",
            "visible_hostname px-0123456789abcdef",
        ] {
            assert!(
                vendor.lines().any(|l| l == line),
                "{line:?} missing in\n{vendor}"
            );
        }
        // The user's cloud-init is untouched.
        assert_eq!(plan_managed.seed_files[1].1, spec.user_data);

        spec.options = r#"{"managedSquid": false}"#.into();
        let plan_own = plan(&config, &spec).unwrap();
        assert_eq!(plan_own.seed_files.len(), 2, "no vendor-data left");
    }

    #[test]
    fn plan_refuses_bad_specs_with_the_field() {
        let config = sample();
        let mut spec = instance_spec();
        spec.name = "../etc".into();
        assert!(permanent(plan(&config, &spec)).starts_with("spec.name:"));
        let mut spec = instance_spec();
        spec.machine_type = Some("large".into());
        assert!(permanent(plan(&config, &spec)).starts_with("spec.placement.machineType:"));
        let mut spec = instance_spec();
        spec.image = Some("https://example.com/x.img".into());
        assert!(permanent(plan(&config, &spec)).starts_with("spec.placement.image:"));
        let mut spec = instance_spec();
        spec.zone = Some("nowhere".into());
        assert!(permanent(plan(&config, &spec)).starts_with("spec.placement.zone:"));
    }

    #[test]
    fn describe_names_the_type_and_capabilities() {
        let info = KvmProvider::info();
        assert_eq!(info.name, "kvm");
        assert_eq!(info.capabilities.len(), 2);
        assert!(matches!(info.capabilities[0], Capability::Log));
        assert!(matches!(info.capabilities[1], Capability::Libvirt));
        let schema: serde_json::Value = serde_json::from_str(&info.config_schema).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["hosts"]));
    }
}
