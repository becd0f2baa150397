use std::time::Duration;

use super::grants::MAX_ENDED;
use super::picking::MAX_RETRY_AFTER;
use super::*;

fn store_of_one() -> LeaseStore {
    let store = LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    );
    store.restore(Snapshot::default());
    store.set_provisioned(vec![ProvisionedProxy {
        key: ProxyKey {
            namespace: "ns".into(),
            name: "only".into(),
        },
        provider: "p".into(),
        zone: None,
        labels: BTreeMap::new(),
        address: "127.0.0.1".into(),
        exit_ip: None,
        port: 3128,
        healthy: true,
        pool: None,
        draining: false,
        login: None,
        protocol: Default::default(),
    }]);
    store
}

#[tokio::test]
async fn a_grant_is_confirmed_only_by_a_write_that_holds_it() {
    let store = store_of_one();
    let before = store.version();
    store.grant(&LeaseRequest::default()).unwrap();
    let granted = store.version();
    assert!(granted > before);
    let wait = Duration::from_millis(50);
    assert_eq!(
        store.wait_stored(granted, wait).await,
        Err(NotStored::TimedOut)
    );
    // A write of older changes confirms nothing newer.
    let pending = store.take_changes().unwrap();
    assert_eq!(pending.version, granted);
    assert!(!pending.whole);
    assert!(
        matches!(pending.changes[..], [Change::Granted(_)]),
        "{pending:?}"
    );
    store.mark_stored(before);
    assert_eq!(
        store.wait_stored(granted, wait).await,
        Err(NotStored::TimedOut)
    );
    store.mark_stored(pending.version);
    assert_eq!(store.wait_stored(granted, wait).await, Ok(()));
}

#[tokio::test]
async fn closing_the_store_ends_every_wait_at_once_and_versions_go_on() {
    let store = Arc::new(store_of_one());
    store.grant(&LeaseRequest::default()).unwrap();
    let granted = store.version();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.wait_stored(granted, Duration::from_secs(3600)).await })
    };
    tokio::task::yield_now().await;
    store.close();
    assert_eq!(waiting.await.unwrap(), Err(NotStored::Closed));
    // The next term restores what the cluster has; its changes get new versions.
    store.restore(Snapshot::default());
    assert_eq!(store.wait_stored(granted, Duration::ZERO).await, Ok(()));
    store.set_provisioned(vec![]);
    assert!(store.version() >= granted);
}

#[test]
fn ended_ids_are_remembered_in_bounded_memory() {
    let store = store_of_one();
    let mut first = None;
    for _ in 0..MAX_ENDED + 10 {
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        store.release(&lease.id).unwrap();
        first.get_or_insert(lease.id);
    }
    let inner = store.lock();
    assert_eq!(inner.ended.len(), MAX_ENDED);
    assert_eq!(inner.ended_order.len(), MAX_ENDED);
    drop(inner);
    // The oldest were forgotten (404), the newest are still known (410).
    assert_eq!(
        store.report(first.as_deref().unwrap(), Outcome::Success),
        Err(LeaseError::NotFound)
    );
}

// ---- pools, sessions, targets, draining, renewals: the store's decisions as tables ----

pub(super) fn key(name: &str) -> ProxyKey {
    ProxyKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn pool_key(name: &str) -> PoolKey {
    key(name)
}

/// `name`: provider `p`, zone `z`, label `tier: cheap`, healthy, in `pool` if given.
pub(super) fn entry(name: &str, pool: Option<&str>) -> ProvisionedProxy {
    ProvisionedProxy {
        key: key(name),
        provider: "p".into(),
        zone: Some("z".into()),
        labels: BTreeMap::from([("tier".into(), "cheap".into())]),
        address: "127.0.0.1".into(),
        port: 3128,
        exit_ip: None,
        healthy: true,
        pool: pool.map(Into::into),
        draining: false,
        login: None,
        protocol: Default::default(),
    }
}

pub(super) fn store_of(entries: Vec<ProvisionedProxy>) -> LeaseStore {
    let store = LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    );
    store.restore(Snapshot::default());
    store.set_provisioned(entries);
    store
}

fn in_pool(pool: &str) -> LeaseRequest {
    LeaseRequest {
        pool: Some(pool_key(pool)),
        ..Default::default()
    }
}

pub(super) fn with_session(session: &str) -> LeaseRequest {
    LeaseRequest {
        session: Some(session.into()),
        ..Default::default()
    }
}

/// The name granted, or the refusal's reason.
fn outcome(store: &LeaseStore, request: &LeaseRequest) -> Result<String, &'static str> {
    store
        .grant(request)
        .map(|(lease, _)| lease.proxy.name.to_string())
        .map_err(|e| e.reason())
}

#[test]
fn which_proxy_a_grant_gets_or_why_not() {
    let draining = ProvisionedProxy {
        draining: true,
        ..entry("draining", Some("b"))
    };
    let sick = ProvisionedProxy {
        healthy: false,
        ..entry("sick", Some("c"))
    };
    let pool = || {
        vec![
            entry("a1", Some("a")),
            draining.clone(),
            sick.clone(),
            entry("loose", None),
        ]
    };
    let request = |f: fn(&mut LeaseRequest)| {
        let mut r = LeaseRequest::default();
        f(&mut r);
        r
    };
    let cases: Vec<(&str, LeaseRequest, Result<&str, &str>)> = vec![
        ("a pool's proxy", in_pool("a"), Ok("a1")),
        (
            "a pool no proxy names and no ProxyPool",
            in_pool("nope"),
            Err("unknown_pool"),
        ),
        (
            "a pool of only a draining proxy: it will be replaced",
            in_pool("b"),
            Err("no_proxy"),
        ),
        (
            "a pool of only an unhealthy proxy",
            in_pool("c"),
            Err("no_proxy"),
        ),
        (
            "labels no proxy has",
            request(|r| r.selector = BTreeMap::from([("tier".into(), "gold".into())])),
            Err("no_match"),
        ),
        (
            "a provider nobody has",
            request(|r| r.provider = Some("q".into())),
            Err("no_match"),
        ),
        (
            "a zone nobody has",
            request(|r| r.zone = Some("y".into())),
            Err("no_match"),
        ),
        (
            "a pool's proxy without its labels",
            LeaseRequest {
                selector: BTreeMap::from([("tier".into(), "gold".into())]),
                ..in_pool("a")
            },
            Err("no_match"),
        ),
        (
            "the draining proxy by name",
            request(|r| r.proxy = Some(key("draining"))),
            Err("draining"),
        ),
        (
            "a proxy in no pool, by name",
            request(|r| r.proxy = Some(key("loose"))),
            Ok("loose"),
        ),
    ];
    for (what, request, expected) in cases {
        let store = store_of(pool());
        let got = outcome(&store, &request);
        assert_eq!(got.as_deref().map_err(|e| *e), expected, "{what}");
    }
}

#[test]
fn a_known_pool_without_proxies_and_an_empty_cluster_are_busy_not_unmatchable() {
    let store = store_of(vec![]);
    assert_eq!(outcome(&store, &LeaseRequest::default()), Err("no_proxy"));
    assert_eq!(
        outcome(
            &store,
            &LeaseRequest {
                provider: Some("q".into()),
                ..Default::default()
            }
        ),
        Err("no_proxy"),
        "nothing is provisioned yet: capacity may come"
    );
    assert_eq!(outcome(&store, &in_pool("scaling")), Err("unknown_pool"));
    store.set_known_pools([("ns".to_string(), "scaling".to_string())]);
    assert_eq!(outcome(&store, &in_pool("scaling")), Err("no_proxy"));
    store.set_provisioned(vec![entry("s1", Some("scaling"))]);
    assert_eq!(outcome(&store, &in_pool("scaling")), Ok("s1".into()));
    // Forgotten by the controller, still known while a proxy names it.
    store.set_known_pools(Vec::<PoolKey>::new());
    assert_eq!(outcome(&store, &in_pool("scaling")), Err("no_proxy"));
}

#[test]
fn retry_after_is_the_next_matching_lease_or_cooldown_to_end() {
    let store = store_of(vec![entry("a1", Some("a")), entry("b1", Some("b"))]);
    let short = LeaseRequest {
        ttl: Some(Duration::from_secs(20)),
        ..in_pool("a")
    };
    store.grant(&short).unwrap();
    let long = LeaseRequest {
        ttl: Some(Duration::from_secs(50)),
        ..in_pool("b")
    };
    store.grant(&long).unwrap();
    let retry = |request: &LeaseRequest| match store.grant(request) {
        Err(GrantError::NoProxy { retry_after }) => retry_after.as_secs(),
        other => panic!("{other:?}"),
    };
    assert!((19..=20).contains(&retry(&in_pool("a"))));
    assert!((49..=50).contains(&retry(&in_pool("b"))));
    assert!((19..=20).contains(&retry(&LeaseRequest::default())));
}

#[test]
fn a_session_keeps_its_proxy_while_it_is_available() {
    let store = store_of(vec![
        entry("a1", None),
        entry("a2", None),
        entry("a3", None),
    ]);
    let first = store.grant_or_join(&with_session("jar-1")).unwrap();
    assert!(!first.joined);
    // A second worker of the same session shares the lease (the same id).
    let again = store.grant_or_join(&with_session("jar-1")).unwrap();
    assert!(again.joined);
    assert_eq!(again.lease.id, first.lease.id);
    // Released, the proxy goes back to the session next time, not to the oldest free proxy.
    store.release(&first.lease.id).unwrap();
    let later = store.grant_or_join(&with_session("jar-1")).unwrap();
    assert!(!later.joined);
    assert_ne!(later.lease.id, first.lease.id);
    assert_eq!(later.lease.proxy, first.lease.proxy);
    assert_eq!(later.lease.session.as_deref(), Some("jar-1"));
    store.release(&later.lease.id).unwrap();

    // Leased to another session: the session moves on, and stays on its new proxy.
    let mine = first.lease.proxy.clone();
    let other = store
        .grant(&LeaseRequest {
            proxy: Some(mine.clone()),
            session: Some("jar-2".into()),
            ..Default::default()
        })
        .unwrap()
        .0;
    let moved = store.grant(&with_session("jar-1")).unwrap().0;
    assert_ne!(moved.proxy, mine);
    store.release(&other.id).unwrap();
    store.release(&moved.id).unwrap();
    assert_eq!(
        store.grant(&with_session("jar-1")).unwrap().0.proxy,
        moved.proxy
    );
}

#[test]
fn a_session_leaves_a_draining_unhealthy_or_blocked_proxy() {
    for what in ["draining", "unhealthy", "blocked", "blocked for its target"] {
        let store = store_of(vec![entry("a1", None), entry("a2", None)]);
        let request = LeaseRequest {
            target: Some("shop.example".into()),
            ..with_session("jar")
        };
        let (lease, _) = store.grant(&request).unwrap();
        let mine = lease.proxy.clone();
        let changed = |f: fn(&mut ProvisionedProxy)| {
            ["a1", "a2"]
                .map(|n| {
                    let mut e = entry(n, None);
                    if e.key == mine {
                        f(&mut e);
                    }
                    e
                })
                .to_vec()
        };
        match what {
            "draining" => {
                store.set_provisioned(changed(|e| e.draining = true));
                // Its lease runs on, but the session is not handed it again.
            }
            "unhealthy" => store.set_provisioned(changed(|e| e.healthy = false)),
            "blocked" => {
                store.report(&lease.id, Outcome::Blocked).unwrap();
            }
            _ => {
                store
                    .report_for(&lease.id, Outcome::Blocked, Some("shop.example"))
                    .unwrap();
            }
        }
        let next = store.grant_or_join(&request).unwrap();
        assert!(!next.joined, "{what}");
        assert_ne!(next.lease.proxy, mine, "{what}");
    }
}

#[test]
fn a_target_block_leaves_the_proxy_leasable_for_other_targets() {
    let store = store_of(vec![entry("only", None)]);
    let for_target = |t: Option<&str>| LeaseRequest {
        target: t.map(Into::into),
        ..Default::default()
    };
    let (lease, _) = store.grant(&for_target(Some("shop.example"))).unwrap();
    store
        .report_for(&lease.id, Outcome::Blocked, Some("shop.example"))
        .unwrap();
    match store.grant(&for_target(Some("shop.example"))) {
        // The cooldown's end, capped like every Retry-After of a 503.
        Err(GrantError::NoProxy { retry_after }) => assert_eq!(retry_after, MAX_RETRY_AFTER),
        other => panic!("{other:?}"),
    }
    match store.grant(&LeaseRequest {
        proxy: Some(key("only")),
        ..for_target(Some("shop.example"))
    }) {
        Err(GrantError::CoolingDown { .. }) => {}
        other => panic!("{other:?}"),
    }
    let (other, _) = store.grant(&for_target(Some("news.example"))).unwrap();
    store.release(&other.id).unwrap();
    let (any, _) = store.grant(&for_target(None)).unwrap();
    // Without a target, a block cools the proxy down for everyone, as before.
    store.report(&any.id, Outcome::Blocked).unwrap();
    assert_eq!(
        outcome(&store, &for_target(Some("news.example"))),
        Err("no_proxy")
    );
    assert_eq!(
        store.usage()[&key("only")],
        ProxyUsage {
            lease_expires_at_ms: None,
            blocked_reports: 2
        }
    );
}

/// Proxies a target cools down for are walked past once: a grant for that target moves them to
/// the back of the free order, so the next grant does not walk past them again.
#[test]
fn proxies_cooling_for_a_target_are_walked_past_once() {
    let store = store_of(["a", "b", "c"].map(|n| entry(n, Some("p"))).to_vec());
    let by_name = |name: &str| LeaseRequest {
        proxy: Some(key(name)),
        ..Default::default()
    };
    let (lease, _) = store.grant(&by_name("a")).unwrap();
    store
        .report_for(&lease.id, Outcome::Blocked, Some("shop.example"))
        .unwrap();
    for name in ["b", "c"] {
        let (lease, _) = store.grant(&by_name(name)).unwrap();
        store.release(&lease.id).unwrap();
    }
    // Free longest first: a (cooling for the shop), b, c.
    let shop = LeaseRequest {
        target: Some("shop.example".into()),
        ..in_pool("p")
    };
    assert_eq!(outcome(&store, &shop), Ok("b".into()));
    // a went behind c; it stays leasable for everything but the shop.
    assert_eq!(outcome(&store, &in_pool("p")), Ok("c".into()));
    assert_eq!(outcome(&store, &in_pool("p")), Ok("a".into()));
}

#[test]
fn blocks_for_ever_new_targets_stay_bounded_and_end_as_a_full_cooldown() {
    let store = store_of(vec![entry("only", None)]);
    for i in 0..MAX_TARGETS_PER_PROXY + 5 {
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        store
            .report_for(&lease.id, Outcome::Blocked, Some(&format!("h{i}.example")))
            .unwrap();
        if i < MAX_TARGETS_PER_PROXY {
            assert_eq!(store.lock().targets.len(), i + 1);
        } else {
            // Blocked by too many sites: cooling down for all of them.
            assert_eq!(outcome(&store, &LeaseRequest::default()), Err("no_proxy"));
            break;
        }
    }
    assert_eq!(store.lock().targets.len(), MAX_TARGETS_PER_PROXY);
    assert_eq!(
        store.usage()[&key("only")].blocked_reports as usize,
        MAX_TARGETS_PER_PROXY + 1
    );
}

#[test]
fn renewal_extends_within_the_maximum_and_is_refused_on_a_draining_proxy() {
    let store = store_of(vec![entry("a1", None)]);
    let (lease, _) = store
        .grant(&LeaseRequest {
            ttl: Some(Duration::from_secs(60)),
            ..Default::default()
        })
        .unwrap();
    let (renewed, _) = store.renew(&lease.id, None).unwrap();
    assert_eq!(renewed.ttl_ms, 60_000, "the lease's own lifetime again");
    assert!(renewed.expires_at_ms >= lease.expires_at_ms);
    let (long, _) = store
        .renew(&lease.id, Some(Duration::from_secs(1_000_000)))
        .unwrap();
    assert_eq!(
        long.ttl_ms,
        LeaseOptions::default().max_ttl.as_millis() as u64
    );
    assert_eq!(store.lease(&lease.id).unwrap().0, long);
    assert_eq!(
        store.usage()[&key("a1")].lease_expires_at_ms,
        Some(long.expires_at_ms)
    );

    store.set_provisioned(vec![ProvisionedProxy {
        draining: true,
        ..entry("a1", None)
    }]);
    assert_eq!(store.renew(&lease.id, None), Err(LeaseError::Draining));
    assert!(store.lease(&lease.id).is_ok(), "the lease runs on");
    store.release(&lease.id).unwrap();
    assert_eq!(
        store.renew(&lease.id, None),
        Err(LeaseError::Ended(EndReason::Released))
    );
    assert_eq!(store.renew("nope", None), Err(LeaseError::NotFound));
    assert_eq!(outcome(&store, &LeaseRequest::default()), Err("no_proxy"));
}

#[test]
fn sessions_targets_and_block_counts_survive_a_restore_and_old_tables_still_read() {
    let store = store_of(vec![entry("a1", Some("a")), entry("a2", Some("a"))]);
    let (lease, _) = store.grant(&with_session("jar")).unwrap();
    store
        .report_for(&lease.id, Outcome::Blocked, Some("shop.example"))
        .unwrap();
    let (held, _) = store.grant(&with_session("jar")).unwrap();
    assert_eq!(held.proxy, lease.proxy, "a target block keeps the session");
    let snapshot = store.snapshot().unwrap();
    let text = serde_json::to_string(&snapshot).unwrap();
    assert!(
        !text.contains("shop.example"),
        "targets are stored as digests"
    );

    let after = store_of(vec![]);
    after.close();
    after.restore(serde_json::from_str(&text).unwrap());
    after.set_provisioned(vec![entry("a1", Some("a")), entry("a2", Some("a"))]);
    let shown = after.lease(&held.id).unwrap().0;
    assert_eq!(shown.session.as_deref(), Some("jar"));
    assert_eq!(shown.pool.as_deref(), Some("a"));
    assert_eq!(after.usage()[&lease.proxy].blocked_reports, 1);
    let joined = after.grant_or_join(&with_session("jar")).unwrap();
    assert!(joined.joined);
    after.release(&held.id).unwrap();
    let blocked = LeaseRequest {
        proxy: Some(lease.proxy.clone()),
        target: Some("shop.example".into()),
        ..Default::default()
    };
    assert!(matches!(
        after.grant(&blocked),
        Err(GrantError::CoolingDown { .. })
    ));

    // The table as the previous release wrote it.
    let old = r#"{"leases":[{"id":"0123456789abcdef0123456789abcdef","proxy":{"namespace":"ns","name":"a1"},"grantedAtMs":1,"expiresAtMs":99999999999999}],"cooldowns":{"ns/a2":99999999999999}}"#;
    let old: Snapshot = serde_json::from_str(old).unwrap();
    let restored = store_of(vec![]);
    restored.close();
    restored.restore(old);
    restored.set_provisioned(vec![entry("a1", None), entry("a2", None)]);
    let views = restored.proxies().unwrap();
    assert_eq!(
        views.iter().map(|v| v.state).collect::<Vec<_>>(),
        ["leased", "coolingDown"]
    );
}

#[test]
fn metrics_are_labelled_by_pool_and_provider_and_requests_make_no_new_series() {
    let metrics = LeaseMetrics::unregistered().unwrap();
    let store = LeaseStore::new(LeaseOptions::default(), metrics.clone(), None);
    store.restore(Snapshot::default());
    store.set_provisioned(vec![entry("a1", Some("a")), entry("x", None)]);
    let (lease, _) = store.grant(&in_pool("a")).unwrap();
    assert_eq!(
        metrics
            .granted
            .with_label_values(&["ns", "ns/a", "p"])
            .get(),
        1
    );
    assert_eq!(
        metrics.active.with_label_values(&["ns", "ns/a", "p"]).get(),
        1
    );
    for i in 0..50 {
        let _ = store.grant(&LeaseRequest {
            provider: Some(format!("made-up-{i}")),
            pool: Some(pool_key(&format!("made-up-{i}"))),
            ..Default::default()
        });
    }
    assert_eq!(
        metrics
            .rejected
            .with_label_values(&["unknown_pool", "unknown", "unknown"])
            .get(),
        50
    );
    let families = |m: &prometheus::IntCounterVec| {
        use prometheus::core::Collector;
        m.collect()[0].get_metric().len()
    };
    assert_eq!(families(&metrics.rejected), 1);
    store.release(&lease.id).unwrap();
    assert_eq!(
        metrics
            .ended
            .with_label_values(&["released", "ns", "ns/a", "p"])
            .get(),
        1
    );
    // The pool is gone: so are its series.
    store.set_provisioned(vec![entry("x", None)]);
    assert_eq!(families(&metrics.granted), 1, "only pool=none is left");
}
