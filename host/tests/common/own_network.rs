//! What every provider's squid must refuse: the network it stands in. Runs a provider's own
//! squid.conf in real squid (the harness places only its port, logs and a `hosts_file`) and sends
//! it, from loopback, requests for a loopback site the config allows, loopback it does not, the
//! cloud metadata address (literally, by a name that resolves to it, IPv4-mapped and in NAT64
//! form) and a private address (literally and by name).
//!
//! Nothing is sent anywhere but loopback: the test talks to squid only, squid refuses by ACL
//! before it connects (its access log says `HIER_NONE`: no server contacted), and an egress
//! guard rejects any packet squid's user would send off loopback were the ACLs wrong.

use std::time::Duration;

use harness::FileServer;
use harness::guard::EgressGuard;
use harness::squid::Squid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Names the test's squid resolves (its `hosts_file`): the metadata server's name and a private
/// host, as a cloud's or a LAN's DNS would answer.
pub const HOSTS: &str = "169.254.169.254 metadata.google.internal metadata.test\n\
                         10.1.2.3 private.test\n";

/// The status squid answers `request_line` with (a raw request: the test decides every byte,
/// and connects to squid only).
pub async fn status_through(squid: &Squid, request_line: &str, host: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(squid.addr()).await.unwrap();
    let request = format!("{request_line}\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The status line is enough; a 200 tunnel stays open, so stop at the first line.
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("squid answers within 10 s")
            .unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer from squid: {text:?}"))
}

/// Runs `conf` (a provider's squid.conf admitting clients on 127.0.0.0/8 and allowing the
/// destination 127.0.0.1/32) and checks, through real squid, what it reaches and refuses.
pub async fn assert_refuses_its_own_network(conf: &str) {
    assert!(
        conf.lines().any(|l| l == "acl to_allowed dst 127.0.0.1/32"),
        "the test's config allows exactly its loopback site:\n{conf}"
    );
    let guard = EgressGuard::install_for("proxy").expect("the egress guard for squid's user");
    let squid = Squid::start_from_provider_conf(conf, HOSTS)
        .await
        .expect("squid runs the provider's squid.conf");
    let site = FileServer::start().await.unwrap();
    site.serve("/page", b"an allowed site".to_vec());
    let port = site.addr().port();

    let get = |url: String| format!("GET {url} HTTP/1.1");
    let allowed = site.url("/page");
    assert_eq!(
        status_through(&squid, &get(allowed.clone()), &site.addr().to_string()).await,
        200,
        "the loopback site in allowDestinations"
    );
    assert_eq!(site.requests("/page"), 1);
    let refused = [
        // Loopback outside allowDestinations (still loopback, were squid to connect).
        (get(format!("http://127.0.0.2:{port}/page")), "127.0.0.2"),
        (get(format!("http://[::1]:{port}/page")), "[::1]"),
        // The cloud metadata server, by address and by the name that resolves to it.
        (
            get("http://169.254.169.254/computeMetadata/v1/instance/".into()),
            "169.254.169.254",
        ),
        (
            get("http://metadata.google.internal/computeMetadata/v1/instance/".into()),
            "metadata.google.internal",
        ),
        (
            "CONNECT metadata.test:443 HTTP/1.1".into(),
            "metadata.test:443",
        ),
        (
            "CONNECT 169.254.169.254:443 HTTP/1.1".into(),
            "169.254.169.254:443",
        ),
        // Its IPv4-mapped and NAT64 forms.
        (
            get("http://[::ffff:169.254.169.254]/".into()),
            "[::ffff:169.254.169.254]",
        ),
        (
            get("http://[64:ff9b::169.254.169.254]/".into()),
            "[64:ff9b::a9fe:a9fe]",
        ),
        // A private address, literally and by name; a libvirt network's gateway.
        (get("http://10.1.2.3/".into()), "10.1.2.3"),
        (get("http://192.168.122.1/".into()), "192.168.122.1"),
        (get("http://private.test/".into()), "private.test"),
        ("CONNECT 10.1.2.3:443 HTTP/1.1".into(), "10.1.2.3:443"),
    ];
    for (request, host) in &refused {
        assert_eq!(
            status_through(&squid, request, host).await,
            403,
            "{request}: squid must refuse it\n{}",
            squid.access_log()
        );
    }
    guard
        .check()
        .expect("the egress guard stayed in place throughout");

    // squid's word for it: each refused request was denied by ACL, no server contacted.
    let log = squid.access_log();
    // (The harness's own readiness check connects and closes: no request, no destination.)
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains("error:transaction-end-before-headers"))
        .collect();
    assert_eq!(lines.len(), 1 + refused.len(), "{log}");
    assert!(
        lines[0].contains("/200 ") && lines[0].contains("HIER_DIRECT/127.0.0.1"),
        "{log}"
    );
    for line in &lines[1..] {
        assert!(
            line.contains("TCP_DENIED/403") && line.contains("HIER_NONE/-"),
            "refused before connecting: {line}\n{log}"
        );
    }
    assert!(log.contains("GET http://private.test/ "), "{log}");
    assert!(log.contains("CONNECT metadata.test:443 "), "{log}");
}

/// The squid.conf in a managed squid's setup script (the quoted heredoc the SDK's
/// `squid::vm_setup_script` writes), as the VM's shell would write it.
pub fn conf_in_script(script: &str) -> String {
    let open = "<<'PROXY_OPERATOR_SQUID_CONF'\n";
    let start = script.find(open).expect("a squid.conf heredoc") + open.len();
    let end = start
        + script[start..]
            .find("\nPROXY_OPERATOR_SQUID_CONF\n")
            .expect("the heredoc's end")
        + 1;
    script[start..end].to_string()
}

/// `squid -k parse` accepts `conf`.
pub fn assert_squid_parses(conf: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("squid.conf");
    std::fs::write(&path, conf).unwrap();
    let parsed = std::process::Command::new("/usr/sbin/squid")
        .args(["-k", "parse", "-f"])
        .arg(&path)
        .output()
        .expect("squid (Debian package squid)");
    let stderr = String::from_utf8_lossy(&parsed.stderr);
    assert!(
        parsed.status.success(),
        "squid -k parse refused:\n{conf}\n{stderr}"
    );
    // squid drops an ACL range it finds inside another, or misreads one, with a warning only
    // (`via off` earns one too: expected).
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("WARNING") && !l.contains("HTTP requires the use of Via"))
        .collect();
    assert!(
        warnings.is_empty(),
        "squid -k parse warned:\n{conf}\n{}",
        warnings.join("\n")
    );
}
