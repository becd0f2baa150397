//! A Proxy of the kvm provider through the real controller, the real kvm component and the real
//! sshd + libvirtd: it waits, with a status that says why, while the `kvm-ssh` Secret is missing;
//! creating the Secret makes its VM; deleting the Proxy removes the VM.

use std::sync::Arc;

use harness::{FileServer, Libvirtd, Sshd};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};
use proxy_operator::api::Proxy;
use proxy_operator::capabilities::libvirt::{LibvirtHub, MaterialSource};
use proxy_operator::config::ProvidersConfig;
use proxy_operator::controller::{self, Context, instance_name};
use proxy_operator::plugins::EngineOptions;
use proxy_operator::registry::load_providers;
use sha2::{Digest, Sha256};

use super::{control_plane, wait_for};
use crate::common::{engine_with, plugins_dir, ssh_material, ssh_secret, test_options};

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
    let (engine, _) = engine_with(EngineOptions {
        call_timeout: std::time::Duration::from_secs(60),
        // As `proxy-operator run` does: the SSH material from Secrets in the operator's namespace.
        libvirt: Some(LibvirtHub::new(
            MaterialSource::Secrets {
                client: ns.client(),
                namespace: ns.name().to_string(),
            },
            tunnels.path().to_path_buf(),
        )),
        ..test_options()
    })
    .await;
    let config = format!(
        r#"providers:
- name: kvm-home
  type: kvm
  config:
    domainType: qemu
    hosts: [{{name: hv1, zone: zone-a, pool: {pool}, network: pxnet}}]
    images:
      tiny: {{url: "{url}", sha256: "{sha}", firmware: bios, format: raw}}
    defaultImage: tiny
    defaults: {{memoryMib: 128, vcpus: 1, diskGib: 1}}
  grants:
    http: {{allow: ["http://{addr}"]}}
    libvirt:
      hosts: [{{name: hv1, address: 127.0.0.1, port: {port}, user: {user}, socket: "{socket}", pools: ["{pool}"], networks: [pxnet]}}]
"#,
        pool = libvirtd.pool_name(),
        url = files.url("/tiny.raw"),
        sha = hex::encode(Sha256::digest(&image)),
        addr = files.addr(),
        port = sshd.port(),
        user = sshd.user(),
        socket = libvirtd.socket().display(),
    );
    let providers = load_providers(
        &engine,
        &plugins_dir(),
        &ProvidersConfig::parse(&config).unwrap(),
        std::path::Path::new("test"),
    )
    .await
    .unwrap();
    let ctx = Arc::new(Context::new(ns.client(), providers, "test-operator"));
    let namespace = ns.name().to_string();
    let controller = tokio::spawn(async move { controller::run(ctx, Some(&namespace)).await });

    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\nmetadata:\n  name: vm1\n  namespace: {}\nspec:\n  provider: kvm-home\n  placement: {{zone: zone-a}}\n  cloudInit: \"#cloud-config\\n\"\n",
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
