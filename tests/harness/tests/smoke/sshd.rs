use anyhow::Result;
use harness::{SshKey, Sshd};

#[tokio::test]
async fn ssh_with_host_key_verification() -> Result<()> {
    let t = std::time::Instant::now();
    let sshd = Sshd::start().await?;
    eprintln!("sshd started in {:?}", t.elapsed());
    assert!(
        sshd.client_key_pem()
            .starts_with("-----BEGIN OPENSSH PRIVATE KEY-----")
    );
    assert_eq!(
        sshd.known_hosts_line(),
        format!("[127.0.0.1]:{} {}", sshd.port(), sshd.host_pubkey())
    );
    assert!(sshd.host_pubkey().starts_with("ssh-ed25519 "));

    let ok = sshd
        .ssh_command(sshd.known_hosts_path())
        .arg("true")
        .output()
        .await?;
    assert!(
        ok.status.success(),
        "ssh failed: {}",
        String::from_utf8_lossy(&ok.stderr)
    );

    // A known_hosts entry with another key for the same host:port must fail.
    let other = SshKey::generate(&sshd.dir().join("other_host_key")).await?;
    let wrong = sshd.dir().join("wrong_known_hosts");
    std::fs::write(
        &wrong,
        format!("[127.0.0.1]:{} {}\n", sshd.port(), other.public),
    )?;
    let bad = sshd.ssh_command(&wrong).arg("true").output().await?;
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "ssh must refuse a changed host key");
    assert!(stderr.contains("Host key verification failed"), "{stderr}");

    // No entry at all must fail too (StrictHostKeyChecking=yes).
    let empty = sshd.dir().join("empty_known_hosts");
    std::fs::write(&empty, "")?;
    let bad = sshd.ssh_command(&empty).arg("true").output().await?;
    assert!(!bad.status.success(), "ssh must refuse an unknown host");
    Ok(())
}
