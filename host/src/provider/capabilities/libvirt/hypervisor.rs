//! The handle a plugin holds on one granted hypervisor. Its operations are in `domains`,
//! `volumes`, `ops` (pools, and volumes by their real names) and `import` (base images).

use std::sync::Arc;

use super::endpoint::Endpoint;
use super::error::LibvirtError;
use super::hub::LibvirtHub;
use super::owner::OwnerMark;
use crate::provider::capabilities::grants::{DomainLimits, Publish};

/// A host-side connection handle on one granted hypervisor (the WIT `hypervisor` resource).
/// Calls share the hub's cached connection to it.
#[derive(Debug, Clone)]
pub struct Hypervisor {
    /// The hypervisor's name in the grant.
    pub host: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) hub: Arc<LibvirtHub>,
    pub(crate) scope: Arc<Scope>,
}

/// What one provider instance may see and use on one hypervisor (from its grant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scope {
    /// The mark of its domains.
    pub mark: OwnerMark,
    /// What its volumes' names start with (`volumes::volume_prefix`).
    pub volume_prefix: String,
    pub pools: Vec<String>,
    pub networks: Vec<String>,
    pub bridges: Vec<String>,
    pub user_networking: bool,
    /// Where a user-mode port forward may listen.
    pub publish: Option<Publish>,
    pub limits: DomainLimits,
}

impl Hypervisor {
    /// Refuses a pool the grant does not list (checked before any libvirt call names it).
    pub(crate) fn granted_pool(&self, pool: &str) -> Result<(), LibvirtError> {
        if self.scope.pools.iter().any(|p| p == pool) {
            return Ok(());
        }
        Err(LibvirtError::Denied(format!(
            "pool `{pool}` is not granted on {} (granted: {}); add it to grants.libvirt.hosts[].pools",
            self.host,
            self.scope.pools.join(", ")
        )))
    }
}
