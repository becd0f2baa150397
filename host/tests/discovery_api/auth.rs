//! Who may lease what, against a real kube-apiserver (the harness's, RBAC on): ServiceAccount
//! tokens minted with the TokenRequest API, reviewed with TokenReview and authorized by RBAC
//! (SubjectAccessReview of `create` on `proxypools/lease`), with the identity and the rights of
//! the operator's own ServiceAccount from deploy/rbac.yaml.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{ControlPlane, TestNamespace};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use proxy_operator::leasing::leases::{
    self, Auth, Discovery, KubeAuthOptions, KubeReviewer, LeaseMetrics, LeaseOptions, LeaseStore,
    ProvisionedProxy, ProxyKey,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const STATIC: &str = "static-token";
const AUDIENCE: &str = "proxy-operator";
pub(super) const OPERATOR: &str = "system:serviceaccount:proxy-operator:proxy-operator";

static RBAC: OnceCell<()> = OnceCell::const_new();

/// The shared control plane with deploy/namespace.yaml and deploy/rbac.yaml applied.
pub(super) async fn control_plane() -> &'static ControlPlane {
    let cp = ControlPlane::shared().await;
    RBAC.get_or_init(|| async {
        for file in ["namespace.yaml", "rbac.yaml"] {
            let path = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
            cp.kubectl_run(&["apply", "-f", &path], None)
                .await
                .unwrap_or_else(|e| panic!("applying deploy/{file}: {e}"));
        }
    })
    .await;
    cp
}

/// The discovery API on loopback, checking tokens as the operator's ServiceAccount.
struct Served {
    addr: SocketAddr,
    discovery: Arc<Discovery>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(super) fn options(allow_ttl: Duration, deny_ttl: Duration) -> KubeAuthOptions {
    KubeAuthOptions {
        allow_ttl,
        deny_ttl,
        timeout: Duration::from_secs(5),
        ..KubeAuthOptions::default()
    }
}

async fn serve(auth: Auth, pool: Vec<ProvisionedProxy>) -> Served {
    let store = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    store.restore(Default::default());
    store.set_provisioned(pool);
    let discovery = Arc::new(Discovery::with_auth(store, auth));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(leases::serve(listener, leases::router(discovery.clone())));
    Served {
        addr,
        discovery,
        task,
    }
}

/// Reviews with the operator's own identity and rights (deploy/rbac.yaml).
pub(super) fn as_the_operator(cp: &ControlPlane, options: KubeAuthOptions) -> Auth {
    let reviewer = KubeReviewer::new(cp.client_as(OPERATOR, &[]), &options.audience);
    Auth::none()
        .with_static_token(STATIC, None)
        .with_kubernetes(Arc::new(reviewer), options)
}

/// A healthy proxy `namespace/name` in `pool`.
pub(super) fn proxy(namespace: &str, name: &str, pool: &str) -> ProvisionedProxy {
    ProvisionedProxy {
        key: ProxyKey {
            namespace: namespace.into(),
            name: name.into(),
        },
        provider: "kvm-home".into(),
        zone: None,
        labels: BTreeMap::from([("proxy-operator.dev/pool".to_string(), pool.to_string())]),
        address: "127.0.0.1".into(),
        port: 3128,
        exit_ip: None,
        healthy: true,
        pool: Some(pool.to_string()),
        draining: false,
        login: None,
        protocol: Default::default(),
    }
}

pub(super) async fn service_account(ns: &TestNamespace, name: &str) {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

/// A Role in `ns` granting `create` on `proxypools/lease` (for `pools`, or every pool), bound
/// to the ServiceAccount `sa` of `sa_namespace`.
pub(super) async fn grant_leases(
    ns: &TestNamespace,
    name: &str,
    pools: Option<&[&str]>,
    sa_namespace: &str,
    sa: &str,
) {
    let role = Role {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["proxy-operator.dev".into()]),
            resources: Some(vec!["proxypools/lease".into()]),
            resource_names: pools.map(|p| p.iter().map(|s| s.to_string()).collect()),
            verbs: vec!["create".into()],
            ..Default::default()
        }]),
    };
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(sa_namespace.into()),
            ..Default::default()
        }]),
    };
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

struct Reply {
    status: StatusCode,
    body: Value,
    www_authenticate: Option<String>,
    retry_after: Option<String>,
}

impl Reply {
    fn assert_problem(&self, status: StatusCode, kind: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(
            self.body["type"],
            format!("urn:proxy-operator:problem:{kind}"),
            "{}",
            self.body
        );
    }

    fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or_default()
    }
}

async fn call(
    addr: SocketAddr,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Reply {
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.unwrap();
    let header = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let (www_authenticate, retry_after) = (header("www-authenticate"), header("retry-after"));
    let status = response.status();
    let body = serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null);
    Reply {
        status,
        body,
        www_authenticate,
        retry_after,
    }
}

async fn grant(addr: SocketAddr, token: &str, body: Value) -> Reply {
    call(addr, reqwest::Method::POST, "/v1/leases", token, Some(body)).await
}

#[tokio::test]
async fn the_operators_service_account_may_review_tokens_and_access() {
    let cp = control_plane().await;
    for resource in [
        "tokenreviews.authentication.k8s.io",
        "subjectaccessreviews.authorization.k8s.io",
    ] {
        let answer = cp
            .kubectl_run(
                &["auth", "can-i", "create", resource, "--as", OPERATOR],
                None,
            )
            .await
            .unwrap();
        assert_eq!(answer.trim(), "yes", "deploy/rbac.yaml: create {resource}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_decides_which_pools_a_service_account_leases_from() {
    let cp = control_plane().await;
    let (a, b) = (
        cp.namespace("auth-a").await.unwrap(),
        cp.namespace("auth-b").await.unwrap(),
    );
    for sa in ["crawler", "stranger"] {
        service_account(&a, sa).await;
    }
    grant_leases(&a, "lease-pool-a", Some(&["pool-a"]), a.name(), "crawler").await;
    let api = serve(
        as_the_operator(
            cp,
            options(Duration::from_secs(20), Duration::from_millis(200)),
        ),
        vec![
            proxy(a.name(), "px-a", "pool-a"),
            proxy(a.name(), "px-a2", "pool-a2"),
            proxy(b.name(), "px-b", "pool-b"),
        ],
    )
    .await;
    let crawler = a
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();
    let stranger = a
        .service_account_token("stranger", AUDIENCE, 600)
        .await
        .unwrap();
    let pool = |ns: &TestNamespace, name: &str| json!({ "pool": format!("{}/{name}", ns.name()) });

    // Allowed: the Role names the pool; the lease is on a proxy of that pool.
    let granted = grant(api.addr, &crawler, pool(&a, "pool-a")).await;
    assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
    assert_eq!(granted.body["proxy"]["name"], "px-a");
    let id = granted.body["id"].as_str().unwrap().to_string();

    // Denied: another pool of the namespace, another namespace's pool, no pool (cluster-wide),
    // and a ServiceAccount without a Role.
    let cases = [
        (
            &crawler,
            pool(&a, "pool-a2"),
            format!("(resourceNames: pool-a2) in namespace {}", a.name()),
        ),
        (
            &crawler,
            pool(&b, "pool-b"),
            format!("(resourceNames: pool-b) in namespace {}", b.name()),
        ),
        (&crawler, json!({}), "cluster-wide".to_string()),
        (
            &crawler,
            json!({"proxy": format!("{}/px-a2", a.name())}),
            format!("proxy-operator.dev in namespace {}", a.name()),
        ),
        (
            &stranger,
            pool(&a, "pool-a"),
            format!("system:serviceaccount:{}:stranger may not lease", a.name()),
        ),
    ];
    for (token, body, needs) in &cases {
        let reply = grant(api.addr, token, body.clone()).await;
        reply.assert_problem(StatusCode::FORBIDDEN, "forbidden");
        assert!(
            reply.detail().contains(needs.as_str()),
            "{body}: {}",
            reply.detail()
        );
        assert!(
            reply.detail().contains("proxypools/lease"),
            "{}",
            reply.detail()
        );
    }

    // Only the holder uses the lease: not the static token, not another ServiceAccount.
    let report_path = format!("/v1/leases/{id}/report");
    let report = |token: &str| {
        let token = token.to_string();
        let path = report_path.clone();
        async move {
            call(
                api.addr,
                reqwest::Method::POST,
                &path,
                &token,
                Some(json!({"outcome": "success"})),
            )
            .await
        }
    };
    // To anyone else a lease is an id never granted: 404 (a release: 204, releasing nothing).
    for other in [STATIC, stranger.as_str()] {
        report(other)
            .await
            .assert_problem(StatusCode::NOT_FOUND, "lease-not-found");
        for (method, path) in [
            (reqwest::Method::GET, format!("/v1/leases/{id}")),
            (reqwest::Method::POST, format!("/v1/leases/{id}/renew")),
        ] {
            call(api.addr, method, &path, other, None)
                .await
                .assert_problem(StatusCode::NOT_FOUND, "lease-not-found");
        }
        let path = format!("/v1/leases/{id}");
        let released = call(api.addr, reqwest::Method::DELETE, &path, other, None).await;
        assert_eq!(released.status, StatusCode::NO_CONTENT);
    }
    assert_eq!(report(&crawler).await.status, StatusCode::OK, "still live");
    let by_static = grant(api.addr, STATIC, pool(&a, "pool-a2")).await;
    assert_eq!(by_static.status, StatusCode::CREATED, "{}", by_static.body);
    let static_id = by_static.body["id"].as_str().unwrap();
    let show = format!("/v1/leases/{static_id}");
    call(api.addr, reqwest::Method::DELETE, &show, &crawler, None).await;
    let kept = call(api.addr, reqwest::Method::GET, &show, STATIC, None).await;
    assert_eq!(kept.status, StatusCode::OK, "{}", kept.body);
    let released = call(
        api.addr,
        reqwest::Method::DELETE,
        &format!("/v1/leases/{id}"),
        &crawler,
        None,
    )
    .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT);

    // Listing every proxy needs `list` on proxies cluster-wide.
    call(
        api.addr,
        reqwest::Method::GET,
        "/v1/proxies",
        &crawler,
        None,
    )
    .await
    .assert_problem(StatusCode::FORBIDDEN, "forbidden");

    // A Role in namespace B for a ServiceAccount of namespace A opens B's pools to it, once
    // the cached denial has expired (200 ms here).
    grant_leases(&b, "lease-team-a", None, a.name(), "crawler").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = grant(api.addr, &crawler, pool(&b, "pool-b")).await;
        if reply.status == StatusCode::CREATED {
            assert_eq!(reply.body["proxy"]["name"], "px-b");
            break;
        }
        reply.assert_problem(StatusCode::FORBIDDEN, "forbidden");
        assert!(
            Instant::now() < deadline,
            "the new RoleBinding never took effect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // One TokenReview per token: the caches hold two tokens (crawler, stranger).
    assert_eq!(api.discovery.auth.cached().0, 2);
}

#[tokio::test]
async fn wrong_or_foreign_tokens_are_401() {
    let cp = control_plane().await;
    let a = cp.namespace("auth-401").await.unwrap();
    service_account(&a, "crawler").await;
    service_account(&a, "gone").await;
    grant_leases(&a, "lease-all", None, a.name(), "crawler").await;
    grant_leases(&a, "lease-all-gone", None, a.name(), "gone").await;
    let api = serve(
        as_the_operator(cp, options(Duration::from_secs(20), Duration::from_secs(3))),
        vec![proxy(a.name(), "px", "pool-a")],
    )
    .await;
    let body = json!({ "pool": format!("{}/pool-a", a.name()) });
    // For the API server's own audience (the Pod's default token), not the discovery API's.
    let for_the_api_server = a
        .service_account_token("crawler", cp.url(), 600)
        .await
        .unwrap();
    // The token of a ServiceAccount deleted since: the API server no longer accepts it.
    let revoked = a
        .service_account_token("gone", AUDIENCE, 600)
        .await
        .unwrap();
    a.api::<ServiceAccount>()
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    let mut forged = a
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();
    forged.replace_range(forged.len() - 8.., "AAAAAAAA");
    for (what, token) in [
        ("not a token", "nope"),
        (
            "JWT-shaped garbage",
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
        ),
        ("another audience", for_the_api_server.as_str()),
        ("a deleted ServiceAccount", revoked.as_str()),
        ("a bad signature", forged.as_str()),
    ] {
        let reply = grant(api.addr, token, body.clone()).await;
        reply.assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(
            reply.www_authenticate.as_deref(),
            Some("Bearer realm=\"proxy-operator\""),
            "{what}"
        );
        assert!(
            reply.detail().contains("for the audience `proxy-operator`"),
            "{what}: {}",
            reply.detail()
        );
    }
    let good = a
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();
    assert_eq!(
        grant(api.addr, &good, body).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_deleted_rolebinding_denies_once_the_cached_allow_expires() {
    let cp = control_plane().await;
    let a = cp.namespace("auth-ttl").await.unwrap();
    service_account(&a, "crawler").await;
    grant_leases(&a, "lease-pool-a", Some(&["pool-a"]), a.name(), "crawler").await;
    let ttl = Duration::from_secs(2);
    let api = serve(
        as_the_operator(cp, options(ttl, Duration::from_millis(100))),
        vec![proxy(a.name(), "px", "pool-a")],
    )
    .await;
    let crawler = a
        .service_account_token("crawler", AUDIENCE, 600)
        .await
        .unwrap();
    let body = json!({ "pool": format!("{}/pool-a", a.name()) });
    let cycle = || async {
        let reply = grant(api.addr, &crawler, body.clone()).await;
        if reply.status == StatusCode::CREATED {
            let id = reply.body["id"].as_str().unwrap();
            let path = format!("/v1/leases/{id}");
            assert_eq!(
                call(api.addr, reqwest::Method::DELETE, &path, &crawler, None)
                    .await
                    .status,
                StatusCode::NO_CONTENT
            );
        }
        reply
    };
    let first = cycle().await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    // The decision was made before this instant, so it is cached until at most `ttl` later.
    let cached_until = Instant::now() + ttl;
    a.api::<RoleBinding>()
        .delete("lease-pool-a", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    loop {
        let reply = cycle().await;
        let now = Instant::now();
        if reply.status == StatusCode::FORBIDDEN {
            reply.assert_problem(StatusCode::FORBIDDEN, "forbidden");
            break;
        }
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        assert!(
            now < deleted + ttl + Duration::from_secs(3),
            "still allowed {:?} after the RoleBinding was deleted (cache TTL {ttl:?})",
            now - deleted
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Allowed from the cache until it expired, denied from then on: the denial came no sooner
    // than the cached decision could expire (it was reviewed a moment before `cached_until - ttl`).
    assert!(
        Instant::now() + Duration::from_millis(500) >= cached_until,
        "denied before the cached allow expired: the cache was not used"
    );
}

#[tokio::test]
async fn the_api_server_away_is_503_never_an_allow_and_the_static_token_still_works() {
    // Refused connections, and a server that accepts but never answers (the review's deadline).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for (what, addr) in [
        ("refused", closed),
        ("silent", silent.local_addr().unwrap()),
    ] {
        let config = kube::Config::new(format!("https://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let options = KubeAuthOptions {
            timeout: Duration::from_millis(500),
            ..KubeAuthOptions::default()
        };
        let reviewer = KubeReviewer::new(client, AUDIENCE);
        let auth = Auth::none()
            .with_static_token(STATIC, None)
            .with_kubernetes(Arc::new(reviewer), options);
        let api = serve(auth, vec![proxy("a", "px", "pool-a")]).await;
        let started = Instant::now();
        let token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln";
        for _ in 0..2 {
            let reply = grant(api.addr, token, json!({"pool": "a/pool-a"})).await;
            reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "auth-unavailable");
            assert_eq!(reply.retry_after.as_deref(), Some("5"), "{what}");
            assert!(
                reply.detail().contains("TokenReview"),
                "{what}: {}",
                reply.detail()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{what}: {:?}",
            started.elapsed()
        );
        assert_eq!(
            api.discovery.auth.cached(),
            (0, 0),
            "{what}: a failure is never cached"
        );
        let reply = grant(api.addr, STATIC, json!({"pool": "a/pool-a"})).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{what}: {}", reply.body);
    }
}

#[tokio::test]
async fn the_static_token_limited_to_pools() {
    let auth = Auth::none().with_static_token(STATIC, Some("a/pool-a,b/*".parse().unwrap()));
    let api = serve(
        auth,
        vec![
            proxy("a", "px-a", "pool-a"),
            proxy("a", "px-a2", "pool-a2"),
            proxy("b", "px-b", "pool-b"),
        ],
    )
    .await;
    for (body, expected) in [
        (json!({"pool": "a/pool-a"}), Some("px-a")),
        (json!({"pool": "b/pool-b"}), Some("px-b")),
        (json!({"pool": "a/pool-a2"}), None),
        (json!({}), None),
        (json!({"proxy": "a/px-a2"}), None),
    ] {
        let reply = grant(api.addr, STATIC, body.clone()).await;
        match expected {
            Some(name) => {
                assert_eq!(reply.status, StatusCode::CREATED, "{body}: {}", reply.body);
                assert_eq!(reply.body["proxy"]["name"], name);
            }
            None => {
                reply.assert_problem(StatusCode::FORBIDDEN, "forbidden");
                assert!(
                    reply.detail().contains("a/pool-a,b/*"),
                    "{}",
                    reply.detail()
                );
            }
        }
    }
    call(api.addr, reqwest::Method::GET, "/v1/proxies", STATIC, None)
        .await
        .assert_problem(StatusCode::FORBIDDEN, "forbidden");
    // A wrong token is still 401, distinct from 403.
    grant(api.addr, "wrong", json!({"pool": "a/pool-a"}))
        .await
        .assert_problem(StatusCode::UNAUTHORIZED, "unauthorized");
    // A malformed pool names the field.
    let reply = grant(api.addr, STATIC, json!({"pool": "pool-a"})).await;
    reply.assert_problem(StatusCode::BAD_REQUEST, "bad-request");
    assert!(
        reply
            .detail()
            .starts_with("pool: `pool-a` must be `namespace/name` of a ProxyPool"),
        "{}",
        reply.detail()
    );
}
