//! The kvm provider component (`plugins/kvm`) in the real runtime against the real harness sshd
//! and libvirtd: a VM's whole life (image import, overlay, seed ISO, domain with metadata), the
//! NoCloud seed as cloud-init reads it, list/check, idempotent delete, and what is refused.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{engine_with, plugin_bytes, spec, ssh_material, test_options};
use harness::bins::debian_binary;
use harness::{FileServer, Libvirtd, Sshd};
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial;
use proxy_operator::provider::capabilities::libvirt::{LibvirtHub, MaterialSource, volume_prefix};
use proxy_operator::provider::plugins::types::{InstanceState, ProviderError};
use proxy_operator::provider::plugins::{
    CallError, EngineOptions, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};
use sha2::{Digest, Sha256};

struct Fixture {
    libvirtd: Libvirtd,
    sshd: Sshd,
    files: FileServer,
    engine: Arc<PluginEngine>,
    image: Vec<u8>,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn start() -> Fixture {
        let (libvirtd, sshd, files) =
            tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
        let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
        libvirtd.define_isolated_network("pxnet").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_for(ssh_material(&sshd), dir.path()).await;
        // A small "disk image": the VMs run under TCG without booting anything from it.
        let image: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
        files.serve("/tiny.raw", image.clone());
        Fixture {
            libvirtd,
            sshd,
            files,
            engine,
            image,
            dir,
        }
    }

    fn grants(&self, hosts: &[&str]) -> Grants {
        let hosts: Vec<_> = hosts
            .iter()
            .map(|name| {
                serde_json::json!({
                    "name": name,
                    "address": "127.0.0.1",
                    "port": self.sshd.port(),
                    "user": self.sshd.user(),
                    "socket": self.libvirtd.socket().to_str().unwrap(),
                    // The pools `check` is tested on (missing, stopped) are granted too: what
                    // it reports about them is the hypervisor's state, not the grant.
                    "pools": [self.libvirtd.pool_name(), "no-such-pool", "stopped"],
                    "networks": ["pxnet"],
                    "userNetworking": true,
                    "publishAddress": "127.0.0.1",
                    "portRange": "47200-47201",
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "http": {"allow": [format!("http://{}", self.files.addr())]},
            "libvirt": {"hosts": hosts},
        }))
        .unwrap()
    }

    fn config(&self, sha256: &str) -> serde_json::Value {
        serde_json::json!({
            "domainType": "qemu",
            "hosts": [
                {"name": "hv1", "zone": "zone-a", "pool": self.libvirtd.pool_name(), "network": "pxnet"},
                {"name": "hv2", "zone": "zone-b", "pool": self.libvirtd.pool_name(), "network": "pxnet"},
            ],
            "images": {
                "tiny": {"url": self.files.url("/tiny.raw"), "sha256": sha256, "firmware": "bios", "format": "raw"}
            },
            "defaultImage": "tiny",
            "defaults": {"memoryMib": 128, "vcpus": 1, "diskGib": 1},
        })
    }

    async fn instance(&self, config: serde_json::Value, granted: &[&str]) -> ProviderInstance {
        self.instance_on(&self.engine, config, self.grants(granted))
            .await
    }

    async fn instance_on(
        &self,
        engine: &Arc<PluginEngine>,
        config: serde_json::Value,
        grants: Grants,
    ) -> ProviderInstance {
        let plugin = engine
            .load("kvm.wasm", plugin_bytes("kvm"))
            .await
            .expect("the kvm plugin loads");
        ProviderInstance::new(
            engine.clone(),
            "kvm-test",
            plugin,
            &config,
            &grants.validate().unwrap(),
            ProviderInstanceOptions::default(),
        )
        .unwrap()
    }

    fn material(&self) -> SshMaterial {
        ssh_material(&self.sshd)
    }

    /// An engine whose SSH material is `material` (a Secret with other contents).
    async fn engine_with_material(&self, material: SshMaterial) -> Arc<PluginEngine> {
        engine_for(material, self.dir.path()).await
    }

    async fn virsh(&self, args: &[&str]) -> String {
        self.libvirtd.virsh_run(args).await.unwrap()
    }

    fn volume_path(&self, name: &str) -> std::path::PathBuf {
        self.libvirtd.pool_path().join(self.volume_name(name))
    }

    /// The name libvirt has for the plugin's volume `name`: with the host's owner prefix of
    /// provider instance `kvm-test` (under the default operator id).
    fn volume_name(&self, name: &str) -> String {
        format!("{}{name}", volume_prefix("proxy-operator", "kvm-test"))
    }

    /// The base volume of image `tiny` with digest `sha256`: named by key and digest.
    fn base_volume(&self, sha256: &str) -> String {
        format!("base-tiny-{}.raw", &sha256[..12])
    }
}

/// An engine whose hypervisor connections use `material`, with tunnel sockets under `dir`.
async fn engine_for(material: SshMaterial, dir: &Path) -> Arc<PluginEngine> {
    engine_with(EngineOptions {
        call_timeout: Duration::from_secs(60),
        libvirt: Some(LibvirtHub::new(
            MaterialSource::Static(material),
            dir.to_path_buf(),
        )),
        ..test_options()
    })
    .await
    .0
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A file of the seed ISO, read the way cloud-init's NoCloud reader would find it (by name).
async fn iso_file(iso: &Path, name: &str) -> Vec<u8> {
    let out = tokio::process::Command::new(debian_binary("/usr/bin/bsdtar", "libarchive-tools"))
        .arg("-xOf")
        .arg(iso)
        .arg(name)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "bsdtar {name}: {out:?}");
    out.stdout
}

async fn iso_volume_id(iso: &Path) -> String {
    let out = tokio::process::Command::new(debian_binary("/usr/bin/isoinfo", "genisoimage"))
        .arg("-d")
        .arg("-i")
        .arg(iso)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("Volume id: "))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn provider_error(result: Result<impl std::fmt::Debug, CallError>) -> ProviderError {
    match result {
        Err(CallError::Provider { error, .. }) => error,
        other => panic!("expected a provider error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_is_made_found_listed_and_removed() {
    let fx = Fixture::start().await;
    let mut config = fx.config(&sha256(&fx.image));
    // The managed squid admits the test on loopback and reaches its one loopback site.
    config["allowFrom"] = serde_json::json!(["127.0.0.0/8"]);
    config["allowDestinations"] = serde_json::json!(["127.0.0.1/32"]);
    let kvm = fx.instance(config, &["hv1", "hv2"]).await;
    kvm.validate_config().await.unwrap();

    let mut request = spec("px-kvm-one", serde_json::json!({}));
    // user-data byte for byte: a script, not YAML, with non-ASCII bytes.
    request.user_data =
        b"#!/bin/sh\necho 'gr\xc3\xbc\xc3\x9fe' > /etc/motd\n\xff\x00end\n".to_vec();
    let created = kvm.create(request.clone()).await.unwrap();
    assert_eq!(created.provider_id, "hv1/px-kvm-one", "zone-a is hv1");
    assert_eq!(created.zone.as_deref(), Some("zone-a"));
    assert_eq!(created.owner.as_ref().unwrap().uid, "uid-px-kvm-one");

    // The base image was imported from the loopback server, once, byte for byte.
    assert_eq!(
        std::fs::read(fx.volume_path(&fx.base_volume(&sha256(&fx.image)))).unwrap(),
        fx.image
    );
    // The overlay is a qcow2 over it; the seed is a NoCloud ISO with the user-data as given.
    let overlay = fx
        .virsh(&[
            "vol-dumpxml",
            "--pool",
            fx.libvirtd.pool_name(),
            &fx.volume_name("px-kvm-one-root.qcow2"),
        ])
        .await;
    assert!(
        overlay.contains(&fx.base_volume(&sha256(&fx.image))),
        "{overlay}"
    );
    let seed = fx.volume_path("px-kvm-one-seed.iso");
    assert_eq!(iso_volume_id(&seed).await, "cidata");
    assert_eq!(iso_file(&seed, "user-data").await, request.user_data);
    let meta = String::from_utf8(iso_file(&seed, "meta-data").await).unwrap();
    assert!(meta.contains("px-kvm-one"), "{meta}");
    let vendor = String::from_utf8_lossy(&iso_file(&seed, "vendor-data").await).to_string();
    assert!(vendor.contains("qemu-guest-agent"), "{vendor}");
    // The managed squid's config, run by real squid: no way to the hypervisor's addresses
    // (loopback through passt, the network's gateway) or the LAN behind it.
    let squid_conf = common::own_network::conf_in_script(&vendor);
    common::own_network::assert_squid_parses(&squid_conf);
    common::own_network::assert_refuses_its_own_network(&squid_conf).await;

    // The domain: defined from the provider's XML, running, carrying the owner.
    let xml = fx.virsh(&["dumpxml", "px-kvm-one"]).await;
    assert!(
        xml.contains("uid-px-kvm-one") && xml.contains("test-operator"),
        "{xml}"
    );
    assert!(
        xml.contains("type='qemu'") || xml.contains("type=\"qemu\""),
        "{xml}"
    );
    assert_eq!(
        fx.virsh(&["domstate", "px-kvm-one"]).await.trim(),
        "running"
    );

    let got = kvm.get("hv1/px-kvm-one").await.unwrap();
    assert!(
        matches!(
            got.state,
            InstanceState::Running | InstanceState::Provisioning
        ),
        "{got:?}"
    );
    assert_eq!(got.owner.as_ref().unwrap().operator_id, "test-operator");
    // A create retried (e.g. after an operator restart) returns the same VM.
    let again = kvm.create(request.clone()).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    let listed = kvm.list().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|i| i.provider_id == "hv1/px-kvm-one")
            .count(),
        1,
        "{listed:?}"
    );
    assert_eq!(
        fx.files.requests("/tiny.raw"),
        1,
        "the base image is reused"
    );

    let checks = kvm.check().await.unwrap();
    assert_eq!(checks.len(), 2, "{checks:?}");
    assert!(checks.iter().all(|c| c.ok), "{checks:?}");

    // Delete removes the domain and its volumes; again is a no-op; an unconfigured host too.
    kvm.delete("hv1/px-kvm-one").await.unwrap();
    let domains = fx.virsh(&["list", "--all", "--name"]).await;
    assert!(!domains.contains("px-kvm-one"), "{domains}");
    assert!(!fx.volume_path("px-kvm-one-root.qcow2").exists());
    assert!(!seed.exists());
    assert!(
        fx.volume_path(&fx.base_volume(&sha256(&fx.image))).exists(),
        "the base stays for the next VM"
    );
    kvm.delete("hv1/px-kvm-one").await.unwrap();
    kvm.delete("gone-host/px-kvm-one").await.unwrap();
    assert!(matches!(
        provider_error(kvm.get("gone-host/px-kvm-one").await),
        ProviderError::Permanent(_)
    ));
    assert!(matches!(
        provider_error(kvm.get("hv1/px-kvm-one").await),
        ProviderError::NotFound(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_image_digest_and_an_ungranted_host_are_refused() {
    let fx = Fixture::start().await;

    // The config's sha256 does not match what the server sends: permanent, nothing left behind.
    let kvm = fx
        .instance(fx.config(&"0".repeat(64)), &["hv1", "hv2"])
        .await;
    let error = provider_error(kvm.create(spec("px-kvm-bad", serde_json::json!({}))).await);
    match &error {
        ProviderError::Permanent(m) => assert!(m.contains("sha256"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!fx.volume_path(&fx.base_volume(&"0".repeat(64))).exists());
    let domains = fx.virsh(&["list", "--all", "--name"]).await;
    assert!(!domains.contains("px-kvm-bad"), "{domains}");

    // hv2 is in the plugin's config but not in the grant: the host refuses to reach it.
    let kvm = fx.instance(fx.config(&sha256(&fx.image)), &["hv1"]).await;
    let mut request = spec("px-kvm-b", serde_json::json!({}));
    request.zone = Some("zone-b".into());
    let error = provider_error(kvm.create(request).await);
    let message = format!("{error:?}");
    assert!(message.contains("grants.libvirt"), "{message}");
    let checks = kvm.check().await.unwrap();
    let hv2 = checks.iter().find(|c| c.target.contains("hv2")).unwrap();
    assert!(!hv2.ok && hv2.reason == "Forbidden", "{hv2:?}");
    let hv1 = checks.iter().find(|c| c.target.contains("hv1")).unwrap();
    assert!(hv1.ok, "{hv1:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_what_is_wrong_with_each_hypervisor_and_calls_fail_with_the_right_class() {
    let fx = Fixture::start().await;
    let sha = sha256(&fx.image);
    let one_host = |pool: &str| {
        let mut config = fx.config(&sha);
        config["hosts"] = serde_json::json!([
            {"name": "hv1", "zone": "zone-a", "pool": pool, "network": "pxnet"}
        ]);
        config
    };
    let verdict = |checks: Vec<proxy_operator::provider::plugins::types::CheckTarget>| {
        assert_eq!(checks.len(), 1, "{checks:?}");
        let c = checks.into_iter().next().unwrap();
        assert!(!c.ok, "{c:?}");
        (c.reason, c.message)
    };

    // The hypervisor shows another host key than known_hosts has.
    let other = harness::SshKey::generate(&fx.dir.path().join("other"))
        .await
        .unwrap();
    let wrong_host_key = SshMaterial {
        known_hosts: format!("[127.0.0.1]:{} {}\n", fx.sshd.port(), other.public.trim()),
        ..fx.material()
    };
    // … or refuses the client key.
    let refused_key = SshMaterial {
        private_key: other.private_pem.clone(),
        ..fx.material()
    };
    for (material, expected) in [
        (wrong_host_key, "HostKeyMismatch"),
        (refused_key, "AuthFailed"),
    ] {
        let engine = fx.engine_with_material(material).await;
        let kvm = fx
            .instance_on(
                &engine,
                one_host(fx.libvirtd.pool_name()),
                fx.grants(&["hv1"]),
            )
            .await;
        let (reason, message) = verdict(kvm.check().await.unwrap());
        assert_eq!(reason, expected, "{message}");
        assert!(matches!(
            create_error(&kvm).await,
            ProviderError::Unauthorized(_)
        ));
    }

    // Nothing answers at the address: transient, retried.
    let engine = fx.engine_with_material(fx.material()).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut grants = fx.grants(&["hv1"]);
    grants.libvirt.as_mut().unwrap().hosts[0].port = closed.local_addr().unwrap().port();
    drop(closed);
    let kvm = fx
        .instance_on(&engine, one_host(fx.libvirtd.pool_name()), grants)
        .await;
    let (reason, message) = verdict(kvm.check().await.unwrap());
    assert_eq!(reason, "Unreachable", "{message}");
    assert!(matches!(
        create_error(&kvm).await,
        ProviderError::Transient { .. }
    ));

    // The pool is missing, or defined but stopped.
    let kvm = fx
        .instance_on(&engine, one_host("no-such-pool"), fx.grants(&["hv1"]))
        .await;
    let (reason, message) = verdict(kvm.check().await.unwrap());
    assert_eq!(reason, "PoolNotFound", "{message}");
    fx.libvirtd.define_pool("stopped").await.unwrap();
    fx.virsh(&["pool-destroy", "stopped"]).await;
    let kvm = fx
        .instance_on(&engine, one_host("stopped"), fx.grants(&["hv1"]))
        .await;
    let (reason, message) = verdict(kvm.check().await.unwrap());
    assert_eq!(reason, "PoolInactive", "{message}");
    assert!(message.contains("virsh pool-start"), "{message}");
}

async fn create_error(kvm: &ProviderInstance) -> ProviderError {
    provider_error(
        kvm.create(spec("px-kvm-check", serde_json::json!({})))
            .await,
    )
}

/// The provider's own domain XML (BIOS, q35, the overlay on virtio, the seed on SATA, a NIC on
/// the isolated network) really boots a guest under TCG: the harness's boot disk runs the kernel,
/// whose init powers the machine off, so the domain shuts off by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_really_boots_from_the_providers_own_domain_xml() {
    let fx = Fixture::start().await;
    let disk_dir = tempfile::tempdir().unwrap();
    let disk = std::fs::read(harness::bootdisk::build(disk_dir.path()).await.unwrap()).unwrap();
    fx.files.serve("/boot.img", disk.clone());
    let mut config = fx.config(&sha256(&fx.image));
    config["images"]["boot"] = serde_json::json!({
        "url": fx.files.url("/boot.img"), "sha256": sha256(&disk), "firmware": "bios", "format": "raw"
    });
    let kvm = fx.instance(config, &["hv1", "hv2"]).await;
    let mut request = spec("px-kvm-boot", serde_json::json!({}));
    request.image = Some("boot".into());
    request.machine_type = Some("1x256".into());
    kvm.create(request).await.unwrap();

    // Booting under TCG takes ~10 s (more on a loaded machine); the guest's init powers it off.
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let state = fx.virsh(&["domstate", "--reason", "px-kvm-boot"]).await;
        if state.trim() == "shut off (shutdown)" {
            break;
        }
        assert!(
            (state.starts_with("running") || state.starts_with("in shutdown"))
                && std::time::Instant::now() < deadline,
            "the guest did not power itself off: {state}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let got = kvm.get("hv1/px-kvm-boot").await.unwrap();
    assert!(matches!(got.state, InstanceState::Stopped), "{got:?}");
    kvm.delete("hv1/px-kvm-boot").await.unwrap();
}

/// The published port of a user-mode domain, from its XML.
async fn published_port(fx: &Fixture, domain: &str) -> u16 {
    let xml = fx.virsh(&["dumpxml", domain]).await;
    let start = xml.find("<range start='").expect("a port forward") + "<range start='".len();
    xml[start..start + xml[start..].find('\'').unwrap()]
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_mode_vms_get_ports_of_their_own_read_back_from_the_domains() {
    let fx = Fixture::start().await;
    let mut config = fx.config(&sha256(&fx.image));
    config["hosts"] = serde_json::json!([{
        "name": "hv1", "zone": "zone-a", "pool": fx.libvirtd.pool_name(),
        "network": {"mode": "user", "publishAddress": "127.0.0.1", "portRange": "47200-47201"},
    }]);
    let kvm = fx.instance(config.clone(), &["hv1"]).await;
    kvm.validate_config().await.unwrap();

    // This libvirtd's private network namespace has no routable interface for passt to copy,
    // as on a hypervisor without passt's prerequisites: the domain is defined, starting it
    // fails, and the error says what user-mode networking needs.
    for name in ["px-user-a", "px-user-b"] {
        match provider_error(kvm.create(spec(name, serde_json::json!({}))).await) {
            ProviderError::Permanent(m) => {
                assert!(
                    m.contains("passt") && m.contains("apt-get install passt"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    let (a, b) = (
        published_port(&fx, "px-user-a").await,
        published_port(&fx, "px-user-b").await,
    );
    assert_ne!(a, b, "no two VMs on a host share a port");
    for port in [a, b] {
        assert!((47200..=47201).contains(&port), "{port}");
    }

    // The range is full: a third Proxy waits with a quota error naming it, and nothing of it is
    // left in the pool.
    match provider_error(kvm.create(spec("px-user-c", serde_json::json!({}))).await) {
        ProviderError::Quota(m) => assert!(m.contains("47200-47201 (2 ports)"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!fx.volume_path("px-user-c-root.qcow2").exists());

    // A new provider instance (as after an operator restart) reads the choices back: a retried
    // create keeps its port, and a deleted VM's port goes to the next Proxy.
    let restarted = fx.instance(config, &["hv1"]).await;
    let _ = restarted
        .create(spec("px-user-a", serde_json::json!({})))
        .await;
    assert_eq!(published_port(&fx, "px-user-a").await, a);
    restarted.delete("hv1/px-user-a").await.unwrap();
    let _ = restarted
        .create(spec("px-user-c", serde_json::json!({})))
        .await;
    assert_eq!(published_port(&fx, "px-user-c").await, a);
    for id in ["hv1/px-user-b", "hv1/px-user-c"] {
        restarted.delete(id).await.unwrap();
    }
}

/// The conformance suite of `proxy-operator plugin test` (as a library) against the kvm provider
/// on the real sshd + libvirtd: the same contract every provider keeps. The VM it creates runs
/// the tiny image under TCG and boots nothing; it is gone at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kvm_provider_is_conformant() {
    let fx = Fixture::start().await;
    let config = fx.config(&sha256(&fx.image));
    common::assert_conformant(&fx.engine, "kvm", config, fx.grants(&["hv1", "hv2"]), None).await;
    let domains = fx.virsh(&["list", "--all", "--name"]).await;
    assert!(
        !domains.contains("px-conformance"),
        "nothing left behind: {domains}"
    );
}

/// Issue #17 item 3, on two real hypervisors (two libvirtds behind the one sshd): a VM made on
/// `hv1`, then the config changes so that `hv2` is where a Proxy of that zone goes. Create again
/// (a retry after a cut-off create) finds the VM on `hv1` instead of making a second on `hv2`.
/// NextReconcile, with `hv2` down, a create for a new name stops with a transient error and makes nothing
/// on `hv1`: the silent host may hold an earlier try's VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_finds_the_vm_on_the_host_an_earlier_config_chose() {
    let fx = Fixture::start().await;
    let other = Libvirtd::start().await.unwrap();
    other.define_isolated_network("pxnet").await.unwrap();
    let pool = fx.libvirtd.pool_name();
    assert_eq!(other.pool_name(), pool);
    let host_grant = |name: &str, socket: &Path| {
        serde_json::json!({
            "name": name, "address": "127.0.0.1", "port": fx.sshd.port(), "user": fx.sshd.user(),
            "socket": socket.to_str().unwrap(), "pools": [pool], "networks": ["pxnet"],
        })
    };
    let grants: Grants = serde_json::from_value(serde_json::json!({
        "http": {"allow": [format!("http://{}", fx.files.addr())]},
        "libvirt": {"hosts": [
            host_grant("hv1", fx.libvirtd.socket()),
            host_grant("hv2", other.socket()),
        ]},
    }))
    .unwrap();
    let with_hosts = |hosts: serde_json::Value| {
        let mut config = fx.config(&sha256(&fx.image));
        config["hosts"] = hosts;
        config
    };
    let host = |name: &str, zone: &str| serde_json::json!({"name": name, "zone": zone, "pool": pool, "network": "pxnet"});
    let request = spec("px-kvm-moved", serde_json::json!({}));
    assert_eq!(request.zone.as_deref(), Some("zone-a"));

    let before = fx
        .instance_on(
            &fx.engine,
            with_hosts(serde_json::json!([host("hv1", "zone-a")])),
            grants.clone(),
        )
        .await;
    let made = before.create(request.clone()).await.unwrap();
    assert_eq!(made.provider_id, "hv1/px-kvm-moved");

    // hv2 joins zone-a, hv1 moves to zone-b: zone-a's only host is now hv2.
    let after = fx
        .instance_on(
            &fx.engine,
            with_hosts(serde_json::json!([
                host("hv2", "zone-a"),
                host("hv1", "zone-b")
            ])),
            grants.clone(),
        )
        .await;
    let again = after.create(request.clone()).await.unwrap();
    assert_eq!(
        again.provider_id, "hv1/px-kvm-moved",
        "found, not made again"
    );
    let on_other = other.virsh_run(&["list", "--all", "--name"]).await.unwrap();
    assert!(
        !on_other.contains("px-kvm-moved"),
        "no second VM: {on_other}"
    );
    let listed = after.list().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|i| i.name == "px-kvm-moved")
            .map(|i| i.provider_id.as_str())
            .collect::<Vec<_>>(),
        ["hv1/px-kvm-moved"]
    );

    // hv2 stops answering; a create that would go to hv1 must not guess.
    drop(other);
    let waiting = fx
        .instance_on(
            &fx.engine,
            with_hosts(serde_json::json!([
                host("hv1", "zone-a"),
                host("hv2", "zone-b")
            ])),
            grants,
        )
        .await;
    match provider_error(
        waiting
            .create(spec("px-kvm-wait", serde_json::json!({})))
            .await,
    ) {
        ProviderError::Transient { message, .. } => assert!(
            message.contains("host hv2 could not be searched for an existing domain px-kvm-wait"),
            "{message}"
        ),
        other => panic!("expected a transient error, got {other:?}"),
    }
    let domains = fx.virsh(&["list", "--all", "--name"]).await;
    assert!(!domains.contains("px-kvm-wait"), "{domains}");
    assert!(!fx.volume_path("px-kvm-wait-root.qcow2").exists());
    after.delete("hv1/px-kvm-moved").await.unwrap();
}
