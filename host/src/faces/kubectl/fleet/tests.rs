use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::leasing::leases::ProxyKey;
use crate::leasing::leases::store::{Lease, Snapshot};

const NOW: u64 = 1_800_000_000_000;

fn time(ms: u64) -> String {
    rfc3339(ms)
}

pub(crate) fn proxy(name: &str, pool: Option<&str>, status: serde_json::Value) -> Proxy {
    let mut labels = json!({});
    if let Some(pool) = pool {
        labels[POOL_LABEL] = pool.into();
    }
    serde_json::from_value(json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": {"name": name, "namespace": "crawl", "labels": labels,
                     "creationTimestamp": time(NOW - 300_000)},
        "spec": {"provider": "store", "port": 3128},
        "status": status,
    }))
    .unwrap()
}

fn ready(address: &str, exit_ip: Option<&str>) -> serde_json::Value {
    let mut status = json!({
        "phase": "Ready",
        "address": address,
        "port": 3128,
        "providerID": "i-1",
        "conditions": [{"type": "Ready", "status": "True", "reason": "Healthy", "message": "",
                        "lastTransitionTime": time(NOW)}],
    });
    if let Some(ip) = exit_ip {
        status["exitIP"] = ip.into();
    }
    status
}

fn pool(name: &str, replicas: i32, ready_replicas: i32) -> ProxyPool {
    serde_json::from_value(json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": name, "namespace": "crawl", "creationTimestamp": time(NOW - 7_200_000)},
        "spec": {"replicas": replicas, "template": {"spec": {"provider": "store"}}},
        "status": {"replicas": replicas, "readyReplicas": ready_replicas, "leasedReplicas": 1,
                   "updatedReplicas": replicas, "drainingReplicas": 1,
                   "conditions": [{"type": "Ready", "status": if ready_replicas >= replicas {"True"} else {"False"},
                                   "reason": "ScalingUp", "message": "", "lastTransitionTime": time(NOW)}]},
    }))
    .unwrap()
}

fn provider(name: &str, ready: bool, plugin: &str) -> ProviderHealth {
    serde_json::from_value(json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProviderHealth",
        "metadata": {"name": name},
        "spec": {"providerType": "test"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": if ready {"True"} else {"False"},
                 "reason": if ready {"Ok"} else {"QuotaExceeded"}, "message": "1 of 1 targets ok",
                 "lastTransitionTime": time(NOW)},
                {"type": "PluginLoaded", "status": "True", "reason": "Loaded", "message": plugin,
                 "lastTransitionTime": time(NOW)}],
            "targetsSummary": if ready {"1/1"} else {"0/1"},
            "lastCheckTime": time(NOW - 20_000),
        },
    }))
    .unwrap()
}

fn lease(proxy: &str, expires: u64, session: Option<&str>) -> Lease {
    Lease {
        id: "0".repeat(32),
        proxy: ProxyKey::parse(proxy).unwrap(),
        granted_at_ms: NOW - 60_000,
        expires_at_ms: expires,
        session: session.map(Arc::from),
        pool: None,
        provider: "store".into(),
        ttl_ms: 0,
        holder: None,
    }
}

/// A pool with four proxies in four states, two providers, and the lease table's word on them.
fn fleet() -> Fleet {
    let snapshot = Snapshot {
        leases: vec![lease("crawl/egress-a", NOW + 240_000, Some("jar-1"))],
        cooldowns: [("crawl/egress-b".into(), NOW + 540_000)].into(),
        target_cooldowns: [(
            "crawl/egress-a".into(),
            [
                (
                    crate::leasing::leases::store::persisted_target("shop.example").unwrap(),
                    NOW + 300_000,
                ),
                ("ff".repeat(16), NOW + 600_000),
            ]
            .into(),
        )]
        .into(),
        blocked_reports: [("crawl/egress-a".into(), 2), ("crawl/egress-b".into(), 1)].into(),
        ..Default::default()
    };
    let mut draining = proxy("egress-d", Some("egress"), ready("10.0.0.4", None));
    draining
        .annotations_mut()
        .insert(DRAINING_ANNOTATION.into(), "true".into());
    Fleet {
        pools: vec![pool("egress", 3, 2)],
        proxies: vec![
            proxy("egress-b", Some("egress"), ready("10.0.0.2", None)),
            proxy(
                "egress-a",
                Some("egress"),
                ready("10.0.0.1", Some("198.51.100.7")),
            ),
            proxy(
                "egress-c",
                Some("egress"),
                json!({"phase": "Unhealthy", "conditions": [{"type": "Ready", "status": "False",
                       "reason": "Unhealthy", "message": "", "lastTransitionTime": time(NOW)}]}),
            ),
            draining,
            proxy("lone", None, json!({"phase": "Pending"})),
        ],
        providers: vec![
            provider("store", true, "test 0.1.0 (sha256 0a1b2c3d4e5f)"),
            provider("cloud", false, "gcp 0.1.0 (sha256 99aa88bb77cc)"),
        ],
        leases: LeaseFacts::from_snapshot(snapshot, NOW),
        now_ms: NOW,
        target: Some((
            "shop.example".into(),
            crate::leasing::leases::store::persisted_target("shop.example").unwrap(),
        )),
        recent_blocks: Some(Ok(vec![
            TargetBlocks {
                target: "shop.example".into(),
                blocks: 2,
            },
            TargetBlocks {
                target: "none".into(),
                blocks: 1,
            },
        ])),
    }
}

#[test]
fn the_fleet_reads_as_one_screen() {
    let fleet = fleet();
    let view = view(&fleet);
    let screen = render(&view, false, NOW, false);
    let expected = "\
POOL     DESIRED   READY   LEASED   COOLING   DRAINING   UP-TO-DATE   PROVIDER   AGE
egress   3         2       1        1         1          3            store      2h

PROVIDER   TYPE   READY   REASON          TARGETS   PLUGIN                             CHECKED
cloud      test   False   QuotaExceeded   0/1       gcp 0.1.0 (sha256 99aa88bb77cc)    20s ago
store      test   True    Ok              1/1       test 0.1.0 (sha256 0a1b2c3d4e5f)   20s ago

PROXY      PHASE       REASON      POOL     AGE   EXIT-IP        LEASE                HOLDER                         EXPIRES
egress-a   Ready       Healthy     egress   5m    198.51.100.7   leased               static token (session jar-1)   in 4m
egress-b   Ready       Healthy     egress   5m    -              cooling down in 9m   -                              -
egress-c   Unhealthy   Unhealthy   egress   5m    -              -                    -                              -
egress-d   Ready       Healthy     egress   5m    -              draining             -                              -
lone       Pending     -           -        5m    -              -                    -                              -

PROXY      BLOCKED   COOLING DOWN (ALL)   TARGETS COOLING        FOR shop.example
egress-a   2         -                    2 (last ends in 10m)   in 5m
egress-b   1         in 9m                -                      -

TARGET         BLOCKS (LAST HOUR)
shop.example   2
none           1
(none: reports naming no host)
";
    assert_eq!(screen, expected, "\n{screen}");
}

#[test]
fn every_namespace_adds_the_column_and_json_carries_the_facts() {
    let fleet = fleet();
    let view = view(&fleet);
    let screen = render(&view, true, NOW, false);
    assert!(screen.starts_with("NAMESPACE   POOL"), "{screen}");
    assert!(
        screen.contains("\ncrawl       egress-a   Ready"),
        "{screen}"
    );
    let json = serde_json::to_value(&view).unwrap();
    let a = &json["proxies"][0];
    assert_eq!(a["name"], "egress-a");
    assert_eq!(a["exitIP"], "198.51.100.7");
    assert_eq!(a["lease"]["holder"], "static token");
    assert_eq!(a["lease"]["session"], "jar-1");
    assert_eq!(a["lease"]["expiresAt"], rfc3339(NOW + 240_000));
    assert_eq!(a["address"], "10.0.0.1:3128");
    assert_eq!(json["pools"][0]["cooling"], 1);
    assert_eq!(
        json["providers"][1]["plugin"],
        "test 0.1.0 (sha256 0a1b2c3d4e5f)"
    );
    assert_eq!(
        json["blocks"][0]["targetCooldownUntil"],
        rfc3339(NOW + 300_000)
    );
    assert_eq!(json["target"], "shop.example");
    assert_eq!(
        json["recentBlocks"],
        json!([{"target": "shop.example", "blocks": 2}, {"target": "none", "blocks": 1}])
    );
    assert_eq!(json["notes"], json!([]));
}

#[test]
fn an_unreadable_lease_table_is_a_note_not_a_failure() {
    let mut fleet = fleet();
    fleet.leases = LeaseFacts::unreadable("configmaps is forbidden".into());
    fleet.target = None;
    let screen = render(&view(&fleet), false, NOW, false);
    assert!(
        screen.ends_with(
            "\nNote: the lease table could not be read (configmaps is forbidden): lease holders, cooldowns and blocks are not shown\n"
        ),
        "{screen}"
    );
    assert!(!screen.contains("BLOCKED"), "{screen}");
}

#[test]
fn blocks_the_leader_could_not_be_asked_for_are_a_note() {
    let mut fleet = fleet();
    fleet.recent_blocks = Some(Err(
        "no Pod in namespace proxy-operator has the label".into()
    ));
    let view = view(&fleet);
    let screen = render(&view, false, NOW, false);
    assert!(!screen.contains("TARGET "), "{screen}");
    assert!(
        screen.ends_with(
            "\nNote: recent blocks by target are not shown: no Pod in namespace proxy-operator has the label\n"
        ),
        "{screen}"
    );
    assert!(
        serde_json::to_value(&view)
            .unwrap()
            .get("recentBlocks")
            .is_none()
    );
}

#[test]
fn an_empty_namespace_says_so() {
    let fleet = Fleet {
        now_ms: NOW,
        target: Some(("a.example".into(), "00".into())),
        ..Default::default()
    };
    assert_eq!(
        render(&view(&fleet), false, NOW, false),
        "No Proxies.\n\nNo proxy cools down for a.example.\n"
    );
}

/// A pool a provider instance's cap holds back says so under the tables, naming the instance
/// and the figure; one that is not capped (or no longer) says nothing.
#[test]
fn a_capped_pool_is_noted_with_its_cap() {
    let mut capped = pool("web", 5, 3);
    capped.status.as_mut().unwrap().conditions.push(
        serde_json::from_value(json!({"type": "CapReached", "status": "True",
            "reason": "ProviderCapReached",
            "message": "provider instance gcp-eu is at its cap of 3 Proxies (limits.maxProxies); 3 of 5 replicas made",
            "lastTransitionTime": time(NOW)}))
        .unwrap(),
    );
    let mut lifted = pool("api", 2, 2);
    lifted.status.as_mut().unwrap().conditions.push(
        serde_json::from_value(json!({"type": "CapReached", "status": "False",
            "reason": "BelowCap", "message": "no provider instance's cap holds the pool back",
            "lastTransitionTime": time(NOW)}))
        .unwrap(),
    );
    let fleet = Fleet {
        pools: vec![capped, lifted],
        now_ms: NOW,
        ..Default::default()
    };
    let view = view(&fleet);
    assert_eq!(
        view.notes,
        [
            "pool crawl/web is capped (CapReached): provider instance gcp-eu is at its cap of 3 Proxies (limits.maxProxies); 3 of 5 replicas made"
        ]
    );
    let screen = render(&view, false, NOW, false);
    assert!(
        screen.contains("Note: pool crawl/web is capped (CapReached): provider instance gcp-eu is at its cap of 3 Proxies"),
        "{screen}"
    );
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["pools"][0]["name"], "api");
    assert_eq!(json["pools"][0].get("capReached"), None);
    assert_eq!(json["pools"][1]["name"], "web");
    assert!(json["pools"][1]["capReached"].is_string());
}
