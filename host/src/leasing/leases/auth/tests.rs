use std::collections::BTreeMap;
use std::sync::Mutex;

use base64::Engine as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

use super::cache::BoundedCache;
use super::kube_reviewer::{access_spec, user_of};
use super::*;
use crate::leasing::leases::store::ProxyKey;

fn key(ns: &str, name: &str) -> ProxyKey {
    ProxyKey {
        namespace: ns.into(),
        name: name.into(),
    }
}

/// A JWT-shaped token whose payload is `claims`.
fn jwt(claims: serde_json::Value) -> String {
    let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    format!(
        "{}.{}.c2ln",
        b64(br#"{"alg":"RS256"}"#),
        b64(claims.to_string().as_bytes())
    )
}

#[test]
fn the_scope_of_a_grant_and_the_access_it_needs() {
    let pool = key("team-a", "pool-a");
    let proxy = key("team-b", "px-1");
    let cases = [
        // (pool, proxy, scope, SAR namespace, SAR name)
        (
            Some(&pool),
            None,
            Scope::Pool(&pool),
            Some("team-a"),
            Some("pool-a"),
        ),
        (
            Some(&pool),
            Some(&proxy),
            Scope::Pool(&pool),
            Some("team-a"),
            Some("pool-a"),
        ),
        (
            None,
            Some(&proxy),
            Scope::Namespace("team-b"),
            Some("team-b"),
            None,
        ),
        (None, None, Scope::Cluster, None, None),
    ];
    for (pool, proxy, scope, namespace, name) in cases {
        let got = Scope::of_grant(pool, proxy);
        assert_eq!(got, scope);
        let access = Access::lease(&got);
        assert_eq!(
            (
                access.verb,
                access.group,
                access.resource,
                access.subresource
            ),
            ("create", "proxy-operator.dev", "proxypools", Some("lease"))
        );
        assert_eq!(access.namespace.as_deref(), namespace, "{scope}");
        assert_eq!(access.name.as_deref(), name, "{scope}");
    }
    assert_eq!(
        Access::list_proxies().describe(),
        "list on proxies.proxy-operator.dev cluster-wide (a ClusterRoleBinding)"
    );
}

#[test]
fn token_pools_parse_and_allow() {
    let pools: TokenPools = " team-a/pool-a, team-b/* ".parse().unwrap();
    assert_eq!(pools.to_string(), "team-a/pool-a,team-b/*");
    let (a, a2, b) = (
        key("team-a", "pool-a"),
        key("team-a", "pool-2"),
        key("team-b", "x"),
    );
    let cases = [
        (Scope::Pool(&a), true),
        (Scope::Pool(&a2), false),
        (Scope::Pool(&b), true),
        (Scope::Namespace("team-a"), false),
        (Scope::Namespace("team-b"), true),
        (Scope::Namespace("team-c"), false),
        (Scope::Cluster, false),
    ];
    for (scope, allowed) in cases {
        assert_eq!(pools.allows(&scope), allowed, "{scope}");
    }
    for bad in ["", " , ", "pool-a", "a/b/c", "/x", "x/", "*/*"] {
        let error = bad.parse::<TokenPools>().unwrap_err();
        assert!(
            error.contains("namespace") || error.contains("unset"),
            "{bad}: {error}"
        );
    }
}

#[test]
fn only_jwt_shaped_tokens_are_reviewed() {
    let long = format!("a.{}.c", "b".repeat(MAX_TOKEN_BYTES));
    for (token, jwt_like) in [
        ("eyJh.eyJi.c2ln", true),
        ("a-_b.c.d", true),
        ("static-token", false),
        ("a.b", false),
        ("a..c", false),
        ("a.b.c.d", false),
        ("a.b+/.c", false),
        (long.as_str(), false),
    ] {
        assert_eq!(looks_like_jwt(token), jwt_like, "{token:.40}");
    }
}

#[test]
fn a_cached_identity_never_outlives_its_token() {
    let ttl = Duration::from_secs(20);
    assert_eq!(
        jwt_expiry(&jwt(serde_json::json!({"exp": 1000}))),
        Some(1000)
    );
    assert_eq!(jwt_expiry(&jwt(serde_json::json!({"sub": "x"}))), None);
    assert_eq!(jwt_expiry("a.%%%.c"), None);
    for (expiry, now, expected) in [
        (None, 500, 20),
        (Some(1000), 500, 20),
        (Some(1000), 990, 10),
        (Some(1000), 1000, 0),
        (Some(1000), 2000, 0),
    ] {
        assert_eq!(
            allow_ttl(ttl, expiry, now),
            Duration::from_secs(expected),
            "{expiry:?} at {now}"
        );
    }
}

#[test]
fn a_token_review_answer_is_a_user_only_when_authenticated_for_the_audience() {
    let status =
        |authenticated: Option<bool>, audiences: Option<Vec<&str>>, username: Option<&str>| {
            Some(TokenReviewStatus {
                authenticated,
                audiences: audiences.map(|a| a.into_iter().map(String::from).collect()),
                user: Some(UserInfo {
                    username: username.map(String::from),
                    uid: Some("u-1".into()),
                    groups: Some(vec!["system:serviceaccounts".into()]),
                    extra: None,
                }),
                error: None,
            })
        };
    let ours = vec!["proxy-operator".to_string()];
    let sa = Some("system:serviceaccount:a:crawler");
    let cases = [
        (
            status(Some(true), Some(vec!["proxy-operator"]), sa),
            &ours,
            true,
        ),
        (
            status(Some(true), Some(vec!["https://kubernetes.default.svc"]), sa),
            &ours,
            false,
        ),
        (status(Some(true), None, sa), &ours, false),
        (status(Some(true), None, sa), &vec![], true),
        (
            status(Some(false), Some(vec!["proxy-operator"]), sa),
            &ours,
            false,
        ),
        (status(None, Some(vec!["proxy-operator"]), sa), &ours, false),
        (
            status(Some(true), Some(vec!["proxy-operator"]), Some("")),
            &ours,
            false,
        ),
        (
            status(Some(true), Some(vec!["proxy-operator"]), None),
            &ours,
            false,
        ),
        (None, &ours, false),
    ];
    for (i, (status, audiences, accepted)) in cases.into_iter().enumerate() {
        let user = user_of(status, audiences);
        assert_eq!(user.is_some(), accepted, "case {i}");
        if let Some(user) = user {
            assert_eq!(user.username, "system:serviceaccount:a:crawler");
            assert_eq!(user.uid, "u-1");
        }
    }
}

#[test]
fn the_access_review_carries_everything_the_token_review_said() {
    let user = User {
        username: "system:serviceaccount:a:crawler".into(),
        uid: "u-1".into(),
        groups: vec!["system:serviceaccounts".into()],
        extra: BTreeMap::from([(
            "authentication.kubernetes.io/pod-name".into(),
            vec!["p".into()],
        )]),
    };
    let pool = key("a", "pool-a");
    let spec = access_spec(&user, &Access::lease(&Scope::Pool(&pool)));
    assert_eq!(
        spec.user.as_deref(),
        Some("system:serviceaccount:a:crawler")
    );
    assert_eq!(spec.uid.as_deref(), Some("u-1"));
    assert_eq!(spec.groups, Some(user.groups.clone()));
    assert_eq!(spec.extra, Some(user.extra.clone()));
    let attributes = spec.resource_attributes.unwrap();
    assert_eq!(
        (
            attributes.verb.as_deref(),
            attributes.group.as_deref(),
            attributes.resource.as_deref(),
            attributes.subresource.as_deref(),
            attributes.namespace.as_deref(),
            attributes.name.as_deref()
        ),
        (
            Some("create"),
            Some("proxy-operator.dev"),
            Some("proxypools"),
            Some("lease"),
            Some("a"),
            Some("pool-a")
        )
    );
}

#[test]
fn only_the_holder_may_use_a_lease() {
    let sa = |name: &str| Caller::Kubernetes {
        user: Arc::new(User {
            username: name.into(),
            ..User::default()
        }),
        token: [0; 32],
    };
    let cases = [
        (Caller::StaticToken, None, true),
        (
            Caller::StaticToken,
            Some("system:serviceaccount:a:x"),
            false,
        ),
        (
            sa("system:serviceaccount:a:x"),
            Some("system:serviceaccount:a:x"),
            true,
        ),
        (
            sa("system:serviceaccount:a:y"),
            Some("system:serviceaccount:a:x"),
            false,
        ),
        (sa("system:serviceaccount:a:x"), None, false),
    ];
    for (caller, holder, allowed) in cases {
        assert_eq!(
            Auth::holds(&caller, holder),
            allowed,
            "{caller:?} on {holder:?}"
        );
    }
}

#[test]
fn the_cache_expires_and_stays_bounded_under_a_flood() {
    let cache = BoundedCache::new(100);
    let t0 = Instant::now();
    cache.insert(1u64, "a", Duration::from_secs(10), t0);
    assert_eq!(cache.get(&1, t0 + Duration::from_secs(9)), Some("a"));
    assert_eq!(cache.get(&1, t0 + Duration::from_secs(10)), None);
    cache.insert(2u64, "zero", Duration::ZERO, t0);
    assert_eq!(cache.get(&2, t0), None, "a zero TTL keeps nothing");
    // A flood of distinct keys, and of the same key again and again.
    for i in 0..100_000u64 {
        cache.insert(i, "x", Duration::from_secs(60), t0);
        cache.insert(7, "y", Duration::from_secs(60), t0);
    }
    assert!(cache.len() <= 100, "{}", cache.len());
    assert!(cache.order_len() <= 200, "{}", cache.order_len());
    assert_eq!(cache.get(&7, t0), Some("y"), "the newest entries stay");
    assert_eq!(cache.get(&99_999, t0), Some("x"));
}

/// Answers from a table, counting the reviews.
#[derive(Default)]
struct FakeReviewer {
    users: Mutex<BTreeMap<String, User>>,
    allowed: Mutex<Vec<Access>>,
    fail: Mutex<Option<String>>,
    hang: std::sync::atomic::AtomicBool,
    token_reviews: AtomicUsize,
    access_reviews: AtomicUsize,
}

impl Reviewer for FakeReviewer {
    fn review_token<'a>(&'a self, token: &'a str) -> Review<'a, Option<User>> {
        Box::pin(async move {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if let Some(e) = self.fail.lock().unwrap().clone() {
                return Err(ReviewError(e));
            }
            Ok(self.users.lock().unwrap().get(token).cloned())
        })
    }

    fn review_access<'a>(&'a self, _: &'a User, access: &'a Access) -> Review<'a, bool> {
        Box::pin(async move {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
            if let Some(e) = self.fail.lock().unwrap().clone() {
                return Err(ReviewError(e));
            }
            Ok(self.allowed.lock().unwrap().contains(access))
        })
    }
}

fn kube_auth(fake: Arc<FakeReviewer>, capacity: usize) -> Auth {
    Auth::none()
        .with_static_token("static", None)
        .with_kubernetes(
            fake,
            KubeAuthOptions {
                cache_capacity: capacity,
                timeout: Duration::from_millis(200),
                ..KubeAuthOptions::default()
            },
        )
}

#[tokio::test]
async fn reviews_are_cached_by_token_and_failures_are_never_an_allow() {
    let fake = Arc::new(FakeReviewer::default());
    let token = jwt(serde_json::json!({"sub": "x"}));
    fake.users.lock().unwrap().insert(
        token.clone(),
        User {
            username: "system:serviceaccount:a:crawler".into(),
            ..User::default()
        },
    );
    let pool = key("a", "pool-a");
    fake.allowed
        .lock()
        .unwrap()
        .push(Access::lease(&Scope::Pool(&pool)));
    let auth = kube_auth(fake.clone(), 100);

    assert!(matches!(
        auth.authenticate(Some("static")).await,
        Ok(Caller::StaticToken)
    ));
    assert_eq!(
        fake.token_reviews.load(Ordering::SeqCst),
        0,
        "the static token needs no review"
    );
    for bad in [None, Some(""), Some("wrong"), Some("a.b.c")] {
        assert!(
            matches!(
                auth.authenticate(bad).await,
                Err(AuthError::Unauthenticated(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        fake.token_reviews.load(Ordering::SeqCst),
        1,
        "only a.b.c looked like a JWT"
    );

    for _ in 0..3 {
        let caller = auth.authenticate(Some(&token)).await.unwrap();
        assert_eq!(caller.holder(), Some("system:serviceaccount:a:crawler"));
        auth.authorize_lease(&caller, &Scope::Pool(&pool))
            .await
            .unwrap();
        let other = key("a", "pool-b");
        let denied = auth.authorize_lease(&caller, &Scope::Pool(&other)).await;
        match denied {
            Err(AuthError::Forbidden(detail)) => assert!(
                detail.contains("create on proxypools/lease.proxy-operator.dev (resourceNames: pool-b) in namespace a"),
                "{detail}"
            ),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        fake.token_reviews.load(Ordering::SeqCst),
        2,
        "one review per token"
    );
    assert_eq!(
        fake.access_reviews.load(Ordering::SeqCst),
        2,
        "one per token and pool"
    );
    assert_eq!(auth.cached(), (2, 2));
}

/// A user allowed to lease from a/pool-a, and its token.
fn one_user(fake: &FakeReviewer) -> (String, ProxyKey) {
    let token = jwt(serde_json::json!({"sub": "x"}));
    fake.users.lock().unwrap().insert(
        token.clone(),
        User {
            username: "system:serviceaccount:a:crawler".into(),
            ..User::default()
        },
    );
    let pool = key("a", "pool-a");
    fake.allowed
        .lock()
        .unwrap()
        .push(Access::lease(&Scope::Pool(&pool)));
    (token, pool)
}

#[tokio::test]
async fn a_review_that_fails_or_hangs_is_unavailable_never_an_allow() {
    let fake = Arc::new(FakeReviewer::default());
    let (token, pool) = one_user(&fake);
    let auth = kube_auth(fake.clone(), 100);
    let caller = auth.authenticate(Some(&token)).await.unwrap();
    auth.authorize_lease(&caller, &Scope::Pool(&pool))
        .await
        .unwrap();
    assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 1);
    // The API server away: a new token is 503, never an allow, and the failure is not cached.
    *fake.fail.lock().unwrap() = Some("connection refused".into());
    let fresh = jwt(serde_json::json!({"sub": "y"}));
    for _ in 0..2 {
        match auth.authenticate(Some(&fresh)).await {
            Err(AuthError::Unavailable(detail)) => {
                assert!(
                    detail.contains("TokenReview failed: connection refused"),
                    "{detail}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        fake.token_reviews.load(Ordering::SeqCst),
        3,
        "failures are not cached"
    );
    // A decision not cached yet fails the same way.
    let caller = auth.authenticate(Some(&token)).await.unwrap();
    let third = key("a", "pool-c");
    assert!(matches!(
        auth.authorize_lease(&caller, &Scope::Pool(&third)).await,
        Err(AuthError::Unavailable(_))
    ));
    // A review that hangs ends at the deadline.
    *fake.fail.lock().unwrap() = None;
    fake.hang.store(true, Ordering::SeqCst);
    let started = Instant::now();
    match auth.authenticate(Some(&fresh)).await {
        Err(AuthError::Unavailable(detail)) => {
            assert!(detail.contains("took longer than 200 ms"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_flood_of_distinct_tokens_keeps_the_caches_bounded() {
    let fake = Arc::new(FakeReviewer::default());
    let auth = kube_auth(fake.clone(), 500);
    for i in 0..5_000 {
        let token = jwt(serde_json::json!({"sub": i}));
        assert!(matches!(
            auth.authenticate(Some(&token)).await,
            Err(AuthError::Unauthenticated(_))
        ));
    }
    assert_eq!(fake.token_reviews.load(Ordering::SeqCst), 5_000);
    let (tokens, decisions) = auth.cached();
    assert!(tokens <= 500 && decisions == 0, "{tokens} {decisions}");
}

#[tokio::test]
async fn a_static_token_limited_to_pools() {
    let auth = Auth::none().with_static_token("static", Some("a/pool-a,b/*".parse().unwrap()));
    let caller = auth.authenticate(Some("static")).await.unwrap();
    let (a, a2, b) = (key("a", "pool-a"), key("a", "pool-2"), key("b", "any"));
    assert!(
        auth.authorize_lease(&caller, &Scope::Pool(&a))
            .await
            .is_ok()
    );
    assert!(
        auth.authorize_lease(&caller, &Scope::Pool(&b))
            .await
            .is_ok()
    );
    for scope in [Scope::Pool(&a2), Scope::Cluster, Scope::Namespace("a")] {
        match auth.authorize_lease(&caller, &scope).await {
            Err(AuthError::Forbidden(detail)) => {
                assert!(
                    detail.contains("only from the pools a/pool-a,b/*"),
                    "{detail}"
                )
            }
            other => panic!("{scope}: {other:?}"),
        }
    }
    assert!(matches!(
        auth.authorize_list(&caller).await,
        Err(AuthError::Forbidden(_))
    ));
    let open = Auth::none().with_static_token("static", None);
    assert!(open.authorize_list(&Caller::StaticToken).await.is_ok());
    assert!(
        open.authorize_lease(&Caller::StaticToken, &Scope::Cluster)
            .await
            .is_ok()
    );
    // Without Kubernetes auth a JWT is just a wrong token, with the old advice.
    match open.authenticate(Some("a.b.c")).await {
        Err(AuthError::Unauthenticated(detail)) => assert_eq!(
            detail,
            "send `Authorization: Bearer <token>` with the token of the discovery Secret"
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_kubernetes_user_takes_the_holder_name_of_a_team_credential() {
    let fake = Arc::new(FakeReviewer::default());
    let token = jwt(serde_json::json!({"sub": "x"}));
    fake.users.lock().unwrap().insert(
        token.clone(),
        User {
            username: "credential:team-a/crawlers".into(),
            ..User::default()
        },
    );
    let auth = kube_auth(fake, 100);
    assert!(matches!(
        auth.authenticate(Some(&token)).await,
        Err(AuthError::Unauthenticated(_))
    ));
}
