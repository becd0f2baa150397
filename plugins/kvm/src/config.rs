//! The provider instance config (`providers[].config` of a `kvm` provider instance), its checks
//! beyond types, and its JSON Schema.
//!
//! Host names and image keys become provider ids and volume file names, so they are held to a
//! DNS-label rule; every message names the field path and the fix.

use std::collections::BTreeMap;

use proxy_operator_sdk::ProviderError;
use proxy_operator_sdk::squid::{self, SquidOptions};
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
    /// Configure squid in every VM (a vendor-data script); a Proxy opts out with
    /// `providerOptions.managedSquid: false`.
    #[serde(default = "default_true")]
    pub managed_squid: bool,
    /// Client address ranges (CIDR) the managed squid accepts: the crawlers' and the operator's.
    #[serde(default = "squid::default_allow_from")]
    pub allow_from: Vec<String>,
    /// Ports crawlers may `CONNECT` to through the managed squid.
    #[serde(default = "squid::default_connect_ports")]
    pub connect_ports: Vec<u16>,
    /// Destinations (CIDR) the managed squid reaches although they are in its own network
    /// (`squid::REFUSED_DESTINATIONS`), e.g. an internal site the crawlers must fetch.
    #[serde(default)]
    pub allow_destinations: Vec<String>,
    /// Destinations (CIDR) the managed squid always refuses, even inside `allowDestinations`.
    #[serde(default)]
    pub deny_destinations: Vec<String>,
    /// Keep the managed squid's access log in the VM.
    #[serde(default)]
    pub access_log: bool,
    /// The managed squid's DNS servers; empty: the VM's own resolv.conf.
    #[serde(default)]
    pub dns_nameservers: Vec<String>,
}

impl Config {
    /// The managed squid's settings, as every provider has them.
    pub fn squid(&self) -> SquidOptions {
        SquidOptions {
            allow_from: self.allow_from.clone(),
            connect_ports: self.connect_ports.clone(),
            allow_destinations: self.allow_destinations.clone(),
            deny_destinations: self.deny_destinations.clone(),
            cluster_ranges: Vec::new(),
            access_log: self.access_log,
        }
    }
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
    /// A libvirt network (by name) or user-mode networking to attach VMs to (exclusive with
    /// `bridge`).
    #[serde(default)]
    pub network: Option<Network>,
    /// A host bridge to attach VMs to (exclusive with `network`).
    #[serde(default)]
    pub bridge: Option<String>,
}

/// `hosts[].network`: a libvirt network's name, or `{mode: user, ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Network {
    Named(String),
    User(UserNetwork),
}

/// User-mode networking (passt) for hypervisors without a bridge: each VM's squid port is
/// published on the hypervisor at `publishAddress` and a port of `portRange`, which is the
/// address the operator probes and crawlers use.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserNetwork {
    /// Must be `user`.
    pub mode: String,
    /// The hypervisor's address the ports are published on (and reported as the proxy's).
    pub publish_address: String,
    /// `FIRST-LAST`, inclusive: the ports VMs are published on, one per VM.
    pub port_range: String,
}

/// An inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// Parses `FIRST-LAST` (1 ≤ FIRST ≤ LAST ≤ 65535).
    pub fn parse(value: &str) -> Option<Self> {
        let (first, last) = value.split_once('-')?;
        let first: u16 = first.trim().parse().ok()?;
        let last: u16 = last.trim().parse().ok()?;
        (first >= 1 && first <= last).then_some(PortRange { first, last })
    }

    /// How many ports the range holds (never 0).
    pub fn count(self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    pub fn contains(self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

/// How a VM's NIC is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nic<'a> {
    Network(&'a str),
    Bridge(&'a str),
    /// passt, with the squid port published at `address:port` on the hypervisor.
    User {
        address: &'a str,
        port: u16,
    },
}

impl HostConfig {
    /// The user-mode network of this host, when it has one.
    pub fn user_network(&self) -> Option<(&str, PortRange)> {
        match &self.network {
            Some(Network::User(user)) => Some((
                user.publish_address.as_str(),
                PortRange::parse(&user.port_range)?,
            )),
            _ => None,
        }
    }

    /// The NIC attachment; `validate` made sure exactly one of network and bridge is set.
    /// `published_port` is the port chosen for a VM on a user-mode network.
    pub fn nic(&self, published_port: Option<u16>) -> Nic<'_> {
        match (&self.network, &self.bridge) {
            (_, Some(bridge)) => Nic::Bridge(bridge),
            (Some(Network::Named(network)), None) => Nic::Network(network),
            (Some(Network::User(user)), None) => Nic::User {
                address: &user.publish_address,
                port: published_port.unwrap_or_default(),
            },
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
    /// Direct kernel boot, for images without a bootloader: the kernel to boot.
    #[serde(default)]
    pub kernel: Option<BootFile>,
    /// The initrd of a direct kernel boot.
    #[serde(default)]
    pub initrd: Option<BootFile>,
    /// The kernel command line of a direct kernel boot; default [`DEFAULT_CMDLINE`].
    #[serde(default)]
    pub cmdline: Option<String>,
}

/// The kernel command line of a direct kernel boot when the image gives none: the root disk is
/// the first virtio disk, the console the serial port.
pub const DEFAULT_CMDLINE: &str = "root=/dev/vda rw console=ttyS0";

/// A file of a direct kernel boot, imported into the pool like the image and checked the same way.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BootFile {
    pub url: String,
    pub sha256: String,
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
        validate_nic(&path, host)?;
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
        validate_kernel_boot(key, image)?;
    }
    config.squid().validate()?;
    for (index, server) in config.dns_nameservers.iter().enumerate() {
        if server.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(format!(
                "config.dnsNameservers[{index}]: {server:?} is not an IP address; list DNS server addresses, e.g. [1.1.1.1]"
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

/// Exactly one of `network` and `bridge`, each well formed.
fn validate_nic(path: &str, host: &HostConfig) -> Result<(), ProviderError> {
    let name_ok =
        |v: &str| !v.is_empty() && !v.chars().any(|c| c.is_whitespace() || c.is_control());
    match (&host.network, &host.bridge) {
        (Some(_), Some(_)) => Err(invalid(format!(
            "{path}: both network and bridge are set; keep exactly one of them"
        ))),
        (None, None) => Err(invalid(format!(
            "{path}: neither network nor bridge is set; add network (a libvirt network, e.g. default, or {{mode: user, publishAddress, portRange}}) or bridge (a host bridge, e.g. br0)"
        ))),
        (Some(Network::Named(value)), None) if !name_ok(value) => Err(invalid(format!(
            "{path}.network: {value:?} is not a valid network name (non-empty, no spaces); fix it"
        ))),
        (None, Some(value)) if !name_ok(value) => Err(invalid(format!(
            "{path}.bridge: {value:?} is not a valid bridge name (non-empty, no spaces); fix it"
        ))),
        (Some(Network::User(user)), None) => {
            if user.mode != "user" {
                return Err(invalid(format!(
                    "{path}.network.mode: {:?} is not a network mode; the only mode is user (or give network a libvirt network's name)",
                    user.mode
                )));
            }
            if user.publish_address.parse::<std::net::IpAddr>().is_err() {
                return Err(invalid(format!(
                    "{path}.network.publishAddress: {:?} is not an IP address; give the hypervisor's address that the operator and the crawlers reach, e.g. 192.168.1.10",
                    user.publish_address
                )));
            }
            if PortRange::parse(&user.port_range).is_none() {
                return Err(invalid(format!(
                    "{path}.network.portRange: {:?} is not FIRST-LAST with 1 <= FIRST <= LAST <= 65535; e.g. 20000-20099",
                    user.port_range
                )));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `kernel`, `initrd` and `cmdline` of an image: the last two only with a kernel.
fn validate_kernel_boot(key: &str, image: &ImageConfig) -> Result<(), ProviderError> {
    if image.kernel.is_none() {
        for (field, set) in [
            ("initrd", image.initrd.is_some()),
            ("cmdline", image.cmdline.is_some()),
        ] {
            if set {
                return Err(invalid(format!(
                    "config.images.{key}.{field}: set without config.images.{key}.kernel; add the kernel (url, sha256) or remove {field}"
                )));
            }
        }
    }
    for (field, file) in [("kernel", &image.kernel), ("initrd", &image.initrd)] {
        let Some(file) = file else { continue };
        if !is_http_url(&file.url) {
            return Err(invalid(format!(
                "config.images.{key}.{field}.url: {:?} is not an https:// or http:// URL; give the file's download URL",
                file.url
            )));
        }
        if !is_sha256(&file.sha256) {
            return Err(invalid(format!(
                "config.images.{key}.{field}.sha256: {:?} is not 64 hex digits; give the file's sha256 (sha256sum FILE)",
                file.sha256
            )));
        }
    }
    if let Some(cmdline) = &image.cmdline
        && (cmdline.len() > 4096 || cmdline.chars().any(char::is_control))
    {
        return Err(invalid(format!(
            "config.images.{key}.cmdline: at most 4096 characters on one line; shorten it"
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
        assert_eq!(c.hosts[0].nic(None), Nic::Network("default"));
        assert_eq!(c.hosts[1].nic(None), Nic::Bridge("br0"));
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
    fn user_mode_network_parses_and_is_checked() {
        let c = parse_config::<Config>(
            r#"{"hosts":[{"name":"hv1","network":{"mode":"user","publishAddress":"127.0.0.1","portRange":"20000-20009"}}]}"#,
        )
        .unwrap();
        validate(&c).unwrap();
        assert_eq!(
            c.hosts[0].user_network(),
            Some((
                "127.0.0.1",
                PortRange {
                    first: 20000,
                    last: 20009
                }
            ))
        );
        assert_eq!(
            c.hosts[0].nic(Some(20003)),
            Nic::User {
                address: "127.0.0.1",
                port: 20003
            }
        );
        let bad = |network: &str| {
            let json = format!(r#"{{"hosts":[{{"name":"hv1","network":{network}}}]}}"#);
            invalid_message(&parse_config::<Config>(&json).unwrap())
        };
        assert!(
            bad(r#"{"mode":"nat","publishAddress":"127.0.0.1","portRange":"1-2"}"#)
                .starts_with("config.hosts[0].network.mode: \"nat\"")
        );
        assert!(
            bad(r#"{"mode":"user","publishAddress":"hv1.lan","portRange":"1-2"}"#)
                .starts_with("config.hosts[0].network.publishAddress:")
        );
        for range in ["2-1", "0-5", "20000", "1-70000", "a-b"] {
            let m = bad(&format!(
                r#"{{"mode":"user","publishAddress":"127.0.0.1","portRange":"{range}"}}"#
            ));
            assert!(
                m.starts_with("config.hosts[0].network.portRange:"),
                "{range}: {m}"
            );
        }
    }

    #[test]
    fn port_ranges() {
        let r = PortRange::parse("20000-20002").unwrap();
        assert_eq!(r.count(), 3);
        assert!(r.contains(20000) && r.contains(20002) && !r.contains(20003));
        assert_eq!(PortRange::parse("7-7").unwrap().count(), 1);
    }

    #[test]
    fn kernel_boot_fields_are_checked() {
        let mut c = sample();
        let digest = "a".repeat(64);
        let image = c.images.get_mut("debian-12").unwrap();
        image.cmdline = Some("console=ttyS0".into());
        assert!(invalid_message(&c).starts_with(
            "config.images.debian-12.cmdline: set without config.images.debian-12.kernel"
        ));
        let image = c.images.get_mut("debian-12").unwrap();
        image.kernel = Some(BootFile {
            url: "http://127.0.0.1/vmlinuz".into(),
            sha256: digest.clone(),
        });
        image.initrd = Some(BootFile {
            url: "http://127.0.0.1/initrd".into(),
            sha256: "x".into(),
        });
        assert!(invalid_message(&c).starts_with("config.images.debian-12.initrd.sha256:"));
        c.images
            .get_mut("debian-12")
            .unwrap()
            .initrd
            .as_mut()
            .unwrap()
            .sha256 = digest;
        validate(&c).unwrap();
    }

    #[test]
    fn managed_squid_settings_are_checked() {
        let c = sample();
        assert!(c.managed_squid);
        assert_eq!(c.squid().connect_ports, [443]);
        let mut open = sample();
        open.allow_from = vec!["0.0.0.0/0".into()];
        assert!(invalid_message(&open).starts_with("config.allowFrom[0]:"));
        let mut dns = sample();
        dns.dns_nameservers = vec!["dns.lan".into()];
        assert!(invalid_message(&dns).starts_with("config.dnsNameservers[0]:"));
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
                "accessLog",
                "allowDestinations",
                "allowFrom",
                "connectPorts",
                "defaultImage",
                "defaults",
                "denyDestinations",
                "dnsNameservers",
                "domainType",
                "hosts",
                "images",
                "installGuestAgent",
                "managedSquid",
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
