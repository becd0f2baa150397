//! The hypervisor handle's calls without the `libvirt` feature: the same signatures as with it
//! (`domains`, `volumes`, `ops`, `import`), none reachable, as no handle can exist
//! (`unavailable`).

use std::sync::Arc;
use std::time::Duration;

use super::error::LibvirtError;
use super::records::{
    DomainInfo, ImageSource, InterfaceAddress, PoolInfo, ProbeReport, VolumeInfo,
};
use super::unavailable::Hypervisor;
use crate::provider::capabilities::CallContext;

type Result<T> = std::result::Result<T, LibvirtError>;

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
