//! The `libvirt` capability: libvirt on the hypervisors a provider instance's grant lists,
//! reached over SSH tunnels the host makes itself (`tunnel`), with one cached connection per
//! hypervisor shared by every call (`hub`). The SSH key and `known_hosts` come from a Secret the
//! plugin never sees; the plugin names hypervisors only by their name in the grant.
//!
//! libvirt's C client is linked only with the host crate's `libvirt` cargo feature (on by
//! default; the default image is built without it, its `-kvm` variant with it, docs/image.md).
//! Without it the modules that call libvirt are left out, `unavailable` stands in for the hub
//! and the hypervisor handle, and a provider instance granted `libvirt` is refused when it is
//! bound ([`check_compiled_in`]), so no handle can ever be made.

#[cfg(feature = "libvirt")]
mod allow;
#[cfg(feature = "libvirt")]
mod domains;
#[cfg(feature = "libvirt")]
mod endpoint;
mod error;
#[cfg(feature = "libvirt")]
mod hub;
#[cfg(feature = "libvirt")]
mod hypervisor;
#[cfg(feature = "libvirt")]
mod import;
#[cfg(feature = "libvirt")]
mod import_jobs;
#[cfg(feature = "libvirt")]
mod lanes;
mod material;
#[cfg(feature = "libvirt")]
mod ops;
mod owner;
mod records;
pub mod tunnel;
#[cfg(not(feature = "libvirt"))]
mod unavailable;
#[cfg(not(feature = "libvirt"))]
mod unavailable_calls;
#[cfg(feature = "libvirt")]
mod volumes;
mod xml;

use std::sync::Arc;

pub use error::LibvirtError;
#[cfg(feature = "libvirt")]
pub use hub::LibvirtHub;
#[cfg(feature = "libvirt")]
pub use hypervisor::Hypervisor;
#[cfg(feature = "libvirt")]
pub use lanes::CallLimits;
pub use material::{DEFAULT_OPERATOR_ID, MaterialSource};
pub use owner::{HOST_METADATA_URI, OwnerMark};
pub use records::{
    DomainInfo, DomainState, ImageSource, InterfaceAddress, PoolInfo, ProbeReport, VolumeInfo,
};
#[cfg(not(feature = "libvirt"))]
pub use unavailable::{Hypervisor, LibvirtHub};
#[cfg(feature = "libvirt")]
pub use volumes::volume_prefix;

pub use crate::provider::capabilities::grants::{
    DEFAULT_REMOTE_SOCKET, DEFAULT_SSH_SECRET, DomainLimits, HypervisorGrant, LibvirtGrant, Publish,
};
use crate::provider::capabilities::grants::{GrantError, ValidLibvirtGrant};

/// Whether this binary has libvirt's client: the host crate's `libvirt` cargo feature.
pub const COMPILED_IN: bool = cfg!(feature = "libvirt");

/// Whether a provider instance granted `libvirt` can run in a binary with (`compiled_in`) or
/// without libvirt's client; if not, why, and what to run instead. [`COMPILED_IN`] says which
/// this binary is.
pub fn check_compiled_in(compiled_in: bool) -> Result<(), String> {
    if compiled_in {
        Ok(())
    } else {
        Err(without_libvirt())
    }
}

/// What a binary without libvirt says to a provider instance granted it.
fn without_libvirt() -> String {
    let version = env!("CARGO_PKG_VERSION");
    format!(
        "this proxy-operator binary was built without libvirt, as the default image is, so it \
         cannot reach hypervisors: run the image's -kvm variant for provider instances granted \
         libvirt (the same tag with -kvm, e.g. proxy-operator:v{version}-kvm; `docker build \
         --target kvm .` builds it), or build the binary with `--features libvirt` (docs/image.md)"
    )
}

/// The parsed grant of one provider instance.
#[derive(Debug, Clone)]
pub struct LibvirtCapability {
    /// The provider instance (its name goes into the owner mark of its domains).
    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    provider: String,
    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    secret: String,
    hosts: Vec<HypervisorGrant>,
    /// `None`: the process has no SSH material (e.g. `plugin run` without `--ssh-key`).
    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    hub: Option<Arc<LibvirtHub>>,
    /// Whether the plugin declared `libvirt`; if not, opening a hypervisor is refused.
    declared: bool,
}

impl LibvirtCapability {
    /// Binds provider instance `provider`'s valid grant to the process's connections and SSH
    /// material. `None` grants no hypervisor. A grant is refused by a binary without libvirt
    /// ([`check_compiled_in`]): the provider instance is not bound, and says why.
    pub fn bind(
        provider: &str,
        grant: Option<&ValidLibvirtGrant>,
        hub: Option<Arc<LibvirtHub>>,
        declared: bool,
    ) -> Result<Self, GrantError> {
        if grant.is_some() {
            check_compiled_in(COMPILED_IN).map_err(GrantError::LibvirtUnavailable)?;
        }
        Ok(LibvirtCapability {
            provider: provider.to_string(),
            secret: grant.map_or_else(|| DEFAULT_SSH_SECRET.into(), |g| g.secret.clone()),
            hosts: grant.map(|g| g.hosts.clone()).unwrap_or_default(),
            hub,
            declared,
        })
    }

    /// A capability that grants nothing (a plugin's `describe` at load).
    pub fn nothing_granted(provider: &str) -> Self {
        LibvirtCapability {
            provider: provider.to_string(),
            secret: DEFAULT_SSH_SECRET.into(),
            hosts: Vec::new(),
            hub: None,
            declared: true,
        }
    }

    /// A handle on hypervisor `name`, if the grant lists it. Nothing is connected yet.
    pub fn open(&self, name: &str) -> Result<Hypervisor, LibvirtError> {
        if !self.declared {
            return Err(LibvirtError::Denied(super::declared::undeclared("libvirt")));
        }
        check_compiled_in(COMPILED_IN).map_err(LibvirtError::Denied)?;
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
        self.handle(name, grant)
    }

    /// The handle on granted hypervisor `name` (no handle without libvirt: `open` refused first).
    #[cfg(not(feature = "libvirt"))]
    fn handle(&self, _name: &str, _grant: &HypervisorGrant) -> Result<Hypervisor, LibvirtError> {
        Err(LibvirtError::Denied(without_libvirt()))
    }

    /// The handle on granted hypervisor `name`.
    #[cfg(feature = "libvirt")]
    fn handle(&self, name: &str, grant: &HypervisorGrant) -> Result<Hypervisor, LibvirtError> {
        let Some(hub) = self.hub.clone() else {
            return Err(LibvirtError::Denied(
                "this operator has no SSH material for hypervisors (run it in a cluster with the kvm-ssh Secret, or `plugin run` with --ssh-key and --known-hosts)".into(),
            ));
        };
        let scope = hypervisor::Scope {
            volume_prefix: volume_prefix(hub.operator_id(), &self.provider),
            mark: OwnerMark {
                operator: hub.operator_id().to_string(),
                provider: self.provider.clone(),
            },
            pools: grant.pools.clone(),
            networks: grant.networks.clone(),
            bridges: grant.bridges.clone(),
            user_networking: grant.user_networking,
            // Checked when the grant was parsed.
            publish: grant.publish().ok().flatten(),
            limits: grant.limits,
        };
        Ok(Hypervisor {
            scope: Arc::new(scope),
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
            hub,
        })
    }
}

/// Both builds: what decides and says the refusal of a binary without libvirt.
#[cfg(test)]
mod compiled_in_tests {
    use super::*;

    #[test]
    fn a_binary_without_libvirt_refuses_a_grant_and_names_the_kvm_variant() {
        assert_eq!(COMPILED_IN, cfg!(feature = "libvirt"));
        assert_eq!(check_compiled_in(true), Ok(()));
        let message = check_compiled_in(false).unwrap_err();
        for says in [
            "built without libvirt",
            "-kvm variant",
            &format!("proxy-operator:v{}-kvm", env!("CARGO_PKG_VERSION")),
            "--target kvm",
            "--features libvirt",
            "docs/image.md",
        ] {
            assert!(message.contains(says), "{says}: {message}");
        }
        // As the operator reports a provider instance it did not bind (providers.rs: the entry's
        // path, then the grant error).
        let refused = GrantError::LibvirtUnavailable(message).to_string();
        assert!(
            refused.starts_with(
                "grants.libvirt: this proxy-operator binary was built without libvirt"
            ),
            "{refused}"
        );
    }

    /// `cargo test -p proxy-operator --no-default-features --lib libvirt::compiled_in_tests`:
    /// this binary refuses the grant when binding it, and a hypervisor when a plugin asks.
    #[cfg(not(feature = "libvirt"))]
    #[test]
    fn without_the_feature_a_grant_is_refused_when_bound() {
        let grant: LibvirtGrant = crate::support::yaml::from_str(
            "hosts: [{name: hv1, address: 10.0.0.1, user: virt, pools: [default]}]",
        )
        .unwrap();
        let grant = ValidLibvirtGrant::parse(&grant).unwrap();
        let hub = LibvirtHub::new(
            MaterialSource::Static(tunnel::SshMaterial {
                private_key: String::new(),
                known_hosts: String::new(),
            }),
            std::env::temp_dir(),
        );
        match LibvirtCapability::bind("kvm-a", Some(&grant), Some(hub), true) {
            Err(e @ GrantError::LibvirtUnavailable(_)) => {
                assert!(e.to_string().contains("-kvm variant"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        match LibvirtCapability::nothing_granted("kvm-a").open("hv1") {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("-kvm variant"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[cfg(all(test, feature = "libvirt"))]
mod tests {
    use super::*;

    fn grant(yaml: &str) -> Result<LibvirtCapability, String> {
        let grant: LibvirtGrant =
            crate::support::yaml::from_str(yaml).map_err(|e| e.to_string())?;
        let grant = ValidLibvirtGrant::parse(&grant).map_err(|e| e.to_string())?;
        // Material that is never used: opening a handle connects nothing.
        let material = tunnel::SshMaterial {
            private_key: String::new(),
            known_hosts: String::new(),
        };
        let hub = LibvirtHub::new(MaterialSource::Static(material), std::env::temp_dir());
        LibvirtCapability::bind("kvm-a", Some(&grant), Some(hub), true).map_err(|e| e.to_string())
    }

    #[test]
    fn a_grant_names_the_field_that_is_wrong() {
        let err = grant("hosts: [{name: hv1, address: 10.0.0.1, user: virt, pools: [default]}, {name: hv1, address: 10.0.0.2, user: virt, pools: [default]}]")
            .unwrap_err();
        assert!(
            err.contains("hosts[1].name") && err.contains("twice"),
            "{err}"
        );
        let err = grant("hosts: [{name: a/b, address: 10.0.0.1, user: virt, pools: [default]}]")
            .unwrap_err();
        assert!(err.contains("hosts[0].name"), "{err}");
        let err = grant(
            "hosts: [{name: hv, address: 10.0.0.1, user: virt, pools: [default], socket: run/s}]",
        )
        .unwrap_err();
        assert!(err.contains("hosts[0].socket"), "{err}");
        let err = grant(
            "hosts: [{name: hv, address: 10.0.0.1, user: virt, pools: [default], sshKey: x}]",
        )
        .unwrap_err();
        assert!(err.contains("sshKey"), "{err}");
        let err = grant("sshSecret: Bad_Name\nhosts: []").unwrap_err();
        assert!(err.contains("sshSecret"), "{err}");
        let host = "name: hv, address: 10.0.0.1, user: virt, pools: [default]";
        for (extra, says) in [
            (
                "publishAddress: 10.0.0.1, portRange: 20000-20099",
                "set userNetworking: true",
            ),
            (
                "userNetworking: true, publishAddress: 10.0.0.1",
                "hosts[0].portRange",
            ),
            (
                "userNetworking: true, portRange: 1-2",
                "hosts[0].publishAddress",
            ),
            (
                "userNetworking: true, publishAddress: 0.0.0.0, portRange: 1-2",
                "every address",
            ),
            (
                "userNetworking: true, publishAddress: hv.example, portRange: 1-2",
                "not an IP address",
            ),
            (
                "userNetworking: true, publishAddress: 10.0.0.1, portRange: 2-1",
                "portRange: `2-1`",
            ),
            (
                "userNetworking: true, publishAddress: 10.0.0.1, portRange: 0-10",
                "1 <= A <= B",
            ),
            (
                "userNetworking: true, publishAddress: 10.0.0.1, portRange: 1-70000",
                "65535",
            ),
            ("limits: {memoryMib: 0}", "limits.memoryMib: 0"),
            ("limits: {vcpus: 0}", "limits.vcpus: 0"),
            ("limits: {tbCacheMib: 0}", "limits.tbCacheMib: 0"),
            ("limits: {disks: 2}", "unknown field `disks`"),
        ] {
            let err = grant(&format!("hosts: [{{{host}, {extra}}}]")).unwrap_err();
            assert!(err.contains(says), "{extra}: {err}");
        }
        let capability = grant(&format!(
            "hosts: [{{{host}, userNetworking: true, publishAddress: 10.0.0.1, portRange: 20000-20099, limits: {{vcpus: 8}}}}]"
        ))
        .unwrap();
        let hv = capability.open("hv").unwrap();
        assert_eq!(
            hv.scope.publish,
            Some(Publish {
                address: "10.0.0.1".parse().unwrap(),
                first: 20000,
                last: 20099
            })
        );
        assert_eq!(
            hv.scope.limits,
            DomainLimits {
                vcpus: 8,
                ..DomainLimits::default()
            }
        );
    }

    #[test]
    fn only_granted_hypervisors_open() {
        let capability =
            grant("hosts: [{name: hv1, address: 10.0.0.1, user: virt, pools: [default]}]").unwrap();
        let hv = capability.open("hv1").unwrap();
        assert_eq!(hv.endpoint.target.port, 22);
        assert_eq!(hv.endpoint.socket, DEFAULT_REMOTE_SOCKET);
        assert_eq!(hv.endpoint.secret, DEFAULT_SSH_SECRET);
        match capability.open("hv2") {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("hv2") && m.contains("hv1"), "{m}"),
            other => panic!("{other:?}"),
        }
        match LibvirtCapability::bind("kvm-a", None, None, true)
            .unwrap()
            .open("hv1")
        {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("nothing is granted"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Granted, but the process has no SSH material.
        let grant: LibvirtGrant = crate::support::yaml::from_str(
            "hosts: [{name: hv1, address: 10.0.0.1, user: virt, pools: [default]}]",
        )
        .unwrap();
        let grant = ValidLibvirtGrant::parse(&grant).unwrap();
        match LibvirtCapability::bind("kvm-a", Some(&grant), None, true)
            .unwrap()
            .open("hv1")
        {
            Err(LibvirtError::Denied(m)) => assert!(m.contains("no SSH material"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
