//! When an object is reconciled again after a failed reconcile.
//!
//! A provider's own wish (the `Retry-After` of a transient error, a quota's minute) is kept as it
//! is. A failed request to the API server (throttled with 429, timed out, refused) backs off per
//! object instead of the fixed 5 s it had: kube's watcher backoff (0.8 s doubling to 30 s,
//! jittered), so 20 Proxies refused together do not all come back together every 5 s into an
//! API server that is already refusing, and never sooner than the API server asked (the
//! `retryAfterSeconds` of a 429). A reconcile that succeeds starts its object's backoff afresh.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::watcher::DefaultBackoff;

/// A provider error without a wish of its own is tried again after this long.
pub const PROVIDER_RETRY: Duration = Duration::from_secs(5);

/// What a failed reconcile asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The provider decides (`None`: it has no wish; [`PROVIDER_RETRY`]).
    Provider(Option<Duration>),
    /// The object's own backoff, but at least `at_least` (the API server's `Retry-After`).
    Backoff { at_least: Option<Duration> },
}

/// What a failed request to the API server asks for: the backoff, at least as long as a 429's
/// `retryAfterSeconds`.
pub fn after_api_error(error: &kube::Error) -> Wait {
    let at_least = match error {
        kube::Error::Api(status) if status.code == 429 => status
            .details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(s.into())),
        _ => None,
    };
    Wait::Backoff { at_least }
}

/// How long to wait, given the wait asked for and the object's next backoff step (taken only
/// when the wait is a backoff, so a provider's retries do not lengthen the API's).
pub fn delay(wait: Wait, next_backoff: impl FnOnce() -> Duration) -> Duration {
    match wait {
        Wait::Provider(after) => after.unwrap_or(PROVIDER_RETRY),
        Wait::Backoff { at_least } => next_backoff().max(at_least.unwrap_or_default()),
    }
}

/// Each object's backoff (by its key: the controllers use `api::ProxyKey`), from its first
/// failed reconcile to its next successful one.
pub struct Backoffs<K>(Mutex<HashMap<K, DefaultBackoff>>);

impl<K> Default for Backoffs<K> {
    fn default() -> Self {
        Backoffs(Mutex::new(HashMap::new()))
    }
}

impl<K: std::hash::Hash + Eq> Backoffs<K> {
    /// The delay before reconciling `key` again after a failure that asks for `wait`.
    pub fn after_failure(&self, key: K, wait: Wait) -> Duration {
        let mut backoffs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        delay(wait, || {
            backoffs
                .entry(key)
                .or_default()
                .next()
                // DefaultBackoff never ends; its ceiling, should that ever change.
                .unwrap_or(Duration::from_secs(30))
        })
    }

    /// `key` reconciled: its next failure waits the shortest step again.
    pub fn succeeded(&self, key: &K) {
        let mut backoffs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        backoffs.remove(key);
    }

    /// Objects with a backoff under way.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::{Status, response::StatusDetails};

    fn api_error(code: u16, retry_after_seconds: Option<u32>) -> kube::Error {
        let mut status = Status::failure("refused", "TooManyRequests").with_code(code);
        status.details = retry_after_seconds.map(|s| StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: s,
        });
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn the_wait_after_a_failed_request_to_the_api_server() {
        let secs = Duration::from_secs;
        let cases = [
            ("429 asking for 3 s", api_error(429, Some(3)), Some(secs(3))),
            ("429 without a wish", api_error(429, None), None),
            ("429 asking for 0 s", api_error(429, Some(0)), None),
            ("409 conflict", api_error(409, Some(3)), None),
            ("500", api_error(500, None), None),
        ];
        for (case, error, at_least) in cases {
            assert_eq!(
                after_api_error(&error),
                Wait::Backoff { at_least },
                "{case}"
            );
        }
    }

    #[test]
    fn the_delay_for_each_wait() {
        let secs = Duration::from_secs;
        let cases = [
            (
                "provider's wish",
                Wait::Provider(Some(secs(60))),
                secs(2),
                secs(60),
            ),
            (
                "provider, no wish",
                Wait::Provider(None),
                secs(2),
                PROVIDER_RETRY,
            ),
            (
                "backoff",
                Wait::Backoff { at_least: None },
                secs(2),
                secs(2),
            ),
            (
                "the server asks for longer",
                Wait::Backoff {
                    at_least: Some(secs(5)),
                },
                secs(2),
                secs(5),
            ),
            (
                "the backoff is longer",
                Wait::Backoff {
                    at_least: Some(secs(1)),
                },
                secs(8),
                secs(8),
            ),
        ];
        for (case, wait, backoff, expected) in cases {
            assert_eq!(delay(wait, || backoff), expected, "{case}");
        }
    }

    #[test]
    fn a_provider_wait_leaves_the_backoff_where_it_was() {
        let mut taken = false;
        delay(Wait::Provider(None), || {
            taken = true;
            Duration::ZERO
        });
        assert!(!taken);
    }

    #[test]
    fn each_object_backs_off_on_its_own_and_a_success_starts_it_again() {
        let backoffs = Backoffs::default();
        let key = |name: &str| ("ns".to_string(), name.to_string());
        let api = Wait::Backoff { at_least: None };
        let a: Vec<Duration> = (0..6)
            .map(|_| backoffs.after_failure(key("a"), api))
            .collect();
        // Doubling from 0.8 s (jitter adds up to one more step), to the 30 s ceiling.
        assert!(a[0] >= Duration::from_millis(800) && a[0] < Duration::from_millis(1700));
        assert!(a[5] > Duration::from_secs(12), "{a:?}");
        assert!(a.iter().all(|d| *d <= Duration::from_secs(60)), "{a:?}");
        // Another object starts at the bottom; a provider failure does not move the backoff.
        assert!(backoffs.after_failure(key("b"), api) < Duration::from_millis(1700));
        assert_eq!(
            backoffs.after_failure(key("a"), Wait::Provider(None)),
            PROVIDER_RETRY
        );
        backoffs.succeeded(&key("a"));
        assert!(backoffs.after_failure(key("a"), api) < Duration::from_millis(1700));
        backoffs.succeeded(&key("a"));
        backoffs.succeeded(&key("b"));
        assert!(backoffs.is_empty());
    }
}
