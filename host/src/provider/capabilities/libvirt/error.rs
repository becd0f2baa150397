//! How a libvirt call fails, as the plugin sees it.

/// Why a libvirt call failed, as the WIT `libvirt-error` variant says it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibvirtError {
    #[error("denied: {0}")]
    Denied(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("transport: {0}")]
    Transport(String),
    #[error("ssh handshake failed: {0}")]
    SshHandshakeFailed(String),
    #[error("host key mismatch: {0}")]
    HostKeyMismatch(String),
    #[error("authentication failed: {0}")]
    AuthFailed(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("failed: {0}")]
    Failed(String),
    #[error("checksum mismatch: {0}")]
    ChecksumMismatch(String),
}
