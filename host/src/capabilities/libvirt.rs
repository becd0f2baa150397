//! The `libvirt` capability. Declared in WIT 0.1.0; the SSH-tunnelled implementation lands with
//! the kvm provider, until then every call answers `denied`.

pub mod tunnel;

/// A host-side connection to one hypervisor (the WIT `hypervisor` resource).
#[derive(Debug)]
pub struct Hypervisor {
    /// The hypervisor's name in the provider config.
    pub host: String,
}
