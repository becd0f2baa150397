//! What the host offers a plugin. Each capability is granted per provider instance by the
//! providers config; the plugin cannot ask for more. Grants are checked without I/O
//! (`grants`), then each capability is bound once per provider instance from its valid grant and
//! the host's shared resources, and checks its grant at the one place the host function is
//! entered.

mod context;
mod declared;
pub mod grants;
pub mod http;
pub mod kube;
pub mod libvirt;
pub mod log;

pub use context::{CallContext, HostResources};
pub use declared::Declared;
pub use grants::{GrantError, Grants, ValidGrants};
