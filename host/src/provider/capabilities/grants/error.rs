//! A grant that cannot be used.

/// A grant that cannot be used, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("grants.http.allow[{index}]: {message}")]
    HttpAllow { index: usize, message: String },
    #[error("grants.http.credentials[{index}]: {message}")]
    HttpCredential { index: usize, message: String },
    #[error("grants.http: {0}")]
    HttpClient(String),
    #[error("grants.libvirt.{0}")]
    Libvirt(String),
    /// A `libvirt` grant given to a binary built without libvirt (`libvirt::check_compiled_in`).
    #[error("grants.libvirt: {0}")]
    LibvirtUnavailable(String),
    #[error("grants.kube.{0}")]
    Kube(String),
}
