use super::*;

const NOW: u64 = 1_000_000_000;
const HASH: &str = "h1";

fn slot(provider: &str, zone: Option<&str>) -> Slot {
    Slot {
        provider: provider.into(),
        zone: zone.map(str::to_string),
    }
}

fn desired(replicas: usize) -> Desired {
    Desired {
        replicas,
        template_hash: HASH.into(),
        slots: vec![slot("test", None)],
        expire_after: None,
        recycle_after: None,
        max_surge: 1,
        max_unavailable: 0,
    }
}

/// A Ready, current, unleased member made `age_s` seconds ago.
fn member(name: &str, age_s: u64) -> Member {
    Member {
        name: name.into(),
        slot: slot("test", None),
        template_hash: Some(HASH.into()),
        created_ms: NOW - age_s * 1000,
        ready: true,
        deleting: false,
        draining: false,
        lease_ends_ms: None,
        blocked_reports: 0,
        credentials_stale: false,
        recycle_requested: false,
    }
}

fn names(drain: &[(String, DrainReason)]) -> Vec<(&str, DrainReason)> {
    drain.iter().map(|(n, r)| (n.as_str(), *r)).collect()
}

/// An empty pool makes its replicas in steps of [`CREATES_PER_STEP`], each followed soon by the
/// next, so its status shows how many exist after every step (at 10 000 it showed nothing for
/// the whole scale-up).
#[test]
fn an_empty_pool_makes_its_replicas_in_steps_that_follow_at_once() {
    let plan = plan(&desired(1000), &[], &Caps::new(), NOW);
    assert_eq!(plan.create.len(), CREATES_PER_STEP);
    assert!(plan.drain.is_empty() && plan.delete.is_empty());
    assert_eq!(plan.counts.replicas, CREATES_PER_STEP);
    assert_eq!(plan.counts.ready, 0);
    assert!(plan.progressing);
    assert_eq!(plan.requeue_after, Some(NEXT_STEP));

    let made: Vec<Member> = (0..CREATES_PER_STEP)
        .map(|i| Member {
            ready: false,
            ..member(&format!("m{i}"), 0)
        })
        .collect();
    let next = super::plan(&desired(1000), &made, &Caps::new(), NOW);
    assert_eq!(next.create.len(), CREATES_PER_STEP);
    assert_eq!(next.counts.replicas, 2 * CREATES_PER_STEP);

    let small = super::plan(&desired(10), &[], &Caps::new(), NOW);
    assert_eq!(small.create.len(), 10);
    assert_ne!(small.requeue_after, Some(NEXT_STEP));
}

#[test]
fn a_settled_pool_does_nothing() {
    let members = [member("a", 10), member("b", 10)];
    let plan = plan(&desired(2), &members, &Caps::new(), NOW);
    assert_eq!(plan.create, vec![]);
    assert_eq!(plan.drain, vec![]);
    assert!(!plan.progressing);
    assert_eq!(plan.requeue_after, None, "nothing will change by itself");
    assert_eq!(
        plan.counts,
        Counts {
            replicas: 2,
            ready: 2,
            leased: 0,
            updated: 2,
            draining: 0
        }
    );
}

#[test]
fn scaling_down_drains_unready_then_unleased_then_oldest() {
    let mut unready = member("unready", 1);
    unready.ready = false;
    let mut leased_old = member("leased-old", 100);
    leased_old.lease_ends_ms = Some(NOW + 60_000);
    let members = [
        leased_old,
        member("new", 5),
        member("old", 50),
        unready,
        member("newest", 1),
    ];
    let plan = plan(&desired(2), &members, &Caps::new(), NOW);
    assert_eq!(
        names(&plan.drain),
        vec![
            ("unready", DrainReason::ScaleDown),
            ("old", DrainReason::ScaleDown),
            ("new", DrainReason::ScaleDown)
        ]
    );
    assert!(plan.create.is_empty());
    assert_eq!(plan.counts.replicas, 2);
    assert_eq!(plan.counts.draining, 3);
}

#[test]
fn a_draining_member_is_deleted_only_once_its_lease_has_ended() {
    let mut held = member("held", 10);
    held.draining = true;
    held.lease_ends_ms = Some(NOW + 1);
    let mut ended = member("ended", 10);
    ended.draining = true;
    ended.lease_ends_ms = Some(NOW);
    let mut free = member("free", 10);
    free.draining = true;
    let plan = plan(&desired(0), &[held, ended, free], &Caps::new(), NOW);
    assert_eq!(plan.delete, vec!["ended".to_string(), "free".to_string()]);
    assert_eq!(plan.counts.draining, 1);
    assert_eq!(plan.counts.leased, 1);
    assert_eq!(plan.requeue_after, Some(BUSY_REQUEUE));
}

#[test]
fn members_being_deleted_count_for_nothing() {
    let mut going = member("going", 10);
    going.deleting = true;
    let plan = plan(&desired(1), &[going], &Caps::new(), NOW);
    assert_eq!(plan.create.len(), 1);
    assert!(plan.delete.is_empty());
}

#[test]
fn a_template_change_surges_first_then_drains_once_the_new_one_is_ready() {
    let mut old = vec![member("a", 10), member("b", 10), member("c", 10)];
    for m in &mut old {
        m.template_hash = Some("h0".into());
    }
    // Step 1: one new (the surge), nothing drained (no room in maxUnavailable 0).
    let step = plan(&desired(3), &old, &Caps::new(), NOW);
    assert_eq!(step.create.len(), 1);
    assert!(step.drain.is_empty());
    assert!(step.progressing);
    assert_eq!(step.counts.ready, 3);

    // Step 2: the new one exists but is not Ready: wait.
    let mut new = member("n1", 0);
    new.ready = false;
    let mut members = old.clone();
    members.push(new.clone());
    let step = plan(&desired(3), &members, &Caps::new(), NOW);
    assert!(step.create.is_empty() && step.drain.is_empty());

    // Step 3: Ready: one old one drained (the oldest), and no create until it is.
    members.last_mut().unwrap().ready = true;
    let step = plan(&desired(3), &members, &Caps::new(), NOW);
    assert_eq!(step.drain.len(), 1);
    assert_eq!(step.drain[0].1, DrainReason::TemplateChanged);
    assert_eq!(
        step.create.len(),
        1,
        "room again once one old one is drained"
    );
    assert!(step.counts.ready >= 3);
}

#[test]
fn max_unavailable_lets_old_ones_go_before_their_replacements_exist() {
    let mut pool: Vec<Member> = (0..100).map(|i| member(&format!("p{i}"), 100)).collect();
    for m in &mut pool {
        m.template_hash = Some("h0".into());
    }
    let mut wanted = desired(100);
    wanted.max_surge = 0;
    wanted.max_unavailable = 10;
    let step = plan(&wanted, &pool, &Caps::new(), NOW);
    assert_eq!(step.drain.len(), 10);
    assert_eq!(
        step.counts.ready, 90,
        "never below replicas - maxUnavailable"
    );
    assert_eq!(step.create.len(), 10, "replacements for the drained ones");
}

/// The benchmark's promise in small: a full rotation never drops the Ready active members
/// below `replicas - maxUnavailable`, and never deletes a member holding a lease.
#[test]
fn a_full_rotation_keeps_the_budget_at_every_step_and_never_deletes_a_leased_member() {
    let mut wanted = desired(20);
    wanted.max_unavailable = 2;
    wanted.max_surge = 5;
    let mut members: Vec<Member> = (0..20)
        .map(|i| {
            let mut m = member(&format!("old{i}"), 100);
            m.template_hash = Some("h0".into());
            // Every third one is leased for a few steps.
            if i % 3 == 0 {
                m.lease_ends_ms = Some(NOW + 3 * 1000);
            }
            m
        })
        .collect();
    let mut next = 0;
    for step_index in 0..200u64 {
        let now = NOW + step_index * 1000;
        let step = plan(&wanted, &members, &Caps::new(), now);
        assert!(
            step.counts.ready >= 18,
            "step {step_index}: {} Ready",
            step.counts.ready
        );
        for name in &step.delete {
            let m = members.iter().find(|m| &m.name == name).unwrap();
            assert!(
                m.lease_ends_ms.is_none_or(|end| end <= now),
                "{name} leased"
            );
        }
        // Carry it out: drains mark, deletes remove, creates appear unready, and what was
        // created a step ago turns Ready.
        for m in &mut members {
            if step.drain.iter().any(|(n, _)| *n == m.name) {
                m.draining = true;
            }
            if !m.ready && m.template_hash.as_deref() == Some(HASH) {
                m.ready = true;
            }
        }
        members.retain(|m| !step.delete.contains(&m.name));
        for slot in step.create {
            let mut m = member(&format!("new{next}"), 0);
            m.created_ms = now;
            m.slot = slot;
            m.ready = false;
            next += 1;
            members.push(m);
        }
        if members.len() == 20 && members.iter().all(|m| m.name.starts_with("new") && m.ready) {
            return;
        }
    }
    panic!("the rotation did not finish: {members:#?}");
}

#[test]
fn expired_and_recycled_members_are_replaced_recycled_first() {
    let mut wanted = desired(3);
    wanted.expire_after = Some(Duration::from_secs(60));
    wanted.recycle_after = Some(5);
    wanted.max_unavailable = 2;
    wanted.max_surge = 0;
    let mut blocked = member("blocked", 10);
    blocked.blocked_reports = 5;
    let members = [member("fresh", 10), member("aged", 61), blocked];
    let step = plan(&wanted, &members, &Caps::new(), NOW);
    assert_eq!(
        names(&step.drain),
        vec![
            ("blocked", DrainReason::Recycled),
            ("aged", DrainReason::Expired)
        ]
    );
    assert_eq!(step.create.len(), 2);
}

#[test]
fn a_leased_old_member_is_drained_after_the_unleased_ones() {
    let mut wanted = desired(2);
    wanted.max_unavailable = 1;
    wanted.max_surge = 0;
    let mut leased = member("leased", 100);
    leased.template_hash = Some("h0".into());
    leased.lease_ends_ms = Some(NOW + 10_000);
    let mut free = member("free", 50);
    free.template_hash = Some("h0".into());
    let step = plan(&wanted, &[leased, free], &Caps::new(), NOW);
    assert_eq!(
        names(&step.drain),
        vec![("free", DrainReason::TemplateChanged)]
    );
}

#[test]
fn new_members_spread_to_the_emptiest_slot_and_a_removed_slot_rolls() {
    let mut wanted = desired(6);
    wanted.slots = vec![slot("test", Some("a")), slot("test", Some("b"))];
    let mut in_a = member("in-a", 10);
    in_a.slot = slot("test", Some("a"));
    let mut in_gone = member("in-c", 10);
    in_gone.slot = slot("test", Some("c"));
    let step = plan(&wanted, &[in_a, in_gone], &Caps::new(), NOW);
    let mut by_slot: BTreeMap<Slot, usize> = BTreeMap::new();
    for s in &step.create {
        *by_slot.entry(s.clone()).or_default() += 1;
    }
    // a has one already: 2 more to a, 3 to b.
    assert_eq!(by_slot[&slot("test", Some("a"))], 2);
    assert_eq!(by_slot[&slot("test", Some("b"))], 3);
    assert_eq!(step.create.len(), 5, "room is replicas + surge - members");
    assert!(
        step.drain.is_empty(),
        "the old one waits for a Ready replacement"
    );
}

#[test]
fn an_expiring_pool_comes_back_when_the_oldest_member_expires() {
    let mut wanted = desired(2);
    wanted.expire_after = Some(Duration::from_secs(3600));
    let step = plan(
        &wanted,
        &[member("a", 600), member("b", 60)],
        &Caps::new(),
        NOW,
    );
    assert_eq!(step.requeue_after, Some(Duration::from_secs(3000)));
}

/// maxSurge, maxUnavailable, replicas, and the counts (or the start of the error).
type BudgetCase = (
    Option<IntOrString>,
    Option<IntOrString>,
    usize,
    Result<(usize, usize), &'static str>,
);

#[test]
fn budgets_resolve_like_a_deployments() {
    use IntOrString::{Int, String as Text};
    let cases: &[BudgetCase] = &[
        (None, None, 100, Ok((25, 0))),
        (None, None, 1, Ok((1, 0))),
        (None, None, 0, Ok((1, 0))),
        (
            Some(Text("10%".into())),
            Some(Text("10%".into())),
            95,
            Ok((10, 9)),
        ),
        (Some(Int(0)), Some(Int(0)), 10, Ok((1, 0))),
        (Some(Int(0)), Some(Text("10%".into())), 100, Ok((0, 10))),
        (
            Some(Int(-1)),
            None,
            10,
            Err("spec.maxSurge: -1 is negative"),
        ),
        (
            None,
            Some(Text("ten".into())),
            10,
            Err("spec.maxUnavailable: `ten` is neither"),
        ),
        (
            None,
            Some(Text("150%".into())),
            10,
            Err("spec.maxUnavailable: `150%` is neither"),
        ),
    ];
    for (surge, unavailable, replicas, expected) in cases {
        let got = budget(surge.as_ref(), unavailable.as_ref(), *replicas);
        match (expected, &got) {
            (Ok(want), Ok(got)) => assert_eq!(want, got, "{surge:?} {unavailable:?} {replicas}"),
            (Err(prefix), Err(message)) => {
                assert!(message.starts_with(prefix), "{message}")
            }
            _ => panic!("{surge:?} {unavailable:?} {replicas}: {got:?}"),
        }
    }
}

#[test]
fn a_member_whose_credentials_could_not_be_rotated_is_replaced_after_recycled_ones() {
    let mut wanted = desired(3);
    wanted.expire_after = Some(Duration::from_secs(60));
    wanted.recycle_after = Some(5);
    wanted.max_unavailable = 3;
    wanted.max_surge = 0;
    let mut blocked = member("blocked", 10);
    blocked.blocked_reports = 5;
    let mut stale = member("stale", 10);
    stale.credentials_stale = true;
    let members = [member("aged", 61), stale, blocked];
    let step = plan(&wanted, &members, &Caps::new(), NOW);
    assert_eq!(
        names(&step.drain),
        vec![
            ("blocked", DrainReason::Recycled),
            ("stale", DrainReason::CredentialsRotated),
            ("aged", DrainReason::Expired),
        ]
    );
    assert_eq!(step.create.len(), 3);
}

/// A member someone asked to recycle is replaced as an old one is: a new member first (the
/// surge), then drained only while the Ready ones stay at `replicas - maxUnavailable`; before
/// any other old member, and whatever its age or reports.
#[test]
fn a_member_asked_to_recycle_is_replaced_within_the_budget_first() {
    let mut asked = member("asked", 10);
    asked.recycle_requested = true;
    let mut wanted = desired(2);
    wanted.expire_after = Some(Duration::from_secs(60));
    let members = [member("aged", 61), asked.clone()];
    // maxUnavailable 0: new ones first, nothing drained while none of them is Ready.
    let first = plan(&wanted, &members, &Caps::new(), NOW);
    assert_eq!(first.drain, vec![]);
    assert_eq!(first.create.len(), 1, "the surge of 1");
    assert!(first.progressing);
    // A Ready replacement lets one go: the one asked for, before the expired one.
    let made = Member {
        name: "new".into(),
        ..member("new", 0)
    };
    let second = plan(
        &wanted,
        &[members[0].clone(), asked.clone(), made],
        &Caps::new(),
        NOW,
    );
    assert_eq!(
        names(&second.drain),
        vec![("asked", DrainReason::Requested)]
    );
    assert_eq!(DrainReason::Requested.as_str(), "RecycleRequested");
    // Not Ready, it goes at once (it costs nothing).
    let mut unready = asked;
    unready.ready = false;
    let third = plan(&desired(1), &[member("ok", 10), unready], &Caps::new(), NOW);
    assert_eq!(names(&third.drain), vec![("asked", DrainReason::Requested)]);
}

/// `n` Ready members made from the template, or from an older one when `old`.
fn members_of(n: usize, old: bool) -> Vec<Member> {
    (0..n)
        .map(|i| Member {
            template_hash: Some(if old { "h0" } else { HASH }.into()),
            ..member(&format!("m{i}"), 100)
        })
        .collect()
}

fn cap_of(cap: usize, counted: usize) -> Caps {
    Caps::from([("test".to_string(), caps::Use { cap, counted })])
}

/// A pool and a cap on its instance: how many are made, drained, and whether the pool says it
/// is held back by the cap (docs/pools.md, "Caps per provider instance").
#[rstest::rstest]
// replicas, surge, members (old?), cap, counted (other pools' included) => creates, drains, capped
#[case::scale_up_stops_at_the_cap((5, 1, 0, false, 3, 0), (3, 0, true))]
#[case::other_pools_count((5, 1, 0, false, 3, 2), (1, 0, true))]
#[case::at_the_cap_nothing_more((5, 1, 3, false, 3, 3), (0, 0, true))]
#[case::a_raised_cap_lets_it_grow((5, 1, 3, false, 5, 3), (2, 0, false))]
#[case::room_enough_is_not_capped((3, 1, 0, false, 20, 10), (3, 0, false))]
#[case::a_lowered_cap_drains_nothing((5, 1, 5, false, 3, 5), (0, 0, false))]
#[case::a_rotation_at_the_cap_surges((3, 1, 3, true, 3, 3), (1, 0, false))]
#[case::a_lowered_cap_lets_rotation_shrink((5, 2, 5, true, 3, 5), (0, 2, true))]
#[case::a_cap_of_zero_freezes((2, 1, 0, false, 0, 0), (0, 0, true))]
fn creates_stay_within_the_cap(
    #[case] given: (usize, usize, usize, bool, usize, usize),
    #[case] want: (usize, usize, bool),
) {
    let (replicas, surge, existing, old, cap, counted) = given;
    let (creates, drains, capped) = want;
    let mut wanted = desired(replicas);
    wanted.max_surge = surge;
    let step = plan(
        &wanted,
        &members_of(existing, old),
        &cap_of(cap, counted),
        NOW,
    );
    assert_eq!(
        (step.create.len(), step.drain.len(), !step.capped.is_empty()),
        (creates, drains, capped),
        "{step:?}"
    );
    if capped {
        assert_eq!(step.capped, ["test"]);
        assert!(step.requeue_after.is_some_and(|a| a <= CAPPED_REQUEUE));
    }
}

/// Draining members are on their way out of the instance already: a lowered cap lets go only
/// as many more old ones as the instance is over beyond them.
#[test]
fn members_already_draining_count_towards_the_overshoot() {
    let mut members = members_of(5, true);
    members[0].draining = true;
    members[0].lease_ends_ms = Some(NOW + 60_000);
    let mut wanted = desired(5);
    wanted.max_surge = 2;
    let step = plan(&wanted, &members, &cap_of(3, 5), NOW);
    assert_eq!(step.drain.len(), 1, "{step:?}");
}

/// A pool spread over two instances: the one at its cap gets no more, the other takes them.
#[test]
fn a_capped_instance_sends_the_creates_to_the_others() {
    let mut wanted = desired(4);
    wanted.slots = vec![slot("capped", None), slot("free", None)];
    let caps = Caps::from([("capped".to_string(), caps::Use { cap: 1, counted: 0 })]);
    let step = plan(&wanted, &[], &caps, NOW);
    assert_eq!(
        step.create,
        [
            slot("capped", None),
            slot("free", None),
            slot("free", None),
            slot("free", None)
        ]
    );
    assert!(step.capped.is_empty(), "replicas are made: {step:?}");

    let both = Caps::from([
        ("capped".to_string(), caps::Use { cap: 1, counted: 0 }),
        ("free".to_string(), caps::Use { cap: 1, counted: 1 }),
    ]);
    let step = plan(&wanted, &[], &both, NOW);
    assert_eq!(step.create, [slot("capped", None)]);
    assert_eq!(step.capped, ["capped", "free"]);
}

/// A rotation at the cap: the surge is made beyond the cap, an old member goes once the new one
/// is Ready, and the next replacement waits until it is deleted (never more than cap + surge).
#[test]
fn a_rotation_at_the_cap_overshoots_by_its_surge_only() {
    let old = members_of(3, true);
    let step = plan(&desired(3), &old, &cap_of(3, 3), NOW);
    assert_eq!((step.create.len(), step.drain.len()), (1, 0));

    let mut members = old.clone();
    members.push(Member {
        ready: false,
        ..member("n1", 0)
    });
    let step = plan(&desired(3), &members, &cap_of(3, 4), NOW);
    assert_eq!(
        (step.create.len(), step.drain.len()),
        (0, 0),
        "the surge is not over the cap: {step:?}"
    );

    members.last_mut().unwrap().ready = true;
    let step = plan(&desired(3), &members, &cap_of(3, 4), NOW);
    assert_eq!(step.drain.len(), 1);
    assert_eq!(step.create.len(), 0, "cap + surge is reached: {step:?}");

    let mut drained = members.clone();
    drained.retain(|m| m.name != step.drain[0].0);
    let step = plan(&desired(3), &drained, &cap_of(3, 3), NOW);
    assert_eq!(
        step.create.len(),
        1,
        "the next one once the drained is gone"
    );
}
