use super::*;

fn files(dir: &Path) -> CertFiles {
    CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    }
}

/// A self-signed certificate for `name` and its key, PEM.
fn pair(name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

#[test]
fn a_certificate_and_its_key_load_and_anything_else_is_named() {
    let f = files(Path::new("/etc/tls"));
    let (cert, key) = pair("a.example");
    let (_, other_key) = pair("b.example");
    // (certificate, key, what the error says; None: loads)
    let cases: [(&str, &str, Option<&str>); 6] = [
        (&cert, &key, None),
        ("", &key, Some("/etc/tls/tls.crt: no certificate in it")),
        (&key, &key, Some("/etc/tls/tls.crt: no certificate in it")),
        (&cert, "", Some("/etc/tls/tls.key: no PEM private key")),
        (&cert, &cert, Some("/etc/tls/tls.key: no PEM private key")),
        (
            &cert,
            &other_key,
            Some("do not make a certificate and its key"),
        ),
    ];
    let provider = provider();
    for (cert_pem, key_pem, error) in cases {
        let loaded = parse_pair(&f, cert_pem.as_bytes(), key_pem.as_bytes(), &provider);
        match (error, loaded) {
            (None, Ok(_)) => {}
            (Some(words), Err(e)) => assert!(e.contains(words), "{e}"),
            (expected, got) => panic!("expected {expected:?}, got {:?}", got.map(|_| ())),
        }
    }
}

#[test]
fn a_certificate_follows_its_files_and_a_bad_change_keeps_the_one_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let f = files(dir.path());
    // Not there yet (the Secret not created): starts without one.
    let cert = ReloadingCert::new(f.clone());
    assert!(!cert.is_loaded());
    assert!(matches!(cert.reload(), Reload::Missing(e) if e.contains("tls.crt")));

    let (first, first_key) = pair("first.example");
    std::fs::write(&f.cert, &first).unwrap();
    std::fs::write(&f.key, &first_key).unwrap();
    assert_eq!(cert.reload(), Reload::Loaded);
    assert_eq!(cert.reload(), Reload::Unchanged);
    let in_use = cert.current().unwrap();

    // Half a change (a new certificate, the old key): refused once, the first stays.
    let (second, second_key) = pair("second.example");
    std::fs::write(&f.cert, &second).unwrap();
    assert!(matches!(cert.reload(), Reload::Invalid(e) if e.contains("do not make")));
    assert_eq!(cert.reload(), Reload::Unchanged);
    assert!(Arc::ptr_eq(&cert.current().unwrap(), &in_use));

    // The whole change: the new one from now on.
    std::fs::write(&f.key, &second_key).unwrap();
    assert_eq!(cert.reload(), Reload::Loaded);
    assert_ne!(cert.current().unwrap().cert, in_use.cert);
}

#[test]
fn a_secret_volume_swap_of_its_data_symlink_is_seen() {
    // A Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..2026_01_01; an update writes a
    // new directory and swaps `..data` (atomically, by rename).
    let dir = tempfile::tempdir().unwrap();
    let write_version = |name: &str, host: &str| {
        let version = dir.path().join(name);
        std::fs::create_dir(&version).unwrap();
        let (cert, key) = pair(host);
        std::fs::write(version.join("tls.crt"), cert).unwrap();
        std::fs::write(version.join("tls.key"), key).unwrap();
        let tmp = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, dir.path().join("..data")).unwrap();
    };
    write_version("..v1", "one.example");
    for file in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), dir.path().join(file)).unwrap();
    }
    let cert = ReloadingCert::new(files(dir.path()));
    let first = cert.current().expect("loaded at start");
    write_version("..v2", "two.example");
    assert_eq!(cert.reload(), Reload::Loaded);
    assert_ne!(cert.current().unwrap().cert, first.cert);
}

#[test]
fn a_ca_file_must_hold_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.crt");
    let missing = ca_certificates(&path, "--discovery-ca-file").unwrap_err();
    assert!(
        missing.to_string().contains("--discovery-ca-file"),
        "{missing}"
    );
    std::fs::write(&path, "not a certificate").unwrap();
    let empty = ca_certificates(&path, "--discovery-ca-file").unwrap_err();
    assert!(empty.to_string().contains("no certificate"), "{empty}");
    std::fs::write(&path, pair("ca.example").0).unwrap();
    assert_eq!(
        ca_certificates(&path, "--discovery-ca-file").unwrap().len(),
        1
    );
}
