//! TLS for the operator's own listeners (the discovery API, docs/security.md "TLS"): rustls with
//! aws-lc-rs (the crypto stack kube already builds), a certificate and key from files, as a
//! `kubernetes.io/tls` Secret mounts them (`tls.crt`, `tls.key`), reloaded when they change.
//!
//! The files are read again every few seconds and compared by content digest: a Secret volume is
//! updated by swapping its `..data` symlink, which a watch on the files themselves misses, and no
//! file-watch crate is in the build (a poll of two small files costs nothing). A new certificate
//! is used for new connections; open ones keep the one they began with. A change that does not
//! load (a key that does not match, a half-written file) keeps the certificate in use, and is
//! said once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};

/// How often the certificate files are read again. A Secret volume follows its Secret within
/// the kubelet's sync period (about a minute), so a few seconds more is nothing.
pub const RELOAD_EVERY: Duration = Duration::from_secs(3);
/// A client that has not finished its handshake by then is dropped (it holds a task and a socket).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate chain and private key files (PEM), e.g. a Secret's `tls.crt` and `tls.key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What one look at the files found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The same content as last time.
    Unchanged,
    /// A new certificate, in use from now on.
    Loaded,
    /// A change that does not load (said once per content); the certificate in use stays.
    Invalid(String),
    /// A file cannot be read (the Secret does not exist yet, a wrong path).
    Missing(String),
}

/// The aws-lc-rs provider every TLS listener and client of the operator uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The certificate and key in `cert_pem` and `key_pem`, checked to belong together. Errors name
/// the file and what to put there.
pub fn parse_pair(
    files: &CertFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "{}: not a PEM certificate chain ({e})",
                files.cert.display()
            )
        })?;
    if chain.is_empty() {
        return Err(format!(
            "{}: no certificate in it (expected `-----BEGIN CERTIFICATE-----`, a Secret's tls.crt)",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        format!(
            "{}: no PEM private key in it ({e}; expected PKCS#8, PKCS#1 or SEC1, a Secret's tls.key)",
            files.key.display()
        )
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        format!(
            "{} and {} do not make a certificate and its key ({e}); are both from the same Secret?",
            files.cert.display(),
            files.key.display()
        )
    })
}

/// A certificate from [`CertFiles`], reloaded by [`ReloadingCert::watch`]; rustls asks it for
/// the certificate at each handshake.
pub struct ReloadingCert {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The digest of the content last looked at (loaded or refused), so each is said once.
    seen: Mutex<Option<[u8; 32]>>,
    /// Whether the files' absence was said (once until they are back).
    missing_said: AtomicBool,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Reads the files once; without them (a Secret not created yet) handshakes fail until they
    /// appear, and the process still starts.
    pub fn new(files: CertFiles) -> Arc<Self> {
        let cert = Arc::new(ReloadingCert {
            files,
            provider: provider(),
            current: RwLock::new(None),
            seen: Mutex::new(None),
            missing_said: AtomicBool::new(false),
        });
        cert.report(cert.reload());
        cert
    }

    /// Reads the files; loads them when their content changed.
    pub fn reload(&self) -> Reload {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                format!(
                    "{}: {e} (is the TLS Secret mounted? its keys are tls.crt and tls.key)",
                    path.display()
                )
            })
        };
        let (cert_pem, key_pem) = match (read(&self.files.cert), read(&self.files.key)) {
            (Ok(cert), Ok(key)) => (cert, key),
            (Err(e), _) | (_, Err(e)) => return Reload::Missing(e),
        };
        let mut digest = Sha256::new();
        digest.update((cert_pem.len() as u64).to_be_bytes());
        digest.update(&cert_pem);
        digest.update(&key_pem);
        let digest: [u8; 32] = digest.finalize().into();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if *seen == Some(digest) {
            return Reload::Unchanged;
        }
        *seen = Some(digest);
        match parse_pair(&self.files, &cert_pem, &key_pem, &self.provider) {
            Ok(key) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(key));
                Reload::Loaded
            }
            Err(e) => Reload::Invalid(e),
        }
    }

    /// Whether a certificate is loaded (handshakes can succeed).
    pub fn is_loaded(&self) -> bool {
        self.current().is_some()
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs what a reload found (never the key), once per change.
    fn report(&self, reload: Reload) {
        let cert = self.files.cert.display();
        match reload {
            Reload::Unchanged => {}
            Reload::Loaded => {
                tracing::info!(%cert, "TLS certificate loaded; new connections use it")
            }
            Reload::Invalid(e) if self.is_loaded() => tracing::warn!(
                "the TLS certificate changed but does not load: {e}; the one in use stays"
            ),
            Reload::Invalid(e) => tracing::warn!(
                "the TLS certificate does not load: {e}; TLS handshakes fail until it does"
            ),
            Reload::Missing(e) => {
                // Said when the files go away (or are not there at start), not at every look.
                if !self.missing_said.swap(true, Ordering::Relaxed) {
                    if self.is_loaded() {
                        tracing::warn!(
                            "cannot read the TLS certificate: {e}; the one in use stays"
                        );
                    } else {
                        tracing::warn!(
                            "cannot read the TLS certificate: {e}; TLS handshakes fail until it appears"
                        );
                    }
                }
                return;
            }
        }
        self.missing_said.store(false, Ordering::Relaxed);
    }

    /// Reads the files every `every` until the future is dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let reload = self.reload();
            self.report(reload);
        }
    }

    /// A TLS acceptor whose certificate follows this one (HTTP/1.1 only, as the servers speak).
    pub fn acceptor(self: &Arc<Self>) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        let mut config = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

/// The CA certificates in the PEM file at `path`, for a client that trusts only them (the
/// gateway's `--discovery-ca-file`). Errors name the file and what it should hold.
pub fn ca_certificates(path: &Path, flag: &str) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: {e} (the discovery API's CA, e.g. ca.crt of its TLS Secret)",
            path.display()
        )
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| anyhow::anyhow!("{flag} {}: not PEM certificates ({e})", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{flag} {}: no certificate in it (expected `-----BEGIN CERTIFICATE-----`)",
        path.display()
    );
    Ok(certs)
}

#[cfg(test)]
mod tests;
