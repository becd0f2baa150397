//! The operator's Kubernetes client: kube's client, with a bounded retry of throttled requests.
//!
//! kube retries a 429 (and 503, 504) by default, but up to 15 times with a wait that doubles
//! from 5 ms to 1000 s (times up to 3 with jitter): under API throttling one request of a
//! reconcile or of a health round could sleep for minutes inside the client, unseen, and the
//! Proxy waited with it (issue #17: 5 of 20 Proxies unprovisioned after 240 s, no error logged).
//! Here a request is retried at most 10 times, each wait at least the server's `Retry-After` and
//! at most 2 s otherwise, as client-go does, and then fails: the caller's own backoff takes over (the controller's per-Proxy backoff, the
//! health engine's next round, the watchers' backoff) and the failure shows in the log.
//!
//! kube waits the server's `Retry-After` exactly, so every request refused in the same instant
//! (20 reconciles writing at once) comes back in the same instant, and one of them gets through
//! per second: each wait here is stretched by a random share of itself, up to double.

use std::time::Duration;

use anyhow::Context as _;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder};
use tower::BoxError;
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};

/// The first wait before retrying a request refused without a `Retry-After` (503, 504); it
/// doubles, jittered, up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(200);
/// The longest wait of the backoff; the server's `Retry-After` (1 s from kube-apiserver's
/// in-flight limit) may ask for longer, and is always waited.
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Retries of one request, as client-go makes (10): a throttled request gives up after ~10-20 s.
const RETRIES: u32 = 10;
/// Requests queued for the retrying client before callers wait (as kube's own client has).
const BUFFER: usize = 1024;

/// The client for in-cluster config or `KUBECONFIG`, retrying throttled requests a bounded
/// number of times.
pub async fn connect() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client config (in-cluster config or KUBECONFIG)")?;
    // Replaced by the bounded retry below.
    config.default_retry = false;
    let retry = RetryPolicy::new(RETRY_MIN, RETRY_MAX, RETRIES, true)
        .context("the API retry policy's bounds")?;
    let client = ClientBuilder::try_from(config)
        .context("building the Kubernetes client")?
        // Retry needs a cloneable service; the buffer makes the boxed one so.
        .with_layer(&BufferLayer::new(BUFFER))
        .with_layer(&RetryLayer::new(Jittered(retry)))
        .build();
    Ok(client)
}

/// kube's retry policy (which answers to retry, how many times, how long at least), with each
/// wait stretched by a random share of itself.
#[derive(Clone)]
struct Jittered(RetryPolicy);

impl<Res> Policy<hyper::Request<Body>, hyper::Response<Res>, BoxError> for Jittered {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        request: &mut hyper::Request<Body>,
        result: &mut Result<hyper::Response<Res>, BoxError>,
    ) -> Option<Self::Future> {
        let wait =
            Policy::<_, hyper::Response<Res>, BoxError>::retry(&mut self.0, request, result)?;
        let now = tokio::time::Instant::now();
        let wait = wait.deadline().saturating_duration_since(now);
        Some(tokio::time::sleep_until(
            now + stretched(wait, rand::random::<f64>()),
        ))
    }

    fn clone_request(&mut self, request: &hyper::Request<Body>) -> Option<hyper::Request<Body>> {
        Policy::<_, hyper::Response<Res>, BoxError>::clone_request(&mut self.0, request)
    }
}

/// `wait` plus `share` (0 to 1) of it.
fn stretched(wait: Duration, share: f64) -> Duration {
    wait + wait.mul_f64(share.clamp(0.0, 1.0))
}

/// Objects listed per page: the API server answers a page of this size in well under its 60 s
/// request timeout even at 10 000 Proxies (an unpaginated list of that many was cut by it).
pub const LIST_PAGE: u32 = 500;

/// Every object `params` selects, page by page (`limit` / `continue`, [`LIST_PAGE`] unless
/// `params` sets its own), so no list of a large fleet is one huge answer.
pub async fn list_all<K>(api: &kube::Api<K>, params: &kube::api::ListParams) -> kube::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    list_all_kept(api, params, Some).await
}

/// [`list_all`], keeping of each object only what `keep` makes of it (or nothing), page by page:
/// at fleet size a caller that needs a few fields of 10 000 objects holds one page of whole
/// objects at a time, not all of them (issue #30: the pool controller's list of its members
/// was the operator's largest allocation during a scale-up).
pub async fn list_all_kept<K, T>(
    api: &kube::Api<K>,
    params: &kube::api::ListParams,
    mut keep: impl FnMut(K) -> Option<T>,
) -> kube::Result<Vec<T>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.clone();
    if params.limit.is_none() {
        params = params.limit(LIST_PAGE);
    }
    let mut all = Vec::new();
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items.into_iter().filter_map(&mut keep));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(all),
        }
    }
}

/// Drops what a cached object carries for the API server's bookkeeping and no reader of the
/// cache uses: `managedFields` (server-side apply's record of every field's manager, about
/// 8 KB of JSON values per Proxy, ~70 % of a cached Proxy: heaptrack, docs/performance.md) and
/// the `kubectl.kubernetes.io/last-applied-configuration` annotation (a copy of the whole object
/// as `kubectl apply` sent it). For a watcher's `.modify()` ahead of a reflector.
pub fn trim_for_cache<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_object_keeps_everything_but_the_api_servers_bookkeeping() {
        let mut secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "px-1", "namespace": "crawlers", "resourceVersion": "42", "uid": "u-1",
                "labels": {"proxy-operator.dev/pool": "fleet"},
                "annotations": {
                    "proxy-operator.dev/draining": "true",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"kind\":\"Secret\"}"
                },
                "ownerReferences": [{"apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
                    "name": "px-1", "uid": "u-0", "controller": true}],
                "managedFields": [{"manager": "proxy-operator", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:password": {}}}}]
            },
            "data": {"password": "c2VjcmV0"}
        }))
        .unwrap();
        let before = secret.clone();
        trim_for_cache(&mut secret);
        assert_eq!(secret.metadata.managed_fields, None);
        assert_eq!(
            secret.metadata.annotations,
            Some(
                [(
                    "proxy-operator.dev/draining".to_string(),
                    "true".to_string()
                )]
                .into()
            )
        );
        // What readers use is untouched.
        assert_eq!(secret.data, before.data);
        assert_eq!(secret.metadata.labels, before.metadata.labels);
        assert_eq!(
            secret.metadata.owner_references,
            before.metadata.owner_references
        );
        assert_eq!(secret.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(secret.metadata.uid.as_deref(), Some("u-1"));
    }

    #[test]
    fn a_wait_is_stretched_by_its_share_up_to_double() {
        let cases = [
            (1000, 0.0, 1000),
            (1000, 0.5, 1500),
            (1000, 0.999, 1999),
            (1000, 1.0, 2000),
            // Out of range shares are clamped: never shorter than asked, never over double.
            (1000, -0.5, 1000),
            (1000, 7.0, 2000),
            (0, 0.5, 0),
        ];
        for (wait, share, expected) in cases {
            assert_eq!(
                stretched(Duration::from_millis(wait), share),
                Duration::from_millis(expected),
                "{wait} ms stretched by {share}"
            );
        }
    }
}
