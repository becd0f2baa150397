use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use sha_crypt::{PasswordVerifier, ShaCrypt};

use super::*;

fn secret(data: &[(&str, &[u8])]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("egress-1-proxy-credentials".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

#[test]
fn a_generated_password_is_long_random_and_needs_no_escaping() {
    let a = ProxyLogin::generate("egress-1");
    let b = ProxyLogin::generate("egress-1");
    assert_eq!(a.username(), "egress-1");
    assert_eq!(a.password().len(), 32);
    assert!(a.password().chars().all(|c| c.is_ascii_alphanumeric()));
    assert_ne!(a.password(), b.password());
}

#[test]
fn the_hash_is_what_squid_checks_and_never_the_password() {
    let login = ProxyLogin::generate("egress-1");
    let hashed = login.hashed();
    assert_eq!(hashed.username, "egress-1");
    assert!(
        hashed.password_hash.starts_with("$6$"),
        "{}",
        hashed.password_hash
    );
    assert!(!hashed.password_hash.contains(login.password()));
    let hash = sha_crypt::PasswordHash::new(&hashed.password_hash).unwrap();
    ShaCrypt::SHA512
        .verify_password(login.password().as_bytes(), &hash)
        .expect("the hash verifies the password");
    assert!(ShaCrypt::SHA512.verify_password(b"another", &hash).is_err());
    // A fresh salt each time: the same password never gives the same line twice.
    assert_ne!(login.hashed().password_hash, hashed.password_hash);
}

#[test]
fn the_fingerprint_changes_with_the_password_and_the_proxy() {
    let login = ProxyLogin::generate("egress-1");
    let other = ProxyLogin::generate("egress-1");
    assert_eq!(login.fingerprint("uid-1"), login.fingerprint("uid-1"));
    assert_ne!(login.fingerprint("uid-1"), other.fingerprint("uid-1"));
    assert_ne!(login.fingerprint("uid-1"), login.fingerprint("uid-2"));
    assert_eq!(login.fingerprint("uid-1").len(), 16);
}

#[test]
fn nothing_prints_the_password() {
    let login = ProxyLogin::generate("egress-1");
    let printed = format!("{login:?} {:?}", login.hashed());
    assert!(!printed.contains(login.password()), "{printed}");
    assert!(printed.contains("<redacted>"));
}

#[test]
fn a_secret_gives_its_credentials_or_says_which_key_is_wrong() {
    let read = |data: &[(&str, &[u8])]| ProxyLogin::from_secret(&secret(data));
    let ok = read(&[("username", b"egress-1"), ("password", b"s3cret\n")])
        .unwrap()
        .unwrap();
    assert_eq!((ok.username(), ok.password()), ("egress-1", "s3cret"));
    // No password (or an empty one): the operator generates one.
    assert_eq!(read(&[("username", b"egress-1")]).unwrap(), None);
    assert_eq!(
        read(&[("username", b"u"), ("password", b"")]).unwrap(),
        None
    );
    for (data, key) in [
        (vec![("password", b"p".as_slice())], "`username`"),
        (
            vec![("username", b"a:b".as_slice()), ("password", b"p")],
            "`username`",
        ),
        (
            vec![("username", b"a b".as_slice()), ("password", b"p")],
            "`username`",
        ),
        (
            vec![("username", b"u".as_slice()), ("password", b"p\x00q")],
            "`password`",
        ),
        (
            vec![("username", b"u".as_slice()), ("password", &[0xff, 0xfe])],
            "`password`",
        ),
    ] {
        let err = read(&data).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("Secret egress-1-proxy-credentials: "),
            "{err}"
        );
        assert!(err.to_string().contains(key), "{err}");
    }
    let long = vec![b'a'; 256];
    assert!(read(&[("username", b"u"), ("password", &long)]).is_err());
}

#[test]
fn proxy_urls_escape_what_a_url_cannot_hold() {
    let login = ProxyLogin {
        username: "egress-1".into(),
        password: "p@ss/w:rd".into(),
        hand_out: true,
    };
    assert_eq!(
        login.proxy_url(ProxyProtocol::Http, "10.0.0.7", 3128),
        "http://egress-1:p%40ss%2Fw%3Ard@10.0.0.7:3128"
    );
    assert_eq!(
        login.proxy_url(ProxyProtocol::Http, "fd00::7", 3128),
        "http://egress-1:p%40ss%2Fw%3Ard@[fd00::7]:3128"
    );
    assert_eq!(
        login.proxy_url(ProxyProtocol::Socks5, "10.0.0.7", 1080),
        "socks5://egress-1:p%40ss%2Fw%3Ard@10.0.0.7:1080"
    );
    let parsed = url::Url::parse(&login.proxy_url(ProxyProtocol::Http, "10.0.0.7", 3128)).unwrap();
    assert_eq!(parsed.password(), Some("p%40ss%2Fw%3Ard"));
    assert_eq!(
        login.basic_authorization(),
        "Basic ZWdyZXNzLTE6cEBzcy93OnJk"
    );
}

#[test]
fn secret_names_fit_an_object_name() {
    assert_eq!(secret_name("egress-1"), "egress-1-proxy-credentials");
    let long = "a".repeat(253);
    let name = secret_name(&long);
    assert!(name.len() <= 253, "{}", name.len());
    assert_ne!(secret_name(&long), secret_name(&"b".repeat(253)));
}
