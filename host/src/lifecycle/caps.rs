//! Caps per provider instance (docs/pools.md, "Caps per provider instance"): what counts against
//! an instance's cap (its `limits` in the providers config) and how many creates the cap allows.
//! Pure; the pool controller asks before every create of a scale-up or a rotation, the Proxy
//! controller before provisioning a Proxy applied directly.
//!
//! The rules:
//! - every Proxy of the instance counts, in any namespace, whatever its phase, unless it is being
//!   deleted: one not yet provisioned is about to be, and leaving it out would let a burst of
//!   new Proxies pass the cap together;
//! - a scale-up makes at most `cap - counted`;
//! - a rotation (a pool replacing old members, which still count until they are drained and
//!   deleted) makes at most `cap + maxSurge - counted`: it may overshoot by its surge, never more;
//! - lowering a cap deletes and drains nothing by itself; an instance over its cap only gets no
//!   new Proxies, and its old members are let go without a replacement as they come up for
//!   rotation, until the instance is back at its cap.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::Proxy;
use crate::api::labels::POOL_LABEL;

/// An instance's cap and how many Proxies count against it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Use {
    pub cap: usize,
    pub counted: usize,
}

/// The instances a pool may make Proxies on that have a cap, by name (no entry: no cap).
pub type Caps = BTreeMap<String, Use>;

/// Whether `proxy` counts against the cap of `instance`.
pub fn counts(proxy: &Proxy, instance: &str) -> bool {
    proxy.spec.provider == instance && proxy.metadata.deletion_timestamp.is_none()
}

/// How many more Proxies the instance may get: up to its cap, or for a rotation up to the cap
/// plus the pool's surge (`surge` 0 otherwise).
pub fn headroom(used: Use, surge: usize) -> usize {
    (used.cap + surge).saturating_sub(used.counted)
}

/// How many Proxies the instance has beyond its cap (after the cap was lowered).
pub fn over(used: Use) -> usize {
    used.counted.saturating_sub(used.cap)
}

/// A Proxy of an instance as the Proxy controller orders them: a Proxy applied directly is
/// provisioned only while fewer than the cap go before it, so two waiting for one free place do
/// not both take it (nor both wait forever).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// `namespace/name`, for a stable order among Proxies made in the same millisecond.
    pub key: String,
    pub created_ms: u64,
    /// Sent to the provider already (a placement or an instance is recorded), or made by a pool
    /// (which held its creates to the cap itself): it goes before any Proxy still waiting.
    pub placed: bool,
}

impl Queued {
    pub fn of(proxy: &Proxy) -> Queued {
        let status = proxy.status.as_ref();
        Queued {
            key: format!(
                "{}/{}",
                proxy.namespace().unwrap_or_default(),
                proxy.name_any()
            ),
            created_ms: crate::api::created_ms(&proxy.metadata),
            placed: made_by_a_pool(proxy)
                || status.is_some_and(|s| s.placement.is_some() || s.provider_id.is_some()),
        }
    }
}

/// Whether a pool made this Proxy (its label, and a ProxyPool as its controlling owner).
pub fn made_by_a_pool(proxy: &Proxy) -> bool {
    proxy.labels().contains_key(POOL_LABEL)
        && proxy
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "ProxyPool")
}

/// How many of `others` (the other Proxies counting against the instance) go before `me`:
/// every placed one, and the waiting ones applied earlier.
pub fn ahead_of<'a>(me: &Queued, others: impl IntoIterator<Item = &'a Queued>) -> usize {
    others
        .into_iter()
        .filter(|other| other.placed || (other.created_ms, &other.key) < (me.created_ms, &me.key))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::empty(Use { cap: 20, counted: 0 }, 0, 20)]
    #[case::some_room(Use { cap: 20, counted: 17 }, 0, 3)]
    #[case::at_cap(Use { cap: 20, counted: 20 }, 0, 0)]
    #[case::over_after_lowering(Use { cap: 3, counted: 5 }, 0, 0)]
    #[case::rotation_may_surge(Use { cap: 20, counted: 20 }, 2, 2)]
    #[case::rotation_surge_counts_what_surged(Use { cap: 20, counted: 21 }, 2, 1)]
    #[case::rotation_over_after_lowering(Use { cap: 3, counted: 5 }, 2, 0)]
    #[case::cap_zero_freezes(Use { cap: 0, counted: 0 }, 0, 0)]
    fn headroom_is_the_cap_less_what_counts(
        #[case] used: Use,
        #[case] surge: usize,
        #[case] want: usize,
    ) {
        assert_eq!(headroom(used, surge), want, "{used:?} surge {surge}");
    }

    #[rstest]
    #[case(Use { cap: 3, counted: 5 }, 2)]
    #[case(Use { cap: 3, counted: 3 }, 0)]
    #[case(Use { cap: 3, counted: 1 }, 0)]
    fn over_is_what_counts_beyond_the_cap(#[case] used: Use, #[case] want: usize) {
        assert_eq!(over(used), want);
    }

    fn proxy(provider: &str, extra: serde_json::Value) -> Proxy {
        let mut value = serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"provider": provider},
        });
        for (key, more) in extra.as_object().unwrap() {
            for (field, v) in more.as_object().unwrap() {
                value[key][field] = v.clone();
            }
        }
        serde_json::from_value(value).unwrap()
    }

    #[rstest]
    #[case::pending(serde_json::json!({}), true)]
    #[case::provisioned(serde_json::json!({"status": {"phase": "Ready", "providerId": "i-1"}}), true)]
    #[case::failed(serde_json::json!({"status": {"phase": "Failed"}}), true)]
    #[case::deleting(serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}}), false)]
    fn what_counts_against_the_cap(#[case] extra: serde_json::Value, #[case] want: bool) {
        assert_eq!(counts(&proxy("gcp-eu", extra.clone()), "gcp-eu"), want);
        assert!(
            !counts(&proxy("other", extra), "gcp-eu"),
            "another instance's never counts"
        );
    }

    fn queued(key: &str, created_ms: u64, placed: bool) -> Queued {
        Queued {
            key: key.into(),
            created_ms,
            placed,
        }
    }

    #[rstest]
    #[case::placed_always_go_first(queued("a/late", 9, true), 1)]
    #[case::earlier_waiting_goes_first(queued("a/early", 1, false), 1)]
    #[case::later_waiting_goes_after(queued("a/late", 9, false), 0)]
    #[case::same_time_by_name_before(queued("a/a", 5, false), 1)]
    #[case::same_time_by_name_after(queued("a/z", 5, false), 0)]
    fn who_goes_before_a_waiting_proxy(#[case] other: Queued, #[case] want: usize) {
        let me = queued("a/m", 5, false);
        assert_eq!(ahead_of(&me, [&other]), want, "{other:?}");
    }

    #[test]
    fn the_queue_is_read_from_the_proxy() {
        let waiting = proxy("gcp-eu", serde_json::json!({}));
        assert!(!Queued::of(&waiting).placed);
        assert_eq!(Queued::of(&waiting).key, "team-a/p");
        let placed = proxy(
            "gcp-eu",
            serde_json::json!({"status": {"placement": {"provider": "gcp-eu"}}}),
        );
        assert!(Queued::of(&placed).placed);
        let member = proxy(
            "gcp-eu",
            serde_json::json!({"metadata": {
                "labels": {POOL_LABEL: "web"},
                "ownerReferences": [{"apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool", "name": "web", "uid": "u", "controller": true}],
            }}),
        );
        assert!(made_by_a_pool(&member) && Queued::of(&member).placed);
    }
}
