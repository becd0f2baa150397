//! Who may read `/metrics` and the status page (`/status*`) on the metrics port (docs/metrics.md,
//! "Who may read the metrics"): as kubebuilder's default metrics server, a bearer token the API
//! server accepts (TokenReview, for its own audience: a Pod's ServiceAccount token, Prometheus's)
//! whose user may `get` the request's path as a non-resource URL (SubjectAccessReview). The
//! discovery API's review code and bounded caches (`leases::auth`), so a scrape costs no review
//! while its answer is cached. `--metrics-insecure` serves them to anyone (a local run).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::leasing::leases::Auth;
use crate::leasing::leases::auth::{AuthError, KubeAuthOptions, KubeReviewer};

/// A second header for the token, read when `Authorization` is absent: the API server's pod
/// proxy (how `kubectl px status` reaches the leader's `/status/blocks.json`) drops
/// `Authorization` once it has authenticated the user, and passes other headers on.
pub const FORWARDED_TOKEN_HEADER: &str = "x-proxy-operator-authorization";

/// Entries each review cache holds at most: scrapers and status readers are few.
const CACHE_CAPACITY: usize = 1024;

/// The check in front of the metrics port's `/metrics` and `/status*`.
pub struct MetricsAuth {
    /// `None`: `--metrics-insecure`.
    auth: Option<Auth>,
}

impl MetricsAuth {
    /// Everyone may read (`--metrics-insecure`).
    pub fn insecure() -> Arc<Self> {
        Arc::new(MetricsAuth { auth: None })
    }

    /// Tokens reviewed by `client`'s API server; the operator's ServiceAccount needs `create` on
    /// tokenreviews and subjectaccessreviews (deploy/rbac.yaml).
    pub fn kubernetes(client: kube::Client) -> Arc<Self> {
        Self::with_reviewer(Arc::new(KubeReviewer::new(client, "")))
    }

    /// Tokens reviewed by `reviewer` (the API server's own audience: what Prometheus presents).
    pub fn with_reviewer(reviewer: Arc<dyn crate::leasing::leases::auth::Reviewer>) -> Arc<Self> {
        let options = KubeAuthOptions {
            audience: String::new(),
            cache_capacity: CACHE_CAPACITY,
            // A user's own token (`kubectl px`'s kubeconfig) may be any bearer token.
            jwt_only: false,
            ..KubeAuthOptions::default()
        };
        Arc::new(MetricsAuth {
            auth: Some(Auth::none().with_kubernetes(reviewer, options)),
        })
    }

    /// `router`'s routes behind the check (the probes beside them are not: the kubelet calls
    /// them without a token).
    pub fn guard(self: &Arc<Self>, router: axum::Router) -> axum::Router {
        router.route_layer(axum::middleware::from_fn_with_state(self.clone(), check))
    }

    /// Whether the holder of `bearer` may `get` `path`.
    pub async fn allows(&self, bearer: Option<&str>, path: &str) -> Result<(), AuthError> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let caller = auth.authenticate(bearer).await.map_err(|e| match e {
            AuthError::Unauthenticated(_) => AuthError::Unauthenticated(
                "send `Authorization: Bearer <token>` with a token the API server accepts (a ServiceAccount's bound to the ClusterRole proxy-operator-metrics-reader; see docs/metrics.md), or run the operator with --metrics-insecure (a local run)"
                    .to_string(),
            ),
            other => other,
        })?;
        auth.authorize_path(&caller, path).await
    }
}

/// The bearer token of a request: `Authorization: Bearer …` (the scheme case-insensitive, RFC
/// 9110 §11.1), else the same in [`FORWARDED_TOKEN_HEADER`]. `None`: none, or not text.
pub fn bearer_of(headers: &HeaderMap) -> Option<&str> {
    let from = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
    };
    if headers.contains_key(header::AUTHORIZATION) {
        return from(header::AUTHORIZATION.as_str());
    }
    from(FORWARDED_TOKEN_HEADER)
}

/// The answer to a refused request: 401 (with `WWW-Authenticate`), 403 or 503, and why.
pub fn refusal(error: AuthError) -> Response {
    let (status, why) = match error {
        AuthError::Unauthenticated(why) => (StatusCode::UNAUTHORIZED, why),
        AuthError::Forbidden(why) => (StatusCode::FORBIDDEN, why),
        AuthError::Unavailable(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let mut response = (status, format!("{why}\n")).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"proxy-operator metrics\""),
        );
    }
    response
}

async fn check(State(auth): State<Arc<MetricsAuth>>, request: Request, next: Next) -> Response {
    let allowed = auth
        .allows(bearer_of(request.headers()), request.uri().path())
        .await;
    match allowed {
        Ok(()) => next.run(request).await,
        Err(e) => refusal(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_authorization_then_the_forwarded_header() {
        let headers = |pairs: &[(&str, &[u8])]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(
                    axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    HeaderValue::from_bytes(value).unwrap(),
                );
            }
            map
        };
        let long = format!("Bearer {}", "a".repeat(100_000));
        // (headers, token)
        let cases: Vec<(HeaderMap, Option<&str>)> = vec![
            (headers(&[]), None),
            (headers(&[("authorization", b"Bearer abc")]), Some("abc")),
            (headers(&[("authorization", b"bearer  abc ")]), Some("abc")),
            (headers(&[("authorization", b"Basic YTpi")]), None),
            (headers(&[("authorization", b"Bearer")]), None),
            (headers(&[("authorization", b"Bearer \xff\xfe")]), None),
            (
                headers(&[(FORWARDED_TOKEN_HEADER, b"Bearer fwd")]),
                Some("fwd"),
            ),
            // Authorization wins; a bad one is not replaced by the other header.
            (
                headers(&[
                    ("authorization", b"Bearer a"),
                    (FORWARDED_TOKEN_HEADER, b"Bearer b"),
                ]),
                Some("a"),
            ),
            (
                headers(&[
                    ("authorization", b"Basic x"),
                    (FORWARDED_TOKEN_HEADER, b"Bearer b"),
                ]),
                None,
            ),
            (
                headers(&[("authorization", long.as_bytes())]),
                Some(&long[7..]),
            ),
        ];
        for (map, token) in &cases {
            assert_eq!(bearer_of(map), *token, "{map:?}");
        }
    }

    #[test]
    fn a_refusal_says_why_with_the_status_of_its_kind() {
        let cases = [
            (AuthError::Unauthenticated("who?".into()), 401, true),
            (AuthError::Forbidden("not you".into()), 403, false),
            (AuthError::Unavailable("later".into()), 503, false),
        ];
        for (error, status, challenge) in cases {
            let response = refusal(error);
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(
                response.headers().contains_key(header::WWW_AUTHENTICATE),
                challenge
            );
        }
    }

    #[tokio::test]
    async fn insecure_lets_anyone_read() {
        assert_eq!(
            MetricsAuth::insecure().allows(None, "/metrics").await,
            Ok(())
        );
    }
}
