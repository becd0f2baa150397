//! What the host offers a plugin. Each capability is granted per provider instance by the
//! providers config; the plugin cannot ask for more. Grants are checked without I/O
//! (`grants`), then each capability is bound once per provider instance from its valid grant and
//! the host's shared resources, and checks its grant at the one place the host function is
//! entered.

pub mod grants;
pub mod http;
pub mod kube;
pub mod libvirt;
pub mod log;

use std::sync::Arc;

pub use grants::{GrantError, Grants, ValidGrants};

/// What the host shares between provider instances: the hypervisor connections and the
/// operator's Kubernetes client.
#[derive(Clone)]
pub struct HostResources {
    /// The process's hypervisor connections and SSH material (the `libvirt` capability);
    /// `None` without SSH material.
    pub libvirt: Option<Arc<libvirt::LibvirtHub>>,
    /// The operator's Kubernetes client (the `kube` capability); `None` without a cluster.
    pub kube: Option<::kube::Client>,
}

/// Everything a call into one provider instance can use: who it is (for logs) and its bound
/// capabilities. Shared by all calls of that provider instance.
#[derive(Debug)]
pub struct CallContext {
    /// The provider instance's name in the providers config.
    pub provider: String,
    /// The plugin (provider type) serving it.
    pub plugin: String,
    pub http: http::HttpCapability,
    pub libvirt: libvirt::LibvirtCapability,
    pub kube: kube::KubeCapability,
}

impl CallContext {
    /// Binds every capability of a provider instance from its valid grants.
    pub fn bind(
        provider: &str,
        plugin: &str,
        grants: &ValidGrants,
        resources: &HostResources,
    ) -> Result<Self, GrantError> {
        Ok(CallContext {
            provider: provider.to_string(),
            plugin: plugin.to_string(),
            http: http::HttpCapability::bind(grants.http.as_ref())?,
            libvirt: libvirt::LibvirtCapability::bind(
                grants.libvirt.as_ref(),
                resources.libvirt.clone(),
            ),
            kube: kube::KubeCapability::bind(
                provider,
                grants.kube.as_ref(),
                resources.kube.clone(),
            ),
        })
    }

    /// A context that grants nothing (a plugin's `describe` at load).
    pub fn nothing_granted(plugin: &str) -> Self {
        CallContext {
            provider: "(loading)".to_string(),
            plugin: plugin.to_string(),
            http: http::HttpCapability::bind(None).expect("no grant builds no client"),
            libvirt: libvirt::LibvirtCapability::bind(None, None),
            kube: kube::KubeCapability::bind("(loading)", None, None),
        }
    }
}
