//! The allow-lists of the XML a plugin hands libvirt (`define-domain`, `create-volume`): only the
//! elements and attributes a proxy VM needs pass, everything else is refused with the element or
//! attribute named. libvirt would accept far more (a host block device as a disk, `<hostdev>`,
//! `qemu:commandline`, an emulator of the plugin's choice), and acts on it as root on the
//! hypervisor. Pure functions: the caller passes what the grant allows and the pools' paths.

use roxmltree::{Document, Node};

use super::owner::{HOST_METADATA_URI, OwnerMark};
use crate::provider::capabilities::grants::{DomainLimits, Publish};

mod bounds;
mod images;
mod qcow2;
mod text;
use bounds::{check_bounds, check_port_forward};
use images::pool_of;
pub use images::{Disk, VolumeImage, chain_problem, volume_image};
pub use qcow2::{FIRST_READ as QCOW2_FIRST_READ, head_length as qcow2_head_length};
use text::{string_value, text};

/// What one provider instance's grant lets a domain use on one hypervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainPolicy {
    /// Name and target directory of each granted pool (its volumes are the only disks).
    pub pools: Vec<(String, String)>,
    pub networks: Vec<String>,
    pub bridges: Vec<String>,
    pub user_networking: bool,
    /// Where a user-mode `<portForward>` may listen (`publishAddress`, `portRange`).
    pub publish: Option<Publish>,
    pub limits: DomainLimits,
    /// What the names of this provider instance's volumes start with (`volume_prefix`).
    pub volume_prefix: String,
}

/// A domain definition that passed: its name, and the XML with the host's owner mark in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedDomain {
    pub name: String,
    pub xml: String,
    /// Its disks, whose images the caller checks with [`chain_problem`].
    pub disks: Vec<Disk>,
}

/// Allowed values of an attribute.
#[derive(Debug, Clone, Copy)]
enum Values {
    /// Anything libvirt takes there (checked below where it matters).
    Any,
    /// Decimal digits.
    Number,
    OneOf(&'static [&'static str]),
}
use Values::{Any, Number, OneOf};

/// An element (its path from the root) and the attributes it may have.
type Rule = (&'static str, &'static [(&'static str, Values)]);

const UNIT: Values = OneOf(&[
    "b", "bytes", "KiB", "MiB", "GiB", "KB", "MB", "GB", "k", "M", "G",
]);
const YES_NO: Values = OneOf(&["yes", "no"]);
/// The channels a domain may have: libvirt makes each one's socket in the domain's own
/// directory, at a path built from the target name, so only names known to be plain pass.
const CHANNEL_NAMES: &[&str] = &["org.qemu.guest_agent.0"];

/// What a proxy VM needs. What is not here is refused.
const DOMAIN_RULES: &[Rule] = &[
    ("domain", &[("type", OneOf(&["qemu", "kvm"]))]),
    ("domain/name", &[]),
    ("domain/title", &[]),
    ("domain/description", &[]),
    ("domain/metadata", &[]),
    ("domain/memory", &[("unit", UNIT)]),
    ("domain/currentMemory", &[("unit", UNIT)]),
    (
        "domain/vcpu",
        &[("placement", OneOf(&["static"])), ("current", Number)],
    ),
    ("domain/os", &[("firmware", OneOf(&["efi"]))]),
    (
        "domain/os/type",
        &[("arch", OneOf(&["x86_64", "aarch64"])), ("machine", Any)],
    ),
    (
        "domain/os/boot",
        &[("dev", OneOf(&["hd", "cdrom", "network"]))],
    ),
    ("domain/os/firmware", &[]),
    (
        "domain/os/firmware/feature",
        &[
            ("enabled", YES_NO),
            ("name", OneOf(&["enrolled-keys", "secure-boot"])),
        ],
    ),
    ("domain/os/kernel", &[]),
    ("domain/os/initrd", &[]),
    ("domain/os/cmdline", &[]),
    ("domain/features", &[]),
    ("domain/features/acpi", &[]),
    ("domain/features/apic", &[]),
    ("domain/features/pae", &[]),
    ("domain/features/tcg", &[]),
    ("domain/features/tcg/tb-cache", &[("unit", UNIT)]),
    (
        "domain/cpu",
        &[
            ("mode", OneOf(&["host-passthrough", "host-model"])),
            ("check", OneOf(&["none", "partial", "full"])),
        ],
    ),
    ("domain/clock", &[("offset", OneOf(&["utc", "localtime"]))]),
    ("domain/on_poweroff", &[]),
    ("domain/on_reboot", &[]),
    ("domain/on_crash", &[]),
    ("domain/devices", &[]),
    (
        "domain/devices/disk",
        &[
            ("type", OneOf(&["file"])),
            ("device", OneOf(&["disk", "cdrom"])),
        ],
    ),
    (
        "domain/devices/disk/driver",
        &[
            ("name", OneOf(&["qemu"])),
            ("type", OneOf(&["raw", "qcow2"])),
            ("discard", OneOf(&["unmap", "ignore"])),
            (
                "cache",
                OneOf(&["none", "writeback", "writethrough", "directsync", "unsafe"]),
            ),
        ],
    ),
    ("domain/devices/disk/source", &[("file", Any)]),
    (
        "domain/devices/disk/target",
        &[("dev", Any), ("bus", OneOf(&["virtio", "sata", "scsi"]))],
    ),
    ("domain/devices/disk/readonly", &[]),
    (
        "domain/devices/interface",
        &[("type", OneOf(&["network", "bridge", "user"]))],
    ),
    (
        "domain/devices/interface/source",
        &[("network", Any), ("bridge", Any)],
    ),
    (
        "domain/devices/interface/model",
        &[("type", OneOf(&["virtio", "e1000", "rtl8139"]))],
    ),
    (
        "domain/devices/interface/backend",
        &[("type", OneOf(&["passt"]))],
    ),
    (
        "domain/devices/interface/portForward",
        &[("proto", OneOf(&["tcp", "udp"])), ("address", Any)],
    ),
    (
        "domain/devices/interface/portForward/range",
        &[("start", Number), ("to", Number), ("end", Number)],
    ),
    ("domain/devices/serial", &[("type", OneOf(&["pty"]))]),
    ("domain/devices/serial/target", &[("port", Number)]),
    ("domain/devices/console", &[("type", OneOf(&["pty"]))]),
    (
        "domain/devices/console/target",
        &[("type", OneOf(&["serial", "virtio"])), ("port", Number)],
    ),
    ("domain/devices/channel", &[("type", OneOf(&["unix"]))]),
    (
        "domain/devices/channel/target",
        &[("type", OneOf(&["virtio"])), ("name", Any)],
    ),
    ("domain/devices/rng", &[("model", OneOf(&["virtio"]))]),
    (
        "domain/devices/rng/backend",
        &[("model", OneOf(&["random"]))],
    ),
    (
        "domain/devices/memballoon",
        &[("model", OneOf(&["virtio", "none"]))],
    ),
];

/// What a plain file volume needs: no `<target><path>`, no permissions, a backing store only
/// inside the pool.
const VOLUME_RULES: &[Rule] = &[
    ("volume", &[("type", OneOf(&["file"]))]),
    ("volume/name", &[]),
    ("volume/capacity", &[("unit", UNIT)]),
    ("volume/allocation", &[("unit", UNIT)]),
    ("volume/target", &[]),
    (
        "volume/target/format",
        &[("type", OneOf(&["raw", "qcow2"]))],
    ),
    ("volume/target/compat", &[]),
    ("volume/target/features", &[]),
    ("volume/target/features/lazy_refcounts", &[]),
    ("volume/target/nocow", &[]),
    ("volume/backingStore", &[]),
    ("volume/backingStore/path", &[]),
    (
        "volume/backingStore/format",
        &[("type", OneOf(&["raw", "qcow2"]))],
    ),
];

/// Why an element is refused, for the ones known to be escapes.
fn known_escape(path: &str, name: &str) -> Option<&'static str> {
    Some(match (path, name) {
        ("domain/devices", "hostdev") => {
            "host devices (<hostdev>) hand the hypervisor's hardware to the guest and are never allowed"
        }
        ("domain/devices", "emulator") => {
            "the emulator is the hypervisor's own; <emulator> cannot be set"
        }
        ("domain/devices", "filesystem") => {
            "filesystem passthrough (<filesystem>) shares the hypervisor's files with the guest and is never allowed"
        }
        ("domain/os", "loader" | "nvram") => {
            "firmware files are chosen by libvirt (use <os firmware='efi'>); <loader> and <nvram> cannot be set"
        }
        ("domain/devices/channel", "source") => {
            "<channel><source> names a socket path on the hypervisor, in directories every domain shares; leave <source> out and libvirt makes the socket in this domain's own directory"
        }
        ("domain/devices/interface", "mac") => {
            "<interface><mac> is libvirt's to choose: an address of the plugin's choice can equal another domain's on the same network; remove <mac>"
        }
        ("domain", "uuid") => {
            "libvirt picks the UUID, so a definition can never replace a domain it did not make; remove <uuid>"
        }
        _ => return None,
    })
}

fn parse(xml: &str) -> Result<Document<'_>, String> {
    // roxmltree refuses a DTD (so no entity a second parser could read otherwise).
    Document::parse(xml).map_err(|e| format!("the XML does not parse: {e}"))
}

/// Checks `node`'s attributes, then its child elements, against `rules`. `<metadata>` is left to
/// [`check_metadata`] (libvirt keeps it without acting on it).
fn check_tree(node: Node<'_, '_>, path: &str, rules: &[Rule]) -> Result<(), String> {
    let Some((_, attributes)) = rules.iter().find(|(p, _)| *p == path) else {
        return Err(format!("<{path}> is not allowed"));
    };
    for attribute in node.attributes() {
        if let Some(ns) = attribute.namespace() {
            return Err(format!(
                "attribute `{}` of namespace {ns} on <{path}> is not allowed",
                attribute.name()
            ));
        }
        let Some((_, values)) = attributes.iter().find(|(a, _)| *a == attribute.name()) else {
            return Err(format!(
                "attribute `{}` on <{path}> is not allowed (allowed: {})",
                attribute.name(),
                names(attributes.iter().map(|(a, _)| *a))
            ));
        };
        check_value(path, attribute.name(), attribute.value(), *values)?;
    }
    if path == "domain/metadata" {
        return check_metadata(node);
    }
    for child in node.children().filter(Node::is_element) {
        let tag = child.tag_name();
        if let Some(ns) = tag.namespace() {
            return Err(format!(
                "<{}> of namespace {ns} in <{path}> is not allowed: libvirt hands foreign elements (such as qemu:commandline) to the hypervisor unchecked",
                tag.name()
            ));
        }
        if let Some(why) = known_escape(path, tag.name()) {
            return Err(why.to_string());
        }
        check_tree(child, &format!("{path}/{}", tag.name()), rules)?;
    }
    Ok(())
}

fn check_value(path: &str, name: &str, value: &str, values: Values) -> Result<(), String> {
    let ok = match values {
        Any => true,
        Number => !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        OneOf(allowed) => allowed.contains(&value),
    };
    if ok {
        return Ok(());
    }
    let allowed = match values {
        OneOf(allowed) => names(allowed.iter().copied()),
        _ => "a number".to_string(),
    };
    Err(format!(
        "<{path} {name}='{value}'> is not allowed (allowed: {allowed})"
    ))
}

fn names<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let list: Vec<&str> = items.collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// A plugin's metadata: elements of its own namespaces, never the host's (its owner mark).
fn check_metadata(metadata: Node<'_, '_>) -> Result<(), String> {
    for element in metadata.descendants().filter(Node::is_element).skip(1) {
        if element.tag_name().namespace() == Some(HOST_METADATA_URI) {
            return Err(format!(
                "<metadata> may not carry the host's namespace {HOST_METADATA_URI}: the host writes the owner mark itself"
            ));
        }
    }
    for child in metadata.children().filter(Node::is_element) {
        if child.tag_name().namespace().is_none() {
            return Err(format!(
                "<metadata><{}> needs a namespace of the plugin's own (libvirt keeps one element per namespace URI)",
                child.tag_name().name()
            ));
        }
    }
    Ok(())
}

/// The text of `node` as libvirt reads it (XPath `string()`: every text node inside it, so a
/// comment cannot split what is checked from what libvirt uses).
fn pools_named(policy: &DomainPolicy) -> String {
    names(policy.pools.iter().map(|(name, _)| name.as_str()))
}

/// Disks, kernel and initrd: files of granted pools only. Returns the disks.
fn check_files(root: Node<'_, '_>, policy: &DomainPolicy) -> Result<Vec<Disk>, String> {
    let not_in_pool = |what: &str, path: &str| {
        format!(
            "{what} `{path}` is not a volume of this provider instance in a granted pool ({}); create it with create-volume or import-image in a pool listed in grants.libvirt.hosts[].pools and use the path they answer",
            pools_named(policy)
        )
    };
    let mut disks = Vec::new();
    for node in root.descendants().filter(Node::is_element) {
        let parent = node.parent_element();
        match (parent.map(|p| p.tag_name().name()), node.tag_name().name()) {
            (Some("disk"), "source") => {
                let file = node.attribute("file").unwrap_or("");
                let Some(pool) = pool_of(file, &policy.pools, &policy.volume_prefix) else {
                    return Err(not_in_pool("<disk><source file>", file));
                };
                let format = parent
                    .and_then(|d| d.children().find(|n| n.has_tag_name("driver")))
                    .and_then(|d| d.attribute("type"))
                    .unwrap_or("raw");
                disks.push(Disk {
                    path: file.to_string(),
                    pool: pool.to_string(),
                    format: format.to_string(),
                });
            }
            // Untrimmed: libvirt hands QEMU the path as written.
            (Some("os"), what @ ("kernel" | "initrd"))
                if pool_of(&string_value(node), &policy.pools, &policy.volume_prefix).is_none() =>
            {
                return Err(not_in_pool(&format!("<{what}>"), &string_value(node)));
            }
            _ => {}
        }
    }
    Ok(disks)
}

/// Interfaces only of the granted networks and bridges, user mode only when granted.
fn check_interface(interface: Node<'_, '_>, policy: &DomainPolicy) -> Result<(), String> {
    let kind = interface.attribute("type").unwrap_or("");
    let source = interface.children().find(|n| n.has_tag_name("source"));
    let (network, bridge) = (
        source.and_then(|s| s.attribute("network")),
        source.and_then(|s| s.attribute("bridge")),
    );
    let user_only = interface
        .children()
        .find(|n| n.has_tag_name("backend") || n.has_tag_name("portForward"));
    match kind {
        "network" => match network {
            Some(n) if bridge.is_none() && policy.networks.iter().any(|g| g == n) => {}
            _ => {
                return Err(format!(
                    "<interface type='network'> on network `{}` is not granted (granted: {}); add it to grants.libvirt.hosts[].networks",
                    network.unwrap_or(""),
                    names(policy.networks.iter().map(String::as_str))
                ));
            }
        },
        "bridge" => match bridge {
            Some(b) if network.is_none() && policy.bridges.iter().any(|g| g == b) => {}
            _ => {
                return Err(format!(
                    "<interface type='bridge'> on bridge `{}` is not granted (granted: {}); add it to grants.libvirt.hosts[].bridges",
                    bridge.unwrap_or(""),
                    names(policy.bridges.iter().map(String::as_str))
                ));
            }
        },
        _ if source.is_some() => {
            return Err("<interface type='user'> takes no <source>".into());
        }
        _ if !policy.user_networking => {
            return Err("<interface type='user'> is not granted; set grants.libvirt.hosts[].userNetworking: true".into());
        }
        _ => {}
    }
    if kind != "user"
        && let Some(node) = user_only
    {
        return Err(format!(
            "<interface type='{kind}'><{}> is for user-mode interfaces only",
            node.tag_name().name()
        ));
    }
    for forward in interface
        .children()
        .filter(|n| n.has_tag_name("portForward"))
    {
        check_port_forward(forward, policy.publish)?;
    }
    Ok(())
}

/// Channels only as libvirt makes them (no `<source>`, see [`known_escape`]; a virtio target of
/// a known name); the rng only from the kernel's devices.
fn check_devices(root: Node<'_, '_>, policy: &DomainPolicy) -> Result<(), String> {
    for node in root.descendants().filter(Node::is_element) {
        let parent = node.parent_element().map(|p| p.tag_name().name());
        match (parent, node.tag_name().name()) {
            (Some("devices"), "interface") => check_interface(node, policy)?,
            (Some("devices"), "channel") => {
                let target = single(node, "target")?;
                let name = target.and_then(|t| t.attribute("name")).unwrap_or("");
                let virtio = target.and_then(|t| t.attribute("type")) == Some("virtio");
                if !virtio || !CHANNEL_NAMES.contains(&name) {
                    return Err(format!(
                        "<channel><target type='virtio' name='{name}'> is not allowed (allowed names: {}): libvirt makes the channel's socket at a path built from the name",
                        CHANNEL_NAMES.join(", ")
                    ));
                }
            }
            (Some("rng"), "backend")
                if !matches!(string_value(node).as_str(), "/dev/urandom" | "/dev/random") =>
            {
                return Err(format!(
                    "<rng><backend> `{}` is not allowed (allowed: /dev/urandom, /dev/random)",
                    string_value(node)
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The one child element `name` of `node`, refusing a second.
fn single<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Result<Option<Node<'a, 'i>>, String> {
    let mut found = node.children().filter(|n| n.has_tag_name(name));
    let first = found.next();
    if found.next().is_some() {
        return Err(format!("<{name}> is given twice"));
    }
    Ok(first)
}

/// Checks a plugin's domain XML against the allow-list and the grant, and writes the host's
/// owner `mark` into its `<metadata>`. The error names what is refused and how to fix it.
pub fn check_domain(
    xml: &str,
    policy: &DomainPolicy,
    mark: &OwnerMark,
) -> Result<CheckedDomain, String> {
    let doc = parse(xml)?;
    let root = doc.root_element();
    if root.tag_name().namespace().is_some() || root.tag_name().name() != "domain" {
        return Err("the root element must be <domain>".into());
    }
    check_tree(root, "domain", DOMAIN_RULES)?;
    let name = match single(root, "name")? {
        Some(name) if !text(name).is_empty() => text(name),
        _ => return Err("<name> is missing".into()),
    };
    let disks = check_files(root, policy)?;
    check_devices(root, policy)?;
    check_bounds(root, policy.limits)?;
    let element = mark.element();
    let xml = match single(root, "metadata")? {
        Some(metadata) => insert_into(xml, metadata.range(), &element, "metadata"),
        None => insert_into(
            xml,
            root.range(),
            &format!("<metadata>{element}</metadata>"),
            "domain",
        ),
    };
    Ok(CheckedDomain { name, xml, disks })
}

/// The disks of a defined domain's XML as libvirt answers it (with its own additions, so not
/// checked against the allow-list again), for `start-domain` to check their images: a qcow2
/// header can have been rewritten since the definition.
pub fn disks_of(xml: &str, policy: &DomainPolicy) -> Result<Vec<Disk>, String> {
    let doc = parse(xml)?;
    let devices = doc
        .root_element()
        .children()
        .filter(|n| n.has_tag_name("devices"));
    let disks = devices.flat_map(|d| d.children().filter(|n| n.has_tag_name("disk")));
    let mut found = Vec::new();
    for disk in disks {
        let Some(source) = disk.children().find(|n| n.has_tag_name("source")) else {
            continue;
        };
        let file = source.attribute("file").unwrap_or("");
        let Some(pool) = pool_of(file, &policy.pools, &policy.volume_prefix) else {
            return Err(format!(
                "the disk `{file}` is not a volume of this provider instance in a granted pool"
            ));
        };
        let format = disk
            .children()
            .find(|n| n.has_tag_name("driver"))
            .and_then(|d| d.attribute("type"))
            .unwrap_or("raw");
        found.push(Disk {
            path: file.to_string(),
            pool: pool.to_string(),
            format: format.to_string(),
        });
    }
    Ok(found)
}

/// `xml` with `content` added at the end of the element spanning `range` (before its end tag;
/// a self-closing `<tag/>` is opened). The element has no attributes where it is self-closing
/// (the rules give `<metadata>` none, and `<domain/>` has no name).
fn insert_into(xml: &str, range: std::ops::Range<usize>, content: &str, tag: &str) -> String {
    let element = &xml[range.clone()];
    if element.ends_with("/>") {
        return format!(
            "{}<{tag}>{content}</{tag}>{}",
            &xml[..range.start],
            &xml[range.end..]
        );
    }
    // An end tag holds no `<`: the last one in the element starts it.
    let end_tag = range.start + element.rfind("</").unwrap_or(element.len());
    format!("{}{content}{}", &xml[..end_tag], &xml[end_tag..])
}

/// A volume definition that passed: the name libvirt gets (with the owner prefix), and the XML
/// with that name in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedVolume {
    pub real_name: String,
    pub xml: String,
}

/// Checks a plugin's volume XML for `create-volume` in `pool` (target directory `pool_path`,
/// `None` for a pool without one): the allow-list, and a backing store only of this provider
/// instance's volumes (names with `prefix`) in the pool. The volume's name gets `prefix`.
pub fn check_volume(
    xml: &str,
    pool: &str,
    pool_path: Option<&str>,
    prefix: &str,
) -> Result<CheckedVolume, String> {
    let doc = parse(xml)?;
    let root = doc.root_element();
    if root.tag_name().namespace().is_some() || root.tag_name().name() != "volume" {
        return Err("the root element must be <volume>".into());
    }
    check_tree(root, "volume", VOLUME_RULES)?;
    let Some(name_node) = single(root, "name")? else {
        return Err("<name> is missing".into());
    };
    // One text node, so it can be replaced by the host's name as a whole.
    let (Some(text_node), 1) = (name_node.first_child(), name_node.children().count()) else {
        return Err("<name> must hold the name as plain text".into());
    };
    let name = text(name_node);
    if !text_node.is_text() || !is_volume_name(&name) {
        return Err(format!(
            "<name> `{name}` is not a volume name (1 to 200 characters, no '/')"
        ));
    }
    if let Some(backing) = single(root, "backingStore")? {
        let path = single(backing, "path")?
            .map(string_value)
            .unwrap_or_default();
        let path = path.as_str();
        let pools = pool_path
            .map(|p| vec![(pool.to_string(), p.to_string())])
            .unwrap_or_default();
        if pool_of(path, &pools, prefix).is_none() {
            return Err(format!(
                "<backingStore><path> `{path}` is not a volume of this provider instance in pool {pool}; a backing store must be one of its volumes in the same pool"
            ));
        }
    }
    let real_name = format!("{prefix}{name}");
    let range = text_node.range();
    let xml = format!(
        "{}{}{}",
        &xml[..range.start],
        super::xml::xml_escape(&real_name),
        &xml[range.end..]
    );
    Ok(CheckedVolume { real_name, xml })
}

/// A name a plugin may give a volume (the host adds its owner prefix in front).
pub fn is_volume_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && !name.contains('/') && name != "." && name != ".."
}

#[cfg(test)]
mod tests;
