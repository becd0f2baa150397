use super::*;

fn quota(name: &str, spec: serde_json::Value) -> ProxyQuota {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProxyQuota",
        "metadata": {"name": name, "namespace": "team-a", "generation": 2},
        "spec": spec,
    }))
    .unwrap()
}

fn counts(pairs: &[(&str, u32)]) -> ProxyCounts {
    ProxyCounts {
        by_provider: pairs.iter().map(|(p, n)| (p.to_string(), *n)).collect(),
    }
}

fn slots(providers: &[&str]) -> Vec<String> {
    providers.iter().map(|p| p.to_string()).collect()
}

/// (quotas, used, creates asked, creates kept, the refusal)
type ClipCase<'a> = (
    Vec<&'a ProxyQuota>,
    ProxyCounts,
    Vec<&'a str>,
    Vec<&'a str>,
    Option<&'a str>,
);

#[test]
fn a_pools_creates_are_clipped_to_the_tightest_headroom_of_their_provider() {
    let q1 = quota("q1", serde_json::json!({"proxies": {"x": 3}}));
    let q2 = quota("q2", serde_json::json!({"proxies": {"x": 10}, "total": 4}));
    let loose = quota("loose", serde_json::json!({"leases": 5}));
    let cases: Vec<ClipCase> = vec![
        (vec![], counts(&[]), vec!["x"; 5], vec!["x"; 5], None),
        // A quota without a Proxies bound bounds no create.
        (vec![&loose], counts(&[]), vec!["x"; 5], vec!["x"; 5], None),
        (
            vec![&q1],
            counts(&[]),
            vec!["x"; 5],
            vec!["x"; 3],
            Some("ProxyQuota team-a/q1: proxies[x] 3/3 in use"),
        ),
        // Other providers are not bounded by `proxies[x]`.
        (
            vec![&q1],
            counts(&[("x", 2)]),
            vec!["x", "y", "x", "y"],
            vec!["x", "y", "y"],
            Some("ProxyQuota team-a/q1: proxies[x] 3/3 in use"),
        ),
        // Several quotas: each applies, `total` counts every provider.
        (
            vec![&q1, &q2],
            counts(&[("y", 2)]),
            vec!["x", "x", "y"],
            vec!["x", "x"],
            Some("ProxyQuota team-a/q2: total 4/4 in use"),
        ),
        // A lowered quota (over its bound already): nothing more, the use shown as it is.
        (
            vec![&q1],
            counts(&[("x", 7)]),
            vec!["x"],
            vec![],
            Some("ProxyQuota team-a/q1: proxies[x] 7/3 in use"),
        ),
    ];
    for (quotas, used, asked, kept, refusal) in cases {
        let mut creates = slots(&asked);
        let stopped = clip_creates(&quotas, &used, &mut creates, |p| p.as_str());
        assert_eq!(creates, slots(&kept), "{asked:?} with {used:?}");
        assert_eq!(
            stopped.map(|s| s.message()).as_deref(),
            refusal,
            "{asked:?} with {used:?}"
        );
    }
}

fn queued(name: &str, provider: &str, started: bool, created_ms: u64) -> Queued {
    Queued {
        name: name.into(),
        provider: provider.into(),
        started,
        created_ms,
    }
}

#[test]
fn a_proxy_is_provisioned_only_within_quota_oldest_first_and_started_ones_never_stop() {
    let q = quota("q1", serde_json::json!({"proxies": {"x": 2}}));
    let namespace = vec![
        queued("a", "x", true, 30),
        queued("b", "x", false, 10),
        queued("c", "x", false, 20),
        queued("d", "y", false, 40),
        queued("e", "x", false, 20),
    ];
    // (proxy, admitted or the refusal)
    let cases = [
        ("a", None),
        ("b", None),
        ("c", Some("ProxyQuota team-a/q1: proxies[x] 2/2 in use")),
        ("e", Some("ProxyQuota team-a/q1: proxies[x] 3/2 in use")),
        ("d", None),
        ("unknown", None),
    ];
    for (name, refusal) in cases {
        let got = admit(&[&q], name, &namespace).map_err(|s| s.message());
        assert_eq!(
            got,
            refusal.map_or(Ok(()), |r| Err(r.to_string())),
            "{name}"
        );
    }
    // A quota lowered below what runs stops nothing that started.
    let lowered = quota("q1", serde_json::json!({"proxies": {"x": 0}}));
    assert_eq!(admit(&[&lowered], "a", &namespace), Ok(()));
    assert!(admit(&[&lowered], "b", &namespace).is_err());
    assert_eq!(admit(&[], "c", &namespace), Ok(()));
}

#[test]
fn the_lease_table_gets_each_namespaces_tightest_bounds() {
    let mut other = quota("z", serde_json::json!({"leases": 1}));
    other.metadata.namespace = Some("team-b".into());
    let quotas: Vec<Arc<ProxyQuota>> = [
        quota(
            "q1",
            serde_json::json!({"leases": 5, "gatewayConnections": 100}),
        ),
        quota("q2", serde_json::json!({"leases": 3})),
        quota("q3", serde_json::json!({"proxies": {"x": 3}})),
        other,
    ]
    .into_iter()
    .map(Arc::new)
    .collect();
    let bounds = namespace_bounds(&quotas);
    let shown: Vec<(String, Option<String>, Option<String>)> = bounds
        .iter()
        .map(|(ns, b)| {
            let of = |b: &Option<Bound>| b.as_ref().map(|b| format!("{} {}", b.quota, b.limit));
            (ns.clone(), of(&b.leases), of(&b.gateway_connections))
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            (
                "team-a".to_string(),
                Some("team-a/q2 3".to_string()),
                Some("team-a/q1 100".to_string())
            ),
            ("team-b".to_string(), Some("team-b/z 1".to_string()), None),
        ]
    );
}

#[test]
fn a_quotas_status_shows_use_against_limit_for_each_bounded_field() {
    let used = NamespaceUse {
        proxies: counts(&[("x", 3), ("y", 1)]),
        leases: 1,
        gateway_connections: 7,
    };
    // (spec, used, summary (proxies, leases, gateway))
    let cases = [
        (
            serde_json::json!({"proxies": {"x": 10}, "leases": 5}),
            serde_json::json!({"proxies": {"x": 3}, "leases": 1}),
            (Some("3/10"), Some("1/5"), None),
        ),
        (
            serde_json::json!({"proxies": {"x": 10, "y": 2}, "total": 5}),
            serde_json::json!({"proxies": {"x": 3, "y": 1}, "total": 4}),
            (Some("1/2"), None, None),
        ),
        (
            serde_json::json!({"gatewayConnections": 50}),
            serde_json::json!({"gatewayConnections": 7}),
            (None, None, Some("7/50")),
        ),
    ];
    for (spec, want_used, (proxies, leases, gateway)) in cases {
        let status = status_of(&quota("q", spec.clone()), &used);
        assert_eq!(
            serde_json::to_value(&status.used).unwrap(),
            want_used,
            "{spec}"
        );
        let summary = status.summary.unwrap();
        assert_eq!(
            (
                summary.proxies.as_deref(),
                summary.leases.as_deref(),
                summary.gateway_connections.as_deref()
            ),
            (proxies, leases, gateway),
            "{spec}"
        );
        assert_eq!(status.observed_generation, Some(2));
    }
}

#[test]
fn a_status_patch_removes_what_the_spec_no_longer_bounds() {
    let used = NamespaceUse {
        proxies: counts(&[("x", 3), ("y", 1)]),
        leases: 1,
        gateway_connections: 0,
    };
    let before = status_of(
        &quota(
            "q",
            serde_json::json!({"proxies": {"x": 5, "y": 5}, "leases": 2}),
        ),
        &used,
    );
    let after = status_of(&quota("q", serde_json::json!({"proxies": {"x": 5}})), &used);
    // (old status, new status, the patch's `used` and `summary`)
    let cases = [
        (
            None,
            &after,
            serde_json::json!({"proxies": {"x": 3}}),
            serde_json::json!({"proxies": "3/5"}),
        ),
        (
            Some(&before),
            &after,
            serde_json::json!({"proxies": {"x": 3, "y": null}, "leases": null}),
            serde_json::json!({"proxies": "3/5", "leases": null}),
        ),
        (
            Some(&after),
            &before,
            serde_json::json!({"proxies": {"x": 3, "y": 1}, "leases": 1}),
            serde_json::json!({"proxies": "3/5", "leases": "1/2"}),
        ),
    ];
    for (old, new, used, summary) in cases {
        let patch = status_patch(old, new);
        assert_eq!(patch["status"]["used"], used, "{old:?}");
        assert_eq!(patch["status"]["summary"], summary, "{old:?}");
    }
}
