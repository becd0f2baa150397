//! What the pool controller does next, decided from what it sees. Pure: every rule is a row of a
//! table in `decide/tests.rs`; `reconcile.rs` gathers the inputs and carries the plan out.
//!
//! The rules, in the terms of docs/pools.md:
//! - a *member* is a Proxy of the pool; *active* ones take new leases, *draining* ones do not
//!   and are deleted once they hold no lease;
//! - an active member is *old* when its template or spread target is not the pool's any more,
//!   it is older than `expireAfter`, crawlers reported it blocked `recycleAfter` times, or
//!   someone asked for it to be recycled; the others are *current*;
//! - new Proxies are made while fewer than `replicas` are current, keeping current + old within
//!   `replicas + maxSurge`;
//! - old ones are drained while the Ready active ones stay at least `replicas -
//!   maxUnavailable` (an old one that is not Ready costs nothing);
//! - scaling down drains current ones too: not Ready first, then unleased, then the oldest;
//! - creates stay within the caps of the provider instances (`crate::lifecycle::caps`): a slot
//!   whose instance has no room gets none, the others take them; a pool with old members
//!   (rotating) may take an instance up to its cap plus `maxSurge`; an old member on an instance
//!   over its cap (a lowered cap) is drained without waiting for the budget, as many as the
//!   instance is over.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::lifecycle::caps::{self, Caps};

/// Where a member runs: the provider instance and the zone of its spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub provider: String,
    pub zone: Option<String>,
}

/// A Proxy of the pool, as the controller sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub name: String,
    pub slot: Slot,
    /// The template hash it was made from (its label); `None` if the label is gone.
    pub template_hash: Option<String>,
    pub created_ms: u64,
    /// Phase `Ready`: provisioned and passing health probes.
    pub ready: bool,
    /// Being deleted (its finalizer is at work): counts for nothing.
    pub deleting: bool,
    /// Takes no new leases (the pool's annotation).
    pub draining: bool,
    /// When its lease ends, if one is held.
    pub lease_ends_ms: Option<u64>,
    /// `blocked` reports crawlers made on it.
    pub blocked_reports: u32,
    /// Its credentials Secret changed and its provider could not change the running proxy's
    /// (`CredentialsCurrent` is `False`, reason `RotationFailed`): a new proxy gets them.
    pub credentials_stale: bool,
    /// Someone asked for a new one in its place (the pool's recycle annotation, as `kubectl px
    /// recycle` sets it): replaced like any old member, within the budget.
    pub recycle_requested: bool,
}

/// What the pool's spec asks for, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub replicas: usize,
    pub template_hash: String,
    /// Where members may run; never empty (the template's own slot when no spread is given).
    pub slots: Vec<Slot>,
    pub expire_after: Option<Duration>,
    pub recycle_after: Option<u32>,
    pub max_surge: usize,
    pub max_unavailable: usize,
}

/// Why a member is drained. The order is the order old members are replaced in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainReason {
    /// Someone asked for it to be replaced (the recycle annotation).
    Requested,
    /// Crawlers reported it blocked `recycleAfter` times.
    Recycled,
    /// Its credentials were rotated, which its provider cannot do in place.
    CredentialsRotated,
    /// Older than `expireAfter`.
    Expired,
    /// Made from another template or spread.
    TemplateChanged,
    /// More members than `replicas`.
    ScaleDown,
}

impl DrainReason {
    /// The event reason and the annotation value.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainReason::Requested => "RecycleRequested",
            DrainReason::Recycled => "Recycled",
            DrainReason::CredentialsRotated => "CredentialsRotated",
            DrainReason::Expired => "Expired",
            DrainReason::TemplateChanged => "TemplateChanged",
            DrainReason::ScaleDown => "ScaleDown",
        }
    }
}

/// The pool's counts, for its status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub replicas: usize,
    pub ready: usize,
    pub leased: usize,
    pub updated: usize,
    pub draining: usize,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// New members to make, one per entry, in that slot.
    pub create: Vec<Slot>,
    /// Members to stop leasing.
    pub drain: Vec<(String, DrainReason)>,
    /// Draining members that hold no lease any more.
    pub delete: Vec<String>,
    /// Counts after the plan is carried out (what the status says).
    pub counts: Counts,
    /// Old or surplus members are left, or new ones are not Ready yet.
    pub progressing: bool,
    /// When to look again even if nothing changes (a lease ends, a member expires).
    pub requeue_after: Option<Duration>,
    /// The provider instances whose caps held back a create the pool needed (sorted): the pool
    /// stays below `replicas` until they have room.
    pub capped: Vec<String>,
}

/// How often a pool with something in flight is looked at again: lease ends and `blocked`
/// reports happen in the lease table, which wakes no reconcile.
pub const BUSY_REQUEUE: Duration = Duration::from_secs(5);
/// How often a settled pool that rotates or recycles is looked at again.
pub const IDLE_REQUEUE: Duration = Duration::from_secs(30);

/// Members made in one step at most: a pool of 10 000 writes its status (how many exist and are
/// Ready) after every step of this many creates, not once at the end of the scale-up.
pub const CREATES_PER_STEP: usize = 250;
/// When the next step of a scale-up that made [`CREATES_PER_STEP`] follows.
pub const NEXT_STEP: Duration = Duration::from_millis(100);
/// How often a pool held back by a cap looks for room again: other pools' Proxies going away
/// wake no reconcile of this one (a raised cap does, as every providers config change).
pub const CAPPED_REQUEUE: Duration = Duration::from_secs(10);

/// Decides the next step for a pool, within the `caps` of the instances its slots are on.
pub fn plan(desired: &Desired, members: &[Member], caps: &Caps, now_ms: u64) -> Plan {
    let leased = |m: &Member| m.lease_ends_ms.is_some_and(|end| end > now_ms);
    let live: Vec<&Member> = members.iter().filter(|m| !m.deleting).collect();
    let mut plan = Plan::default();

    // Draining members leave once their lease is over.
    for member in live.iter().filter(|m| m.draining) {
        if !leased(member) {
            plan.delete.push(member.name.clone());
        }
    }

    let mut current: Vec<&Member> = Vec::new();
    let mut old: Vec<(&Member, DrainReason)> = Vec::new();
    for member in live.iter().filter(|m| !m.draining) {
        match outdated(desired, member, now_ms) {
            Some(reason) => old.push((member, reason)),
            None => current.push(member),
        }
    }

    if current.len() > desired.replicas {
        // Scaling down: every old member goes, and the surplus of current ones.
        plan.drain
            .extend(old.iter().map(|(m, reason)| (m.name.clone(), *reason)));
        current.sort_by_key(|m| (m.ready, leased(m), m.created_ms));
        let surplus = current.len() - desired.replicas;
        plan.drain.extend(
            current
                .drain(..surplus)
                .map(|m| (m.name.clone(), DrainReason::ScaleDown)),
        );
        old.clear();
    } else {
        // Replace old members within the budget. (Not "whatever is beyond `replicas`": new
        // members that are not Ready yet would count, and the Ready ones would drop below the
        // budget. A lower `replicas` lowers the floor instead.)
        let min_available = desired.replicas.saturating_sub(desired.max_unavailable);
        let available = current.iter().filter(|m| m.ready).count()
            + old.iter().filter(|(m, _)| m.ready).count();
        let mut budget = available.saturating_sub(min_available);
        let rotating = !old.is_empty();
        let mut over = over_caps(caps, &live, &current);
        old.sort_by_key(|(m, reason)| (m.ready, leased(m), *reason, m.created_ms));
        let mut kept = Vec::new();
        for (member, reason) in old {
            let over_here = over.get_mut(member.slot.provider.as_str());
            if !member.ready || budget > 0 || over_here.as_ref().is_some_and(|n| **n > 0) {
                if member.ready && budget > 0 {
                    budget -= 1;
                }
                if let Some(n) = over_here {
                    *n = n.saturating_sub(1);
                }
                plan.drain.push((member.name.clone(), reason));
            } else {
                kept.push((member, reason));
            }
        }
        old = kept;
        let need = desired.replicas - current.len();
        let room = (desired.replicas + desired.max_surge).saturating_sub(current.len() + old.len());
        let surge = if rotating { desired.max_surge } else { 0 };
        let wanted = need.min(room).min(CREATES_PER_STEP);
        (plan.create, plan.capped) = creates(desired, &current, wanted, caps, surge);
    }

    let drained: std::collections::HashSet<&str> =
        plan.drain.iter().map(|(name, _)| name.as_str()).collect();
    let active_after: Vec<&Member> = live
        .iter()
        .copied()
        .filter(|m| !m.draining && !drained.contains(m.name.as_str()))
        .collect();
    let updated = current.len();
    plan.counts = Counts {
        replicas: active_after.len() + plan.create.len(),
        ready: active_after.iter().filter(|m| m.ready).count(),
        leased: live.iter().filter(|m| leased(m)).count(),
        updated: updated + plan.create.len(),
        draining: live.iter().filter(|m| m.draining).count() - plan.delete.len() + plan.drain.len(),
    };
    plan.progressing = !old.is_empty()
        || !plan.create.is_empty()
        || !plan.drain.is_empty()
        || current.iter().any(|m| !m.ready);
    plan.requeue_after = requeue_after(desired, &live, &plan, now_ms);
    if plan.create.len() == CREATES_PER_STEP {
        // Maybe more to make: the next step soon, after this one's status is written.
        plan.requeue_after = Some(NEXT_STEP);
    }
    if !plan.capped.is_empty() {
        plan.requeue_after = Some(
            plan.requeue_after
                .map_or(CAPPED_REQUEUE, |after| after.min(CAPPED_REQUEUE)),
        );
    }
    plan
}

/// Where `wanted` new members go, each in the emptiest slot whose instance has room (its cap,
/// plus `surge` for a rotation); and the instances whose caps held back the rest, if any were.
fn creates(
    desired: &Desired,
    current: &[&Member],
    wanted: usize,
    caps: &Caps,
    surge: usize,
) -> (Vec<Slot>, Vec<String>) {
    let mut headroom: BTreeMap<&str, usize> = caps
        .iter()
        .map(|(name, used)| (name.as_str(), caps::headroom(*used, surge)))
        .collect();
    let mut per_slot = slot_counts(desired, current);
    let mut made = Vec::new();
    for _ in 0..wanted {
        let has_room = |slot: &Slot| headroom.get(slot.provider.as_str()) != Some(&0);
        let Some(slot) = emptiest(desired, &per_slot, has_room) else {
            return (made, capped_instances(desired, &headroom));
        };
        if let Some(left) = headroom.get_mut(slot.provider.as_str()) {
            *left -= 1;
        }
        *per_slot.entry(slot.clone()).or_default() += 1;
        made.push(slot);
    }
    (made, Vec::new())
}

/// How many Proxies each capped instance has beyond its cap, less the pool's members there that
/// are draining already (on their way out) and its new ones not Ready yet (a rotation's surge,
/// which drains an old one by the budget once Ready): so many old members may go unreplaced.
fn over_caps<'a>(
    caps: &'a Caps,
    live: &[&Member],
    current: &[&Member],
) -> BTreeMap<&'a str, usize> {
    caps.iter()
        .map(|(name, used)| {
            let here = |m: &&&Member| m.slot.provider == *name;
            let leaving = live.iter().filter(here).filter(|m| m.draining).count();
            let surging = current.iter().filter(here).filter(|m| !m.ready).count();
            (
                name.as_str(),
                caps::over(*used).saturating_sub(leaving + surging),
            )
        })
        .collect()
}

/// The instances of the pool's slots that have no room left.
fn capped_instances(desired: &Desired, headroom: &BTreeMap<&str, usize>) -> Vec<String> {
    let mut names: Vec<String> = desired
        .slots
        .iter()
        .filter(|slot| headroom.get(slot.provider.as_str()) == Some(&0))
        .map(|slot| slot.provider.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Why an active member should be replaced, if it should.
fn outdated(desired: &Desired, member: &Member, now_ms: u64) -> Option<DrainReason> {
    if member.recycle_requested {
        return Some(DrainReason::Requested);
    }
    if desired
        .recycle_after
        .is_some_and(|limit| member.blocked_reports >= limit)
    {
        return Some(DrainReason::Recycled);
    }
    if member.credentials_stale {
        return Some(DrainReason::CredentialsRotated);
    }
    if desired
        .expire_after
        .is_some_and(|age| now_ms >= member.created_ms.saturating_add(age.as_millis() as u64))
    {
        return Some(DrainReason::Expired);
    }
    if member.template_hash.as_deref() != Some(desired.template_hash.as_str())
        || !desired.slots.contains(&member.slot)
    {
        return Some(DrainReason::TemplateChanged);
    }
    None
}

fn slot_counts(desired: &Desired, current: &[&Member]) -> BTreeMap<Slot, usize> {
    let mut counts: BTreeMap<Slot, usize> = desired.slots.iter().map(|s| (s.clone(), 0)).collect();
    for member in current {
        if let Some(count) = counts.get_mut(&member.slot) {
            *count += 1;
        }
    }
    counts
}

/// The slot with the fewest members among those `open` allows; the first listed on a tie.
/// `None` when no slot is open (every instance of the pool is at its cap).
fn emptiest(
    desired: &Desired,
    counts: &BTreeMap<Slot, usize>,
    open: impl Fn(&Slot) -> bool,
) -> Option<Slot> {
    desired
        .slots
        .iter()
        .enumerate()
        .filter(|(_, slot)| open(slot))
        .min_by_key(|(index, slot)| (counts.get(*slot).copied().unwrap_or(0), *index))
        .map(|(_, slot)| slot.clone())
}

fn requeue_after(
    desired: &Desired,
    live: &[&Member],
    plan: &Plan,
    now_ms: u64,
) -> Option<Duration> {
    if plan.progressing || live.iter().any(|m| m.draining) || !plan.delete.is_empty() {
        return Some(BUSY_REQUEUE);
    }
    let mut next: Option<Duration> = None;
    if let Some(age) = desired.expire_after {
        let soonest = live
            .iter()
            .map(|m| m.created_ms.saturating_add(age.as_millis() as u64))
            .min();
        if let Some(at) = soonest {
            next = Some(Duration::from_millis(at.saturating_sub(now_ms)).max(BUSY_REQUEUE));
        }
    }
    if desired.recycle_after.is_some() {
        next = Some(next.map_or(IDLE_REQUEUE, |n| n.min(IDLE_REQUEUE)));
    }
    next
}

/// `maxSurge` and `maxUnavailable` as counts of `replicas`: a percentage rounds up for the
/// surge and down for unavailability (as a Deployment's do). Both zero would never progress, so
/// the surge is then 1.
pub fn budget(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    replicas: usize,
) -> Result<(usize, usize), String> {
    let surge = match max_surge {
        None => replicas.div_ceil(4),
        Some(value) => count_of("spec.maxSurge", value, replicas, true)?,
    };
    let unavailable = match max_unavailable {
        None => 0,
        Some(value) => count_of("spec.maxUnavailable", value, replicas, false)?,
    };
    Ok(if surge == 0 && unavailable == 0 {
        (1, 0)
    } else {
        (surge, unavailable)
    })
}

fn count_of(
    field: &str,
    value: &IntOrString,
    replicas: usize,
    round_up: bool,
) -> Result<usize, String> {
    match value {
        IntOrString::Int(n) if *n >= 0 => Ok(*n as usize),
        IntOrString::Int(n) => Err(format!("{field}: {n} is negative; use 0 or more")),
        IntOrString::String(text) => {
            let percent = text
                .strip_suffix('%')
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| *p <= 100)
                .ok_or_else(|| {
                    format!("{field}: `{text}` is neither a count nor a percentage such as 25%")
                })? as usize;
            let scaled = replicas * percent;
            Ok(if round_up {
                scaled.div_ceil(100)
            } else {
                scaled / 100
            })
        }
    }
}

#[cfg(test)]
mod tests;
