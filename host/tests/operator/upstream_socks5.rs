//! SOCKS5 upstreams (`socks5://` URLs of the upstream provider) through the operator binary, with
//! real SOCKS5 servers from Debian standing in for a vendor's: dante without a login, microsocks
//! requiring an RFC 1929 username and password (the operator reads it from a file, as from a
//! mounted Secret), and a dead one. The health probe speaks SOCKS5 (logging in), a lease's
//! `proxyUrl` is `socks5://` (with the login only where the providers config allows), curl gets a
//! page through the leased URL, the gateway carries a request through a SOCKS5 upstream logging
//! in itself, and a wrong password is never Ready.

use harness::process::free_port;
use harness::socks::SocksServer;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use proxy_operator::api::Proxy;
use reqwest::Method;

use super::common::operator_process::TOKEN;
use super::upstream::{
    condition, gateway_to_target, leased_url, operator_for_gateway, pool, proxy, ready_members,
    wait_condition,
};
use super::world::World;

const USERNAME: &str = "socks-customer-3";
/// With a character a URL must escape.
const PASSWORD: &str = "s0cks/Vendor-pw";
const WRONG: &str = "not-the-vendor-pw";
const GATEWAY_TOKEN: &str = "gateway-token-for-socks5-tests";

/// curl through `proxy` (any scheme curl takes: `socks5://user:pw@…`) for `page`: (body, exit
/// code; 0 when it got a page).
async fn curl_through(proxy: &str, page: &str) -> (String, i32) {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "-f", "--max-time", "20", "-x", proxy, page])
        .env_remove("http_proxy")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .output()
        .await
        .expect("curl is installed (Debian package curl)");
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        out.status.code().unwrap_or(-1),
    )
}

/// Four provider instances: dante listed (no login), microsocks listed with the login withheld
/// from leases, any upstream named per Proxy with the login handed out, and the same with a
/// wrong password.
fn providers_config(records: &str, files: [&str; 2], dante: u16, vendor: u16) -> String {
    let kube = format!("grants: {{kube: {{namespace: {records}, kinds: [v1/ConfigMap]}}}}");
    let login = |file: &str| {
        format!("credentials: {{username: {USERNAME}, passwordFrom: {{file: {file}}}}}")
    };
    let [right, wrong] = files;
    format!(
        "providers:\n\
         - name: socks-open\n  type: upstream\n  config: {{upstreams: [{{url: \"socks5://127.0.0.1:{dante}\"}}]}}\n  {kube}\n\
         - name: socks-vendor\n  type: upstream\n  config: {{upstreams: [{{url: \"socks5://127.0.0.1:{vendor}\"}}]}}\n  {kube}\n  upstream: {{{}}}\n\
         - name: socks-shared\n  type: upstream\n  {kube}\n  upstream: {{{}, handOutCredentials: true}}\n\
         - name: socks-wrong\n  type: upstream\n  {kube}\n  upstream: {{{}}}\n",
        login(right),
        login(right),
        login(wrong),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_upstreams_are_probed_leased_and_relayed_with_the_login_the_operator_holds() {
    let world = World::start("px-socks5").await;
    let records = world.cp.namespace("px-socks5-records").await.unwrap();
    let open = SocksServer::dante().await.unwrap();
    let vendor = SocksServer::microsocks_with_login(USERNAME, PASSWORD)
        .await
        .unwrap();
    let (right, wrong) = (
        world.dir.path().join("right"),
        world.dir.path().join("wrong"),
    );
    std::fs::write(&right, format!("{PASSWORD}\n")).unwrap();
    std::fs::write(&wrong, WRONG).unwrap();
    let config = world.dir.path().join("socks5-providers.yaml");
    let files = [right.to_str().unwrap(), wrong.to_str().unwrap()];
    let text = providers_config(records.name(), files, open.port(), vendor.port());
    std::fs::write(&config, &text).unwrap();
    let mut operator = operator_for_gateway(&world, &config, GATEWAY_TOKEN).await;
    let ns = world.ns.name().to_string();
    let proxies: Api<Proxy> = world.ns.api();
    let page = world.target.url("/page");
    world.target.serve("/page", b"through socks5".to_vec());
    let dead = free_port().unwrap();
    let url = |port: u16| format!("  providerOptions: {{url: \"socks5://127.0.0.1:{port}\"}}\n");
    let yaml = [
        pool(&ns, "open-pool", 1, "socks-open"),
        pool(&ns, "vendor-pool", 1, "socks-vendor"),
        proxy(&ns, "shared-1", "socks-shared", &url(vendor.port())),
        proxy(&ns, "wrong-1", "socks-wrong", &url(vendor.port())),
        proxy(&ns, "dead-1", "socks-open", &url(dead)),
        proxy(
            &ns,
            "bad-1",
            "socks-open",
            "  providerOptions: {url: \"socks4://127.0.0.1:1080\"}\n",
        ),
    ]
    .join("---\n");
    world
        .cp
        .kubectl_run(&["apply", "-f", "-"], Some(&yaml))
        .await
        .unwrap();

    // dante, listed: probed over SOCKS5, Ready; the lease's proxyUrl is socks5://, and curl
    // gets the page through it.
    let member = ready_members(&proxies, "open-pool", 1).await.remove(0);
    let leased = leased_url(&mut operator, &format!("{ns}/{member}")).await;
    assert_eq!(leased, format!("socks5://127.0.0.1:{}", open.port()));
    let (body, code) = curl_through(&leased, &page).await;
    assert_eq!(
        (body.as_str(), code),
        ("through socks5", 0),
        "{}",
        open.log()
    );

    // microsocks, listed, the login withheld: Ready (the probe logged in), the proxyUrl is the
    // bare address, which gets nothing without the login; through the gateway (which logs in
    // with RFC 1929 itself) the crawler gets the page over each of its doors.
    let member = ready_members(&proxies, "vendor-pool", 1).await.remove(0);
    let bare = format!("socks5://127.0.0.1:{}", vendor.port());
    assert_eq!(
        leased_url(&mut operator, &format!("{ns}/{member}")).await,
        bare
    );
    assert_ne!(curl_through(&bare, &page).await.1, 0);
    let gateway = gateway_to_target(&world, &operator, GATEWAY_TOKEN, "gw-socks5").await;
    let through_gateway = gateway.proxy_url(&format!("pool-{ns}.vendor-pool"), TOKEN);
    let (body, code) = curl_through(&through_gateway, &page).await;
    assert_eq!(
        (body.as_str(), code),
        ("through socks5", 0),
        "{}",
        gateway.process.log_tail(30)
    );
    let socks_door = format!("socks5h://pool-{ns}.vendor-pool:{TOKEN}@{}", gateway.socks);
    let (body, code) = curl_through(&socks_door, &page).await;
    assert_eq!(
        (body.as_str(), code),
        ("through socks5", 0),
        "{}",
        gateway.process.log_tail(30)
    );

    // Where the providers config allows it, the proxyUrl carries the login, and curl uses it.
    wait_condition(&proxies, "shared-1", "Ready", "True", "Healthy").await;
    let shared = leased_url(&mut operator, &format!("{ns}/shared-1")).await;
    assert_eq!(
        shared,
        format!(
            "socks5://{USERNAME}:s0cks%2FVendor-pw@127.0.0.1:{}",
            vendor.port()
        )
    );
    let (body, code) = curl_through(&shared, &page).await;
    assert_eq!((body.as_str(), code), ("through socks5", 0));

    // A wrong password: recorded, never Ready, and the operator says why.
    let message = wait_condition(&proxies, "wrong-1", "Ready", "False", "Unhealthy").await;
    assert!(message.contains("refused the login"), "{message}");
    // The dead one likewise.
    let message = wait_condition(&proxies, "dead-1", "Ready", "False", "Unhealthy").await;
    assert!(message.contains("cannot connect"), "{message}");
    let states = operator.states().await;
    for name in ["wrong-1", "dead-1"] {
        let state = states
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_str());
        assert_ne!(state, Some("available"), "{name}: {states:?}");
        let (code, body) = operator
            .call(
                Method::POST,
                "/v1/leases",
                Some(serde_json::json!({"proxy": format!("{ns}/{name}")})),
            )
            .await;
        assert_ne!(code, reqwest::StatusCode::CREATED, "{name}: {body}");
    }

    // SOCKS4 is refused naming the field.
    let message = wait_condition(&proxies, "bad-1", "Provisioned", "False", "ProviderError").await;
    assert!(
        message.contains("spec.providerOptions.url: SOCKS4 is not supported"),
        "{message}"
    );
    let (status, _, _) = condition(&proxies, "shared-1", "Ready").await.unwrap();
    assert_eq!(status, "True");

    // The password is in no log, status or event.
    let log = std::fs::read_to_string(world.dir.path().join("operator.log")).unwrap();
    let all = serde_json::to_string(&proxies.list(&ListParams::default()).await.unwrap()).unwrap();
    let events: Api<Event> = world.ns.api();
    let events =
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap()).unwrap();
    let gateway_log = gateway.process.log_tail(400);
    for password in [PASSWORD, WRONG] {
        assert!(!log.contains(password), "the operator's log has a password");
        assert!(!all.contains(password), "a Proxy has a password");
        assert!(!events.contains(password), "an event has a password");
        assert!(
            !gateway_log.contains(password),
            "the gateway's log has a password"
        );
    }
}
