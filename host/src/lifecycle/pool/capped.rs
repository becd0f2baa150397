//! The pool controller's side of the caps per provider instance (`crate::lifecycle::caps`): what
//! counts against the instances of a pool's slots, read from the operator's cache of Proxies,
//! and the pool's `CapReached` condition with its Event. Its own check before the creates, apart
//! from any other (a namespace's quota), so each can change alone.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::decide::{Desired, Member, Plan};
use crate::api::conditions::{BELOW_CAP, CAP_REACHED, PROVIDER_CAP_REACHED, set_named};
use crate::api::{Proxy, ProxyPool};
use crate::leasing::leases::ProxyKey;
use crate::lifecycle::caps::{self, Caps, Use};
use crate::provider::limits::ProxyCap;
use crate::provider::providers::Providers;
use crate::support::events::EventType;

/// The caps of a pool's instances: what the plan needs, and what the messages say.
#[derive(Default)]
pub(super) struct PoolCaps {
    pub uses: Caps,
    pub caps: BTreeMap<String, ProxyCap>,
    /// Held while the pool counts, creates and waits for the cache to show its creates: one pool
    /// on capped instances at a time, so two never count the same free places.
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// The turn pools on capped instances take (see [`PoolCaps`]).
pub(super) type Turns = std::sync::Arc<tokio::sync::Mutex<()>>;

/// How long a pool waits, after its creates, for the cache to show them (so the next pool's
/// count has them); a watch event usually takes milliseconds.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The caps of the instances of the pool's slots, and what counts against each: the other
/// Proxies of the instance from the cache (every namespace the operator watches), and the
/// pool's own from `members` (a fresh list: its creates of the step before are always seen).
/// Nothing is read when no instance of the pool has a cap.
pub(super) async fn caps_for(
    pool: &ProxyPool,
    desired: &Desired,
    members: &[Member],
    providers: &Providers,
    (cache, turns): (&Store<Proxy>, &Turns),
) -> PoolCaps {
    let mut out = PoolCaps::default();
    for slot in &desired.slots {
        if let Some(cap) = providers.get(&slot.provider).and_then(|p| p.cap()) {
            out.caps.insert(slot.provider.clone(), cap);
        }
    }
    if out.caps.is_empty() {
        return out;
    }
    out._turn = Some(turns.clone().lock_owned().await);
    // Until the cache has listed every Proxy once, it would count too few.
    if cache.wait_until_ready().await.is_err() {
        tracing::warn!("the cache of Proxies is gone; counting the pool's own only");
    }
    let uid = pool.uid().unwrap_or_default();
    let others = cache.state();
    for (instance, cap) in &out.caps {
        let theirs = others
            .iter()
            .filter(|p| caps::counts(p, instance))
            .filter(|p| !p.owner_references().iter().any(|o| o.uid == uid))
            .count();
        let ours = members
            .iter()
            .filter(|m| !m.deleting && m.slot.provider == *instance)
            .count();
        out.uses.insert(
            instance.clone(),
            Use {
                cap: cap.proxies,
                counted: theirs + ours,
            },
        );
    }
    out
}

/// After the creates of `plan`: waits (at most [`SETTLE`]) until the cache shows the pool's new
/// Proxies on its capped instances, so the next pool to take the turn counts them.
pub(super) async fn settle(
    caps: &PoolCaps,
    cache: &Store<Proxy>,
    pool: &ProxyPool,
    members: &[Member],
    plan: &Plan,
) {
    if caps.caps.is_empty() || plan.create.is_empty() {
        return;
    }
    let uid = pool.uid().unwrap_or_default();
    let known: std::collections::HashSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
    let shown = |instance: &str| {
        cache
            .state()
            .iter()
            .filter(|p| p.spec.provider == instance && !known.contains(p.name_any().as_str()))
            .filter(|p| p.owner_references().iter().any(|o| o.uid == uid))
            .count()
    };
    let deadline = tokio::time::Instant::now() + SETTLE;
    for instance in caps.caps.keys() {
        let made = plan
            .create
            .iter()
            .filter(|s| s.provider == *instance)
            .count();
        while shown(instance) < made && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// Whether each pool was held back by a cap when last announced, as this controller published
/// it: a reconcile that reads the pool from a cache not yet showing its own status write does
/// not announce the same turn twice.
#[derive(Default)]
pub(super) struct Announced(std::sync::Mutex<std::collections::HashMap<ProxyKey, bool>>);

impl Announced {
    /// What this controller last announced of the pool, if anything.
    pub(super) fn get(&self, pool: &ProxyKey) -> Option<bool> {
        let known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.get(pool).copied()
    }

    /// Records what the status now says (after it is written).
    pub(super) fn set(&self, pool: ProxyKey, capped: bool) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.insert(pool, capped);
    }

    /// A deleted pool's: a new pool of the same name starts from its own status.
    pub(super) fn forget(&self, pool: &ProxyKey) {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        known.remove(pool);
    }
}

/// Sets `CapReached` from the plan: `True` naming each instance and its figure while a cap holds
/// creates back, `False` once none does (and absent on a pool no cap ever held). The Event to
/// publish when it turned, once per transition: `announced` is what this controller last said
/// of the pool (the condition says it otherwise).
pub(super) fn set_condition(
    conditions: &mut Vec<Condition>,
    plan: &Plan,
    desired: &Desired,
    caps: &PoolCaps,
    announced: Option<bool>,
    generation: Option<i64>,
) -> Option<(EventType, &'static str, String)> {
    let was = announced.or_else(|| {
        conditions
            .iter()
            .find(|c| c.type_ == CAP_REACHED)
            .map(|c| c.status == "True")
    });
    let capped = !plan.capped.is_empty();
    if !capped && was.is_none() {
        return None;
    }
    let message = if capped {
        held_back(plan, desired.replicas, &caps.caps)
    } else {
        "no provider instance's cap holds the pool back".to_string()
    };
    let reason = if capped {
        PROVIDER_CAP_REACHED
    } else {
        BELOW_CAP
    };
    set_named(
        conditions,
        CAP_REACHED,
        capped,
        reason,
        &message,
        generation,
    );
    match (was == Some(true), capped) {
        (false, true) => Some((EventType::Warning, CAP_REACHED, message)),
        (true, false) => Some((EventType::Normal, BELOW_CAP, message)),
        _ => None,
    }
}

/// e.g. `provider instance gcp-eu is at its cap of 20 Proxies (limits.maxProxies); 3 of 5
/// replicas made`.
fn held_back(plan: &Plan, replicas: usize, caps: &BTreeMap<String, ProxyCap>) -> String {
    let each: Vec<String> = plan
        .capped
        .iter()
        .map(|instance| match caps.get(instance) {
            Some(cap) => format!(
                "provider instance {instance} is at its cap of {} Proxies ({})",
                cap.proxies, cap.source
            ),
            None => format!("provider instance {instance} is at its cap"),
        })
        .collect();
    format!(
        "{}; {} of {replicas} replicas made",
        each.join("; "),
        plan.counts.replicas
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::pool::decide::Counts;

    fn desired() -> Desired {
        Desired {
            replicas: 5,
            template_hash: "h".into(),
            slots: vec![],
            expire_after: None,
            recycle_after: None,
            max_surge: 1,
            max_unavailable: 0,
        }
    }

    fn caps() -> PoolCaps {
        PoolCaps {
            uses: Caps::new(),
            _turn: None,
            caps: BTreeMap::from([(
                "gcp-eu".to_string(),
                ProxyCap {
                    proxies: 20,
                    source: "limits.maxProxies".into(),
                },
            )]),
        }
    }

    fn plan(capped: bool, made: usize) -> Plan {
        Plan {
            capped: if capped {
                vec!["gcp-eu".into()]
            } else {
                vec![]
            },
            counts: Counts {
                replicas: made,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The condition names the instance and the figure, and its Event comes once per turn.
    #[test]
    fn cap_reached_turns_with_one_event_each_way() {
        let mut conditions = Vec::new();
        let set = |conditions: &mut Vec<Condition>, capped, made| {
            set_condition(
                conditions,
                &plan(capped, made),
                &desired(),
                &caps(),
                None,
                Some(1),
            )
        };
        assert_eq!(set(&mut conditions, false, 5), None);
        assert!(conditions.is_empty(), "no cap ever held it: no condition");

        let (type_, reason, message) = set(&mut conditions, true, 3).unwrap();
        assert_eq!((type_, reason), (EventType::Warning, "CapReached"));
        assert_eq!(
            message,
            "provider instance gcp-eu is at its cap of 20 Proxies (limits.maxProxies); 3 of 5 replicas made"
        );
        assert_eq!(
            (conditions[0].status.as_str(), conditions[0].reason.as_str()),
            ("True", "ProviderCapReached")
        );
        assert_eq!(
            set(&mut conditions, true, 4),
            None,
            "still capped: no Event"
        );
        assert!(conditions[0].message.contains("4 of 5"));

        let (type_, reason, _) = set(&mut conditions, false, 5).unwrap();
        assert_eq!((type_, reason), (EventType::Normal, "BelowCap"));
        assert_eq!(conditions[0].status, "False");
        assert_eq!(set(&mut conditions, false, 5), None);
    }

    /// After its creates a pool waits for the cache to show them (the next pool counts from it),
    /// and goes on at once when it does.
    #[tokio::test]
    async fn settle_returns_once_the_cache_shows_the_creates() {
        use kube::runtime::watcher;
        let pool: ProxyPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "web", "namespace": "crawl", "uid": "pool-uid"},
            "spec": {"replicas": 1, "template": {"spec": {"provider": "gcp-eu"}}},
        }))
        .unwrap();
        let made: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "Proxy",
            "metadata": {"name": "web-new", "namespace": "crawl", "ownerReferences": [
                {"apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool", "name": "web",
                 "uid": "pool-uid", "controller": true}]},
            "spec": {"provider": "gcp-eu"},
        }))
        .unwrap();
        let (cache, mut writer) = kube::runtime::reflector::store::<Proxy>();
        writer.apply_watcher_event(&watcher::Event::Apply(made));
        let mut creates = plan(true, 1);
        creates.create = vec![crate::lifecycle::pool::decide::Slot {
            provider: "gcp-eu".into(),
            zone: None,
        }];
        let started = std::time::Instant::now();
        settle(&caps(), &cache, &pool, &[], &creates).await;
        assert!(started.elapsed() < SETTLE, "it went on at once");
    }

    /// A reconcile reading the pool from a cache that does not show its last status write yet
    /// announces nothing again.
    #[test]
    fn a_turn_already_announced_is_not_announced_again() {
        let mut stale = Vec::new();
        let capped = plan(true, 3);
        let again = set_condition(&mut stale, &capped, &desired(), &caps(), Some(true), None);
        assert_eq!(again, None);
        assert_eq!(stale[0].status, "True", "the condition is still written");

        let announced = Announced::default();
        let key = ProxyKey {
            namespace: "crawl".into(),
            name: "web".into(),
        };
        assert_eq!(announced.get(&key), None);
        announced.set(key.clone(), true);
        assert_eq!(announced.get(&key), Some(true));
        announced.forget(&key);
        assert_eq!(announced.get(&key), None);
    }
}
