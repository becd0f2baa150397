//! Caps per provider instance with the real operator binary, the real API server and the real
//! test provider: a pool stops at its instance's `limits.maxProxies` and says so, a raised cap
//! lets it grow, a lowered one deletes nothing; a Proxy applied directly waits for room.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use proxy_operator::api::labels::{DRAINING_ANNOTATION, POOL_LABEL};
use proxy_operator::api::{Phase, Proxy, ProxyPool};

use super::common::operator_process::OperatorProcess;
use super::world::World;

struct Setup {
    world: World,
    operator: OperatorProcess,
}

impl Setup {
    /// The providers config: the test provider's instance `store` with `limits`.
    fn set_limits(&self, limits: &str) {
        let entry = self.world.store.provider_entry("store");
        std::fs::write(
            &self.world.config,
            format!("providers:\n{entry}  limits: {limits}\n"),
        )
        .unwrap();
    }

    async fn apply(&self, yaml: &str) {
        self.world
            .cp
            .kubectl_run(&["apply", "-f", "-"], Some(yaml))
            .await
            .unwrap();
    }

    async fn members(&self) -> Vec<Proxy> {
        let api: Api<Proxy> = self.world.ns.api();
        api.list(&kube::api::ListParams::default().labels(&format!("{POOL_LABEL}=web")))
            .await
            .unwrap()
            .items
    }

    /// Waits until `get` gives something `done` accepts.
    async fn wait<T: std::fmt::Debug>(
        &self,
        what: &str,
        get: impl AsyncFn() -> T,
        done: impl Fn(&T) -> bool,
    ) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let seen = get().await;
            if done(&seen) {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {seen:#?}\n{}",
                self.operator.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn pool(&self) -> ProxyPool {
        self.world.ns.api::<ProxyPool>().get("web").await.unwrap()
    }

    async fn proxy(&self, name: &str) -> Proxy {
        self.world.ns.api::<Proxy>().get(name).await.unwrap()
    }

    /// The `CapReached` events of the namespace, as (object, type, message, series count).
    async fn cap_events(&self) -> Vec<(String, String, String, Option<i64>)> {
        let events = super::events_of(self.world.cp, &self.world.ns).await;
        events
            .iter()
            .filter(|e| e["reason"] == "CapReached")
            .map(|e| {
                (
                    e["regarding"]["name"].as_str().unwrap_or_default().into(),
                    e["type"].as_str().unwrap_or_default().into(),
                    e["note"].as_str().unwrap_or_default().into(),
                    e["series"]["count"].as_i64(),
                )
            })
            .collect()
    }
}

/// The `CapReached` condition's status and message.
fn cap_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == "CapReached")
        .map(|c| (c.status.clone(), c.message.clone()))
}

fn pool_cap(pool: &ProxyPool) -> Option<(String, String)> {
    cap_condition(&pool.status.as_ref()?.conditions)
}

fn proxy_cap(proxy: &Proxy) -> Option<(String, String)> {
    cap_condition(&proxy.status.as_ref()?.conditions)
}

fn pool_yaml(ns: &str, replicas: i32, port: u16) -> String {
    named_pool_yaml(ns, "web", replicas, port)
}

fn named_pool_yaml(ns: &str, name: &str, replicas: i32, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: store\n      port: {port}\n"
    )
}

fn proxy_yaml(ns: &str, name: &str, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  provider: store\n  port: {port}\n"
    )
}

/// A pool of 5 on an instance capped at 3 stops at 3 with `CapReached` naming the instance and
/// the figure, one Warning Event and `kubectl get pp` showing it; a Proxy applied directly then
/// waits `Pending`. Raising the cap to 6 lets the pool reach 5 (the condition turns False) and
/// the waiting Proxy be made; lowering it to 2 deletes and drains nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_stops_at_its_instances_cap_and_a_lowered_cap_deletes_nothing() {
    let world = World::start("pp-caps").await;
    let entry = world.store.provider_entry("store");
    std::fs::write(
        &world.config,
        format!("providers:\n{entry}  limits: {{maxProxies: 3}}\n"),
    )
    .unwrap();
    let operator = world
        .operator_with(&["--providers-config-reload-interval", "1s"])
        .await;
    let s = Setup { world, operator };
    let ns = s.world.ns.name().to_string();
    let port = s.world.squid.port();

    s.apply(&pool_yaml(&ns, 5, port)).await;
    let pool = s
        .wait(
            "the pool held at 3 by the cap",
            || s.pool(),
            |p| {
                pool_cap(p).is_some_and(|(status, _)| status == "True")
                    && p.status.as_ref().is_some_and(|st| st.ready_replicas == 3)
            },
        )
        .await;
    let (_, message) = pool_cap(&pool).unwrap();
    assert_eq!(
        message,
        "provider instance store is at its cap of 3 Proxies (limits.maxProxies); 3 of 5 replicas made"
    );
    let conditions = &pool.status.as_ref().unwrap().conditions;
    let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(
        ready
            .message
            .ends_with("a provider instance's cap holds back the others (see CapReached)"),
        "{}",
        ready.message
    );
    assert_eq!(s.members().await.len(), 3, "no more than the cap made");
    let table = s
        .world
        .cp
        .kubectl_run(&["get", "pp", "web", "-n", &ns], None)
        .await
        .unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    let capped = header.iter().position(|h| *h == "CAPPED").expect(&table);
    assert_eq!(row[capped], "True", "{table}");

    // A Proxy applied directly waits for room, Pending, saying why.
    s.apply(&proxy_yaml(&ns, "solo", port)).await;
    let solo = s
        .wait(
            "the direct Proxy held by the cap",
            || s.proxy("solo"),
            |p| proxy_cap(p).is_some_and(|(status, _)| status == "True"),
        )
        .await;
    assert_eq!(solo.status.as_ref().unwrap().phase, Some(Phase::Pending));
    let (_, message) = proxy_cap(&solo).unwrap();
    assert!(
        message.starts_with(
            "provider instance store is at its cap of 3 Proxies (limits.maxProxies); 3 go before this one"
        ),
        "{message}"
    );
    assert!(solo.status.unwrap().provider_id.is_none());

    // One Warning each, however many reconciles saw the cap.
    let events = s
        .wait(
            "a CapReached Event for the pool and the Proxy",
            || s.cap_events(),
            |events| events.len() >= 2,
        )
        .await;
    for (object, type_, note, series) in &events {
        assert_eq!(type_, "Warning", "{events:?}");
        assert!(
            note.starts_with("provider instance store is at its cap of 3 Proxies"),
            "{note}"
        );
        assert_eq!(*series, None, "{object}: published once, not per reconcile");
    }
    let mut objects: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    objects.sort();
    assert_eq!(objects, ["solo", "web"]);

    // A raised cap: the pool reaches 5, the condition turns False, the Proxy is made.
    s.set_limits("{maxProxies: 6}");
    let pool = s
        .wait(
            "the pool at 5 after the cap is raised",
            || s.pool(),
            |p| {
                pool_cap(p).is_some_and(|(status, _)| status == "False")
                    && p.status.as_ref().is_some_and(|st| st.ready_replicas == 5)
            },
        )
        .await;
    assert_eq!(pool.status.unwrap().replicas, 5);
    let solo = s
        .wait(
            "the direct Proxy made once there is room",
            || s.proxy("solo"),
            |p| p.status.as_ref().and_then(|st| st.phase) == Some(Phase::Ready),
        )
        .await;
    assert_eq!(
        proxy_cap(&solo).map(|(status, _)| status),
        Some("False".to_string())
    );

    // A lowered cap: a new Proxy waits (so the operator has it), nothing is deleted or drained.
    s.set_limits("{maxProxies: 2}");
    s.apply(&proxy_yaml(&ns, "late", port)).await;
    let late = s
        .wait(
            "a new Proxy held by the lowered cap",
            || s.proxy("late"),
            |p| proxy_cap(p).is_some_and(|(_, message)| message.contains("cap of 2 Proxies")),
        )
        .await;
    assert_eq!(late.status.unwrap().phase, Some(Phase::Pending));
    let members = s.members().await;
    assert_eq!(members.len(), 5, "nothing deleted");
    assert!(
        members
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none()
                && !p.annotations().contains_key(DRAINING_ANNOTATION)),
        "nothing drained: {:?}",
        members.iter().map(|p| p.annotations()).collect::<Vec<_>>()
    );
    let solo = s.proxy("solo").await;
    assert_eq!(solo.status.unwrap().phase, Some(Phase::Ready));
    let pool = s.pool().await;
    assert_eq!(
        pool_cap(&pool).map(|(status, _)| status),
        Some("False".to_string()),
        "at its replicas: not held back"
    );
}

/// Two pools scaling up on one capped instance at the same moment: together they never pass the
/// cap (each counts the other's creates), and both say they are held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_racing_for_one_capped_instance_never_pass_the_cap() {
    let world = World::start("pp-caps-race").await;
    let entry = world.store.provider_entry("store");
    std::fs::write(
        &world.config,
        format!("providers:\n{entry}  limits: {{maxProxies: 4}}\n"),
    )
    .unwrap();
    let operator = world.operator().await;
    let s = Setup { world, operator };
    let ns = s.world.ns.name().to_string();
    let port = s.world.squid.port();
    let both = format!(
        "{}---\n{}",
        named_pool_yaml(&ns, "a", 5, port),
        named_pool_yaml(&ns, "b", 5, port)
    );
    s.apply(&both).await;
    let api: Api<Proxy> = s.world.ns.api();
    let pools: Api<ProxyPool> = s.world.ns.api();
    let mut most = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let proxies = api.list(&Default::default()).await.unwrap().items;
        most = most.max(proxies.len());
        assert!(
            proxies.len() <= 4,
            "the two pools together passed the cap of 4: {:?}",
            proxies.iter().map(|p| p.name_any()).collect::<Vec<_>>()
        );
        let capped = |name: &str| {
            let pools = pools.clone();
            let name = name.to_string();
            async move {
                let pool = pools.get(&name).await.unwrap();
                pool_cap(&pool).is_some_and(|(status, _)| status == "True")
            }
        };
        let ready = proxies
            .iter()
            .filter(|p| p.status.as_ref().and_then(|st| st.phase) == Some(Phase::Ready))
            .count();
        if ready == 4 && capped("a").await && capped("b").await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} Proxies, {ready} Ready\n{}",
            proxies.len(),
            s.operator.proc.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(most, 4, "the two pools together stay within the cap of 4");
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 4);
}
