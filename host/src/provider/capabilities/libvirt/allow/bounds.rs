//! What a domain may take of its hypervisor: memory, vCPUs and TCG's translation cache within the
//! grant's limits, and user-mode port forwards only on the grant's publish address and range.

use roxmltree::Node;

use super::text::text;
use crate::provider::capabilities::grants::{DomainLimits, Publish};

/// A user-mode port forward listens on the hypervisor (passt binds it there): only on the
/// grant's publish address, only on ports of its range.
pub(super) fn check_port_forward(
    forward: Node<'_, '_>,
    publish: Option<Publish>,
) -> Result<(), String> {
    let Some(Publish {
        address,
        first,
        last,
    }) = publish
    else {
        return Err("<portForward> listens on the hypervisor and is not granted there; set grants.libvirt.hosts[].publishAddress and portRange".into());
    };
    let given = forward.attribute("address");
    if given.and_then(|a| a.parse::<std::net::IpAddr>().ok()) != Some(address) {
        return Err(format!(
            "<portForward address='{}'> is not the grant's publishAddress {address} (without an address, passt listens on every address of the hypervisor); give address='{address}'",
            given.unwrap_or("")
        ));
    }
    let ranges: Vec<_> = forward
        .children()
        .filter(|n| n.has_tag_name("range"))
        .collect();
    if ranges.is_empty() {
        return Err(format!(
            "<portForward> needs a <range start='…'> within the grant's portRange {first}-{last}"
        ));
    }
    for range in ranges {
        let port = |name: &str| range.attribute(name).map(|v| v.parse::<u16>().ok());
        let start = port("start").flatten();
        let end = port("end").unwrap_or(start);
        match (start, end) {
            (Some(s), Some(e)) if first <= s && s <= e && e <= last => {}
            _ => {
                return Err(format!(
                    "<portForward><range start='{}'{}> is outside the grant's portRange {first}-{last}: these are ports of the hypervisor",
                    range.attribute("start").unwrap_or(""),
                    range
                        .attribute("end")
                        .map(|e| format!(" end='{e}'"))
                        .unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

/// Bytes of a libvirt scaled value (`virScaleInteger`): decimal `digits` in `unit`, KiB when
/// none is given; `None` when it is not one or does not fit.
pub(super) fn scaled_bytes(digits: &str, unit: Option<&str>) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale: u64 = match unit.unwrap_or("KiB") {
        "b" | "bytes" => 1,
        "KiB" | "k" => 1 << 10,
        "KB" => 1000,
        "MiB" | "M" => 1 << 20,
        "MB" => 1_000_000,
        "GiB" | "G" => 1 << 30,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// Memory, vCPUs and the TCG translation cache within the grant's `limits`. A `type='qemu'`
/// domain must bound its translation cache: QEMU's default is 1 GiB of the hypervisor's memory.
pub(super) fn check_bounds(root: Node<'_, '_>, limits: DomainLimits) -> Result<(), String> {
    const MIB: u64 = 1 << 20;
    let mut tb_cache = false;
    for node in root.descendants().filter(Node::is_element) {
        let (what, most, field) = match node.tag_name().name() {
            name @ ("memory" | "currentMemory") if node.parent() == Some(root) => {
                (name, limits.memory_mib, "memoryMib")
            }
            "tb-cache" => {
                tb_cache = true;
                ("tb-cache", limits.tb_cache_mib, "tbCacheMib")
            }
            "vcpu" if node.parent() == Some(root) => {
                let count = |v: &str| {
                    v.parse::<u64>()
                        .ok()
                        .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                };
                for (value, of) in [
                    (Some(text(node)), "<vcpu>"),
                    (
                        node.attribute("current").map(str::to_string),
                        "<vcpu current>",
                    ),
                ] {
                    let Some(value) = value else { continue };
                    match count(&value) {
                        Some(n) if n <= u64::from(limits.vcpus) => {}
                        _ => {
                            return Err(format!(
                                "{of} {value} is more than this hypervisor's grant allows ({}); lower it or raise grants.libvirt.hosts[].limits.vcpus",
                                limits.vcpus
                            ));
                        }
                    }
                }
                continue;
            }
            _ => continue,
        };
        let value = text(node);
        let unit = node.attribute("unit");
        match scaled_bytes(&value, unit) {
            Some(bytes) if bytes <= most * MIB => {}
            Some(_) => {
                return Err(format!(
                    "<{what}{}>{value}</{what}> is more than this hypervisor's grant allows ({most} MiB); lower it or raise grants.libvirt.hosts[].limits.{field}",
                    unit.map(|u| format!(" unit='{u}'")).unwrap_or_default()
                ));
            }
            None => {
                return Err(format!(
                    "<{what}> `{value}` is not a size (decimal digits, with a unit such as unit='MiB')"
                ));
            }
        }
    }
    if root.attribute("type") == Some("qemu") && !tb_cache {
        return Err(format!(
            "<domain type='qemu'> needs <features><tcg><tb-cache unit='MiB'>…</tb-cache></tcg></features> of at most {} MiB: QEMU's default translation cache takes 1 GiB of the hypervisor's memory",
            limits.tb_cache_mib
        ));
    }
    Ok(())
}
