//! `kubectl px why`: each way a Proxy is stuck, provoked for real (a provider nobody configured,
//! a plugin that refuses its config, a provider out of quota, an instance whose guest agent
//! reports no address, squid refusing the health probe), explained by its first failing step.

use std::collections::BTreeMap;

use harness::Squid;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};

use super::{Ran, World, proxy_yaml};
use crate::common::plugin_bytes;

/// squid as a provider configures it for CONNECT to 443 only: the health probe's CONNECT to the
/// loopback target's port is refused with 403, as a real fleet's is when `connectPorts` lacks
/// the `--health-target` port.
const ONLY_443: &str = "http_port 3128
cache_log /var/log/squid/cache.log
acl loopback src 127.0.0.0/8
acl SSL_ports port 443
acl CONNECT method CONNECT
http_access deny CONNECT !SSL_ports
http_access allow loopback
http_access deny all
";

/// `why NAME` until it reads every one of `lines` (the cause is reached through the steps
/// before it, so this waits for the operator to get there), then its exit code, its JSON
/// form's failing step, and no colour into a pipe.
async fn explained(world: &World, name: &str, step: &str, lines: &[&str]) -> Ran {
    let px = world.px();
    let ran = px
        .until(&["why", name], &format!("{name}: {lines:?}"), |ran| {
            ran.code == 3
                && lines
                    .iter()
                    .all(|line| ran.stdout.lines().any(|l| l.contains(line)))
        })
        .await;
    assert!(ran.stderr.is_empty(), "{ran:#?}");
    assert!(
        !ran.stdout.contains('\x1b'),
        "no colour into a pipe: {ran:#?}"
    );
    let ns = world.ns.name();
    assert!(
        ran.stdout
            .starts_with(&format!("{ns}/{name} is not Ready (phase ")),
        "{}",
        ran.stdout
    );
    let json = px.run(&["why", name, "-o", "json"]).await;
    assert_eq!(json.code, 3, "{json:#?}");
    assert_eq!(json.json()["cause"]["step"], step, "{json:#?}");
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_names_the_first_failing_step_of_each_way_a_proxy_is_stuck() {
    let world = World::start("px-why").await;
    let ns = world.ns.name().to_string();
    let full = crate::common::InstanceStore::start().await;
    *full.state.refuse_creates.lock().unwrap() = Some((429, "the store is full".into()));
    let booting = crate::common::InstanceStore::start().await;
    *booting.state.new_instances.lock().unwrap() = Some(serde_json::json!({
        "state": "provisioning",
        "address": null,
        "message": "running; waiting for the guest agent to report an IPv4 address",
    }));
    let refusing = Squid::start_from_provider_conf(ONLY_443, "").await.unwrap();
    // `picky`'s plugin (type `late`) is in neither the plugins directory nor the ConfigMap yet.
    let providers = format!(
        "{}{}{}- {{name: picky, type: late, config: {{endpoint: \"gopher://x\"}}}}\n",
        world.store.provider_entry("store"),
        full.provider_entry("full"),
        booting.provider_entry("booting"),
    );
    let _operator = world
        .operator(
            &providers,
            &[
                "--plugins-configmap",
                "plugins",
                "--provider-check-interval",
                "2s",
            ],
        )
        .await;
    for (name, provider, port) in [
        ("fine", "store", world.squid.port()),
        ("lost", "nowhere", 3128),
        ("picky-1", "picky", 3128),
        ("full-1", "full", 3128),
        ("booting-1", "booting", 3128),
        ("refused-1", "store", refusing.port()),
    ] {
        world.apply(&proxy_yaml(&ns, name, provider, port)).await;
    }

    // Ready: exit 0, and whether crawlers can lease it.
    let px = world.px();
    let ready = px
        .until(&["why", "fine"], "fine Ready", |ran| ran.code == 0)
        .await;
    assert_eq!(
        ready.stdout.lines().next(),
        Some(format!("{ns}/fine is Ready; it is free: crawlers can lease it.").as_str()),
        "{ready:#?}"
    );
    assert!(ready.stdout.contains("✓ probes"), "{}", ready.stdout);

    explained(
        &world,
        "lost",
        "provider",
        &[
            "✗ provider",
            "no provider instance `nowhere` in the providers config (configured: booting, full, picky, store)",
            "Why:  its provider is not in the operator's providers config",
            "Do:   Add a provider instance named `nowhere` to the providers config",
            "See:  docs/troubleshooting.md#a-proxy-stays-pending-with-reason-unknownprovider",
            "Warning UnknownProvider",
            "· instance",
        ],
    )
    .await;

    // The plugin arrives, and refuses the entry's config.
    explained(
        &world,
        "picky-1",
        "plugin",
        &["✗ plugin", "is not loaded: "],
    )
    .await;
    let maps: Api<ConfigMap> = world.ns.api();
    let upload = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("plugins".into()),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(
            "late.wasm".to_string(),
            ByteString(plugin_bytes("test")),
        )])),
        ..Default::default()
    };
    maps.patch(
        "plugins",
        &PatchParams::apply("test").force(),
        &Patch::Apply(&upload),
    )
    .await
    .unwrap();
    explained(
        &world,
        "picky-1",
        "plugin",
        &[
            "✗ plugin",
            "the `late` plugin rejected its config: config.endpoint: `gopher://x` must start with",
            "Why:  the provider's plugin refused the provider instance's config",
            "Do:   Fix `config` of provider instance `picky` in the providers config",
            "See:  docs/troubleshooting.md#a-proxy-stays-pending-with-reason-pluginnotloaded",
        ],
    )
    .await;

    explained(
        &world,
        "full-1",
        "instance",
        &[
            "✓ plugin          plugin test 0.1.0 (sha256 ",
            "✗ instance        Create at provider full: quota: HTTP 429: {\"error\":\"the store is full\"}; retrying",
            "Why:  the provider is out of capacity (a quota)",
            "See:  docs/troubleshooting.md#a-proxy-stays-pending-with-reason-quota-or-retrying",
            "Warning Quota",
        ],
    )
    .await;

    explained(
        &world,
        "booting-1",
        "address",
        &[
            "✓ instance",
            "✗ address         instance ",
            "is Provisioning, waiting for an address: running; waiting for the guest agent to report an IPv4 address",
            "Why:  the instance exists but has no address yet",
            "See:  docs/troubleshooting.md#a-kvm-proxy-stays-provisioning",
        ],
    )
    .await;

    explained(
        &world,
        "refused-1",
        "probes",
        &[
            "✓ address         running at 127.0.0.1:",
            "✗ probes",
            "the proxy answered CONNECT with HTTP 403",
            "Why:  squid refused the health probe (HTTP 403)",
            "Do:   Add the operator's address range to the provider's `allowFrom`",
            "See:  docs/troubleshooting.md#a-proxy-has-an-address-but-never-becomes-ready",
        ],
    )
    .await;

    // `status` of one of them says the same phase, and exits 3 as `why` does.
    let one = px.run(&["status", "proxy/full-1"]).await;
    assert_eq!(one.code, 3, "{one:#?}");
    assert!(
        one.stdout.contains("Phase:       Pending"),
        "{}",
        one.stdout
    );
    assert!(
        one.stdout
            .contains("Provisioned: False Quota: Create at provider full: quota"),
        "{}",
        one.stdout
    );
    let missing = px.run(&["why", "nobody"]).await;
    assert_eq!(missing.code, 1, "{missing:#?}");
    assert_eq!(
        missing.stderr,
        format!("error: no Proxy nobody in namespace {ns}\n")
    );
}
