//! What every call into one provider instance can use: its bound capabilities, and the host's
//! shared resources they are bound from.

use std::sync::Arc;

use super::Declared;
use super::grants::{GrantError, ValidGrants};
use super::{http, kube, libvirt, log};

/// What the host shares between provider instances: the hypervisor connections and the
/// operator's Kubernetes client.
#[derive(Clone)]
pub struct HostResources {
    /// The process's hypervisor connections and SSH material (the `libvirt` capability);
    /// `None` without SSH material.
    pub libvirt: Option<Arc<libvirt::LibvirtHub>>,
    /// The operator's Kubernetes client (the `kube` capability); `None` without a cluster.
    pub kube: Option<::kube::Client>,
    /// The operator's own objects, which the `kube` capability never lets a plugin touch.
    pub operator_objects: Arc<kube::OperatorObjects>,
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
    /// Where the plugin's log lines go, with their rate budget (shared by the instance's calls).
    pub log: log::PluginLog,
}

impl CallContext {
    /// Binds every capability of a provider instance from its valid grants; a capability the
    /// plugin did not declare refuses its calls.
    pub fn bind(
        provider: &str,
        plugin: &str,
        declared: Declared,
        grants: &ValidGrants,
        resources: &HostResources,
    ) -> Result<Self, GrantError> {
        if let (Some(grant), Some(home)) = (&grants.kube, resources.operator_objects.home())
            && grant.namespace == home
        {
            return Err(GrantError::Kube(format!(
                "namespace: `{home}` is the operator's own namespace; a plugin granted it could make Pods that join the operator's Services (its discovery API) and reach its objects. Grant a namespace of the plugin's own, e.g. proxies"
            )));
        }
        Ok(CallContext {
            provider: provider.to_string(),
            plugin: plugin.to_string(),
            http: http::HttpCapability::bind(grants.http.as_ref(), declared.http)?,
            libvirt: libvirt::LibvirtCapability::bind(
                provider,
                grants.libvirt.as_ref(),
                resources.libvirt.clone(),
                declared.libvirt,
            )?,
            kube: kube::KubeCapability::bind(
                provider,
                grants.kube.as_ref(),
                resources.kube.clone(),
                resources.operator_objects.clone(),
                declared.kube,
            ),
            log: log::PluginLog::new(plugin, provider, declared.log),
        })
    }

    /// A context that grants nothing (a plugin's `describe` at load).
    pub fn nothing_granted(plugin: &str) -> Self {
        CallContext {
            provider: "(loading)".to_string(),
            plugin: plugin.to_string(),
            http: http::HttpCapability::bind(None, true).expect("no grant builds no client"),
            libvirt: libvirt::LibvirtCapability::nothing_granted("(loading)"),
            kube: kube::KubeCapability::bind("(loading)", None, None, Arc::default(), true),
            log: log::PluginLog::new(plugin, "(loading)", true),
        }
    }
}
