//! The metrics port as `proxy-operator run` serves it (`probes::serve`) behind the check
//! (`metrics_auth`), against the real kube-apiserver: no token 401, a token RBAC does not allow
//! 403, a token bound to deploy/metrics-rbac.yaml's ClusterRoles served, the probes open to the
//! kubelet, hostile headers answered, and an allowed scrape reviewed once while cached.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::routing::get;
use harness::TestNamespace;
use harness::process::free_port;
use proxy_operator::faces::metrics_auth::MetricsAuth;
use proxy_operator::faces::probes::{self, ProbeState};
use proxy_operator::leasing::leases::auth::{Access, KubeReviewer, Review, Reviewer, User};
use proxy_operator::leasing::leases::{LeaseMetrics, LeaseOptions, LeaseStore};
use proxy_operator::support::leader::LeaderView;
use reqwest::StatusCode;
use tokio_util::sync::CancellationToken;

use super::auth::{OPERATOR, control_plane, service_account};

/// The operator's reviewer, counting the reviews it asks for.
struct Counting {
    inner: KubeReviewer,
    reviews: Arc<AtomicUsize>,
}

impl Reviewer for Counting {
    fn review_token<'a>(&'a self, token: &'a str) -> Review<'a, Option<User>> {
        self.reviews.fetch_add(1, Ordering::SeqCst);
        self.inner.review_token(token)
    }

    fn review_access<'a>(&'a self, user: &'a User, access: &'a Access) -> Review<'a, bool> {
        self.reviews.fetch_add(1, Ordering::SeqCst);
        self.inner.review_access(user, access)
    }
}

struct Port {
    addr: SocketAddr,
    stop: CancellationToken,
    reviews: Arc<AtomicUsize>,
}

impl Drop for Port {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The metrics port with a counter in its registry and a stand-in for the status page's routes.
async fn serve(reviewer: KubeReviewer) -> Port {
    let registry = prometheus::Registry::new();
    let counter =
        prometheus::IntCounter::new("proxy_operator_test_total", "a test counter").unwrap();
    registry.register(Box::new(counter.clone())).unwrap();
    counter.inc();
    let reviews = Arc::new(AtomicUsize::new(0));
    let auth = MetricsAuth::with_reviewer(Arc::new(Counting {
        inner: reviewer,
        reviews: reviews.clone(),
    }));
    let leases = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    leases.restore(Default::default());
    let pages = axum::Router::new()
        .route("/status", get(|| async { "the status page" }))
        .route("/status/blocks.json", get(|| async { "{}" }));
    let addr: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let stop = CancellationToken::new();
    let state = ProbeState {
        view: LeaderView::always_serving(),
        leases,
        grants_wait_for_writes: false,
    };
    probes::serve(&stop, addr, registry, state, pages, &auth)
        .await
        .unwrap();
    Port {
        addr,
        stop,
        reviews,
    }
}

async fn get_with(
    addr: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> (StatusCode, String, bool) {
    let mut request = reqwest::Client::new().get(format!("http://{addr}{path}"));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let response = request.send().await.unwrap();
    let (status, challenge) = (
        response.status(),
        response.headers().contains_key("www-authenticate"),
    );
    (status, response.text().await.unwrap(), challenge)
}

async fn bind(ns: &TestNamespace, role: &str, sa: &str) {
    let cp = control_plane().await;
    let name = format!("{}-{sa}-{role}", ns.name());
    cp.kubectl_run(
        &[
            "create",
            "clusterrolebinding",
            &name,
            &format!("--clusterrole={role}"),
            &format!("--serviceaccount={}:{sa}", ns.name()),
        ],
        None,
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_rbac_allows_and_the_probes_stay_open() {
    let cp = control_plane().await;
    let path = format!("{}/../deploy/metrics-rbac.yaml", env!("CARGO_MANIFEST_DIR"));
    cp.kubectl_run(&["apply", "-f", &path], None).await.unwrap();
    let ns = cp.namespace("metrics-auth").await.unwrap();
    for sa in ["scraper", "stranger"] {
        service_account(&ns, sa).await;
    }
    bind(&ns, "proxy-operator-metrics-reader", "scraper").await;
    // The API server's own audience (its issuer): what a Pod's ServiceAccount token is for.
    let token = |sa: &'static str, audience: &'static str| {
        let ns = &ns;
        async move {
            let audience = if audience.is_empty() {
                cp.url()
            } else {
                audience
            };
            ns.service_account_token(sa, audience, 600).await.unwrap()
        }
    };
    let (scraper, stranger) = (token("scraper", "").await, token("stranger", "").await);
    let for_the_discovery_api = token("scraper", "proxy-operator").await;
    let port = serve(KubeReviewer::new(cp.client_as(OPERATOR, &[]), "")).await;
    let addr = port.addr;
    let bearer = |t: &str| format!("Bearer {t}");

    // The kubelet's probes need no token.
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(
            get_with(addr, probe, None).await.0,
            StatusCode::OK,
            "{probe}"
        );
    }
    // (path, Authorization, status, words of the answer)
    let huge = format!("Bearer {}", "a".repeat(64 * 1024));
    let cases: Vec<(&str, Option<String>, StatusCode, &str)> = vec![
        (
            "/metrics",
            None,
            StatusCode::UNAUTHORIZED,
            "proxy-operator-metrics-reader",
        ),
        (
            "/status",
            None,
            StatusCode::UNAUTHORIZED,
            "Authorization: Bearer",
        ),
        (
            "/metrics",
            Some("Bearer not-a-token".into()),
            StatusCode::UNAUTHORIZED,
            "--metrics-insecure",
        ),
        (
            "/metrics",
            Some("Bearer a.b.c".into()),
            StatusCode::UNAUTHORIZED,
            "Bearer",
        ),
        (
            "/metrics",
            Some("Basic c2NyYXBlcjpwdw==".into()),
            StatusCode::UNAUTHORIZED,
            "Bearer",
        ),
        ("/metrics", Some(huge), StatusCode::UNAUTHORIZED, "Bearer"),
        // A token for another audience (the discovery API's) is not the API server's.
        (
            "/metrics",
            Some(bearer(&for_the_discovery_api)),
            StatusCode::UNAUTHORIZED,
            "Bearer",
        ),
        (
            "/metrics",
            Some(bearer(&stranger)),
            StatusCode::FORBIDDEN,
            "non-resource URL /metrics",
        ),
        (
            "/metrics",
            Some(bearer(&scraper)),
            StatusCode::OK,
            "proxy_operator_test_total 1",
        ),
        // The metrics reader is not a status reader.
        (
            "/status",
            Some(bearer(&scraper)),
            StatusCode::FORBIDDEN,
            "may not read /status",
        ),
    ];
    for (path, authorization, status, words) in &cases {
        let (got, body, challenge) = get_with(addr, path, authorization.as_deref()).await;
        let shown = authorization.as_deref().map(|a| &a[..a.len().min(20)]);
        assert_eq!(got, *status, "{path} {shown:?}: {body}");
        assert!(body.contains(words), "{path} {shown:?}: {body}");
        assert_eq!(
            challenge,
            got == StatusCode::UNAUTHORIZED,
            "{path} {shown:?}"
        );
        assert!(
            !body.contains(&scraper) && !body.contains(&stranger),
            "no token is echoed"
        );
    }
    // The port still answers after all that.
    assert_eq!(get_with(addr, "/healthz", None).await.0, StatusCode::OK);

    // An allowed scrape is reviewed once (TokenReview + SubjectAccessReview) while cached.
    let before = port.reviews.load(Ordering::SeqCst);
    for _ in 0..3 {
        let (status, _, _) = get_with(addr, "/metrics", Some(&bearer(&scraper))).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(
        port.reviews.load(Ordering::SeqCst),
        before,
        "cached scrapes cost no review"
    );

    // The status reader's ClusterRole opens the page and the blocks (`kubectl px status`).
    bind(&ns, "proxy-operator-status-reader", "scraper").await;
    let (status, body, _) = get_with(addr, "/status/blocks.json", Some(&bearer(&scraper))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Through the API server's pod proxy the token comes in the forwarded header.
    let response = reqwest::Client::new()
        .get(format!("http://{addr}/status/blocks.json"))
        .header("x-proxy-operator-authorization", bearer(&scraper))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn insecure_serves_the_metrics_to_anyone() {
    let registry = prometheus::Registry::new();
    let addr: SocketAddr = ([127, 0, 0, 1], free_port().unwrap()).into();
    let stop = CancellationToken::new();
    let leases = Arc::new(LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    ));
    let state = ProbeState {
        view: LeaderView::always_serving(),
        leases,
        grants_wait_for_writes: false,
    };
    let pages = axum::Router::new().route("/status", get(|| async { "the status page" }));
    probes::serve(
        &stop,
        addr,
        registry,
        state,
        pages,
        &MetricsAuth::insecure(),
    )
    .await
    .unwrap();
    assert_eq!(get_with(addr, "/metrics", None).await.0, StatusCode::OK);
    assert_eq!(get_with(addr, "/status", None).await.1, "the status page");
    stop.cancel();
}
