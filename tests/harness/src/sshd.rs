//! OpenSSH sshd (Debian) on a free loopback port, with generated ed25519 keys.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::bins::debian_binary;
use crate::process::{Check, Proc, Scratch, free_port, run_output, wait_for};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// sshd on `127.0.0.1:PORT` accepting only the generated client key (for the
/// user running the tests), with TCP and unix-socket forwarding allowed (the
/// KVM provider tunnels libvirt's socket through it). Stopped on drop.
pub struct Sshd {
    proc: Proc,
    port: u16,
    user: String,
    client_key_pem: String,
    client_key_path: PathBuf,
    client_pubkey: String,
    host_pubkey: String,
    known_hosts_line: String,
    known_hosts_path: PathBuf,
    scratch: Scratch,
}

/// An ed25519 key pair made by `ssh-keygen`.
pub struct SshKey {
    /// OpenSSH private key text (`-----BEGIN OPENSSH PRIVATE KEY-----`).
    pub private_pem: String,
    pub private_path: PathBuf,
    /// `ssh-ed25519 AAAA...` (no comment).
    pub public: String,
}

impl SshKey {
    /// Generates a key pair at `path` (private) and `path.pub`.
    pub async fn generate(path: &Path) -> Result<SshKey> {
        let keygen = debian_binary("/usr/bin/ssh-keygen", "openssh-client");
        run_output(
            tokio::process::Command::new(keygen)
                .args([
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "proxy-operator-harness",
                    "-f",
                ])
                .arg(path),
        )
        .await?;
        let private_pem = std::fs::read_to_string(path)?;
        let public_full = std::fs::read_to_string(path.with_extension("pub"))?;
        let public = public_full
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        Ok(SshKey {
            private_pem,
            private_path: path.to_owned(),
            public,
        })
    }
}

impl Sshd {
    /// Generates keys, writes the config and starts `sshd -D -e`; waits for the
    /// SSH banner.
    pub async fn start() -> Result<Sshd> {
        Self::start_with("").await
    }

    /// Like [`Sshd::start`], with `overrides` (sshd_config lines, e.g. `AllowTcpForwarding no`)
    /// placed first: sshd takes the first value of each keyword, so they win over the defaults.
    pub async fn start_with(overrides: &str) -> Result<Sshd> {
        let sshd = debian_binary("/usr/sbin/sshd", "openssh-server");
        let scratch = Scratch::new("sshd")?;
        let dir = scratch.path().to_owned();
        let host = SshKey::generate(&dir.join("host_ed25519")).await?;
        let client = SshKey::generate(&dir.join("client_ed25519")).await?;
        let authorized = dir.join("authorized_keys");
        std::fs::write(&authorized, format!("{}\n", client.public))?;
        let port = free_port()?;
        let known_hosts_line = format!("[127.0.0.1]:{port} {}", host.public);
        let known_hosts_path = dir.join("known_hosts");
        std::fs::write(&known_hosts_path, format!("{known_hosts_line}\n"))?;

        let conf = dir.join("sshd_config");
        std::fs::write(
            &conf,
            format!(
                "# proxy-operator test harness
{overrides}
ListenAddress 127.0.0.1:{port}
HostKey {host_key}
AuthorizedKeysFile {authorized}
PidFile {dir}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
",
                host_key = host.private_path.display(),
                authorized = authorized.display(),
                dir = dir.display(),
            ),
        )?;
        // Privilege separation directory (root only; Debian's unit creates it).
        if unsafe { libc::geteuid() } == 0 {
            std::fs::create_dir_all("/run/sshd").context("create /run/sshd")?;
        }

        let mut cmd = Command::new(sshd);
        cmd.arg("-D").arg("-e").arg("-f").arg(&conf);
        let mut proc = Proc::spawn("sshd", cmd, &dir.join("sshd.log"))?;
        let addr = ([127, 0, 0, 1], port).into();
        wait_for("sshd banner", START_TIMEOUT, || {
            let exited = proc.ensure_running().err();
            async move {
                if let Some(e) = exited {
                    return Check::Failed(e);
                }
                match banner(addr).await {
                    Ok(b) if b.starts_with("SSH-2.0-") => Check::Ready(()),
                    Ok(b) => Check::NotYet(format!("unexpected banner {b:?}")),
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await?;

        Ok(Sshd {
            proc,
            port,
            user: current_user()?,
            client_key_pem: client.private_pem,
            client_key_path: client.private_path,
            client_pubkey: client.public,
            host_pubkey: host.public,
            known_hosts_line,
            known_hosts_path,
            scratch,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// The user to log in as (the one running the tests).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The client's private key, OpenSSH format (what goes into a Secret).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key_pem
    }

    /// The client's private key file (mode 0600).
    pub fn client_key_path(&self) -> &Path {
        &self.client_key_path
    }

    /// `ssh-ed25519 AAAA...` of the client key.
    pub fn client_pubkey(&self) -> &str {
        &self.client_pubkey
    }

    /// `ssh-ed25519 AAAA...` of the host key.
    pub fn host_pubkey(&self) -> &str {
        &self.host_pubkey
    }

    /// `[127.0.0.1]:PORT ssh-ed25519 AAAA...`
    pub fn known_hosts_line(&self) -> &str {
        &self.known_hosts_line
    }

    /// A known_hosts file holding [`Sshd::known_hosts_line`].
    pub fn known_hosts_path(&self) -> &Path {
        &self.known_hosts_path
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// The real `ssh` client, set up for this server: the client key only,
    /// strict host-key checking against `known_hosts`, no config files, batch mode.
    /// Append the remote command.
    pub fn ssh_command(&self, known_hosts: &Path) -> tokio::process::Command {
        let ssh = debian_binary("/usr/bin/ssh", "openssh-client");
        let mut cmd = tokio::process::Command::new(ssh);
        cmd.arg("-F")
            .arg("/dev/null")
            .arg("-i")
            .arg(&self.client_key_path)
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
            .args([
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
            ])
            .arg(format!("{}@127.0.0.1", self.user));
        cmd
    }
}

async fn banner(addr: std::net::SocketAddr) -> Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .context("no banner within 5 s")??;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Name of the effective user.
pub(crate) fn current_user() -> Result<String> {
    // SAFETY: getpwuid returns static storage or null; copied out at once.
    unsafe {
        let pw = libc::getpwuid(libc::geteuid());
        if pw.is_null() {
            bail!("no passwd entry for uid {}", libc::geteuid());
        }
        Ok(std::ffi::CStr::from_ptr((*pw).pw_name)
            .to_string_lossy()
            .into_owned())
    }
}
