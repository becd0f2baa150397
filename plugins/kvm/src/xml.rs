//! The XML this provider writes (domain, volumes, owner metadata) and the one element it reads
//! back (the owner metadata). Hand-written: the shapes are small and fixed, and an XML crate would
//! cost more wasm than all of this.

use std::fmt::Write as _;

use crate::config::{DomainType, Firmware, ImageFormat, Nic};
use crate::names::{METADATA_PREFIX, METADATA_URI};

/// Escapes `value` for element text and attribute values (either quote). Tab, newline and carriage
/// return become character references so attribute values survive whitespace normalisation;
/// characters XML 1.0 cannot carry at all become U+FFFD.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Undoes [`escape`] and any other predefined-entity or character reference; an unknown or broken
/// reference stays as written.
pub fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest.find(';').and_then(|semi| {
            let entity = &rest[1..semi];
            let c = match entity {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => {
                    let number = if let Some(hex) = entity
                        .strip_prefix("#x")
                        .or_else(|| entity.strip_prefix("#X"))
                    {
                        u32::from_str_radix(hex, 16).ok()
                    } else if let Some(dec) = entity.strip_prefix('#') {
                        dec.parse::<u32>().ok()
                    } else {
                        None
                    };
                    number.and_then(char::from_u32)
                }
            };
            c.map(|c| (c, semi))
        });
        match decoded {
            Some((c, semi)) => {
                out.push(c);
                rest = &rest[semi + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The identity a domain carries in its `<metadata>`, for garbage collection and `get`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub operator_id: String,
    /// The port squid listens on.
    pub port: Option<u16>,
    /// The hypervisor port squid is published on (user-mode networks).
    pub publish_port: Option<u16>,
    /// Seconds since the Unix epoch.
    pub created_at: Option<i64>,
}

/// The owner element: `<po:owner xmlns:po="URI" namespace=".." name=".." uid=".." operator-id=".." port=".." created-at=".."/>`.
pub fn owner_element(owner: &OwnerMeta) -> String {
    let mut out = format!(
        "<{p}:owner xmlns:{p}=\"{uri}\" namespace=\"{}\" name=\"{}\" uid=\"{}\" operator-id=\"{}\"",
        escape(&owner.namespace),
        escape(&owner.name),
        escape(&owner.uid),
        escape(&owner.operator_id),
        p = METADATA_PREFIX,
        uri = METADATA_URI,
    );
    if let Some(port) = owner.port {
        let _ = write!(out, " port=\"{port}\"");
    }
    if let Some(port) = owner.publish_port {
        let _ = write!(out, " publish-port=\"{port}\"");
    }
    if let Some(created_at) = owner.created_at {
        let _ = write!(out, " created-at=\"{created_at}\"");
    }
    out.push_str("/>");
    out
}

/// Reads the owner identity from a `<metadata>` element as libvirt returns it (any prefix, or a
/// default namespace). `None` when there is no `owner` element or it lacks one of namespace,
/// name, uid and operator-id.
pub fn parse_owner(xml: &str) -> Option<OwnerMeta> {
    let attributes = find_element(xml, "owner")?;
    let get = |name: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    Some(OwnerMeta {
        namespace: get("namespace")?,
        name: get("name")?,
        uid: get("uid")?,
        operator_id: get("operator-id")?,
        port: get("port").and_then(|p| p.trim().parse().ok()),
        publish_port: get("publish-port").and_then(|p| p.trim().parse().ok()),
        created_at: get("created-at").and_then(|t| t.trim().parse().ok()),
    })
}

/// The attributes (local names, unescaped values) of the first element whose local name is
/// `local`. Skips comments, CDATA, processing instructions and declarations.
fn find_element(xml: &str, local: &str) -> Option<Vec<(String, String)>> {
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix("!--") {
            rest = &after[after.find("-->")? + 3..];
            continue;
        }
        if let Some(after) = rest.strip_prefix("![CDATA[") {
            rest = &after[after.find("]]>")? + 3..];
            continue;
        }
        if rest.starts_with(['?', '!', '/']) {
            continue;
        }
        let end = rest
            .find(|c: char| c.is_ascii_whitespace() || c == '/' || c == '>')
            .unwrap_or(rest.len());
        let qname = &rest[..end];
        if local_name(qname) == local {
            return parse_attributes(&rest[end..]);
        }
    }
    None
}

fn local_name(qname: &str) -> &str {
    qname.rsplit_once(':').map_or(qname, |(_, l)| l)
}

/// Parses `name="value"` pairs up to the end of a start tag. Namespace declarations are dropped;
/// prefixed attribute names are reduced to their local name.
fn parse_attributes(mut rest: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with(['/', '>']) {
            return Some(out);
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim();
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '>' || c == '<') {
            return None;
        }
        rest = rest[eq + 1..].trim_start();
        let quote = rest.chars().next().filter(|q| *q == '"' || *q == '\'')?;
        rest = &rest[1..];
        let close = rest.find(quote)?;
        let value = unescape(&rest[..close]);
        rest = &rest[close + 1..];
        if name != "xmlns" && !name.starts_with("xmlns:") {
            out.push((local_name(name).to_string(), value));
        }
    }
}

/// Everything the domain XML is made from.
#[derive(Debug, Clone)]
pub struct DomainSpec<'a> {
    pub domain_type: DomainType,
    pub name: &'a str,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub firmware: Firmware,
    /// Path of the qcow2 overlay (from `volume-info`).
    pub root_path: &'a str,
    /// Path of the seed ISO (from `volume-info`).
    pub seed_path: &'a str,
    pub nic: Nic<'a>,
    pub boot: Boot<'a>,
    /// The port squid listens on in the guest (the target of a user-mode port forward).
    pub guest_port: u16,
    pub owner: &'a OwnerMeta,
}

/// How the VM boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boot<'a> {
    /// From the root disk's bootloader.
    Disk,
    /// Direct kernel boot with files from the pool.
    Kernel {
        kernel_path: &'a str,
        initrd_path: Option<&'a str>,
        cmdline: &'a str,
    },
}

/// The domain XML of a proxy VM: q35, UEFI (libvirt picks the firmware) or BIOS, a virtio
/// overlay disk, the seed ISO as a read-only virtio disk (cloud kernels, such as Debian's
/// `linux-image-cloud-amd64`, have no SATA CD-ROM driver; NoCloud finds the seed by its label on
/// any block device), one virtio NIC, a serial console and the
/// guest agent channel, and the owner identity in `<metadata>`.
pub fn domain_xml(d: &DomainSpec<'_>) -> String {
    let mut x = String::with_capacity(2048);
    let _ = writeln!(x, "<domain type='{}'>", d.domain_type.as_str());
    let _ = writeln!(x, "  <name>{}</name>", escape(d.name));
    let _ = writeln!(
        x,
        "  <metadata>\n    {}\n  </metadata>",
        owner_element(d.owner)
    );
    let _ = writeln!(x, "  <memory unit='MiB'>{}</memory>", d.memory_mib);
    let _ = writeln!(x, "  <vcpu placement='static'>{}</vcpu>", d.vcpus);
    match d.firmware {
        Firmware::Uefi => x.push_str("  <os firmware='efi'>\n"),
        Firmware::Bios => x.push_str("  <os>\n"),
    }
    x.push_str("    <type arch='x86_64' machine='q35'>hvm</type>\n");
    match d.boot {
        Boot::Disk => x.push_str("    <boot dev='hd'/>\n"),
        Boot::Kernel {
            kernel_path,
            initrd_path,
            cmdline,
        } => {
            // Secure boot would have the firmware refuse a kernel it is handed directly.
            if d.firmware == Firmware::Uefi {
                x.push_str("    <firmware>\n      <feature enabled='no' name='enrolled-keys'/>\n      <feature enabled='no' name='secure-boot'/>\n    </firmware>\n");
            }
            let _ = writeln!(x, "    <kernel>{}</kernel>", escape(kernel_path));
            if let Some(initrd) = initrd_path {
                let _ = writeln!(x, "    <initrd>{}</initrd>", escape(initrd));
            }
            let _ = writeln!(x, "    <cmdline>{}</cmdline>", escape(cmdline));
        }
    }
    x.push_str("  </os>\n");
    x.push_str("  <features>\n    <acpi/>\n    <apic/>\n");
    if d.domain_type == DomainType::Qemu {
        // TCG's translation cache defaults to 1 GiB of host memory per VM; 128 MiB is plenty for
        // a proxy.
        x.push_str("    <tcg>\n      <tb-cache unit='MiB'>128</tb-cache>\n    </tcg>\n");
    }
    x.push_str("  </features>\n");
    if d.domain_type == DomainType::Kvm {
        x.push_str("  <cpu mode='host-passthrough' check='none'/>\n");
    }
    x.push_str("  <clock offset='utc'/>\n");
    x.push_str("  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n");
    x.push_str("  <devices>\n");
    let _ = writeln!(
        x,
        "    <disk type='file' device='disk'>\n      <driver name='qemu' type='qcow2' discard='unmap'/>\n      <source file='{}'/>\n      <target dev='vda' bus='virtio'/>\n    </disk>",
        escape(d.root_path)
    );
    let _ = writeln!(
        x,
        "    <disk type='file' device='disk'>\n      <driver name='qemu' type='raw'/>\n      <source file='{}'/>\n      <target dev='vdb' bus='virtio'/>\n      <readonly/>\n    </disk>",
        escape(d.seed_path)
    );
    match d.nic {
        Nic::Network(network) => {
            let _ = writeln!(
                x,
                "    <interface type='network'>\n      <source network='{}'/>\n      <model type='virtio'/>\n    </interface>",
                escape(network)
            );
        }
        Nic::Bridge(bridge) => {
            let _ = writeln!(
                x,
                "    <interface type='bridge'>\n      <source bridge='{}'/>\n      <model type='virtio'/>\n    </interface>",
                escape(bridge)
            );
        }
        Nic::User { address, port } => {
            let _ = writeln!(
                x,
                "    <interface type='user'>\n      <backend type='passt'/>\n      <portForward proto='tcp' address='{}'>\n        <range start='{port}' to='{}'/>\n      </portForward>\n      <model type='virtio'/>\n    </interface>",
                escape(address),
                d.guest_port
            );
        }
    }
    x.push_str("    <serial type='pty'/>\n    <console type='pty'/>\n");
    x.push_str("    <channel type='unix'>\n      <target type='virtio' name='org.qemu.guest_agent.0'/>\n    </channel>\n");
    x.push_str("    <rng model='virtio'>\n      <backend model='random'>/dev/urandom</backend>\n    </rng>\n");
    x.push_str("  </devices>\n</domain>\n");
    x
}

/// A qcow2 overlay volume of `capacity` bytes over the base image at `base_path`.
pub fn overlay_volume_xml(
    name: &str,
    capacity: u64,
    base_path: &str,
    base_format: ImageFormat,
) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <target>\n    <format type='qcow2'/>\n  </target>\n  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n</volume>\n",
        escape(name),
        escape(base_path),
        base_format.as_str()
    )
}

/// A raw volume of `capacity` bytes (the seed ISO is uploaded into it).
pub fn raw_volume_xml(name: &str, capacity: u64) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <allocation unit='bytes'>{capacity}</allocation>\n  <target>\n    <format type='raw'/>\n  </target>\n</volume>\n",
        escape(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> OwnerMeta {
        let o = crate::testing::owner();
        OwnerMeta {
            namespace: o.namespace,
            name: o.name,
            uid: o.uid,
            operator_id: o.operator_id,
            port: Some(8080),
            publish_port: None,
            created_at: Some(1_700_000_123),
        }
    }

    #[test]
    fn escape_and_unescape_round_trip() {
        let nasty = "a<b>&\"c\" 'd'\t\n\r é";
        let escaped = escape(nasty);
        assert_eq!(
            escaped,
            "a&lt;b&gt;&amp;&quot;c&quot; &apos;d&apos;&#9;&#10;&#13; é"
        );
        assert_eq!(unescape(&escaped), nasty);
        assert_eq!(escape("a\u{1}b"), "a\u{FFFD}b");
        assert_eq!(
            unescape("&#x41;&#66;&unknown; & &amp"),
            "AB&unknown; & &amp"
        );
    }

    #[test]
    fn owner_element_is_escaped_and_parses_back() {
        let o = owner();
        let el = owner_element(&o);
        assert_eq!(
            el,
            "<po:owner xmlns:po=\"https://proxy-operator.dev/xmlns/kvm/1\" namespace=\"crawlers\" name=\"egress-&lt;1&gt;&amp;&quot;q&quot;\" uid=\"5f0c6e1a-9a4b-4a35-b1f6-0d2c1e7c9a11\" operator-id=\"op&apos;s-1\" port=\"8080\" created-at=\"1700000123\"/>"
        );
        assert_eq!(parse_owner(&el), Some(o));
    }

    #[test]
    fn owner_parses_as_libvirt_returns_it() {
        // virDomainGetMetadata may re-serialise with a default namespace, another prefix, single
        // quotes, and without the optional attributes.
        let default_ns = "<owner xmlns=\"https://proxy-operator.dev/xmlns/kvm/1\" namespace=\"ns\" name=\"p&amp;1\" uid=\"u\" operator-id=\"op\"/>";
        let parsed = parse_owner(default_ns).unwrap();
        assert_eq!(parsed.name, "p&1");
        assert_eq!(parsed.port, None);
        assert_eq!(parsed.created_at, None);

        let other_prefix = "<?xml version='1.0'?><!-- made by <po:owner> --><x:owner xmlns:x='https://proxy-operator.dev/xmlns/kvm/1'\n   namespace='ns' name='a&gt;b' uid='u' x:operator-id='op' port='3129' created-at='12'></x:owner>";
        let parsed = parse_owner(other_prefix).unwrap();
        assert_eq!(parsed.name, "a>b");
        assert_eq!(parsed.operator_id, "op");
        assert_eq!(parsed.port, Some(3129));
        assert_eq!(parsed.created_at, Some(12));
    }

    #[test]
    fn incomplete_or_foreign_metadata_is_no_owner() {
        assert_eq!(parse_owner(""), None);
        assert_eq!(parse_owner("<owner namespace='a' name='b' uid='c'/>"), None);
        assert_eq!(
            parse_owner("<owners namespace='a' name='b' uid='c' operator-id='d'/>"),
            None
        );
        assert_eq!(parse_owner("<owner namespace='a"), None);
    }

    fn spec<'a>(owner: &'a OwnerMeta, firmware: Firmware, nic: Nic<'a>) -> DomainSpec<'a> {
        DomainSpec {
            domain_type: DomainType::Kvm,
            name: "px-0123456789abcdef",
            vcpus: 2,
            memory_mib: 2048,
            firmware,
            root_path: "/var/lib/libvirt/images/px-0123456789abcdef-root.qcow2",
            seed_path: "/var/lib/libvirt/images/it's & <seed>.iso",
            nic,
            boot: Boot::Disk,
            guest_port: 3128,
            owner,
        }
    }

    #[test]
    fn uefi_domain_xml() {
        let o = owner();
        let xml = domain_xml(&spec(&o, Firmware::Uefi, Nic::Network("default")));
        for needle in [
            "<domain type='kvm'>",
            "<name>px-0123456789abcdef</name>",
            "<memory unit='MiB'>2048</memory>",
            "<vcpu placement='static'>2</vcpu>",
            "<os firmware='efi'>",
            "<type arch='x86_64' machine='q35'>hvm</type>",
            "<source file='/var/lib/libvirt/images/px-0123456789abcdef-root.qcow2'/>",
            "<source file='/var/lib/libvirt/images/it&apos;s &amp; &lt;seed&gt;.iso'/>",
            "<target dev='vdb' bus='virtio'/>\n      <readonly/>",
            "<interface type='network'>\n      <source network='default'/>\n      <model type='virtio'/>",
            "<serial type='pty'/>",
            "<console type='pty'/>",
            "<target type='virtio' name='org.qemu.guest_agent.0'/>",
            "name=\"egress-&lt;1&gt;&amp;&quot;q&quot;\"",
            "operator-id=\"op&apos;s-1\"",
        ] {
            assert!(xml.contains(needle), "missing {needle:?} in\n{xml}");
        }
        // The metadata inside the domain parses back to the same owner.
        let start = xml.find("<metadata>").unwrap();
        let end = xml.find("</metadata>").unwrap();
        assert_eq!(parse_owner(&xml[start..end]), Some(o));
        assert_eq!(xml.matches("<disk ").count(), 2);
    }

    #[test]
    fn bios_qemu_bridge_domain_xml() {
        let o = owner();
        let mut s = spec(&o, Firmware::Bios, Nic::Bridge("br0"));
        s.domain_type = DomainType::Qemu;
        let xml = domain_xml(&s);
        assert!(xml.starts_with("<domain type='qemu'>"));
        assert!(xml.contains(
            "  <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    <boot dev='hd'/>"
        ));
        assert!(!xml.contains("firmware="));
        assert!(
            !xml.contains("host-passthrough"),
            "TCG cannot pass the host CPU through"
        );
        assert!(xml.contains("<interface type='bridge'>\n      <source bridge='br0'/>"));
    }

    #[test]
    fn direct_kernel_boot_on_a_user_mode_network() {
        let mut o = owner();
        o.publish_port = Some(20001);
        let mut s = spec(
            &o,
            Firmware::Uefi,
            Nic::User {
                address: "127.0.0.1",
                port: 20001,
            },
        );
        s.domain_type = DomainType::Qemu;
        s.boot = Boot::Kernel {
            kernel_path: "/pool/base-k-kernel-0123",
            initrd_path: Some("/pool/base-k-initrd-4567"),
            cmdline: "root=/dev/vda rw console=ttyS0 a<b",
        };
        let xml = domain_xml(&s);
        for needle in [
            "<os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    <firmware>\n      <feature enabled='no' name='enrolled-keys'/>\n      <feature enabled='no' name='secure-boot'/>\n    </firmware>\n    <kernel>/pool/base-k-kernel-0123</kernel>\n    <initrd>/pool/base-k-initrd-4567</initrd>\n    <cmdline>root=/dev/vda rw console=ttyS0 a&lt;b</cmdline>\n  </os>",
            "<tcg>\n      <tb-cache unit='MiB'>128</tb-cache>\n    </tcg>",
            "<interface type='user'>\n      <backend type='passt'/>\n      <portForward proto='tcp' address='127.0.0.1'>\n        <range start='20001' to='3128'/>\n      </portForward>",
            "publish-port=\"20001\"",
        ] {
            assert!(xml.contains(needle), "missing {needle:?} in\n{xml}");
        }
        assert!(
            !xml.contains("<boot dev="),
            "a direct boot has no boot device"
        );
        let start = xml.find("<metadata>").unwrap();
        let end = xml.find("</metadata>").unwrap();
        assert_eq!(
            parse_owner(&xml[start..end]).unwrap().publish_port,
            Some(20001)
        );
        // BIOS needs no firmware features; disk boot keeps its boot device.
        s.firmware = Firmware::Bios;
        assert!(!domain_xml(&s).contains("<firmware>"));
    }

    #[test]
    fn volume_xml() {
        let xml = overlay_volume_xml(
            "px-1-root.qcow2",
            10 << 30,
            "/pool/base-debian-12.qcow2",
            ImageFormat::Qcow2,
        );
        assert!(xml.contains("<name>px-1-root.qcow2</name>"));
        assert!(xml.contains("<capacity unit='bytes'>10737418240</capacity>"));
        assert!(xml.contains("<target>\n    <format type='qcow2'/>"));
        assert!(xml.contains(
            "<backingStore>\n    <path>/pool/base-debian-12.qcow2</path>\n    <format type='qcow2'/>\n  </backingStore>"
        ));
        let raw = overlay_volume_xml("r", 1, "/p/base-x.raw", ImageFormat::Raw);
        assert!(raw.contains("<path>/p/base-x.raw</path>\n    <format type='raw'/>"));
        let seed = raw_volume_xml("px-1-seed.iso", 374_784);
        assert!(seed.contains("<name>px-1-seed.iso</name>"));
        assert!(seed.contains("<capacity unit='bytes'>374784</capacity>"));
        assert!(seed.contains("<format type='raw'/>"));
    }
}
