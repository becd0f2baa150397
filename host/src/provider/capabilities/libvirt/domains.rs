//! What a plugin can do with domains. Ownership is the host's: `define-domain` checks the XML
//! against the allow-list (`allow`) and writes the host's owner mark into it (`owner`), and every
//! other call finds a domain only when it carries this provider instance's mark. Another
//! domain answers `not-found` exactly as a missing one does, so a plugin cannot even learn
//! which names exist.

use tracing::trace;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;
use virt::sys;

use super::allow::{self, Disk, DomainPolicy, VolumeImage};
use super::error::LibvirtError;
use super::hypervisor::Hypervisor;
use super::owner::{HOST_METADATA_URI, OwnerMark};
use super::records::{DomainInfo, DomainState, InterfaceAddress};

/// `VIR_DOMAIN_METADATA_ELEMENT`: the custom element of a namespace.
const METADATA_ELEMENT: i32 = 2;
/// `VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT`: ask the guest agent.
const ADDRESSES_FROM_AGENT: u32 = 1;
/// `VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | SNAPSHOTS_METADATA | NVRAM`: a UEFI domain (NVRAM) or
/// one with saved state cannot be undefined without them.
const UNDEFINE_EVERYTHING: u32 = 1 | 2 | 4;

type Result<T> = std::result::Result<T, LibvirtError>;
type VirtResult<T> = std::result::Result<T, virt::error::Error>;

/// The domain's `<metadata>` element of namespace `uri`, `None` when it has none.
fn metadata(domain: &Domain, uri: &str) -> VirtResult<Option<String>> {
    match domain.get_metadata(METADATA_ELEMENT, Some(uri), 0) {
        Ok(xml) => Ok(Some(xml)),
        Err(e) if matches!(e.code(), ErrorNumber::NoDomainMetadata) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_owned(domain: &Domain, mark: &OwnerMark) -> VirtResult<bool> {
    Ok(mark.matches(metadata(domain, HOST_METADATA_URI)?.as_deref()))
}

/// Domain `name` if it exists and carries `mark`.
fn owned(c: &Connect, name: &str, mark: &OwnerMark) -> VirtResult<Option<Domain>> {
    match Domain::lookup_by_name(c, name) {
        Ok(domain) => Ok(is_owned(&domain, mark)?.then_some(domain)),
        Err(e) if matches!(e.code(), ErrorNumber::NoDomain) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What libvirt has for the volume at `path`, `None` when it has none there; for a qcow2
/// volume with the first bytes of its file, which name what QEMU and libvirt will open.
fn image_at(c: &Connect, path: &str) -> VirtResult<Option<VolumeImage>> {
    let volume = match StorageVol::lookup_by_path(c, path) {
        Ok(volume) => volume,
        Err(e) if matches!(e.code(), ErrorNumber::NoStorageVolume) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut image = allow::volume_image(&volume.get_xml_desc(0)?);
    if image.format.as_deref() == Some("qcow2") {
        let mut head = read_head(c, &volume, allow::QCOW2_FIRST_READ)?;
        let needed = allow::qcow2_head_length(&head);
        if head.len() == allow::QCOW2_FIRST_READ && needed > head.len() {
            head = read_head(c, &volume, needed)?;
        }
        image.head = Some(head);
    }
    Ok(Some(image))
}

/// Up to `length` bytes from the start of `volume`'s file (fewer when it is shorter).
fn read_head(c: &Connect, volume: &StorageVol, length: usize) -> VirtResult<Vec<u8>> {
    let stream = Stream::new(c, 0)?;
    volume.download(&stream, 0, length as u64, 0)?;
    // One byte more than asked for: libvirt sends at most `length`, then the end.
    let mut head = vec![0u8; length + 1];
    let mut got = 0;
    let ended = loop {
        match stream.recv(&mut head[got..]) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(e) => {
                let _ = stream.abort();
                return Err(e);
            }
        }
        if got > length {
            break false;
        }
    };
    if ended {
        stream.finish()?;
    } else {
        let _ = stream.abort();
    }
    head.truncate(got.min(length));
    head.truncate(got);
    Ok(head)
}

fn domain_info(domain: &Domain, metadata_uri: Option<&str>) -> VirtResult<DomainInfo> {
    let (state, _reason) = domain.get_state()?;
    let metadata = match metadata_uri {
        None => None,
        Some(uri) => metadata(domain, uri)?,
    };
    Ok(DomainInfo {
        name: domain.get_name()?,
        uuid: domain.get_uuid_string()?,
        state: match state {
            sys::VIR_DOMAIN_RUNNING => DomainState::Running,
            sys::VIR_DOMAIN_BLOCKED => DomainState::Blocked,
            sys::VIR_DOMAIN_PAUSED => DomainState::Paused,
            sys::VIR_DOMAIN_SHUTDOWN => DomainState::Shutdown,
            sys::VIR_DOMAIN_SHUTOFF => DomainState::Shutoff,
            sys::VIR_DOMAIN_CRASHED => DomainState::Crashed,
            sys::VIR_DOMAIN_PMSUSPENDED => DomainState::Suspended,
            _ => DomainState::NoState,
        },
        metadata,
    })
}

fn addresses(domain: &Domain) -> VirtResult<Vec<InterfaceAddress>> {
    let interfaces = domain.interface_addresses(ADDRESSES_FROM_AGENT, 0)?;
    Ok(interfaces
        .into_iter()
        .flat_map(|i| {
            let name = i.name;
            let mac = Some(i.hwaddr).filter(|m| !m.is_empty());
            i.addrs.into_iter().map(move |a| InterfaceAddress {
                name: name.clone(),
                mac: mac.clone(),
                address: a.addr,
                prefix: a.prefix.min(128) as u8,
            })
        })
        .collect())
}

impl Hypervisor {
    /// What `not-found` says for a domain this provider instance does not own, or that does
    /// not exist: the same words, so they cannot be told apart.
    fn no_domain(&self, name: &str) -> LibvirtError {
        LibvirtError::NotFound(format!(
            "domain {name} is not among this provider instance's domains on {}",
            self.host
        ))
    }

    /// Runs `op` on domain `name` when it is this provider instance's; `not-found` otherwise.
    async fn on_owned<T: Send + 'static>(
        &self,
        rpc: &'static str,
        name: String,
        op: impl FnOnce(&Domain) -> VirtResult<T> + Send + 'static,
    ) -> Result<T> {
        let ids = format!("domain={name}");
        let mark = self.scope.mark.clone();
        let looked_for = name.clone();
        let found = self
            .hub
            .call(&self.endpoint, rpc, &ids, move |c| {
                owned(c, &name, &mark)?.map(|d| op(&d)).transpose()
            })
            .await;
        match found {
            Ok(Some(value)) => Ok(value),
            // Undefined between the lookup and the call: the same answer as never there.
            Ok(None) | Err(LibvirtError::NotFound(_)) => Err(self.no_domain(&looked_for)),
            Err(e) => Err(e),
        }
    }

    /// What this handle's grant lets a domain use: the granted pools' directories (looked up
    /// now; a granted pool the hypervisor lacks holds no disks), networks, bridges, user mode.
    async fn domain_policy(&self) -> Result<DomainPolicy> {
        let pools = self.pool_paths().await?;
        Ok(DomainPolicy {
            pools,
            networks: self.scope.networks.clone(),
            bridges: self.scope.bridges.clone(),
            user_networking: self.scope.user_networking,
            publish: self.scope.publish,
            limits: self.scope.limits,
            volume_prefix: self.scope.volume_prefix.clone(),
        })
    }

    pub async fn define_domain(&self, xml: String) -> Result<DomainInfo> {
        trace!(hypervisor = %self.host, xml = %xml, "define-domain");
        let policy = self.domain_policy().await?;
        let checked = allow::check_domain(&xml, &policy, &self.scope.mark)
            .map_err(|m| LibvirtError::Denied(format!("define-domain: {m}")))?;
        self.check_images("define-domain", checked.disks.clone(), policy)
            .await?;
        let name = checked.name.clone();
        let mark = self.scope.mark.clone();
        let defined = self
            .hub
            .call(
                &self.endpoint,
                "domain-define-xml",
                &format!("domain={name}"),
                move |c| {
                    // A name another owner has is refused before libvirt sees it (libvirt
                    // would refuse too, as the XML has no UUID, but name the other's UUID).
                    match Domain::lookup_by_name(c, &checked.name) {
                        Ok(existing) if !is_owned(&existing, &mark)? => return Ok(None),
                        Ok(_) => {}
                        Err(e) if matches!(e.code(), ErrorNumber::NoDomain) => {}
                        Err(e) => return Err(e),
                    }
                    let domain = Domain::define_xml(c, &checked.xml)?;
                    domain_info(&domain, None).map(Some)
                },
            )
            .await?;
        defined.ok_or_else(|| {
            LibvirtError::Denied(format!(
                "define-domain: the name {name} is taken on {} by a domain that is not this provider instance's; choose another name",
                self.host
            ))
        })
    }

    /// The disks' images as libvirt reads them (after refreshing their pools, so a header
    /// written by upload-volume is seen): formats as given, backing files only of own volumes.
    async fn check_images(&self, call: &str, disks: Vec<Disk>, policy: DomainPolicy) -> Result<()> {
        if disks.is_empty() {
            return Ok(());
        }
        let mut pools: Vec<String> = disks.iter().map(|d| d.pool.clone()).collect();
        pools.sort();
        pools.dedup();
        let problem = self
            .hub
            .call(&self.endpoint, "storage-vol-get-xml-desc", "", move |c| {
                for pool in &pools {
                    StoragePool::lookup_by_name(c, pool)?.refresh(0)?;
                }
                for disk in &disks {
                    let problem =
                        allow::chain_problem(disk, &policy.pools, &policy.volume_prefix, |path| {
                            image_at(c, path)
                        })?;
                    if problem.is_some() {
                        return Ok(problem);
                    }
                }
                Ok(None)
            })
            .await?;
        match problem {
            Some(why) => Err(LibvirtError::Denied(format!("{call}: {why}"))),
            None => Ok(()),
        }
    }

    pub async fn lookup_domain(
        &self,
        name: String,
        metadata_uri: Option<String>,
    ) -> Result<DomainInfo> {
        let info = self
            .on_owned("domain-lookup-by-name", name, move |d| {
                domain_info(d, metadata_uri.as_deref())
            })
            .await?;
        trace!(hypervisor = %self.host, domain = %info.name, metadata = ?info.metadata, "lookup-domain");
        Ok(info)
    }

    /// Starts the domain once its disks' images pass again: libvirt reads the backing chain
    /// from the images' headers when QEMU starts, and a plugin can rewrite a header
    /// (upload-volume) after the definition.
    pub async fn start_domain(&self, name: String) -> Result<()> {
        let policy = self.domain_policy().await?;
        let xml = self
            .on_owned("domain-get-xml-desc", name.clone(), |d| d.get_xml_desc(0))
            .await?;
        let disks = allow::disks_of(&xml, &policy)
            .map_err(|m| LibvirtError::Denied(format!("start-domain: {m}")))?;
        self.check_images("start-domain", disks, policy).await?;
        self.on_owned("domain-create", name, |d| d.create().map(drop))
            .await
    }

    pub async fn destroy_domain(&self, name: String) -> Result<()> {
        self.on_owned("domain-destroy", name, Domain::destroy).await
    }

    pub async fn undefine_domain(&self, name: String) -> Result<()> {
        self.on_owned("domain-undefine", name, |d| {
            d.undefine_flags(UNDEFINE_EVERYTHING)
        })
        .await
    }

    /// This provider instance's domains; the others are left out.
    pub async fn list_domains(&self, metadata_uri: Option<String>) -> Result<Vec<DomainInfo>> {
        let mark = self.scope.mark.clone();
        self.hub
            .call(&self.endpoint, "connect-list-all-domains", "", move |c| {
                let mut infos = Vec::new();
                for domain in c.list_all_domains(0)? {
                    let info = is_owned(&domain, &mark).and_then(|owned| {
                        owned
                            .then(|| domain_info(&domain, metadata_uri.as_deref()))
                            .transpose()
                    });
                    match info {
                        Ok(Some(info)) => infos.push(info),
                        Ok(None) => {}
                        // Undefined between the listing and the lookup: not there any more.
                        Err(e) if matches!(e.code(), ErrorNumber::NoDomain) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(infos)
            })
            .await
    }

    pub async fn domain_addresses(&self, name: String) -> Result<Vec<InterfaceAddress>> {
        self.on_owned("domain-interface-addresses", name, addresses)
            .await
    }
}
