//! What a Proxy asks for, resolved against the config: the host, the image, the size.

use proxy_operator_sdk::ProviderError;
use proxy_operator_sdk::squid;

use crate::config::{
    Config, DEFAULT_CMDLINE, Defaults, Firmware, HostConfig, ImageConfig, ImageFormat, MEMORY_MIB,
    VCPUS,
};
use crate::config::{is_http_url, is_sha256};
use crate::names::{base_volume_for_digest, base_volume_for_key, boot_file_volume, fnv1a};

/// The port squid listens on when the spec gives none.
pub const DEFAULT_PORT: u16 = 3128;

/// Chooses the host for a Proxy: the hosts of `zone` (all hosts without one), then one of them by
/// a stable hash of the owner's UID, so a retried create lands on the same host.
pub fn choose_host<'a>(
    config: &'a Config,
    zone: Option<&str>,
    owner_uid: &str,
) -> Result<&'a HostConfig, ProviderError> {
    let zone = zone.filter(|z| !z.is_empty());
    let candidates: Vec<&HostConfig> = match zone {
        None => config.hosts.iter().collect(),
        Some(zone) => config
            .hosts
            .iter()
            .filter(|h| h.zone.as_deref() == Some(zone))
            .collect(),
    };
    if candidates.is_empty() {
        let mut zones: Vec<&str> = config
            .hosts
            .iter()
            .filter_map(|h| h.zone.as_deref())
            .collect();
        zones.sort_unstable();
        zones.dedup();
        let known = if zones.is_empty() {
            "no host in the provider config has a zone".to_string()
        } else {
            format!("the provider config has zones: {}", zones.join(", "))
        };
        return Err(ProviderError::Permanent(format!(
            "spec.placement.zone: no host is in zone {:?} ({known}); use one of those zones or add hosts to the provider config",
            zone.unwrap_or_default()
        )));
    }
    let index = (fnv1a(owner_uid.as_bytes()) % candidates.len() as u64) as usize;
    Ok(candidates[index])
}

/// The hosts `create` looks on for a domain named like the one it is asked for, before making
/// one: `chosen` first (where a retry almost always finds it), then every other configured host,
/// whatever its zone. An earlier try may have made the domain on the host the config pointed at
/// then (hosts added, removed or reordered since); the contract says create returns that one
/// instead of making a second.
pub fn search_order<'a>(config: &'a Config, chosen: &'a HostConfig) -> Vec<&'a HostConfig> {
    std::iter::once(chosen)
        .chain(config.hosts.iter().filter(|h| h.name != chosen.name))
        .collect()
}

/// The base image a VM boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChoice {
    /// The volume holding the base image in the host's pool.
    pub base_volume: String,
    pub url: String,
    /// Lowercase hex.
    pub sha256: String,
    pub format: ImageFormat,
    pub firmware: Firmware,
    /// Direct kernel boot, when the image has a kernel.
    pub kernel_boot: Option<KernelBoot>,
}

/// A file imported into the pool beside the base image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootVolume {
    pub volume: String,
    pub url: String,
    /// Lowercase hex.
    pub sha256: String,
}

/// The kernel, initrd and command line of a direct kernel boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelBoot {
    pub kernel: BootVolume,
    pub initrd: Option<BootVolume>,
    pub cmdline: String,
}

fn kernel_boot(key: &str, image: &ImageConfig) -> Option<KernelBoot> {
    let volume = |what: &str, file: &crate::config::BootFile| BootVolume {
        volume: boot_file_volume(key, what, &file.sha256),
        url: file.url.clone(),
        sha256: file.sha256.to_ascii_lowercase(),
    };
    Some(KernelBoot {
        kernel: volume("kernel", image.kernel.as_ref()?),
        initrd: image.initrd.as_ref().map(|f| volume("initrd", f)),
        cmdline: image
            .cmdline
            .clone()
            .unwrap_or_else(|| DEFAULT_CMDLINE.to_string()),
    })
}

/// Resolves `spec.placement.image` (empty: `config.defaultImage`) to a configured image, or to a
/// URL whose digest `spec.providerOptions.imageSha256` gives.
pub fn resolve_image(
    config: &Config,
    image: Option<&str>,
    options: &str,
) -> Result<ImageChoice, ProviderError> {
    let image = image.filter(|i| !i.is_empty());
    let key = match image {
        Some(image) if image.starts_with("https://") || image.starts_with("http://") => {
            return resolve_url_image(image, options);
        }
        Some(key) => key,
        None => config.default_image.as_deref().ok_or_else(|| {
            ProviderError::Permanent(
                "spec.placement.image is empty and the provider config has no defaultImage; name an image or set config.defaultImage".into(),
            )
        })?,
    };
    let Some(found) = config.images.get(key) else {
        let known: Vec<&str> = config.images.keys().map(String::as_str).collect();
        return Err(ProviderError::Permanent(format!(
            "spec.placement.image: {key:?} is neither a key of the provider's images ({}) nor an https:// URL; use one of those keys",
            if known.is_empty() {
                "none configured".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    Ok(ImageChoice {
        base_volume: base_volume_for_key(key, &found.sha256, found.format),
        url: found.url.clone(),
        sha256: found.sha256.to_ascii_lowercase(),
        format: found.format,
        firmware: found.firmware,
        kernel_boot: kernel_boot(key, found),
    })
}

fn resolve_url_image(url: &str, options: &str) -> Result<ImageChoice, ProviderError> {
    let refuse = |why: String| {
        ProviderError::Permanent(format!("spec.placement.image: {url:?} is a URL, so {why}"))
    };
    if !is_http_url(url) {
        return Err(refuse(
            "it must be a whole http(s) URL without spaces".into(),
        ));
    }
    let options: serde_json::Value = serde_json::from_str(if options.trim().is_empty() {
        "{}"
    } else {
        options
    })
    .map_err(|e| refuse(format!("spec.providerOptions must be a JSON object ({e})")))?;
    let text = |field: &str| options.get(field).and_then(|v| v.as_str());
    let sha256 = match text("imageSha256") {
        Some(s) if is_sha256(s) => s.to_ascii_lowercase(),
        _ => {
            return Err(refuse(
                "spec.providerOptions.imageSha256 must give its sha256 (64 hex digits)".into(),
            ));
        }
    };
    let format = match text("imageFormat") {
        None => ImageFormat::Qcow2,
        Some(f) => ImageFormat::parse(f).ok_or_else(|| {
            refuse(format!(
                "spec.providerOptions.imageFormat must be qcow2 or raw, not {f:?}"
            ))
        })?,
    };
    let firmware = match text("imageFirmware") {
        None => Firmware::Uefi,
        Some(f) => Firmware::parse(f).ok_or_else(|| {
            refuse(format!(
                "spec.providerOptions.imageFirmware must be uefi or bios, not {f:?}"
            ))
        })?,
    };
    Ok(ImageChoice {
        base_volume: base_volume_for_digest(&sha256, format),
        url: url.to_string(),
        sha256,
        format,
        firmware,
        kernel_boot: None,
    })
}

/// Whether the provider configures squid in this Proxy's VM, see [`squid::managed`].
pub fn managed_squid(config: &Config, options: &str) -> Result<bool, ProviderError> {
    squid::managed(config.managed_squid, options)
}

/// A VM's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
}

/// Parses `spec.placement.machineType`: `<vcpus>x<memoryMib>` (e.g. `2x2048`); empty means
/// `config.defaults`. The disk size always comes from `config.defaults.diskGib`.
pub fn parse_machine_type(
    machine_type: Option<&str>,
    defaults: &Defaults,
) -> Result<Size, ProviderError> {
    let mut size = Size {
        vcpus: defaults.vcpus,
        memory_mib: defaults.memory_mib,
        disk_gib: defaults.disk_gib,
    };
    let Some(value) = machine_type.filter(|m| !m.is_empty()) else {
        return Ok(size);
    };
    let parsed = value.split_once('x').and_then(|(c, m)| {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if digits(c) && digits(m) {
            Some((c.parse::<u32>().ok()?, m.parse::<u64>().ok()?))
        } else {
            None
        }
    });
    match parsed {
        Some((vcpus, memory_mib)) if VCPUS.contains(&vcpus) && MEMORY_MIB.contains(&memory_mib) => {
            size.vcpus = vcpus;
            size.memory_mib = memory_mib;
            Ok(size)
        }
        _ => Err(ProviderError::Permanent(format!(
            "spec.placement.machineType: {value:?} is not <vcpus>x<memoryMib> (e.g. 2x2048, vcpus {}-{}, memory {}-{} MiB); fix it or leave it empty for the provider's defaults",
            VCPUS.start(),
            VCPUS.end(),
            MEMORY_MIB.start(),
            MEMORY_MIB.end()
        ))),
    }
}

/// The port squid listens on: the spec's, or 3128.
pub fn port(spec_port: u16) -> u16 {
    if spec_port == 0 {
        DEFAULT_PORT
    } else {
        spec_port
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{permanent, sample};

    #[test]
    fn placement_is_deterministic_and_spreads() {
        let c = sample();
        let first = choose_host(&c, None, "uid-1").unwrap().name.clone();
        for _ in 0..3 {
            assert_eq!(choose_host(&c, None, "uid-1").unwrap().name, first);
        }
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64 {
            seen.insert(
                choose_host(&c, None, &format!("uid-{i}"))
                    .unwrap()
                    .name
                    .clone(),
            );
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        // The index is the FNV-1a hash modulo the candidate count.
        let uid = "5f0c6e1a-9a4b-4a35-b1f6-0d2c1e7c9a11";
        let expected = (fnv1a(uid.as_bytes()) % 3) as usize;
        assert_eq!(
            choose_host(&c, None, uid).unwrap().name,
            c.hosts[expected].name
        );
        assert_eq!(
            choose_host(&c, Some(""), uid).unwrap().name,
            c.hosts[expected].name
        );
    }

    #[test]
    fn create_searches_the_chosen_host_first_then_every_other_in_any_zone() {
        let c = sample();
        let names = |chosen: usize| -> Vec<String> {
            search_order(&c, &c.hosts[chosen])
                .into_iter()
                .map(|h| h.name.clone())
                .collect()
        };
        assert_eq!(names(0), ["hv1", "hv2", "hv3"]);
        assert_eq!(names(1), ["hv2", "hv1", "hv3"]);
        assert_eq!(names(2), ["hv3", "hv1", "hv2"]);
    }

    #[test]
    fn zone_selects_its_hosts() {
        let c = sample();
        for i in 0..32 {
            let host = choose_host(&c, Some("home-a"), &format!("u{i}")).unwrap();
            assert!(host.name == "hv1" || host.name == "hv3", "{}", host.name);
            let host = choose_host(&c, Some("home-b"), &format!("u{i}")).unwrap();
            assert_eq!(host.name, "hv2");
        }
    }

    #[test]
    fn unknown_zone_names_the_configured_zones() {
        let c = sample();
        assert_eq!(
            permanent(choose_host(&c, Some("mars"), "u")),
            "spec.placement.zone: no host is in zone \"mars\" (the provider config has zones: home-a, home-b); use one of those zones or add hosts to the provider config"
        );
    }

    #[test]
    fn image_keys_resolve_with_their_settings() {
        let c = sample();
        let debian = resolve_image(&c, None, "{}").unwrap();
        assert_eq!(debian.base_volume, "base-debian-12-0123456789ab.qcow2");
        assert_eq!(debian.firmware, Firmware::Uefi);
        assert_eq!(debian.format, ImageFormat::Qcow2);
        assert_eq!(resolve_image(&c, Some(""), "{}").unwrap(), debian);
        let alpine = resolve_image(&c, Some("alpine"), "").unwrap();
        assert_eq!(alpine.base_volume, "base-alpine-fedcba987654.raw");
        assert_eq!(alpine.firmware, Firmware::Bios);
        assert_eq!(alpine.sha256, "fedcba9876543210".repeat(4));
    }

    #[test]
    fn unknown_image_key_is_permanent() {
        let c = sample();
        let m = permanent(resolve_image(&c, Some("ubuntu"), "{}"));
        assert!(m.starts_with("spec.placement.image: \"ubuntu\" is neither a key of the provider's images (alpine, debian-12)"), "{m}");
        let mut c = sample();
        c.default_image = None;
        let m = permanent(resolve_image(&c, None, "{}"));
        assert!(m.contains("no defaultImage"), "{m}");
    }

    #[test]
    fn url_images_need_a_digest() {
        let c = sample();
        let url = "https://example.com/img.qcow2";
        let m = permanent(resolve_image(&c, Some(url), "{}"));
        assert_eq!(
            m,
            "spec.placement.image: \"https://example.com/img.qcow2\" is a URL, so spec.providerOptions.imageSha256 must give its sha256 (64 hex digits)"
        );
        let m = permanent(resolve_image(&c, Some(url), r#"{"imageSha256":"xyz"}"#));
        assert!(m.contains("imageSha256"), "{m}");
        let digest = "AB".repeat(32);
        let options =
            format!(r#"{{"imageSha256":"{digest}","imageFormat":"raw","imageFirmware":"bios"}}"#);
        let choice = resolve_image(&c, Some(url), &options).unwrap();
        assert_eq!(choice.base_volume, "base-abababababababab.raw");
        assert_eq!(choice.sha256, "ab".repeat(32));
        assert_eq!(choice.url, url);
        assert_eq!(choice.format, ImageFormat::Raw);
        assert_eq!(choice.firmware, Firmware::Bios);
        let options = format!(r#"{{"imageSha256":"{digest}","imageFormat":"vmdk"}}"#);
        let m = permanent(resolve_image(&c, Some(url), &options));
        assert!(
            m.contains("imageFormat must be qcow2 or raw, not \"vmdk\""),
            "{m}"
        );
    }

    #[test]
    fn machine_types() {
        let d = sample().defaults;
        assert_eq!(
            parse_machine_type(None, &d).unwrap(),
            Size {
                vcpus: 1,
                memory_mib: 1024,
                disk_gib: 10
            }
        );
        assert_eq!(parse_machine_type(Some(""), &d).unwrap().memory_mib, 1024);
        assert_eq!(
            parse_machine_type(Some("2x2048"), &d).unwrap(),
            Size {
                vcpus: 2,
                memory_mib: 2048,
                disk_gib: 10
            }
        );
        for bad in [
            "small", "2x", "x2048", "0x2048", "2x64", "+2x2048", "2X2048", "2x2048x1",
        ] {
            let m = permanent(parse_machine_type(Some(bad), &d));
            assert!(
                m.starts_with(&format!("spec.placement.machineType: {bad:?}")),
                "{m}"
            );
        }
    }

    #[test]
    fn ports() {
        assert_eq!(port(0), 3128);
        assert_eq!(port(8080), 8080);
    }

    #[test]
    fn kernel_boot_comes_with_the_image() {
        let mut c = sample();
        assert_eq!(resolve_image(&c, None, "").unwrap().kernel_boot, None);
        let kernel = "ab".repeat(32);
        let image = c.images.get_mut("debian-12").unwrap();
        image.kernel = Some(crate::config::BootFile {
            url: "http://127.0.0.1:1/vmlinuz".into(),
            sha256: kernel.to_ascii_uppercase(),
        });
        let boot = resolve_image(&c, Some("debian-12"), "")
            .unwrap()
            .kernel_boot
            .unwrap();
        assert_eq!(boot.kernel.volume, "base-debian-12-kernel-abababababab");
        assert_eq!(boot.kernel.sha256, kernel, "digests are lowercased");
        assert_eq!(boot.initrd, None);
        assert_eq!(boot.cmdline, DEFAULT_CMDLINE);
        c.images.get_mut("debian-12").unwrap().cmdline = Some("console=ttyS0 quiet".into());
        let boot = resolve_image(&c, None, "").unwrap().kernel_boot.unwrap();
        assert_eq!(boot.cmdline, "console=ttyS0 quiet");
    }

    #[test]
    fn managed_squid_is_the_configs_unless_the_proxy_opts_out() {
        let mut c = sample();
        assert!(managed_squid(&c, "").unwrap());
        assert!(managed_squid(&c, "{}").unwrap());
        assert!(!managed_squid(&c, r#"{"managedSquid": false}"#).unwrap());
        c.managed_squid = false;
        assert!(!managed_squid(&c, "{}").unwrap());
        assert!(managed_squid(&c, r#"{"managedSquid": true}"#).unwrap());
        assert!(
            permanent(managed_squid(&c, r#"{"managedSquid": "no"}"#))
                .starts_with("spec.providerOptions.managedSquid: \"no\" is not true or false")
        );
        assert!(permanent(managed_squid(&c, "[")).starts_with("spec.providerOptions must be"));
    }
}
