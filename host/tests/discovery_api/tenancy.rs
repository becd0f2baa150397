//! Two teams on one fleet, against a real kube-apiserver: ServiceAccounts `team-a…/crawler` and
//! `team-b…/crawler`, each with `create` on `proxypools/lease` for its own pool only, tokens
//! reviewed by the API server as the operator's ServiceAccount. Through the discovery API and
//! through the gateway's door (`/v1/gateway/…`, what the gateway asks for each client): what
//! lies outside a team's scope is neither taken nor told apart (docs/security.md, "What one
//! team can learn of another").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proxy_operator::leasing::leases::api::{GATEWAY_TOKEN_HEADER, GatewayAccess};
use proxy_operator::leasing::leases::{
    self, Discovery, LeaseMetrics, LeaseOptions, LeaseStore, ProvisionedProxy,
};
use proxy_operator::provider::credentials::ProxyLogin;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::auth::{as_the_operator, control_plane, grant_leases, options, proxy, service_account};

const AUDIENCE: &str = "proxy-operator";
const GATEWAY: &str = "gateway-s3cret";

/// The ServiceAccount, Role and RoleBinding of docs/tenancy.md's "Set up a new team" block,
/// created as written but in `ns` (the Namespace is `ns` itself; the ProxyPool is the operator's
/// to serve, which this test's table stands in for). The block says `team-a`, `crawler`,
/// `pool-a`: the names this test leases with.
async fn apply_the_docs_new_team_block(ns: &harness::TestNamespace) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tenancy.md"),
    )
    .unwrap();
    let section = docs
        .split("## Set up a new team")
        .nth(1)
        .expect("docs/tenancy.md has a section \"Set up a new team\"");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the section's yaml block");
    let block = block.replace("team-a", ns.name());
    let mut made = Vec::new();
    for document in block.split("\n---\n") {
        let object: Value = proxy_operator::support::yaml::from_str(document).unwrap();
        let post = PostParams::default();
        match object["kind"].as_str().unwrap() {
            "ServiceAccount" => {
                let sa: ServiceAccount = serde_json::from_value(object).unwrap();
                ns.api::<ServiceAccount>().create(&post, &sa).await.unwrap();
            }
            "Role" => {
                let role: Role = serde_json::from_value(object).unwrap();
                ns.api::<Role>().create(&post, &role).await.unwrap();
            }
            "RoleBinding" => {
                let binding: RoleBinding = serde_json::from_value(object).unwrap();
                ns.api::<RoleBinding>()
                    .create(&post, &binding)
                    .await
                    .unwrap();
            }
            "Namespace" | "ProxyPool" => continue,
            other => panic!("docs/tenancy.md's block has a {other}: apply it here too"),
        }
        made.push(
            document
                .lines()
                .find(|l| l.starts_with("kind:"))
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert_eq!(
        made,
        ["kind: ServiceAccount", "kind: Role", "kind: RoleBinding"],
        "the block's RBAC, as this test applies it"
    );
}

/// An answer, as a probing client sees all of it.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
    text: String,
}

impl Answer {
    /// What must not differ between two probes: status, headers that tell state, the problem's
    /// type and title, the detail with the probed name taken out.
    fn shape(&self, probed: &str) -> (StatusCode, Option<String>, Value, Value, String) {
        (
            self.status,
            self.retry_after.clone(),
            self.body["type"].clone(),
            self.body["title"].clone(),
            self.body["detail"]
                .as_str()
                .unwrap_or_default()
                .replace(probed, "<probed>"),
        )
    }

    fn kind(&self) -> &str {
        self.body["type"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("urn:proxy-operator:problem:")
    }
}

struct Served {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn call(
    addr: SocketAddr,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
    gateway: bool,
) -> Answer {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .bearer_auth(token);
    if gateway {
        request = request.header(GATEWAY_TOKEN_HEADER, GATEWAY);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        retry_after,
        body,
        text,
    }
}

/// A healthy proxy of `pool` that requires its own login (so a `proxyUrl` carries a password).
fn with_login(namespace: &str, name: &str, pool: &str) -> (ProvisionedProxy, ProxyLogin) {
    let login = ProxyLogin::generate(name);
    let entry = ProvisionedProxy {
        login: Some(login.clone()),
        ..proxy(namespace, name, pool)
    };
    (entry, login)
}

/// A grant body from B's pool and the proxy it names.
type Body = fn(&str, &str) -> Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_teams_never_take_join_or_read_each_others_proxies() {
    let cp = control_plane().await;
    let (a, b) = (
        cp.namespace("team-a").await.unwrap(),
        cp.namespace("team-b").await.unwrap(),
    );
    // Team A as docs/tenancy.md sets a team up (its copy-paste block, in A's namespace); team B
    // by the same rights written here.
    apply_the_docs_new_team_block(&a).await;
    service_account(&b, "crawler").await;
    grant_leases(&b, "lease-pool-b", Some(&["pool-b"]), b.name(), "crawler").await;
    let token_a = a
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();
    let token_b = b
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();

    let mut fleet = Vec::new();
    let mut passwords = Vec::new();
    for (ns, name, pool) in [
        (a.name(), "px-a1", "pool-a"),
        (a.name(), "px-a2", "pool-a"),
        (a.name(), "px-a3", "pool-a"),
        (b.name(), "px-b1", "pool-b"),
        (b.name(), "px-b2", "pool-b"),
    ] {
        let (entry, login) = with_login(ns, name, pool);
        fleet.push(entry);
        passwords.push((name, login.password().to_string()));
    }
    let store = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.restore(Default::default());
    store.set_provisioned(fleet);
    let auth = as_the_operator(
        cp,
        options(Duration::from_secs(20), Duration::from_millis(200)),
    );
    let discovery = Discovery::with_auth(store, auth).serving_the_gateway(GatewayAccess {
        token: GATEWAY.into(),
        max_connections_per_proxy: 2,
        block_statuses: vec![403, 429],
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Served {
        task: tokio::spawn(leases::serve(listener, leases::router(Arc::new(discovery)))),
    };
    let post = reqwest::Method::POST;
    let grant = |token: &str, body: Value| {
        let token = token.to_string();
        async move {
            call(
                addr,
                reqwest::Method::POST,
                "/v1/leases",
                &token,
                Some(body),
                false,
            )
            .await
        }
    };
    let (pool_a, pool_b) = (
        format!("{}/pool-a", a.name()),
        format!("{}/pool-b", b.name()),
    );

    // A leases for its session `shop1`.
    let by_a = grant(&token_a, json!({"pool": pool_a, "session": "shop1"})).await;
    assert_eq!(by_a.status, StatusCode::CREATED, "{}", by_a.text);
    let id_a = by_a.body["id"].as_str().unwrap().to_string();
    let leased = by_a.body["proxy"]["name"].as_str().unwrap().to_string();
    let password_a = &passwords.iter().find(|(n, _)| *n == leased).unwrap().1;
    assert!(
        by_a.text.contains(password_a.as_str()),
        "A's proxyUrl has its login"
    );

    // A second proxy of A's cools down after a block; a third stays free.
    let cooled = grant(&token_a, json!({"pool": pool_a})).await;
    assert_eq!(cooled.status, StatusCode::CREATED, "{}", cooled.text);
    let cooled_id = cooled.body["id"].as_str().unwrap().to_string();
    let cooling = cooled.body["proxy"]["name"].as_str().unwrap().to_string();
    let report = call(
        addr,
        post.clone(),
        &format!("/v1/leases/{cooled_id}/report"),
        &token_a,
        Some(json!({"outcome": "blocked"})),
        false,
    )
    .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.text);
    let free = ["px-a1", "px-a2", "px-a3"]
        .into_iter()
        .find(|n| *n != leased && *n != cooling)
        .unwrap();

    // B's grant for its own pool naming A's proxy and A's session: the out-of-scope answer,
    // never A's lease.
    let takeover = grant(
        &token_b,
        json!({"pool": pool_b, "proxy": format!("{}/{leased}", a.name()), "session": "shop1"}),
    )
    .await;
    assert_eq!(takeover.status, StatusCode::NOT_FOUND, "{}", takeover.text);
    assert_eq!(takeover.kind(), "proxy-not-found");
    assert!(!takeover.text.contains(&id_a), "{}", takeover.text);
    assert!(!takeover.text.contains(password_a.as_str()));
    assert!(!takeover.text.contains("proxyUrl"));

    // B's probes of A's leased, cooling, free and non-existent proxies: one answer each way.
    let probed = [leased.as_str(), cooling.as_str(), free, "ghost"];
    let ways: [(&str, Body); 3] = [
        (
            "B's pool naming A's proxy",
            |pool_b, proxy| json!({"pool": pool_b, "proxy": proxy}),
        ),
        (
            "B's pool naming A's proxy and a session",
            |pool_b, proxy| json!({"pool": pool_b, "proxy": proxy, "session": "shop1"}),
        ),
        (
            "A's proxy without a pool",
            |_, proxy| json!({"proxy": proxy, "session": "shop1"}),
        ),
    ];
    for (way, body) in ways {
        let mut shapes = Vec::new();
        for name in probed {
            let named = format!("{}/{name}", a.name());
            let answer = grant(&token_b, body(&pool_b, &named)).await;
            assert!(
                answer.status.is_client_error(),
                "{way} {name}: {}",
                answer.text
            );
            assert!(answer.retry_after.is_none(), "{way} {name}: {answer:?}");
            assert!(!answer.text.contains(&id_a));
            shapes.push((name, answer.shape(&named)));
        }
        for (name, shape) in &shapes[1..] {
            assert_eq!(
                shape, &shapes[0].1,
                "{way}: {name} told apart from {}",
                shapes[0].0
            );
        }
    }

    // Both teams' `shop1`: two sessions, each bound to its own pool.
    let by_b = grant(&token_b, json!({"pool": pool_b, "session": "shop1"})).await;
    assert_eq!(by_b.status, StatusCode::CREATED, "{}", by_b.text);
    assert_ne!(by_b.body["id"], id_a.as_str());
    assert_eq!(by_b.body["pool"], pool_b.as_str());
    assert_eq!(by_b.body["proxy"]["namespace"], b.name());
    let again_a = grant(&token_a, json!({"pool": pool_a, "session": "shop1"})).await;
    assert_eq!(
        again_a.status,
        StatusCode::OK,
        "A joins its own: {}",
        again_a.text
    );
    assert_eq!(again_a.body["id"], id_a.as_str());
    assert_eq!(again_a.body["pool"], pool_a.as_str());
    let again_b = grant(&token_b, json!({"pool": pool_b, "session": "shop1"})).await;
    assert_eq!(
        again_b.status,
        StatusCode::OK,
        "B joins its own: {}",
        again_b.text
    );
    assert_eq!(again_b.body["id"], by_b.body["id"]);

    // A's lease ids are nobody else's: live, ended or never granted, one answer to B; A's
    // lease is untouched.
    let unknown = "0123456789abcdef0123456789abcdef";
    for (method, suffix, body) in [
        (reqwest::Method::GET, "", None),
        (post.clone(), "/renew", Some(json!({}))),
        (post.clone(), "/report", Some(json!({"outcome": "blocked"}))),
        (reqwest::Method::DELETE, "", None),
    ] {
        let mut shapes = Vec::new();
        for id in [id_a.as_str(), cooled_id.as_str(), unknown] {
            let path = format!("/v1/leases/{id}{suffix}");
            let answer = call(addr, method.clone(), &path, &token_b, body.clone(), false).await;
            assert!(
                !answer.text.contains(password_a.as_str()),
                "{method} {path}"
            );
            shapes.push(answer.shape(id));
        }
        assert_eq!(
            shapes[0], shapes[2],
            "{method} {suffix}: A's live lease told apart"
        );
        assert_eq!(
            shapes[1], shapes[2],
            "{method} {suffix}: A's ended lease told apart"
        );
    }
    let still = call(
        addr,
        reqwest::Method::GET,
        &format!("/v1/leases/{id_a}"),
        &token_a,
        None,
        false,
    )
    .await;
    assert_eq!(still.status, StatusCode::OK, "{}", still.text);
    let ended = call(
        addr,
        reqwest::Method::GET,
        &format!("/v1/leases/{cooled_id}"),
        &token_a,
        None,
        false,
    )
    .await;
    assert_eq!(
        ended.status,
        StatusCode::GONE,
        "its holder is told: {}",
        ended.text
    );

    // Through the gateway's door: routes stay in each team's pool for the same session key,
    // another team's pool is refused before anything is looked at, and a client's report on
    // its session lands on its own proxy.
    let route = |token: &str, body: Value| {
        let token = token.to_string();
        async move {
            call(
                addr,
                reqwest::Method::POST,
                "/v1/gateway/routes",
                &token,
                Some(body),
                true,
            )
            .await
        }
    };
    let routed_b = route(
        &token_b,
        json!({"replica": "gw-0", "pool": pool_b, "session": "shop1"}),
    )
    .await;
    assert_eq!(routed_b.status, StatusCode::OK, "{}", routed_b.text);
    assert_eq!(routed_b.body["proxy"]["namespace"], b.name());
    assert_eq!(routed_b.body["pool"], pool_b.as_str());
    let routed_a = route(
        &token_a,
        json!({"replica": "gw-0", "pool": pool_a, "session": "shop1"}),
    )
    .await;
    assert_eq!(routed_a.status, StatusCode::OK, "{}", routed_a.text);
    assert_eq!(routed_a.body["proxy"]["namespace"], a.name());
    assert!(!routed_b.text.contains(password_a.as_str()));
    let mut refusals = Vec::new();
    for body in [
        json!({"replica": "gw-0", "pool": pool_a, "session": "shop1"}),
        json!({"replica": "gw-0", "pool": format!("{}/no-such-pool", a.name()), "session": "shop1"}),
    ] {
        let answer = route(&token_b, body).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text);
        assert!(answer.retry_after.is_none());
        refusals.push(answer.kind().to_string());
    }
    assert_eq!(refusals, ["forbidden", "forbidden"]);
    let landed = call(
        addr,
        post.clone(),
        "/v1/gateway/session-reports",
        &token_b,
        Some(json!({"session": "shop1", "outcome": "failure"})),
        true,
    )
    .await;
    assert_eq!(landed.status, StatusCode::OK, "{}", landed.text);
    let routed_to = format!(
        "{}/{}",
        b.name(),
        routed_b.body["proxy"]["name"].as_str().unwrap()
    );
    assert_eq!(landed.body["proxy"], routed_to.as_str(), "B's own proxy");
    drop(served);
}
