//! The `libvirt` capability: libvirt on the hypervisors a provider instance's grant lists,
//! reached over SSH tunnels the host makes itself (`tunnel`), with one cached connection per
//! hypervisor shared by every call (`hub`). The SSH key and `known_hosts` come from a Secret the
//! plugin never sees; the plugin names hypervisors only by their name in the grant.

mod endpoint;
mod error;
mod hub;
mod hypervisor;
mod import;
mod import_jobs;
mod ops;
mod records;
pub mod tunnel;
mod xml;

use std::sync::Arc;

use serde::Deserialize;

pub use error::LibvirtError;
pub use hub::{LibvirtHub, MaterialSource};
pub use hypervisor::Hypervisor;
pub use records::{
    DomainInfo, DomainState, ImageSource, InterfaceAddress, PoolInfo, ProbeReport, VolumeInfo,
};

use crate::capabilities::GrantError;

/// The Secret holding the SSH key and known_hosts when the grant does not name one.
pub const DEFAULT_SSH_SECRET: &str = "kvm-ssh";
/// libvirtd's system socket on Debian, Ubuntu, Fedora and RHEL.
pub const DEFAULT_REMOTE_SOCKET: &str = "/var/run/libvirt/libvirt-sock";

/// The `grants.libvirt` section of a provider instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LibvirtGrant {
    /// The Secret in the operator's namespace with `ssh-privatekey` and `known_hosts`.
    #[serde(default = "default_secret")]
    pub ssh_secret: String,
    /// The hypervisors this provider instance may reach.
    pub hosts: Vec<HypervisorGrant>,
}

fn default_secret() -> String {
    DEFAULT_SSH_SECRET.to_string()
}

/// One hypervisor: where sshd answers and which libvirt socket to forward to.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HypervisorGrant {
    /// The name the plugin (and its config) uses for the hypervisor.
    pub name: String,
    /// Host name or IP address of its sshd.
    pub address: String,
    #[serde(default = "default_ssh_port")]
    pub port: u16,
    /// The SSH user; it needs access to the libvirt socket (the `libvirt` group).
    pub user: String,
    /// The remote libvirt socket; default `/var/run/libvirt/libvirt-sock`.
    #[serde(default)]
    pub socket: Option<String>,
}

fn default_ssh_port() -> u16 {
    22
}

/// The parsed grant of one provider instance.
#[derive(Debug, Clone)]
pub struct LibvirtCapability {
    secret: String,
    hosts: Vec<HypervisorGrant>,
    hub: Arc<LibvirtHub>,
}

impl LibvirtCapability {
    /// Checks a grant; `None` grants no hypervisor. Calls go through `hub` (see [`Self::with_hub`]).
    pub fn new(grant: Option<&LibvirtGrant>) -> Result<Self, GrantError> {
        let Some(grant) = grant else {
            return Ok(LibvirtCapability {
                secret: DEFAULT_SSH_SECRET.into(),
                hosts: Vec::new(),
                hub: LibvirtHub::unconfigured(),
            });
        };
        let err = |message: String| GrantError::Libvirt(message);
        if !is_dns_subdomain(&grant.ssh_secret) {
            return Err(err(format!(
                "sshSecret: `{}` is not a Secret name (lowercase letters, digits, '-' and '.')",
                grant.ssh_secret
            )));
        }
        for (index, host) in grant.hosts.iter().enumerate() {
            let at = format!("hosts[{index}]");
            if !crate::config::is_dns_label(&host.name) {
                return Err(err(format!(
                    "{at}.name: `{}` is not a valid hypervisor name (lowercase letters, digits and '-', at most 63)",
                    host.name
                )));
            }
            if grant.hosts[..index].iter().any(|h| h.name == host.name) {
                return Err(err(format!(
                    "{at}.name: `{}` is listed twice; hypervisor names must be unique",
                    host.name
                )));
            }
            if host.address.trim().is_empty() || host.address.contains(['/', ' ', '@']) {
                return Err(err(format!(
                    "{at}.address: `{}` is not a host name or IP address",
                    host.address
                )));
            }
            if host.user.is_empty() || host.user.contains(['@', ' ', '/']) {
                return Err(err(format!(
                    "{at}.user: `{}` is not an SSH user name",
                    host.user
                )));
            }
            if let Some(socket) = &host.socket
                && !socket.starts_with('/')
            {
                return Err(err(format!(
                    "{at}.socket: `{socket}` must be an absolute path, e.g. {DEFAULT_REMOTE_SOCKET}"
                )));
            }
        }
        Ok(LibvirtCapability {
            secret: grant.ssh_secret.clone(),
            hosts: grant.hosts.clone(),
            hub: LibvirtHub::unconfigured(),
        })
    }

    /// The same grant, served by `hub` (the process's connections and SSH material).
    pub fn with_hub(mut self, hub: Arc<LibvirtHub>) -> Self {
        self.hub = hub;
        self
    }

    /// A handle on hypervisor `name`, if the grant lists it. Nothing is connected yet.
    pub fn open(&self, name: &str) -> Result<Hypervisor, LibvirtError> {
        let Some(grant) = self.hosts.iter().find(|h| h.name == name) else {
            return Err(LibvirtError::Denied(format!(
                "hypervisor `{name}` is not in this provider instance's grants.libvirt.hosts ({})",
                if self.hosts.is_empty() {
                    "nothing is granted".to_string()
                } else {
                    self.hosts
                        .iter()
                        .map(|h| h.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )));
        };
        Ok(Hypervisor {
            host: name.to_string(),
            endpoint: endpoint::Endpoint {
                target: tunnel::SshTarget {
                    address: grant.address.clone(),
                    port: grant.port,
                    user: grant.user.clone(),
                },
                socket: grant
                    .socket
                    .clone()
                    .unwrap_or_else(|| DEFAULT_REMOTE_SOCKET.to_string()),
                secret: self.secret.clone(),
            },
            hub: self.hub.clone(),
        })
    }
}

/// A Kubernetes object name: RFC 1123 subdomain.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(crate::config::is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(yaml: &str) -> Result<LibvirtCapability, String> {
        let grant: LibvirtGrant = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        LibvirtCapability::new(Some(&grant)).map_err(|e| e.to_string())
    }

    #[test]
    fn a_grant_names_the_field_that_is_wrong() {
        let err = grant("hosts: [{name: hv1, address: 10.0.0.1, user: virt}, {name: hv1, address: 10.0.0.2, user: virt}]")
            .unwrap_err();
        assert!(
            err.contains("hosts[1].name") && err.contains("twice"),
            "{err}"
        );
        let err = grant("hosts: [{name: a/b, address: 10.0.0.1, user: virt}]").unwrap_err();
        assert!(err.contains("hosts[0].name"), "{err}");
        let err =
            grant("hosts: [{name: hv, address: 10.0.0.1, user: virt, socket: run/s}]").unwrap_err();
        assert!(err.contains("hosts[0].socket"), "{err}");
        let err =
            grant("hosts: [{name: hv, address: 10.0.0.1, user: virt, sshKey: x}]").unwrap_err();
        assert!(err.contains("sshKey"), "{err}");
        let err = grant("sshSecret: Bad_Name\nhosts: []").unwrap_err();
        assert!(err.contains("sshSecret"), "{err}");
    }

    #[test]
    fn only_granted_hypervisors_open() {
        let capability = grant("hosts: [{name: hv1, address: 10.0.0.1, user: virt}]").unwrap();
        let hv = capability.open("hv1").unwrap();
        assert_eq!(hv.endpoint.target.port, 22);
        assert_eq!(hv.endpoint.socket, DEFAULT_REMOTE_SOCKET);
        assert_eq!(hv.endpoint.secret, DEFAULT_SSH_SECRET);
        match capability.open("hv2") {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("hv2") && m.contains("hv1"), "{m}"),
            other => panic!("{other:?}"),
        }
        match LibvirtCapability::new(None).unwrap().open("hv1") {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("nothing is granted"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
