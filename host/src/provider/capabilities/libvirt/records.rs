//! What libvirt calls answer and take, in the WIT's shapes (the host's side of its records).

/// A domain's state, as `virDomainGetState` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    Shutdown,
    Shutoff,
    Crashed,
    Suspended,
}

/// A domain: its identity, state and (when asked for) the plugin's metadata element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub name: String,
    pub uuid: String,
    pub state: DomainState,
    pub metadata: Option<String>,
}

/// One address of a domain's interface, as its guest agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddress {
    pub name: String,
    pub mac: Option<String>,
    pub address: String,
    pub prefix: u8,
}

/// A storage pool and its space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    pub name: String,
    pub active: bool,
    pub path: Option<String>,
    pub capacity: u64,
    pub allocation: u64,
    pub available: u64,
}

/// A storage volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub path: String,
    pub capacity: u64,
    pub allocation: u64,
}

/// How long reaching a hypervisor took, and its libvirt version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    pub ssh_ms: u32,
    pub libvirt_ms: u32,
    pub libvirt_version: String,
}

/// Where a base image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSource {
    pub url: String,
    /// 64 lowercase hex digits.
    pub sha256: String,
    /// `qcow2` or `raw`.
    pub format: String,
}
