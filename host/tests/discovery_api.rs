//! The discovery API over real HTTP on loopback, as a crawler uses it: grant, report, release,
//! cooldown, expiry, refusals, auth, bad input, concurrency. The pool is set directly here (the
//! health engine's part is tested against real squid in the operator tests).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proxy_operator::leasing::leases::api::{GATEWAY_TOKEN_HEADER, GatewayAccess};
use proxy_operator::leasing::leases::{
    self, Discovery, LeaseMetrics, LeaseOptions, LeaseStore, ProvisionedProxy, ProxyKey,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

// Who may lease what: ServiceAccount tokens and RBAC against a real API server.
#[path = "discovery_api/auth.rs"]
mod auth;
#[path = "discovery_api/browser.rs"]
mod browser;
// A team's gateway credential: a watched Secret, with curl, requests and Chromium.
#[path = "discovery_api/credentials.rs"]
mod credentials;
#[path = "discovery_api/dataplane.rs"]
mod dataplane;
#[path = "discovery_api/gateway.rs"]
mod gateway;
// The gateway in front of SOCKS5 upstreams (dante, microsocks).
#[path = "discovery_api/socks5_upstream.rs"]
mod socks5_upstream;
// The metrics port behind TokenReview + SubjectAccessReview, against the real API server.
#[path = "discovery_api/metrics_auth.rs"]
mod metrics_auth;
// Two teams on one fleet: what one may lease, join and learn of the other's.
#[path = "discovery_api/tenancy.rs"]
mod tenancy;
#[path = "common/test_ca.rs"]
mod test_ca;
// The API over TLS: trusted, refused, renewed; the gateway trusting its CA.
#[path = "discovery_api/tls.rs"]
mod tls;

const TOKEN: &str = "s3cret-token";
const GATEWAY_TOKEN: &str = "gateway-s3cret";

struct Api {
    addr: SocketAddr,
    http: reqwest::Client,
    store: Arc<LeaseStore>,
    suspects: tokio::sync::mpsc::Receiver<ProxyKey>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Api {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn entry(name: &str, healthy: bool) -> ProvisionedProxy {
    ProvisionedProxy {
        key: key(name),
        provider: if name.starts_with("gcp") {
            "gcp-eu"
        } else {
            "kvm-home"
        }
        .into(),
        zone: Some(
            if name.ends_with('b') {
                "zone-b"
            } else {
                "zone-a"
            }
            .into(),
        ),
        labels: BTreeMap::from([("tier".to_string(), "cheap".to_string())]),
        address: "127.0.0.1".into(),
        port: 3128,
        exit_ip: name.starts_with("gcp").then(|| "203.0.113.7".to_string()),
        healthy,
        pool: None,
        draining: false,
        login: None,
        protocol: Default::default(),
    }
}

/// A healthy proxy of ProxyPool `crawlers/{pool}`.
fn pooled(name: &str, pool: &str) -> ProvisionedProxy {
    ProvisionedProxy {
        pool: Some(pool.into()),
        ..entry(name, true)
    }
}

fn key(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "crawlers".into(),
        name: name.into(),
    }
}

async fn serve(options: LeaseOptions, pool: Vec<ProvisionedProxy>) -> Api {
    let (tx, suspects) = tokio::sync::mpsc::channel(16);
    let store = Arc::new(LeaseStore::new(
        options,
        LeaseMetrics::unregistered().unwrap(),
        Some(tx),
    ));
    store.restore(Default::default());
    store.set_provisioned(pool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let discovery = Discovery::new(store.clone(), TOKEN).serving_the_gateway(GatewayAccess {
        token: GATEWAY_TOKEN.into(),
        max_connections_per_proxy: 2,
        block_statuses: vec![403, 429],
    });
    let app = leases::router(Arc::new(discovery));
    // The operator's own server (`leases::serve`, as `proxy-operator run` serves the API).
    let server = tokio::spawn(leases::serve(listener, app));
    let expiry = tokio::spawn(leases::persist::expire_leases(store.clone()));
    Api {
        addr,
        http: reqwest::Client::new(),
        store,
        suspects,
        tasks: vec![server, expiry],
    }
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Reply {
    /// The answer, its body parsed as JSON (`null` when empty).
    async fn of(response: reqwest::Response) -> Reply {
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts an RFC 9457 problem of `kind` with this status.
    fn assert_problem(&self, status: StatusCode, kind: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        assert_eq!(
            self.body["type"],
            format!("urn:proxy-operator:problem:{kind}")
        );
        assert_eq!(self.body["status"], status.as_u16());
    }

    fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After: {}", self.body))
            .parse()
            .unwrap()
    }
}

impl Api {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<String>) -> Reply {
        self.send_as(method, path, body, Some(TOKEN)).await
    }

    async fn send_as(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
        token: Option<&str>,
    ) -> Reply {
        let mut request = self
            .http
            .request(method, format!("http://{}{path}", self.addr));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        Reply::of(request.send().await.unwrap()).await
    }

    /// A call to the gateway's door: with the gateway token (`gateway`) and a client token.
    async fn gateway(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
        gateway: Option<&str>,
        client: Option<&str>,
    ) -> Reply {
        let mut request = self
            .http
            .request(method, format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(token) = gateway {
            request = request.header(GATEWAY_TOKEN_HEADER, token);
        }
        if let Some(token) = client {
            request = request.bearer_auth(token);
        }
        Reply::of(request.send().await.unwrap()).await
    }

    /// The gateway's route for `body`, answered 200; the proxy's name.
    async fn route(&self, body: Value) -> String {
        let reply = self
            .gateway(
                reqwest::Method::POST,
                "/v1/gateway/routes",
                body,
                Some(GATEWAY_TOKEN),
                Some(TOKEN),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body["proxy"]["name"].as_str().unwrap().to_string()
    }

    async fn grant(&self, body: Value) -> Reply {
        self.send(reqwest::Method::POST, "/v1/leases", Some(body.to_string()))
            .await
    }

    async fn report(&self, id: &str, outcome: &str) -> Reply {
        self.send(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/report"),
            Some(json!({ "outcome": outcome }).to_string()),
        )
        .await
    }

    async fn show(&self, id: &str) -> Reply {
        self.send(reqwest::Method::GET, &format!("/v1/leases/{id}"), None)
            .await
    }

    async fn renew(&self, id: &str, body: Value) -> Reply {
        self.send(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/renew"),
            Some(body.to_string()),
        )
        .await
    }

    async fn release(&self, id: &str) -> Reply {
        self.send(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
            .await
    }

    async fn proxy_state(&self, name: &str) -> String {
        let reply = self.send(reqwest::Method::GET, "/v1/proxies", None).await;
        assert_eq!(reply.status, StatusCode::OK);
        reply.body["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| p["state"].as_str().unwrap().to_string())
            .unwrap_or_else(|| "absent".into())
    }
}

fn options() -> LeaseOptions {
    LeaseOptions {
        default_ttl: Duration::from_secs(300),
        max_ttl: Duration::from_secs(600),
        cooldown: Duration::from_secs(120),
        failure_threshold: 3,
        ..LeaseOptions::default()
    }
}

#[tokio::test]
async fn lease_lifecycle_grant_report_block_cooldown_release() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;

    let granted = api.grant(json!({ "ttlSeconds": 99_999 })).await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    let id = granted.body["id"].as_str().unwrap().to_string();
    assert_eq!(
        granted.header("location"),
        Some(format!("/v1/leases/{id}").as_str())
    );
    assert_eq!(granted.body["proxyUrl"], "http://127.0.0.1:3128");
    assert_eq!(granted.body["proxy"]["name"], "kvm-1");
    assert_eq!(granted.body["proxy"]["provider"], "kvm-home");
    assert_eq!(granted.body["ttlSeconds"], 600, "clamped to the maximum");
    assert_eq!(api.proxy_state("kvm-1").await, "leased");

    // The only proxy is leased: nothing left, and the answer says when to come back.
    let none = api.grant(json!({})).await;
    none.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    assert!((1..=60).contains(&none.retry_after()));

    let ok = api.report(&id, "success").await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(ok.body["active"], true);

    let blocked = api.report(&id, "blocked").await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    assert_eq!(blocked.body["active"], false);
    assert_eq!(api.proxy_state("kvm-1").await, "coolingDown");

    // Cooling down: by name 409 with Retry-After, any proxy 503.
    let by_name = api.grant(json!({ "proxy": "crawlers/kvm-1" })).await;
    by_name.assert_problem(StatusCode::CONFLICT, "proxy-cooling-down");
    assert!((110..=120).contains(&by_name.retry_after()));
    api.grant(json!({}))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");

    // The lease ended with the block: its holder is told so.
    api.report(&id, "success")
        .await
        .assert_problem(StatusCode::GONE, "lease-ended");
    // Release is idempotent, also for an ended or unknown lease.
    assert_eq!(api.release(&id).await.status, StatusCode::NO_CONTENT);
    assert_eq!(api.release(&id).await.status, StatusCode::NO_CONTENT);
    let no_such_lease = "0".repeat(32);
    assert_eq!(
        api.release(&no_such_lease).await.status,
        StatusCode::NO_CONTENT
    );
    api.report(&no_such_lease, "success")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "lease-not-found");
}

#[tokio::test]
async fn release_returns_the_proxy_and_filters_choose_the_proxy() {
    let api = serve(
        options(),
        vec![
            entry("kvm-1", true),
            entry("gcp-1b", true),
            entry("kvm-2", false),
        ],
    )
    .await;
    let gcp = api.grant(json!({ "provider": "gcp-eu" })).await;
    assert_eq!(gcp.status, StatusCode::CREATED, "{}", gcp.body);
    assert_eq!(gcp.body["proxy"]["name"], "gcp-1b");
    // The exit IP is in the answer when the health engine learned it, and absent otherwise.
    assert_eq!(gcp.body["proxy"]["exitIP"], "203.0.113.7");
    api.grant(json!({ "zone": "zone-b" }))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    // Labels no proxy has: waiting will not help (before pools this was a 503).
    api.grant(json!({ "selector": { "tier": "premium" } }))
        .await
        .assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "no-matching-proxy");
    // The unhealthy proxy is never handed out, not even by name.
    api.grant(json!({ "proxy": "crawlers/kvm-2" }))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    api.grant(json!({ "proxy": "crawlers/ghost" }))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "proxy-not-found");
    let kvm = api.grant(json!({ "selector": { "tier": "cheap" } })).await;
    assert_eq!(kvm.body["proxy"]["name"], "kvm-1");
    assert!(kvm.body["proxy"].get("exitIP").is_none(), "{}", kvm.body);
    api.grant(json!({ "proxy": "crawlers/kvm-1" }))
        .await
        .assert_problem(StatusCode::CONFLICT, "proxy-leased");

    let id = kvm.body["id"].as_str().unwrap();
    assert_eq!(api.release(id).await.status, StatusCode::NO_CONTENT);
    assert_eq!(api.proxy_state("kvm-1").await, "available");
    assert_eq!(api.proxy_state("kvm-2").await, "unhealthy");
    let again = api.grant(json!({ "provider": "kvm-home" })).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.body["proxy"]["name"], "kvm-1");
}

#[tokio::test]
async fn an_expired_lease_returns_its_proxy_to_the_pool() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    // JSON Schema's `integer` (the document's type for ttlSeconds) admits 1.0: so does the API.
    let granted = api.grant(json!({ "ttlSeconds": 1.0 })).await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    assert_eq!(granted.body["ttlSeconds"], 1);
    let id = granted.body["id"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.proxy_state("kvm-1").await != "available" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = api.report(&id, "success").await;
    reply.assert_problem(StatusCode::GONE, "lease-ended");
    assert!(reply.body["detail"].as_str().unwrap().contains("expired"));
    assert_eq!(
        api.grant(json!({})).await.status,
        StatusCode::CREATED,
        "the proxy is leasable again"
    );
}

#[tokio::test]
async fn a_proxy_that_turns_unhealthy_or_is_deleted_ends_its_lease() {
    let api = serve(options(), vec![entry("kvm-1", true), entry("kvm-2", true)]).await;
    let first = api.grant(json!({ "proxy": "crawlers/kvm-1" })).await;
    let second = api.grant(json!({ "proxy": "crawlers/kvm-2" })).await;
    api.store.set_provisioned(vec![entry("kvm-1", false)]); // kvm-1 unhealthy, kvm-2 deleted
    let unhealthy = api
        .report(first.body["id"].as_str().unwrap(), "success")
        .await;
    unhealthy.assert_problem(StatusCode::GONE, "lease-ended");
    assert!(
        unhealthy.body["detail"]
            .as_str()
            .unwrap()
            .contains("health probes")
    );
    let deleted = api
        .report(second.body["id"].as_str().unwrap(), "failure")
        .await;
    deleted.assert_problem(StatusCode::GONE, "lease-ended");
    assert!(deleted.body["detail"].as_str().unwrap().contains("deleted"));
    assert_eq!(api.proxy_state("kvm-2").await, "absent");
}

#[tokio::test]
async fn repeated_failure_reports_ask_the_health_engine_for_a_probe() {
    let mut api = serve(options(), vec![entry("kvm-1", true)]).await;
    let granted = api.grant(json!({})).await;
    let id = granted.body["id"].as_str().unwrap().to_string();
    for _ in 0..2 {
        assert_eq!(api.report(&id, "failure").await.status, StatusCode::OK);
    }
    assert!(
        api.suspects.try_recv().is_err(),
        "two failures are not yet a pattern"
    );
    assert_eq!(api.report(&id, "failure").await.status, StatusCode::OK);
    assert_eq!(api.suspects.try_recv().unwrap(), key("kvm-1"));
}

#[tokio::test]
async fn missing_or_wrong_token_is_401_with_www_authenticate() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    for token in [None, Some("wrong"), Some("")] {
        let reply = api
            .send_as(reqwest::Method::GET, "/v1/proxies", None, token)
            .await;
        reply.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"proxy-operator\"")
        );
    }
    let reply = api
        .send_as(
            reqwest::Method::POST,
            "/v1/leases",
            Some("{}".into()),
            Some("s3cret-token-but-longer"),
        )
        .await;
    reply.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    assert_eq!(
        api.proxy_state("kvm-1").await,
        "available",
        "nothing granted"
    );
}

#[tokio::test]
async fn bad_input_is_a_4xx_problem_naming_the_field_never_a_500() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    let granted = api.grant(json!({})).await;
    let id = granted.body["id"].as_str().unwrap().to_string();
    let report_path = format!("/v1/leases/{id}/report");
    let cases: Vec<(&str, String, String, StatusCode, &str, &str)> = vec![
        (
            "malformed JSON",
            "/v1/leases".into(),
            "{\"ttlSeconds\": ".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "EOF while parsing",
        ),
        (
            "an array for a body (serde would read it as a struct)",
            report_path.replace("/report", "/renew"),
            "[]".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "body: must be a JSON object",
        ),
        (
            "a string for a body",
            "/v1/leases".into(),
            "\"x\"".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "body: must be a JSON object",
        ),
        (
            "wrong type",
            "/v1/leases".into(),
            "{\"ttlSeconds\": \"ten\"}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttlSeconds",
        ),
        (
            "wrong type after good fields",
            "/v1/leases".into(),
            "{\"pool\": \"a/b\", \"session\": \"s\", \"ttlSeconds\": \"ten\"}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttlSeconds: invalid type",
        ),
        (
            "a fraction of a second",
            "/v1/leases".into(),
            "{\"ttlSeconds\": 1.5}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttlSeconds: invalid value: 1.5, expected a whole number",
        ),
        (
            "a negative ttl",
            "/v1/leases".into(),
            "{\"ttlSeconds\": -3}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttlSeconds: invalid value: -3",
        ),
        (
            "an empty target",
            "/v1/leases".into(),
            "{\"target\": \"\"}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "target: must not be empty",
        ),
        (
            "wrong type of a label",
            "/v1/leases".into(),
            "{\"selector\": {\"tier\": 5}}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "selector.tier: invalid type",
        ),
        (
            "unknown field",
            "/v1/leases".into(),
            "{\"ttl\": 10}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttl",
        ),
        (
            "zero ttl",
            "/v1/leases".into(),
            "{\"ttlSeconds\": 0}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "ttlSeconds",
        ),
        (
            "bad proxy name",
            "/v1/leases".into(),
            "{\"proxy\": \"kvm-1\"}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "namespace/name",
        ),
        (
            "unknown outcome",
            report_path.clone(),
            "{\"outcome\": \"meh\"}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "outcome",
        ),
        (
            "missing outcome",
            report_path.clone(),
            "{}".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "outcome",
        ),
        (
            "not an object",
            report_path.clone(),
            "[1,2]".into(),
            StatusCode::BAD_REQUEST,
            "bad-request",
            "body",
        ),
        (
            "oversized body",
            "/v1/leases".into(),
            format!("{{\"zone\": \"{}\"}}", "z".repeat(20_000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "16384",
        ),
    ];
    for (what, path, body, status, kind, mentions) in cases {
        let reply = api.send(reqwest::Method::POST, &path, Some(body)).await;
        reply.assert_problem(status, kind);
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.contains(mentions),
            "{what}: detail `{detail}` should mention `{mentions}`"
        );
    }
    api.send(reqwest::Method::GET, "/v1/nothing", None)
        .await
        .assert_problem(StatusCode::NOT_FOUND, "not-found");
    api.send(reqwest::Method::PUT, "/v1/leases", None)
        .await
        .assert_problem(StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed");
    // Still serving, and the lease survived the noise.
    assert_eq!(api.report(&id, "success").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_clients_never_share_a_proxy() {
    let pool: Vec<ProvisionedProxy> = (0..64).map(|i| entry(&format!("kvm-{i}"), true)).collect();
    let api = Arc::new(serve(options(), pool).await);
    // 96 clients for 64 proxies: 64 distinct grants, 32 refusals, never a duplicate.
    let clients: Vec<_> = (0..96)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.grant(json!({})).await })
        })
        .collect();
    let mut granted = HashSet::new();
    let mut refused = 0;
    for client in clients {
        let reply = client.await.unwrap();
        match reply.status {
            StatusCode::CREATED => {
                let name = reply.body["proxy"]["name"].as_str().unwrap().to_string();
                assert!(granted.insert(name.clone()), "{name} granted twice");
            }
            StatusCode::SERVICE_UNAVAILABLE => refused += 1,
            other => panic!("unexpected {other}: {}", reply.body),
        }
    }
    assert_eq!((granted.len(), refused), (64, 32));
}

#[tokio::test]
async fn the_openapi_document_is_served_and_covers_every_route() {
    let api = serve(options(), vec![]).await;
    let reply = api
        .send_as(reqwest::Method::GET, "/openapi.json", None, None)
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let committed: Value = serde_json::from_str(leases::api::OPENAPI).unwrap();
    assert_eq!(reply.body, committed);
    assert_eq!(committed["openapi"], "3.1.0");
    let paths = committed["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/leases", "post"),
        ("/v1/leases/{id}", "get"),
        ("/v1/leases/{id}", "delete"),
        ("/v1/leases/{id}/renew", "post"),
        ("/v1/leases/{id}/report", "post"),
        ("/v1/proxies", "get"),
        ("/openapi.json", "get"),
    ] {
        assert!(
            paths[path][method].is_object(),
            "{method} {path} not documented"
        );
    }
    // Every problem type the API answers is listed, and nothing else.
    let documented: HashSet<&str> =
        committed["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
    let source = [
        include_str!("../src/leasing/leases/api.rs"),
        include_str!("../src/leasing/leases/api/problems.rs"),
    ]
    .concat();
    let answered: HashSet<String> = source
        .split("StatusCode::")
        .skip(1)
        .filter_map(|rest| {
            // `Problem::new(StatusCode::X,\n "kind",` — the string right after the status.
            let after = rest.split_once(",")?.1.trim_start();
            let kind = after.strip_prefix('"')?.split('"').next()?;
            Some(format!("urn:proxy-operator:problem:{kind}"))
        })
        .collect();
    assert!(answered.len() >= 12, "scan found {answered:?}");
    let answered: HashSet<&str> = answered.iter().map(String::as_str).collect();
    assert_eq!(answered, documented);
}

/// Whether the OpenAPI document lists `status` (or a `default`) for `method path`.
fn documented(doc: &Value, path: &str, method: &str, status: StatusCode) -> bool {
    let responses = &doc["paths"][path][method]["responses"];
    responses.get(status.as_str()).is_some() || responses.get("default").is_some()
}

/// The corners of the contract: every answer, even to a request the router never sees whole, is
/// a problem listed in the OpenAPI document, and the document says what the server checks.
#[tokio::test]
async fn every_refusal_is_a_documented_problem() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    let doc: Value = serde_json::from_str(leases::api::OPENAPI).unwrap();
    let id_pattern = doc["components"]["parameters"]["LeaseId"]["schema"]["pattern"]
        .as_str()
        .expect("the lease id has a pattern");
    assert_eq!(id_pattern, "^[0-9a-f]{32}$");
    let proxy_pattern =
        doc["components"]["schemas"]["LeaseRequest"]["properties"]["proxy"]["pattern"]
            .as_str()
            .expect("proxy has a pattern");
    assert_eq!(proxy_pattern, "^[^/]+/[^/]+$");

    // (what, method, path, documented as: path and operation, status, problem)
    type Case<'a> = (
        &'a str,
        reqwest::Method,
        &'a str,
        (&'a str, &'a str),
        StatusCode,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "id not UTF-8 (release)",
            reqwest::Method::DELETE,
            "/v1/leases/%ff",
            ("/v1/leases/{id}", "delete"),
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "id not UTF-8 (report)",
            reqwest::Method::POST,
            "/v1/leases/%ff/report",
            ("/v1/leases/{id}/report", "post"),
            StatusCode::BAD_REQUEST,
            "bad-request",
        ),
        (
            "unknown path",
            reqwest::Method::GET,
            "/v1/nothing",
            // The fallbacks answer for any path: every operation's `default` covers them.
            ("/v1/leases", "post"),
            StatusCode::NOT_FOUND,
            "not-found",
        ),
        (
            "unknown method",
            reqwest::Method::PUT,
            "/v1/leases",
            ("/v1/leases", "post"),
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
        ),
    ];
    for (what, method, path, (template, operation), status, kind) in cases {
        let reply = api
            .send(
                method.clone(),
                path,
                (method == reqwest::Method::POST).then(|| "{\"outcome\":\"success\"}".into()),
            )
            .await;
        reply.assert_problem(status, kind);
        if status == StatusCode::BAD_REQUEST {
            let detail = reply.body["detail"].as_str().unwrap();
            assert!(detail.starts_with("id: "), "{what}: {detail}");
        }
        assert!(
            documented(&doc, template, operation, status),
            "{what}: {status} not documented for {operation} {template}"
        );
    }

    // An id of another shape is refused, naming it, on every lease path; a well-formed one that
    // is no lease is still released idempotently.
    for (method, path) in [
        (reqwest::Method::DELETE, "/v1/leases/not-a-lease"),
        (reqwest::Method::GET, "/v1/leases/not-a-lease"),
        (reqwest::Method::DELETE, "/v1/leases/%C2%84"),
        (
            reqwest::Method::POST,
            "/v1/leases/0123456789ABCDEF0123456789ABCDEF/renew",
        ),
    ] {
        let reply = api.send(method.clone(), path, None).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("id: ") && detail.contains("32 lowercase hex"),
            "{method} {path}: {detail}"
        );
    }
    assert_eq!(
        api.release(&"f".repeat(32)).await.status,
        StatusCode::NO_CONTENT
    );

    // Too many headers: a problem too, not hyper's empty 431.
    let mut request = api
        .http
        .post(format!("http://{}/v1/leases", api.addr))
        .bearer_auth(TOKEN);
    for i in 0..500 {
        request = request.header(format!("x-filler-{i}"), "1");
    }
    let response = request.send().await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null);
    assert_eq!(body["type"], "urn:proxy-operator:problem:headers-too-large");
    assert!(documented(
        &doc,
        "/v1/leases",
        "post",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    ));

    // Every operation has a `default` problem, for the fallback answers.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert_eq!(
                operation["responses"]["default"]["$ref"], "#/components/responses/Problem",
                "{method} {path}"
            );
        }
    }

    // One rule for optional fields: `null` is the same as absent, for every one of them.
    let granted = api
        .grant(json!({
            "provider": null, "zone": null, "selector": null, "proxy": null, "ttlSeconds": null
        }))
        .await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    let id = granted.body["id"].as_str().unwrap();
    assert!(
        id.len() == 32
            && id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "lease ids match the documented pattern: {id}"
    );
    for (field, schema) in doc["components"]["schemas"]["LeaseRequest"]["properties"]
        .as_object()
        .unwrap()
    {
        let null = json!("null");
        let types = schema["type"].as_array();
        let alternatives = schema["anyOf"].as_array();
        assert!(
            types.is_some_and(|t| t.contains(&null))
                || alternatives.is_some_and(|a| a.iter().any(|s| s["type"] == null)),
            "{field}: the document says whether null is allowed: {schema}"
        );
    }
    assert_eq!(api.release(id).await.status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn before_restore_the_store_refuses_with_503() {
    let store = Arc::new(LeaseStore::new(
        options(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.set_provisioned(vec![entry("kvm-1", true)]);
    let request = leases::LeaseRequest::default();
    assert!(matches!(
        store.grant(&request),
        Err(leases::store::GrantError::NotReady)
    ));
    store.restore(Default::default());
    assert!(store.grant(&request).is_ok());
}

fn id_of(reply: &Reply) -> String {
    reply.body["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no lease: {} {}", reply.status, reply.body))
        .to_string()
}

#[tokio::test]
async fn pools_select_and_unknown_or_unmatchable_requests_say_so() {
    let api = serve(
        options(),
        vec![
            pooled("kvm-1", "fast"),
            pooled("kvm-2", "slow"),
            entry("kvm-3", true),
        ],
    )
    .await;
    let fast = api.grant(json!({ "pool": "crawlers/fast" })).await;
    assert_eq!(fast.status, StatusCode::CREATED, "{}", fast.body);
    assert_eq!(fast.body["proxy"]["name"], "kvm-1");
    assert_eq!(fast.body["pool"], "crawlers/fast");
    // Combined with the other filters.
    let slow = api
        .grant(json!({ "pool": "crawlers/slow", "provider": "kvm-home", "selector": {"tier": "cheap"} }))
        .await;
    assert_eq!(slow.body["proxy"]["name"], "kvm-2", "{}", slow.body);

    // The pool is busy: 503 with the time until its lease ends.
    let busy = api.grant(json!({ "pool": "crawlers/fast" })).await;
    busy.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    assert_eq!(busy.retry_after(), 60, "the lease's end (300 s), capped");

    let unknown = api.grant(json!({ "pool": "crawlers/nope" })).await;
    unknown.assert_problem(StatusCode::NOT_FOUND, "unknown-pool");
    assert!(
        unknown.body["detail"]
            .as_str()
            .unwrap()
            .contains("crawlers/nope")
    );
    for body in [
        json!({ "selector": { "tier": "gold" } }),
        json!({ "provider": "nobody" }),
        json!({ "zone": "zone-z" }),
        json!({ "pool": "crawlers/fast", "zone": "zone-b" }),
    ] {
        let reply = api.grant(body.clone()).await;
        reply.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, "no-matching-proxy");
        assert!(reply.header("retry-after").is_none(), "{body}");
    }

    // A ProxyPool scaling from 0: known, so 503 and not 404.
    api.store
        .set_known_pools([("crawlers".to_string(), "empty".to_string())]);
    api.grant(json!({ "pool": "crawlers/empty" }))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");

    let listed = api.send(reqwest::Method::GET, "/v1/proxies", None).await;
    assert_eq!(listed.body["proxies"][0]["pool"], "crawlers/fast");
    assert!(listed.body["proxies"][2].get("pool").is_none());
}

#[tokio::test]
async fn a_session_sticks_to_its_proxy_and_shares_its_lease() {
    let api = serve(
        options(),
        vec![
            entry("kvm-1", true),
            entry("kvm-2", true),
            entry("kvm-3", true),
        ],
    )
    .await;
    let first = api.grant(json!({ "session": "jar-7" })).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert_eq!(first.body["session"], "jar-7");
    let proxy = first.body["proxy"]["name"].clone();
    // A second worker of the session: the same lease, 200 (nothing new).
    let second = api.grant(json!({ "session": "jar-7" })).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(id_of(&second), id_of(&first));
    assert_eq!(second.header("location"), first.header("location"));
    // Another session gets another proxy.
    let other = api.grant(json!({ "session": "jar-8" })).await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_ne!(other.body["proxy"]["name"], proxy);
    // Released and asked again: the same proxy, a new lease.
    assert_eq!(
        api.release(&id_of(&first)).await.status,
        StatusCode::NO_CONTENT
    );
    let again = api.grant(json!({ "session": "jar-7" })).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.body["proxy"]["name"], proxy);
    assert_ne!(id_of(&again), id_of(&first));
}

#[tokio::test]
async fn a_target_block_cools_the_proxy_down_for_that_target_only() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    let lease = api.grant(json!({ "target": "Shop.Example" })).await;
    let id = id_of(&lease);
    let blocked = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/report"),
            Some(json!({ "outcome": "blocked", "target": "shop.example." }).to_string()),
        )
        .await;
    assert_eq!(blocked.status, StatusCode::OK, "{}", blocked.body);
    assert_eq!(blocked.body["active"], false);
    // Not for shop.example (any spelling), but for anything else.
    let refused = api.grant(json!({ "target": "SHOP.example" })).await;
    refused.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    assert_eq!(
        refused.retry_after(),
        60,
        "the cooldown's end, capped at 60 s"
    );
    let by_name = api
        .grant(json!({ "proxy": "crawlers/kvm-1", "target": "shop.example" }))
        .await;
    by_name.assert_problem(StatusCode::CONFLICT, "proxy-cooling-down");
    assert!((110..=120).contains(&by_name.retry_after()));
    assert_eq!(api.proxy_state("kvm-1").await, "available");
    let news = api.grant(json!({ "target": "news.example" })).await;
    assert_eq!(news.status, StatusCode::CREATED, "{}", news.body);
    assert_eq!(
        api.release(&id_of(&news)).await.status,
        StatusCode::NO_CONTENT
    );
    let plain = api.grant(json!({})).await;
    assert_eq!(plain.status, StatusCode::CREATED);
    let usage = api.store.usage();
    assert_eq!(usage[&key("kvm-1")].blocked_reports, 1);
}

#[tokio::test]
async fn a_lease_is_shown_renewed_and_a_draining_proxy_refuses_renewals() {
    let api = serve(options(), vec![pooled("kvm-1", "fast")]).await;
    let granted = api
        .grant(json!({ "ttlSeconds": 60, "session": "s", "pool": "crawlers/fast" }))
        .await;
    let id = id_of(&granted);
    let shown = api.show(&id).await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    for field in [
        "id",
        "proxy",
        "proxyUrl",
        "grantedAt",
        "expiresAt",
        "ttlSeconds",
        "pool",
        "session",
    ] {
        assert_eq!(shown.body[field], granted.body[field], "{field}");
    }

    let renewed = api.renew(&id, json!({ "ttlSeconds": 99_999 })).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.body);
    assert_eq!(renewed.body["ttlSeconds"], 600, "capped by --max-lease-ttl");
    assert!(renewed.body["expiresAt"].as_str() > granted.body["expiresAt"].as_str());
    assert_eq!(renewed.body["grantedAt"], granted.body["grantedAt"]);
    assert_eq!(
        api.show(&id).await.body["expiresAt"],
        renewed.body["expiresAt"]
    );
    // Without a body: the lease's own lifetime again.
    let plain = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/renew"),
            None,
        )
        .await;
    assert_eq!(plain.body["ttlSeconds"], 600, "{}", plain.body);

    // Its pool drains the proxy: the lease runs on, is not renewed, and nobody gets the proxy.
    api.store.set_provisioned(vec![ProvisionedProxy {
        draining: true,
        ..pooled("kvm-1", "fast")
    }]);
    api.renew(&id, json!({}))
        .await
        .assert_problem(StatusCode::CONFLICT, "proxy-draining");
    assert_eq!(api.show(&id).await.status, StatusCode::OK);
    api.grant(json!({ "proxy": "crawlers/kvm-1" }))
        .await
        .assert_problem(StatusCode::CONFLICT, "proxy-draining");
    let listed = api.send(reqwest::Method::GET, "/v1/proxies", None).await;
    assert_eq!(listed.body["proxies"][0]["draining"], true);

    assert_eq!(api.release(&id).await.status, StatusCode::NO_CONTENT);
    api.grant(json!({ "session": "s" }))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    api.renew(&id, json!({}))
        .await
        .assert_problem(StatusCode::GONE, "lease-ended");
    api.show(&id)
        .await
        .assert_problem(StatusCode::GONE, "lease-ended");
    api.show("0123456789abcdef0123456789abcdef")
        .await
        .assert_problem(StatusCode::NOT_FOUND, "lease-not-found");
    api.renew("0123456789abcdef0123456789abcdef", json!({}))
        .await
        .assert_problem(StatusCode::NOT_FOUND, "lease-not-found");
}

#[tokio::test]
async fn session_target_and_pool_over_their_limits_are_400_naming_the_field() {
    let api = serve(options(), vec![entry("kvm-1", true)]).await;
    let granted = api.grant(json!({})).await;
    let id = id_of(&granted);
    let long_host = vec!["a".repeat(63); 5].join(".");
    let cases = [
        (
            json!({ "session": "s".repeat(257) }),
            "session",
            "at most 256 are accepted",
        ),
        (
            json!({ "session": "ü".repeat(257) }),
            "session",
            "257 characters long",
        ),
        (json!({ "session": "" }), "session", "empty"),
        (json!({ "session": "a\u{1}b" }), "session", "control"),
        (json!({ "target": long_host }), "target", "253"),
        (
            json!({ "target": "https://shop.example/" }),
            "target",
            "host name",
        ),
        (
            json!({ "target": "shop.example:443" }),
            "target",
            "host name",
        ),
        (json!({ "pool": "fast" }), "pool", "namespace/name"),
    ];
    for (body, field, mentions) in cases {
        let reply = api.grant(body.clone()).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("{field}: ")) && detail.contains(mentions),
            "{body}: {detail}"
        );
    }
    let report = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/leases/{id}/report"),
            Some(json!({ "outcome": "blocked", "target": "not a host" }).to_string()),
        )
        .await;
    report.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    assert!(
        report.body["detail"]
            .as_str()
            .unwrap()
            .starts_with("target: ")
    );
    for (body, mentions) in [
        (json!({ "ttlSeconds": 0 }), "ttlSeconds"),
        (json!({ "ttl": 5 }), "ttl"),
    ] {
        let reply = api.renew(&id, body).await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        assert!(reply.body["detail"].as_str().unwrap().contains(mentions));
    }
    // Nothing above touched the lease.
    assert_eq!(api.report(&id, "success").await.status, StatusCode::OK);
    assert_eq!(api.store.usage()[&key("kvm-1")].blocked_reports, 0);
}

/// The venv of tests/fixtures/schemathesis (.ci/install-fixtures.sh); a missing or stale one
/// fails with the fix.
fn schemathesis() -> std::path::PathBuf {
    let venv = std::env::var_os("PROXY_OPERATOR_SCHEMATHESIS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/proxy-operator/schemathesis")
        });
    let fix = "run .ci/install-fixtures.sh (it installs tests/fixtures/schemathesis/requirements.txt \
               into that venv)";
    let program = venv.join("bin/schemathesis");
    assert!(program.exists(), "{} is missing: {fix}", program.display());
    let wanted = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/schemathesis/requirements.txt"),
    )
    .unwrap();
    let installed = std::fs::read(venv.join("requirements.txt")).unwrap_or_default();
    assert!(
        wanted == installed,
        "{} holds another schemathesis than tests/fixtures/schemathesis/requirements.txt: {fix}",
        venv.display()
    );
    program
}

/// Schemathesis (pinned) fuzzes the live API from the OpenAPI document the API serves, with
/// every check it has: each answer's status, content type, headers and body must be documented
/// for its operation, what the schema refuses must be refused and what it admits accepted, no
/// 5xx, no endpoint open without the token. Seeded, so a failure reproduces with the command it
/// prints (issue #36: the two had drifted apart in six places).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_api_and_its_openapi_document_agree_under_schemathesis() {
    let program = schemathesis();
    // Enough proxies that grants succeed for a while; then 503s, which are documented too.
    let mut pool: Vec<ProvisionedProxy> =
        (0..40).map(|i| entry(&format!("kvm-{i}a"), true)).collect();
    pool.extend((0..40).map(|i| pooled(&format!("fleet-{i}b"), "fleet")));
    let api = serve(LeaseOptions::default(), pool).await;
    let scratch = tempfile::tempdir().unwrap();
    let schema = format!("http://{}/openapi.json", api.addr);
    let auth = format!("Authorization: Bearer {TOKEN}");
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/schemathesis/schemathesis.toml");
    let config = config.to_str().unwrap();
    // Another seed explores other inputs: SCHEMATHESIS_SEED=N.
    let seed = std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "42".into());
    let args = [
        "--config-file",
        config,
        "run",
        &schema,
        "--checks",
        "all",
        "--header",
        &auth,
        "--seed",
        &seed,
        "--max-examples",
        "40",
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--generation-database",
        "none",
        "--no-color",
    ];
    let output = tokio::process::Command::new(&program)
        .args(args)
        .current_dir(scratch.path())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "schemathesis found the API and its document disagreeing ({}):\n{stdout}\n{stderr}\n\
         again by hand: {} {}",
        output.status,
        program.display(),
        args.join(" ")
    );
    // It ran: every operation of the document, in every phase but the examples (the document
    // gives none).
    for ran in [
        "Selected: 6/6",
        "Tested: 6",
        "✅ Coverage",
        "✅ Fuzzing",
        "✅ Stateful",
    ] {
        assert!(stdout.contains(ran), "no `{ran}` in its summary:\n{stdout}");
    }
    assert!(
        stdout.contains("No issues found") || only_the_known_timing_warning(&stdout),
        "schemathesis warned:\n{stdout}"
    );
}

/// Whether the run's only warning is `validation_mismatch` for `GET /v1/leases/{id}`: how many
/// of that operation's answers are 4xx depends on how many of the run's leases had ended when
/// it asked (tests/fixtures/schemathesis/schemathesis.toml), and schemathesis 4.32 shows the
/// heuristic although the configuration turns it off for that operation.
fn only_the_known_timing_warning(stdout: &str) -> bool {
    let Some((_, warnings)) = stdout.split_once("=== WARNINGS ===") else {
        return false;
    };
    let warnings = warnings.split("=== SUMMARY ===").next().unwrap_or_default();
    let listed: Vec<&str> = warnings
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("- "))
        .collect();
    warnings.contains("Schema validation mismatch: 1 operation")
        && listed == ["- GET /v1/leases/{id}"]
        && stdout.matches("⚠️").count() == 1
}

#[tokio::test]
async fn the_gateway_door_shares_proxies_by_the_lease_rules_and_only_for_the_gateway() {
    let api = serve(
        options(),
        vec![pooled("g1", "gw"), pooled("g2", "gw"), pooled("x1", "api")],
    )
    .await;
    let body = json!({ "replica": "gw-0", "pool": "crawlers/gw", "target": "example.com" });
    let post = reqwest::Method::POST;
    // Only the gateway, and only for a client the lease API accepts.
    api.gateway(
        post.clone(),
        "/v1/gateway/routes",
        body.clone(),
        None,
        Some(TOKEN),
    )
    .await
    .assert_problem(StatusCode::FORBIDDEN, "not-the-gateway");
    api.gateway(
        post.clone(),
        "/v1/gateway/routes",
        body.clone(),
        Some("guess"),
        Some(TOKEN),
    )
    .await
    .assert_problem(StatusCode::FORBIDDEN, "not-the-gateway");
    api.gateway(
        post.clone(),
        "/v1/gateway/routes",
        body.clone(),
        Some(GATEWAY_TOKEN),
        None,
    )
    .await
    .assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    api.gateway(
        post.clone(),
        "/v1/gateway/routes",
        body.clone(),
        Some(GATEWAY_TOKEN),
        Some("wrong"),
    )
    .await
    .assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    let answer = api
        .gateway(
            post.clone(),
            "/v1/gateway/routes",
            body.clone(),
            Some(GATEWAY_TOKEN),
            Some(TOKEN),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body["blockStatuses"], json!([403, 429]));
    assert_eq!(answer.body["proxy"]["address"], "127.0.0.1");
    assert_eq!(answer.body["proxy"]["port"], 3128);
    let first = answer.body["proxy"]["name"].as_str().unwrap().to_string();
    // Without a session, requests rotate over the pool.
    let second = api.route(body.clone()).await;
    assert_ne!(first, second);
    assert!(["g1", "g2"].contains(&second.as_str()));
    // Both carry gateway traffic: the lease API does not hand them out exclusively...
    api.grant(json!({ "pool": "crawlers/gw" }))
        .await
        .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    // ...and the gateway never routes through an exclusive lease's proxy.
    let leased = api.grant(json!({ "pool": "crawlers/api" })).await;
    assert_eq!(leased.status, StatusCode::CREATED);
    api.gateway(
        post.clone(),
        "/v1/gateway/routes",
        json!({ "replica": "gw-0", "pool": "crawlers/api" }),
        Some(GATEWAY_TOKEN),
        Some(TOKEN),
    )
    .await
    .assert_problem(StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available");
    // GET /v1/proxies shows which proxies the gateway uses, with the connections the replicas
    // report (none yet).
    let listed = api.send(reqwest::Method::GET, "/v1/proxies", None).await;
    let shown: Vec<(String, Value)> = listed.body["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["gatewayConnections"].clone(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            ("g1".to_string(), json!(0)),
            ("g2".to_string(), json!(0)),
            ("x1".to_string(), Value::Null)
        ]
    );

    // A replica's report replaces what the leader counted: g1 carries two, its bound.
    let put = reqwest::Method::PUT;
    let load = |g1: u32| json!({ "connections": { "crawlers/g1": g1, "crawlers/not-a-proxy": 9 } });
    let reply = api
        .gateway(
            put.clone(),
            "/v1/gateway/replicas/gw-0",
            load(2),
            Some(GATEWAY_TOKEN),
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    for _ in 0..2 {
        assert_eq!(api.route(body.clone()).await, "g2", "g1 is full");
    }
    api.gateway(
        put.clone(),
        "/v1/gateway/replicas/gw-0",
        load(0),
        Some(GATEWAY_TOKEN),
        None,
    )
    .await;

    // A session keeps its proxy; a block for its site moves it, other sites keep the proxy.
    let session = json!({ "replica": "gw-0", "pool": "crawlers/gw", "session": "s1", "target": "shop.example" });
    let bound = api.route(session.clone()).await;
    assert_eq!(api.route(session.clone()).await, bound);
    let reply = api
        .gateway(
            post.clone(),
            "/v1/gateway/reports",
            json!({ "proxy": format!("crawlers/{bound}"), "outcome": "blocked", "target": "shop.example" }),
            Some(GATEWAY_TOKEN),
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.body);
    api.gateway(
        put.clone(),
        "/v1/gateway/replicas/gw-0",
        load(0),
        Some(GATEWAY_TOKEN),
        None,
    )
    .await;
    let moved = api.route(session.clone()).await;
    assert_ne!(moved, bound, "blocked for shop.example");
    let other_site = json!({ "replica": "gw-0", "pool": "crawlers/gw", "target": "news.example", "avoid": format!("crawlers/{moved}") });
    assert_eq!(
        api.route(other_site).await,
        bound,
        "still good for other sites"
    );

    // Bad input names the field; reports and loads need the gateway token too.
    for (path, method, body, field) in [
        (
            "/v1/gateway/routes",
            post.clone(),
            json!({ "pool": "crawlers/gw" }),
            "replica",
        ),
        (
            "/v1/gateway/routes",
            post.clone(),
            json!({ "replica": "r", "pool": "gw" }),
            "pool",
        ),
        (
            "/v1/gateway/routes",
            post.clone(),
            json!({ "replica": "r", "session": "" }),
            "session",
        ),
        (
            "/v1/gateway/routes",
            post.clone(),
            json!({ "replica": "r", "avoid": "x" }),
            "avoid",
        ),
        (
            "/v1/gateway/reports",
            post.clone(),
            json!({ "outcome": "blocked" }),
            "proxy",
        ),
        (
            "/v1/gateway/reports",
            post.clone(),
            json!({ "proxy": "crawlers/g1" }),
            "outcome",
        ),
        (
            "/v1/gateway/replicas/r",
            put.clone(),
            json!({ "connections": { "g1": 1 } }),
            "connections.g1",
        ),
    ] {
        let reply = api
            .gateway(method, path, body, Some(GATEWAY_TOKEN), Some(TOKEN))
            .await;
        reply.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(detail.starts_with(field), "{path}: {detail}");
    }
    let long = "r".repeat(254);
    api.gateway(
        put.clone(),
        &format!("/v1/gateway/replicas/{long}"),
        load(0),
        Some(GATEWAY_TOKEN),
        None,
    )
    .await
    .assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    for (method, path) in [
        (post.clone(), "/v1/gateway/reports"),
        (put.clone(), "/v1/gateway/replicas/r"),
    ] {
        api.gateway(method, path, load(0), None, Some(TOKEN))
            .await
            .assert_problem(StatusCode::FORBIDDEN, "not-the-gateway");
    }
}

#[tokio::test]
async fn the_gateway_asks_the_leader_for_routes_through_its_door() {
    use proxy_operator::leasing::gateway::leader::{LeaderRoutes, LeaderTrust};
    use proxy_operator::leasing::gateway::{
        Destination, Report, RouteError, RouteRequest, Routes, Routing,
    };

    let api = serve(options(), vec![pooled("g1", "gw")]).await;
    let base = format!("http://{}", api.addr);
    let routes = LeaderRoutes::new(&base, GATEWAY_TOKEN, "gw-0", LeaderTrust::PlainHttp).unwrap();
    let request = |token: &str, pool: &str| RouteRequest {
        routing: Routing {
            pool: Some(("crawlers".into(), pool.into())),
            session: Some("s".into()),
            ..Routing::default()
        },
        token: token.into(),
        destination: Destination {
            host: "example.com".into(),
            port: 443,
        },
        avoid: None,
    };
    let route = routes.route(&request(TOKEN, "gw")).await.unwrap();
    assert_eq!(route.proxy, "crawlers/g1");
    assert_eq!(
        route.pool.as_deref(),
        Some("crawlers/gw"),
        "its bytes' pool"
    );
    assert_eq!((route.address.as_str(), route.port), ("127.0.0.1", 3128));
    assert_eq!(route.block_statuses, vec![403, 429]);
    assert_eq!(
        routes.route(&request("wrong", "gw")).await,
        Err(RouteError::Unauthenticated)
    );
    match routes.route(&request(TOKEN, "nope")).await {
        Err(RouteError::Invalid(why)) => assert!(why.contains("crawlers/nope"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A block report cools g1 down for the site: nothing else in the pool.
    routes
        .report(&route, &request(TOKEN, "gw").destination, Report::Blocked)
        .await;
    match routes.route(&request(TOKEN, "gw")).await {
        Err(RouteError::NoProxy { retry_after }) => assert!(retry_after.as_secs() >= 1),
        other => panic!("{other:?}"),
    }
    // The load report carries the bytes per pool since the last one: the leader adds them up,
    // for pools it knows (and `none`).
    let bytes = std::collections::BTreeMap::from([
        ("crawlers/gw".to_string(), (10, 200)),
        ("none".to_string(), (1, 2)),
        ("crawlers/made-up".to_string(), (5, 5)),
    ]);
    routes
        .push_load(&[("crawlers/g1".into(), 1)], &bytes)
        .await
        .unwrap();
    routes
        .push_load(&[("crawlers/g1".into(), 1)], &bytes)
        .await
        .unwrap();
    assert_eq!(api.store.shared_loads()[&key("g1")], 1);
    let totals: Vec<(String, (u64, u64))> = api
        .store
        .gateway_bytes()
        .into_iter()
        .map(|(pool, t)| (pool, (t.sent, t.received)))
        .collect();
    assert_eq!(
        totals,
        [
            ("crawlers/gw".to_string(), (20, 400)),
            ("none".into(), (2, 4))
        ]
    );
    let malformed = std::collections::BTreeMap::from([("no-slash".to_string(), (1, 1))]);
    let refused = routes.push_load(&[], &malformed).await.unwrap_err();
    assert!(
        refused.to_string().contains("bytes.no-slash"),
        "{refused:#}"
    );
    // A gateway with the wrong token is the operator's misconfiguration, not the client's.
    let impostor = LeaderRoutes::new(&base, "guess", "gw-1", LeaderTrust::PlainHttp).unwrap();
    match impostor.route(&request(TOKEN, "gw")).await {
        Err(RouteError::Unavailable(why)) => assert!(why.contains("refused the gateway"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(impostor.push_load(&[], &bytes).await.is_err());
}

/// A log sink for one test's subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// With debug logs on, each request is a span naming its method and path, closed by one event
/// with its status, and what a handler logs inside carries the span.
#[tokio::test]
async fn each_request_is_a_span_with_its_method_path_and_status() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("proxy_operator=debug")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // This test's runtime is one thread: the server's tasks log through this subscriber.
    let _default = tracing::subscriber::set_default(subscriber);
    // Other tests of this binary log on other threads at the same time: a callsite they
    // register while this dispatcher is being added can keep the interest computed without
    // it (tracing-core's cache; seen once as an empty log). Computed again, with it.
    tracing::callsite::rebuild_interest_cache();
    let api = serve(options(), vec![entry("kvm-1a", true)]).await;
    let response = api
        .http
        .get(format!("http://{}/v1/proxies", api.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let missing = api
        .http
        .get(format!("http://{}/v1/leases/{}", api.addr, "0".repeat(32)))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.lines().any(
            |l| l.contains("discovery_request{method=GET path=/v1/proxies}")
                && l.contains("status=200")
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains(&format!(
            "discovery_request{{method=GET path=/v1/leases/{}}}",
            "0".repeat(32)
        )) && l.contains("status=404")),
        "{text}"
    );
}
