//! Names this provider decides: provider ids, volume names, the metadata namespace.

use proxy_operator_sdk::ProviderError;

use crate::config::{ImageFormat, is_label};

/// The XML namespace of the owner identity in a domain's `<metadata>`.
pub const METADATA_URI: &str = "https://proxy-operator.dev/xmlns/kvm/1";

/// The prefix the plugin writes the metadata element with (readers accept any).
pub const METADATA_PREFIX: &str = "po";

/// A parsed provider id: `<host-name>/<domain-name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderId<'a> {
    pub host: &'a str,
    pub domain: &'a str,
}

impl<'a> ProviderId<'a> {
    /// Parses `<host>/<domain>`, both DNS labels; anything else is `permanent` (no retry can fix
    /// an id this provider never made).
    pub fn parse(id: &'a str) -> Result<Self, ProviderError> {
        match id.split_once('/') {
            Some((host, domain)) if is_label(host) && is_label(domain) => {
                Ok(ProviderId { host, domain })
            }
            _ => Err(ProviderError::Permanent(format!(
                "provider id {id:?} is not <host>/<domain> (each lowercase letters, digits and '-'); it was not made by the kvm provider"
            ))),
        }
    }
}

/// The provider id of domain `domain` on host `host`.
pub fn provider_id(host: &str, domain: &str) -> String {
    format!("{host}/{domain}")
}

/// Checks `spec.name` (derived by the operator from the Proxy UID): it names the domain and its
/// volume files, so it must be a DNS label.
pub fn check_domain_name(name: &str) -> Result<(), ProviderError> {
    if is_label(name) {
        Ok(())
    } else {
        Err(ProviderError::Permanent(format!(
            "spec.name: {name:?} cannot name a libvirt domain (lowercase letters, digits and '-', at most 63)"
        )))
    }
}

/// The per-VM qcow2 overlay over the base image.
pub fn root_volume(domain: &str) -> String {
    format!("{domain}-root.qcow2")
}

/// The per-VM NoCloud seed ISO.
pub fn seed_volume(domain: &str) -> String {
    format!("{domain}-seed.iso")
}

/// The base image volume of a configured image key. The digest's first 12 hex digits are part of
/// the name: pointing a key at a new image (a new release) imports it beside the old one, rather
/// than silently reusing the old base for new VMs (whose running VMs still need it).
pub fn base_volume_for_key(key: &str, sha256: &str, format: ImageFormat) -> String {
    let digest: String = sha256.chars().take(12).collect();
    format!(
        "base-{key}-{}.{}",
        digest.to_ascii_lowercase(),
        format.as_str()
    )
}

/// The base image volume of an image given by URL: named by its digest, so two Proxies with the
/// same URL and digest share it.
pub fn base_volume_for_digest(sha256: &str, format: ImageFormat) -> String {
    let prefix: String = sha256.chars().take(16).collect();
    format!("base-{}.{}", prefix.to_ascii_lowercase(), format.as_str())
}

/// A direct-kernel-boot file (`what`: `kernel` or `initrd`) of image `key`, named by its digest
/// like the base image.
pub fn boot_file_volume(key: &str, what: &str, sha256: &str) -> String {
    let digest: String = sha256.chars().take(12).collect();
    format!("base-{key}-{what}-{}", digest.to_ascii_lowercase())
}

pub use proxy_operator_sdk::hash::fnv1a;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::permanent;

    #[test]
    fn provider_ids_round_trip() {
        let id = provider_id("hv1", "px-0123456789abcdef");
        assert_eq!(id, "hv1/px-0123456789abcdef");
        assert_eq!(
            ProviderId::parse(&id).unwrap(),
            ProviderId {
                host: "hv1",
                domain: "px-0123456789abcdef"
            }
        );
    }

    #[test]
    fn bad_provider_ids_are_permanent() {
        for bad in [
            "",
            "hv1",
            "hv1/",
            "/px",
            "hv1/px/x",
            "hv1/../etc",
            "HV1/px",
            "hv1/a.b",
        ] {
            let m = permanent(ProviderId::parse(bad));
            assert!(m.contains("is not <host>/<domain>"), "{bad}: {m}");
        }
    }

    #[test]
    fn volume_names() {
        assert_eq!(root_volume("px-1"), "px-1-root.qcow2");
        assert_eq!(seed_volume("px-1"), "px-1-seed.iso");
        let digest = "0123456789abcdef".repeat(4);
        assert_eq!(
            base_volume_for_key("debian-12", &digest, ImageFormat::Qcow2),
            "base-debian-12-0123456789ab.qcow2"
        );
        // A new image under the same key is a new base volume.
        assert_ne!(
            base_volume_for_key("debian-12", &"f".repeat(64), ImageFormat::Qcow2),
            base_volume_for_key("debian-12", &digest, ImageFormat::Qcow2)
        );
        assert_eq!(
            base_volume_for_digest(
                "FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210FEDCBA9876543210",
                ImageFormat::Raw
            ),
            "base-fedcba9876543210.raw"
        );
    }

    #[test]
    fn domain_names_are_labels() {
        check_domain_name("px-0123456789abcdef").unwrap();
        let m = permanent(check_domain_name("../px"));
        assert!(m.starts_with("spec.name: \"../px\""), "{m}");
    }
}
