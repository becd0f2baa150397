//! `grants.libvirt`: the hypervisors a provider instance may reach over SSH, and the Secret with
//! the SSH key and known_hosts.

use serde::Deserialize;

use super::GrantError;
use crate::names::{is_dns_label, is_dns_subdomain};

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
    /// The storage pools the plugin may use (volumes, disks, kernels); at least one.
    #[serde(default)]
    pub pools: Vec<String>,
    /// The libvirt networks a domain's `<interface type='network'>` may name.
    #[serde(default)]
    pub networks: Vec<String>,
    /// The host bridges a domain's `<interface type='bridge'>` may name.
    #[serde(default)]
    pub bridges: Vec<String>,
    /// Whether a domain may have `<interface type='user'>` (user-mode networking, e.g. passt).
    #[serde(default)]
    pub user_networking: bool,
}

fn default_ssh_port() -> u16 {
    22
}

/// A checked `grants.libvirt`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidLibvirtGrant {
    /// The Secret with the SSH key and known_hosts.
    pub secret: String,
    pub hosts: Vec<HypervisorGrant>,
}

impl ValidLibvirtGrant {
    /// Checks the Secret name and every hypervisor entry.
    pub fn parse(grant: &LibvirtGrant) -> Result<Self, GrantError> {
        let err = |message: String| GrantError::Libvirt(message);
        if !is_dns_subdomain(&grant.ssh_secret) {
            return Err(err(format!(
                "sshSecret: `{}` is not a Secret name (lowercase letters, digits, '-' and '.')",
                grant.ssh_secret
            )));
        }
        for (index, host) in grant.hosts.iter().enumerate() {
            let at = format!("hosts[{index}]");
            check_hypervisor(host).map_err(|m| err(format!("{at}.{m}")))?;
            if grant.hosts[..index].iter().any(|h| h.name == host.name) {
                return Err(err(format!(
                    "{at}.name: `{}` is listed twice; hypervisor names must be unique",
                    host.name
                )));
            }
        }
        Ok(ValidLibvirtGrant {
            secret: grant.ssh_secret.clone(),
            hosts: grant.hosts.clone(),
        })
    }
}

fn check_hypervisor(host: &HypervisorGrant) -> Result<(), String> {
    if !is_dns_label(&host.name) {
        return Err(format!(
            "name: `{}` is not a valid hypervisor name (lowercase letters, digits and '-', at most 63)",
            host.name
        ));
    }
    if host.address.trim().is_empty() || host.address.contains(['/', ' ', '@']) {
        return Err(format!(
            "address: `{}` is not a host name or IP address",
            host.address
        ));
    }
    if host.user.is_empty() || host.user.contains(['@', ' ', '/']) {
        return Err(format!("user: `{}` is not an SSH user name", host.user));
    }
    if let Some(socket) = &host.socket
        && !socket.starts_with('/')
    {
        return Err(format!(
            "socket: `{socket}` must be an absolute path, e.g. {DEFAULT_REMOTE_SOCKET}"
        ));
    }
    if host.pools.is_empty() {
        return Err(
            "pools: name the storage pools this provider instance may use, e.g. `pools: [default]` (nothing is granted otherwise)"
                .into(),
        );
    }
    for (field, names) in [
        ("pools", &host.pools),
        ("networks", &host.networks),
        ("bridges", &host.bridges),
    ] {
        for (index, name) in names.iter().enumerate() {
            // They are compared with what the plugin's XML names, and printed in errors.
            if name.is_empty()
                || name.len() > 255
                || name.contains(['/', '\'', '"', '<', '&'])
                || name.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(format!(
                    "{field}[{index}]: `{name}` is not a libvirt name (no '/', quotes, spaces)"
                ));
            }
            if names[..index].contains(name) {
                return Err(format!("{field}[{index}]: `{name}` is listed twice"));
            }
        }
    }
    Ok(())
}
