//! The gcp provider component through the real runtime and the host's `http` capability against
//! a fake of Google's token endpoint and Compute Engine API (nothing real can run here; the fake
//! follows the documented shapes and checks the JWT signature and the bearer token). The host
//! mints the OAuth token from the service-account key; the plugin only makes REST calls.

use proxy_operator::api::{Phase, PlacementRecord, Proxy};
use proxy_operator::provider::plugins::ProviderInstance;
use proxy_operator::provider::plugins::types::{InstanceState, ProviderError};

use super::common::fake_gcp::{FakeGcp, PROJECT};
use super::common::own_network;
use super::common::{spec, test_options};
use super::{
    Operator, bound_provider, control_plane, phase, providers_with, proxy_yaml, refused, wait_for,
};

const ZONES: [&str; 2] = ["europe-west1-b", "europe-west1-c"];

/// The providers-config entry of a gcp provider instance against `fake`, its key in `key_file`.
fn entry(fake: &FakeGcp, key_file: &std::path::Path) -> serde_json::Value {
    entry_in(fake, key_file, &ZONES)
}

/// [`entry`] with `config.zones` = `zones`.
fn entry_in(fake: &FakeGcp, key_file: &std::path::Path, zones: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "config": {"project": PROJECT, "zones": zones, "apiBase": fake.url()},
        "grants": {"http": {
            "allow": [fake.url()],
            "credentials": [{
                "url": fake.url(),
                "header": "Authorization",
                "prefix": "Bearer ",
                "valueFrom": {"gcpServiceAccountKey": key_file},
            }],
        }},
    })
}

async fn gcp_provider(entry: &serde_json::Value) -> ProviderInstance {
    bound_provider(
        test_options(),
        "gcp",
        "gcp-eu",
        &entry["config"],
        entry["grants"].clone(),
    )
    .await
    .unwrap()
}

/// The fake's service-account key, written to a key file in `dir`.
fn key_file(fake: &FakeGcp, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("key.json");
    std::fs::write(&path, fake.key_file_json()).unwrap();
    path
}

/// The controller of `ns` with one gcp provider instance `gcp-eu` against `fake` (its key file
/// lives in the returned directory).
async fn gcp_operator(
    ns: &harness::TestNamespace,
    fake: &FakeGcp,
) -> (Operator, tempfile::TempDir) {
    gcp_operator_in(ns, fake, &ZONES).await
}

/// [`gcp_operator`] with `config.zones` = `zones`.
async fn gcp_operator_in(
    ns: &harness::TestNamespace,
    fake: &FakeGcp,
    zones: &[&str],
) -> (Operator, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut entry = entry_in(fake, &key_file(fake, &dir), zones);
    entry["name"] = "gcp-eu".into();
    entry["type"] = "gcp".into();
    let providers = providers_with(
        test_options(),
        &serde_json::json!({"providers": [entry]}).to_string(),
    )
    .await;
    (Operator::with_providers(ns.client(), ns, providers), dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_is_made_with_a_token_the_host_mints_and_found_listed_and_deleted() {
    let fake = FakeGcp::start(&ZONES).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = gcp_provider(&entry(&fake, &key_file(&fake, &dir))).await;

    let checked = provider.check().await.unwrap();
    assert_eq!(checked.len(), 2);
    assert!(checked.iter().all(|t| t.ok), "{checked:?}");

    let mut want = spec("px-gcp-one", serde_json::json!({}));
    want.zone = Some("europe-west1-c".into());
    let created = provider.create(want.clone()).await.unwrap();
    assert_eq!(created.provider_id, "europe-west1-c/px-gcp-one");
    assert_eq!(created.state, InstanceState::Provisioning);
    let vm = fake.with(|s| s.instances["europe-west1-c/px-gcp-one"].clone());
    assert_eq!(vm["labels"]["proxy-operator-managed"], "true");
    assert_eq!(
        vm["machineType"],
        "zones/europe-west1-c/machineTypes/e2-small"
    );
    let items = vm["metadata"]["items"].as_array().unwrap();
    let user_data = items.iter().find(|i| i["key"] == "user-data").unwrap();
    assert_eq!(
        user_data["value"], "#cloud-config\n",
        "cloud-init byte for byte"
    );
    // The managed squid rides in the startup script; real squid accepts its squid.conf.
    let script = items
        .iter()
        .find(|i| i["key"] == "startup-script")
        .and_then(|i| i["value"].as_str())
        .expect("the managed squid's startup script");
    squid_accepts_the_scripts_conf(script);

    // STAGING, then RUNNING with its external IP.
    let mut got = provider.get("europe-west1-c/px-gcp-one").await.unwrap();
    while got.state != InstanceState::Running {
        assert_eq!(got.state, InstanceState::Provisioning);
        got = provider.get("europe-west1-c/px-gcp-one").await.unwrap();
    }
    assert_eq!(got.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(got.owner.unwrap().uid, "uid-px-gcp-one");
    assert_eq!(got.created_at, Some(1_796_066_553));
    // Create again: the same VM, no second insert.
    let again = provider.create(want.clone()).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(fake.with(|s| s.instances.len()), 1);
    let listed: Vec<String> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.provider_id)
        .collect();
    assert_eq!(listed, ["europe-west1-c/px-gcp-one"]);

    // Quota, and a zone the provider does not have.
    fake.with(|s| s.quota_exceeded = true);
    let mut anywhere = spec("px-gcp-two", serde_json::json!({}));
    anywhere.zone = None;
    match refused(provider.create(anywhere).await) {
        ProviderError::Quota(m) => assert!(m.contains("quotaExceeded"), "{m}"),
        other => panic!("{other:?}"),
    }
    let mut elsewhere = spec("px-gcp-three", serde_json::json!({}));
    elsewhere.zone = Some("us-central1-a".into());
    match refused(provider.create(elsewhere).await) {
        ProviderError::Permanent(m) => {
            assert!(m.contains("not one of this provider's zones"), "{m}")
        }
        other => panic!("{other:?}"),
    }

    provider.delete("europe-west1-c/px-gcp-one").await.unwrap();
    assert!(fake.with(|s| s.instances.is_empty()));
    provider
        .delete("europe-west1-c/px-gcp-one")
        .await
        .expect("deleting again is fine");
    assert!(matches!(
        refused(provider.get("europe-west1-c/px-gcp-one").await),
        ProviderError::NotFound(_)
    ));

    // One token for all of it (cached by the host), on every request.
    fake.with(|s| {
        assert_eq!(s.token_requests, 1);
        assert!(
            s.authorizations.iter().all(|a| a == "Bearer ya29.fake-1"),
            "{:?}",
            s.authorizations
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_google_does_not_know_is_reported_and_no_request_goes_out_unsigned() {
    let fake = FakeGcp::start(&ZONES).await;
    let other = FakeGcp::start(&ZONES).await;
    let dir = tempfile::tempdir().unwrap();
    // A well-formed key of another account, pointing at this fake's token endpoint.
    let key_file = dir.path().join("key.json");
    let mut key: serde_json::Value = serde_json::from_str(&other.key_file_json()).unwrap();
    key["token_uri"] = format!("{}/token", fake.url()).into();
    std::fs::write(&key_file, key.to_string()).unwrap();
    let provider = gcp_provider(&entry(&fake, &key_file)).await;
    let checked = provider.check().await.unwrap();
    assert!(!checked[0].ok);
    assert!(
        checked[0].message.contains("refused the service account"),
        "{checked:?}"
    );
    assert!(
        !checked[0].message.contains("PRIVATE KEY"),
        "the key never appears in a message"
    );
    assert!(
        fake.with(|s| s.authorizations.is_empty()),
        "nothing reached the API without a token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_of_the_gcp_provider_becomes_ready_and_its_deletion_deletes_the_vm() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-gcp").await.unwrap();
    let fake = FakeGcp::start(&ZONES).await;
    let (_operator, _key_dir) = gcp_operator(&ns, &fake).await;

    let yaml =
        proxy_yaml(ns.name(), "vm-1", "gcp-eu", "").replace("zone: zone-a", "zone: europe-west1-b");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let ready = wait_for(&proxies, "vm-1", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    let status = ready.status.unwrap();
    assert_eq!(status.address.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.zone.as_deref(), Some("europe-west1-b"));
    let id = status.provider_id.unwrap();
    assert!(id.starts_with("europe-west1-b/"), "{id}");
    assert!(fake.with(|s| s.instances.contains_key(&id)));

    cp.kubectl_run(
        &["delete", "proxy", "vm-1", "-n", ns.name(), "--wait=true"],
        None,
    )
    .await
    .unwrap();
    assert!(
        fake.with(|s| s.instances.is_empty()),
        "the VM is deleted with its Proxy"
    );
}

/// A Proxy whose `providerID` was edited to point at somebody's own VM in the project: its
/// deletion deletes nothing (the provider checks that proxy-operator made the VM) and still
/// finishes, and an event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_id_patched_to_a_vm_the_operator_did_not_make_deletes_nothing() {
    use kube::api::{Patch, PatchParams};
    let cp = control_plane().await;
    let ns = cp.namespace("px-gcp-victim").await.unwrap();
    let fake = FakeGcp::start(&ZONES).await;
    let (_operator, _key_dir) = gcp_operator(&ns, &fake).await;
    // Somebody's own VM in the same project, made outside the operator.
    let victim = "europe-west1-b/victim";
    fake.with(|s| {
        s.instances.insert(
            victim.into(),
            serde_json::json!({"name": "victim", "status": "RUNNING", "labels": {"team": "web"}}),
        )
    });

    let yaml = proxy_yaml(ns.name(), "attacker", "gcp-eu", "")
        .replace("zone: zone-a", "zone: europe-west1-b");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    wait_for(&proxies, "attacker", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    let patch = serde_json::json!({ "status": { "providerID": victim } });
    proxies
        .patch_status("attacker", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&proxies, "attacker", "pointing at the victim", |p| {
        p.and_then(|p| p.status.as_ref()?.provider_id.clone())
            .as_deref()
            == Some(victim)
    })
    .await
    .unwrap();
    cp.kubectl_run(
        &[
            "delete",
            "proxy",
            "attacker",
            "-n",
            ns.name(),
            "--wait=true",
        ],
        None,
    )
    .await
    .unwrap();
    assert!(
        fake.with(|s| s.instances.contains_key(victim)),
        "the VM the operator did not make is still there"
    );
    let events = super::events_of(cp, &ns).await;
    let nothing = events
        .iter()
        .find(|e| e["reason"] == "NothingDeleted")
        .unwrap_or_else(|| panic!("a NothingDeleted event in {events:?}"));
    let note = nothing["note"].as_str().unwrap();
    assert!(
        note.contains("instance victim has no label proxy-operator-managed=true"),
        "{note}"
    );
}

/// A `quota` answer reaches the Proxy as a condition and an event, not only `lastError`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_answer_shows_in_the_conditions_and_an_event() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-gcp-quota").await.unwrap();
    let fake = FakeGcp::start(&ZONES).await;
    fake.with(|s| s.quota_exhausted = true);
    let (_operator, _key_dir) = gcp_operator(&ns, &fake).await;
    let yaml =
        proxy_yaml(ns.name(), "vm-q", "gcp-eu", "").replace("zone: zone-a", "zone: europe-west1-b");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let waiting = wait_for(&proxies, "vm-q", "the Quota condition", |p| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Provisioned" && c.reason == "Quota")
        })
    })
    .await
    .unwrap();
    let status = waiting.status.unwrap();
    let provisioned = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Provisioned")
        .unwrap();
    assert_eq!(provisioned.status, "False");
    assert!(
        provisioned.message.contains("quotaExceeded"),
        "{}",
        provisioned.message
    );
    let events = super::events_of(cp, &ns).await;
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Quota" && e["type"] == "Warning"),
        "a Quota event in {events:?}"
    );
}

/// An insert Google accepts and whose zone operation then fails (here: the image does not
/// exist) makes the Proxy `Failed` with the operation's error, after one insert, instead of an
/// insert every 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_whose_operation_fails_fails_the_proxy_with_its_error() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-gcp-opfail").await.unwrap();
    let fake = FakeGcp::start(&ZONES).await;
    fake.with(|s| {
        s.insert_fails_with = Some((
            "RESOURCE_NOT_FOUND".into(),
            "The resource 'projects/debian-cloud/global/images/family/debian-99' was not found"
                .into(),
        ))
    });
    let (_operator, _key_dir) = gcp_operator(&ns, &fake).await;
    let yaml = proxy_yaml(ns.name(), "vm-bad-image", "gcp-eu", "")
        .replace("zone: zone-a", "zone: europe-west1-b");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let failed = wait_for(&proxies, "vm-bad-image", "Failed", |p| {
        phase(p) == Some(Phase::Failed)
    })
    .await
    .unwrap();
    let error = failed.status.unwrap().last_error.unwrap();
    assert!(
        error.contains("failed: RESOURCE_NOT_FOUND: The resource 'projects/debian-cloud/global/images/family/debian-99' was not found"),
        "{error}"
    );
    assert_eq!(fake.with(|s| s.inserts), 1, "one insert, not one every 2 s");
    assert!(fake.with(|s| s.instances.is_empty()));
}

/// Issue #17 item 3: the operator is killed while its insert is in flight (Google made the VM,
/// the answer never arrived), the providers config then puts another zone first, and the
/// restarted operator finds the first VM instead of inserting a second one in the new zone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cut_off_then_retried_after_a_zone_change_makes_one_vm() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-gcp-moved").await.unwrap();
    let (first, second) = (ZONES[0], ZONES[1]);
    let fake = FakeGcp::start(&ZONES).await;
    fake.hold_inserts();
    let (operator, _key_dir) = gcp_operator_in(&ns, &fake, &[first]).await;

    // No zone in the spec: the provider chooses (`config.zones[0]`).
    let yaml = proxy_yaml(ns.name(), "vm-moved", "gcp-eu", "")
        .replace("  placement: {zone: zone-a}\n", "");
    assert!(!yaml.contains("placement"), "{yaml}");
    cp.kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();
    let proxies: kube::Api<Proxy> = ns.api();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fake.inserts() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the insert never reached the fake"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // What the create asked for was recorded before the call; nothing of its answer was.
    let asked = proxies.get("vm-moved").await.unwrap().status.unwrap();
    assert_eq!(
        asked.placement,
        Some(PlacementRecord {
            provider: "gcp-eu".into(),
            zone: None
        })
    );
    assert_eq!(asked.provider_id, None);
    drop(operator);
    fake.release_inserts();
    let made: Vec<String> = fake.with(|s| s.instances.keys().cloned().collect());
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0].starts_with(&format!("{first}/")), "{made:?}");

    // The providers config now puts another zone first.
    let (_restarted, _key_dir) = gcp_operator_in(&ns, &fake, &[second, first]).await;
    let ready = wait_for(&proxies, "vm-moved", "Ready", |p| {
        phase(p) == Some(Phase::Ready)
    })
    .await
    .unwrap();
    let status = ready.status.unwrap();
    assert_eq!(status.provider_id.as_deref(), Some(made[0].as_str()));
    assert_eq!(status.zone.as_deref(), Some(first));
    assert_eq!(fake.inserts(), 1, "no second insert");
    let now: Vec<String> = fake.with(|s| s.instances.keys().cloned().collect());
    assert_eq!(now, made, "exactly one VM");
}

/// A zone that does not answer while create looks for an earlier try's VM stops the create with
/// a transient error: inserting into the zone that answers could make a second VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_that_cannot_be_searched_stops_the_create_instead_of_inserting_elsewhere() {
    let fake = FakeGcp::start(&ZONES).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = gcp_provider(&entry(&fake, &key_file(&fake, &dir))).await;
    fake.with(|s| s.unavailable_zones.insert(ZONES[1].to_string()));
    let mut want = spec("px-gcp-wait", serde_json::json!({}));
    want.zone = Some(ZONES[0].into());
    match refused(provider.create(want.clone()).await) {
        ProviderError::Transient { message, .. } => assert!(
            message.contains(&format!(
                "zone {} could not be searched for an existing instance px-gcp-wait",
                ZONES[1]
            )) && message.contains("503 backendError"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.inserts(), 0, "nothing inserted while a zone is silent");
    fake.with(|s| s.unavailable_zones.clear());
    let made = provider.create(want).await.unwrap();
    assert_eq!(made.provider_id, format!("{}/px-gcp-wait", ZONES[0]));
    assert_eq!(fake.inserts(), 1);
}

/// `list` follows `nextPageToken`: with one VM a page, all three are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_follows_every_page() {
    let fake = FakeGcp::start(&ZONES).await;
    fake.with(|s| s.page_size = 1);
    let dir = tempfile::tempdir().unwrap();
    let provider = gcp_provider(&entry(&fake, &key_file(&fake, &dir))).await;
    for name in ["px-page-1", "px-page-2", "px-page-3"] {
        let mut want = spec(name, serde_json::json!({}));
        want.zone = Some("europe-west1-b".into());
        provider.create(want).await.unwrap();
    }
    let mut listed: Vec<String> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.provider_id)
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "europe-west1-b/px-page-1",
            "europe-west1-b/px-page-2",
            "europe-west1-b/px-page-3"
        ]
    );
}

/// Cuts the squid.conf out of a managed squid setup script (a quoted heredoc) and has real
/// squid parse it.
fn squid_accepts_the_scripts_conf(script: &str) -> String {
    let conf = own_network::conf_in_script(script);
    own_network::assert_squid_parses(&conf);
    conf
}

/// The VM's managed squid is no way to the metadata server (its token, the user's cloud-init)
/// or the VPC: the startup script's squid.conf, run by real squid, refuses 169.254.169.254, a
/// name resolving to it and a private address, and reaches the one loopback site the config
/// allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managed_squid_refuses_the_metadata_server_and_the_vpc() {
    let fake = FakeGcp::start(&ZONES).await;
    let dir = tempfile::tempdir().unwrap();
    let mut entry = entry(&fake, &key_file(&fake, &dir));
    entry["config"]["allowFrom"] = serde_json::json!(["127.0.0.0/8"]);
    entry["config"]["allowDestinations"] = serde_json::json!(["127.0.0.1/32"]);
    let provider = gcp_provider(&entry).await;
    let mut want = spec("px-gcp-meta", serde_json::json!({}));
    want.zone = Some("europe-west1-b".into());
    provider.create(want).await.unwrap();
    let script = fake.with(|s| {
        s.instances
            .values()
            .flat_map(|vm| {
                vm["metadata"]["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .find(|i| i["key"] == "startup-script")
            .and_then(|i| i["value"].as_str().map(str::to_string))
            .expect("the managed squid's startup script")
    });
    let conf = squid_accepts_the_scripts_conf(&script);
    assert!(conf.contains("acl to_internal dst "), "{conf}");
    own_network::assert_refuses_its_own_network(&conf).await;

    // A range that squid would misread is refused with the field's name and the fix.
    entry["config"]["denyDestinations"] = serde_json::json!(["::ffff:10.0.0.0/104"]);
    let refused = gcp_provider(&entry)
        .await
        .validate_config()
        .await
        .expect_err("a bad denyDestinations is refused")
        .to_string();
    assert!(
        refused.contains("config.denyDestinations[0]: `::ffff:10.0.0.0/104`")
            && refused.contains("write it as IPv4"),
        "{refused}"
    );
}

/// The conformance suite of `proxy-operator plugin test` (as a library) against the gcp provider
/// and the fake Compute Engine API, with the token the host mints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gcp_provider_is_conformant() {
    let fake = FakeGcp::start(&ZONES).await;
    let dir = tempfile::tempdir().unwrap();
    let entry = entry(&fake, &key_file(&fake, &dir));
    let (engine, _) = super::common::engine_with(test_options()).await;
    let grants = serde_json::from_value(entry["grants"].clone()).unwrap();
    super::common::assert_conformant(&engine, "gcp", entry["config"].clone(), grants, None).await;
    assert!(fake.with(|s| s.instances.is_empty()), "nothing left behind");
}
