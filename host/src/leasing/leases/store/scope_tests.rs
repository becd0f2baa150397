//! Scope first, then the store: every (reach, request, state) a crawler's grant or route can
//! meet, as a table. What lies outside the caller's reach gets one answer, whatever its state.

use super::shared::RouteRequest;
use super::*;

const A: &str = "system:serviceaccount:team-a:crawler";
const B: &str = "system:serviceaccount:team-b:crawler";
const TARGET: &str = "shop.example";

fn key(namespace: &str, name: &str) -> ProxyKey {
    ProxyKey {
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn pool_a() -> PoolKey {
    key("team-a", "pool-a")
}

fn pool_b() -> PoolKey {
    key("team-b", "pool-b")
}

fn proxy(namespace: &str, name: &str, pool: &str, draining: bool) -> ProvisionedProxy {
    ProvisionedProxy {
        key: key(namespace, name),
        provider: "p".into(),
        zone: None,
        labels: BTreeMap::new(),
        address: "127.0.0.1".into(),
        port: 3128,
        exit_ip: None,
        healthy: true,
        pool: Some(pool.into()),
        draining,
        login: None,
        protocol: Default::default(),
    }
}

/// What team A's proxy `team-a/px-a` is doing when the request comes.
#[derive(Clone, Copy, Debug)]
enum State {
    Free,
    /// Leased by A for its session `shop1`.
    LeasedByA,
    /// Reported blocked by A: cooling down for every target.
    CoolingDown,
    /// Reported blocked by A for [`TARGET`].
    CoolingForTarget,
    Draining,
    /// Carrying A's gateway traffic.
    InGatewayUse,
    /// Not provisioned at all: the request names `team-a/ghost`.
    Missing,
}

const STATES: [State; 7] = [
    State::Free,
    State::LeasedByA,
    State::CoolingDown,
    State::CoolingForTarget,
    State::Draining,
    State::InGatewayUse,
    State::Missing,
];

/// A's own request: its pool, its session `shop1`.
fn as_a() -> LeaseRequest {
    LeaseRequest {
        pool: Some(pool_a()),
        session: Some("shop1".into()),
        holder: Some(A.into()),
        reach: Reach::Pool(pool_a()),
        ..LeaseRequest::default()
    }
}

/// The table in `state`, and the proxy a request about A's proxy names; the id of A's lease
/// when it holds one.
fn table_in(state: State) -> (LeaseStore, ProxyKey, Option<String>) {
    let store = LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    );
    store.restore(Snapshot::default());
    store.set_provisioned(vec![
        proxy("team-a", "px-a", "pool-a", matches!(state, State::Draining)),
        proxy("team-b", "px-b", "pool-b", false),
    ]);
    let px_a = key("team-a", "px-a");
    let mut held = None;
    match state {
        State::Free | State::Draining => {}
        State::Missing => return (store, key("team-a", "ghost"), None),
        State::LeasedByA => held = Some(store.grant(&as_a()).unwrap().0.id),
        State::CoolingDown | State::CoolingForTarget => {
            let (lease, _) = store.grant(&as_a()).unwrap();
            let target = matches!(state, State::CoolingForTarget).then_some(TARGET);
            store
                .report_for(&lease.id, Outcome::Blocked, target)
                .unwrap();
        }
        State::InGatewayUse => {
            store
                .route(&RouteRequest {
                    filters: as_a(),
                    replica: "gw-0".into(),
                    avoid: None,
                    max_connections: 2,
                })
                .unwrap();
        }
    }
    (store, px_a, held)
}

/// What a grant got: `new <name>`, `joined <id>`, or the refusal as it is (Retry-After too).
fn answer(store: &LeaseStore, request: &LeaseRequest) -> Result<String, GrantError> {
    store.grant_or_join(request).map(|g| match g.joined {
        true => format!("joined {}", g.lease.id),
        false => format!("new {}", g.lease.proxy),
    })
}

/// A request of B's about A's proxy `named` (or about A's session key only, without it).
type Probe = (&'static str, fn(ProxyKey) -> LeaseRequest);

fn probes_by_b() -> Vec<Probe> {
    fn b(reach: Reach) -> LeaseRequest {
        LeaseRequest {
            holder: Some(B.into()),
            target: Some(TARGET.into()),
            reach,
            ..LeaseRequest::default()
        }
    }
    vec![
        ("B's own pool, naming A's proxy and A's session", |named| {
            LeaseRequest {
                pool: Some(pool_b()),
                proxy: Some(named),
                session: Some("shop1".into()),
                ..b(Reach::Pool(pool_b()))
            }
        }),
        ("B's own pool, naming A's proxy", |named| LeaseRequest {
            pool: Some(pool_b()),
            proxy: Some(named),
            ..b(Reach::Pool(pool_b()))
        }),
        ("B's namespace, naming A's proxy", |named| LeaseRequest {
            proxy: Some(named),
            session: Some("shop1".into()),
            ..b(Reach::Namespace("team-b".into()))
        }),
        (
            "A's proxy named without a pool, B reaching only its pool",
            |named| LeaseRequest {
                proxy: Some(named),
                session: Some("shop1".into()),
                ..b(Reach::Pool(pool_b()))
            },
        ),
    ]
}

#[test]
fn outside_the_reach_every_state_gets_the_answer_of_a_proxy_that_does_not_exist() {
    for (probe, request) in probes_by_b() {
        for state in STATES {
            let (store, named, _) = table_in(state);
            assert_eq!(
                answer(&store, &request(named)),
                Err(GrantError::UnknownProxy),
                "{probe}, A's proxy {state:?}"
            );
        }
    }
}

#[test]
fn a_session_key_is_the_holders_own_and_never_reaches_past_the_pool() {
    for state in STATES {
        let (store, _, held) = table_in(state);
        // B's `shop1` in B's pool: B's own proxy, never A's lease.
        let by_b = LeaseRequest {
            pool: Some(pool_b()),
            session: Some("shop1".into()),
            holder: Some(B.into()),
            reach: Reach::Pool(pool_b()),
            ..LeaseRequest::default()
        };
        assert_eq!(
            answer(&store, &by_b),
            Ok("new team-b/px-b".into()),
            "A's proxy {state:?}"
        );
        // ...and through the gateway (on a table of its own: a route shares px-b).
        let (routes, _, _) = table_in(state);
        let routed = routes.route(&RouteRequest {
            filters: by_b.clone(),
            replica: "gw-1".into(),
            avoid: None,
            max_connections: 2,
        });
        assert_eq!(
            routed.map(|r| r.entry.key.to_string()),
            Ok("team-b/px-b".into()),
            "routed, A's proxy {state:?}"
        );
        // A's own `shop1` is still A's.
        if let Some(id) = held {
            assert_eq!(answer(&store, &as_a()), Ok(format!("joined {id}")));
        }
    }
}

#[test]
fn inside_the_reach_the_state_is_told_and_a_join_needs_the_same_holder() {
    let named_by_a = |named: ProxyKey| LeaseRequest {
        proxy: Some(named),
        target: Some(TARGET.into()),
        ..as_a()
    };
    let cases: Vec<(State, &str, Result<&str, &str>)> = vec![
        (State::Free, "A names its free proxy", Ok("new team-a/px-a")),
        (State::LeasedByA, "A joins its own session", Ok("joined")),
        (State::CoolingDown, "cooling down", Err("cooling_down")),
        (
            State::CoolingForTarget,
            "cooling for the target",
            Err("cooling_down"),
        ),
        (State::Draining, "draining", Err("draining")),
        (State::InGatewayUse, "in gateway use", Err("leased")),
        (State::Missing, "not provisioned", Err("unknown_proxy")),
    ];
    for (state, case, want) in cases {
        let (store, named, _) = table_in(state);
        let got = answer(&store, &named_by_a(named));
        let got = got
            .as_ref()
            .map(|s| s.split(' ').next().filter(|w| *w == "joined").unwrap_or(s))
            .map_err(GrantError::reason);
        assert_eq!(got, want, "{case}");
    }
    // Somebody who may lease from A's pool too (the unlimited static token), with A's session
    // key: the proxy is leased to another holder, not joined.
    let (store, named, _) = table_in(State::LeasedByA);
    let everywhere = LeaseRequest {
        proxy: Some(named),
        session: Some("shop1".into()),
        ..LeaseRequest::default()
    };
    assert!(matches!(
        answer(&store, &everywhere),
        Err(GrantError::Leased { .. })
    ));
    // A pool outside the reach is one that does not exist.
    let (store, _, _) = table_in(State::Free);
    let other_pool = LeaseRequest {
        pool: Some(pool_a()),
        holder: Some(B.into()),
        reach: Reach::Pool(pool_b()),
        ..LeaseRequest::default()
    };
    assert_eq!(answer(&store, &other_pool), Err(GrantError::UnknownPool));
    let route = store.route(&RouteRequest {
        filters: other_pool,
        replica: "gw-0".into(),
        avoid: None,
        max_connections: 2,
    });
    assert_eq!(
        route.map(|r| r.entry.key.to_string()),
        Err(GrantError::UnknownPool)
    );
    // A request naming no pool reaches only what its reach covers.
    let anything_of_b = LeaseRequest {
        holder: Some(B.into()),
        reach: Reach::Namespace("team-b".into()),
        ..LeaseRequest::default()
    };
    assert_eq!(answer(&store, &anything_of_b), Ok("new team-b/px-b".into()));
    assert_eq!(
        answer(&store, &anything_of_b).map_err(|e| e.reason()),
        Err("no_proxy"),
        "A's free proxy is not B's"
    );
}
