//! How libvirt answers become provider answers: errors, states, addresses, check verdicts.

use std::net::Ipv4Addr;

use proxy_operator_sdk::capabilities::libvirt::{DomainState, InterfaceAddress, LibvirtError};
use proxy_operator_sdk::{InstanceState, ProviderError, retried_as_transient, transient};

/// Maps a libvirt error of a call described by `context` (e.g. `hv1: define-domain px-1`).
pub fn libvirt_error(context: &str, err: LibvirtError) -> ProviderError {
    match err {
        LibvirtError::Denied(m) => ProviderError::Denied(format!("{context}: {m}")),
        LibvirtError::NotFound(m) => ProviderError::NotFound(format!("{context}: {m}")),
        LibvirtError::Transport(m) => transient(format!("{context}: transport: {m}"), None),
        LibvirtError::Timeout(m) => transient(format!("{context}: timeout: {m}"), None),
        LibvirtError::SshHandshakeFailed(m) => {
            transient(format!("{context}: SSH handshake failed: {m}"), None)
        }
        LibvirtError::HostKeyMismatch(m) => ProviderError::Unauthorized(format!(
            "{context}: SSH host key does not match known_hosts: {m}"
        )),
        LibvirtError::AuthFailed(m) => {
            ProviderError::Unauthorized(format!("{context}: SSH authentication failed: {m}"))
        }
        LibvirtError::Failed(m) => ProviderError::Permanent(format!("{context}: libvirt: {m}")),
        LibvirtError::ChecksumMismatch(m) => {
            ProviderError::Permanent(format!("{context}: image checksum mismatch: {m}"))
        }
    }
}

/// Maps a failed `open(host)`: a host missing from the grant is a config mistake the platform
/// engineer fixes, so it is `permanent` and says how.
pub fn open_error(host: &str, err: LibvirtError) -> ProviderError {
    match err {
        LibvirtError::Denied(m) => ProviderError::Permanent(denied_message(host, &m)),
        other => libvirt_error(&format!("host {host}"), other),
    }
}

fn denied_message(host: &str, detail: &str) -> String {
    format!(
        "host {host} is not granted to this provider instance ({detail}); add it to grants.libvirt.hosts with its SSH address, user and key"
    )
}

/// What `create` answers when `host` could not be searched for domain `name`: always
/// transient. The domain of an earlier try may be on that host, so making one on another host
/// could make a second VM; waiting for the host to answer cannot. An error that would not go away
/// by itself (a grant, a host key) is retried slowly rather than failing the Proxy for good: the
/// Proxy's own host is fine and the fix is outside its spec.
pub fn search_failed(host: &str, name: &str, error: ProviderError) -> ProviderError {
    retried_as_transient(error, 30_000, |message| {
        format!(
            "host {host} could not be searched for an existing domain {name} ({message}); not making one elsewhere until it answers"
        )
    })
}

/// Whether `err` says the thing looked up does not exist.
pub fn is_not_found(err: &LibvirtError) -> bool {
    matches!(err, LibvirtError::NotFound(_))
}

/// Whether a `destroy-domain` failure only says the domain was not running.
pub fn is_not_running(err: &LibvirtError) -> bool {
    match err {
        LibvirtError::Failed(m) => {
            let m = m.to_ascii_lowercase();
            m.contains("not running") || m.contains("is not active") || m.contains("shut off")
        }
        _ => false,
    }
}

/// The instance state for a domain state; a running domain without an address is still
/// provisioning. The message explains states that are not self-evident.
pub fn instance_state(state: DomainState, has_address: bool) -> (InstanceState, Option<String>) {
    match state {
        DomainState::Running | DomainState::Blocked if has_address => {
            (InstanceState::Running, None)
        }
        DomainState::Running | DomainState::Blocked => (
            InstanceState::Provisioning,
            Some("running; waiting for the guest agent to report an IPv4 address".into()),
        ),
        DomainState::Paused => (InstanceState::Stopped, Some("domain is paused".into())),
        DomainState::Suspended => (
            InstanceState::Stopped,
            Some("domain is suspended by guest power management".into()),
        ),
        DomainState::Shutdown => (
            InstanceState::Stopping,
            Some("domain is shutting down".into()),
        ),
        DomainState::Shutoff => (InstanceState::Stopped, Some("domain is shut off".into())),
        DomainState::Crashed => (InstanceState::Failed, Some("domain crashed".into())),
        DomainState::NoState => (InstanceState::Unknown, None),
    }
}

/// How long a running VM may go without an address before its message says what to check.
pub const ADDRESS_PATIENCE_SECS: i64 = 300;

/// The message of a running VM whose guest agent reports no address yet, `age` seconds after it
/// was made: after [`ADDRESS_PATIENCE_SECS`] it says what usually causes it.
pub fn waiting_for_address(domain: &str, age: Option<i64>) -> String {
    match age {
        Some(age) if age >= ADDRESS_PATIENCE_SECS => format!(
            "running for {age} s and the guest agent has reported no IPv4 address: check that the image runs qemu-guest-agent (installGuestAgent: true installs it at first boot, which needs a package mirror) and gets an address on its network (DHCP); the boot log is on the serial console (virsh console {domain})"
        ),
        _ => "running; waiting for the guest agent to report an IPv4 address".into(),
    }
}

/// A failed `start-domain`, with what to do when libvirt could not start passt (user-mode
/// networks) on the hypervisor.
pub fn start_error(host: &str, err: ProviderError) -> ProviderError {
    match err {
        ProviderError::Permanent(m) | ProviderError::InvalidConfig(m)
            if m.to_ascii_lowercase().contains("passt") =>
        {
            ProviderError::Permanent(format!(
                "{m}; user-mode networking needs passt on host {host} (Debian/Ubuntu: apt-get install passt; Fedora: dnf install passt), or attach the host's VMs to a network or bridge instead"
            ))
        }
        other => other,
    }
}

/// Whether the domain is up, so asking for its addresses makes sense.
pub fn is_up(state: DomainState) -> bool {
    matches!(state, DomainState::Running | DomainState::Blocked)
}

/// The first IPv4 address a proxy can be reached at: not loopback, link-local or unspecified.
pub fn first_usable_ipv4(addresses: &[InterfaceAddress]) -> Option<String> {
    addresses
        .iter()
        .filter(|a| a.name != "lo")
        .filter_map(|a| a.address.parse::<Ipv4Addr>().ok())
        .find(|ip| !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified())
        .map(|ip| ip.to_string())
}

/// The check reason for a failed `open`/`probe`/`pool-info`.
pub fn check_reason(err: &LibvirtError) -> &'static str {
    match err {
        LibvirtError::Transport(_) => "Unreachable",
        LibvirtError::SshHandshakeFailed(_) => "SSHHandshakeFailed",
        LibvirtError::HostKeyMismatch(_) => "HostKeyMismatch",
        LibvirtError::AuthFailed(_) => "AuthFailed",
        LibvirtError::Timeout(_) => "Timeout",
        LibvirtError::Denied(_) => "Forbidden",
        LibvirtError::NotFound(_) => "NotFound",
        LibvirtError::Failed(_) | LibvirtError::ChecksumMismatch(_) => "LibvirtError",
    }
}

/// The check message for a failed `open`/`probe`.
pub fn check_message(host: &str, err: &LibvirtError) -> String {
    match err {
        LibvirtError::Denied(m) => denied_message(host, m),
        LibvirtError::Transport(m) => format!("cannot reach {host}: {m}"),
        LibvirtError::SshHandshakeFailed(m) => format!("SSH handshake with {host} failed: {m}"),
        LibvirtError::HostKeyMismatch(m) => {
            format!("SSH host key of {host} does not match known_hosts: {m}")
        }
        LibvirtError::AuthFailed(m) => format!("SSH authentication to {host} failed: {m}"),
        LibvirtError::Timeout(m) => format!("{host} did not answer in time: {m}"),
        LibvirtError::NotFound(m) => format!("{host}: not found: {m}"),
        LibvirtError::Failed(m) => format!("{host}: libvirt: {m}"),
        LibvirtError::ChecksumMismatch(m) => format!("{host}: {m}"),
    }
}

/// A size in bytes for people: `12.3 GiB`, rounded to a tenth.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    let mut scale: u64 = 1;
    while unit < UNITS.len() - 1 && bytes / scale >= 1024 {
        scale *= 1024;
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let mut whole = bytes / scale;
    let mut tenth = ((bytes % scale) * 10 + scale / 2) / scale;
    if tenth == 10 {
        whole += 1;
        tenth = 0;
    }
    format!("{whole}.{tenth} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_that_cannot_be_searched_makes_create_wait_not_make_a_domain_elsewhere() {
        let cases = [
            (transient("transport: refused", None), None),
            (transient("timeout", Some(500)), Some(500)),
            (ProviderError::Unauthorized("host key".into()), Some(30_000)),
            (ProviderError::Permanent("not granted".into()), Some(30_000)),
            (ProviderError::Denied("pool".into()), Some(30_000)),
        ];
        for (error, after) in cases {
            match search_failed("hv2", "px-1", error.clone()) {
                ProviderError::Transient(t) => {
                    assert_eq!(t.retry_after_ms, after, "{error:?}");
                    assert!(
                        t.message.starts_with(
                            "host hv2 could not be searched for an existing domain px-1"
                        ) && t
                            .message
                            .ends_with("not making one elsewhere until it answers"),
                        "{}",
                        t.message
                    );
                }
                other => panic!("{error:?} -> {other:?}"),
            }
        }
    }

    fn addr(name: &str, address: &str) -> InterfaceAddress {
        InterfaceAddress {
            name: name.into(),
            mac: None,
            address: address.into(),
            prefix: 24,
        }
    }

    #[test]
    fn error_mapping_follows_the_contract() {
        let c = "hv1: lookup-domain px";
        assert!(
            matches!(libvirt_error(c, LibvirtError::Denied("x".into())), ProviderError::Denied(m) if m == "hv1: lookup-domain px: x")
        );
        assert!(matches!(
            libvirt_error(c, LibvirtError::NotFound("x".into())),
            ProviderError::NotFound(_)
        ));
        for e in [
            LibvirtError::Transport("x".into()),
            LibvirtError::Timeout("x".into()),
            LibvirtError::SshHandshakeFailed("x".into()),
        ] {
            assert!(
                matches!(libvirt_error(c, e), ProviderError::Transient(t) if t.retry_after_ms.is_none())
            );
        }
        for e in [
            LibvirtError::HostKeyMismatch("x".into()),
            LibvirtError::AuthFailed("x".into()),
        ] {
            assert!(matches!(
                libvirt_error(c, e),
                ProviderError::Unauthorized(_)
            ));
        }
        for e in [
            LibvirtError::Failed("x".into()),
            LibvirtError::ChecksumMismatch("x".into()),
        ] {
            assert!(matches!(libvirt_error(c, e), ProviderError::Permanent(_)));
        }
    }

    #[test]
    fn ungranted_host_is_permanent_and_says_where_to_grant() {
        match open_error("hv9", LibvirtError::Denied("not in grant".into())) {
            ProviderError::Permanent(m) => {
                assert!(m.starts_with("host hv9 is not granted"), "{m}");
                assert!(m.contains("add it to grants.libvirt.hosts"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            open_error("hv9", LibvirtError::Transport("refused".into())),
            ProviderError::Transient(_)
        ));
    }

    #[test]
    fn not_running_is_recognised() {
        assert!(is_not_running(&LibvirtError::Failed(
            "Requested operation is not valid: domain is not running".into()
        )));
        assert!(!is_not_running(&LibvirtError::Failed(
            "internal error".into()
        )));
        assert!(!is_not_running(&LibvirtError::Transport(
            "not running".into()
        )));
    }

    #[test]
    fn states() {
        assert_eq!(
            instance_state(DomainState::Running, true).0,
            InstanceState::Running
        );
        assert_eq!(
            instance_state(DomainState::Running, false).0,
            InstanceState::Provisioning
        );
        assert_eq!(
            instance_state(DomainState::Blocked, true).0,
            InstanceState::Running
        );
        assert_eq!(
            instance_state(DomainState::Shutoff, false).0,
            InstanceState::Stopped
        );
        assert_eq!(
            instance_state(DomainState::Crashed, false).0,
            InstanceState::Failed
        );
        assert_eq!(
            instance_state(DomainState::Paused, false).0,
            InstanceState::Stopped
        );
        assert_eq!(
            instance_state(DomainState::Suspended, false).0,
            InstanceState::Stopped
        );
        assert_eq!(
            instance_state(DomainState::Shutdown, false).0,
            InstanceState::Stopping
        );
        assert_eq!(
            instance_state(DomainState::NoState, false).0,
            InstanceState::Unknown
        );
    }

    #[test]
    fn address_selection() {
        let list = [
            addr("lo", "127.0.0.1"),
            addr("eth0", "fe80::1"),
            addr("eth0", "169.254.3.4"),
            addr("eth0", "192.168.122.57"),
            addr("eth1", "10.0.0.2"),
        ];
        assert_eq!(first_usable_ipv4(&list).as_deref(), Some("192.168.122.57"));
        assert_eq!(first_usable_ipv4(&list[..3]), None);
        assert_eq!(first_usable_ipv4(&[addr("eth0", "0.0.0.0")]), None);
    }

    #[test]
    fn check_reasons() {
        assert_eq!(
            check_reason(&LibvirtError::Transport("x".into())),
            "Unreachable"
        );
        assert_eq!(
            check_reason(&LibvirtError::SshHandshakeFailed("x".into())),
            "SSHHandshakeFailed"
        );
        assert_eq!(
            check_reason(&LibvirtError::HostKeyMismatch("x".into())),
            "HostKeyMismatch"
        );
        assert_eq!(
            check_reason(&LibvirtError::AuthFailed("x".into())),
            "AuthFailed"
        );
        assert_eq!(check_reason(&LibvirtError::Timeout("x".into())), "Timeout");
        assert_eq!(check_reason(&LibvirtError::Denied("x".into())), "Forbidden");
        assert!(
            check_message("hv1", &LibvirtError::Denied("x".into()))
                .contains("grants.libvirt.hosts")
        );
    }

    #[test]
    fn bytes_for_people() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
        assert_eq!(human_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn a_vm_without_an_address_says_what_to_check_after_a_while() {
        let early = waiting_for_address("px-1", Some(ADDRESS_PATIENCE_SECS - 1));
        assert_eq!(
            early,
            "running; waiting for the guest agent to report an IPv4 address"
        );
        assert_eq!(waiting_for_address("px-1", None), early);
        let late = waiting_for_address("px-1", Some(ADDRESS_PATIENCE_SECS + 12));
        assert!(
            late.starts_with("running for 312 s and the guest agent has reported no IPv4 address"),
            "{late}"
        );
        assert!(
            late.contains("qemu-guest-agent") && late.contains("virsh console px-1"),
            "{late}"
        );
    }

    #[test]
    fn missing_passt_says_how_to_install_it() {
        let e = start_error(
            "hv1",
            ProviderError::Permanent("hv1: start-domain px-1: libvirt: Cannot find 'passt' in path: No such file or directory".into()),
        );
        match e {
            ProviderError::Permanent(m) => {
                assert!(
                    m.contains("apt-get install passt") && m.contains("host hv1"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        let other = start_error("hv1", ProviderError::Permanent("no memory".into()));
        assert!(matches!(other, ProviderError::Permanent(m) if m == "no memory"));
    }
}
