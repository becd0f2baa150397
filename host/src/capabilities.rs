//! What the host offers a plugin. Each capability is granted per provider instance by the
//! providers config; the plugin cannot ask for more. A capability checks its grant at the one
//! place the host function is entered.

pub mod http;
pub mod kube;
pub mod libvirt;
pub mod log;

use serde::Deserialize;

/// What one provider instance may reach, from the `grants` of its providers-config entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grants {
    /// Outbound HTTP: the hosts it may call and the credentials the host adds.
    #[serde(default)]
    pub http: Option<http::HttpGrant>,
    /// libvirt on hypervisors over SSH: which ones, and the Secret with the SSH key.
    #[serde(default)]
    pub libvirt: Option<libvirt::LibvirtGrant>,
    /// Kubernetes objects of some kinds in one namespace.
    #[serde(default)]
    pub kube: Option<kube::KubeGrant>,
}

/// Everything a call into one provider instance can use: who it is (for logs) and its grants,
/// already parsed. Shared by all calls of that provider instance.
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
    /// Builds the context from the grants; an invalid grant is reported with its field.
    pub fn new(provider: &str, plugin: &str, grants: &Grants) -> Result<Self, GrantError> {
        Ok(CallContext {
            provider: provider.to_string(),
            plugin: plugin.to_string(),
            http: http::HttpCapability::new(grants.http.as_ref())?,
            libvirt: libvirt::LibvirtCapability::new(grants.libvirt.as_ref())?,
            kube: kube::KubeCapability::new(provider, grants.kube.as_ref())?,
        })
    }

    /// The same context with libvirt calls served by `hub` (the process's connections).
    pub fn with_libvirt_hub(mut self, hub: std::sync::Arc<libvirt::LibvirtHub>) -> Self {
        self.libvirt = self.libvirt.with_hub(hub);
        self
    }

    /// The same context with kube calls made by `client` (the operator's; `None`: no cluster).
    pub fn with_kube_client(mut self, client: Option<::kube::Client>) -> Self {
        self.kube = self.kube.with_client(client);
        self
    }
}

/// A grant that cannot be used, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("grants.http.allow[{index}]: {message}")]
    HttpAllow { index: usize, message: String },
    #[error("grants.http.credentials[{index}]: {message}")]
    HttpCredential { index: usize, message: String },
    #[error("grants.http: {0}")]
    HttpClient(String),
    #[error("grants.libvirt.{0}")]
    Libvirt(String),
    #[error("grants.kube.{0}")]
    Kube(String),
}
