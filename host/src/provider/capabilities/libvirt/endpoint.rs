//! Where one hypervisor's libvirt is: the key of its cached connection and of its imports.

use super::tunnel::SshTarget;

/// Which hypervisor, which socket on it, with which Secret: the key of a cached connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Endpoint {
    pub target: SshTarget,
    pub socket: String,
    pub secret: String,
}

impl Endpoint {
    pub fn label(&self) -> String {
        format!(
            "{}@{}:{}",
            self.target.user, self.target.address, self.target.port
        )
    }
}
