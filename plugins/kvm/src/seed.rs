//! The NoCloud seed: user-data byte for byte, meta-data naming the instance, and vendor-data
//! (the guest agent script plus any configured or per-Proxy vendor-data, as one MIME multipart
//! when there is more than one part). Nothing here is ever logged.

use proxy_operator_sdk::ProviderError;

use proxy_operator_sdk::cloudinit;

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
  systemctl is-enabled --quiet qemu-guest-agent 2>/dev/null || systemctl enable qemu-guest-agent >/dev/null 2>&1 || true
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

/// vendor-data from its parts, in order: the guest agent script (when `guest_agent`), the managed
/// squid's setup script, the provider config's `vendorData`, the Proxy's `vendorData`. Empty parts
/// are skipped; no part means no vendor-data file; one part is used as it is; more become a MIME
/// multipart.
pub fn vendor_data(
    guest_agent: bool,
    squid_setup: Option<&str>,
    config_vendor_data: Option<&str>,
    spec_vendor_data: &[u8],
) -> Option<Vec<u8>> {
    let agent: &[u8] = if guest_agent {
        GUEST_AGENT_SCRIPT.as_bytes()
    } else {
        b""
    };
    cloudinit::combine(&[
        agent,
        squid_setup.unwrap_or_default().as_bytes(),
        config_vendor_data.unwrap_or_default().as_bytes(),
        spec_vendor_data,
    ])
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
        assert_eq!(vendor_data(false, None, None, b""), None);
        assert_eq!(vendor_data(false, None, Some(""), b""), None);
        assert_eq!(
            vendor_data(true, None, None, b"").unwrap(),
            GUEST_AGENT_SCRIPT.as_bytes()
        );
        // One part that is not the agent script is used byte for byte.
        assert_eq!(
            vendor_data(false, None, None, b"#cloud-config\nruncmd: [x]\n").unwrap(),
            b"#cloud-config\nruncmd: [x]\n"
        );
        assert_eq!(
            vendor_data(false, None, Some("#!/bin/sh\necho hi\n"), b"").unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
    }

    #[test]
    fn several_parts_become_a_multipart() {
        let spec = b"#cloud-config\npackages: [squid]\n";
        let out = vendor_data(true, None, Some("#!/bin/bash\necho config\n"), spec).unwrap();
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
            vendor_data(true, None, Some("#!/bin/bash\necho config\n"), spec).unwrap(),
            out
        );
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
        assert!(
            iso.windows(user.len()).any(|w| w == user),
            "user-data is stored unchanged"
        );
        assert_eq!(&iso[16 * 2048 + 1..16 * 2048 + 6], b"CD001");
        assert_eq!(&iso[16 * 2048 + 40..16 * 2048 + 46], b"cidata");

        let files = seed_files("px-1", b"", None);
        assert_eq!(files.len(), 2);
        assert_eq!(files[1].1, b"#cloud-config\n");
    }
}
