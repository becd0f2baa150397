//! `kubectl px status`, `lease`, `release`, `report`, `drain`, `recycle` and `scale` against a
//! pool the operator keeps: what each prints, what it changes, and the exit codes.

use serde_json::Value;

use super::{Px, Ran, World, kubeconfig_with_token, proxy_yaml};
use crate::common::operator_process::TOKEN;

pub(super) fn pool_yaml(ns: &str, replicas: i32, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  name: egress\n  namespace: {ns}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: store\n      port: {port}\n"
    )
}

const CRAWLER_RBAC: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: crawler, namespace: NS}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: lease-egress, namespace: NS}
rules:
  - apiGroups: [proxy-operator.dev]
    resources: [proxypools/lease]
    resourceNames: [egress]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: crawler-leases-egress, namespace: NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: lease-egress}
subjects: [{kind: ServiceAccount, name: crawler, namespace: NS}]
";

fn pool_of(status: &Value) -> &Value {
    &status["pools"][0]
}

fn names(status: &Value) -> Vec<String> {
    status["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// The line of the table that starts with `first`, if there is one.
fn row<'a>(ran: &'a Ran, first: &str) -> Option<&'a str> {
    ran.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
}

/// The line of the table that starts with `first`.
fn line<'a>(ran: &'a Ran, first: &str) -> &'a str {
    row(ran, first).unwrap_or_else(|| panic!("no line for {first} in\n{}", ran.stdout))
}

/// Whether `member`'s row says `Ready` and `Healthy` (probed: before its first probe a Proxy
/// is Ready with reason `InstanceRunning`).
fn probed_and_ready(ran: &Ran, member: &str) -> bool {
    row(ran, member).is_some_and(|l| {
        l.split_whitespace()
            .skip(1)
            .take(2)
            .eq(["Ready", "Healthy"])
    })
}

/// `status -o json` until `done` holds for it.
pub(super) async fn status_until(px: &Px, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    px.until(&["status", "-o", "json"], what, |ran| {
        ran.code == 0 && serde_json::from_str(&ran.stdout).is_ok_and(|v| done(&v))
    })
    .await
    .json()
}

pub(super) fn settled(status: &Value, replicas: i64) -> bool {
    let pool = pool_of(status);
    pool["desired"] == replicas
        && pool["ready"] == replicas
        && pool["draining"] == 0
        && status["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pool"] == "egress")
            .count()
            == replicas as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_from_a_shell_status_leases_blocks_drain_recycle_and_scale() {
    let world = World::start("px-fleet").await;
    let ns = world.ns.name().to_string();
    let operator = world
        .operator(
            &world.store.provider_entry("store"),
            &["--provider-check-interval", "2s"],
        )
        .await;
    let px = world.leasing_px(&operator).await;
    let url = format!("https://localhost:{}", operator.discovery.port());
    let ca = world.discovery_ca();
    world.apply(&pool_yaml(&ns, 3, world.squid.port())).await;
    let status = status_until(&px, "3 Ready", |s| settled(s, 3)).await;
    let members = names(&status);

    // The screen: the pool, the provider with its plugin, three free Ready proxies, probed.
    let screen = px
        .until(
            &["status"],
            "the provider checked and every member probed",
            |ran| {
                ran.stdout.contains("test 0.1.0 (sha256 ")
                    && members.iter().all(|member| probed_and_ready(ran, member))
            },
        )
        .await;
    assert_eq!(screen.code, 0);
    assert!(
        screen.stdout.starts_with(
            "POOL     DESIRED   READY   LEASED   COOLING   DRAINING   UP-TO-DATE   PROVIDER   AGE\n"
        ),
        "{}",
        screen.stdout
    );
    let pool_line: Vec<&str> = line(&screen, "egress").split_whitespace().collect();
    assert_eq!(
        pool_line[..8],
        ["egress", "3", "3", "0", "0", "0", "3", "store"],
        "{}",
        screen.stdout
    );
    let provider_line = line(&screen, "store");
    assert!(
        provider_line.contains("True")
            && provider_line.contains(" Ok ")
            && provider_line.contains("1/1"),
        "{provider_line}"
    );
    for member in &members {
        let row: Vec<&str> = line(&screen, member).split_whitespace().collect();
        assert_eq!(row[1..3], ["Ready", "Healthy"], "{}", screen.stdout);
        assert!(row.contains(&"free"), "{}", screen.stdout);
    }

    // A lease with the kubeconfig's credentials: the admin's token is no discovery token (the
    // operator answers 401), so the operator's static token from its Secret is used.
    let leased = px
        .run(&[
            "lease",
            "--pool",
            "egress",
            "--session",
            "jar-1",
            "--target",
            "shop.example",
            "-o",
            "json",
        ])
        .await;
    assert_eq!(leased.code, 0, "{leased:#?}");
    let lease = leased.json();
    let id = lease["id"].as_str().unwrap().to_string();
    let a = lease["proxy"]["name"].as_str().unwrap().to_string();
    let url_with_password = lease["proxyUrl"].as_str().unwrap().to_string();
    assert!(
        url_with_password.starts_with(&format!("http://{a}:")),
        "{url_with_password}"
    );
    // The same session again: the same lease, its password not on the screen.
    let again = px
        .run(&["lease", "--pool", "egress", "--session", "jar-1"])
        .await;
    assert_eq!(again.code, 0, "{again:#?}");
    assert!(
        again.stdout.starts_with("The session's lease"),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains(&format!("Lease:      {id}\n")),
        "{}",
        again.stdout
    );
    assert!(
        again.stdout.contains(&format!(
            "Proxy:      {ns}/{a} (provider store, pool {ns}/egress)"
        )),
        "{}",
        again.stdout
    );
    assert!(
        again
            .stdout
            .contains(&format!("http://{a}:xxxxx@127.0.0.1:")),
        "{}",
        again.stdout
    );
    let password = url_with_password
        .split(':')
        .nth(2)
        .unwrap()
        .split('@')
        .next()
        .unwrap();
    assert!(
        !again.stdout.contains(password),
        "the password on the screen"
    );

    // A ServiceAccount's kubeconfig: its token is the discovery token, RBAC lets it lease.
    world.apply(&CRAWLER_RBAC.replace("NS", &ns)).await;
    let token = world
        .ns
        .service_account_token("crawler", "proxy-operator", 600)
        .await
        .unwrap();
    let crawler_config = world.dir.path().join("crawler.kubeconfig");
    kubeconfig_with_token(world.cp, &token, &crawler_config);
    let crawler = Px {
        kubeconfig: crawler_config,
        ..world
            .px()
            .with_env("DISCOVERY_URL", &url)
            .with_env("DISCOVERY_CA_FILE", &ca)
    };
    let sa_lease = crawler
        .run(&["lease", "--pool", "egress", "-o", "json"])
        .await;
    assert_eq!(sa_lease.code, 0, "{sa_lease:#?}");
    let sa_lease = sa_lease.json();
    let b = sa_lease["proxy"]["name"].as_str().unwrap().to_string();
    assert_ne!(a, b);
    let holder = format!("system:serviceaccount:{ns}:crawler");
    let shown = px
        .until(&["status"], "both holders", |ran| {
            ran.stdout.contains(&holder) && ran.stdout.contains("static token (session jar-1)")
        })
        .await;
    assert!(
        line(&shown, &a).contains("leased")
            && line(&shown, &a).contains("static token (session jar-1)"),
        "{}",
        shown.stdout
    );
    assert!(line(&shown, &b).contains(&holder), "{}", shown.stdout);

    // A named proxy that is leased: the API says when to try again, the exit code says so.
    let busy = px.run(&["lease", "--proxy", &a]).await;
    assert_eq!(busy.code, 4, "{busy:#?}");
    assert!(
        busy.stderr.contains("409 proxy-leased") && busy.stderr.contains("try again in"),
        "{}",
        busy.stderr
    );
    let wrong = px.run(&["lease", "--token", "wrong"]).await;
    assert_eq!(wrong.code, 1, "{wrong:#?}");
    assert!(
        wrong.stderr.contains("401 unauthorized")
            && wrong
                .stderr
                .contains("the token was --token / DISCOVERY_TOKEN"),
        "{}",
        wrong.stderr
    );
    let nowhere = world.px().run(&["release", &id]).await;
    assert_eq!(nowhere.code, 2, "{nowhere:#?}");
    assert!(
        nowhere.stderr.contains("--discovery-url"),
        "{}",
        nowhere.stderr
    );

    // Blocks: one site blocks A (it cools down for that host only), B is blocked for all.
    let report = px
        .run(&["report", &id, "blocked", "--target", "shop.example"])
        .await;
    assert_eq!(report.code, 0, "{report:#?}");
    assert_eq!(
        report.stdout,
        format!(
            "Reported lease {id} blocked by shop.example: the lease ended; the proxy cools down for shop.example only.\n"
        )
    );
    let sa_id = sa_lease["id"].as_str().unwrap();
    let blocked = crawler.run(&["report", sa_id, "blocked"]).await;
    assert_eq!(blocked.code, 0, "{blocked:#?}");
    assert!(
        blocked.stdout.contains("cools down for every target"),
        "{}",
        blocked.stdout
    );
    let blocks = px
        .until(
            &["status", "--target", "shop.example"],
            "the blocks",
            |ran| {
                ran.stdout.contains("FOR shop.example")
                    && ran
                        .stdout
                        .lines()
                        .filter(|l| {
                            l.starts_with(&format!("{a} ")) || l.starts_with(&format!("{b} "))
                        })
                        .count()
                        == 4
            },
        )
        .await;
    let section = blocks
        .stdout
        .split("\n\n")
        .find(|s| s.contains("BLOCKED"))
        .unwrap();
    assert!(section.starts_with("PROXY"), "{section}");
    let a_row: Vec<&str> = section
        .lines()
        .find(|l| l.starts_with(&a))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(a_row[1..3], ["1", "-"], "{section}");
    assert!(
        a_row.ends_with(&["in", "10m"]) || a_row.ends_with(&["in", "9m"]),
        "{section}"
    );
    let b_row = section.lines().find(|l| l.starts_with(&b)).unwrap();
    assert!(
        b_row.contains(" 1 ") && (b_row.contains("in 10m") || b_row.contains("in 9m")),
        "{section}"
    );
    assert_eq!(
        line(&blocks, "egress").split_whitespace().nth(4),
        Some("1"),
        "COOLING: {}",
        blocks.stdout
    );
    recent_blocks_by_name(&world, &px, &operator.metrics.to_string()).await;

    // A lease with the flag's token, released.
    let flagged = px
        .run(&["lease", "--proxy", &a, "--token", TOKEN, "-o", "json"])
        .await;
    assert_eq!(flagged.code, 0, "{flagged:#?}");
    let flagged_id = flagged.json()["id"].as_str().unwrap().to_string();
    let released = px.run(&["release", &flagged_id]).await;
    assert_eq!(
        (released.code, released.stdout.as_str()),
        (0, format!("Lease {flagged_id} released.\n").as_str())
    );

    // Drain the third: the pool replaces it and deletes it (it holds no lease).
    let c = members
        .iter()
        .find(|m| **m != a && **m != b)
        .unwrap()
        .clone();
    let drained = px.run(&["drain", &c]).await;
    assert_eq!(drained.code, 0, "{drained:#?}");
    assert_eq!(
        drained.stdout,
        format!(
            "{ns}/{c} is draining: it takes no new lease; pool egress makes a replacement and deletes it once its lease ends (it holds no lease).\n"
        )
    );
    status_until(&px, "c replaced", |s| {
        settled(s, 3) && !names(s).contains(&c)
    })
    .await;

    // Recycle A: a new one first, then A goes.
    let recycled = px.run(&["recycle", &a]).await;
    assert_eq!(recycled.code, 0, "{recycled:#?}");
    assert_eq!(
        recycled.stdout,
        format!(
            "{ns}/{a} will be replaced: pool egress makes a new Proxy, then drains this one within its maxSurge and maxUnavailable and deletes it once its lease ends.\n"
        )
    );
    status_until(&px, "a replaced", |s| {
        settled(s, 3) && !names(s).contains(&a)
    })
    .await;

    // A Proxy of no pool: drained and undrained by hand, not recycled.
    world
        .apply(&proxy_yaml(&ns, "lone", "store", world.squid.port()))
        .await;
    px.until(&["status", "lone"], "lone Ready", |ran| ran.code == 0)
        .await;
    let lone = px.run(&["drain", "lone"]).await;
    assert!(
        lone.stdout
            .contains("It is in no pool, so nothing replaces or deletes it"),
        "{lone:#?}"
    );
    let shown = px.run(&["status", "proxy/lone"]).await;
    assert!(
        shown.stdout.contains("\nLease:       draining\n"),
        "{}",
        shown.stdout
    );
    assert_eq!(
        px.run(&["drain", "--undo", "lone"]).await.stdout,
        format!("{ns}/lone is leased again.\n")
    );
    let not_in_a_pool = px.run(&["recycle", "lone"]).await;
    assert_eq!(not_in_a_pool.code, 1);
    assert!(
        not_in_a_pool
            .stderr
            .starts_with(&format!("error: {ns}/lone is in no pool")),
        "{not_in_a_pool:#?}"
    );

    // Scale: the pool makes the fourth; `status egress` is the pool's own screen.
    let scaled = px.run(&["scale", "egress", "4"]).await;
    assert_eq!(
        scaled.stdout,
        format!("{ns}/egress scaled from 3 to 4 Proxies.\n"),
        "{scaled:#?}"
    );
    status_until(&px, "4 Ready", |s| settled(s, 4)).await;
    let pool = px.run(&["status", "egress"]).await;
    assert_eq!(pool.code, 0, "{pool:#?}");
    assert!(
        pool.stdout.starts_with(&format!(
            "Pool:        {ns}/egress\nReplicas:    4 desired, 4 ready, "
        )),
        "{}",
        pool.stdout
    );
    let yaml: Value = proxy_operator::support::yaml::from_str(
        &px.run(&["status", "pool/egress", "-o", "yaml"])
            .await
            .stdout,
    )
    .unwrap();
    assert_eq!(yaml["ready"], true);
    assert_eq!(yaml["proxies"].as_array().unwrap().len(), 4);
    let too_many = px.run(&["scale", "egress", "10001"]).await;
    assert_eq!(too_many.code, 2, "{too_many:#?}");
}

/// A Pod that claims to be the leader but that no node runs: the API server's pod proxy has
/// nowhere to send a request for its metrics port.
const FAKE_LEADER: &str = "apiVersion: v1
kind: Pod
metadata:
  name: fake-leader
  namespace: NS
  labels: {proxy-operator.dev/leader: \"true\"}
spec:
  automountServiceAccountToken: false
  containers:
    - name: manager
      image: proxy-operator:test
      ports: [{name: metrics, containerPort: 9191}]
";

/// `status`'s recent blocks by target host, after `shop.example` blocked one lease and another
/// was blocked naming no host: by name from the leader's metrics port, and a note with the way
/// out when that port cannot be reached.
async fn recent_blocks_by_name(world: &World, px: &Px, metrics: &str) {
    let ns = world.ns.name();
    // The operator runs outside the cluster here: no Pod carries the leader label.
    let outside = px.run(&["status"]).await;
    assert_eq!(outside.code, 0, "{outside:#?}");
    assert!(
        outside.stdout.contains(&format!(
            "\nNote: recent blocks by target are not shown: no Pod in namespace {ns} has the label proxy-operator.dev/leader=true"
        )) && outside.stdout.contains("pass --metrics-url"),
        "{}",
        outside.stdout
    );
    assert!(!outside.stdout.contains("BLOCKS (LAST HOUR)"));
    // A labelled Pod the API server cannot reach: its pod proxy's answer, and the same way out.
    world.apply(&FAKE_LEADER.replace("NS", ns)).await;
    let unreachable = px.run(&["status"]).await;
    assert_eq!(unreachable.code, 0, "{unreachable:#?}");
    assert!(
        unreachable.stdout.contains(&format!(
            "\nNote: recent blocks by target are not shown: the leader's metrics port through the API server's pod proxy (Pod {ns}/fake-leader, port 9191) did not answer ("
        )) && unreachable.stdout.contains("pass --metrics-url"),
        "{}",
        unreachable.stdout
    );
    world
        .cp
        .kubectl_run(&["-n", ns, "delete", "pod", "fake-leader"], None)
        .await
        .unwrap();
    // With the metrics port's address: the hosts by name, as the leader counted them. The port
    // answers only a token RBAC allows (the operator runs without --metrics-insecure here):
    // `kubectl px` sends the kubeconfig user's.
    let url = format!("http://{metrics}");
    let bare = reqwest::get(format!("{url}/status/blocks.json"))
        .await
        .unwrap();
    assert_eq!(bare.status(), reqwest::StatusCode::UNAUTHORIZED);
    let shown = px
        .until(&["status", "--metrics-url", &url], "recent blocks", |ran| {
            ran.stdout.contains("BLOCKS (LAST HOUR)")
        })
        .await;
    assert_eq!(shown.code, 0, "{shown:#?}");
    let section = shown
        .stdout
        .split("\n\n")
        .find(|s| s.starts_with("TARGET"))
        .unwrap_or_else(|| panic!("no TARGET section in\n{}", shown.stdout));
    assert_eq!(
        section,
        "TARGET         BLOCKS (LAST HOUR)\nnone           1\nshop.example   1\n(none: reports naming no host)\n",
        "{}",
        shown.stdout
    );
    assert!(
        !shown
            .stdout
            .contains("recent blocks by target are not shown")
    );
    // The variable does the same for scripts, and JSON carries the rows.
    let json = world
        .px()
        .with_env("PROXY_OPERATOR_METRICS_URL", &url)
        .run(&["status", "-o", "json"])
        .await
        .json();
    assert_eq!(
        json["recentBlocks"],
        serde_json::json!([
            {"target": "none", "blocks": 1},
            {"target": "shop.example", "blocks": 1},
        ])
    );
    // Not the operator's metrics port: said, not a failure.
    let wrong = px
        .run(&["status", "--metrics-url", &format!("{url}/nowhere")])
        .await;
    assert_eq!(wrong.code, 0, "{wrong:#?}");
    assert!(
        wrong
            .stdout
            .contains("recent blocks by target are not shown: http://")
            && wrong
                .stdout
                .contains("(HTTP 404 Not Found): is it the leader's --metrics-addr"),
        "{}",
        wrong.stdout
    );
}
