//! The NoCloud seed: user-data byte for byte, meta-data naming the instance, and vendor-data
//! (the guest agent script plus any configured or per-Proxy vendor-data, as one MIME multipart
//! when there is more than one part). Nothing here is ever logged.

use proxy_operator_sdk::ProviderError;

use crate::names::fnv1a;

/// The volume id NoCloud looks for.
pub const VOLUME_ID: &str = "cidata";

/// user-data when the Proxy gives none: an empty cloud-config, so cloud-init still runs.
pub const EMPTY_USER_DATA: &[u8] = b"#cloud-config\n";

/// A vendor-data script installing and starting the QEMU guest agent with whichever package
/// manager the image has. The agent is how the provider learns the VM's address.
pub const GUEST_AGENT_SCRIPT: &str = r#"#!/bin/sh
# proxy-operator (kvm): install and start the QEMU guest agent, which reports this VM's address.
set -u
if command -v qemu-ga >/dev/null 2>&1 || [ -x /usr/sbin/qemu-ga ] || [ -x /usr/bin/qemu-ga ]; then
  :
elif command -v apt-get >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -q || true
  apt-get -o DPkg::Lock::Timeout=300 install -y -q qemu-guest-agent
elif command -v dnf >/dev/null 2>&1; then
  dnf install -y qemu-guest-agent
elif command -v yum >/dev/null 2>&1; then
  yum install -y qemu-guest-agent
elif command -v apk >/dev/null 2>&1; then
  apk add --no-cache qemu-guest-agent
elif command -v zypper >/dev/null 2>&1; then
  zypper --non-interactive install qemu-guest-agent
else
  echo "proxy-operator: no known package manager; cannot install qemu-guest-agent" >&2
  exit 1
fi
if command -v systemctl >/dev/null 2>&1; then
  systemctl enable qemu-guest-agent >/dev/null 2>&1 || true
  systemctl start qemu-guest-agent
elif command -v rc-service >/dev/null 2>&1; then
  rc-update add qemu-guest-agent default >/dev/null 2>&1 || true
  rc-service qemu-guest-agent start
fi
"#;

/// meta-data: the domain name as instance id and host name.
pub fn meta_data(domain: &str) -> String {
    format!("instance-id: {domain}\nlocal-hostname: {domain}\n")
}

/// vendor-data from its parts, in order: the guest agent script (when `guest_agent`), the
/// provider config's `vendorData`, the Proxy's `vendorData`. Empty parts are skipped; no part
/// means no vendor-data file; one part is used as it is; more become a MIME multipart.
pub fn vendor_data(
    guest_agent: bool,
    config_vendor_data: Option<&str>,
    spec_vendor_data: &[u8],
) -> Option<Vec<u8>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    if guest_agent {
        parts.push(GUEST_AGENT_SCRIPT.as_bytes());
    }
    if let Some(extra) = config_vendor_data.filter(|v| !v.is_empty()) {
        parts.push(extra.as_bytes());
    }
    if !spec_vendor_data.is_empty() {
        parts.push(spec_vendor_data);
    }
    match parts.as_slice() {
        [] => None,
        [one] => Some(one.to_vec()),
        many => Some(multipart(many)),
    }
}

/// The MIME type cloud-init gives a part starting like `data` (its own "starts with" table).
pub fn part_content_type(data: &[u8]) -> &'static str {
    let first_line = data.split(|b| *b == b'\n').next().unwrap_or_default();
    let first_line = first_line.strip_suffix(b"\r").unwrap_or(first_line);
    const TABLE: &[(&[u8], &str)] = &[
        (b"#cloud-config-archive", "text/cloud-config-archive"),
        (b"#cloud-config-jsonp", "text/cloud-config-jsonp"),
        (b"#cloud-config", "text/cloud-config"),
        (b"#cloud-boothook", "text/cloud-boothook"),
        (b"#include-once", "text/x-include-once-url"),
        (b"#include", "text/x-include-url"),
        (b"#part-handler", "text/part-handler"),
        (b"#upstart-job", "text/upstart-job"),
        (b"## template: jinja", "text/jinja2"),
        (b"#!", "text/x-shellscript"),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| first_line.starts_with(prefix))
        .map_or("text/plain", |(_, mime)| mime)
}

/// Builds a `multipart/mixed` message of `parts`, each typed by [`part_content_type`]. Text parts
/// go as 8bit, anything that is not UTF-8 (e.g. gzip) as base64. A part that is already a MIME
/// entity (starts with `Content-Type:`) is nested as it is. The boundary is derived from the
/// content and never occurs in it, so the same parts give the same bytes.
pub fn multipart(parts: &[&[u8]]) -> Vec<u8> {
    let mut seed = 0u64;
    for part in parts {
        seed ^= fnv1a(part);
    }
    let mut boundary = format!("==proxy-operator-kvm-{seed:016x}==");
    let mut n = 0u32;
    while parts.iter().any(|p| contains(p, boundary.as_bytes())) {
        n += 1;
        boundary = format!("==proxy-operator-kvm-{seed:016x}-{n}==");
    }
    let mut out = Vec::new();
    out.extend_from_slice(
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n")
            .as_bytes(),
    );
    for (i, part) in parts.iter().enumerate() {
        out.extend_from_slice(format!("--{boundary}\n").as_bytes());
        if is_mime_entity(part) {
            out.extend_from_slice(part);
        } else {
            let filename = format!("part-{:03}", i + 1);
            match std::str::from_utf8(part) {
                Ok(text) => {
                    out.extend_from_slice(
                        format!(
                            "Content-Type: {}; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: 8bit\nContent-Disposition: attachment; filename=\"{filename}\"\n\n",
                            part_content_type(part)
                        )
                        .as_bytes(),
                    );
                    out.extend_from_slice(text.as_bytes());
                }
                Err(_) => {
                    let mime = if part.starts_with(&[0x1f, 0x8b]) {
                        "application/x-gzip"
                    } else {
                        "application/octet-stream"
                    };
                    out.extend_from_slice(
                        format!(
                            "Content-Type: {mime}\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\nContent-Disposition: attachment; filename=\"{filename}\"\n\n"
                        )
                        .as_bytes(),
                    );
                    out.extend_from_slice(base64_lines(part).as_bytes());
                }
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(format!("--{boundary}--\n").as_bytes());
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_mime_entity(part: &[u8]) -> bool {
    part.len() >= 13 && part[..13].eq_ignore_ascii_case(b"content-type:")
}

/// Base64 (RFC 4648, with padding) in 76-character lines.
pub fn base64_lines(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len() * 4 / 3 + data.len() / 57 + 4);
    for (i, chunk) in data.chunks(3).enumerate() {
        if i > 0 && i % 19 == 0 {
            out.push('\n');
        }
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63] as char);
        out.push(ALPHABET[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// The files of the seed, in the order they are laid out.
pub fn seed_files(
    domain: &str,
    user_data: &[u8],
    vendor_data: Option<Vec<u8>>,
) -> Vec<(&'static str, Vec<u8>)> {
    let user_data = if user_data.is_empty() {
        EMPTY_USER_DATA
    } else {
        user_data
    };
    let mut files = vec![
        ("meta-data", meta_data(domain).into_bytes()),
        ("user-data", user_data.to_vec()),
    ];
    if let Some(vendor) = vendor_data {
        files.push(("vendor-data", vendor));
    }
    files
}

/// The seed ISO bytes.
pub fn build_iso(files: &[(&'static str, Vec<u8>)]) -> Result<Vec<u8>, ProviderError> {
    let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (*n, d.as_slice())).collect();
    seed_iso::build(&borrowed, VOLUME_ID)
        .map_err(|e| ProviderError::Permanent(format!("building the seed ISO: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_data_names_the_instance() {
        assert_eq!(
            meta_data("px-0123456789abcdef"),
            "instance-id: px-0123456789abcdef\nlocal-hostname: px-0123456789abcdef\n"
        );
    }

    #[test]
    fn vendor_data_parts() {
        assert_eq!(vendor_data(false, None, b""), None);
        assert_eq!(vendor_data(false, Some(""), b""), None);
        assert_eq!(
            vendor_data(true, None, b"").unwrap(),
            GUEST_AGENT_SCRIPT.as_bytes()
        );
        // One part that is not the agent script is used byte for byte.
        assert_eq!(
            vendor_data(false, None, b"#cloud-config\nruncmd: [x]\n").unwrap(),
            b"#cloud-config\nruncmd: [x]\n"
        );
        assert_eq!(
            vendor_data(false, Some("#!/bin/sh\necho hi\n"), b"").unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
    }

    #[test]
    fn several_parts_become_a_multipart() {
        let spec = b"#cloud-config\npackages: [squid]\n";
        let out = vendor_data(true, Some("#!/bin/bash\necho config\n"), spec).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        let first_line = text.lines().next().unwrap();
        let boundary = first_line
            .strip_prefix("Content-Type: multipart/mixed; boundary=\"")
            .and_then(|b| b.strip_suffix('"'))
            .unwrap();
        assert!(text.contains("\nMIME-Version: 1.0\n\n--"));
        let delimiter = format!("\n--{boundary}\n");
        let body: Vec<&str> = text.split(&delimiter).collect();
        // Preamble, three parts; the last ends with the close delimiter.
        assert_eq!(body.len(), 4, "{text}");
        assert!(body[1].starts_with("Content-Type: text/x-shellscript; charset=\"utf-8\"\n"));
        assert!(body[1].contains("\n\n#!/bin/sh\n# proxy-operator (kvm)"));
        assert!(body[2].starts_with("Content-Type: text/x-shellscript;"));
        assert!(body[2].ends_with("\n\n#!/bin/bash\necho config\n"));
        assert!(body[3].starts_with("Content-Type: text/cloud-config;"));
        assert!(body[3].contains("filename=\"part-003\""));
        assert!(body[3].ends_with(&format!(
            "\n\n#cloud-config\npackages: [squid]\n\n--{boundary}--\n"
        )));
        // Deterministic.
        assert_eq!(
            vendor_data(true, Some("#!/bin/bash\necho config\n"), spec).unwrap(),
            out
        );
    }

    #[test]
    fn boundary_never_occurs_in_a_part() {
        let a: &[u8] = b"#!/bin/sh\n";
        let seed = fnv1a(a) ^ fnv1a(b"x");
        let trap = format!("#!/bin/sh\n# ==proxy-operator-kvm-{seed:016x}==\n");
        let parts: [&[u8]; 2] = [trap.as_bytes(), b"x"];
        let seed = fnv1a(parts[0]) ^ fnv1a(parts[1]);
        let trap2 = format!("# ==proxy-operator-kvm-{seed:016x}==\n");
        let with_trap = [trap.as_bytes(), trap2.as_bytes()];
        let out = String::from_utf8(multipart(&with_trap)).unwrap();
        let boundary = out.split('"').nth(1).unwrap();
        assert!(!trap.contains(boundary) && !trap2.contains(boundary));
    }

    #[test]
    fn binary_and_mime_parts() {
        let gzip: &[u8] = &[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe];
        let mime: &[u8] = b"Content-Type: multipart/mixed; boundary=\"inner\"\n\n--inner\nContent-Type: text/cloud-config\n\n#cloud-config\n--inner--\n";
        let out = String::from_utf8(multipart(&[gzip, mime])).unwrap();
        assert!(out.contains("Content-Type: application/x-gzip\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\n"));
        assert!(out.contains("\n\nH4sIAP/+\n"));
        assert!(
            out.contains(&format!("--\n{}", std::str::from_utf8(mime).unwrap()))
                || out.contains(std::str::from_utf8(mime).unwrap())
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(part_content_type(b"#!/bin/sh\n"), "text/x-shellscript");
        assert_eq!(part_content_type(b"#cloud-config\r\n"), "text/cloud-config");
        assert_eq!(
            part_content_type(b"#cloud-config-archive\n"),
            "text/cloud-config-archive"
        );
        assert_eq!(
            part_content_type(b"#cloud-boothook\n"),
            "text/cloud-boothook"
        );
        assert_eq!(
            part_content_type(b"#include\nhttp://x\n"),
            "text/x-include-url"
        );
        assert_eq!(part_content_type(b"hello"), "text/plain");
    }

    #[test]
    fn base64_vectors() {
        assert_eq!(base64_lines(b""), "");
        assert_eq!(base64_lines(b"f"), "Zg==");
        assert_eq!(base64_lines(b"fo"), "Zm8=");
        assert_eq!(base64_lines(b"foobar"), "Zm9vYmFy");
        let long = base64_lines(&[0u8; 60]);
        assert_eq!(long.lines().next().unwrap().len(), 76);
        assert_eq!(long.len(), 80 + 1);
    }

    #[test]
    fn seed_keeps_user_data_byte_for_byte() {
        let user = b"#cloud-config\r\npackages: [squid]\n\xff\x00 no newline";
        let files = seed_files("px-1", user, Some(b"#!/bin/sh\n".to_vec()));
        assert_eq!(
            files[0],
            (
                "meta-data",
                b"instance-id: px-1\nlocal-hostname: px-1\n".to_vec()
            )
        );
        assert_eq!(files[1], ("user-data", user.to_vec()));
        assert_eq!(files[2], ("vendor-data", b"#!/bin/sh\n".to_vec()));
        let iso = build_iso(&files).unwrap();
        assert_eq!(iso.len() % 2048, 0);
        assert!(contains(&iso, user), "user-data is stored unchanged");
        assert_eq!(&iso[16 * 2048 + 1..16 * 2048 + 6], b"CD001");
        assert_eq!(&iso[16 * 2048 + 40..16 * 2048 + 46], b"cidata");

        let files = seed_files("px-1", b"", None);
        assert_eq!(files.len(), 2);
        assert_eq!(files[1].1, b"#cloud-config\n");
    }
}
