//! The guest image really boots under TCG in the harness's private libvirtd, is configured
//! from a NoCloud seed, and its squid proxies to a server on loopback through passt.
//!
//! The `Libvirtd` fixture runs in a network namespace of its own with only `lo`. passt
//! (Debian's 0.0~git20230309) copies its guest's address, gateway and DNS from a "template"
//! interface with a default route and refuses to start without one ("No external routable
//! interface for IPv4 / IPv6", "External interface not usable"), so this test gives the
//! namespace a veth pair (both ends inside it) with 10.0.2.15/24 and a default route via
//! 10.0.2.2, and brings `lo` up. passt then leases 10.0.2.15 to the guest, maps the gateway
//! address 10.0.2.2 to the namespace's loopback, and listens for the port forward on the
//! namespace's 127.0.0.1: everything the test talks to lives in that namespace (sockets made
//! on a thread that entered it), and nothing there routes anywhere else.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use harness::Libvirtd;
use harness::bins::debian_binary;
use harness::guest_image::{EgressGuard, KERNEL_CMDLINE, guest_image};
use harness::process::run_output;

/// The address passt maps to the namespace's loopback (the template interface's gateway).
const GATEWAY: &str = "10.0.2.2";
const BOOT_TIMEOUT: Duration = Duration::from_secs(360);
const BODY: &str = "hello from the namespace's loopback\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guest_image_boots_and_its_squid_reaches_loopback_through_passt() -> Result<()> {
    let image = guest_image();
    let qemu_img = debian_binary("/usr/bin/qemu-img", "qemu-utils");
    let genisoimage = debian_binary("/usr/bin/genisoimage", "genisoimage");
    debian_binary("/usr/bin/passt", "passt");
    debian_binary("/usr/bin/nsenter", "util-linux");
    let _guard = EgressGuard::install()?;
    let lv = Libvirtd::start().await?;
    let netns = PathBuf::from(format!(
        "/proc/{}/ns/net",
        lv.libvirtd_pid().context("libvirtd pid")?
    ));
    give_passt_a_template(&netns).await?;

    // A loopback HTTP server in the namespace: what the guest reaches at GATEWAY.
    let listener = in_netns(&netns, || TcpListener::bind("127.0.0.1:0"))?;
    let http_port = listener.local_addr()?.port();
    std::thread::spawn(move || serve(listener));
    let forward_port = in_netns(&netns, || {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr())
    })?
    .port();

    let pool = lv.pool_path();
    let base = pool.join("proxyvm-base.qcow2");
    std::fs::copy(&image.root, &base).context("copy root.qcow2")?;
    std::fs::copy(&image.kernel, pool.join("vmlinuz"))?;
    std::fs::copy(&image.initrd, pool.join("initrd.img"))?;
    run_output(
        tokio::process::Command::new(&qemu_img)
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&base)
            .arg(pool.join("proxyvm.qcow2")),
    )
    .await?;
    let seed_dir = lv.dir().join("seed");
    std::fs::create_dir_all(&seed_dir)?;
    std::fs::write(seed_dir.join("user-data"), USER_DATA)?;
    std::fs::write(
        seed_dir.join("meta-data"),
        "instance-id: smoke-1\nlocal-hostname: proxyvm\n",
    )?;
    run_output(
        tokio::process::Command::new(&genisoimage)
            .args(["-quiet", "-V", "cidata", "-J", "-r", "-o"])
            .arg(pool.join("seed.iso"))
            .arg(seed_dir.join("user-data"))
            .arg(seed_dir.join("meta-data")),
    )
    .await?;

    let console = lv.dir().join("console.log");
    let xml = domain_xml(pool, &console, forward_port);
    let xml_path = lv.dir().join("proxyvm.xml");
    std::fs::write(&xml_path, &xml)?;
    lv.virsh_run(&["define", xml_path.to_str().unwrap()])
        .await?;
    let started = Instant::now();
    lv.virsh_run(&["start", "proxyvm"]).await?;
    let passt = std::process::Command::new("ps")
        .args(["-o", "user=,args=", "-C", "passt.avx2,passt"])
        .output()?;
    eprintln!(
        "started in {:?}; passt: {}",
        started.elapsed(),
        String::from_utf8_lossy(&passt.stdout).trim()
    );

    let result = async {
        let mut agent = None;
        let mut proxied = None;
        while agent.is_none() || proxied.is_none() {
            if started.elapsed() > BOOT_TIMEOUT {
                bail!(
                    "not up after {BOOT_TIMEOUT:?} (guest agent: {agent:?}, squid: {proxied:?})"
                );
            }
            if agent.is_none()
                && lv
                    .virsh_run(&[
                        "qemu-agent-command",
                        "proxyvm",
                        r#"{"execute":"guest-ping"}"#,
                    ])
                    .await
                    .is_ok()
            {
                agent = Some(started.elapsed());
                eprintln!("guest agent answered after {:?}", started.elapsed());
            }
            if proxied.is_none() {
                let request = format!(
                    "GET http://{GATEWAY}:{http_port}/ HTTP/1.1\r\nHost: {GATEWAY}:{http_port}\r\nConnection: close\r\n\r\n"
                );
                if let Ok(response) = proxy_request(&netns, forward_port, request).await
                    && response.starts_with("HTTP/1.1 200")
                {
                    assert!(response.ends_with(BODY), "{response}");
                    proxied = Some(started.elapsed());
                    eprintln!("squid proxied a GET after {:?}", started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // CONNECT too, as the health engine uses it.
        let request = format!(
            "CONNECT {GATEWAY}:{http_port} HTTP/1.1\r\nHost: {GATEWAY}:{http_port}\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let response = proxy_request(&netns, forward_port, request).await?;
        assert!(
            response.starts_with("HTTP/1.1 200 Connection established") && response.ends_with(BODY),
            "{response}"
        );
        let addrs = lv
            .virsh_run(&["domifaddr", "proxyvm", "--source", "agent"])
            .await?;
        assert!(addrs.contains("10.0.2.15/24"), "{addrs}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("console:\n{}", harness::process::log_tail(&console, 60));
    }
    let _ = lv.virsh_run(&["destroy", "proxyvm"]).await;
    result
}

const USER_DATA: &str = "#cloud-config
write_files:
  - path: /etc/squid/squid.conf
    content: |
      http_port 3128
      acl clients src 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10 192.0.2.0/24
      http_access allow clients
      http_access deny all
      visible_hostname proxyvm
      dns_nameservers 127.0.0.1
      cache deny all
      pinger_enable off
";

fn domain_xml(pool: &std::path::Path, console: &std::path::Path, forward_port: u16) -> String {
    let p = pool.display();
    format!(
        "<domain type='qemu'>
  <name>proxyvm</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{p}/vmlinuz</kernel>
    <initrd>{p}/initrd.img</initrd>
    <cmdline>{KERNEL_CMDLINE}</cmdline>
  </os>
  <features><acpi/><tcg><tb-cache unit='MiB'>128</tb-cache></tcg></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{p}/proxyvm.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='{p}/seed.iso'/>
      <target dev='vdb' bus='virtio'/>
      <readonly/>
    </disk>
    <interface type='user'>
      <backend type='passt'/>
      <portForward proto='tcp' address='127.0.0.1'>
        <range start='{forward_port}' to='3128'/>
      </portForward>
      <model type='virtio'/>
    </interface>
    <serial type='file'><source path='{}'/><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>",
        console.display()
    )
}

/// `lo` up and a veth pair with an address and a default route in the namespace `netns`:
/// what passt needs to start there.
async fn give_passt_a_template(netns: &std::path::Path) -> Result<()> {
    let net = format!("--net={}", netns.display());
    for args in [
        &["link", "set", "lo", "up"][..],
        &[
            "link", "add", "pxv0", "type", "veth", "peer", "name", "pxv1",
        ],
        &["link", "set", "pxv0", "up"],
        &["link", "set", "pxv1", "up"],
        &["addr", "add", "10.0.2.15/24", "dev", "pxv0"],
        &["route", "add", "default", "via", GATEWAY, "dev", "pxv0"],
    ] {
        run_output(
            tokio::process::Command::new("/usr/bin/nsenter")
                .arg(&net)
                .arg("/usr/sbin/ip")
                .args(args),
        )
        .await?;
    }
    Ok(())
}

/// Runs `f` on a thread that entered the network namespace `netns`: sockets it makes stay
/// in that namespace.
fn in_netns<T: Send + 'static>(
    netns: &std::path::Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    use std::os::fd::AsRawFd;
    let ns = std::fs::File::open(netns).with_context(|| format!("open {}", netns.display()))?;
    std::thread::spawn(move || {
        // SAFETY: setns(2) on a valid descriptor; it only changes this thread's namespace.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .expect("netns thread panicked")
    .context("in the libvirtd network namespace")
}

/// Sends `request` to the guest's squid through passt's port forward; returns the response.
async fn proxy_request(netns: &std::path::Path, port: u16, request: String) -> Result<String> {
    let mut stream = in_netns(netns, move || TcpStream::connect(("127.0.0.1", port)))?;
    tokio::task::spawn_blocking(move || {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(request.as_bytes())?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Ok(String::from_utf8_lossy(&response).into_owned())
    })
    .await?
}

/// Answers every request with BODY.
fn serve(listener: TcpListener) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
                BODY.len()
            );
        });
    }
}
