//! `kubectl px drain`, `recycle` and `scale`: the annotations and field the operator already
//! acts on (docs/pools.md), set by merge patch, and what each will do in words. The patches and
//! words are pure; `apply` sends one.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::exit::Failure;
use super::fleet::qualified_name;
use super::table::relative;
use crate::api::Proxy;
use crate::api::labels::{
    DRAIN_REASON_ANNOTATION, DRAINING_ANNOTATION, POOL_LABEL, RECYCLE_ANNOTATION,
};

/// The drain reason `kubectl px drain` writes (the pool writes its own: `Recycled`, …).
pub const MANUAL: &str = "Manual";

/// The annotations of a drain, or (`undo`) their removal.
pub fn drain_patch(undo: bool) -> Value {
    if undo {
        json!({"metadata": {"annotations": {DRAINING_ANNOTATION: null, DRAIN_REASON_ANNOTATION: null}}})
    } else {
        json!({"metadata": {"annotations": {DRAINING_ANNOTATION: "true", DRAIN_REASON_ANNOTATION: MANUAL}}})
    }
}

pub fn recycle_patch() -> Value {
    json!({"metadata": {"annotations": {RECYCLE_ANNOTATION: "true"}}})
}

pub fn scale_patch(replicas: i32) -> Value {
    json!({"spec": {"replicas": replicas}})
}

fn pool_of(proxy: &Proxy) -> Option<String> {
    proxy.labels().get(POOL_LABEL).cloned()
}

/// What a drain does to this Proxy, said after it is set. `lease_until_ms`: its lease's end,
/// when the lease table says it is leased.
pub fn drained(proxy: &Proxy, undo: bool, lease_until_ms: Option<u64>, now_ms: u64) -> String {
    let key = qualified_name(&proxy.namespace().unwrap_or_default(), &proxy.name_any());
    let lease = match lease_until_ms {
        Some(until) => format!("its lease ends {}", relative(until, now_ms)),
        None => "it holds no lease".to_string(),
    };
    match (undo, pool_of(proxy)) {
        (true, Some(pool)) => format!(
            "{key} is leased again. (Pool {pool} may have made its replacement already, and then scales the surplus down.)\n"
        ),
        (true, None) => format!("{key} is leased again.\n"),
        (false, Some(pool)) => format!(
            "{key} is draining: it takes no new lease; pool {pool} makes a replacement and deletes it once its lease ends ({lease}).\n"
        ),
        (false, None) => format!(
            "{key} is draining: it takes no new lease ({lease}). It is in no pool, so nothing replaces or deletes it: `kubectl delete px {}` when it is free, or `kubectl px drain --undo {}`.\n",
            proxy.name_any(),
            proxy.name_any()
        ),
    }
}

/// Recycling needs a pool to make the replacement.
pub fn check_recyclable(proxy: &Proxy) -> Result<String, Failure> {
    pool_of(proxy).ok_or_else(|| {
        Failure::error(format!(
            "{} is in no pool: nothing would make its replacement; `kubectl px drain {}` stops its leases, `kubectl delete px {}` removes it",
            qualified_name(&proxy.namespace().unwrap_or_default(), &proxy.name_any()),
            proxy.name_any(),
            proxy.name_any()
        ))
    })
}

pub fn recycled(proxy: &Proxy, pool: &str) -> String {
    format!(
        "{} will be replaced: pool {pool} makes a new Proxy, then drains this one within its maxSurge and maxUnavailable and deletes it once its lease ends.\n",
        qualified_name(&proxy.namespace().unwrap_or_default(), &proxy.name_any()),
    )
}

pub fn scaled(key: &str, from: i32, to: i32) -> String {
    if from == to {
        format!("{key} keeps {to} Proxies (unchanged).\n")
    } else {
        format!("{key} scaled from {from} to {to} Proxies.\n")
    }
}

/// Sends a merge patch; the field manager names the plugin.
pub async fn apply<K>(api: &Api<K>, name: &str, patch: &Value, what: &str) -> Result<K, Failure>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams {
            field_manager: Some("kubectl-px".into()),
            ..Default::default()
        },
        &Patch::Merge(patch),
    )
    .await
    .map_err(|e| Failure::kube(&format!("{what} {name}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faces::kubectl::fleet::tests::proxy;

    #[test]
    fn the_patches_are_what_the_operator_reads() {
        assert_eq!(
            drain_patch(false)["metadata"]["annotations"],
            json!({"proxy-operator.dev/draining": "true", "proxy-operator.dev/drain-reason": "Manual"})
        );
        assert_eq!(
            drain_patch(true)["metadata"]["annotations"],
            json!({"proxy-operator.dev/draining": null, "proxy-operator.dev/drain-reason": null})
        );
        assert_eq!(
            recycle_patch(),
            json!({"metadata": {"annotations": {"proxy-operator.dev/recycle": "true"}}})
        );
        assert_eq!(scale_patch(5), json!({"spec": {"replicas": 5}}));
    }

    #[test]
    fn each_action_says_what_will_happen() {
        const NOW: u64 = 1_800_000_000_000;
        let member = proxy("egress-a", Some("egress"), json!({"phase": "Ready"}));
        let lone = proxy("lone", None, json!({"phase": "Ready"}));
        assert_eq!(
            drained(&member, false, Some(NOW + 240_000), NOW),
            "crawl/egress-a is draining: it takes no new lease; pool egress makes a replacement and deletes it once its lease ends (its lease ends in 4m).\n"
        );
        assert!(
            drained(&lone, false, None, NOW)
                .contains("It is in no pool, so nothing replaces or deletes it")
        );
        assert_eq!(
            drained(&lone, true, None, NOW),
            "crawl/lone is leased again.\n"
        );
        assert_eq!(check_recyclable(&member).unwrap(), "egress");
        let refused = check_recyclable(&lone).unwrap_err();
        assert!(
            refused.message.starts_with("crawl/lone is in no pool"),
            "{}",
            refused.message
        );
        assert_eq!(
            scaled("crawl/egress", 3, 5),
            "crawl/egress scaled from 3 to 5 Proxies.\n"
        );
    }
}
