//! The upstream provider (proxies that exist already) through the operator binary, with real
//! squids standing in for a vendor's proxies: one requiring a login, two open ones, one dead. The
//! login comes from a file (a mounted Secret) the operator reads; the plugin never gets it, a
//! lease's `proxyUrl` carries it only where the providers config allows, and a ProxyPool takes N
//! upstreams of a list. Also: `plugin test` conformance, and a bad `providerOptions.url` refused
//! naming the field.

use super::credentials::fetch_through;
use std::time::Duration;

use harness::Squid;
use harness::gateway::GatewayProcess;
use harness::process::{Check, free_port, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use proxy_operator::api::Proxy;
use proxy_operator::provider::credentials::ProxyLogin;
use proxy_operator::provider::plugins::EngineOptions;
use proxy_operator::provider::plugins::types::InstanceState;
use reqwest::{Method, StatusCode};

use super::common::operator_process::{OperatorProcess, OperatorSetup, TOKEN};
use super::common::{spec, test_options};
use super::world::World;
use super::{bound_provider, control_plane};

const USERNAME: &str = "customer-7";
const PASSWORD: &str = "vendor-S3cret/pw";
const ROTATED: &str = "r0tated-by-the-vendor";
const GATEWAY_TOKEN: &str = "gateway-token-for-upstream-tests";

pub(super) fn proxy(ns: &str, name: &str, provider: &str, spec: &str) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  provider: {provider}\n{spec}"
    )
}

/// The Proxy's condition `type`: (status, reason, message), once it has one.
pub(super) async fn condition(
    proxies: &Api<Proxy>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let proxy = proxies.get(name).await.ok()?;
    let status = proxy.status?;
    let c = status.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

/// Waits until the Proxy's condition `type_` has `status` and a reason `reason`.
pub(super) async fn wait_condition(
    proxies: &Api<Proxy>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    wait_for(
        &format!("{name}: {type_}={status} ({reason})"),
        Duration::from_secs(60),
        || async {
            match condition(proxies, name, type_).await {
                Some((s, r, m)) if s == status && r == reason => Check::Ready(m),
                other => Check::NotYet(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap()
}

/// The `proxyUrl` of a lease granted on `proxy` (and released).
pub(super) async fn leased_url(operator: &mut OperatorProcess, proxy: &str) -> String {
    let lease = operator.lease(proxy).await;
    let (status, granted) = operator
        .call(Method::GET, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{granted}");
    // Released again: a leased proxy is the lease holder's alone (the gateway skips it).
    let (status, _) = operator
        .call(Method::DELETE, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    granted["proxyUrl"].as_str().unwrap().to_string()
}

/// The operator over the providers config at `config`, probing the world's target, taking
/// `gateway_token` from a gateway; leading.
pub(super) async fn operator_for_gateway(
    world: &World,
    config: &std::path::Path,
    gateway_token: &str,
) -> OperatorProcess {
    let target = world.target.addr().to_string();
    let setup = OperatorProcess::setup(
        world.cp,
        &world.ns,
        world.dir.path(),
        config.to_str().unwrap(),
        &target,
    );
    let mut operator = OperatorProcess::start_with(OperatorSetup {
        extra: vec!["--gateway-token".into(), gateway_token.into()],
        ..setup
    });
    operator.wait_leading().await;
    operator
}

/// A gateway in front of `operator` (started with `--gateway-token gateway_token`), allowed to
/// reach only the world's target site; ready.
pub(super) async fn gateway_to_target(
    world: &World,
    operator: &OperatorProcess,
    gateway_token: &str,
    name: &str,
) -> GatewayProcess {
    let allowed_port = world.target.addr().port().to_string();
    let flags = [
        "--allowed-networks",
        "127.0.0.1/32",
        "--allowed-ports",
        &allowed_port,
    ];
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_proxy-operator"));
    let mut gateway =
        GatewayProcess::spawn(binary, operator.discovery, gateway_token, name, &flags).unwrap();
    gateway.wait_ready(Duration::from_secs(30)).await.unwrap();
    gateway
}

pub(super) fn pool(ns: &str, name: &str, replicas: u32, provider: &str) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: {provider}\n"
    )
}

pub(super) async fn pool_members(proxies: &Api<Proxy>, pool: &str) -> Vec<Proxy> {
    let selector = format!("proxy-operator.dev/pool={pool}");
    proxies
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// Waits until the ProxyPool `pool` has `n` Ready Proxies; their names.
pub(super) async fn ready_members(proxies: &Api<Proxy>, pool: &str, n: usize) -> Vec<String> {
    wait_for(
        &format!("{n} Ready in pool {pool}"),
        Duration::from_secs(60),
        || async {
            let members = pool_members(proxies, pool).await;
            let ready: Vec<String> = members
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    })
                })
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            if ready.len() == n {
                Check::Ready(ready)
            } else {
                let seen: Vec<_> = members
                    .iter()
                    .map(|p| (&p.metadata.name, p.status.as_ref().map(|s| &s.conditions)))
                    .collect();
                Check::NotYet(format!("{ready:?} Ready of {seen:?}"))
            }
        },
    )
    .await
    .unwrap()
}

/// The providers config: the test provider under an `upstream` section (its store shows what
/// the plugin was given), the upstream plugin with a list of one upstream requiring the login
/// (withheld from leases), the same upstream named per Proxy with the login handed out, and
/// two open upstreams for a pool.
fn providers_config(world: &World, records: &str, password_file: &str, open: [u16; 2]) -> String {
    let login =
        format!("credentials: {{username: {USERNAME}, passwordFrom: {{file: {password_file}}}}}");
    let kube = format!("grants: {{kube: {{namespace: {records}, kinds: [v1/ConfigMap]}}}}");
    let vendor = world.squid.port();
    format!(
        "providers:\n{store}  upstream: {{{login}}}\n\
         - name: vendor\n  type: upstream\n  config: {{upstreams: [{{url: \"http://127.0.0.1:{vendor}\"}}]}}\n  {kube}\n  upstream: {{{login}}}\n\
         - name: vendor-shared\n  type: upstream\n  {kube}\n  upstream: {{{login}, handOutCredentials: true}}\n\
         - name: open\n  type: upstream\n  config: {{upstreams: [{{url: \"http://127.0.0.1:{}\"}}, {{url: \"http://127.0.0.1:{}\", zone: b}}]}}\n  {kube}\n",
        open[0],
        open[1],
        store = world.store.provider_entry("store-up"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_proxies_are_probed_leased_and_pooled_and_their_login_stays_with_the_operator() {
    let vendor = Squid::start_requiring_login().await.unwrap();
    let hash = ProxyLogin::of_upstream(USERNAME, PASSWORD, false)
        .unwrap()
        .hashed()
        .password_hash;
    vendor
        .set_passwords(&format!("{USERNAME}:{hash}\n"))
        .unwrap();
    let world = World::start_with_squid("px-upstream", vendor).await;
    let records = world.cp.namespace("px-upstream-records").await.unwrap();
    let open = [Squid::start().await.unwrap(), Squid::start().await.unwrap()];
    let password_file = world.dir.path().join("vendor-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let config = world.dir.path().join("upstream-providers.yaml");
    let text = providers_config(
        &world,
        records.name(),
        password_file.to_str().unwrap(),
        [open[0].port(), open[1].port()],
    );
    std::fs::write(&config, &text).unwrap();
    let mut operator = operator_for_gateway(&world, &config, GATEWAY_TOKEN).await;
    let ns = world.ns.name().to_string();
    let proxies: Api<Proxy> = world.ns.api();
    let page = world.target.url("/page");
    world
        .target
        .serve("/page", b"through the upstream".to_vec());
    let dead = free_port().unwrap();
    let vendor_port = world.squid.port();
    let yaml = [
        proxy(
            &ns,
            "via-store",
            "store-up",
            &format!("  port: {vendor_port}\n"),
        ),
        proxy(
            &ns,
            "shared-1",
            "vendor-shared",
            &format!("  providerOptions: {{url: \"http://127.0.0.1:{vendor_port}\"}}\n"),
        ),
        proxy(
            &ns,
            "dead-1",
            "open",
            &format!("  providerOptions: {{url: \"http://127.0.0.1:{dead}\"}}\n"),
        ),
        proxy(
            &ns,
            "bad-url",
            "open",
            "  providerOptions: {url: \"http://someone:hunter2@127.0.0.1:3128\"}\n",
        ),
        pool(&ns, "open-pool", 2, "open"),
        pool(&ns, "vendor-pool", 1, "vendor"),
    ]
    .join("---\n");
    world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();

    // The login: the probe logs in, so the upstream that requires it becomes Ready; the plugin
    // was given nothing, not even a hash (the test provider's store keeps what it got).
    wait_condition(&proxies, "via-store", "Ready", "True", "Healthy").await;
    let stored = world.store.state.instances.lock().unwrap().clone();
    let via_store = stored
        .values()
        .find(|i| i["owner"]["name"] == "via-store")
        .unwrap();
    assert!(via_store["credentials"].is_null(), "{via_store}");
    let status = proxies.get("via-store").await.unwrap().status.unwrap();
    let recorded = status.credentials.unwrap();
    assert_eq!(
        recorded.secret_name,
        format!("file:{}", password_file.display())
    );

    // A listed upstream, taken by a pool: Ready, and a lease's proxyUrl is the bare address (the
    // login withheld): squid asks for the login. Through the gateway, which logs in itself, the
    // crawler gets the page without ever knowing the login.
    let member = ready_members(&proxies, "vendor-pool", 1).await.remove(0);
    let bare = format!("http://127.0.0.1:{vendor_port}");
    assert_eq!(
        leased_url(&mut operator, &format!("{ns}/{member}")).await,
        bare
    );
    assert_eq!(
        fetch_through(&bare, &page).await,
        StatusCode::PROXY_AUTHENTICATION_REQUIRED
    );
    let gateway = gateway_to_target(&world, &operator, GATEWAY_TOKEN, "gw-upstream").await;
    let through_gateway = gateway.proxy_url(&format!("pool-{ns}.vendor-pool"), TOKEN);
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(&through_gateway).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client.get(&page).send().await.unwrap();
    let status = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "through the upstream"),
        "{}",
        gateway.process.log_tail(30)
    );
    let gateway_log = gateway.process.log_tail(200);
    assert!(
        !gateway_log.contains(PASSWORD),
        "the gateway's log has the password"
    );
    // The list had one upstream, so another Proxy of it waits on Quota.
    let extra = proxy(&ns, "vendor-2", "vendor", "");
    world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(&extra))
        .await
        .unwrap();
    let message = wait_condition(&proxies, "vendor-2", "Provisioned", "False", "Quota").await;
    assert!(
        message.contains("all 1 upstreams of config.upstreams"),
        "{message}"
    );

    // Where the providers config allows it, the proxyUrl carries the login, and it works.
    wait_condition(&proxies, "shared-1", "Ready", "True", "Healthy").await;
    let shared = leased_url(&mut operator, &format!("{ns}/shared-1")).await;
    assert_eq!(
        shared,
        format!("http://{USERNAME}:vendor-S3cret%2Fpw@127.0.0.1:{vendor_port}")
    );
    assert_eq!(fetch_through(&shared, &page).await, StatusCode::OK);

    // A pool takes the two open upstreams of its provider's list, one each.
    ready_members(&proxies, "open-pool", 2).await;
    let mut ports: Vec<u16> = pool_members(&proxies, "open-pool")
        .await
        .into_iter()
        .filter_map(|p| p.status?.port)
        .collect();
    ports.sort();
    let mut expected = vec![open[0].port(), open[1].port()];
    expected.sort();
    assert_eq!(ports, expected);

    // The dead upstream is provisioned (it is recorded) but never Ready; the operator says why.
    wait_condition(&proxies, "dead-1", "Provisioned", "True", "InstanceRunning").await;
    let (status, _, message) = condition(&proxies, "dead-1", "Ready").await.unwrap();
    assert_eq!(status, "False", "{message}");
    let states = operator.states().await;
    let dead_state = states
        .iter()
        .find(|(n, _)| n == "dead-1")
        .map(|(_, s)| s.as_str());
    assert_ne!(dead_state, Some("healthy"), "{states:?}");
    let (code, body) = operator
        .call(
            Method::POST,
            "/v1/leases",
            Some(serde_json::json!({"proxy": format!("{ns}/dead-1")})),
        )
        .await;
    assert_ne!(code, StatusCode::CREATED, "{body}");

    // A bad URL is refused naming the field, and the password in it is not repeated.
    let message =
        wait_condition(&proxies, "bad-url", "Provisioned", "False", "ProviderError").await;
    assert!(
        message.contains("spec.providerOptions.url: must not carry a user name or password"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");

    rotation_is_taken_at_the_next_look(&world, &mut operator, &password_file, &page).await;

    // The password (old or new) is in no log, status, event, listing or record.
    let log = std::fs::read_to_string(world.dir.path().join("operator.log")).unwrap();
    let all = serde_json::to_string(&proxies.list(&ListParams::default()).await.unwrap()).unwrap();
    let events: Api<Event> = world.ns.api();
    let events =
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap()).unwrap();
    let (_, listed) = operator.call(Method::GET, "/v1/proxies", None).await;
    let maps: Api<ConfigMap> = records.api();
    let maps = serde_json::to_string(&maps.list(&ListParams::default()).await.unwrap()).unwrap();
    assert!(maps.contains("upstream-record"), "{maps}");
    assert!(!events.contains("hunter2"), "{events}");
    for password in [PASSWORD, ROTATED] {
        assert!(!log.contains(password), "the operator's log has a password");
        assert!(!all.contains(password), "a Proxy has a password: {all}");
        assert!(
            !events.contains(password),
            "an event has a password: {events}"
        );
        assert!(!listed.to_string().contains(password), "{listed}");
        assert!(!maps.contains(password), "a record has a password: {maps}");
    }
}

/// The vendor changed the password and the mounted Secret followed: at its next look at a Proxy
/// (an annotation brings it at once; otherwise within 5 minutes) the operator takes the new one
/// without asking the plugin: the status records it, `CredentialsRotated` says so, and the
/// lease's `proxyUrl` (where allowed) carries it and works.
async fn rotation_is_taken_at_the_next_look(
    world: &World,
    operator: &mut OperatorProcess,
    password_file: &std::path::Path,
    page: &str,
) {
    let proxies: Api<Proxy> = world.ns.api();
    let fingerprint = |p: Proxy| p.status.and_then(|s| s.credentials).map(|c| c.fingerprint);
    let before = fingerprint(proxies.get("shared-1").await.unwrap());
    let hash = ProxyLogin::of_upstream(USERNAME, ROTATED, false)
        .unwrap()
        .hashed()
        .password_hash;
    world
        .squid
        .set_passwords(&format!("{USERNAME}:{hash}\n"))
        .unwrap();
    std::fs::write(password_file, ROTATED).unwrap();
    let ns = world.ns.name();
    world
        .cp
        .kubectl_run(
            &[
                "annotate",
                "-n",
                ns,
                "proxy/shared-1",
                "example.com/looked=1",
            ],
            None,
        )
        .await
        .unwrap();
    wait_for("the new fingerprint", Duration::from_secs(60), || async {
        let now = fingerprint(proxies.get("shared-1").await.unwrap());
        if now != before {
            Check::Ready(())
        } else {
            Check::NotYet(format!("{now:?}"))
        }
    })
    .await
    .unwrap();
    // The event is published after the status write that showed the fingerprint: awaited.
    let events: Api<Event> = world.ns.api();
    wait_for(
        "a CredentialsRotated event on shared-1",
        Duration::from_secs(30),
        || async {
            let reasons: Vec<_> = events
                .list(&ListParams::default().fields("involvedObject.name=shared-1"))
                .await
                .map(|l| l.items.into_iter().filter_map(|e| e.reason).collect())
                .unwrap_or_default();
            if reasons.iter().any(|r| r == "CredentialsRotated") {
                Check::Ready(())
            } else {
                Check::NotYet(format!("events: {reasons:?}"))
            }
        },
    )
    .await
    .unwrap();
    wait_condition(&proxies, "shared-1", "Ready", "True", "Healthy").await;
    let url = leased_url(operator, &format!("{ns}/shared-1")).await;
    assert!(url.contains(&format!("{USERNAME}:{ROTATED}@")), "{url}");
    assert_eq!(fetch_through(&url, page).await, StatusCode::OK);
}

/// The conformance suite of `proxy-operator plugin test` (as a library) against the upstream
/// provider on the real API server: records made, read, listed and deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_provider_is_conformant() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-up-conformance").await.unwrap();
    let (engine, _) = super::common::engine_with(EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    })
    .await;
    let grants = serde_json::from_value(serde_json::json!({
        "kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap"]}
    }))
    .unwrap();
    let config = serde_json::json!({"upstreams": [{"url": "http://127.0.0.1:3128"}, {"url": "http://127.0.0.1:3129"}]});
    super::common::assert_conformant(&engine, "upstream", config, grants, None).await;
    let maps: Api<ConfigMap> = Api::namespaced(ns.client(), ns.name());
    let left = maps
        .list(&ListParams::default().labels("plugin.proxy-operator.dev/upstream-record"))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "no record left behind");
}

/// Two creates at the same moment gave the same listed upstream to two Proxies (each wrote its
/// record before either looked): at the next look the later name moves to a free upstream and
/// the first keeps it; each is Running only once a look found it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_proxies_given_one_upstream_at_once_the_later_name_moves_to_a_free_one() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-up-race").await.unwrap();
    let grants = serde_json::json!({"kube": {"namespace": ns.name(), "kinds": ["v1/ConfigMap"]}});
    let config = serde_json::json!({"upstreams": [
        {"url": "http://127.0.0.1:3001"}, {"url": "http://127.0.0.1:3002"}
    ]});
    let options = EngineOptions {
        kube: Some(ns.client()),
        ..test_options()
    };
    let provider = bound_provider(options, "upstream", "vendor", &config, grants)
        .await
        .unwrap();
    let mut late = spec("px-late", serde_json::json!({}));
    late.zone = None;
    let created = provider.create(late).await.unwrap();
    // Not Running until a later look: another create of the same moment may not have written
    // its record yet.
    assert_eq!(
        (created.state, created.port),
        (InstanceState::Provisioning, 3001)
    );

    // The record of a create with an earlier name, for the same upstream, written meanwhile.
    let maps: Api<ConfigMap> = ns.api();
    let mut early = maps.get("px-late").await.unwrap();
    early.metadata = ObjectMeta {
        name: Some("px-early".into()),
        labels: early.metadata.labels.clone(),
        ..Default::default()
    };
    let data = early.data.get_or_insert_with(Default::default);
    data.insert("ownerName".into(), "proxy-px-early".into());
    data.insert("ownerUid".into(), "uid-px-early".into());
    data.remove("verified");
    maps.create(&PostParams::default(), &early).await.unwrap();

    let moved = provider.get("px-late").await.unwrap();
    assert_eq!(
        (moved.state, moved.port),
        (InstanceState::Provisioning, 3002)
    );
    assert!(
        moved
            .message
            .unwrap()
            .contains("taken at the same moment by px-early")
    );
    let settled = provider.get("px-late").await.unwrap();
    assert_eq!(
        (settled.state, settled.port),
        (InstanceState::Running, 3002)
    );
    let kept = provider.get("px-early").await.unwrap();
    assert_eq!((kept.state, kept.port), (InstanceState::Running, 3001));
}
