//! The product end to end, for real: `kubectl apply` of a kvm Proxy with no cloud-init → the
//! operator binary imports the guest image from a loopback HTTP server into the pool, writes the
//! overlay and the seed, boots the domain (UEFI, direct kernel boot, TCG) on a user-mode network
//! → the guest agent reports an address → a real CONNECT probe through the guest's squid → Ready
//! → a lease → an HTTP request through the leased proxy reaches a loopback site → `blocked` →
//! cooldown → deleting the Proxy removes the domain, its volumes and its published port.
//!
//! The VM runs behind the harness's egress guard: QEMU and passt reach loopback only.

use std::path::PathBuf;
use std::time::Duration;

use harness::stack::{
    PORT_RANGE, PROXY_NAME, PROXY_NAMESPACE, Phases, SITE_BODY, Stack, StackOptions,
};
use serde_json::json;

/// Extracts the managed squid's config from the vendor-data of a seed ISO and has real squid
/// parse it.
async fn squid_parses_the_seeds_config(seed: &std::path::Path, scratch: &std::path::Path) {
    let out = tokio::process::Command::new("/usr/bin/bsdtar")
        .arg("-xOf")
        .arg(seed)
        .arg("vendor-data")
        .output()
        .await
        .expect("bsdtar (libarchive-tools) reads the seed ISO");
    assert!(
        out.status.success(),
        "bsdtar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vendor = String::from_utf8(out.stdout).unwrap();
    assert!(
        vendor.contains("cat > /etc/squid/proxy-operator.passwd <<'PROXY_OPERATOR_PASSWORDS'"),
        "the managed squid gets its password file"
    );
    let start = vendor
        .find("<<'PROXY_OPERATOR_SQUID_CONF'\n")
        .expect("the managed squid script is in the vendor-data")
        + "<<'PROXY_OPERATOR_SQUID_CONF'\n".len();
    let end = start
        + vendor[start..]
            .find("\nPROXY_OPERATOR_SQUID_CONF\n")
            .unwrap()
        + 1;
    let conf = scratch.join("guest-squid.conf");
    std::fs::write(&conf, &vendor[start..end]).unwrap();
    let parse = tokio::process::Command::new("/usr/sbin/squid")
        .args(["-k", "parse", "-f"])
        .arg(&conf)
        .output()
        .await
        .unwrap();
    assert!(
        parse.status.success(),
        "squid -k parse refused the managed squid.conf:\n{}\n{}",
        &vendor[start..end],
        String::from_utf8_lossy(&parse.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm_proxy_boots_serves_a_leased_request_and_is_removed() {
    let options = StackOptions {
        operator_bin: PathBuf::from(env!("CARGO_BIN_EXE_proxy-operator")),
        plugins_dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
        firmware: "uefi",
    };
    let mut phases = Phases::new();
    let mut stack = Stack::start(&options, &mut phases).await.unwrap();

    stack.apply_proxy().await.unwrap();
    phases.done("kubectl apply: a kvm Proxy with no cloud-init");
    let status = stack
        .wait_ready(&mut phases, Duration::from_secs(300))
        .await
        .unwrap();
    assert_eq!(status["address"], "127.0.0.1", "{status}");
    let port = status["port"].as_u64().unwrap() as u16;
    assert!(
        (PORT_RANGE.0..=PORT_RANGE.1).contains(&port),
        "the published port {port} is in the range"
    );
    assert_eq!(
        stack.files.requests("/proxyvm/root.qcow2"),
        1,
        "the image was imported once, from the loopback server"
    );

    // What libvirt holds for it: a UEFI domain, and its overlay and seed in the pool.
    let provider_id = status["providerID"].as_str().unwrap().to_string();
    let domain = provider_id.split_once('/').unwrap().1.to_string();
    let xml = stack
        .libvirtd
        .virsh_run(&["dumpxml", &domain])
        .await
        .unwrap();
    assert!(
        xml.contains("OVMF") || xml.contains("edk2"),
        "booted with UEFI firmware:\n{xml}"
    );
    let pool = stack.libvirtd.pool_path().to_owned();
    // Named with the host's owner prefix of the provider instance (default operator id).
    let prefix = proxy_operator::provider::capabilities::libvirt::volume_prefix(
        "proxy-operator",
        harness::stack::PROVIDER,
    );
    let overlay = pool.join(format!("{prefix}{domain}-root.qcow2"));
    let seed = pool.join(format!("{prefix}{domain}-seed.iso"));
    assert!(overlay.exists() && seed.exists());
    squid_parses_the_seeds_config(&seed, stack.scratch.path()).await;

    // A crawler leases it and sends a request through it.
    let lease = stack.lease().await.unwrap();
    let proxy_url = lease["proxyUrl"].as_str().unwrap().to_string();
    let bare = harness::stack::without_credentials(&proxy_url);
    assert_eq!(bare, format!("http://127.0.0.1:{port}"));
    let password = url::Url::parse(&proxy_url)
        .unwrap()
        .password()
        .unwrap()
        .to_string();
    let (code, body) = stack.get_through(&proxy_url).await.unwrap();
    assert_eq!((code, body.as_str()), (200, SITE_BODY));
    // The VM's squid requires the credentials; the seed it booted from has only their hash.
    let (code, _) = stack.get_through(&bare).await.unwrap();
    assert_eq!(code, 407, "without credentials");
    let seed_bytes = std::fs::read(&seed).unwrap();
    assert!(
        !seed_bytes
            .windows(password.len())
            .any(|w| w == password.as_bytes()),
        "the password is not in the seed"
    );
    phases.done("leased, and a request through the proxy (with its credentials) reached the loopback site; 407 without");

    // Blocked: the lease ends and the proxy cools down.
    let id = lease["id"].as_str().unwrap();
    let (code, report) = stack
        .discovery(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/report"),
            Some(json!({"outcome": "blocked"})),
        )
        .await
        .unwrap();
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["active"], false);
    let (code, problem) = stack
        .discovery(
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({"proxy": format!("{PROXY_NAMESPACE}/{PROXY_NAME}")})),
        )
        .await
        .unwrap();
    assert_eq!(code, 409, "{problem}");
    assert!(
        problem["type"]
            .as_str()
            .unwrap_or_default()
            .ends_with("proxy-cooling-down"),
        "{problem}"
    );
    phases.done("reported blocked: the proxy cools down");

    // Deleting the Proxy removes the domain, its volumes and its published port.
    stack.delete_proxy(Duration::from_secs(120)).await.unwrap();
    let domains = stack
        .libvirtd
        .virsh_run(&["list", "--all", "--name"])
        .await
        .unwrap();
    assert!(!domains.contains(&domain), "{domains}");
    assert!(
        !overlay.exists() && !seed.exists(),
        "overlay and seed removed"
    );
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err(),
        "nothing listens on the published port {port} any more"
    );
    phases.done("deleted: domain, overlay, seed and port gone");

    eprintln!("\nphase timings (kvm end to end, TCG, 1 vCPU, 512 MiB):");
    for (what, step, total) in phases.all() {
        eprintln!("  {step:6.1} s  {total:6.1} s  {what}");
    }
}
