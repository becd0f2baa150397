//! The process's libvirt connections: one SSH tunnel + virt connection per hypervisor, opened on
//! first use and shared by every call and provider instance that reaches it; the SSH material read
//! from its Secret on first use and cached. Only a failure of the connection itself drops a
//! cached connection: an error libvirt answered (no such domain, a bad XML, even its generic
//! "system error" about a file on the hypervisor) leaves it for the next call, so no plugin can
//! make the host drop a connection every provider instance shares.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use tracing::{debug, info, warn};
use virt::connect::Connect;
use virt::error::ErrorNumber;

use super::endpoint::Endpoint;
use super::error::LibvirtError;
use super::import_jobs::Imports;
use super::lanes::{CallLimits, Lane, NoThread};
use super::material::{DEFAULT_OPERATOR_ID, MaterialSource};
use super::records::ProbeReport;
use super::tunnel::{HostKeyProblem, SshMaterial, Tunnel, TunnelError};

/// A libvirtd (or a tunnel) that accepts the connection but never answers its handshake must
/// not hold the hypervisor's connection slot, and so every call to it, forever.
const LIBVIRT_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// An open tunnel and the libvirt connection through it.
pub(crate) struct Connection {
    // Declared first so it drops first: with the socket gone, closing the libvirt connection
    // cannot wait on a peer.
    tunnel: Tunnel,
    virt: Option<Connect>,
}

impl Connection {
    pub fn virt(&self) -> &Connect {
        self.virt.as_ref().expect("present until drop")
    }

    fn is_alive(&self) -> bool {
        self.tunnel.is_alive()
    }

    /// Whether the tunnel and the libvirt client both still hold the connection open (no RPC:
    /// libvirt's client marks a connection closed when its socket fails), and if not, which
    /// one let go: the SSH session, or libvirtd with the session still up.
    fn link(&self) -> Link {
        if !self.is_alive() {
            Link::SshDropped
        } else if !self.virt().is_alive().unwrap_or(false) {
            Link::LibvirtClosed
        } else {
            Link::Open
        }
    }
}

/// The state of a connection after a failed call, as [`Connection::link`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Open,
    /// The SSH session ended (reset, closed by the server, keepalives unanswered).
    SshDropped,
    /// The SSH session is up but libvirt's client saw its socket close (libvirtd restarted or
    /// closed the connection, or sshd closed the channel).
    LibvirtClosed,
}

/// Why a call's connection is gone, so its error says it instead of libvirt's bare
/// "Cannot write data: Broken pipe".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lost {
    Ssh,
    Libvirt,
    /// The libvirt handle itself is unusable (no SSH or socket failure seen).
    Handle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        // virConnectClose is a blocking RPC: off the async runtime when there is one.
        if let Some(virt) = self.virt.take() {
            let close = move || {
                let mut virt = virt;
                let _ = virt.close();
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(close)),
                Err(_) => close(),
            }
        }
    }
}

/// One hypervisor's cached connection and the lane of its calls. The async mutex serialises
/// opening the connection; waiting for it is cancellable, so a call's deadline interrupts the
/// wait.
struct HostSlot {
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    lane: Lane,
}

/// The process's libvirt connections and SSH material.
pub struct LibvirtHub {
    /// The operator installation: part of the owner mark on every domain its plugins define.
    operator_id: String,
    material: MaterialSource,
    tunnel_dir: PathBuf,
    limits: CallLimits,
    materials: tokio::sync::Mutex<HashMap<String, SshMaterial>>,
    slots: Mutex<HashMap<Endpoint, Arc<HostSlot>>>,
    pub(crate) imports: Imports,
    /// Connections opened since start: shows (in tests and logs) that calls share them.
    opened: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for LibvirtHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LibvirtHub")
            .field("material", &self.material)
            .field("tunnel_dir", &self.tunnel_dir)
            .finish()
    }
}

impl LibvirtHub {
    /// A hub whose tunnels' sockets live in new private directories under `tunnel_dir`, for the
    /// default operator id (`proxy-operator`, as `--operator-id` defaults to).
    pub fn new(material: MaterialSource, tunnel_dir: PathBuf) -> Arc<Self> {
        Self::for_operator(DEFAULT_OPERATOR_ID, material, tunnel_dir)
    }

    /// A hub for operator installation `operator_id` (`--operator-id`): the domains its
    /// plugins define carry it in their owner mark, and its plugins see only those.
    pub fn for_operator(
        operator_id: &str,
        material: MaterialSource,
        tunnel_dir: PathBuf,
    ) -> Arc<Self> {
        Self::with_limits(operator_id, material, tunnel_dir, CallLimits::default())
    }

    /// Like [`LibvirtHub::for_operator`], with other bounds on each hypervisor's calls.
    pub fn with_limits(
        operator_id: &str,
        material: MaterialSource,
        tunnel_dir: PathBuf,
        limits: CallLimits,
    ) -> Arc<Self> {
        // libvirt prints every error to stderr by default; they are returned and logged instead.
        static QUIET: OnceLock<()> = OnceLock::new();
        QUIET.get_or_init(virt::error::clear_error_callback);
        Arc::new(LibvirtHub {
            operator_id: operator_id.to_string(),
            material,
            tunnel_dir,
            limits,
            materials: Default::default(),
            slots: Default::default(),
            imports: Default::default(),
            opened: Default::default(),
        })
    }

    /// The operator installation this hub serves.
    pub fn operator_id(&self) -> &str {
        &self.operator_id
    }

    /// Libvirt calls blocking a thread now, over all hypervisors (bounded by
    /// [`CallLimits::threads`] per hypervisor, even when one hangs).
    pub fn blocking_calls(&self) -> usize {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.values().map(|s| s.lane.blocking()).sum()
    }

    /// How many hypervisor connections this hub has opened (a reconnect counts again).
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The SSH material named `secret`, read on first use and cached.
    async fn material(&self, secret: &str) -> Result<SshMaterial, LibvirtError> {
        let mut cache = self.materials.lock().await;
        if let Some(material) = cache.get(secret) {
            return Ok(material.clone());
        }
        let material = match &self.material {
            MaterialSource::Static(material) => material.clone(),
            MaterialSource::Secrets { client, namespace } => {
                read_secret(client, namespace, secret).await?
            }
        };
        // Parsed now, so a broken key is reported as the Secret's fault, not the host's.
        russh::keys::decode_secret_key(&material.private_key, None).map_err(|e| {
            LibvirtError::AuthFailed(format!(
                "the ssh-privatekey in Secret {secret} cannot be used: {e}; put an unencrypted OpenSSH private key there"
            ))
        })?;
        cache.insert(secret.to_string(), material.clone());
        Ok(material)
    }

    /// Forgets cached material, so a corrected Secret is read on the next call.
    async fn forget_material(&self, secret: &str) {
        self.materials.lock().await.remove(secret);
    }

    fn slot(&self, endpoint: &Endpoint) -> Arc<HostSlot> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(endpoint.clone())
            .or_insert_with(|| {
                Arc::new(HostSlot {
                    connection: Default::default(),
                    lane: Lane::new(&self.limits),
                })
            })
            .clone()
    }

    /// The cached connection to `endpoint`, or a new one.
    pub(crate) async fn connection(
        &self,
        endpoint: &Endpoint,
    ) -> Result<Arc<Connection>, LibvirtError> {
        let slot = self.slot(endpoint);
        let mut cached = slot.connection.lock().await;
        if let Some(connection) = cached.as_ref() {
            if connection.is_alive() {
                return Ok(connection.clone());
            }
            info!(hypervisor = %endpoint.label(), "ssh tunnel closed; reconnecting");
            *cached = None;
        }
        let material = self.material(&endpoint.secret).await?;
        let started = Instant::now();
        let tunnel = Tunnel::open(
            &endpoint.target,
            &material,
            &endpoint.socket,
            &self.tunnel_dir,
        )
        .await;
        let tunnel = match tunnel {
            Ok(tunnel) => tunnel,
            Err(e) => {
                if matches!(
                    e,
                    TunnelError::HostKey { .. }
                        | TunnelError::Auth { .. }
                        | TunnelError::KeyUnparseable { .. }
                ) {
                    self.forget_material(&endpoint.secret).await;
                }
                warn!(hypervisor = %endpoint.label(), error = %e, "cannot reach the hypervisor");
                return Err(from_tunnel(e));
            }
        };
        let uri = format!(
            "qemu+unix:///system?socket={}",
            tunnel.socket_path().display()
        );
        let opening = tokio::task::spawn_blocking(move || Connect::open(Some(&uri)));
        let Ok(opened) = tokio::time::timeout(LIBVIRT_OPEN_TIMEOUT, opening).await else {
            // Dropping the tunnel closes libvirt's socket, which ends the blocking open.
            drop(tunnel);
            warn!(hypervisor = %endpoint.label(), "libvirt did not answer the connection; tunnel closed");
            return Err(LibvirtError::Timeout(format!(
                "libvirt on {} did not answer the connection within {} s",
                endpoint.label(),
                LIBVIRT_OPEN_TIMEOUT.as_secs()
            )));
        };
        let virt = opened
            .map_err(|e| LibvirtError::Transport(format!("libvirt connect: {e}")))?
            .map_err(|e| {
                LibvirtError::Transport(format!(
                    "libvirt on {} does not answer: {}",
                    endpoint.label(),
                    e.message()
                ))
            })?;
        let opened = self
            .opened
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        info!(
            hypervisor = %endpoint.label(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            connections_opened = opened,
            "connected to libvirt over ssh"
        );
        let connection = Arc::new(Connection {
            tunnel,
            virt: Some(virt),
        });
        *cached = Some(connection.clone());
        Ok(connection)
    }

    /// Drops the cached connection if it is still `broken` (a newer one is kept).
    async fn drop_connection(&self, endpoint: &Endpoint, broken: &Arc<Connection>) {
        let slot = self.slot(endpoint);
        let mut cached = slot.connection.lock().await;
        if cached.as_ref().is_some_and(|c| Arc::ptr_eq(c, broken)) {
            warn!(hypervisor = %endpoint.label(), "dropping the libvirt connection after a transport error");
            *cached = None;
        }
    }

    /// Runs one libvirt call on a blocking thread over the cached connection, within the
    /// hypervisor's lane and deadline ([`CallLimits`]), logs it as one debug line, and drops the
    /// connection when the connection itself failed.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        endpoint: &Endpoint,
        rpc: &'static str,
        ids: &str,
        op: impl FnOnce(&Connect) -> Result<T, virt::error::Error> + Send + 'static,
    ) -> Result<T, LibvirtError> {
        self.call_within(endpoint, rpc, ids, Some(self.limits.deadline), op)
            .await
    }

    /// Like [`LibvirtHub::call`] without a deadline, for streams as long as an image (uploads,
    /// digests, copies): still one of the lane's threads.
    pub(crate) async fn call_streaming<T: Send + 'static>(
        &self,
        endpoint: &Endpoint,
        rpc: &'static str,
        ids: &str,
        op: impl FnOnce(&Connect) -> Result<T, virt::error::Error> + Send + 'static,
    ) -> Result<T, LibvirtError> {
        self.call_within(endpoint, rpc, ids, None, op).await
    }

    async fn call_within<T: Send + 'static>(
        &self,
        endpoint: &Endpoint,
        rpc: &'static str,
        ids: &str,
        deadline: Option<Duration>,
        op: impl FnOnce(&Connect) -> Result<T, virt::error::Error> + Send + 'static,
    ) -> Result<T, LibvirtError> {
        let started = Instant::now();
        let slot = self.slot(endpoint);
        let result: Result<T, Failure> = async {
            // Held until the caller is answered: a bounded number of callers per hypervisor.
            let _place = slot.lane.admit().map_err(|_| self.no_thread(endpoint, rpc, ids, NoThread::Full))?;
            let connection = self.connection(endpoint).await?;
            let left = |d: Duration| d.saturating_sub(started.elapsed());
            let thread = slot
                .lane
                .thread(deadline.map(left))
                .await
                .map_err(|why| self.no_thread(endpoint, rpc, ids, why))?;
            let shared = connection.clone();
            let work = tokio::task::spawn_blocking(move || {
                let _blocking = thread.enter();
                let outcome = op(shared.virt());
                // Asked after a failure only: it is what tells the two kinds apart.
                let link = if outcome.is_ok() {
                    Link::Open
                } else {
                    shared.link()
                };
                (outcome, link)
            });
            let joined = match deadline {
                // Past the deadline the thread goes on (blocked in C) and keeps its place.
                Some(d) => tokio::time::timeout(left(d), work).await.map_err(|_| {
                    LibvirtError::Timeout(format!(
                        "{rpc} {ids}: {} did not answer within {d:?}; the call goes on in the background",
                        endpoint.label()
                    ))
                })?,
                None => work.await,
            };
            let (outcome, link) =
                joined.map_err(|e| LibvirtError::Failed(format!("{rpc}: {e}")))?;
            outcome.map_err(|e| {
                let lost = connection_lost(e.code(), link);
                Failure {
                    error: classify(rpc, ids, &endpoint.label(), e.code(), e.message(), lost),
                    broken: lost.is_some().then_some(connection),
                }
            })
        }
        .await;
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(value) => {
                debug!(rpc, hypervisor = %endpoint.label(), ids, elapsed_ms, "libvirt call");
                Ok(value)
            }
            Err(Failure { error, broken }) => {
                debug!(rpc, hypervisor = %endpoint.label(), ids, elapsed_ms, error = %error, "libvirt call");
                if let Some(broken) = broken {
                    self.drop_connection(endpoint, &broken).await;
                }
                Err(error)
            }
        }
    }

    /// `timeout` for a call that got no thread: the hypervisor's earlier calls still block them.
    fn no_thread(&self, endpoint: &Endpoint, rpc: &str, ids: &str, why: NoThread) -> LibvirtError {
        let CallLimits {
            deadline,
            threads,
            waiting,
        } = self.limits;
        LibvirtError::Timeout(match why {
            NoThread::Full => format!(
                "{rpc} {ids}: {} has {threads} libvirt calls under way and {waiting} waiting, none answered; not queueing more",
                endpoint.label()
            ),
            NoThread::Deadline => format!(
                "{rpc} {ids}: none of the {threads} libvirt calls under way on {} finished within {deadline:?}",
                endpoint.label()
            ),
        })
    }

    /// SSH and libvirt reachable within `timeout`. A slow answer is given up on without dropping
    /// the shared connection (the call finishes in the background).
    pub(crate) async fn probe(
        &self,
        endpoint: &Endpoint,
        timeout: Duration,
    ) -> Result<ProbeReport, LibvirtError> {
        let started = Instant::now();
        let work = async {
            let connection = self.connection(endpoint).await?;
            let ssh_ms = started.elapsed().as_millis() as u32;
            let libvirt_started = Instant::now();
            let version = self
                .call(endpoint, "connect-get-lib-version", "", |c| {
                    c.get_lib_version()
                })
                .await?;
            drop(connection);
            Ok(ProbeReport {
                ssh_ms,
                libvirt_ms: libvirt_started.elapsed().as_millis() as u32,
                libvirt_version: format!(
                    "{}.{}.{}",
                    version / 1_000_000,
                    version / 1000 % 1000,
                    version % 1000
                ),
            })
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(LibvirtError::Timeout(format!(
                    "{} did not answer within {timeout:?}",
                    endpoint.label()
                )))
            })
    }
}

/// A failed call and the connection to drop, if the transport failed.
struct Failure {
    error: LibvirtError,
    broken: Option<Arc<Connection>>,
}

impl From<LibvirtError> for Failure {
    fn from(error: LibvirtError) -> Self {
        Failure {
            error,
            broken: None,
        }
    }
}

async fn read_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<SshMaterial, LibvirtError> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let secret = api.get_opt(name).await.map_err(|e| {
        LibvirtError::Transport(format!("cannot read Secret {namespace}/{name}: {e}"))
    })?;
    let Some(secret) = secret else {
        return Err(LibvirtError::Transport(format!(
            "the Secret {namespace}/{name} with the SSH key for the hypervisors does not exist; create it: \
             kubectl -n {namespace} create secret generic {name} --from-file=ssh-privatekey=KEY --from-file=known_hosts=FILE"
        )));
    };
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| -> Result<String, LibvirtError> {
        let bytes = data.get(key).ok_or_else(|| {
            LibvirtError::AuthFailed(format!(
                "Secret {namespace}/{name} has no `{key}` key (it needs ssh-privatekey and known_hosts)"
            ))
        })?;
        String::from_utf8(bytes.0.clone()).map_err(|_| {
            LibvirtError::AuthFailed(format!("Secret {namespace}/{name}: `{key}` is not text"))
        })
    };
    Ok(SshMaterial {
        private_key: text("ssh-privatekey")?,
        known_hosts: text("known_hosts")?,
    })
}

/// Whether (and how) a failed call means the connection itself is gone (`link`: what the tunnel
/// and libvirt's client say of it), rather than an error libvirt answered over it. Error codes
/// alone cannot tell: libvirt answers "system error" for a missing file on the hypervisor as
/// well as for a reset socket.
fn connection_lost(code: ErrorNumber, link: Link) -> Option<Lost> {
    match link {
        Link::SshDropped => Some(Lost::Ssh),
        Link::LibvirtClosed => Some(Lost::Libvirt),
        Link::Open if matches!(code, ErrorNumber::NoConnect | ErrorNumber::InvalidConn) => {
            Some(Lost::Handle)
        }
        Link::Open => None,
    }
}

/// A libvirt error as the WIT variant; `transport` only when the connection was lost, and then
/// the message says which part of it (`host`: the hypervisor's SSH address).
fn classify(
    rpc: &str,
    ids: &str,
    host: &str,
    code: ErrorNumber,
    libvirt_message: &str,
    lost: Option<Lost>,
) -> LibvirtError {
    let message = format!("{rpc} {ids}: {libvirt_message}");
    match code {
        ErrorNumber::NoDomain
        | ErrorNumber::NoStoragePool
        | ErrorNumber::NoStorageVolume
        | ErrorNumber::NoDomainMetadata
        | ErrorNumber::NoNetwork => LibvirtError::NotFound(message),
        // Answers only libvirtd gives: true even if the connection went right after.
        ErrorNumber::AuthFailed | ErrorNumber::AccessDenied => LibvirtError::AuthFailed(message),
        _ => match lost {
            Some(Lost::Ssh) => LibvirtError::Transport(format!(
                "{rpc} {ids}: the SSH connection to {host} dropped ({libvirt_message})"
            )),
            Some(Lost::Libvirt) => LibvirtError::Transport(format!(
                "{rpc} {ids}: libvirtd on {host} closed the connection, the SSH session still up ({libvirt_message})"
            )),
            Some(Lost::Handle) => LibvirtError::Transport(message),
            None => LibvirtError::Failed(message),
        },
    }
}

fn from_tunnel(e: TunnelError) -> LibvirtError {
    let message = e.to_string();
    match e {
        TunnelError::Connect { source, .. } => match source {
            russh::Error::IO(_) | russh::Error::Disconnect | russh::Error::HUP => {
                LibvirtError::Transport(message)
            }
            _ => LibvirtError::SshHandshakeFailed(message),
        },
        TunnelError::Timeout { .. } => LibvirtError::Timeout(message),
        TunnelError::HostKey { problem, .. } => match problem {
            HostKeyProblem::Unknown { .. }
            | HostKeyProblem::Mismatch { .. }
            | HostKeyProblem::Revoked => LibvirtError::HostKeyMismatch(message),
        },
        TunnelError::Auth { .. } | TunnelError::KeyUnparseable { .. } => {
            LibvirtError::AuthFailed(message)
        }
        TunnelError::ChannelRefused { .. } | TunnelError::LocalSocket { .. } => {
            LibvirtError::Transport(message)
        }
        TunnelError::SocketPathTooLong { .. } => LibvirtError::Failed(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failed_connection_is_dropped() {
        use Link::{LibvirtClosed, Open, SshDropped};
        let cases = [
            // What libvirt answers over a working connection: kept, whatever the code.
            (ErrorNumber::SystemError, Open, None),
            (ErrorNumber::Rpc, Open, None),
            (ErrorNumber::NoDomain, Open, None),
            (ErrorNumber::XmlError, Open, None),
            (ErrorNumber::OperationFailed, Open, None),
            // The connection is closed (a reset socket, a dead tunnel): dropped.
            (ErrorNumber::SystemError, SshDropped, Some(Lost::Ssh)),
            (ErrorNumber::Rpc, SshDropped, Some(Lost::Ssh)),
            (ErrorNumber::NoDomain, SshDropped, Some(Lost::Ssh)),
            (ErrorNumber::SystemError, LibvirtClosed, Some(Lost::Libvirt)),
            // The handle itself is unusable.
            (ErrorNumber::NoConnect, Open, Some(Lost::Handle)),
            (ErrorNumber::InvalidConn, Open, Some(Lost::Handle)),
        ];
        for (code, link, lost) in cases {
            assert_eq!(connection_lost(code, link), lost, "{code:?} {link:?}");
        }
    }

    /// A lost connection is a transport error that says which part was lost; an answer only
    /// libvirtd gives keeps its kind; over a working connection, anything else is `failed`.
    #[test]
    fn a_lost_connection_is_named_in_the_error() {
        let host = "root@hv1:22";
        let cases: [(ErrorNumber, Option<Lost>, &str); 6] = [
            (
                ErrorNumber::SystemError,
                Some(Lost::Ssh),
                "transport: storage-vol-upload v: the SSH connection to root@hv1:22 dropped (Cannot write data: Broken pipe)",
            ),
            (
                ErrorNumber::Rpc,
                Some(Lost::Libvirt),
                "transport: storage-vol-upload v: libvirtd on root@hv1:22 closed the connection, the SSH session still up (Cannot write data: Broken pipe)",
            ),
            (
                ErrorNumber::NoConnect,
                Some(Lost::Handle),
                "transport: storage-vol-upload v: Cannot write data: Broken pipe",
            ),
            (
                ErrorNumber::SystemError,
                None,
                "failed: storage-vol-upload v: Cannot write data: Broken pipe",
            ),
            (
                ErrorNumber::NoStorageVolume,
                Some(Lost::Ssh),
                "not found: storage-vol-upload v: Cannot write data: Broken pipe",
            ),
            (
                ErrorNumber::AccessDenied,
                None,
                "authentication failed: storage-vol-upload v: Cannot write data: Broken pipe",
            ),
        ];
        for (code, lost, expected) in cases {
            let error = classify(
                "storage-vol-upload",
                "v",
                host,
                code,
                "Cannot write data: Broken pipe",
                lost,
            );
            assert_eq!(error.to_string(), expected, "{code:?} {lost:?}");
        }
    }
}
