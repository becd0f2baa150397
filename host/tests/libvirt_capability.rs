//! The host's `libvirt` capability against the real harness sshd and libvirtd on loopback:
//! domains, metadata, volumes, uploads and image imports through the SSH tunnel; the grant;
//! how SSH failures are classified; the SSH material read from a Secret in a real cluster.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::relay::Relay;
use common::{children_of, noise, ssh_material, ssh_secret};
use harness::{ControlPlane, FileServer, Libvirtd, SshKey, Sshd};
use k8s_openapi::api::core::v1::Secret;
use proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial;
use proxy_operator::provider::capabilities::libvirt::{
    CallLimits, DomainState, Hypervisor, ImageSource, LibvirtError, LibvirtHub, MaterialSource,
};
use proxy_operator::provider::capabilities::{CallContext, Declared, Grants, HostResources};
use sha2::{Digest, Sha256};

const METADATA_URI: &str = "https://proxy-operator.dev/xmlns/kvm/1";

/// Grants hypervisor `hv1` (the harness sshd, forwarding to the harness libvirtd) and HTTP to
/// loopback (for image imports).
fn grants(sshd: &Sshd, libvirtd: &Libvirtd, secret: &str) -> Grants {
    grants_at(sshd.port(), sshd, libvirtd, secret)
}

/// Like [`grants`], with SSH to `port` on loopback (a relay in front of the harness sshd).
fn grants_at(port: u16, sshd: &Sshd, libvirtd: &Libvirtd, secret: &str) -> Grants {
    serde_json::from_value(serde_json::json!({
        "http": {"allow": ["http://127.0.0.1:*"]},
        "libvirt": {
            "sshSecret": secret,
            "hosts": [{
                "name": "hv1",
                "address": "127.0.0.1",
                "port": port,
                "user": sshd.user(),
                "socket": libvirtd.socket().to_str().unwrap(),
                "pools": [libvirtd.pool_name()],
                "networks": ["pxnet"],
            }]
        }
    }))
    .unwrap()
}

fn context(grants: &Grants, hub: Arc<LibvirtHub>) -> Arc<CallContext> {
    Arc::new(
        CallContext::bind(
            "kvm-test",
            "kvm",
            Declared::ALL,
            &grants.validate().unwrap(),
            &HostResources {
                libvirt: Some(hub),
                kube: None,
                operator_objects: Arc::default(),
            },
        )
        .unwrap(),
    )
}

fn hub(source: MaterialSource, dir: &std::path::Path) -> Arc<LibvirtHub> {
    LibvirtHub::new(source, dir.to_path_buf())
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A domain that runs under TCG without disks, its NIC on the fixture's isolated network (in
/// libvirtd's private network namespace, so it reaches nothing).
fn domain_xml(name: &str, uid: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os>\
         <features><tcg><tb-cache unit='MiB'>16</tb-cache></tcg></features>\
         <metadata><po:owner xmlns:po='{METADATA_URI}' namespace='crawl' name='p1' uid='{uid}' operator-id='op'/></metadata>\
         <devices><serial type='pty'/><interface type='network'><source network='pxnet'/>\
         <model type='virtio'/></interface></devices></domain>"
    )
}

/// Staging volumes of image imports in the fixture's (directory) pool.
fn staging_volumes(libvirtd: &Libvirtd) -> Vec<String> {
    std::fs::read_dir(libvirtd.pool_path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".partial"))
        .collect()
}

async fn open(context: &CallContext) -> Hypervisor {
    context.libvirt.open("hv1").expect("hv1 is granted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_volumes_and_images_go_through_the_tunnel() {
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(
        &grants(&sshd, &libvirtd, "kvm-ssh"),
        hub(MaterialSource::Static(ssh_material(&sshd)), dir.path()),
    );
    let hv = open(&ctx).await;
    let pool = libvirtd.pool_name().to_string();
    libvirtd.define_isolated_network("pxnet").await.unwrap();

    let report = hv.probe(Duration::from_secs(30)).await.unwrap();
    assert!(report.libvirt_version.starts_with("11."), "{report:?}");
    let info = hv.pool_info(pool.clone()).await.unwrap();
    assert!(info.active, "{info:?}");
    assert_eq!(info.path.as_deref(), libvirtd.pool_path().to_str());

    // A small payload (a seed ISO) lands byte for byte in a volume the plugin created.
    let seed: Vec<u8> = "#cloud-config\nhostname: prøxy\n"
        .bytes()
        .chain(0..=255u8)
        .collect();
    let created = hv
        .create_volume(
            pool.clone(),
            format!("<volume><name>seed.iso</name><capacity unit='bytes'>{}</capacity><target><format type='raw'/></target></volume>", seed.len()),
        )
        .await
        .unwrap();
    hv.upload_volume(pool.clone(), "seed.iso".into(), seed.clone())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&created.path).unwrap(), seed);
    let found = hv
        .lookup_volume(pool.clone(), "seed.iso".into())
        .await
        .unwrap();
    assert_eq!(found.path, created.path);

    // A base image: downloaded by the host, verified, imported once.
    let image: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    files.serve("/base.qcow2", image.clone());
    let source = ImageSource {
        url: files.url("/base.qcow2"),
        sha256: sha256(&image),
        format: "raw".into(),
    };
    let base = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-test.img".into(),
            source.clone(),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&base.path).unwrap(), image);
    let again = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-test.img".into(),
            source.clone(),
        )
        .await
        .unwrap();
    assert_eq!(again.path, base.path);
    assert_eq!(
        files.requests("/base.qcow2"),
        1,
        "imported once, then reused"
    );
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());

    // What a crash mid-import leaves: a half-written staging volume and no base. The next import
    // replaces it, and the base gets every byte.
    let staging = "base-crash.img.partial";
    hv.create_volume(
        pool.clone(),
        format!("<volume><name>{staging}</name><capacity unit='bytes'>{}</capacity><target><format type='raw'/></target></volume>", image.len()),
    )
    .await
    .unwrap();
    hv.upload_volume(
        pool.clone(),
        staging.into(),
        image[..image.len() / 2].to_vec(),
    )
    .await
    .unwrap();
    assert!(matches!(
        hv.lookup_volume(pool.clone(), "base-crash.img".into())
            .await,
        Err(LibvirtError::NotFound(_))
    ));
    let recovered = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-crash.img".into(),
            source.clone(),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&recovered.path).unwrap(), image);
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());

    // A qcow2 image (what cloud images are) arrives byte for byte, not converted by the copy.
    let qcow2_path = dir.path().join("base.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&qcow2_path)
        .arg("64M")
        .status()
        .expect("qemu-img (Debian qemu-utils, installed by .ci/install-fixtures.sh)");
    assert!(made.success());
    let qcow2 = std::fs::read(&qcow2_path).unwrap();
    files.serve("/real.qcow2", qcow2.clone());
    let imported = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-real.qcow2".into(),
            ImageSource {
                url: files.url("/real.qcow2"),
                sha256: sha256(&qcow2),
                format: "qcow2".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&imported.path).unwrap(), qcow2);
    assert_eq!(
        imported.capacity,
        64 << 20,
        "libvirt reads the qcow2 header"
    );

    // A wrong digest fails permanently and leaves no volume behind.
    let wrong = ImageSource {
        sha256: "0".repeat(64),
        ..source.clone()
    };
    match hv
        .import_image(ctx.clone(), pool.clone(), "base-wrong.img".into(), wrong)
        .await
    {
        Err(LibvirtError::ChecksumMismatch(m)) => {
            assert!(m.contains(&sha256(&image)), "names the digest it got: {m}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        hv.lookup_volume(pool.clone(), "base-wrong.img".into())
            .await,
        Err(LibvirtError::NotFound(_))
    ));
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());
    // An image server outside grants.http is refused before anything is downloaded.
    let outside = ImageSource {
        url: format!("http://127.0.0.2:{}/base.qcow2", files.addr().port()),
        ..source
    };
    match hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-outside.img".into(),
            outside,
        )
        .await
    {
        Err(LibvirtError::Denied(m)) => assert!(m.contains("grants.http"), "{m}"),
        other => panic!("{other:?}"),
    }

    // Domains: define with the owner in <metadata>, find it by that metadata, run it, remove it.
    let defined = hv
        .define_domain(domain_xml("px-cap-test", "uid-123"))
        .await
        .unwrap();
    assert_eq!(defined.state, DomainState::Shutoff);
    let looked_up = hv
        .lookup_domain("px-cap-test".into(), Some(METADATA_URI.into()))
        .await
        .unwrap();
    let metadata = looked_up.metadata.expect("metadata for the URI");
    assert!(metadata.contains("uid=\"uid-123\""), "{metadata}");
    let listed = hv.list_domains(Some(METADATA_URI.into())).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|d| d.name == "px-cap-test" && d.metadata.is_some()),
        "{listed:?}"
    );
    hv.start_domain("px-cap-test".into()).await.unwrap();
    let running = hv.lookup_domain("px-cap-test".into(), None).await.unwrap();
    assert_eq!(running.state, DomainState::Running);
    assert_eq!(running.metadata, None, "no URI asked for, no metadata");
    hv.destroy_domain("px-cap-test".into()).await.unwrap();
    hv.undefine_domain("px-cap-test".into()).await.unwrap();
    match hv.lookup_domain("px-cap-test".into(), None).await {
        Err(LibvirtError::NotFound(m)) => assert!(m.contains("px-cap-test"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A libvirt error the plugin caused keeps the shared connection: the next call works.
    // (The XML passes the host's allow-list; libvirt refuses the lifecycle action.)
    let bad = hv
        .define_domain(
            "<domain type='kvm'><name>px-bad</name><memory unit='MiB'>32</memory><on_poweroff>explode</on_poweroff></domain>"
                .into(),
        )
        .await;
    assert!(matches!(bad, Err(LibvirtError::Failed(_))), "{bad:?}");
    hv.delete_volume(pool.clone(), "seed.iso".into())
        .await
        .unwrap();
    hv.delete_volume(pool.clone(), "base-test.img".into())
        .await
        .unwrap();
    assert!(
        !std::path::Path::new(&base.path).exists(),
        "the volume file is gone"
    );

    // Only granted hypervisors.
    match ctx.libvirt.open("hv2") {
        Err(LibvirtError::Denied(m)) => assert!(m.contains("grants.libvirt.hosts"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_failures_are_classified() {
    let (libvirtd, sshd) = tokio::join!(Libvirtd::start(), Sshd::start());
    let (libvirtd, sshd) = (libvirtd.unwrap(), sshd.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let grants = grants(&sshd, &libvirtd, "kvm-ssh");
    let timeout = Duration::from_secs(30);

    // known_hosts lists another key for the host.
    let other = SshKey::generate(&dir.path().join("other")).await.unwrap();
    let mut wrong_host = ssh_material(&sshd);
    wrong_host.known_hosts = format!("[127.0.0.1]:{} {}\n", sshd.port(), other.public.trim());
    let ctx = context(&grants, hub(MaterialSource::Static(wrong_host), dir.path()));
    match open(&ctx).await.probe(timeout).await {
        Err(LibvirtError::HostKeyMismatch(m)) => assert!(m.contains("known_hosts"), "{m}"),
        other => panic!("{other:?}"),
    }

    // The server does not accept the client key.
    let mut wrong_key = ssh_material(&sshd);
    wrong_key.private_key = other.private_pem.clone();
    let ctx = context(&grants, hub(MaterialSource::Static(wrong_key), dir.path()));
    assert!(matches!(
        open(&ctx).await.probe(timeout).await,
        Err(LibvirtError::AuthFailed(_))
    ));

    // Nothing listens: a transient transport error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut nowhere = grants.clone();
    nowhere.libvirt.as_mut().unwrap().hosts[0].port = port;
    let ctx = context(
        &nowhere,
        hub(MaterialSource::Static(ssh_material(&sshd)), dir.path()),
    );
    assert!(matches!(
        open(&ctx).await.probe(timeout).await,
        Err(LibvirtError::Transport(_))
    ));

    // The right material works, and a dead sshd afterwards is noticed and recovered from.
    let ctx = context(
        &grants,
        hub(MaterialSource::Static(ssh_material(&sshd)), dir.path()),
    );
    let hv = open(&ctx).await;
    hv.probe(timeout).await.unwrap();
    hv.list_domains(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ssh_material_comes_from_a_secret_that_may_appear_later() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("kvm-secret").await.unwrap();
    let (libvirtd, sshd) = tokio::join!(Libvirtd::start(), Sshd::start());
    let (libvirtd, sshd) = (libvirtd.unwrap(), sshd.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let ctx = context(
        &grants(&sshd, &libvirtd, "kvm-ssh"),
        hub(
            MaterialSource::Secrets {
                client: ns.client(),
                namespace: ns.name().to_string(),
            },
            dir.path(),
        ),
    );
    let hv = open(&ctx).await;

    // No Secret yet: a transient error that says what to create.
    match hv.probe(Duration::from_secs(30)).await {
        Err(LibvirtError::Transport(m)) => {
            assert!(m.contains("kvm-ssh") && m.contains("does not exist"), "{m}");
            assert!(!m.contains("PRIVATE KEY"), "{m}");
        }
        other => panic!("{other:?}"),
    }

    // A Secret with a broken key: permanent, and the key never appears in the message.
    let secrets: kube::Api<Secret> = ns.api();
    let secret = |key: &str| {
        ssh_secret(&SshMaterial {
            private_key: key.into(),
            ..ssh_material(&sshd)
        })
    };
    secrets
        .create(&Default::default(), &secret("not a key"))
        .await
        .unwrap();
    match hv.probe(Duration::from_secs(30)).await {
        Err(LibvirtError::AuthFailed(m)) => {
            assert!(
                m.contains("ssh-privatekey") && !m.contains("not a key"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }

    // Fixed: the next call reads it again and connects.
    secrets
        .replace(
            "kvm-ssh",
            &Default::default(),
            &secret(sshd.client_key_pem()),
        )
        .await
        .unwrap();
    let report = hv.probe(Duration::from_secs(30)).await.unwrap();
    assert!(report.libvirt_version.starts_with("11."), "{report:?}");
}

/// A hypervisor whose libvirtd hangs (SIGSTOP): `probe` gives up at its own deadline with
/// `Timeout`, and the shared connection survives it: once libvirtd runs again, calls go through
/// the same connection, without a new SSH session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_gives_up_on_a_hung_libvirtd_without_dropping_the_connection() {
    let (libvirtd, sshd) = tokio::join!(Libvirtd::start(), Sshd::start());
    let (libvirtd, sshd) = (libvirtd.unwrap(), sshd.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let hub = hub(MaterialSource::Static(ssh_material(&sshd)), dir.path());
    let ctx = context(&grants(&sshd, &libvirtd, "kvm-ssh"), hub.clone());
    let hv = open(&ctx).await;
    hv.probe(Duration::from_secs(30)).await.unwrap();
    assert_eq!(hub.connections_opened(), 1);

    let pid = libvirtd.libvirtd_pid().unwrap() as i32;
    // SAFETY: signalling a child process of this test.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Without its own deadline this would wait for libvirtd forever (it is resumed only after).
    let hung = hv.probe(Duration::from_millis(500)).await;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(matches!(hung, Err(LibvirtError::Timeout(_))), "{hung:?}");

    hv.list_domains(None).await.unwrap();
    hv.probe(Duration::from_secs(30)).await.unwrap();
    assert_eq!(hub.connections_opened(), 1, "the connection was kept");
}

/// A hung libvirtd (SIGSTOP) holds at most the lane's threads of the host: of 600 calls, those
/// beyond `threads + waiting` are refused at once, the others give up at their deadline; while
/// they wait, the runtime's blocking pool still serves others (a DNS lookup, a blocking task), and
/// once libvirtd runs again the same connection serves calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_libvirtd_holds_a_bounded_number_of_threads() {
    let (libvirtd, sshd) = tokio::join!(Libvirtd::start(), Sshd::start());
    let (libvirtd, sshd) = (libvirtd.unwrap(), sshd.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let limits = CallLimits {
        deadline: Duration::from_secs(3),
        threads: 8,
        waiting: 64,
    };
    let hub = LibvirtHub::with_limits(
        "proxy-operator",
        MaterialSource::Static(ssh_material(&sshd)),
        dir.path().to_path_buf(),
        limits,
    );
    let ctx = context(&grants(&sshd, &libvirtd, "kvm-ssh"), hub.clone());
    let hv = open(&ctx).await;
    hv.list_domains(None).await.unwrap();

    let pid = libvirtd.libvirtd_pid().unwrap() as i32;
    // SAFETY: signalling a child process of this test.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let calls: Vec<_> = (0..600)
        .map(|_| {
            let hv = hv.clone();
            tokio::spawn(async move { hv.list_domains(None).await })
        })
        .collect();
    // While the hung hypervisor's calls wait, other work that needs a blocking thread gets one
    // (the guard fails the test instead of hanging it).
    let guard = Duration::from_secs(2);
    let lookup = tokio::time::timeout(guard, tokio::net::lookup_host("localhost:80"))
        .await
        .map(|found| found.map(Iterator::count));
    assert!(
        matches!(lookup, Ok(Ok(1..))),
        "a DNS lookup got no thread: {lookup:?}"
    );
    let blocking = tokio::time::timeout(guard, tokio::task::spawn_blocking(|| 7)).await;
    assert!(
        matches!(blocking, Ok(Ok(7))),
        "a blocking task got no thread"
    );
    let mut refused_at_once = 0;
    for call in calls {
        match call.await.unwrap() {
            Err(LibvirtError::Timeout(m)) if m.contains("not queueing more") => {
                refused_at_once += 1
            }
            Err(LibvirtError::Timeout(_)) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
    let blocked = hub.blocking_calls();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert_eq!(refused_at_once, 600 - 8 - 64);
    assert_eq!(
        blocked, 8,
        "only the lane's threads block on the hung libvirtd"
    );

    hv.list_domains(None).await.unwrap();
    assert_eq!(hub.connections_opened(), 1, "the connection was kept");
}

/// The hypervisor `hv1` reached through a new [`Relay`] in front of the harness sshd, connected.
async fn through_a_relay(
    sshd: &Sshd,
    libvirtd: &Libvirtd,
    dir: &std::path::Path,
) -> (Relay, Arc<LibvirtHub>, Arc<CallContext>, Hypervisor) {
    let relay = Relay::start(sshd.addr()).await;
    let material = SshMaterial {
        known_hosts: format!("[127.0.0.1]:{} {}\n", relay.port(), sshd.host_pubkey()),
        ..ssh_material(sshd)
    };
    let hub = hub(MaterialSource::Static(material), dir);
    let ctx = context(
        &grants_at(relay.port(), sshd, libvirtd, "kvm-ssh"),
        hub.clone(),
    );
    let hv = open(&ctx).await;
    hv.probe(Duration::from_secs(30)).await.unwrap();
    (relay, hub, ctx, hv)
}

/// The SSH connection drops in the middle of an image import, twice: a relay between the host
/// and sshd cuts it after a quarter of the 24 MiB image; then sshd's process for the connection
/// is killed while the relay holds the upload at a quarter (a second call joined to the same
/// job). Each call fails with a transport error that says the import was interrupted because
/// the SSH connection dropped; the base volume never exists half-written; the shared connection
/// is opened again; and the next import-image, with the network back, starts over (a new
/// download, no stale job) and ends with every byte of the image and no staging volume left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_cut_by_a_dropped_ssh_connection_fails_clearly_then_starts_over() {
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (relay, hub, ctx, hv) = through_a_relay(&sshd, &libvirtd, dir.path()).await;
    let pool = libvirtd.pool_name().to_string();
    assert_eq!(hub.connections_opened(), 1);

    const IMAGE: usize = 24 << 20;
    const CUT_AFTER: u64 = 6 << 20;
    let image = noise(IMAGE);
    files.serve("/big.raw", image.clone());
    let source = ImageSource {
        url: files.url("/big.raw"),
        sha256: sha256(&image),
        format: "raw".into(),
    };
    let base_path = libvirtd.pool_path().join(format!(
        "{}base-big.img",
        proxy_operator::provider::capabilities::libvirt::volume_prefix(
            "proxy-operator",
            "kvm-test"
        )
    ));

    relay.cut_after(CUT_AFTER);
    let started = std::time::Instant::now();
    let cut = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-big.img".into(),
            source.clone(),
        )
        .await;
    let failed_after = started.elapsed();
    assert_eq!(relay.cuts(), 1, "the relay cut the SSH connection once");
    let message = match cut {
        Err(LibvirtError::Transport(m)) => m,
        other => panic!("expected a transport error, got {other:?}"),
    };
    eprintln!("import cut after {failed_after:?}: {message}");
    for needed in [
        "SSH connection",
        "dropped",
        "import",
        "base-big.img",
        "hv1",
        "tries again",
    ] {
        assert!(
            message.contains(needed),
            "`{needed}` missing from: {message}"
        );
    }
    // Nothing half-written under the base's name, neither for libvirt nor on disk. The shared
    // connection is being opened again after the drop: on a busy machine the first lookups may
    // meet it still down (a transport error), so they are retried until it answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match hv.lookup_volume(pool.clone(), "base-big.img".into()).await {
            Err(LibvirtError::NotFound(_)) => break,
            Err(LibvirtError::Transport(m)) if std::time::Instant::now() < deadline => {
                eprintln!("lookup after the cut, connection not back yet: {m}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("no base volume after a cut import, got {other:?}"),
        }
    }
    assert!(!base_path.exists(), "{} exists", base_path.display());
    let listed = libvirtd.virsh_run(&["vol-list", &pool]).await.unwrap();
    assert!(!listed.contains("base-big.img "), "{listed}");

    // The network is back: the same call starts the import over and gets every byte.
    relay.pass();
    let started = std::time::Instant::now();
    let imported = tokio::time::timeout(
        Duration::from_secs(120),
        hv.import_image(
            ctx.clone(),
            pool.clone(),
            "base-big.img".into(),
            source.clone(),
        ),
    )
    .await
    .expect("the second import is not blocked by the first one's job")
    .unwrap();
    eprintln!("second import took {:?}", started.elapsed());
    assert_eq!(
        files.requests("/big.raw"),
        2,
        "the import started over with a new download"
    );
    let written = std::fs::read(&imported.path).unwrap();
    assert_eq!(written.len(), IMAGE);
    assert_eq!(
        sha256(&written),
        source.sha256,
        "the base has the image's digest"
    );
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());
    assert!(
        hub.connections_opened() >= 2,
        "the dropped connection was replaced"
    );

    // The same from the server's side: sshd's process for the connection dies mid-upload (the
    // relay holds the upload after 6 MiB meanwhile, so it is mid-transfer for sure). A second
    // call for the volume joins the running job and gets the same answer.
    relay.hold_after(CUT_AFTER);
    let import = |volume: &'static str| {
        let (hv, ctx, pool, source) = (hv.clone(), ctx.clone(), pool.clone(), source.clone());
        async move { hv.import_image(ctx, pool, volume.into(), source).await }
    };
    let first = tokio::spawn(import("base-killed.img"));
    relay.held(1).await;
    let mut second = Box::pin(import("base-killed.img"));
    // Polled once: past its (synchronous) look at the job table, it waits on the running job.
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut second)
            .await
            .is_err()
    );
    let sessions = children_of(sshd.pid());
    assert!(!sessions.is_empty(), "no sshd connection process");
    for pid in sessions {
        // SAFETY: kill(2) has no memory-safety preconditions; these are our sshd's children.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let (first, second) = (first.await.unwrap(), second.await);
    relay.pass();
    for result in [first, second] {
        match result {
            Err(LibvirtError::Transport(m)) => {
                for needed in [
                    "base-killed.img",
                    "was interrupted",
                    "SSH connection",
                    "dropped",
                ] {
                    assert!(m.contains(needed), "`{needed}` missing from: {m}");
                }
            }
            other => panic!("expected a transport error, got {other:?}"),
        }
    }
    assert!(matches!(
        hv.lookup_volume(pool.clone(), "base-killed.img".into())
            .await,
        Err(LibvirtError::NotFound(_))
    ));
    let imported = import("base-killed.img").await.unwrap();
    assert_eq!(
        sha256(&std::fs::read(&imported.path).unwrap()),
        source.sha256
    );
    assert_eq!(files.requests("/big.raw"), 4, "one download per job");
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());
    hv.probe(Duration::from_secs(30)).await.unwrap();
}

/// The SSH connection goes silent in the middle of an image import (the relay stops forwarding
/// towards sshd after a quarter of the image: no reset, no close, as when a route or a NAT entry
/// vanishes). The SSH keepalives (every 15 s, 3 unanswered end the session) notice: the import
/// fails after about a minute (60.5 s here) with the same interrupted error instead of waiting forever (its
/// job would block every later call for the volume), and the next one, with the path back,
/// starts over and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_over_a_silently_dead_ssh_connection_fails_once_keepalives_go_unanswered_then_starts_over()
 {
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (relay, _hub, ctx, hv) = through_a_relay(&sshd, &libvirtd, dir.path()).await;
    let pool = libvirtd.pool_name().to_string();
    let image = noise(24 << 20);
    files.serve("/big.raw", image.clone());
    let source = ImageSource {
        url: files.url("/big.raw"),
        sha256: sha256(&image),
        format: "raw".into(),
    };

    relay.hold_after(6 << 20);
    let started = std::time::Instant::now();
    let silent = tokio::time::timeout(
        Duration::from_secs(120),
        hv.import_image(
            ctx.clone(),
            pool.clone(),
            "base-silent.img".into(),
            source.clone(),
        ),
    )
    .await
    .expect("a silent connection fails the import, it does not hang it");
    let noticed = started.elapsed();
    relay.pass();
    eprintln!("silent drop noticed after {noticed:?}");
    assert!(
        noticed >= Duration::from_secs(30),
        "{noticed:?}: keepalives, not a fluke"
    );
    match silent {
        Err(LibvirtError::Transport(m)) => {
            for needed in [
                "base-silent.img",
                "was interrupted",
                "SSH connection",
                "dropped",
            ] {
                assert!(m.contains(needed), "`{needed}` missing from: {m}");
            }
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
    let imported = hv
        .import_image(
            ctx.clone(),
            pool.clone(),
            "base-silent.img".into(),
            source.clone(),
        )
        .await
        .unwrap();
    assert_eq!(
        sha256(&std::fs::read(&imported.path).unwrap()),
        source.sha256
    );
    assert_eq!(files.requests("/big.raw"), 2);
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());
}

/// How many leading bytes of `copy` are already `image`'s, in whole MiB (libvirt allocates the
/// whole file before it copies, so its size says nothing).
fn copied(copy: &std::path::Path, image: &std::path::Path) -> u64 {
    let (Ok(copy), Ok(image)) = (std::fs::read(copy), std::fs::read(image)) else {
        return 0;
    };
    let same = copy
        .chunks(1 << 20)
        .zip(image.chunks(1 << 20))
        .take_while(|(a, b)| a == b)
        .count() as u64;
    (same << 20).min(image.len() as u64)
}

/// The last MiB of the file at `path`.
fn last_mib(path: &std::path::Path) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).unwrap();
    file.seek(SeekFrom::End(-(1 << 20))).unwrap();
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).unwrap();
    tail
}

/// The SSH connection drops while libvirt copies the verified staging volume (128 MiB) to the
/// base's name: libvirtd is stopped (SIGSTOP) as soon as the copy has made the base's file, the
/// relay cuts the connection, libvirtd goes on. libvirtd finishes a copy whose client went away
/// on its own, and the base is there half-copied until then: the import answers only once the
/// copy is over and its digest checked, so the base is never handed out half-copied; here the
/// copy finished, and the import succeeds without a second download. (Before, the import
/// answered at once with a bare transport error and the very next lookup handed out the
/// half-copied base.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_drop_during_the_copy_to_the_base_never_hands_out_a_half_copied_base() {
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (relay, _hub, ctx, hv) = through_a_relay(&sshd, &libvirtd, dir.path()).await;
    let pool = libvirtd.pool_name().to_string();
    const IMAGE: u64 = 128 << 20;
    let image_path = dir.path().join("copy.raw");
    let digest = {
        let image = noise(IMAGE as usize);
        std::fs::write(&image_path, &image).unwrap();
        sha256(&image)
    };
    files.serve_file("/copy.raw", &image_path);
    let source = ImageSource {
        url: files.url("/copy.raw"),
        sha256: digest.clone(),
        format: "raw".into(),
    };
    let base = libvirtd.pool_path().join(format!(
        "{}base-copy.img",
        proxy_operator::provider::capabilities::libvirt::volume_prefix(
            "proxy-operator",
            "kvm-test"
        )
    ));
    let import = {
        let (hv, ctx, pool, source) = (hv.clone(), ctx.clone(), pool.clone(), source.clone());
        tokio::spawn(async move {
            hv.import_image(ctx, pool, "base-copy.img".into(), source)
                .await
        })
    };
    // The copy makes the base's file first; there is no event for it, so it is polled.
    let pid = libvirtd.libvirtd_pid().unwrap() as i32;
    let started = std::time::Instant::now();
    while !base.exists() {
        assert!(
            !import.is_finished(),
            "the import ended before its copy started"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "no copy");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // SAFETY: signalling a child process of this test.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    eprintln!(
        "libvirtd stopped {:?} in, {} of the image copied",
        started.elapsed(),
        copied(&base, &image_path)
    );
    if copied(&base, &image_path) >= IMAGE {
        // SAFETY: as above; libvirtd must not be left stopped.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        panic!("the copy ended before libvirtd could be stopped");
    }
    relay.cut_now();
    relay.cut(1).await;
    relay.pass();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let answered = import.await.unwrap();
    let looked_up = hv.lookup_volume(pool.clone(), "base-copy.img".into()).await;
    eprintln!("import answered: {answered:?}");
    match looked_up {
        Ok(volume) => {
            // The copy goes front to back: its last MiB tells at once whether it is done.
            assert!(
                last_mib(std::path::Path::new(&volume.path)) == last_mib(&image_path),
                "a half-copied base was handed out"
            );
            assert_eq!(sha256(&std::fs::read(&volume.path).unwrap()), digest);
        }
        Err(LibvirtError::NotFound(m)) => eprintln!("refused: {m}"),
        Err(e) => panic!("{e:?}"),
    }
    // libvirt finished the copy by itself and it has the image's digest: the import recovered
    // (no second download), and no staging volume is left.
    let imported = answered.expect("the copy libvirt went on with is the image");
    assert_eq!(sha256(&std::fs::read(&imported.path).unwrap()), digest);
    assert_eq!(files.requests("/copy.raw"), 1);
    assert_eq!(staging_volumes(&libvirtd), Vec::<String>::new());
}

/// A libvirt socket that accepts the connection and never answers (a wedged libvirtd, or a
/// tunnel whose far side holds the bytes): the connect gives up at its deadline with a timeout
/// that says so, instead of holding the hypervisor's connection slot, and every call to it,
/// forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libvirt_socket_that_never_answers_times_the_connect_out() {
    let sshd = Sshd::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let silent = dir.path().join("silent-libvirt.sock");
    let listener = tokio::net::UnixListener::bind(&silent).unwrap();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepting = {
        let held = held.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                held.lock().unwrap().push(stream);
            }
        })
    };
    let grants: Grants = serde_json::from_value(serde_json::json!({
        "libvirt": {
            "sshSecret": "kvm-ssh",
            "hosts": [{
                "name": "hv1",
                "address": "127.0.0.1",
                "port": sshd.port(),
                "user": sshd.user(),
                "socket": silent.to_str().unwrap(),
                "pools": ["default"],
            }]
        }
    }))
    .unwrap();
    let hub = hub(MaterialSource::Static(ssh_material(&sshd)), dir.path());
    let ctx = context(&grants, hub.clone());
    let hv = open(&ctx).await;
    let answer = hv.list_domains(None).await;
    match &answer {
        Err(LibvirtError::Timeout(m)) => assert!(
            m.contains("did not answer the connection"),
            "the timeout says what did not answer: {m}"
        ),
        other => panic!("expected a connect timeout, got {other:?}"),
    }
    assert!(
        !held.lock().unwrap().is_empty(),
        "the connect reached the silent socket through the tunnel"
    );
    assert_eq!(hub.connections_opened(), 0);
    accepting.abort();
}
