use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::Result;
use harness::EgressGuard;
use harness::guard::QEMU_USER;

/// Whether a TCP connect to `addr` from a process running as the QEMU user succeeds.
fn connects_as_qemu_user(addr: std::net::SocketAddr) -> bool {
    let (uid, gid) = harness::squid::user_ids(QEMU_USER).unwrap();
    let script = format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port());
    Command::new("/bin/bash")
        .args(["-c", &script])
        .uid(uid)
        .gid(gid)
        .status()
        .unwrap()
        .success()
}

/// The machine's own first non-loopback IPv4 address: traffic to it never leaves the machine,
/// but it is off loopback, so the guard must refuse it.
fn own_non_loopback_address() -> std::net::Ipv4Addr {
    let out = Command::new("/usr/sbin/ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next()?.parse().ok())
        .unwrap_or_else(|| {
            panic!("no global IPv4 address on this machine to test the guard with: {text}")
        })
}

#[test]
fn the_guard_refuses_the_qemu_user_everything_but_loopback() -> Result<()> {
    // A guard of a process killed before its exit hook would still refuse the user.
    harness::guard::remove_stale_rules();
    // One listener on every address of the machine; nothing here leaves it.
    let listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    let port = listener.local_addr()?.port();
    let own = std::net::SocketAddr::from((own_non_loopback_address(), port));
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        connects_as_qemu_user(own),
        "without the guard the own address answers"
    );

    let guard = EgressGuard::install()?;
    assert!(guard.is_in_place());
    assert!(connects_as_qemu_user(loopback), "loopback stays open");
    assert!(!connects_as_qemu_user(own), "the guard refuses {own}");

    drop(guard);
    assert!(
        connects_as_qemu_user(own),
        "dropping the guard removes its rules"
    );
    Ok(())
}
