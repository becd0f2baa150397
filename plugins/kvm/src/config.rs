//! The provider instance config (`providers[].config` of a `kvm` provider instance), its checks
//! beyond types, and its JSON Schema.
//!
//! Host names and image keys become provider ids and volume file names, so they are held to a
//! DNS-label rule; every message names the field path and the fix.

use std::collections::BTreeMap;

use proxy_operator_sdk::ProviderError;
use serde::Deserialize;

/// The whole config of one `kvm` provider instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// `kvm` (hardware virtualisation) or `qemu` (TCG emulation, for tests).
    #[serde(default)]
    pub domain_type: DomainType,
    /// The hypervisors, by the names their SSH details have in `grants.libvirt.hosts`.
    pub hosts: Vec<HostConfig>,
    /// Base images by key; a Proxy names one in `spec.placement.image`.
    #[serde(default)]
    pub images: BTreeMap<String, ImageConfig>,
    /// The image key used when a Proxy names none.
    #[serde(default)]
    pub default_image: Option<String>,
    /// Size of a VM whose Proxy gives no machine type.
    #[serde(default)]
    pub defaults: Defaults,
    /// Ship a vendor-data script installing the QEMU guest agent (it reports the VM's address).
    #[serde(default = "default_true")]
    pub install_guest_agent: bool,
    /// Extra cloud-init vendor-data for every VM of this provider instance.
    #[serde(default)]
    pub vendor_data: Option<String>,
}

/// The libvirt domain type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    #[default]
    Kvm,
    Qemu,
}

impl DomainType {
    /// The value of `<domain type='…'>`.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainType::Kvm => "kvm",
            DomainType::Qemu => "qemu",
        }
    }
}

/// One hypervisor.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostConfig {
    /// The host's name in `grants.libvirt.hosts`; also the first half of provider ids.
    pub name: String,
    /// The zone a Proxy selects with `spec.placement.zone`.
    #[serde(default)]
    pub zone: Option<String>,
    /// The libvirt storage pool for base images, overlays and seed ISOs.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// A libvirt network to attach VMs to (exclusive with `bridge`).
    #[serde(default)]
    pub network: Option<String>,
    /// A host bridge to attach VMs to (exclusive with `network`).
    #[serde(default)]
    pub bridge: Option<String>,
}

/// How a VM's NIC is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nic<'a> {
    Network(&'a str),
    Bridge(&'a str),
}

impl HostConfig {
    /// The NIC attachment; `validate` made sure exactly one of network and bridge is set.
    pub fn nic(&self) -> Nic<'_> {
        match (&self.network, &self.bridge) {
            (_, Some(bridge)) => Nic::Bridge(bridge),
            (Some(network), None) => Nic::Network(network),
            (None, None) => Nic::Network("default"),
        }
    }
}

/// A base image the host downloads into each pool on first use.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageConfig {
    pub url: String,
    pub sha256: String,
    #[serde(default)]
    pub firmware: Firmware,
    #[serde(default)]
    pub format: ImageFormat,
}

/// The firmware a VM boots with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    #[default]
    Uefi,
    Bios,
}

impl Firmware {
    /// Parses `uefi` or `bios`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "uefi" => Some(Firmware::Uefi),
            "bios" => Some(Firmware::Bios),
            _ => None,
        }
    }
}

/// The disk format of a base image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    #[default]
    Qcow2,
    Raw,
}

impl ImageFormat {
    /// `qcow2` or `raw`, as libvirt and the file extension spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Raw => "raw",
        }
    }

    /// Parses `qcow2` or `raw`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "qcow2" => Some(ImageFormat::Qcow2),
            "raw" => Some(ImageFormat::Raw),
            _ => None,
        }
    }
}

/// VM size when the Proxy gives no machine type.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Defaults {
    #[serde(default = "default_memory_mib")]
    pub memory_mib: u64,
    #[serde(default = "default_vcpus")]
    pub vcpus: u32,
    #[serde(default = "default_disk_gib")]
    pub disk_gib: u64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            memory_mib: default_memory_mib(),
            vcpus: default_vcpus(),
            disk_gib: default_disk_gib(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_pool() -> String {
    "default".into()
}
fn default_memory_mib() -> u64 {
    1024
}
fn default_vcpus() -> u32 {
    1
}
fn default_disk_gib() -> u64 {
    10
}

/// Memory a VM may get, in MiB (a cloud image does not boot in less than 128 MiB).
pub const MEMORY_MIB: std::ops::RangeInclusive<u64> = 128..=1_048_576;
/// vCPUs a VM may get.
pub const VCPUS: std::ops::RangeInclusive<u32> = 1..=256;
/// Root disk size, in GiB.
pub const DISK_GIB: std::ops::RangeInclusive<u64> = 1..=65_536;

/// Whether `value` is a DNS label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
/// Host names, image keys and domain names are such labels: they end up in provider ids and
/// volume file names, so no `/`, no `.`, no `..`.
pub fn is_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Whether `value` is 64 hex digits.
pub fn is_sha256(value: &str) -> bool {
    value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `value` is an http(s) URL with something after the scheme and no whitespace.
pub fn is_http_url(value: &str) -> bool {
    let rest = value
        .strip_prefix("https://")
        .or_else(|| value.strip_prefix("http://"));
    matches!(rest, Some(rest) if !rest.is_empty()
        && !rest.starts_with('/')
        && !value.chars().any(|c| c.is_whitespace() || c.is_control()))
}

const LABEL_RULE: &str = "lowercase letters, digits and '-', at most 63";

fn invalid(message: String) -> ProviderError {
    ProviderError::InvalidConfig(message)
}

/// Checks what the types cannot: names, uniqueness, exclusive fields, ranges, references.
pub fn validate(config: &Config) -> Result<(), ProviderError> {
    if config.hosts.is_empty() {
        return Err(invalid(
            "config.hosts: at least one host is required; add one with name, pool and network or bridge".into(),
        ));
    }
    for (i, host) in config.hosts.iter().enumerate() {
        let path = format!("config.hosts[{i}]");
        if !is_label(&host.name) {
            return Err(invalid(format!(
                "{path}.name: {:?} is not a valid host name ({LABEL_RULE}); rename it",
                host.name
            )));
        }
        if let Some(first) = config.hosts[..i].iter().position(|h| h.name == host.name) {
            return Err(invalid(format!(
                "{path}.name: {:?} is already the name of config.hosts[{first}]; host names must be unique, rename one",
                host.name
            )));
        }
        if let Some(zone) = &host.zone
            && (zone.is_empty() || zone.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(format!(
                "{path}.zone: {zone:?} is not a zone name (non-empty, no spaces); fix it or remove the field"
            )));
        }
        if host.pool.is_empty()
            || host.pool.contains('/')
            || host.pool.chars().any(char::is_control)
        {
            return Err(invalid(format!(
                "{path}.pool: {:?} is not a libvirt storage pool name (non-empty, no '/'); name an existing pool",
                host.pool
            )));
        }
        match (&host.network, &host.bridge) {
            (Some(_), Some(_)) => {
                return Err(invalid(format!(
                    "{path}: both network and bridge are set; keep exactly one of them"
                )));
            }
            (None, None) => {
                return Err(invalid(format!(
                    "{path}: neither network nor bridge is set; add network (a libvirt network, e.g. default) or bridge (a host bridge, e.g. br0)"
                )));
            }
            (Some(value), None) | (None, Some(value)) => {
                let field = if host.network.is_some() {
                    "network"
                } else {
                    "bridge"
                };
                if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(invalid(format!(
                        "{path}.{field}: {value:?} is not a valid {field} name (non-empty, no spaces); fix it"
                    )));
                }
            }
        }
    }
    for (key, image) in &config.images {
        if !is_label(key) {
            return Err(invalid(format!(
                "config.images.{key}: {key:?} is not a valid image key ({LABEL_RULE}); rename it"
            )));
        }
        if !is_http_url(&image.url) {
            return Err(invalid(format!(
                "config.images.{key}.url: {:?} is not an https:// or http:// URL; give the image's download URL",
                image.url
            )));
        }
        if !is_sha256(&image.sha256) {
            return Err(invalid(format!(
                "config.images.{key}.sha256: {:?} is not 64 hex digits; give the image's sha256 (sha256sum FILE)",
                image.sha256
            )));
        }
    }
    if let Some(key) = &config.default_image
        && !config.images.contains_key(key)
    {
        let known = if config.images.is_empty() {
            "config.images is empty".to_string()
        } else {
            format!(
                "known keys: {}",
                config.images.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        return Err(invalid(format!(
            "config.defaultImage: {key:?} is not a key of config.images ({known}); add the image or fix the name"
        )));
    }
    let d = &config.defaults;
    if !MEMORY_MIB.contains(&d.memory_mib) {
        return Err(invalid(format!(
            "config.defaults.memoryMib: {} is out of range; use {} to {}",
            d.memory_mib,
            MEMORY_MIB.start(),
            MEMORY_MIB.end()
        )));
    }
    if !VCPUS.contains(&d.vcpus) {
        return Err(invalid(format!(
            "config.defaults.vcpus: {} is out of range; use {} to {}",
            d.vcpus,
            VCPUS.start(),
            VCPUS.end()
        )));
    }
    if !DISK_GIB.contains(&d.disk_gib) {
        return Err(invalid(format!(
            "config.defaults.diskGib: {} is out of range; use {} to {}",
            d.disk_gib,
            DISK_GIB.start(),
            DISK_GIB.end()
        )));
    }
    Ok(())
}

/// The JSON Schema (draft 2020-12) of [`Config`]. Kept as a file rather than built with
/// `json!`: a literal costs the component a fraction of the code the macro expands to.
pub const SCHEMA: &str = include_str!("config.schema.json");

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_operator_sdk::parse_config;

    use crate::testing::sample;

    fn invalid_message(config: &Config) -> String {
        match validate(config) {
            Err(ProviderError::InvalidConfig(m)) => m,
            other => panic!("expected invalid-config, got {other:?}"),
        }
    }

    #[test]
    fn sample_parses_with_defaults() {
        let c = sample();
        validate(&c).unwrap();
        assert_eq!(c.domain_type, DomainType::Kvm);
        assert!(c.install_guest_agent);
        assert_eq!(c.hosts[1].pool, "default");
        assert_eq!(c.hosts[0].nic(), Nic::Network("default"));
        assert_eq!(c.hosts[1].nic(), Nic::Bridge("br0"));
        let img = &c.images["debian-12"];
        assert_eq!(img.firmware, Firmware::Uefi);
        assert_eq!(img.format, ImageFormat::Qcow2);
        assert_eq!(c.defaults.memory_mib, 1024);
        assert_eq!(c.defaults.vcpus, 1);
        assert_eq!(c.defaults.disk_gib, 10);
    }

    #[test]
    fn labels() {
        for ok in ["a", "hv1", "debian-12", "0", &"a".repeat(63)] {
            assert!(is_label(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a/b",
            "..",
            "a..b",
            "a.b",
            "a_b",
            &"a".repeat(64),
        ] {
            assert!(!is_label(bad), "{bad}");
        }
    }

    #[test]
    fn host_name_with_dots_is_refused_with_its_path() {
        let mut c = sample();
        c.hosts[1].name = "..".into();
        assert_eq!(
            invalid_message(&c),
            "config.hosts[1].name: \"..\" is not a valid host name (lowercase letters, digits and '-', at most 63); rename it"
        );
        c.hosts[1].name = "a/b".into();
        assert!(
            invalid_message(&c)
                .starts_with("config.hosts[1].name: \"a/b\" is not a valid host name")
        );
    }

    #[test]
    fn duplicate_host_names_are_refused() {
        let mut c = sample();
        c.hosts[1].name = "hv1".into();
        let m = invalid_message(&c);
        assert!(
            m.starts_with("config.hosts[1].name: \"hv1\" is already the name of config.hosts[0]"),
            "{m}"
        );
    }

    #[test]
    fn network_and_bridge_are_exclusive() {
        let mut c = sample();
        c.hosts[0].bridge = Some("br0".into());
        assert_eq!(
            invalid_message(&c),
            "config.hosts[0]: both network and bridge are set; keep exactly one of them"
        );
        c.hosts[0].bridge = None;
        c.hosts[0].network = None;
        assert!(
            invalid_message(&c).starts_with("config.hosts[0]: neither network nor bridge is set")
        );
    }

    #[test]
    fn no_hosts_is_refused() {
        let mut c = sample();
        c.hosts.clear();
        assert!(invalid_message(&c).starts_with("config.hosts: at least one host is required"));
    }

    #[test]
    fn image_keys_urls_and_digests_are_checked() {
        let mut c = sample();
        let image = c.images["debian-12"].clone();
        c.images.insert("Debian.12".into(), image.clone());
        assert!(
            invalid_message(&c)
                .starts_with("config.images.Debian.12: \"Debian.12\" is not a valid image key")
        );
        c.images.remove("Debian.12");

        c.images.get_mut("debian-12").unwrap().url = "ftp://example.com/x.qcow2".into();
        assert!(
            invalid_message(&c)
                .starts_with("config.images.debian-12.url: \"ftp://example.com/x.qcow2\"")
        );
        c.images.get_mut("debian-12").unwrap().url = image.url.clone();

        c.images.get_mut("debian-12").unwrap().sha256 = "abc".into();
        assert!(
            invalid_message(&c)
                .starts_with("config.images.debian-12.sha256: \"abc\" is not 64 hex digits")
        );
    }

    #[test]
    fn unknown_default_image_is_refused() {
        let mut c = sample();
        c.default_image = Some("ubuntu".into());
        assert_eq!(
            invalid_message(&c),
            "config.defaultImage: \"ubuntu\" is not a key of config.images (known keys: alpine, debian-12); add the image or fix the name"
        );
    }

    #[test]
    fn default_ranges_are_checked() {
        let mut c = sample();
        c.defaults.memory_mib = 64;
        assert_eq!(
            invalid_message(&c),
            "config.defaults.memoryMib: 64 is out of range; use 128 to 1048576"
        );
        c.defaults.memory_mib = 512;
        c.defaults.vcpus = 0;
        assert!(invalid_message(&c).starts_with("config.defaults.vcpus: 0 is out of range"));
    }

    #[test]
    fn unknown_fields_and_bad_enums_name_the_path() {
        let err = parse_config::<Config>(r#"{"hosts":[{"name":"a","network":"n","netwrok":"x"}]}"#)
            .unwrap_err();
        match err {
            ProviderError::InvalidConfig(m) => {
                assert!(m.starts_with("config.hosts[0]"), "{m}");
                assert!(m.contains("unknown field `netwrok`"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        let err = parse_config::<Config>(r#"{"domainType":"xen","hosts":[]}"#).unwrap_err();
        match err {
            ProviderError::InvalidConfig(m) => assert!(m.starts_with("config.domainType"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn schema_matches_the_config() {
        let s: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let props = s["properties"].as_object().unwrap();
        let mut keys: Vec<_> = props.keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "defaultImage",
                "defaults",
                "domainType",
                "hosts",
                "images",
                "installGuestAgent",
                "vendorData"
            ]
        );
        assert_eq!(s["properties"]["hosts"]["minItems"], 1);
        let host = &s["properties"]["hosts"]["items"]["properties"];
        let mut host_keys: Vec<_> = host.as_object().unwrap().keys().cloned().collect();
        host_keys.sort();
        assert_eq!(host_keys, ["bridge", "name", "network", "pool", "zone"]);
        let d = &s["properties"]["defaults"]["properties"];
        let defaults = Defaults::default();
        assert_eq!(d["memoryMib"]["default"], defaults.memory_mib);
        assert_eq!(d["memoryMib"]["minimum"], *MEMORY_MIB.start());
        assert_eq!(d["memoryMib"]["maximum"], *MEMORY_MIB.end());
        assert_eq!(d["vcpus"]["default"], defaults.vcpus);
        assert_eq!(d["vcpus"]["minimum"], *VCPUS.start());
        assert_eq!(d["vcpus"]["maximum"], *VCPUS.end());
        assert_eq!(d["diskGib"]["default"], defaults.disk_gib);
        assert_eq!(d["diskGib"]["minimum"], *DISK_GIB.start());
        assert_eq!(d["diskGib"]["maximum"], *DISK_GIB.end());
        // The pattern of a name is the label rule.
        assert_eq!(host["name"]["pattern"], "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
    }
}
