//! A CA of the test's own and the certificates it signs (rcgen), written as a
//! `kubernetes.io/tls` Secret volume holds them: `tls.crt`, `tls.key`, `ca.crt`.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM (what a client trusts).
    pub pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses) and its key, PEM.
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes a certificate for `names` into `dir` as a Secret volume does (each file replaced by
    /// a rename, so a reader never sees half of one): `tls.crt`, `tls.key`, `ca.crt`.
    pub fn write(&self, dir: &Path, names: &[&str]) -> TlsFiles {
        let (cert, key) = self.leaf(names);
        let files = TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        };
        for (path, text) in [
            (&files.key, &key),
            (&files.cert, &cert),
            (&files.ca, &self.pem),
        ] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        }
        files
    }
}

pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A reqwest client that trusts only `ca_pem`.
pub fn client_trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap()
}

/// The whole chain of `error`'s causes, to tell a certificate error from another.
pub fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(&format!(": {e}"));
        source = e.source();
    }
    text
}
