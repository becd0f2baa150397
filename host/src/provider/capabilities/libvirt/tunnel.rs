//! An SSH tunnel from a private local unix socket to a hypervisor's libvirt socket, made with
//! russh: the host key is verified against the `known_hosts` text from the `kvm-ssh` Secret (there
//! is no accept-any mode), the client authenticates with its public key, and every connection to
//! the local socket becomes one `direct-streamlocal@openssh.com` channel to the remote socket.
//! libvirt then connects with `qemu+unix:///system?socket=<Tunnel::socket_path>`.
//!
//! libvirt's own `qemu+ssh://` transport is not used: it ignores `known_hosts=` and, with
//! `no_verify=1`, writes the user's known_hosts.

mod known_hosts;

use std::borrow::Cow;
use std::fmt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use russh::ChannelOpenFailure;
use russh::client::{self, AuthResult};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey, PublicKeyOrCertificate};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

pub use known_hosts::HostKeyProblem;
use known_hosts::KnownHosts;

/// TCP connect, key exchange, authentication and the first channel together.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Opening one channel is a single round trip (~0.5 ms on loopback); longer means a dead peer.
const CHANNEL_OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// A keepalive every 15 s, three unanswered ones end the session: a hypervisor that vanished
/// (no RST, e.g. powered off) is noticed within about a minute and the cached tunnel dropped.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_MAX: usize = 3;
/// Per direction. Larger than tokio's 8 KiB default so image uploads fill SSH packets (32 KiB).
const COPY_BUFFER: usize = 64 * 1024;
/// `sun_path` is 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;
const SOCKET_NAME: &str = "libvirt-sock";

/// Where to log in: one hypervisor of a kvm provider instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SshTarget {
    /// Host name or IP address of the hypervisor.
    pub address: String,
    pub port: u16,
    pub user: String,
}

impl SshTarget {
    /// `address:port` (`[v6]:port` for an IPv6 literal), as error messages name the host.
    fn host(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }
}

/// The SSH material from the `kvm-ssh` Secret.
#[derive(Clone)]
pub struct SshMaterial {
    /// The client's private key, OpenSSH text (`-----BEGIN OPENSSH PRIVATE KEY-----`), unencrypted.
    pub private_key: String,
    /// `known_hosts` text: `host`, `[host]:port` or hashed (`|1|…`) entries.
    pub known_hosts: String,
}

impl fmt::Debug for SshMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key; the size of known_hosts is enough to tell an empty one.
        f.debug_struct("SshMaterial")
            .field("private_key", &"<redacted>")
            .field("known_hosts_lines", &self.known_hosts.lines().count())
            .finish()
    }
}

/// Why a tunnel could not be opened. [`TunnelError::is_transient`] says whether trying again later
/// can help; the permanent ones need a change to the Secret, the hypervisor or the config.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The network or the SSH transport failed (refused, reset, timed out, closed by the server).
    #[error("ssh to {host}: {source}")]
    Connect {
        host: String,
        #[source]
        source: russh::Error,
    },
    #[error("ssh to {host}: no answer within {after:?}")]
    Timeout { host: String, after: Duration },
    /// The server's host key is not one `known_hosts` lists for this host.
    #[error("ssh to {host}: host key {algorithm} {fingerprint} {problem}")]
    HostKey {
        host: String,
        algorithm: String,
        fingerprint: String,
        problem: HostKeyProblem,
    },
    /// The server refused the client key.
    #[error(
        "ssh to {host}: public key authentication as {user:?} refused (server accepts: {methods})"
    )]
    Auth {
        host: String,
        user: String,
        methods: String,
    },
    /// The private key in the Secret cannot be used.
    #[error("ssh private key unusable: {source}")]
    KeyUnparseable {
        #[source]
        source: russh::keys::Error,
    },
    /// The server would not open a channel to the remote socket. OpenSSH answers `ConnectFailed`
    /// both when nothing listens there and when its config forbids the channel, so the message
    /// names both causes and the sshd options to check.
    #[error(
        "ssh to {host}: channel to {socket} refused: {failure:?}{}",
        channel_refused_hint(failure, socket)
    )]
    ChannelRefused {
        host: String,
        socket: String,
        failure: ChannelOpenFailure,
    },
    #[error("local socket {path}: {source}")]
    LocalSocket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("local socket path {path} is longer than {MAX_SOCKET_PATH} bytes")]
    SocketPathTooLong { path: PathBuf },
}

/// What to check when sshd refuses the channel to the libvirt socket.
fn channel_refused_hint(failure: &ChannelOpenFailure, socket: &str) -> String {
    const SSHD: &str = "sshd on the hypervisor must allow forwarding to a Unix socket: \
        `AllowTcpForwarding yes` (or `local`; `no` forbids Unix-socket channels too) and \
        `AllowStreamLocalForwarding yes` (or `local`), no `DisableForwarding yes`, and no \
        `restrict` or `no-port-forwarding` on the key in authorized_keys; its log says \
        `request … denied` when this is the cause";
    match failure {
        ChannelOpenFailure::ConnectFailed => format!(
            "; either nothing listens on {socket} (libvirtd down or elsewhere: set `socket` in \
             the grant), or {SSHD}"
        ),
        ChannelOpenFailure::AdministrativelyProhibited => format!("; {SSHD}"),
        _ => String::new(),
    }
}

impl TunnelError {
    /// Whether trying again later may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            TunnelError::Connect { .. } | TunnelError::Timeout { .. } => true,
            TunnelError::LocalSocket { .. } => true,
            // The remote socket is missing (libvirtd restarting) or the server is busy.
            TunnelError::ChannelRefused { failure, .. } => matches!(
                failure,
                ChannelOpenFailure::ConnectFailed | ChannelOpenFailure::ResourceShortage
            ),
            TunnelError::HostKey { .. }
            | TunnelError::Auth { .. }
            | TunnelError::KeyUnparseable { .. }
            | TunnelError::SocketPathTooLong { .. } => false,
        }
    }
}

/// An open tunnel: a private unix socket forwarding to the remote libvirt socket over one SSH
/// session. Dropping it closes the socket (the file and its directory are removed), every
/// forwarded connection and the session.
pub struct Tunnel {
    host: String,
    socket_path: PathBuf,
    session: Arc<client::Handle<Verifier>>,
    accept: JoinHandle<()>,
    _dir: PrivateDir,
}

impl fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tunnel")
            .field("host", &self.host)
            .field("socket_path", &self.socket_path)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl Tunnel {
    /// Connects to `target`, verifies its host key against `material.known_hosts`, authenticates
    /// with `material.private_key`, checks that `remote_socket` can be reached (one channel opened
    /// and closed), and listens on a new private socket in a new 0700 directory under `local_dir`.
    pub async fn open(
        target: &SshTarget,
        material: &SshMaterial,
        remote_socket: &str,
        local_dir: &Path,
    ) -> Result<Tunnel, TunnelError> {
        let host = target.host();
        // Both parsed before any connection: a bad Secret fails without touching the network.
        let key = russh::keys::decode_secret_key(&material.private_key, None)
            .map_err(|source| TunnelError::KeyUnparseable { source })?;
        let known = KnownHosts::for_host(&material.known_hosts, &target.address, target.port);
        // The local side next, so a directory we cannot use fails before the network is touched.
        let dir = PrivateDir::create(local_dir)?;
        let socket_path = dir.path.join(SOCKET_NAME);
        if socket_path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(TunnelError::SocketPathTooLong { path: socket_path });
        }
        let local_err = |source| TunnelError::LocalSocket {
            path: socket_path.clone(),
            source,
        };
        // Nobody knows the path before open() returns: connections cannot arrive early.
        let listener = UnixListener::bind(&socket_path).map_err(local_err)?;
        // The directory already keeps others out; the socket's own mode says so too.
        std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o600))
            .map_err(local_err)?;

        let started = Instant::now();
        let Connected { handle, closed } = tokio::time::timeout(
            CONNECT_TIMEOUT,
            connect(target, &host, known, key, remote_socket),
        )
        .await
        .map_err(|_| TunnelError::Timeout {
            host: host.clone(),
            after: CONNECT_TIMEOUT,
        })??;
        let session = Arc::new(handle);

        debug!(
            host,
            socket = %socket_path.display(),
            remote_socket,
            elapsed = ?started.elapsed(),
            "ssh tunnel open"
        );
        let accept = tokio::spawn(serve(
            listener,
            session.clone(),
            closed,
            remote_socket.to_string(),
            host.clone(),
        ));
        Ok(Tunnel {
            host,
            socket_path,
            session,
            accept,
            _dir: dir,
        })
    }

    /// The local socket: `qemu+unix:///system?socket=<this>`.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Whether the SSH session is up and the local socket still accepts connections. A dead
    /// tunnel never recovers: drop it and open a new one.
    pub fn is_alive(&self) -> bool {
        !self.session.is_closed() && !self.accept.is_finished()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // Aborting the accept loop drops its listener and its JoinSet, which aborts every
        // forwarding task; their channels close, and the session ends when the last handle goes.
        self.accept.abort();
        debug!(host = self.host, "ssh tunnel closed");
    }
}

/// An authenticated session, and a receiver whose `changed()` fails once the session has ended.
struct Connected {
    handle: client::Handle<Verifier>,
    closed: watch::Receiver<()>,
}

async fn connect(
    target: &SshTarget,
    host: &str,
    known: KnownHosts,
    key: russh::keys::PrivateKey,
    remote_socket: &str,
) -> Result<Connected, TunnelError> {
    let connect_err = |source| TunnelError::Connect {
        host: host.to_string(),
        source,
    };
    let config = Arc::new(client::Config {
        preferred: russh::Preferred {
            key: Cow::Owned(known.preferred_algorithms()),
            ..Default::default()
        },
        keepalive_interval: Some(KEEPALIVE_INTERVAL),
        keepalive_max: KEEPALIVE_MAX,
        // libvirt RPC is request/response: Nagle would add latency to every call.
        nodelay: true,
        ..Default::default()
    });
    let (closed_tx, closed) = watch::channel(());
    let verifier = Verifier {
        known,
        _closed: closed_tx,
    };
    let mut handle = client::connect(config, (target.address.as_str(), target.port), verifier)
        .await
        .map_err(|e| match e {
            SessionError::HostKey {
                algorithm,
                fingerprint,
                problem,
            } => TunnelError::HostKey {
                host: host.to_string(),
                algorithm,
                fingerprint,
                problem,
            },
            SessionError::Ssh(e) => connect_err(e),
        })?;

    let hash_alg = if key.algorithm().is_rsa() {
        // rsa-sha2-512/256 when the server says it accepts them (server-sig-algs), else ssh-rsa.
        handle
            .best_supported_rsa_hash()
            .await
            .map_err(connect_err)?
            .flatten()
    } else {
        None
    };
    let key = PrivateKeyWithHashAlg::new(Arc::new(key), hash_alg);
    match handle
        .authenticate_publickey(target.user.clone(), key)
        .await
        .map_err(connect_err)?
    {
        AuthResult::Success => {}
        AuthResult::Failure {
            remaining_methods, ..
        } => {
            let methods: Vec<&str> = remaining_methods.iter().map(<&str>::from).collect();
            return Err(TunnelError::Auth {
                host: host.to_string(),
                user: target.user.clone(),
                methods: if methods.is_empty() {
                    "none".into()
                } else {
                    methods.join(",")
                },
            });
        }
    }

    // One channel now, so a server that forbids streamlocal forwarding or a missing libvirt
    // socket is reported by open() rather than as an EOF on the first libvirt call.
    let probe = open_channel(&handle, host, remote_socket).await?;
    let _ = probe.close().await;
    Ok(Connected { handle, closed })
}

async fn open_channel(
    session: &client::Handle<Verifier>,
    host: &str,
    remote_socket: &str,
) -> Result<russh::Channel<client::Msg>, TunnelError> {
    match tokio::time::timeout(
        CHANNEL_OPEN_TIMEOUT,
        session.channel_open_direct_streamlocal(remote_socket),
    )
    .await
    {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(russh::Error::ChannelOpenFailure(failure))) => Err(TunnelError::ChannelRefused {
            host: host.to_string(),
            socket: remote_socket.to_string(),
            failure,
        }),
        Ok(Err(source)) => Err(TunnelError::Connect {
            host: host.to_string(),
            source,
        }),
        Err(_) => Err(TunnelError::Timeout {
            host: host.to_string(),
            after: CHANNEL_OPEN_TIMEOUT,
        }),
    }
}

/// Accepts local connections until the session ends; each gets its own channel. Owning the
/// forwarding tasks in a JoinSet means aborting this task ends them all.
async fn serve(
    listener: UnixListener,
    session: Arc<client::Handle<Verifier>>,
    mut closed: watch::Receiver<()>,
    remote_socket: String,
    host: String,
) {
    let mut forwards = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((local, _)) => {
                    forwards.spawn(forward(
                        local,
                        session.clone(),
                        remote_socket.clone(),
                        host.clone(),
                    ));
                }
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    warn!(host, error = %e, "ssh tunnel: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = forwards.join_next(), if !forwards.is_empty() => {}
            _ = closed.changed() => {
                // The handler (and with it the sender) is dropped when the session ends.
                warn!(host, "ssh tunnel: session ended");
                return;
            }
        }
    }
}

/// Copies one local connection to a new channel and back until both sides are done.
async fn forward(
    mut local: UnixStream,
    session: Arc<client::Handle<Verifier>>,
    remote_socket: String,
    host: String,
) {
    let started = Instant::now();
    let channel = match open_channel(&session, &host, &remote_socket).await {
        Ok(channel) => channel,
        Err(error) => {
            // Dropping `local` closes it: libvirt reports the connection as closed.
            warn!(host, %error, "ssh tunnel: channel open failed");
            return;
        }
    };
    let opened = started.elapsed();
    let mut remote = channel.into_stream();
    let result =
        tokio::io::copy_bidirectional_with_sizes(&mut local, &mut remote, COPY_BUFFER, COPY_BUFFER)
            .await;
    match result {
        Ok((sent, received)) => debug!(
            host,
            ?opened,
            sent,
            received,
            elapsed = ?started.elapsed(),
            "ssh tunnel: connection done"
        ),
        Err(error) => debug!(host, %error, "ssh tunnel: connection ended with an error"),
    }
}

/// The russh client handler: only host key verification.
struct Verifier {
    known: KnownHosts,
    /// Dropped with the handler when the session ends; see [`Connected::closed`].
    _closed: watch::Sender<()>,
}

/// The handler's error: russh's own, or the host key refused (with what to report).
#[derive(Debug)]
enum SessionError {
    Ssh(russh::Error),
    HostKey {
        algorithm: String,
        fingerprint: String,
        problem: HostKeyProblem,
    },
}

impl From<russh::Error> for SessionError {
    fn from(e: russh::Error) -> Self {
        SessionError::Ssh(e)
    }
}

impl client::Handler for Verifier {
    type Error = SessionError;

    async fn check_server_key(
        &mut self,
        offered: &PublicKeyOrCertificate,
    ) -> Result<bool, SessionError> {
        // Host certificates are never advertised (Preferred::host_key_certificates is empty), so
        // a certificate here is unexpected; it is judged by its bare key like any other key.
        let key: PublicKey = match offered {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => cert.public_key().clone().into(),
        };
        match self.known.verify(key.key_data()) {
            Ok(()) => Ok(true),
            Err(problem) => Err(SessionError::HostKey {
                algorithm: key.algorithm().as_str().to_string(),
                fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
                problem,
            }),
        }
    }
}

/// A new 0700 directory for the local socket, removed (with the socket) on drop.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create(parent: &Path) -> Result<PrivateDir, TunnelError> {
        // A fresh name per tunnel; an existing one (left by a crashed process with the same pid,
        // or made by someone else) is never reused, so the directory is always ours.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!("ssh-tunnel-{}-{n}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(PrivateDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(TunnelError::LocalSocket { path, source }),
            }
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(path = %self.path.display(), error = %e, "ssh tunnel: cannot remove socket directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ";

    /// A valid OpenSSH private key text, from a fixed seed.
    fn test_private_key() -> String {
        use russh::keys::ssh_key::{LineEnding, PrivateKey, private::Ed25519Keypair};
        let key = PrivateKey::from(Ed25519Keypair::from_seed(&[7; 32]));
        key.to_openssh(LineEnding::LF).unwrap().to_string()
    }

    #[test]
    fn material_debug_hides_the_key() {
        let m = SshMaterial {
            private_key: "-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n".into(),
            known_hosts: format!("hv1 {ED_A}\n"),
        };
        let shown = format!("{m:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    /// The connection cache shares tunnels between tasks, and opens them from spawned tasks.
    #[test]
    fn tunnel_is_shareable_and_open_is_send() {
        fn shareable<T: Send + Sync + 'static>() {}
        fn send<T: Send>(_: &T) {}
        shareable::<Tunnel>();
        shareable::<TunnelError>();
        let target = SshTarget {
            address: "hv1".into(),
            port: 22,
            user: "root".into(),
        };
        let material = SshMaterial {
            private_key: String::new(),
            known_hosts: String::new(),
        };
        send(&Tunnel::open(&target, &material, "/s", Path::new("/tmp")));
    }

    /// A socket path the kernel would refuse fails before connecting, and leaves nothing behind.
    #[tokio::test]
    async fn too_long_socket_path_fails_before_connecting() {
        let parent = tempfile::tempdir().unwrap();
        let long = parent.path().join("d".repeat(100));
        std::fs::create_dir(&long).unwrap();
        let target = SshTarget {
            address: "127.0.0.1".into(),
            port: 1,
            user: "root".into(),
        };
        let material = SshMaterial {
            private_key: test_private_key(),
            known_hosts: String::new(),
        };
        let err = Tunnel::open(&target, &material, "/run/libvirt/libvirt-sock", &long)
            .await
            .unwrap_err();
        assert!(
            matches!(err, TunnelError::SocketPathTooLong { .. }),
            "{err}"
        );
        assert!(!err.is_transient());
        assert!(std::fs::read_dir(&long).unwrap().next().is_none());
    }

    /// The key is parsed before any connection: port 1 on loopback is never dialled.
    #[tokio::test]
    async fn unusable_private_key_fails_before_connecting() {
        let target = SshTarget {
            address: "127.0.0.1".into(),
            port: 1,
            user: "root".into(),
        };
        let material = SshMaterial {
            private_key: "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n".into(),
            known_hosts: String::new(),
        };
        let dir = std::env::temp_dir();
        let err = Tunnel::open(&target, &material, "/run/libvirt/libvirt-sock", &dir)
            .await
            .unwrap_err();
        assert!(matches!(err, TunnelError::KeyUnparseable { .. }), "{err}");
        assert!(!err.is_transient());
        assert!(!err.to_string().contains("not a key"), "{err}");
    }
}
