//! The handle a plugin holds on one granted hypervisor. Its operations are in `ops` (libvirt
//! calls) and `import` (base images).

use std::sync::Arc;

use super::endpoint::Endpoint;
use super::hub::LibvirtHub;

/// A host-side connection handle on one granted hypervisor (the WIT `hypervisor` resource).
/// Calls share the hub's cached connection to it.
#[derive(Debug, Clone)]
pub struct Hypervisor {
    /// The hypervisor's name in the grant.
    pub host: String,
    pub(crate) endpoint: Endpoint,
    pub(crate) hub: Arc<LibvirtHub>,
}
