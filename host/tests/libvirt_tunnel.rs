//! The SSH tunnel to libvirt against the real harness sshd and libvirtd on loopback: virsh through
//! it, host key and client key refusals, a missing remote socket, and teardown.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use harness::bins::debian_binary;
use harness::{Libvirtd, SshKey, Sshd};
use proxy_operator::provider::capabilities::libvirt::tunnel::{
    HostKeyProblem, SshMaterial, SshTarget, Tunnel, TunnelError,
};
use russh::ChannelOpenFailure;

fn target(sshd: &Sshd) -> SshTarget {
    SshTarget {
        address: "127.0.0.1".into(),
        port: sshd.port(),
        user: sshd.user().into(),
    }
}

use common::children_of;
use common::ssh_material as material;

/// `virsh -c qemu+unix:///system?socket=<socket> <args>`; stdout, or a panic with stderr.
async fn virsh(socket: &Path, args: &[&str]) -> String {
    let out = tokio::process::Command::new(debian_binary("/usr/bin/virsh", "libvirt-clients"))
        .arg("-c")
        .arg(format!("qemu+unix:///system?socket={}", socket.display()))
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run virsh");
    assert!(
        out.status.success(),
        "virsh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `SHA256:...` of a public key file, as OpenSSH prints it.
async fn fingerprint(pubkey_file: &Path) -> String {
    let out = tokio::process::Command::new(debian_binary("/usr/bin/ssh-keygen", "openssh-client"))
        .args(["-l", "-E", "sha256", "-f"])
        .arg(pubkey_file)
        .output()
        .await
        .expect("run ssh-keygen -l");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

fn sshd_log(sshd: &Sshd) -> String {
    std::fs::read_to_string(sshd.dir().join("sshd.log")).unwrap_or_default()
}

/// The sshd log once it contains `needle` (sshd writes it from another process, a bit later).
async fn wait_for_log(sshd: &Sshd, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = sshd_log(sshd);
        if log.contains(needle) {
            return log;
        }
        assert!(
            Instant::now() < deadline,
            "sshd log never had {needle:?}:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn virsh_through_the_tunnel_then_drop_removes_the_socket() {
    let (sshd, lv) = tokio::join!(Sshd::start(), Libvirtd::start());
    let (sshd, lv) = (sshd.unwrap(), lv.unwrap());
    let local = tempfile::tempdir().unwrap();
    let remote = lv.socket().to_str().unwrap();

    let t = Instant::now();
    let tunnel = Tunnel::open(&target(&sshd), &material(&sshd), remote, local.path())
        .await
        .unwrap();
    eprintln!("tunnel open in {:?}", t.elapsed());
    let socket = tunnel.socket_path().to_owned();
    let dir = socket.parent().unwrap().to_owned();
    assert!(socket.starts_with(local.path()), "{}", socket.display());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "socket directory mode {mode:o}");
    assert!(tunnel.is_alive());

    // Two sequential connections, each its own channel over the one session.
    let t = Instant::now();
    let pools = virsh(&socket, &["pool-list", "--all", "--name"]).await;
    eprintln!("virsh pool-list through the tunnel in {:?}", t.elapsed());
    assert!(
        pools.lines().any(|l| l.trim() == lv.pool_name()),
        "pool {} not listed: {pools:?}",
        lv.pool_name()
    );
    let domains = virsh(&socket, &["list", "--all"]).await;
    assert!(domains.contains("Name"), "{domains:?}");
    // And two at once.
    let pool_info = ["pool-info", lv.pool_name()];
    let (a, b) = tokio::join!(virsh(&socket, &pool_info), virsh(&socket, &["version"]));
    assert!(a.contains(lv.pool_name()), "{a}");
    assert!(b.contains("libvirt"), "{b}");
    assert!(tunnel.is_alive());
    // One SSH login for all of it.
    let log = wait_for_log(&sshd, "Accepted publickey").await;
    assert_eq!(log.matches("Accepted publickey").count(), 1, "{log}");

    drop(tunnel);
    assert!(!socket.exists(), "socket left behind");
    assert!(!dir.exists(), "socket directory left behind");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());
}

#[tokio::test]
async fn unknown_or_changed_host_key_is_refused_before_auth() {
    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let offered = fingerprint(&sshd.dir().join("host_ed25519.pub")).await;
    let other = SshKey::generate(&sshd.dir().join("other_host"))
        .await
        .unwrap();
    let host = format!("127.0.0.1:{}", sshd.port());

    let cases = [
        ("empty known_hosts", String::new()),
        (
            "only another host",
            format!("[127.0.0.1]:{} {}\n", sshd.port() + 1, sshd.host_pubkey()),
        ),
        (
            "plain entry is port 22 only",
            format!("127.0.0.1 {}\n", sshd.host_pubkey()),
        ),
        (
            "another key for this host",
            format!("[127.0.0.1]:{} {}\n", sshd.port(), other.public),
        ),
        (
            "revoked",
            format!(
                "{}\n@revoked [127.0.0.1]:{} {}\n",
                sshd.known_hosts_line(),
                sshd.port(),
                sshd.host_pubkey()
            ),
        ),
    ];
    let cases_len = cases.len();
    for (name, known_hosts) in cases {
        let material = SshMaterial {
            known_hosts,
            ..material(&sshd)
        };
        let err = Tunnel::open(&target(&sshd), &material, "/unused", local.path())
            .await
            .expect_err(name);
        let TunnelError::HostKey {
            host: h,
            fingerprint,
            problem,
            ..
        } = &err
        else {
            panic!("{name}: expected a host key error, got {err:?}");
        };
        assert_eq!(h, &host, "{name}");
        assert_eq!(fingerprint, &offered, "{name}");
        match name {
            "another key for this host" => {
                assert!(
                    matches!(problem, HostKeyProblem::Mismatch { .. }),
                    "{problem:?}"
                )
            }
            "revoked" => assert_eq!(problem, &HostKeyProblem::Revoked),
            _ => assert!(
                matches!(problem, HostKeyProblem::Unknown { .. }),
                "{name}: {problem:?}"
            ),
        }
        let message = err.to_string();
        assert!(
            message.contains(&host) && message.contains(&offered),
            "{message}"
        );
        assert!(!err.is_transient(), "{name}");
    }
    assert!(std::fs::read_dir(local.path()).unwrap().next().is_none());

    // sshd never saw an authentication attempt: it logs each close as `Connection closed by
    // ADDR [preauth]`, and names the user (`authenticating user root`) once one has started.
    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = sshd_log(&sshd);
        if log.matches("[preauth]").count() >= cases_len || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(log.matches("[preauth]").count(), cases_len, "{log}");
    for never in ["Accepted", "Failed", "authenticating user", "Invalid user"] {
        assert!(!log.contains(never), "sshd log has {never:?}:\n{log}");
    }
}

#[tokio::test]
async fn wrong_client_key_is_refused() {
    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let stranger = SshKey::generate(&sshd.dir().join("stranger"))
        .await
        .unwrap();
    let material = SshMaterial {
        private_key: stranger.private_pem.clone(),
        ..material(&sshd)
    };
    let err = Tunnel::open(&target(&sshd), &material, "/unused", local.path())
        .await
        .unwrap_err();
    let TunnelError::Auth { user, .. } = &err else {
        panic!("expected an auth error, got {err:?}");
    };
    assert_eq!(user, sshd.user());
    assert!(!err.is_transient());
    assert!(err.to_string().contains("publickey"), "{err}");
}

#[tokio::test]
async fn missing_remote_socket_is_a_transient_channel_refusal() {
    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let err = Tunnel::open(
        &target(&sshd),
        &material(&sshd),
        "/nonexistent/libvirt-sock",
        local.path(),
    )
    .await
    .unwrap_err();
    let TunnelError::ChannelRefused { failure, .. } = &err else {
        panic!("expected a channel refusal, got {err:?}");
    };
    assert_eq!(failure, &ChannelOpenFailure::ConnectFailed);
    assert!(err.is_transient());
    assert!(
        err.to_string().contains("/nonexistent/libvirt-sock"),
        "{err}"
    );
}

/// An sshd that forbids forwarding refuses the channel with the same code as a missing socket
/// (OpenSSH logs `request … denied`, the client sees only `ConnectFailed`), so the error names the
/// sshd options to check. `AllowTcpForwarding no` forbids stream-local channels too.
#[tokio::test]
async fn sshd_forbidding_forwarding_is_reported_with_the_option_to_check() {
    let local = tempfile::tempdir().unwrap();
    // A socket that exists, so the refusal is sshd's own.
    let remote = local.path().join("libvirt-sock");
    let _listener = tokio::net::UnixListener::bind(&remote).unwrap();
    for option in ["AllowTcpForwarding no", "AllowStreamLocalForwarding no"] {
        let sshd = Sshd::start_with(option).await.unwrap();
        let err = Tunnel::open(
            &target(&sshd),
            &material(&sshd),
            remote.to_str().unwrap(),
            local.path(),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, TunnelError::ChannelRefused { .. }),
            "{option}: {err:?}"
        );
        let message = err.to_string();
        for part in ["AllowTcpForwarding", "AllowStreamLocalForwarding", "sshd"] {
            assert!(
                message.contains(part),
                "{option}: `{message}` should name {part}"
            );
        }
    }
}

#[tokio::test]
async fn closed_port_is_a_transient_connect_error() {
    // A port sshd listened on a moment ago: nothing there now.
    let port = Sshd::start().await.unwrap().port();
    let local = tempfile::tempdir().unwrap();
    let sshd_gone = SshTarget {
        address: "127.0.0.1".into(),
        port,
        user: "root".into(),
    };
    let material = SshMaterial {
        private_key: SshKey::generate(&local.path().join("k"))
            .await
            .unwrap()
            .private_pem,
        known_hosts: String::new(),
    };
    let err = Tunnel::open(&sshd_gone, &material, "/unused", local.path())
        .await
        .unwrap_err();
    assert!(matches!(err, TunnelError::Connect { .. }), "{err:?}");
    assert!(err.is_transient());
}

/// A unix socket server that echoes what it reads, standing in for libvirtd.
fn echo_server(path: &Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    })
}

#[tokio::test]
async fn bytes_flow_both_ways_and_the_tunnel_dies_with_its_session() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let remote = local.path().join("echo.sock");
    let _echo = echo_server(&remote);
    let tunnel = Tunnel::open(
        &target(&sshd),
        &material(&sshd),
        remote.to_str().unwrap(),
        local.path(),
    )
    .await
    .unwrap();

    // 1 MiB each way (several SSH packets and windows), then a half-close the far end sees.
    let payload: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let mut conn = tokio::net::UnixStream::connect(tunnel.socket_path())
        .await
        .unwrap();
    let (mut r, mut w) = conn.split();
    let send = async {
        w.write_all(&payload).await.unwrap();
        w.shutdown().await.unwrap();
    };
    let mut echoed = Vec::new();
    let recv = r.read_to_end(&mut echoed);
    let (_, n) = tokio::join!(send, recv);
    assert_eq!(n.unwrap(), payload.len());
    assert!(echoed == payload, "echoed bytes differ");
    assert!(tunnel.is_alive());

    // sshd forks a process per connection, in its own session (setsid): stopping the listener
    // leaves it running. Kill the connection's processes, as a crashed or rebooted host would.
    let children = children_of(sshd.pid());
    assert!(!children.is_empty(), "no sshd connection process");
    for pid in children {
        // SAFETY: kill(2) has no memory-safety preconditions; these are our sshd's children.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while tunnel.is_alive() {
        assert!(Instant::now() < deadline, "tunnel still alive without sshd");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New connections are not accepted any more.
    let refused = tokio::net::UnixStream::connect(tunnel.socket_path()).await;
    assert!(refused.is_err(), "a dead tunnel accepted a connection");
}

/// Runs `ssh-keygen` with `args`, panicking with its stderr on failure.
async fn ssh_keygen(args: &[&str], file: &Path) {
    let out = tokio::process::Command::new(debian_binary("/usr/bin/ssh-keygen", "openssh-client"))
        .args(args)
        .arg(file)
        .output()
        .await
        .expect("run ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn hashed_known_hosts_from_ssh_keygen_is_accepted() {
    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let remote = local.path().join("echo.sock");
    let _echo = echo_server(&remote);
    // What `HashKnownHosts yes` (Debian's default ssh_config) writes: `|1|salt|hash key`.
    let file = local.path().join("known_hosts");
    std::fs::write(&file, format!("{}\n", sshd.known_hosts_line())).unwrap();
    ssh_keygen(&["-q", "-H", "-f"], &file).await;
    let hashed = std::fs::read_to_string(&file).unwrap();
    assert!(hashed.starts_with("|1|"), "{hashed}");
    let material = SshMaterial {
        known_hosts: hashed,
        ..material(&sshd)
    };
    let tunnel = Tunnel::open(
        &target(&sshd),
        &material,
        remote.to_str().unwrap(),
        local.path(),
    )
    .await
    .unwrap();
    assert!(tunnel.is_alive());
}

#[tokio::test]
async fn rsa_client_key_authenticates() {
    let sshd = Sshd::start().await.unwrap();
    let local = tempfile::tempdir().unwrap();
    let remote = local.path().join("echo.sock");
    let _echo = echo_server(&remote);
    let key = local.path().join("id_rsa");
    ssh_keygen(&["-q", "-t", "rsa", "-b", "3072", "-N", "", "-f"], &key).await;
    // sshd reads authorized_keys on every login.
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let mut authorized = std::fs::read_to_string(sshd.dir().join("authorized_keys")).unwrap();
    authorized.push_str(&public);
    std::fs::write(sshd.dir().join("authorized_keys"), authorized).unwrap();

    let material = SshMaterial {
        private_key: std::fs::read_to_string(&key).unwrap(),
        ..material(&sshd)
    };
    let tunnel = Tunnel::open(
        &target(&sshd),
        &material,
        remote.to_str().unwrap(),
        local.path(),
    )
    .await
    .unwrap();
    assert!(tunnel.is_alive());
    // OpenSSH 9.2 accepts only rsa-sha2-* signatures by default, so the login itself shows a
    // SHA-2 signature was chosen; the log shows it was the RSA key.
    let log = wait_for_log(&sshd, "Accepted publickey").await;
    assert!(log.contains("ssh2: RSA SHA256:"), "{log}");
}
