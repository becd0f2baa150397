//! Without the `libvirt` cargo feature (the default image): the types the rest of the host names,
//! with nothing behind them. The hub connects nothing; a hypervisor handle cannot exist (its type
//! is uninhabited), because a provider instance granted `libvirt` is refused when it is bound and
//! `LibvirtCapability::open` refuses before making one (`super::check_compiled_in`). So the
//! plugin's libvirt calls compile, and none of them can be reached.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::error::LibvirtError;
use super::material::{DEFAULT_OPERATOR_ID, MaterialSource};
use super::records::{
    DomainInfo, ImageSource, InterfaceAddress, PoolInfo, ProbeReport, VolumeInfo,
};
use crate::capabilities::CallContext;

type Result<T> = std::result::Result<T, LibvirtError>;

/// The process's libvirt connections: none, in a binary without libvirt.
#[derive(Debug)]
pub struct LibvirtHub(());

impl LibvirtHub {
    /// A hub for the default operator id (as with libvirt).
    pub fn new(material: MaterialSource, tunnel_dir: PathBuf) -> Arc<Self> {
        Self::for_operator(DEFAULT_OPERATOR_ID, material, tunnel_dir)
    }

    /// A hub for operator installation `operator_id`: it keeps nothing, as it opens nothing.
    pub fn for_operator(
        _operator_id: &str,
        _material: MaterialSource,
        _tunnel_dir: PathBuf,
    ) -> Arc<Self> {
        Arc::new(LibvirtHub(()))
    }
}

/// A handle on one granted hypervisor: none can be made without libvirt.
#[derive(Debug, Clone)]
pub struct Hypervisor {
    never: Infallible,
}

/// The WIT `hypervisor` resource's methods, as with libvirt; unreachable (no handle exists).
impl Hypervisor {
    pub async fn probe(&self, _timeout: Duration) -> Result<ProbeReport> {
        match self.never {}
    }

    pub async fn define_domain(&self, _xml: String) -> Result<DomainInfo> {
        match self.never {}
    }

    pub async fn lookup_domain(
        &self,
        _name: String,
        _metadata_uri: Option<String>,
    ) -> Result<DomainInfo> {
        match self.never {}
    }

    pub async fn start_domain(&self, _name: String) -> Result<()> {
        match self.never {}
    }

    pub async fn destroy_domain(&self, _name: String) -> Result<()> {
        match self.never {}
    }

    pub async fn undefine_domain(&self, _name: String) -> Result<()> {
        match self.never {}
    }

    pub async fn list_domains(&self, _metadata_uri: Option<String>) -> Result<Vec<DomainInfo>> {
        match self.never {}
    }

    pub async fn domain_addresses(&self, _name: String) -> Result<Vec<InterfaceAddress>> {
        match self.never {}
    }

    pub async fn pool_info(&self, _pool: String) -> Result<PoolInfo> {
        match self.never {}
    }

    pub async fn refresh_pool(&self, _pool: String) -> Result<()> {
        match self.never {}
    }

    pub async fn create_volume(&self, _pool: String, _xml: String) -> Result<VolumeInfo> {
        match self.never {}
    }

    pub async fn lookup_volume(&self, _pool: String, _name: String) -> Result<VolumeInfo> {
        match self.never {}
    }

    pub async fn delete_volume(&self, _pool: String, _name: String) -> Result<()> {
        match self.never {}
    }

    pub async fn upload_volume(&self, _pool: String, _name: String, _data: Vec<u8>) -> Result<()> {
        match self.never {}
    }

    pub async fn import_image(
        &self,
        _context: Arc<CallContext>,
        _pool: String,
        _name: String,
        _source: ImageSource,
    ) -> Result<VolumeInfo> {
        match self.never {}
    }
}
