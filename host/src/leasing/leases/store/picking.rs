//! Which proxy a grant gets: the named one, the session's own, or the one free the longest
//! that fits; and the free order it picks from.

use std::collections::BTreeSet;
use std::time::Duration;

use super::sessions::{Digest, session_digest};
use super::shared_use::SHARED_HOLD;
use super::targets::target_digest;
use super::{GrantError, Inner, LeaseRequest, PoolKey, ProxyKey, Reach, Slot};

/// Retry-After when nothing is known to free up sooner.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Longest Retry-After of `no-proxy-available`.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What a grant asks for beyond the filters, hashed before the lock is taken.
pub(super) struct Wanted {
    pub(super) session: Option<Digest>,
    pub(super) target: Option<Digest>,
}

impl Wanted {
    /// The digests of a request's session (per holder: two crawlers choosing the same key do
    /// not share a proxy) and target, made before the table's lock is taken.
    pub(super) fn of(request: &LeaseRequest) -> Wanted {
        Wanted {
            session: request
                .session
                .as_deref()
                .map(|s| session_digest(request.holder.as_deref(), s)),
            target: request.target.as_deref().map(target_digest),
        }
    }
}

pub(super) enum Picked {
    New(ProxyKey),
    /// The session's own lease, by id.
    Joined(String),
}

fn until(from_ms: u64, to_ms: u64) -> Duration {
    Duration::from_millis(to_ms.saturating_sub(from_ms)).max(Duration::from_secs(1))
}

fn min_into(soonest: &mut Option<u64>, at: u64) {
    *soonest = Some(soonest.map_or(at, |s| s.min(at)));
}

/// Whether `slot`'s proxy is one the request's reach and filters (not its target) allow.
pub(super) fn matches(slot: &Slot, request: &LeaseRequest) -> bool {
    let entry = &slot.entry;
    request.reach.covers(&entry.key, slot.pool.as_ref())
        && request
            .pool
            .as_ref()
            .is_none_or(|p| slot.pool.as_ref() == Some(p))
        && request
            .provider
            .as_ref()
            .is_none_or(|p| *p == entry.provider)
        && request
            .zone
            .as_ref()
            .is_none_or(|z| entry.zone.as_ref() == Some(z))
        && request
            .selector
            .iter()
            .all(|(k, v)| entry.labels.get(k) == Some(v))
}

/// What a free proxy is to a grant request.
pub(super) enum Fit {
    /// Grantable; `true` when its ended cooldown is to be forgotten.
    Grant(bool),
    /// Not what the request's filters ask for (or gone).
    Mismatch,
    /// Cooling down, for every target or for the request's, until then (ms).
    Cooling(u64),
}

fn fit(inner: &Inner, key: &ProxyKey, request: &LeaseRequest, wanted: &Wanted, now: u64) -> Fit {
    let Some(slot) = inner.pool.get(key) else {
        return Fit::Mismatch;
    };
    if !matches(slot, request) {
        return Fit::Mismatch;
    }
    fit_matching(inner, key, wanted, now)
}

/// [`fit`] for a proxy already known to match the request's filters.
pub(super) fn fit_matching(inner: &Inner, key: &ProxyKey, wanted: &Wanted, now: u64) -> Fit {
    let mut expired = false;
    match inner.cooldowns.get(key) {
        Some(&until_ms) if until_ms > now => return Fit::Cooling(until_ms),
        Some(_) => expired = true,
        None => {}
    }
    if let Some(target) = &wanted.target
        && let Some(until_ms) = inner.targets.until(key, target, now)
    {
        return Fit::Cooling(until_ms);
    }
    Fit::Grant(expired)
}

/// Chooses the proxy for a grant: the named one; else the session's own, while it is free (or
/// leased by the session itself); else the matching free proxy that has been free the longest.
pub(super) fn pick(
    inner: &mut Inner,
    request: &LeaseRequest,
    wanted: &Wanted,
    now: u64,
) -> Result<Picked, GrantError> {
    if !inner.ready {
        return Err(GrantError::NotReady);
    }
    check_pool(inner, request)?;
    if let Some(key) = &request.proxy {
        return pick_named(inner, key, request, wanted, now);
    }
    if let Some(session) = &wanted.session
        && let Some(bound) = inner.sessions.proxy_of(session)
        && let Some(slot) = inner.pool.get(bound)
        && !slot.entry.draining
        && matches(slot, request)
    {
        // A free proxy is not leased: one lookup in the common case (asked for again after its
        // release).
        if inner.free_seq.contains_key(bound) {
            if let Fit::Grant(expired) = fit_matching(inner, bound, wanted, now) {
                let bound = bound.clone();
                if expired {
                    inner.cooldowns.remove(&bound);
                }
                return Ok(Picked::New(bound));
            }
        } else if let Some(id) = inner.leased.get(bound) {
            let lease = &inner.leases[id].lease;
            // Leased to another session (or holder), the session moves on.
            if joins(lease, request) {
                return Ok(Picked::Joined(id.clone()));
            }
        }
    }
    let mut soonest: Option<u64> = None;
    let mut cooling = Vec::new();
    let mut found = None;
    for (seq, key) in free_in_scope(inner, narrowest_pool(request)) {
        match fit(inner, key, request, wanted, now) {
            Fit::Grant(expired) => {
                found = Some((key.clone(), expired));
                break;
            }
            Fit::Mismatch => {}
            Fit::Cooling(until_ms) => {
                min_into(&mut soonest, until_ms);
                cooling.push(seq);
            }
        }
    }
    if let Some((key, expired)) = found {
        if expired {
            inner.cooldowns.remove(&key);
        }
        // The proxies walked past because they cool down go to the back of the free order, so
        // the next grant (likely for the same site) does not walk past them again: without this
        // every grant for a target walks past every free proxy that target blocked. They stay
        // leasable for the rest.
        for seq in cooling {
            inner.move_free_to_back(seq);
        }
        return Ok(Picked::New(key));
    }
    Err(nothing_free(inner, request, soonest, now))
}

/// The request's pool, inside its reach and known; else the answer of a pool that does not
/// exist (one outside the reach is not told apart from it).
pub(super) fn check_pool(inner: &Inner, request: &LeaseRequest) -> Result<(), GrantError> {
    match &request.pool {
        Some(pool) if !request.reach.covers_pool(pool) || !inner.is_known(pool) => {
            Err(GrantError::UnknownPool)
        }
        _ => Ok(()),
    }
}

/// The one pool a request can be granted from, if it is one: its own, or its reach's.
pub(super) fn narrowest_pool(request: &LeaseRequest) -> Option<&PoolKey> {
    match (&request.pool, &request.reach) {
        (Some(pool), _) | (None, Reach::Pool(pool)) => Some(pool),
        _ => None,
    }
}

/// The free proxies of `pool` (or of every pool) by their place in the free order, longest
/// free first, with their sequence numbers.
pub(super) fn free_in_scope<'a>(
    inner: &'a Inner,
    pool: Option<&PoolKey>,
) -> impl Iterator<Item = (u64, &'a ProxyKey)> {
    let in_pool = pool.map(|pool| {
        inner
            .free_by_pool
            .get(pool)
            .into_iter()
            .flatten()
            .filter_map(|seq| Some((*seq, inner.free.get(seq)?)))
    });
    let anywhere = pool
        .is_none()
        .then(|| inner.free.iter().map(|(seq, key)| (*seq, key)));
    in_pool
        .into_iter()
        .flatten()
        .chain(anywhere.into_iter().flatten())
}

/// The named proxy: first whether it is inside the request's reach at all (outside, whatever
/// its state, it is answered as a proxy that does not exist), then its state.
fn pick_named(
    inner: &Inner,
    key: &ProxyKey,
    request: &LeaseRequest,
    wanted: &Wanted,
    now: u64,
) -> Result<Picked, GrantError> {
    let Some(slot) = inner
        .pool
        .get(key)
        .filter(|slot| request.reach.covers(key, slot.pool.as_ref()))
    else {
        return Err(GrantError::UnknownProxy);
    };
    if slot.entry.draining {
        return Err(GrantError::Draining);
    }
    if inner.shared.is_in_use(key) {
        // Carrying gateway traffic: not exclusive until that ends.
        return Err(GrantError::Leased {
            retry_after: SHARED_HOLD,
        });
    }
    if let Some(id) = inner.leased.get(key) {
        let lease = &inner.leases[id].lease;
        if joins(lease, request) {
            return Ok(Picked::Joined(id.clone()));
        }
        return Err(GrantError::Leased {
            retry_after: until(now, lease.expires_at_ms),
        });
    }
    if let Some(&until_ms) = inner.cooldowns.get(key).filter(|u| **u > now) {
        return Err(GrantError::CoolingDown {
            retry_after: until(now, until_ms),
        });
    }
    if let Some(target) = &wanted.target
        && let Some(until_ms) = inner.targets.until(key, target, now)
    {
        return Err(GrantError::CoolingDown {
            retry_after: until(now, until_ms),
        });
    }
    if !slot.entry.healthy || !matches(slot, request) {
        return Err(GrantError::NoProxy {
            retry_after: DEFAULT_RETRY_AFTER,
        });
    }
    Ok(Picked::New(key.clone()))
}

/// Whether `request` joins `lease`: the same session of the same holder (a session key is no
/// credential: two holders choosing `shop1` are two sessions).
pub(super) fn joins(lease: &super::Lease, request: &LeaseRequest) -> bool {
    request.session.is_some()
        && lease.session.as_deref() == request.session.as_deref()
        && lease.holder == request.holder
}

/// The refusal when no matching proxy is free: `NoMatch` when no provisioned proxy could ever
/// match, else `NoProxy` with the earliest end of a matching lease or cooldown (`soonest`, from
/// the scan). A pool or a cluster with no proxies yet may grow, so that is `NoProxy` too.
pub(super) fn nothing_free(
    inner: &Inner,
    request: &LeaseRequest,
    mut soonest: Option<u64>,
    now: u64,
) -> GrantError {
    let pooled = |pool| inner.pooled.get(pool).copied().unwrap_or(0) as usize;
    let in_scope = match (narrowest_pool(request), &request.reach) {
        (Some(pool), _) => pooled(pool),
        (None, Reach::Namespace(namespace)) => inner
            .pool
            .keys()
            .filter(|k| *k.namespace == **namespace)
            .count(),
        (None, _) => inner.pool.len(),
    };
    if in_scope > 0 && !inner.pool.values().any(|slot| matches(slot, request)) {
        return GrantError::NoMatch;
    }
    for held in inner.leases.values() {
        if inner
            .pool
            .get(&held.lease.proxy)
            .is_some_and(|s| s.entry.leasable() && matches(s, request))
        {
            min_into(&mut soonest, held.lease.expires_at_ms);
        }
    }
    GrantError::NoProxy {
        retry_after: soonest
            .map(|s| until(now, s).min(MAX_RETRY_AFTER))
            .unwrap_or(DEFAULT_RETRY_AFTER),
    }
}

impl Inner {
    pub(super) fn push_free(&mut self, key: ProxyKey) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(pool) = self.pool.get(&key).and_then(|s| s.pool.as_ref()) {
            match self.free_by_pool.get_mut(pool) {
                Some(seqs) => {
                    seqs.insert(seq);
                }
                None => {
                    self.free_by_pool
                        .insert(pool.clone(), BTreeSet::from([seq]));
                }
            }
        }
        self.free.insert(seq, key.clone());
        self.free_seq.insert(key, seq);
    }

    /// Moves the free proxy at `seq` to the back of the free order (its pool's too).
    fn move_free_to_back(&mut self, seq: u64) {
        let Some(key) = self.free.remove(&seq) else {
            return;
        };
        let back = self.next_seq;
        self.next_seq += 1;
        if let Some(pool) = self.pool.get(&key).and_then(|s| s.pool.as_ref())
            && let Some(seqs) = self.free_by_pool.get_mut(pool)
        {
            seqs.remove(&seq);
            seqs.insert(back);
        }
        if let Some(at) = self.free_seq.get_mut(&key) {
            *at = back;
        }
        self.free.insert(back, key);
    }

    pub(super) fn remove_free(&mut self, key: &ProxyKey) {
        let pool = self.pool.get(key).and_then(|s| s.pool.clone());
        self.remove_free_of_pool(key, pool.as_ref());
    }

    /// [`Self::remove_free`] with the proxy's pool already at hand (one lookup fewer).
    pub(super) fn remove_free_of_pool(&mut self, key: &ProxyKey, pool: Option<&PoolKey>) {
        if let Some(seq) = self.free_seq.remove(key) {
            self.free.remove(&seq);
            if let Some(pool) = pool
                && let Some(seqs) = self.free_by_pool.get_mut(pool)
            {
                seqs.remove(&seq);
            }
        }
    }

    /// The per-pool free order from `free`, after the pool membership changed.
    pub(super) fn rebuild_free_by_pool(&mut self) {
        self.free_by_pool.clear();
        for (seq, key) in &self.free {
            if let Some(pool) = self.pool.get(key).and_then(|s| s.pool.as_ref()) {
                self.free_by_pool
                    .entry(pool.clone())
                    .or_default()
                    .insert(*seq);
            }
        }
    }
}
