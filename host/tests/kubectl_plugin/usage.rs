//! `kubectl px usage`: a team's instance-hours and leases from the leader's usage book, the
//! same after a restart of the operator (the book is persisted), and nothing of a namespace
//! that used nothing.

use serde_json::Value;

use super::fleet::{pool_yaml, settled, status_until};
use super::{Px, World};
use crate::common::operator_process::OperatorProcess;

/// `usage -o json` until `done` holds for its one line (the namespace's).
async fn usage_until(px: &Px, metrics: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let args = ["usage", "--metrics-url", metrics, "-o", "json"];
    px.until(&args, what, |ran| {
        ran.code == 0
            && serde_json::from_str::<Value>(&ran.stdout).is_ok_and(|v| {
                v["lines"].as_array().is_some_and(|l| l.len() == 1) && done(&v["lines"][0])
            })
    })
    .await
    .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_usage_counts_its_leases_and_hours_and_survives_a_restart() {
    let world = World::start("px-usage").await;
    let ns = world.ns.name().to_string();
    let providers = world.store.provider_entry("store");
    let mut operator = world.operator(&providers, &[]).await;
    let px = world.leasing_px(&operator).await;
    world.apply(&pool_yaml(&ns, 2, world.squid.port())).await;
    status_until(&px, "2 Ready", |s| settled(s, 2)).await;
    for session in ["a", "b"] {
        let leased = px
            .run(&["lease", "--pool", "egress", "--session", session])
            .await;
        assert_eq!(leased.code, 0, "{leased:#?}");
    }

    // The team's line: its two leases, and hours for its two instances.
    let metrics = format!("http://{}", operator.metrics);
    let line = usage_until(&px, &metrics, "2 leases and some instance-seconds", |l| {
        l["total"]["leasesGranted"] == 2.0 && l["total"]["instanceSeconds"].as_f64() > Some(0.0)
    })
    .await;
    assert_eq!(line["lines"][0]["namespace"], ns.as_str());
    assert_eq!(line["lines"][0]["lastHour"]["leasesGranted"], 2.0);
    // Per pool: the pool's row holds them.
    let by_pool = px
        .run(&["usage", "--metrics-url", &metrics, "--by", "pool"])
        .await;
    assert_eq!(by_pool.code, 0, "{by_pool:#?}");
    assert!(
        by_pool.stdout.starts_with("Last hour\nNAMESPACE"),
        "{}",
        by_pool.stdout
    );
    let egress: Vec<&str> = by_pool
        .stdout
        .lines()
        .find(|l| l.contains(" egress "))
        .unwrap_or_else(|| panic!("no egress row in\n{}", by_pool.stdout))
        .split_whitespace()
        .collect();
    assert_eq!(
        (egress[0], egress[1], egress[4]),
        (ns.as_str(), "egress", "2"),
        "{}",
        by_pool.stdout
    );
    // A namespace that used nothing sees nothing (and nothing of this one).
    let other = Px {
        namespace: "default".into(),
        ..world.px()
    }
    .run(&["usage", "--metrics-url", &metrics])
    .await;
    assert_eq!(other.code, 0, "{other:#?}");
    assert_eq!(
        other.stdout,
        "No usage recorded for these namespaces yet.\n"
    );

    // A graceful restart (as a failover's old leader ends its term): the new process's
    // counters start at zero, so its two leases can only come from the persisted book.
    let exit = operator.proc.stop(std::time::Duration::from_secs(30)).await;
    assert!(
        exit.success(),
        "graceful stop failed: {exit:?}\n{}",
        operator.proc.log_tail(40)
    );
    let book = world
        .cp
        .kubectl_run(
            &[
                "-n",
                &ns,
                "get",
                "configmap",
                &format!("e2e-{ns}-usage"),
                "-o",
                "jsonpath={.data.book\\.json}",
            ],
            None,
        )
        .await
        .expect("the usage book in its ConfigMap");
    assert!(book.contains("\"leasesGranted\":2.0"), "{book}");
    operator = world.operator(&providers, &[]).await;
    let metrics = format!("http://{}", operator.metrics);
    let restored = usage_until(&px, &metrics, "the book restored", |l| {
        l["total"]["leasesGranted"] == 2.0
    })
    .await;
    assert!(
        restored["lines"][0]["total"]["instanceSeconds"].as_f64()
            >= line["lines"][0]["total"]["instanceSeconds"].as_f64()
    );
    drop::<OperatorProcess>(operator);
}
