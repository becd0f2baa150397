//! `grants.libvirt`: the hypervisors a provider instance may reach over SSH, and the Secret with
//! the SSH key and known_hosts.

use serde::Deserialize;

use super::GrantError;
use crate::support::names::{is_dns_label, is_dns_subdomain};

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
    /// The hypervisor address a user-mode `<portForward>` may listen on (passt binds it on the
    /// hypervisor). Without it, and [`Self::port_range`], no port forward is allowed.
    #[serde(default)]
    pub publish_address: Option<String>,
    /// The hypervisor ports (`"A-B"`) a user-mode `<portForward>` may listen on.
    #[serde(default)]
    pub port_range: Option<String>,
    /// The most one domain may take of the hypervisor.
    #[serde(default)]
    pub limits: DomainLimits,
}

/// Upper bounds of one domain's use of the hypervisor, with defaults that fit a proxy VM.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DomainLimits {
    /// `<memory>` and `<currentMemory>`, in MiB.
    pub memory_mib: u64,
    /// `<vcpu>`.
    pub vcpus: u32,
    /// The TCG translation cache (`<features><tcg><tb-cache>`), in MiB.
    pub tb_cache_mib: u64,
}

impl Default for DomainLimits {
    fn default() -> Self {
        DomainLimits {
            memory_mib: 4096,
            vcpus: 4,
            tb_cache_mib: 256,
        }
    }
}

/// Where a user-mode port forward may listen on the hypervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Publish {
    pub address: std::net::IpAddr,
    pub first: u16,
    pub last: u16,
}

impl HypervisorGrant {
    /// `publishAddress` and `portRange`, checked; `None` when neither is given.
    pub fn publish(&self) -> Result<Option<Publish>, String> {
        let (address, range) = match (&self.publish_address, &self.port_range) {
            (None, None) => return Ok(None),
            (Some(a), Some(r)) => (a, r),
            (Some(_), None) => {
                return Err("portRange: give the hypervisor ports port forwards may listen on with publishAddress, e.g. \"20000-20099\"".into());
            }
            (None, Some(_)) => {
                return Err("publishAddress: give the hypervisor address port forwards may listen on with portRange, e.g. 192.168.1.10".into());
            }
        };
        if !self.user_networking {
            return Err(
                "publishAddress: port forwards are user-mode networking; set userNetworking: true or remove publishAddress and portRange".into(),
            );
        }
        let address: std::net::IpAddr = address.parse().map_err(|_| {
            format!("publishAddress: `{address}` is not an IP address (e.g. 192.168.1.10)")
        })?;
        if address.is_unspecified() || address.is_multicast() {
            return Err(format!(
                "publishAddress: `{address}` is not one address of the hypervisor (it would publish on every address); name the one the proxies are reached at"
            ));
        }
        let parsed = range.split_once('-').and_then(|(a, b)| {
            Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?))
        });
        match parsed {
            Some((first, last)) if first >= 1 && first <= last => Ok(Some(Publish {
                address,
                first,
                last,
            })),
            _ => Err(format!(
                "portRange: `{range}` is not a port range `A-B` with 1 <= A <= B <= 65535 (e.g. \"20000-20099\")"
            )),
        }
    }
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
    host.publish()?;
    let DomainLimits {
        memory_mib,
        vcpus,
        tb_cache_mib,
    } = host.limits;
    // The upper ends keep byte counts far from overflow; beyond them is a typo.
    if !(16..=1 << 24).contains(&memory_mib) {
        return Err(format!(
            "limits.memoryMib: {memory_mib} is out of range (16 to 16777216 MiB); the default is 4096"
        ));
    }
    if !(1..=4096).contains(&vcpus) {
        return Err(format!(
            "limits.vcpus: {vcpus} is out of range (1 to 4096); the default is 4"
        ));
    }
    if !(1..=1 << 20).contains(&tb_cache_mib) {
        return Err(format!(
            "limits.tbCacheMib: {tb_cache_mib} is out of range (1 to 1048576 MiB); the default is 256"
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
