//! Where the SSH key and known_hosts for the hypervisors come from, and the operator id their
//! domains are marked with: what the operator and `plugin run` hand the libvirt capability,
//! with or without the `libvirt` feature.

use std::fmt;

use super::tunnel::SshMaterial;

/// The operator id when none is given (the default of `--operator-id`).
pub const DEFAULT_OPERATOR_ID: &str = "proxy-operator";

/// Where the SSH key and known_hosts come from.
#[derive(Clone)]
pub enum MaterialSource {
    /// Secrets in the operator's namespace, named by each grant's `sshSecret`.
    Secrets {
        client: kube::Client,
        namespace: String,
    },
    /// Fixed material for every grant (`plugin run --ssh-key … --known-hosts …`).
    Static(SshMaterial),
}

impl fmt::Debug for MaterialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaterialSource::Secrets { namespace, .. } => write!(f, "Secrets({namespace})"),
            MaterialSource::Static(_) => write!(f, "Static(<redacted>)"),
        }
    }
}
