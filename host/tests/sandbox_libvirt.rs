//! The libvirt sandbox against a hostile plugin (`plugins/hostile-libvirt`), through the real
//! runtime, the real harness sshd and libvirtd: a domain `victim` (running) and a volume
//! `victim-root.qcow2` are made outside the operator, then each case tries one way to reach
//! them or the hypervisor, and asserts both the host's refusal and that nothing changed.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use common::{engine_with, plugin_bytes, spec, ssh_material, test_options};
use harness::{FileServer, Libvirtd, Sshd};
use proxy_operator::provider::capabilities::Grants;
use proxy_operator::provider::capabilities::libvirt::{
    HOST_METADATA_URI, LibvirtHub, MaterialSource, volume_prefix,
};
use proxy_operator::provider::plugins::types::ProviderError;
use proxy_operator::provider::plugins::{
    CallError, EngineOptions, PluginEngine, ProviderInstance, ProviderInstanceOptions,
};
use rstest::rstest;
use sha2::{Digest, Sha256};

const VICTIM: &str = "victim";
const VICTIM_VOLUME: &str = "victim-root.qcow2";

struct Fixture {
    libvirtd: Libvirtd,
    sshd: Sshd,
    files: FileServer,
    engine: Arc<PluginEngine>,
    hub: Arc<LibvirtHub>,
    other_pool: std::path::PathBuf,
    victim_xml: String,
    victim_uuid: String,
    victim_volume: Vec<u8>,
    /// The victim's MAC on `pxnet`, as libvirt chose it.
    victim_mac: String,
    /// The victim's QEMU monitor socket, where libvirtd sees it and where the test does.
    victim_monitor: (String, std::path::PathBuf),
    /// A root-only file of the hypervisor's.
    victim_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

const VICTIM_FILE_BYTES: &[u8] = b"root-only file of the hypervisor\n";

/// A domain that runs under TCG without disks, on the isolated network.
fn victim_xml() -> String {
    format!(
        "<domain type='qemu'><name>{VICTIM}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type></os><devices><serial type='pty'/>\
         <interface type='network'><source network='pxnet'/><model type='virtio'/></interface>\
         </devices></domain>"
    )
}

impl Fixture {
    async fn start() -> Fixture {
        let (libvirtd, sshd, files) =
            tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
        let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
        libvirtd.define_isolated_network("pxnet").await.unwrap();
        let other_pool = libvirtd.define_pool("other").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        // The victims, made with virsh: nothing of the operator's touches them.
        let xml_path = dir.path().join("victim.xml");
        std::fs::write(&xml_path, victim_xml()).unwrap();
        libvirtd
            .virsh_run(&["define", xml_path.to_str().unwrap()])
            .await
            .unwrap();
        libvirtd.virsh_run(&["start", VICTIM]).await.unwrap();
        let pool = libvirtd.pool_name().to_string();
        libvirtd
            .virsh_run(&[
                "vol-create-as",
                &pool,
                VICTIM_VOLUME,
                "1M",
                "--format",
                "qcow2",
            ])
            .await
            .unwrap();
        let victim_volume = std::fs::read(libvirtd.pool_path().join(VICTIM_VOLUME)).unwrap();
        let victim_xml = libvirtd
            .virsh_run(&["dumpxml", "--inactive", VICTIM])
            .await
            .unwrap();
        let victim_uuid = libvirtd
            .virsh_run(&["domuuid", VICTIM])
            .await
            .unwrap()
            .trim()
            .to_string();
        let victim_mac = victim_xml
            .split("<mac address='")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .expect("the victim's MAC")
            .to_string();
        let id = libvirtd.virsh_run(&["domid", VICTIM]).await.unwrap();
        let monitor = format!("qemu/domain-{}-{VICTIM}/monitor.sock", id.trim());
        let victim_monitor = (
            format!("/var/lib/libvirt/{monitor}"),
            libvirtd.dir().join("lib").join(&monitor),
        );
        assert!(victim_monitor.1.exists(), "{:?}", victim_monitor.1);
        let victim_file = dir.path().join("victim-file");
        std::fs::write(&victim_file, VICTIM_FILE_BYTES).unwrap();
        std::fs::set_permissions(&victim_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let hub = LibvirtHub::new(
            MaterialSource::Static(ssh_material(&sshd)),
            dir.path().to_path_buf(),
        );
        let (engine, _) = engine_with(EngineOptions {
            call_timeout: Duration::from_secs(60),
            libvirt: Some(hub.clone()),
            ..test_options()
        })
        .await;
        Fixture {
            libvirtd,
            sshd,
            files,
            engine,
            hub,
            other_pool,
            victim_xml,
            victim_uuid,
            victim_volume,
            victim_mac,
            victim_monitor,
            victim_file,
            _dir: dir,
        }
    }

    /// hv1 with the harness pool and network `pxnet`; the pool `other` is not granted. With
    /// user-mode networking, port forwards may listen on 127.0.0.1:47300-47309.
    fn grants(&self, user_networking: bool) -> Grants {
        let mut grants = self.grants_value(user_networking);
        if user_networking {
            let host = &mut grants["libvirt"]["hosts"][0];
            host["publishAddress"] = "127.0.0.1".into();
            host["portRange"] = "47300-47309".into();
        }
        serde_json::from_value(grants).unwrap()
    }

    fn grants_value(&self, user_networking: bool) -> serde_json::Value {
        serde_json::json!({
            "http": {"allow": [format!("http://{}", self.files.addr())]},
            "libvirt": {"hosts": [{
                "name": "hv1",
                "address": "127.0.0.1",
                "port": self.sshd.port(),
                "user": self.sshd.user(),
                "socket": self.libvirtd.socket().to_str().unwrap(),
                "pools": [self.libvirtd.pool_name()],
                "networks": ["pxnet"],
                "userNetworking": user_networking,
            }]}
        })
    }

    /// `text` with the fixture's placeholders filled in.
    fn fill(&self, text: &str) -> String {
        text.replace("{pool}", self.libvirtd.pool_name())
            .replace("{pool_path}", self.libvirtd.pool_path().to_str().unwrap())
            .replace("{other_path}", self.other_pool.to_str().unwrap())
            .replace("{victim_uuid}", &self.victim_uuid)
            .replace("{victim_mac}", &self.victim_mac)
            .replace("{victim_monitor}", &self.victim_monitor.0)
            .replace("{victim_file}", self.victim_file.to_str().unwrap())
            .replace("{ssh_port}", &self.sshd.port().to_string())
            .replace("{host_uri}", HOST_METADATA_URI)
            .replace("{prefix}", &volume_prefix("proxy-operator", "hostile-test"))
    }

    async fn hostile(&self, provider: &str, config: serde_json::Value) -> ProviderInstance {
        self.instance(provider, "hostile-libvirt", config, self.grants(false))
            .await
    }

    async fn instance(
        &self,
        provider: &str,
        plugin: &str,
        config: serde_json::Value,
        grants: Grants,
    ) -> ProviderInstance {
        let plugin = self
            .engine
            .load(&format!("{plugin}.wasm"), plugin_bytes(plugin))
            .await
            .expect("the plugin loads");
        ProviderInstance::new(
            self.engine.clone(),
            provider,
            plugin,
            &config,
            &grants.validate().unwrap(),
            ProviderInstanceOptions::default(),
        )
        .unwrap()
    }

    /// Makes the hostile call of `config`: the host's answer, or its error as the plugin saw it.
    async fn attempt(&self, provider: &ProviderInstance) -> Result<String, String> {
        match provider.create(spec("px-1", serde_json::json!({}))).await {
            Ok(instance) => Ok(instance.message.unwrap_or_default()),
            Err(CallError::Provider {
                error: ProviderError::Denied(m),
                ..
            }) => Err(m),
            Err(other) => panic!("expected the host's answer, got {other:?}"),
        }
    }

    /// The victims are as they were made, and the plugin left nothing behind.
    async fn assert_nothing_changed(&self) {
        let state = self
            .libvirtd
            .virsh_run(&["domstate", VICTIM])
            .await
            .unwrap();
        assert_eq!(state.trim(), "running", "the victim domain still runs");
        let xml = self
            .libvirtd
            .virsh_run(&["dumpxml", "--inactive", VICTIM])
            .await
            .unwrap();
        assert_eq!(xml, self.victim_xml, "the victim's definition is unchanged");
        assert!(
            self.victim_monitor.1.exists(),
            "the victim's monitor socket is still there"
        );
        self.assert_victim_file_intact();
        let domains = self
            .libvirtd
            .virsh_run(&["list", "--all", "--name"])
            .await
            .unwrap();
        let domains: Vec<&str> = domains.split_whitespace().collect();
        assert_eq!(domains, [VICTIM], "no domain was defined");
        let volume = std::fs::read(self.libvirtd.pool_path().join(VICTIM_VOLUME))
            .expect("the victim volume is still there");
        assert!(volume == self.victim_volume, "the victim volume is intact");
        for pool in [self.libvirtd.pool_path(), self.other_pool.as_path()] {
            let files: Vec<String> = std::fs::read_dir(pool)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name != VICTIM_VOLUME)
                .collect();
            assert!(files.is_empty(), "no volume was made: {files:?}");
        }
    }
}

impl Fixture {
    /// The hypervisor's root-only file has its bytes, owner and mode (libvirt relabels what it
    /// hands QEMU: `libvirt-qemu` would own it).
    fn assert_victim_file_intact(&self) {
        let meta = std::fs::metadata(&self.victim_file).expect("the victim file is still there");
        assert_eq!(
            std::fs::read(&self.victim_file).unwrap(),
            VICTIM_FILE_BYTES,
            "the victim file's bytes are intact"
        );
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (0, 0, 0o600),
            "the victim file is root's, mode 0600"
        );
    }
}

/// A disk-less domain of the plugin's with `devices` and `os` extras.
fn domain(name: &str, os: &str, devices: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64'>hvm</type>{os}</os>{TB_CACHE}<devices>{devices}</devices></domain>"
    )
}

/// TCG's translation cache, bounded (QEMU's default is 1 GiB).
const TB_CACHE: &str = "<features><tcg><tb-cache unit='MiB'>16</tb-cache></tcg></features>";

/// A domain of the plugin's with these sizes.
fn sized(memory: &str, vcpu: &str, features: &str) -> serde_json::Value {
    define(&format!(
        "<domain type='qemu'><name>hostile-1</name>{memory}{vcpu}<os><type arch='x86_64'>hvm</type></os>{features}</domain>"
    ))
}

fn define(xml: &str) -> serde_json::Value {
    serde_json::json!({"attempt": "define-domain", "xml": xml})
}

fn on_victim(attempt: &str) -> serde_json::Value {
    serde_json::json!({"attempt": attempt, "name": VICTIM})
}

fn volume(pool: &str, xml: &str) -> serde_json::Value {
    serde_json::json!({"attempt": "create-volume", "pool": pool, "xml": xml})
}

const NOT_OURS: &str = "is not among this provider instance's domains";
const NOT_OUR_VOLUME: &str =
    "volume victim-root.qcow2 is not among this provider instance's volumes";

fn on_victim_volume(attempt: &str) -> serde_json::Value {
    serde_json::json!({"attempt": attempt, "pool": "{pool}", "name": VICTIM_VOLUME, "arg": "hostile bytes"})
}

#[rstest]
// Another's domain: not-found, in the words a missing domain gets.
#[case::lookup_the_victim(on_victim("lookup-domain"), NOT_OURS)]
#[case::lookup_the_victims_owner_mark(
    serde_json::json!({"attempt": "lookup-domain", "name": VICTIM, "arg": HOST_METADATA_URI}),
    NOT_OURS
)]
#[case::start_the_victim(on_victim("start-domain"), NOT_OURS)]
#[case::destroy_the_victim(on_victim("destroy-domain"), NOT_OURS)]
#[case::undefine_the_victim(on_victim("undefine-domain"), NOT_OURS)]
#[case::read_the_victims_addresses(on_victim("domain-addresses"), NOT_OURS)]
#[case::redefine_the_victim(define(&domain(VICTIM, "", "")), "the name victim is taken")]
#[case::redefine_the_victim_by_uuid(
    define(
        "<domain type='qemu'><name>hostile-1</name><uuid>{victim_uuid}</uuid><memory unit='MiB'>32</memory><os><type arch='x86_64'>hvm</type></os></domain>"
    ),
    "remove <uuid>"
)]
// Domain XML outside the allow-list.
#[case::disk_of_a_host_block_device(
    define(&domain("hostile-1", "", "<disk type='block' device='disk'><source dev='/dev/loop0'/><target dev='vda'/></disk>")),
    "<domain/devices/disk type='block'> is not allowed"
)]
#[case::disk_of_etc_shadow(
    define(&domain("hostile-1", "", "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/etc/shadow'/><target dev='vda'/></disk>")),
    "`/etc/shadow` is not a volume of this provider instance in a granted pool"
)]
#[case::disk_of_an_ungranted_pool(
    define(&domain("hostile-1", "", "<disk type='file' device='disk'><source file='{other_path}/x.qcow2'/><target dev='vda'/></disk>")),
    "is not a volume of this provider instance in a granted pool"
)]
#[case::disk_out_of_the_pool_by_dot_dot(
    define(&domain("hostile-1", "", "<disk type='file' device='disk'><source file='{pool_path}/../../../../etc/shadow'/><target dev='vda'/></disk>")),
    "is not a volume of this provider instance in a granted pool"
)]
#[case::hostdev(
    define(&domain("hostile-1", "", "<hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>")),
    "<hostdev>"
)]
#[case::qemu_commandline(
    define(
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><name>hostile-1</name><memory unit='MiB'>32</memory><os><type arch='x86_64'>hvm</type></os><qemu:commandline><qemu:arg value='-drive'/><qemu:arg value='file=/etc/shadow'/></qemu:commandline></domain>"
    ),
    "<commandline> of namespace http://libvirt.org/schemas/domain/qemu/1.0"
)]
#[case::emulator_override(
    define(&domain("hostile-1", "", "<emulator>/bin/sh</emulator>")),
    "<emulator> cannot be set"
)]
#[case::filesystem_passthrough(
    define(&domain("hostile-1", "", "<filesystem type='mount' accessmode='passthrough'><source dir='/'/><target dir='host'/></filesystem>")),
    "filesystem passthrough"
)]
#[case::serial_into_a_host_file(
    define(&domain("hostile-1", "", "<serial type='file'><source path='/etc/cron.d/hostile'/></serial>")),
    "<domain/devices/serial type='file'> is not allowed"
)]
#[case::channel_socket_outside_libvirts_directories(
    define(&domain("hostile-1", "", "<channel type='unix'><source mode='bind' path='/run/hostile.sock'/><target type='virtio' name='x'/></channel>")),
    "<channel><source> names a socket path on the hypervisor"
)]
// libvirt's directories are every domain's: bound there, the socket would replace the victim's
// monitor, and be unlinked at the plugin's domain's stop.
#[case::channel_socket_over_the_victims_monitor(
    define(&domain("hostile-1", "", "<channel type='unix'><source mode='bind' path='{victim_monitor}'/><target type='virtio' name='org.qemu.guest_agent.0'/></channel>")),
    "<channel><source> names a socket path on the hypervisor, in directories every domain shares; leave <source> out"
)]
// libvirtd (root) would make the socket at a path built from the name, and delete it at stop.
#[case::channel_target_name_out_of_libvirts_directories(
    define(&domain("hostile-1", "", "<channel type='unix'><target type='virtio' name='../../../../../../..{victim_file}'/></channel>")),
    "<channel><target type='virtio' name='../../../../../../..{victim_file}'> is not allowed (allowed names: org.qemu.guest_agent.0): libvirt makes the channel's socket at a path built from the name"
)]
#[case::mac_of_the_victim(
    define(&domain("hostile-1", "", "<interface type='network'><source network='pxnet'/><mac address='{victim_mac}'/></interface>")),
    "<interface><mac> is libvirt's to choose: an address of the plugin's choice can equal another domain's on the same network; remove <mac>"
)]
#[case::memory_of_512_gib(
    sized("<memory unit='GiB'>512</memory>", "<vcpu>1</vcpu>", TB_CACHE),
    "<memory unit='GiB'>512</memory> is more than this hypervisor's grant allows (4096 MiB); lower it or raise grants.libvirt.hosts[].limits.memoryMib"
)]
#[case::memory_of_512_gib_in_bytes(
    sized("<memory unit='b'>549755813888</memory>", "<vcpu>1</vcpu>", TB_CACHE),
    "limits.memoryMib"
)]
#[case::memory_of_512_gib_in_kib_by_default(
    sized("<memory>536870912</memory>", "<vcpu>1</vcpu>", TB_CACHE),
    "limits.memoryMib"
)]
#[case::current_memory_of_512_gib(
    sized(
        "<memory unit='MiB'>32</memory><currentMemory unit='GB'>550</currentMemory>",
        "<vcpu>1</vcpu>",
        TB_CACHE
    ),
    "<currentMemory unit='GB'>550</currentMemory> is more than"
)]
#[case::vcpus_64(
    sized("<memory unit='MiB'>32</memory>", "<vcpu>64</vcpu>", TB_CACHE),
    "<vcpu> 64 is more than this hypervisor's grant allows (4); lower it or raise grants.libvirt.hosts[].limits.vcpus"
)]
#[case::tb_cache_of_512_gib(
    sized(
        "<memory unit='MiB'>32</memory>",
        "<vcpu>1</vcpu>",
        "<features><tcg><tb-cache unit='GiB'>512</tb-cache></tcg></features>"
    ),
    "<tb-cache unit='GiB'>512</tb-cache> is more than this hypervisor's grant allows (256 MiB); lower it or raise grants.libvirt.hosts[].limits.tbCacheMib"
)]
#[case::tb_cache_left_at_qemus_default(
    sized("<memory unit='MiB'>32</memory>", "<vcpu>1</vcpu>", ""),
    "<domain type='qemu'> needs <features><tcg><tb-cache unit='MiB'>…</tb-cache></tcg></features> of at most 256 MiB"
)]
#[case::kernel_from_the_hypervisors_boot(
    define(&domain("hostile-1", "<kernel>/boot/vmlinuz</kernel>", "")),
    "<kernel> `/boot/vmlinuz` is not a volume of this provider instance in a granted pool"
)]
#[case::initrd_from_elsewhere(
    define(&domain("hostile-1", "<kernel>{pool_path}/{prefix}k</kernel><initrd>/etc/shadow</initrd>", "")),
    "<initrd> `/etc/shadow` is not a volume of this provider instance in a granted pool"
)]
#[case::firmware_loader_of_the_plugins_choice(
    define(&domain("hostile-1", "<loader readonly='yes' type='pflash'>/etc/shadow</loader>", "")),
    "<loader> and <nvram> cannot be set"
)]
#[case::interface_on_an_ungranted_network(
    define(&domain("hostile-1", "", "<interface type='network'><source network='default'/></interface>")),
    "network `default` is not granted (granted: pxnet)"
)]
#[case::interface_on_an_ungranted_bridge(
    define(&domain("hostile-1", "", "<interface type='bridge'><source bridge='virbr0'/></interface>")),
    "bridge `virbr0` is not granted"
)]
#[case::user_mode_networking_not_granted(
    define(&domain("hostile-1", "", "<interface type='user'><backend type='passt'/></interface>")),
    "userNetworking: true"
)]
#[case::a_forged_owner_mark(
    define(
        "<domain type='qemu'><name>hostile-1</name><metadata><poh:owner xmlns:poh='{host_uri}' operator='proxy-operator' provider='someone-else'/></metadata><memory unit='MiB'>32</memory><os><type arch='x86_64'>hvm</type></os></domain>"
    ),
    "may not carry the host's namespace"
)]
// Pools and volumes: another's volume is not-found, and cannot be a disk or a backing store.
#[case::lookup_the_victim_volume(on_victim_volume("lookup-volume"), NOT_OUR_VOLUME)]
#[case::delete_the_victim_volume(on_victim_volume("delete-volume"), NOT_OUR_VOLUME)]
#[case::upload_into_the_victim_volume(on_victim_volume("upload-volume"), NOT_OUR_VOLUME)]
#[case::disk_of_the_victim_volume(
    define(&domain("hostile-1", "", "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{pool_path}/victim-root.qcow2'/><target dev='vda'/></disk>")),
    "`{pool_path}/victim-root.qcow2` is not a volume of this provider instance"
)]
#[case::kernel_of_the_victim_volume(
    define(&domain("hostile-1", "<kernel>{pool_path}/victim-root.qcow2</kernel>", "")),
    "is not a volume of this provider instance"
)]
#[case::an_overlay_over_the_victim_volume(
    volume(
        "{pool}",
        "<volume><name>hostile.qcow2</name><capacity>1048576</capacity><target><format type='qcow2'/></target><backingStore><path>{pool_path}/victim-root.qcow2</path><format type='qcow2'/></backingStore></volume>"
    ),
    "is not a volume of this provider instance in pool"
)]
#[case::a_volume_named_out_of_the_pool(
    volume(
        "{pool}",
        "<volume><name>../hostile</name><capacity>1</capacity></volume>"
    ),
    "is not a volume name"
)]
#[case::a_backing_store_outside_the_pool(
    volume(
        "{pool}",
        "<volume><name>hostile.qcow2</name><capacity>1048576</capacity><target><format type='qcow2'/></target><backingStore><path>/etc/shadow</path><format type='raw'/></backingStore></volume>"
    ),
    "`/etc/shadow` is not a volume of this provider instance in pool"
)]
#[case::a_volume_at_a_path_of_the_plugins_choice(
    volume(
        "{pool}",
        "<volume><name>hostile</name><capacity>1</capacity><target><path>/etc/cron.d/hostile</path></target></volume>"
    ),
    "<volume/target/path> is not allowed"
)]
#[case::a_volume_with_permissions_of_the_plugins_choice(
    volume(
        "{pool}",
        "<volume><name>hostile</name><capacity>1</capacity><target><permissions><mode>0777</mode></permissions></target></volume>"
    ),
    "<volume/target/permissions> is not allowed"
)]
#[case::a_volume_in_an_ungranted_pool(
    volume("other", "<volume><name>hostile</name><capacity>1</capacity></volume>"),
    "pool `other` is not granted"
)]
#[case::info_of_an_ungranted_pool(
    serde_json::json!({"attempt": "pool-info", "pool": "other"}),
    "pool `other` is not granted"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escapes_are_refused_and_change_nothing(
    #[case] config: serde_json::Value,
    #[case] says: &str,
) {
    let fx = Fixture::start().await;
    let config: serde_json::Value = serde_json::from_str(&fx.fill(&config.to_string())).unwrap();
    let hostile = fx.hostile("hostile-test", config).await;
    let refused = fx.attempt(&hostile).await.expect_err("refused");
    assert!(refused.contains(&fx.fill(says)), "{refused}");
    fx.assert_nothing_changed().await;
}

/// Not-found for another's domain is word for word what a missing one gets, so a plugin cannot
/// learn which names exist; `list-domains` leaves the victim out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_domains_cannot_be_told_from_missing_ones() {
    let fx = Fixture::start().await;
    let lookup = |name: &str| serde_json::json!({"attempt": "lookup-domain", "name": name});
    let victim = fx
        .attempt(&fx.hostile("hostile-test", lookup(VICTIM)).await)
        .await
        .unwrap_err();
    let missing = fx
        .attempt(&fx.hostile("hostile-test", lookup("nobody")).await)
        .await
        .unwrap_err();
    assert_eq!(victim.replace(VICTIM, "X"), missing.replace("nobody", "X"));
    let listed = fx
        .attempt(
            &fx.hostile(
                "hostile-test",
                serde_json::json!({"attempt": "list-domains"}),
            )
            .await,
        )
        .await
        .unwrap();
    assert_eq!(listed, "domains: ", "the victim is not listed");
    fx.assert_nothing_changed().await;
}

/// A domain the plugin defines within the allow-list works for its own provider instance, and
/// is invisible to another provider instance of the same plugin on the same hypervisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_instance_sees_only_its_own_domains() {
    let fx = Fixture::start().await;
    let own = domain(
        "hostile-own",
        "",
        "<serial type='pty'/><interface type='network'><source network='pxnet'/></interface>",
    );
    let call = |attempt: &str| serde_json::json!({"attempt": attempt, "name": "hostile-own"});
    let a = |config| fx.hostile("instance-a", config);
    fx.attempt(&a(define(&own)).await).await.unwrap();
    // The host's mark is in the definition, naming the provider instance.
    let xml = fx
        .libvirtd
        .virsh_run(&["dumpxml", "hostile-own"])
        .await
        .unwrap();
    assert!(
        xml.contains(HOST_METADATA_URI) && xml.contains("provider=\"instance-a\""),
        "{xml}"
    );
    fx.attempt(&a(call("start-domain")).await).await.unwrap();
    let b = |config| fx.hostile("instance-b", config);
    for attempt in ["lookup-domain", "destroy-domain", "undefine-domain"] {
        let refused = fx.attempt(&b(call(attempt)).await).await.unwrap_err();
        assert!(refused.contains(NOT_OURS), "{attempt}: {refused}");
    }
    let listed = fx
        .attempt(&b(serde_json::json!({"attempt": "list-domains"})).await)
        .await
        .unwrap();
    assert_eq!(listed, "domains: ");
    let listed = fx
        .attempt(&a(serde_json::json!({"attempt": "list-domains"})).await)
        .await
        .unwrap();
    assert_eq!(listed, "domains: hostile-own");
    let state = fx
        .libvirtd
        .virsh_run(&["domstate", "hostile-own"])
        .await
        .unwrap();
    assert_eq!(state.trim(), "running", "instance-b stopped nothing");
    fx.attempt(&a(call("destroy-domain")).await).await.unwrap();
    fx.attempt(&a(call("undefine-domain")).await).await.unwrap();
    fx.assert_nothing_changed().await;
    assert_eq!(fx.hub.connections_opened(), 1, "one shared connection");
}

/// `import-image` returns an existing volume only once it has seen the volume's bytes have the
/// image's digest: a volume planted under the plugin's own name (outside the operator, or by
/// the plugin through create-volume and upload-volume) is refused, not handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_image_never_returns_a_volume_it_has_not_verified() {
    let fx = Fixture::start().await;
    let image: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    fx.files.serve("/base.img", image.clone());
    let planted = format!(
        "{}base.img",
        volume_prefix("proxy-operator", "hostile-test")
    );
    let pool = fx.libvirtd.pool_name().to_string();
    fx.libvirtd
        .virsh_run(&["vol-create-as", &pool, &planted, "64K", "--format", "raw"])
        .await
        .unwrap();
    let call = |attempt: &str| {
        serde_json::json!({
            "attempt": attempt, "pool": pool, "name": "base.img",
            "arg": if attempt == "import-image" { fx.files.url("/base.img") } else { "hostile".into() },
            "sha256": hex::encode(Sha256::digest(&image)),
        })
    };
    let import = fx.hostile("hostile-test", call("import-image")).await;
    let refused = fx.attempt(&import).await.unwrap_err();
    assert!(
        refused.contains("ChecksumMismatch") && refused.contains("exists with sha256"),
        "{refused}"
    );
    let path = fx.libvirtd.pool_path().join(&planted);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![0u8; 64 * 1024],
        "left as it was"
    );
    assert_eq!(fx.files.requests("/base.img"), 0, "nothing was downloaded");

    // Once it is gone, the import downloads and verifies the image.
    let delete = fx.hostile("hostile-test", call("delete-volume")).await;
    fx.attempt(&delete).await.unwrap();
    fx.attempt(&import).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), image);
    fx.attempt(&import).await.unwrap();
    assert_eq!(
        fx.files.requests("/base.img"),
        1,
        "verified once, then reused"
    );

    // Written to after the import, it is no longer the image.
    let upload = fx.hostile("hostile-test", call("upload-volume")).await;
    fx.attempt(&upload).await.unwrap();
    let refused = fx.attempt(&import).await.unwrap_err();
    assert!(refused.contains("ChecksumMismatch"), "{refused}");
    fx.attempt(&delete).await.unwrap();
    fx.assert_nothing_changed().await;
}

/// An error libvirt answers, even its generic "system error" (here: a backing file that does
/// not exist), is the plugin's failure and not the connection's: the connection every provider
/// instance shares stays, and the next call goes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_error_libvirt_answers_keeps_the_shared_connection() {
    let fx = Fixture::start().await;
    let missing = volume(
        "{pool}",
        "<volume><name>hostile.qcow2</name><capacity>1048576</capacity><target><format type='qcow2'/></target><backingStore><path>{pool_path}/{prefix}missing.qcow2</path><format type='qcow2'/></backingStore></volume>",
    );
    let missing = serde_json::from_str(&fx.fill(&missing.to_string())).unwrap();
    let refused = fx
        .attempt(&fx.hostile("hostile-test", missing).await)
        .await
        .unwrap_err();
    assert!(
        refused.contains("Failed") && refused.contains("missing.qcow2"),
        "libvirt's own error, not transport: {refused}"
    );
    let list = fx
        .hostile(
            "hostile-test",
            serde_json::json!({"attempt": "list-domains"}),
        )
        .await;
    fx.attempt(&list).await.unwrap();
    assert_eq!(fx.hub.connections_opened(), 1, "the connection was kept");
    fx.assert_nothing_changed().await;
}

/// The kvm provider's config for hv1 (only `get` and `delete` are called: no image is fetched).
fn kvm_config(fx: &Fixture) -> serde_json::Value {
    serde_json::json!({
        "domainType": "qemu",
        "hosts": [{"name": "hv1", "zone": "zone-a", "pool": fx.libvirtd.pool_name(), "network": "pxnet"}],
        "images": {"tiny": {"url": fx.files.url("/tiny.raw"), "sha256": "ab".repeat(32), "firmware": "bios", "format": "raw"}},
        "defaultImage": "tiny",
    })
}

/// `status.providerID` patched to point at the victim: the kvm provider's `get` finds nothing
/// and its `delete` deletes nothing, since the host shows it no domain but its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_id_patched_to_the_victim_deletes_nothing() {
    let fx = Fixture::start().await;
    let kvm = fx
        .instance("kvm-test", "kvm", kvm_config(&fx), fx.grants(false))
        .await;
    match kvm.get("hv1/victim").await {
        Err(CallError::Provider {
            error: ProviderError::NotFound(m),
            ..
        }) => assert!(m.contains(NOT_OURS), "{m}"),
        other => panic!("expected not-found, got {other:?}"),
    }
    kvm.delete("hv1/victim").await.unwrap();
    fx.assert_nothing_changed().await;
}

/// The kvm provider checks the owner identity itself before deleting by id: a domain of its own
/// provider instance that carries no kvm owner element (not made for a Proxy) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kvm_provider_deletes_only_domains_with_its_owner_identity() {
    let fx = Fixture::start().await;
    // Defined through the same provider instance's grant, by another plugin.
    let foreign = domain("px-foreign", "", "<serial type='pty'/>");
    let same_instance =
        |config| fx.instance("kvm-test", "hostile-libvirt", config, fx.grants(false));
    fx.attempt(&same_instance(define(&foreign)).await)
        .await
        .unwrap();
    let kvm = fx
        .instance("kvm-test", "kvm", kvm_config(&fx), fx.grants(false))
        .await;
    kvm.delete("hv1/px-foreign").await.unwrap();
    let domains = fx
        .libvirtd
        .virsh_run(&["list", "--all", "--name"])
        .await
        .unwrap();
    assert!(domains.contains("px-foreign"), "not deleted: {domains}");
    let undefine = serde_json::json!({"attempt": "undefine-domain", "name": "px-foreign"});
    fx.attempt(&same_instance(undefine).await).await.unwrap();
    fx.assert_nothing_changed().await;
}

/// A qcow2 header the plugin writes itself (upload-volume into its own volume) names a backing
/// file of its choice; QEMU would open it, and libvirt would hand it to QEMU. `define-domain`
/// reads each qcow2 disk's backing chain as libvirt sees it (after a pool refresh) and refuses
/// a backing file that is not the plugin's own volume in a granted pool; a disk given as another
/// format than libvirt reads the volume as is refused too.
#[rstest]
#[case::as_qcow2("qcow2", "has a backing file `/etc/shadow`")]
#[case::as_raw_though_libvirt_reads_qcow2("raw", "is qcow2 as libvirt reads it")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backing_file_planted_in_a_qcow2_header_is_refused(
    #[case] driver: &str,
    #[case] says: &str,
) {
    let fx = Fixture::start().await;
    let header = fx._dir.path().join("evil.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args([
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "cluster_size=512",
            "-b",
            "/etc/shadow",
            "-F",
            "raw",
        ])
        .arg(&header)
        .arg("1M")
        .status()
        .unwrap();
    assert!(made.success());
    let header = std::fs::read(&header).unwrap();
    let pool = fx.libvirtd.pool_name().to_string();
    let create = volume(
        &pool,
        "<volume><name>evil.img</name><capacity>1048576</capacity><target><format type='raw'/></target></volume>",
    );
    fx.attempt(&fx.hostile("hostile-test", create).await)
        .await
        .unwrap();
    let upload = serde_json::json!({"attempt": "upload-volume", "pool": pool, "name": "evil.img", "bytes": header});
    fx.attempt(&fx.hostile("hostile-test", upload).await)
        .await
        .unwrap();
    let disk = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='{driver}'/><source file='{{pool_path}}/{{prefix}}evil.img'/><target dev='vda'/></disk>"
    );
    let define =
        serde_json::from_str(&fx.fill(&define(&domain("hostile-1", "", &disk)).to_string()))
            .unwrap();
    let refused = fx
        .attempt(&fx.hostile("hostile-test", define).await)
        .await
        .unwrap_err();
    assert!(refused.contains(says), "{refused}");
    let delete = serde_json::json!({"attempt": "delete-volume", "pool": pool, "name": "evil.img"});
    fx.attempt(&fx.hostile("hostile-test", delete).await)
        .await
        .unwrap();
    fx.assert_nothing_changed().await;
}

/// The header rewritten after the definition: `start-domain` checks the images again, as
/// libvirt reads the backing chain from the headers when QEMU starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backing_file_planted_after_the_definition_is_refused_at_start() {
    let fx = Fixture::start().await;
    let header = fx._dir.path().join("evil.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args([
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "cluster_size=512",
            "-b",
            "/etc/shadow",
            "-F",
            "raw",
        ])
        .arg(&header)
        .arg("1M")
        .status()
        .unwrap();
    assert!(made.success());
    let pool = fx.libvirtd.pool_name().to_string();
    let call = |config: serde_json::Value| async {
        fx.attempt(&fx.hostile("hostile-test", config).await).await
    };
    let create = volume(
        &pool,
        "<volume><name>root.qcow2</name><capacity>1048576</capacity><target><format type='qcow2'/></target></volume>",
    );
    call(create).await.unwrap();
    let disk = "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{pool_path}/{prefix}root.qcow2'/><target dev='vda'/></disk>";
    let define =
        serde_json::from_str(&fx.fill(&define(&domain("hostile-1", "", disk)).to_string()))
            .unwrap();
    call(define).await.unwrap();
    let upload = serde_json::json!({"attempt": "upload-volume", "pool": pool, "name": "root.qcow2", "bytes": std::fs::read(&header).unwrap()});
    call(upload).await.unwrap();
    let refused = call(serde_json::json!({"attempt": "start-domain", "name": "hostile-1"}))
        .await
        .unwrap_err();
    assert!(
        refused.contains("start-domain: the qcow2 disk") && refused.contains("`/etc/shadow`"),
        "{refused}"
    );
    let state = fx
        .libvirtd
        .virsh_run(&["domstate", "hostile-1"])
        .await
        .unwrap();
    assert_eq!(state.trim(), "shut off", "not started");
    call(serde_json::json!({"attempt": "undefine-domain", "name": "hostile-1"}))
        .await
        .unwrap();
    call(serde_json::json!({"attempt": "delete-volume", "pool": pool, "name": "root.qcow2"}))
        .await
        .unwrap();
    fx.assert_nothing_changed().await;
}

fn user_interface(forward: &str) -> serde_json::Value {
    define(&domain(
        "hostile-1",
        "",
        &format!(
            "<interface type='user'><backend type='passt'/>{forward}<model type='virtio'/></interface>"
        ),
    ))
}

/// With user-mode networking granted, a port forward (which passt binds on the hypervisor)
/// listens only on the grant's `publishAddress` and only on ports of its `portRange`
/// (127.0.0.1:47300-47309 here): not on every address, not on the hypervisor's own ports.
#[rstest]
#[case::port_forward_on_every_address(
    user_interface("<portForward proto='tcp'><range start='47300' to='3128'/></portForward>"),
    "<portForward address=''> is not the grant's publishAddress 127.0.0.1 (without an address, passt listens on every address of the hypervisor)"
)]
#[case::port_forward_on_0_0_0_0(
    user_interface(
        "<portForward proto='tcp' address='0.0.0.0'><range start='47300' to='3128'/></portForward>"
    ),
    "<portForward address='0.0.0.0'> is not the grant's publishAddress 127.0.0.1"
)]
#[case::port_forward_on_the_hypervisors_ssh_port(
    user_interface(
        "<portForward proto='tcp' address='127.0.0.1'><range start='{ssh_port}' to='22'/></portForward>"
    ),
    "<portForward><range start='{ssh_port}'> is outside the grant's portRange 47300-47309: these are ports of the hypervisor"
)]
#[case::port_forward_of_every_port(
    user_interface(
        "<portForward proto='tcp' address='127.0.0.1'><range start='47300' end='65535'/></portForward>"
    ),
    "<portForward><range start='47300' end='65535'> is outside the grant's portRange 47300-47309"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forwards_only_on_the_grants_publish_address_and_range(
    #[case] config: serde_json::Value,
    #[case] says: &str,
) {
    let fx = Fixture::start().await;
    let config: serde_json::Value = serde_json::from_str(&fx.fill(&config.to_string())).unwrap();
    let hostile = fx
        .instance("hostile-test", "hostile-libvirt", config, fx.grants(true))
        .await;
    let refused = fx.attempt(&hostile).await.expect_err("refused");
    assert!(refused.contains(&fx.fill(says)), "{refused}");
    fx.assert_nothing_changed().await;
}

/// `qemu-img create -f qcow2 -o data_file=…,data_file_raw=on` writes a header whose guest data
/// is a file of the hypervisor's; uploaded into the plugin's own volume, libvirt would hand QEMU
/// that file (relabelled to `libvirt-qemu`) for the guest to read and write. `define-domain`
/// and `start-domain` read each qcow2 disk's header (its first cluster, as QEMU and libvirt
/// read it) and refuse an external data file; a clean header passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_data_file_in_a_qcow2_header_is_refused_at_define_and_at_start() {
    let fx = Fixture::start().await;
    let qemu_img = |path: &std::path::Path, options: &str| {
        let made = std::process::Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-o", options])
            .arg(path)
            .arg("1M")
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::read(path).unwrap()
    };
    // qemu-img makes the data file itself: made first, then given the victim's bytes and mode.
    let evil = qemu_img(
        &fx._dir.path().join("evil.qcow2"),
        &format!(
            "data_file={},data_file_raw=on",
            fx.victim_file.to_str().unwrap()
        ),
    );
    std::fs::write(&fx.victim_file, VICTIM_FILE_BYTES).unwrap();
    std::fs::set_permissions(&fx.victim_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let clean = qemu_img(&fx._dir.path().join("clean.qcow2"), "cluster_size=65536");
    let pool = fx.libvirtd.pool_name().to_string();
    let call = |config: serde_json::Value| async {
        fx.attempt(&fx.hostile("hostile-test", config).await).await
    };
    let upload = |bytes: &[u8]| serde_json::json!({"attempt": "upload-volume", "pool": pool, "name": "root.qcow2", "bytes": bytes});
    let create = volume(
        &pool,
        "<volume><name>root.qcow2</name><capacity>1048576</capacity><target><format type='qcow2'/></target></volume>",
    );
    call(create).await.unwrap();
    call(upload(&evil)).await.unwrap();
    let disk = "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{pool_path}/{prefix}root.qcow2'/><target dev='vda'/></disk>";
    let define: serde_json::Value =
        serde_json::from_str(&fx.fill(&define(&domain("hostile-1", "", disk)).to_string()))
            .unwrap();
    let refused = call(define.clone()).await.unwrap_err();
    assert!(
        refused.contains(&fx.fill(&format!(
            "define-domain: the qcow2 image `{{pool_path}}/{{prefix}}root.qcow2` (disk `{{pool_path}}/{{prefix}}root.qcow2`) may not be a disk: its qcow2 header names an external data file `{}`: QEMU would read and write that file on the hypervisor",
            fx.victim_file.display()
        ))),
        "{refused}"
    );
    fx.assert_victim_file_intact();

    // A clean header passes; the data file written in after the definition is refused at start.
    call(upload(&clean)).await.unwrap();
    call(define).await.unwrap();
    call(upload(&evil)).await.unwrap();
    let refused = call(serde_json::json!({"attempt": "start-domain", "name": "hostile-1"}))
        .await
        .unwrap_err();
    assert!(
        refused.contains("start-domain: the qcow2 image")
            && refused.contains(&format!(
                "external data file `{}`",
                fx.victim_file.display()
            )),
        "{refused}"
    );
    let state = fx
        .libvirtd
        .virsh_run(&["domstate", "hostile-1"])
        .await
        .unwrap();
    assert_eq!(state.trim(), "shut off", "not started");
    fx.assert_victim_file_intact();
    call(serde_json::json!({"attempt": "undefine-domain", "name": "hostile-1"}))
        .await
        .unwrap();
    call(serde_json::json!({"attempt": "delete-volume", "pool": pool, "name": "root.qcow2"}))
        .await
        .unwrap();
    fx.assert_nothing_changed().await;
}
