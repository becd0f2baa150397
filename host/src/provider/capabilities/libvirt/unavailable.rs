//! Without the `libvirt` cargo feature (the default image): the types the rest of the host names,
//! with nothing behind them. The hub connects nothing; a hypervisor handle cannot exist (its type
//! is uninhabited), because a provider instance granted `libvirt` is refused when it is bound and
//! `LibvirtCapability::open` refuses before making one (`super::check_compiled_in`). So the
//! plugin's libvirt calls (`unavailable_calls`) compile, and none of them can be reached.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;

use super::material::{DEFAULT_OPERATOR_ID, MaterialSource};

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
    pub(super) never: Infallible,
}
