//! A Proxy of the kvm provider through the real controller, the real kvm component and the real
//! sshd + libvirtd: it waits, with a status that says why, while the `kvm-ssh` Secret is missing;
//! creating the Secret makes its VM; deleting the Proxy removes the VM. While the SSH connection
//! drops in the middle of its base image import, its conditions say the import was interrupted
//! and is retried; with the network back, it goes on to its VM.

use std::sync::Arc;

use harness::{FileServer, Libvirtd, Sshd};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};
use proxy_operator::api::Proxy;
use proxy_operator::lifecycle::controller::{self, Context, instance_name};
use proxy_operator::provider::capabilities::libvirt::tunnel::SshMaterial;
use proxy_operator::provider::capabilities::libvirt::{LibvirtHub, MaterialSource};
use proxy_operator::provider::config::ProvidersConfig;
use proxy_operator::provider::plugins::EngineOptions;
use proxy_operator::provider::registry::load_providers;
use sha2::{Digest, Sha256};

use super::{control_plane, wait_for, wait_for_within};
use crate::common::relay::Relay;
use crate::common::{engine_with, noise, plugins_dir, ssh_material, ssh_secret, test_options};

/// A providers config with kvm provider instance `kvm-home`: hypervisor `hv1` reached over SSH on
/// loopback `ssh_port`, its base image `image_path` of `files`.
fn providers_yaml(
    libvirtd: &Libvirtd,
    files: &FileServer,
    image_path: &str,
    image_sha256: &str,
    ssh_port: u16,
    user: &str,
) -> String {
    format!(
        r#"providers:
- name: kvm-home
  type: kvm
  config:
    domainType: qemu
    hosts: [{{name: hv1, zone: zone-a, pool: {pool}, network: pxnet}}]
    images:
      tiny: {{url: "{url}", sha256: "{image_sha256}", firmware: bios, format: raw}}
    defaultImage: tiny
    defaults: {{memoryMib: 128, vcpus: 1, diskGib: 1}}
  grants:
    http: {{allow: ["http://{addr}"]}}
    libvirt:
      hosts: [{{name: hv1, address: 127.0.0.1, port: {ssh_port}, user: {user}, socket: "{socket}", pools: ["{pool}"], networks: [pxnet]}}]
"#,
        pool = libvirtd.pool_name(),
        url = files.url(image_path),
        addr = files.addr(),
        socket = libvirtd.socket().display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm_proxy_waits_for_its_ssh_secret_then_gets_a_vm_that_its_deletion_removes() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kvm").await.unwrap();
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    libvirtd.define_isolated_network("pxnet").await.unwrap();
    let image: Vec<u8> = (0..512 * 1024u32).map(|i| (i % 241) as u8).collect();
    files.serve("/tiny.raw", image.clone());

    let tunnels = tempfile::tempdir().unwrap();
    let engine = kvm_engine(&ns, tunnels.path()).await;
    let config = providers_yaml(
        &libvirtd,
        &files,
        "/tiny.raw",
        &hex::encode(Sha256::digest(&image)),
        sshd.port(),
        sshd.user(),
    );
    let providers = load_providers(
        &engine,
        &plugins_dir(),
        &ProvidersConfig::parse(&config).unwrap(),
        std::path::Path::new("test"),
    )
    .await
    .unwrap();
    let ctx = Arc::new(Context::new(
        ns.client(),
        providers,
        "test-operator",
        Default::default(),
    ));
    let namespace = ns.name().to_string();
    let controller = tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await });

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: vm1\n  namespace: {}\nspec:\n  provider: kvm-home\n  placement: {{zone: zone-a}}\n  cloudInit: \"#cloud-config\\n\"\n",
            ns.name()
        )),
    )
    .await
    .unwrap();
    let api: Api<Proxy> = ns.api();

    // No Secret: the Proxy waits, and its status says which Secret to create.
    let waiting = wait_for(&api, "vm1", "a status naming the missing Secret", |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.last_error.as_deref())
            .is_some_and(|e| e.contains("kvm-ssh") && e.contains("does not exist"))
    })
    .await
    .unwrap();
    assert_ne!(
        waiting.status.as_ref().unwrap().phase,
        Some(proxy_operator::api::Phase::Failed),
        "a missing Secret is not a permanent failure"
    );

    let secret = ssh_secret(&ssh_material(&sshd));
    ns.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .unwrap();

    // With the Secret, the next retry makes the VM.
    let uid = waiting.metadata.uid.unwrap();
    let domain = instance_name(&uid);
    let provisioned = wait_for(&api, "vm1", "a provider id", |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.provider_id.as_deref())
            .is_some()
    })
    .await
    .unwrap();
    assert_eq!(
        provisioned.status.unwrap().provider_id.unwrap(),
        format!("hv1/{domain}")
    );
    let state = libvirtd.virsh_run(&["domstate", &domain]).await.unwrap();
    assert_eq!(state.trim(), "running");
    let xml = libvirtd.virsh_run(&["dumpxml", &domain]).await.unwrap();
    assert!(
        xml.contains(&uid),
        "the domain carries the Proxy's UID: {xml}"
    );

    api.delete("vm1", &DeleteParams::default()).await.unwrap();
    wait_for(&api, "vm1", "gone", |p| p.is_none()).await;
    let domains = libvirtd
        .virsh_run(&["list", "--all", "--name"])
        .await
        .unwrap();
    assert!(!domains.contains(&domain), "{domains}");
    controller.abort();
}

/// The SSH connection to the hypervisor drops in the middle of the base image import, at every
/// try (a relay between the operator and sshd cuts each connection after 4 MiB of the 16 MiB
/// image): the Proxy is not Failed, its Provisioned and Ready conditions are False with reason
/// Retrying and a message saying that the image import was interrupted by the dropped SSH
/// connection and is retried, and no base volume exists. With the relay passing again, the next
/// retry imports the whole image and the Proxy gets its VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvm_proxy_whose_image_import_is_cut_says_so_and_goes_on_once_ssh_is_back() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-kvm-cut").await.unwrap();
    let (libvirtd, sshd, files) =
        tokio::join!(Libvirtd::start(), Sshd::start(), FileServer::start());
    let (libvirtd, sshd, files) = (libvirtd.unwrap(), sshd.unwrap(), files.unwrap());
    libvirtd.define_isolated_network("pxnet").await.unwrap();
    let relay = Relay::start(sshd.addr()).await;
    const IMAGE: usize = 16 << 20;
    let image = noise(IMAGE);
    let sha = hex::encode(Sha256::digest(&image));
    files.serve("/big.raw", image);

    let secret = ssh_secret(&SshMaterial {
        known_hosts: format!("[127.0.0.1]:{} {}\n", relay.port(), sshd.host_pubkey()),
        ..ssh_material(&sshd)
    });
    ns.api::<Secret>()
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let tunnels = tempfile::tempdir().unwrap();
    let engine = kvm_engine(&ns, tunnels.path()).await;
    let config = providers_yaml(
        &libvirtd,
        &files,
        "/big.raw",
        &sha,
        relay.port(),
        sshd.user(),
    );
    let providers = load_providers(
        &engine,
        &plugins_dir(),
        &ProvidersConfig::parse(&config).unwrap(),
        std::path::Path::new("test"),
    )
    .await
    .unwrap();
    let ctx = Arc::new(Context::new(
        ns.client(),
        providers,
        "test-operator",
        Default::default(),
    ));
    let namespace = ns.name().to_string();
    let controller = tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await });

    // Every SSH connection is cut after 4 MiB towards sshd: far less than the image, far more
    // than the calls before the import.
    relay.cut_after(4 << 20);
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: vm-cut\n  namespace: {}\nspec:\n  provider: kvm-home\n  placement: {{zone: zone-a}}\n  cloudInit: \"#cloud-config\\n\"\n",
            ns.name()
        )),
    )
    .await
    .unwrap();
    let api: Api<Proxy> = ns.api();
    let condition = |p: &Proxy, type_: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned())
    };
    let interrupted = wait_for(
        &api,
        "vm-cut",
        "conditions saying the import was interrupted",
        |p| {
            p.and_then(|p| condition(p, "Provisioned"))
                .is_some_and(|c| c.message.contains("was interrupted"))
        },
    )
    .await
    .unwrap();
    assert!(relay.cuts() >= 1, "the relay cut a connection");
    eprintln!(
        "Provisioned: {}",
        condition(&interrupted, "Provisioned").unwrap().message
    );
    for type_ in ["Provisioned", "Ready"] {
        let c = condition(&interrupted, type_).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Retrying"),
            "{type_}: {c:?}"
        );
        for needed in [
            "image import",
            "was interrupted",
            "SSH connection",
            "dropped",
            "tries again",
            "retrying",
        ] {
            assert!(
                c.message.contains(needed),
                "{type_}: `{needed}` missing from: {}",
                c.message
            );
        }
    }
    let status = interrupted.status.as_ref().unwrap();
    assert_ne!(status.phase, Some(proxy_operator::api::Phase::Failed));
    assert_eq!(status.provider_id, None, "no VM without its base image");
    let volumes = libvirtd
        .virsh_run(&["vol-list", libvirtd.pool_name()])
        .await
        .unwrap();
    let base_name = |line: &str| {
        line.split_whitespace()
            .next()
            .is_some_and(|name| name.contains(".base-") && !name.ends_with(".partial"))
    };
    assert!(
        !volumes.lines().any(base_name),
        "a base volume after a cut import: {volumes}"
    );

    // The network is back: the next retry imports the image and makes the VM.
    relay.pass();
    let restored = std::time::Instant::now();
    // The whole 16 MiB image goes over SSH again before the VM is defined: on a runner busy with
    // other suites that once took longer than a minute.
    let within = std::time::Duration::from_secs(180);
    let provisioned = wait_for_within(&api, "vm-cut", "a provider id", within, |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.provider_id.as_deref())
            .is_some()
    })
    .await
    .unwrap();
    eprintln!(
        "cuts: {}; VM defined {:?} after the relay passed again",
        relay.cuts(),
        restored.elapsed()
    );
    let domain = instance_name(provisioned.metadata.uid.as_deref().unwrap());
    let state = libvirtd.virsh_run(&["domstate", &domain]).await.unwrap();
    assert_eq!(state.trim(), "running");
    let volumes = libvirtd
        .virsh_run(&["vol-list", libvirtd.pool_name()])
        .await
        .unwrap();
    let base = volumes
        .lines()
        .find(|line| base_name(line))
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no base volume: {volumes}"));
    let written = std::fs::read(base).unwrap();
    assert_eq!(
        hex::encode(Sha256::digest(&written)),
        sha,
        "the base is the whole image"
    );
    assert!(
        !volumes.contains(".partial"),
        "no staging volume left: {volumes}"
    );

    api.delete("vm-cut", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&api, "vm-cut", "gone", |p| p.is_none()).await;
    controller.abort();
}

/// The plugin engine as `proxy-operator run` makes it for kvm: the SSH material from Secrets in
/// the operator's namespace, tunnel sockets under `tunnels`.
async fn kvm_engine(
    ns: &harness::TestNamespace,
    tunnels: &std::path::Path,
) -> std::sync::Arc<proxy_operator::provider::plugins::PluginEngine> {
    let (engine, _) = engine_with(EngineOptions {
        call_timeout: std::time::Duration::from_secs(60),
        libvirt: Some(LibvirtHub::new(
            MaterialSource::Secrets {
                client: ns.client(),
                namespace: ns.name().to_string(),
            },
            tunnels.to_path_buf(),
        )),
        ..test_options()
    })
    .await;
    engine
}
