//! What a provider instance may reach: the `grants` section of its providers-config entry as
//! plain data, and its validation into [`ValidGrants`] (no I/O: nothing is connected or read),
//! from which each capability is bound once per provider instance.

mod error;
mod http;
mod kube;
mod libvirt;
mod secret;

use serde::Deserialize;

pub use error::GrantError;
pub use http::{CredentialGrant, HttpGrant, ValidCredential, ValidHttpGrant};
pub use kube::{
    DEFAULT_IMAGES, DEFAULT_NODE_SELECTOR_KEYS, DEFAULT_QUOTA_MEBIBYTES, DEFAULT_QUOTA_OBJECTS,
    ImagePattern, ImageRef, KNOWN_KINDS, KindPolicy, KnownKind, KubeGrant, KubeGrantError,
    KubeKind, QuotaGrant, SchedulingGrant, Toleration, ValidKubeGrant, known_kinds_list,
};
pub use libvirt::{
    DEFAULT_REMOTE_SOCKET, DEFAULT_SSH_SECRET, DomainLimits, HypervisorGrant, LibvirtGrant,
    Publish, ValidLibvirtGrant,
};
pub(crate) use secret::read_secret;
pub use secret::{AwsCredentialsSource, AwsKeys, AwsSigning, SecretSource, SecretValue};

/// What one provider instance may reach, from the `grants` of its providers-config entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grants {
    /// Outbound HTTP: the hosts it may call and the credentials the host adds.
    #[serde(default)]
    pub http: Option<HttpGrant>,
    /// libvirt on hypervisors over SSH: which ones, and the Secret with the SSH key.
    #[serde(default)]
    pub libvirt: Option<LibvirtGrant>,
    /// Kubernetes objects of some kinds in one namespace.
    #[serde(default)]
    pub kube: Option<KubeGrant>,
}

/// Grants that passed every check, in the form the capabilities are bound from. `None`: that
/// capability is not granted (every call is denied).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidGrants {
    pub http: Option<ValidHttpGrant>,
    pub libvirt: Option<ValidLibvirtGrant>,
    pub kube: Option<ValidKubeGrant>,
}

impl Grants {
    /// Checks every grant; the error names the field and the fix.
    pub fn validate(&self) -> Result<ValidGrants, GrantError> {
        Ok(ValidGrants {
            http: self.http.as_ref().map(ValidHttpGrant::parse).transpose()?,
            libvirt: self
                .libvirt
                .as_ref()
                .map(ValidLibvirtGrant::parse)
                .transpose()?,
            kube: self.kube.as_ref().map(ValidKubeGrant::parse).transpose()?,
        })
    }
}
