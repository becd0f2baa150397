//! A team's gateway credential, against a real kube-apiserver (docs/gateway.md, "Team
//! credentials"): the Secret made by the docs' own `kubectl create secret` + `kubectl label`
//! commands in team A's namespace, watched with the operator's ServiceAccount and its rights
//! from deploy/rbac.yaml; the `proxy-operator gateway` binary in front of the discovery API, a
//! real squid requiring its login behind it; curl (HTTP, CONNECT, SOCKS5), Python requests and
//! headless Chromium (in a network namespace with no uplink) with the credential as their proxy
//! password. Team B's pool is refused to it as any pool it may not use; a Secret too weak is
//! refused with an Event that never shows it; a credential changed in place or deleted gets 407
//! within seconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::netns::Netns;
use harness::process::{Check, wait_for};
use harness::squid::Squid;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use proxy_operator::leasing::leases::api::GatewayAccess;
use proxy_operator::leasing::leases::auth::{CredentialBook, team_watch};
use proxy_operator::leasing::leases::{
    self, Discovery, KubeReviewer, LeaseMetrics, LeaseOptions, LeaseStore, ProvisionedProxy,
};
use proxy_operator::provider::credentials::ProxyLogin;
use reqwest::StatusCode;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::GATEWAY_TOKEN;
use super::auth::{OPERATOR, control_plane, options, proxy};
use super::browser::{LoginForwarder, chromium_dump_dom};
use super::gateway::{PAGE, Site, curl, python, spawn_replica};

/// The section of docs/gateway.md whose commands this test runs.
const SECTION: &str = "## Team credentials";

/// The `kubectl` commands of the section's first `sh` block, for namespace `ns`, with the
/// credential `credential` in place of `$(openssl rand -hex 24)`.
fn the_docs_commands(ns: &str, credential: &str) -> Vec<Vec<String>> {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/gateway.md"),
    )
    .unwrap();
    let block = docs
        .split(SECTION)
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .expect("docs/gateway.md has a section \"Team credentials\" with an sh block");
    let block = block.replace("\\\n", " ");
    let commands: Vec<Vec<String>> = block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("kubectl "))
        .map(|line| {
            line.replace("team-a", ns)
                .replace("\"$(openssl rand -hex 24)\"", credential)
                .split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect()
        })
        .collect();
    assert_eq!(
        commands.iter().map(|c| c[2].as_str()).collect::<Vec<_>>(),
        ["create", "label"],
        "the section's block: {block}"
    );
    commands
}

/// A credential as `openssl rand -hex 24` makes one (48 hex characters), unique per test run.
fn a_credential(seed: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    hex::encode(&Sha256::digest(format!("{seed}{nanos}"))[..24])
}

struct Served(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Served {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// curl through the gateway as `username` with `password`: (status, body).
async fn through(
    gateway: &harness::gateway::GatewayProcess,
    username: &str,
    password: &str,
    url: &str,
) -> (u16, String) {
    let (status, body, _) = curl(&["-x", &gateway.proxy_url(username, password), url]).await;
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_credential_works_with_curl_requests_and_chromium_only_in_its_pools_until_deleted() {
    let cp = control_plane().await;
    let (a, b) = (
        cp.namespace("team-a").await.unwrap(),
        cp.namespace("team-b").await.unwrap(),
    );
    // One squid requiring its login, a proxy of A's pool and one of B's.
    let site = Site::start().await;
    let squid = Squid::start_requiring_login().await.unwrap();
    let login = ProxyLogin::generate("squid-0");
    let hashed = login.hashed();
    squid
        .set_passwords(&format!("{}:{}\n", hashed.username, hashed.password_hash))
        .unwrap();
    let upstream = |ns: &str, name: &str, pool: &str| ProvisionedProxy {
        port: squid.port(),
        login: Some(login.clone()),
        ..proxy(ns, name, pool)
    };
    let store = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.restore(Default::default());
    store.set_provisioned(vec![
        upstream(a.name(), "px-a", "pool-a"),
        upstream(b.name(), "px-b", "pool-b"),
    ]);

    // The leader's side as the operator wires it: ServiceAccount tokens and team credentials,
    // the credentials watched and refusals told as the operator's ServiceAccount.
    let operator = cp.client_as(OPERATOR, &[]);
    let kube_options = options(Duration::from_secs(20), Duration::from_millis(200));
    let book = Arc::new(CredentialBook::default());
    // (Every namespace's, as the operator watches them: this test's Secrets are its own.)
    let auth = leases::Auth::none()
        .with_kubernetes(
            Arc::new(KubeReviewer::new(operator.clone(), &kube_options.audience)),
            kube_options,
        )
        .with_credentials(book.clone());
    let refusals = team_watch::Refusals {
        recorder: proxy_operator::support::events::recorder(operator.clone()),
        publish: Arc::new(|| true),
    };
    let discovery = Discovery::with_auth(store, auth).serving_the_gateway(GatewayAccess {
        token: GATEWAY_TOKEN.into(),
        max_connections_per_proxy: 8,
        block_statuses: vec![403, 429],
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap();
    let _served = Served(vec![
        tokio::spawn(team_watch::watch(
            operator,
            None,
            book.clone(),
            Some(refusals),
        )),
        tokio::spawn(leases::serve(listener, leases::router(Arc::new(discovery)))),
    ]);
    let gateway = spawn_replica(api, &[site.port], "gw-credentials", &[]).await;
    let page = site.url("127.0.0.1", "/page");
    let pool_a = format!("pool-{}.pool-a", a.name());

    // Team A makes its credential with the docs' commands.
    let credential = a_credential("team-a");
    for args in the_docs_commands(a.name(), &credential) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cp.kubectl_run(&args, None)
            .await
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    }

    // The discovery API takes it as a bearer token too: a lease of A's pool (released
    // before the gateway routes there: a lease is exclusive); B's pool forbidden.
    let lease = |pool: String| {
        let credential = credential.clone();
        async move {
            reqwest::Client::new()
                .post(format!("http://{api}/v1/leases"))
                .bearer_auth(credential)
                .header("content-type", "application/json")
                .body(json!({"pool": pool}).to_string())
                .send()
                .await
                .unwrap()
        }
    };
    // Once the watch has seen the Secret.
    let leased = wait_for("the credential to lease", Duration::from_secs(10), || {
        let answer = lease(format!("{}/pool-a", a.name()));
        async move {
            let answer = answer.await;
            match answer.status() {
                StatusCode::CREATED => Check::Ready(answer.text().await.unwrap()),
                status => Check::NotYet(format!("{status}: {}", answer.text().await.unwrap())),
            }
        }
    })
    .await
    .unwrap();
    let leased: serde_json::Value = serde_json::from_str(&leased).unwrap();
    assert_eq!(leased["proxy"]["name"], "px-a");
    let released = reqwest::Client::new()
        .delete(format!(
            "http://{api}/v1/leases/{}",
            leased["id"].as_str().unwrap()
        ))
        .bearer_auth(&credential)
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);

    // curl, a plain request.
    let (status, body) = through(&gateway, &pool_a, &credential, &page).await;
    assert_eq!(
        (status, body.as_str()),
        (200, PAGE),
        "{}",
        gateway.process.log_tail(100)
    );
    // Over a CONNECT tunnel too.
    let (status, body, _) =
        curl(&["-p", "-x", &gateway.proxy_url(&pool_a, &credential), &page]).await;
    assert_eq!((status, body.as_str()), (200, PAGE));
    // SOCKS5, the name resolved by the fleet's proxy.
    let socks = gateway.socks.to_string();
    let login = format!("{pool_a}:{credential}");
    let (status, body, _) = curl(&["--socks5-hostname", &socks, "-U", &login, &page]).await;
    assert_eq!((status, body.as_str()), (200, PAGE));

    // Python requests with nothing but HTTP_PROXY.
    let out = tokio::process::Command::new(python())
        .args([
            "-c",
            "import os, requests; r = requests.get(os.environ['PAGE'], timeout=20); print(r.status_code); print(r.text, end='')",
        ])
        .env("HTTP_PROXY", gateway.proxy_url(&pool_a, &credential))
        .env("PAGE", &page)
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("200\n{PAGE}"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Headless Chromium, in a namespace with no uplink, through a forwarder logging in with
    // the credential.
    let netns = Netns::create("browser").expect("the browser's network namespace, no uplink");
    let plain = format!("127.0.0.1:{}", site.port);
    let forwarder = LoginForwarder::start(
        &netns,
        gateway.http,
        &pool_a,
        &credential,
        vec![plain.clone()],
    )
    .await;
    let unused_spki = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let browser_page = site.url("127.0.0.1", "/browser");
    let dom = chromium_dump_dom(&netns, forwarder.addr, unused_spki, &browser_page).await;
    assert!(
        dom.contains("<p id=\"script\">rendered over http:</p>"),
        "{dom}\n{}",
        gateway.process.log_tail(100)
    );

    // Every request came through the squid, never carrying the credential.
    let seen = [site.seen("/page"), site.seen("/browser")].concat();
    assert_eq!(seen.len(), 5, "{seen:?}");
    for s in &seen {
        assert!(
            !s.headers.values().any(|v| v.contains(&credential)),
            "{s:?}"
        );
    }
    assert!(!squid.access_log().contains(&credential));

    // B's pool: the refusal of any pool it may not use, whether the pool exists or not.
    let mut refusals = Vec::new();
    for pool in ["pool-b", "no-such-pool"] {
        let username = format!("pool-{}.{pool}", b.name());
        let (status, body, _) =
            curl(&["-x", &gateway.proxy_url(&username, &credential), &page]).await;
        refusals.push((status, body.replace(pool, "<pool>")));
    }
    assert_eq!(refusals[0].0, 403, "{refusals:?}");
    assert_eq!(refusals[0], refusals[1]);
    assert_eq!(site.seen("/page").len(), 4, "nothing more reached the site");

    let denied = lease(format!("{}/pool-b", b.name())).await;
    assert_eq!(denied.status(), StatusCode::FORBIDDEN);

    // A Secret too weak: refused, with an Event on it that does not show it; it logs in nowhere.
    let weak = "0123456789abcdef";
    let weak_commands = the_docs_commands(a.name(), weak);
    for args in weak_commands {
        let args: Vec<String> = args.iter().map(|a| a.replace("crawlers", "weak")).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cp.kubectl_run(&args, None).await.unwrap();
    }
    let events: kube::Api<Event> = a.api();
    let note = wait_for("the weak Secret's Event", Duration::from_secs(10), || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.unwrap();
            match list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("weak")
                    && e.reason.as_deref() == Some("CredentialRefused")
            }) {
                Some(event) => Check::Ready(event.note.unwrap_or_default()),
                None => Check::NotYet("no Event yet".into()),
            }
        }
    })
    .await
    .unwrap();
    assert!(note.contains("shorter than 32 characters"), "{note}");
    assert!(note.contains("openssl rand -hex 24"), "{note}");
    assert!(!note.contains(weak), "{note}");
    assert_eq!(through(&gateway, &pool_a, weak, &page).await.0, 407);
    assert!(!gateway.process.log_tail(500).contains(&credential));

    // Changed in place: the old value gets 407, the new one works, within seconds.
    let secrets: kube::Api<Secret> = a.api();
    let rotated = a_credential("rotated");
    secrets
        .patch(
            "crawlers",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"credential": rotated}})),
        )
        .await
        .unwrap();
    let took = answered(&gateway, &pool_a, &credential, &page, 407).await;
    eprintln!("the old value refused {took:?} after the change");
    answered(&gateway, &pool_a, &rotated, &page, 200).await;

    // Deleted: the credential gets 407 within seconds.
    secrets
        .delete("crawlers", &DeleteParams::default())
        .await
        .unwrap();
    let took = answered(&gateway, &pool_a, &rotated, &page, 407).await;
    eprintln!("refused {took:?} after the Secret's deletion");
    let gone = reqwest::Client::new()
        .post(format!("http://{api}/v1/leases"))
        .bearer_auth(&rotated)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::UNAUTHORIZED);
}

/// How long until curl through the gateway as `username` with `password` gets `status`
/// (within 10 s, or a panic).
async fn answered(
    gateway: &harness::gateway::GatewayProcess,
    username: &str,
    password: &str,
    url: &str,
    status: u16,
) -> Duration {
    let start = Instant::now();
    wait_for(
        &format!("{status} through the gateway"),
        Duration::from_secs(10),
        || async move {
            match through(gateway, username, password, url).await {
                (got, _) if got == status => Check::Ready(()),
                other => Check::NotYet(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", gateway.process.log_tail(60)));
    start.elapsed()
}
