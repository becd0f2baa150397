use rstest::rstest;

use super::*;
use crate::provider::capabilities::grants::{DomainLimits, Publish};

const POOL: &str = "/var/lib/libvirt/images";
/// The owner prefix of this provider instance's volumes.
const PFX: &str = "kvm-a.0123456789ab.";

fn policy() -> DomainPolicy {
    DomainPolicy {
        pools: vec![("default".into(), POOL.into())],
        networks: vec!["pxnet".into()],
        bridges: vec!["br0".into()],
        user_networking: true,
        publish: Some(Publish {
            address: "127.0.0.1".parse().unwrap(),
            first: 13100,
            last: 13199,
        }),
        limits: DomainLimits::default(),
        volume_prefix: PFX.into(),
    }
}

fn mark() -> OwnerMark {
    OwnerMark {
        operator: "op".into(),
        provider: "kvm-a".into(),
    }
}

/// What the kvm provider writes (plugins/kvm/src/xml.rs), with `devices` and `os` extras.
fn domain(os_extra: &str, devices: &str) -> String {
    format!(
        "<domain type='qemu'>\n  <name>px-1</name>\n  <metadata>\n    <po:owner xmlns:po='https://proxy-operator.dev/xmlns/kvm/1' uid='u'/>\n  </metadata>\n\
         <memory unit='MiB'>512</memory><vcpu placement='static'>1</vcpu>\
         <os firmware='efi'><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/>{os_extra}</os>\
         <features><acpi/><apic/><tcg><tb-cache unit='MiB'>128</tb-cache></tcg></features>\
         <clock offset='utc'/><on_poweroff>destroy</on_poweroff>\
         <devices>\
         <disk type='file' device='disk'><driver name='qemu' type='qcow2' discard='unmap'/><source file='{POOL}/{PFX}px-1-root.qcow2'/><target dev='vda' bus='virtio'/></disk>\
         <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{POOL}/{PFX}px-1-seed.iso'/><target dev='vdb' bus='virtio'/><readonly/></disk>\
         <serial type='pty'/><console type='pty'/>\
         <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>\
         {devices}</devices></domain>"
    )
}

const NETWORK: &str =
    "<interface type='network'><source network='pxnet'/><model type='virtio'/></interface>";

#[rstest]
#[case::network(NETWORK)]
#[case::bridge("<interface type='bridge'><source bridge='br0'/><model type='virtio'/></interface>")]
#[case::user_passt(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'><range start='13128' to='3128'/></portForward><model type='virtio'/></interface>"
)]
#[case::user_passt_a_range_of_the_grant(
    "<interface type='user'><backend type='passt'/><portForward proto='udp' address='127.0.0.1'><range start='13100' end='13199'/></portForward></interface>"
)]
#[case::user_without_port_forwards("<interface type='user'><backend type='passt'/></interface>")]
fn what_a_proxy_vm_needs_passes(#[case] devices: &str) {
    let checked = check_domain(&domain("", devices), &policy(), &mark()).unwrap();
    assert_eq!(checked.name, "px-1");
    // The mark is in the one <metadata>, beside the plugin's own element.
    let doc = roxmltree::Document::parse(&checked.xml).unwrap();
    let metadata: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("metadata"))
        .collect();
    assert_eq!(metadata.len(), 1);
    let owners: Vec<_> = metadata[0]
        .children()
        .filter(|n| n.has_tag_name("owner"))
        .map(|n| n.tag_name().namespace().unwrap().to_string())
        .collect();
    assert_eq!(
        owners,
        [
            "https://proxy-operator.dev/xmlns/kvm/1".to_string(),
            HOST_METADATA_URI.to_string()
        ]
    );
}

#[test]
fn direct_kernel_boot_from_the_pool_passes() {
    let os = format!(
        "<kernel>{POOL}/{PFX}base-k</kernel><initrd>{POOL}/{PFX}base-i</initrd><cmdline>console=ttyS0</cmdline>"
    );
    check_domain(&domain(&os, NETWORK), &policy(), &mark()).unwrap();
}

#[rstest]
#[case::no_metadata("<domain type='kvm'><name>a</name></domain>")]
#[case::empty_metadata("<domain type='kvm'><name>a</name><metadata/></domain>")]
#[case::open_metadata("<domain type='kvm'><name>a</name><metadata></metadata ></domain >")]
fn the_mark_is_added_wherever_metadata_is(#[case] xml: &str) {
    let checked = check_domain(xml, &policy(), &mark()).unwrap();
    let doc = roxmltree::Document::parse(&checked.xml).unwrap();
    let owner = doc
        .descendants()
        .find(|n| n.tag_name().namespace() == Some(HOST_METADATA_URI))
        .expect("the mark");
    assert_eq!(
        owner.parent_element().unwrap().tag_name().name(),
        "metadata"
    );
    assert!(mark().matches(Some(&owner.document().input_text()[owner.range()])));
}

#[rstest]
#[case::host_block_device(
    "<disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vdc'/></disk>",
    "<domain/devices/disk type='block'>"
)]
#[case::another_owners_volume_in_the_pool(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/victim-root.qcow2'/><target dev='vdc'/></disk>",
    "is not a volume of this provider instance"
)]
#[case::another_provider_instances_volume(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/kvm-b.0123456789ab.px-root.qcow2'/><target dev='vdc'/></disk>",
    "is not a volume of this provider instance"
)]
#[case::the_bare_prefix(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/kvm-a.0123456789ab.'/><target dev='vdc'/></disk>",
    "is not a volume of this provider instance"
)]
#[case::file_outside_the_pools(
    "<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vdc'/></disk>",
    "`/etc/shadow` is not a volume of this provider instance in a granted pool"
)]
#[case::dot_dot_out_of_the_pool(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/../../../etc/shadow'/><target dev='vdc'/></disk>",
    "is not a volume of this provider instance in a granted pool"
)]
#[case::subdirectory_of_the_pool(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/sub/x'/><target dev='vdc'/></disk>",
    "is not a volume of this provider instance in a granted pool"
)]
#[case::network_disk(
    "<disk type='network' device='disk'><source protocol='nbd' name='x'/></disk>",
    "type='network'"
)]
#[case::backing_store_in_the_domain(
    "<disk type='file' device='disk'><source file='/var/lib/libvirt/images/a'/><backingStore type='file'><source file='/etc/shadow'/></backingStore><target dev='vdc'/></disk>",
    "<domain/devices/disk/backingStore> is not allowed"
)]
#[case::hostdev(
    "<hostdev mode='subsystem' type='pci'><source><address bus='0x01'/></source></hostdev>",
    "<hostdev>"
)]
#[case::emulator("<emulator>/tmp/evil</emulator>", "<emulator> cannot be set")]
#[case::filesystem(
    "<filesystem type='mount'><source dir='/'/><target dir='root'/></filesystem>",
    "filesystem passthrough"
)]
#[case::ungranted_network(
    "<interface type='network'><source network='default'/></interface>",
    "network `default` is not granted (granted: pxnet); add it to grants.libvirt.hosts[].networks"
)]
#[case::ungranted_bridge(
    "<interface type='bridge'><source bridge='virbr0'/></interface>",
    "grants.libvirt.hosts[].bridges"
)]
#[case::direct_macvtap(
    "<interface type='direct'><source dev='eth0' mode='bridge'/></interface>",
    "<domain/devices/interface type='direct'>"
)]
#[case::passt_log_file(
    "<interface type='user'><backend type='passt' logFile='/etc/cron.d/x'/></interface>",
    "attribute `logFile`"
)]
#[case::serial_to_a_file(
    "<serial type='file'><source path='/etc/passwd'/></serial>",
    "<domain/devices/serial type='file'>"
)]
#[case::serial_to_tcp(
    "<serial type='tcp'><source mode='bind' host='0.0.0.0' service='23'/></serial>",
    "type='tcp'"
)]
#[case::channel_socket_elsewhere(
    "<channel type='unix'><source mode='bind' path='/root/.ssh/x'/><target type='virtio' name='x'/></channel>",
    "<channel><source> names a socket path on the hypervisor"
)]
#[case::channel_socket_in_libvirts_directory(
    "<channel type='unix'><source mode='bind' path='/var/lib/libvirt/qemu/domain-1-victim/monitor.sock'/><target type='virtio' name='org.qemu.guest_agent.0'/></channel>",
    "leave <source> out"
)]
#[case::channel_target_name_dot_dot(
    "<channel type='unix'><target type='virtio' name='../../../../etc/x'/></channel>",
    "<channel><target type='virtio' name='../../../../etc/x'> is not allowed (allowed names: org.qemu.guest_agent.0)"
)]
#[case::channel_another_name(
    "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.1'/></channel>",
    "allowed names: org.qemu.guest_agent.0"
)]
#[case::channel_not_virtio(
    "<channel type='unix'><target type='guestfwd' name='org.qemu.guest_agent.0'/></channel>",
    "is not allowed"
)]
#[case::channel_without_target("<channel type='unix'/>", "is not allowed")]
#[case::channel_two_targets(
    "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/><target type='virtio' name='x'/></channel>",
    "<target> is given twice"
)]
#[case::mac_of_the_plugins_choice(
    "<interface type='network'><source network='pxnet'/><mac address='52:54:00:12:34:56'/></interface>",
    "remove <mac>"
)]
#[case::port_forward_on_every_address(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp'><range start='13128' to='3128'/></portForward></interface>",
    "<portForward address=''> is not the grant's publishAddress 127.0.0.1"
)]
#[case::port_forward_on_0_0_0_0(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='0.0.0.0'><range start='13128' to='3128'/></portForward></interface>",
    "is not the grant's publishAddress"
)]
#[case::port_forward_on_another_spelling(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.1'><range start='13128' to='3128'/></portForward></interface>",
    "is not the grant's publishAddress"
)]
#[case::port_forward_of_the_hypervisors_ssh_port(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'><range start='22' to='22'/></portForward></interface>",
    "<portForward><range start='22'> is outside the grant's portRange 13100-13199"
)]
#[case::port_forward_a_range_past_the_grant(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'><range start='13190' end='13300'/></portForward></interface>",
    "end='13300'> is outside the grant's portRange"
)]
#[case::port_forward_a_range_backwards(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'><range start='13190' end='13100'/></portForward></interface>",
    "is outside the grant's portRange"
)]
#[case::port_forward_without_a_range(
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'/></interface>",
    "needs a <range"
)]
#[case::rng_split_by_a_comment(
    "<rng model='virtio'><backend model='random'>/dev/<!---->sda</backend></rng>",
    "`/dev/sda`"
)]
#[case::rng_from_a_file(
    "<rng model='virtio'><backend model='random'>/etc/shadow</backend></rng>",
    "<rng><backend> `/etc/shadow`"
)]
#[case::rng_egd(
    "<rng model='virtio'><backend model='egd' type='tcp'/></rng>",
    "model='egd'"
)]
#[case::graphics(
    "<graphics type='vnc' listen='0.0.0.0'/>",
    "<domain/devices/graphics> is not allowed"
)]
#[case::foreign_element_in_devices("<x:thing xmlns:x='urn:x'/>", "of namespace urn:x")]
#[case::foreign_attribute(
    "<memballoon model='none' xmlns:x='urn:x' x:a='1'/>",
    "attribute `a` of namespace urn:x"
)]
fn escapes_through_devices_are_refused(#[case] devices: &str, #[case] says: &str) {
    let err = check_domain(&domain("", devices), &policy(), &mark()).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[rstest]
#[case::kernel_of_another_owner(
    "<kernel>/var/lib/libvirt/images/vmlinuz</kernel>",
    "<kernel> `/var/lib/libvirt/images/vmlinuz` is not a volume of this provider instance"
)]
#[case::kernel_outside_the_pools(
    "<kernel>/boot/vmlinuz</kernel>",
    "<kernel> `/boot/vmlinuz` is not a volume of this provider instance in a granted pool (default)"
)]
#[case::initrd_outside_the_pools(
    "<kernel>/var/lib/libvirt/images/kvm-a.0123456789ab.k</kernel><initrd>/etc/shadow</initrd>",
    "<initrd> `/etc/shadow`"
)]
#[case::loader(
    "<loader readonly='yes' type='pflash'>/etc/shadow</loader>",
    "<loader> and <nvram> cannot be set"
)]
#[case::nvram("<nvram>/etc/shadow</nvram>", "<loader> and <nvram>")]
fn escapes_through_boot_files_are_refused(#[case] os: &str, #[case] says: &str) {
    let err = check_domain(&domain(os, NETWORK), &policy(), &mark()).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[rstest]
#[case::qemu_commandline(
    "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'><name>a</name><qemu:commandline><qemu:arg value='-x'/></qemu:commandline></domain>",
    "<commandline> of namespace http://libvirt.org/schemas/domain/qemu/1.0"
)]
#[case::forged_mark(
    "<domain type='kvm'><name>a</name><metadata><x:owner xmlns:x='https://proxy-operator.dev/xmlns/host/1' operator='op' provider='victim'/></metadata></domain>",
    "may not carry the host's namespace"
)]
#[case::forged_mark_nested(
    "<domain type='kvm'><name>a</name><metadata><y:a xmlns:y='urn:y'><x:owner xmlns:x='https://proxy-operator.dev/xmlns/host/1'/></y:a></metadata></domain>",
    "may not carry the host's namespace"
)]
#[case::uuid(
    "<domain type='kvm'><name>a</name><uuid>00000000-0000-0000-0000-000000000001</uuid></domain>",
    "remove <uuid>"
)]
#[case::xen("<domain type='xen'><name>a</name></domain>", "<domain type='xen'>")]
#[case::no_name("<domain type='kvm'></domain>", "<name> is missing")]
#[case::two_names(
    "<domain type='kvm'><name>a</name><name>b</name></domain>",
    "<name> is given twice"
)]
#[case::two_metadata(
    "<domain type='kvm'><name>a</name><metadata/><metadata/></domain>",
    "<metadata> is given twice"
)]
#[case::not_a_domain("<network><name>a</name></network>", "root element must be <domain>")]
#[case::dtd(
    "<!DOCTYPE domain [<!ENTITY p '/etc/shadow'>]><domain type='kvm'><name>a</name></domain>",
    "does not parse"
)]
#[case::broken("<domain", "does not parse")]
#[case::seclabel(
    "<domain type='kvm'><name>a</name><seclabel type='none'/></domain>",
    "<domain/seclabel> is not allowed"
)]
#[case::cpu_numa_tuning(
    "<domain type='kvm'><name>a</name><numatune><memory nodeset='0'/></numatune></domain>",
    "<domain/numatune>"
)]
fn escapes_through_the_document_are_refused(#[case] xml: &str, #[case] says: &str) {
    let err = check_domain(xml, &policy(), &mark()).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[rstest]
#[case::memory_512_gib(
    "<memory unit='GiB'>512</memory>",
    "<memory unit='GiB'>512</memory> is more than this hypervisor's grant allows (4096 MiB)"
)]
#[case::memory_in_kib_by_default("<memory>4194305</memory>", "limits.memoryMib")]
#[case::memory_in_bytes("<memory unit='b'>4294967297</memory>", "is more than")]
#[case::memory_in_bytes_spelled_out("<memory unit='bytes'>4294967297</memory>", "is more than")]
#[case::memory_in_k("<memory unit='k'>4194305</memory>", "is more than")]
#[case::memory_in_kb("<memory unit='KB'>4294968</memory>", "is more than")]
#[case::memory_in_m("<memory unit='M'>4097</memory>", "is more than")]
#[case::memory_in_mb("<memory unit='MB'>4295</memory>", "is more than")]
#[case::memory_in_g("<memory unit='G'>5</memory>", "is more than")]
#[case::memory_in_gb("<memory unit='GB'>5</memory>", "is more than")]
#[case::memory_in_tib("<memory unit='TiB'>1</memory>", "unit='TiB'> is not allowed")]
#[case::memory_in_lowercase("<memory unit='gib'>1</memory>", "unit='gib'> is not allowed")]
#[case::memory_overflowing("<memory unit='GiB'>18446744073709551615</memory>", "is not a size")]
#[case::memory_split_by_a_comment(
    "<memory unit='MiB'>5<!---->12000</memory>",
    "<memory unit='MiB'>512000</memory> is more than"
)]
#[case::memory_signed("<memory unit='MiB'>+512</memory>", "is not a size")]
#[case::current_memory(
    "<currentMemory unit='GiB'>512</currentMemory>",
    "<currentMemory unit='GiB'>512</currentMemory> is more than"
)]
#[case::vcpus(
    "<vcpu>64</vcpu>",
    "<vcpu> 64 is more than this hypervisor's grant allows (4)"
)]
#[case::vcpus_current("<vcpu current='64'>4</vcpu>", "<vcpu current> 64 is more than")]
#[case::tb_cache_512_gib(
    "<features><tcg><tb-cache unit='GiB'>512</tb-cache></tcg></features>",
    "<tb-cache unit='GiB'>512</tb-cache> is more than this hypervisor's grant allows (256 MiB)"
)]
#[case::tb_cache_in_kib(
    "<features><tcg><tb-cache>262145</tb-cache></tcg></features>",
    "limits.tbCacheMib"
)]
fn bounds_are_the_grants(#[case] element: &str, #[case] says: &str) {
    let xml = format!(
        "<domain type='kvm'><name>a</name>{element}<features><tcg><tb-cache unit='MiB'>128</tb-cache></tcg></features></domain>"
    );
    let err = check_domain(&xml, &policy(), &mark()).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[test]
fn bounds_at_the_limits_pass_and_a_qemu_domain_needs_a_tb_cache() {
    for element in [
        "<memory unit='GiB'>4</memory><currentMemory unit='b'>4294967296</currentMemory>",
        "<memory>4194304</memory><vcpu current='1'>4</vcpu>",
        "<features><tcg><tb-cache unit='MiB'>256</tb-cache></tcg></features>",
    ] {
        let xml = format!("<domain type='kvm'><name>a</name>{element}</domain>");
        check_domain(&xml, &policy(), &mark()).unwrap();
    }
    let limits = DomainLimits {
        memory_mib: 1 << 20,
        vcpus: 64,
        tb_cache_mib: 1024,
    };
    let big =
        "<domain type='kvm'><name>a</name><memory unit='GiB'>512</memory><vcpu>64</vcpu></domain>";
    check_domain(big, &DomainPolicy { limits, ..policy() }, &mark()).unwrap();
    let err = check_domain(
        "<domain type='qemu'><name>a</name></domain>",
        &policy(),
        &mark(),
    )
    .unwrap_err();
    assert!(err.contains("needs <features><tcg><tb-cache"), "{err}");
}

#[rstest]
#[case::port_forward_not_granted(
    DomainPolicy { publish: None, ..policy() },
    "<interface type='user'><backend type='passt'/><portForward proto='tcp' address='127.0.0.1'><range start='13128' to='3128'/></portForward></interface>",
    "set grants.libvirt.hosts[].publishAddress and portRange"
)]
#[case::user_mode_not_granted(
    DomainPolicy { user_networking: false, ..policy() },
    "<interface type='user'><backend type='passt'/></interface>",
    "set grants.libvirt.hosts[].userNetworking: true"
)]
#[case::nothing_granted(
    DomainPolicy::default(),
    NETWORK,
    "not a volume of this provider instance in a granted pool (none)"
)]
fn the_grant_decides(#[case] policy: DomainPolicy, #[case] devices: &str, #[case] says: &str) {
    let err = check_domain(&domain("", devices), &policy, &mark()).unwrap_err();
    assert!(err.contains(says), "{err}");
}

fn volume(extra: &str) -> String {
    format!(
        "<volume><name>px-1-root.qcow2</name><capacity unit='bytes'>1024</capacity>\
         <target><format type='qcow2'/></target>{extra}</volume>"
    )
}

#[rstest]
#[case::plain("")]
#[case::overlay(
    "<backingStore><path>/var/lib/libvirt/images/kvm-a.0123456789ab.base-a.qcow2</path><format type='qcow2'/></backingStore>"
)]
fn volumes_a_proxy_needs_pass(#[case] extra: &str) {
    let checked = check_volume(&volume(extra), "default", Some(POOL), PFX).unwrap();
    assert_eq!(checked.real_name, format!("{PFX}px-1-root.qcow2"));
    // The name libvirt gets is the prefixed one; the rest is as the plugin wrote it.
    assert_eq!(
        checked.xml,
        volume(extra).replace(
            "<name>px-1-root.qcow2",
            &format!("<name>{PFX}px-1-root.qcow2")
        )
    );
}

#[test]
fn a_name_with_references_is_replaced_whole() {
    let checked = check_volume(
        "<volume><name>a&amp;b</name><capacity>1</capacity></volume>",
        "default",
        Some(POOL),
        PFX,
    )
    .unwrap();
    assert_eq!(checked.real_name, format!("{PFX}a&b"));
    assert!(
        checked.xml.contains(&format!("<name>{PFX}a&amp;b</name>")),
        "{}",
        checked.xml
    );
    // (CDATA is one text node, replaced whole like any other.)
    for bad in [
        "<name><!--x-->a</name>",
        "<name>a<!--x--></name>",
        "<name></name>",
    ] {
        let xml = format!("<volume>{bad}<capacity>1</capacity></volume>");
        assert!(
            check_volume(&xml, "default", Some(POOL), PFX).is_err(),
            "{bad}"
        );
    }
}

#[rstest]
#[case::backing_store_outside_the_pool(
    "<backingStore><path>/etc/shadow</path><format type='raw'/></backingStore>",
    "`/etc/shadow` is not a volume of this provider instance in pool default"
)]
#[case::backing_store_of_another_owner(
    "<backingStore><path>/var/lib/libvirt/images/victim-root.qcow2</path></backingStore>",
    "is not a volume of this provider instance in pool default"
)]
#[case::backing_store_of_a_device(
    "<backingStore><path>/dev/sda</path></backingStore>",
    "is not a volume of this provider instance in pool default"
)]
#[case::backing_store_dot_dot(
    "<backingStore><path>/var/lib/libvirt/images/../x</path></backingStore>",
    "is not a volume of this provider instance in pool default"
)]
#[case::backing_store_without_a_path(
    "<backingStore><format type='raw'/></backingStore>",
    "is not a volume of this provider instance in pool default"
)]
#[case::permissions(
    "<permissions><owner>0</owner><mode>0777</mode></permissions>",
    "<volume/permissions> is not allowed"
)]
#[case::foreign("<x:y xmlns:x='urn:x'/>", "of namespace urn:x")]
fn volume_escapes_are_refused(#[case] extra: &str, #[case] says: &str) {
    let err = check_volume(&volume(extra), "default", Some(POOL), PFX).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[rstest]
#[case::target_path(
    "<volume><name>a</name><capacity>1</capacity><target><path>/etc/shadow</path></target></volume>",
    "<volume/target/path> is not allowed"
)]
#[case::slash_in_the_name(
    "<volume><name>../a</name><capacity>1</capacity></volume>",
    "is not a volume name"
)]
#[case::block_volume(
    "<volume type='block'><name>a</name><capacity>1</capacity></volume>",
    "<volume type='block'>"
)]
#[case::not_a_volume("<pool><name>a</name></pool>", "root element must be <volume>")]
fn volume_documents_are_checked(#[case] xml: &str, #[case] says: &str) {
    let err = check_volume(xml, "default", Some(POOL), PFX).unwrap_err();
    assert!(err.contains(says), "{err}");
}

#[test]
fn a_pool_without_a_directory_takes_no_backing_store() {
    let xml = volume(&format!(
        "<backingStore><path>/var/lib/libvirt/images/{PFX}a</path></backingStore>"
    ));
    assert!(check_volume(&xml, "rbd", None, PFX).is_err());
    check_volume(&volume(""), "rbd", None, PFX).unwrap();
}

#[test]
fn the_disks_of_a_defined_domain_are_read_from_libvirts_xml() {
    let xml = format!(
        "<domain type='qemu'><name>px-1</name><devices>\
         <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{POOL}/{PFX}r'/>\
         <backingStore type='file'><format type='raw'/><source file='{POOL}/{PFX}b'/></backingStore>\
         <target dev='vda' bus='virtio'/><address type='pci' bus='0x04'/></disk>\
         <disk type='file' device='cdrom'><target dev='sda'/></disk>\
         <controller type='usb' model='qemu-xhci'/></devices></domain>"
    );
    let disks = disks_of(&xml, &policy()).unwrap();
    assert_eq!(
        disks,
        [Disk {
            path: format!("{POOL}/{PFX}r"),
            pool: "default".into(),
            format: "qcow2".into()
        }]
    );
    let other = xml.replace(&format!("{POOL}/{PFX}r"), "/etc/shadow");
    assert!(disks_of(&other, &policy()).is_err());
}
