//! A lease from grant to end: grant (or a session's join), report, renew, release, expiry, and
//! what the table remembers of ended leases.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::picking::{Picked, Wanted, pick};
use super::{
    EndReason, Grant, GrantError, Held, Inner, Lease, LeaseError, LeaseRequest, LeaseStore,
    Outcome, ProvisionedProxy, ProxyKey, ProxyUsage, now_ms,
};
use crate::leasing::leases::journal::Change;
use crate::leasing::leases::metrics::Series;

/// How long the id of an ended lease is remembered, so its holder gets 410 rather than 404.
const REMEMBER_ENDED: Duration = Duration::from_secs(3600);
/// At most this many ended ids are remembered (oldest forgotten first): at tens of thousands of
/// leases a second, an hour of ids would otherwise grow without bound.
pub(super) const MAX_ENDED: usize = 65_536;

/// 128 random bits from the thread-local CSPRNG (ChaCha, seeded and reseeded from the OS): an id
/// cannot be guessed, and a grant costs no system call.
fn new_lease_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

impl LeaseStore {
    /// Grants a lease on a healthy proxy that is neither leased nor cooling down (nor draining).
    pub fn grant(&self, request: &LeaseRequest) -> Result<(Lease, ProvisionedProxy), GrantError> {
        self.grant_or_join(request)
            .map(|g| (g.lease, Arc::unwrap_or_clone(g.entry)))
    }

    /// Grants a lease, or hands a session the lease it already holds (see [`Grant::joined`]).
    pub fn grant_or_join(&self, request: &LeaseRequest) -> Result<Grant, GrantError> {
        let now = now_ms();
        let ttl = request
            .ttl
            .unwrap_or(self.options.default_ttl)
            .min(self.options.max_ttl)
            .max(Duration::from_secs(1));
        // Made outside the lock, which every grant and release waits for: the id and its copies
        // for the table, the request's strings, the digests.
        let id = new_lease_id();
        let (held_id, leased_id) = (id.clone(), id.clone());
        let session: Option<Arc<str>> = request.session.as_deref().map(Arc::from);
        let holder = request.holder.clone();
        let wanted = Wanted::of(request);
        let ttl_ms = ttl.as_millis() as u64;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let key = match pick(inner, request, &wanted, now) {
            Ok(Picked::New(key)) => match inner.check_lease_quota(&key) {
                Ok(()) => key,
                Err(e) => {
                    self.reject(inner, request, &e);
                    return Err(e);
                }
            },
            Ok(Picked::Joined(id)) => {
                let held = &inner.leases[&id];
                let lease = held.lease.clone();
                let entry = inner.pool[&lease.proxy].entry.clone();
                if let Some(session) = wanted.session {
                    inner.sessions.bind(session, &lease.proxy);
                }
                return Ok(Grant {
                    lease,
                    entry,
                    joined: true,
                });
            }
            Err(e) => {
                self.reject(inner, request, &e);
                return Err(e);
            }
        };
        let slot = &inner.pool[&key];
        let (series, entry, pool) = (slot.series.clone(), slot.entry.clone(), slot.pool.clone());
        // The pool's name is the slot's, shared.
        let pool_name = pool.as_ref().map(|k| k.name.clone());
        let lease_on = |id, holder| Lease {
            id,
            proxy: entry.key.clone(),
            granted_at_ms: now,
            expires_at_ms: now + ttl_ms,
            session: session.clone(),
            pool: pool_name.clone(),
            provider: entry.provider.clone(),
            ttl_ms,
            holder,
        };
        let lease = lease_on(held_id, holder);
        inner.record(Change::Granted(lease.clone()));
        inner.remove_free_of_pool(&key, pool.as_ref());
        if let Some(session) = wanted.session {
            inner.sessions.bind(session, &key);
        }
        inner.quotas.count(&key, true);
        inner.leased.insert(key, leased_id);
        series.granted.inc();
        series.active.inc();
        inner.leases.insert(id.clone(), Held { lease, series });
        self.mark_dirty(inner);
        drop(guard);
        // The caller's copy, made after the lock is released.
        let lease = lease_on(id, request.holder.clone());
        Ok(Grant {
            lease,
            entry,
            joined: false,
        })
    }

    /// Applies a crawler's report. `blocked` ends the lease and cools the proxy down.
    pub fn report(&self, id: &str, outcome: Outcome) -> Result<Lease, LeaseError> {
        self.report_for(id, outcome, None)
    }

    /// Applies a crawler's report; a `blocked` one naming a `target` (normalized, see
    /// [`normalize_target`](super::normalize_target)) cools the proxy down for that target
    /// only, unless a bound on per-target cooldowns is reached (then for every target).
    pub fn report_for(
        &self,
        id: &str,
        outcome: Outcome,
        target: Option<&str>,
    ) -> Result<Lease, LeaseError> {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let (lease, series) = inner.live(id, now)?;
        series.reports[outcome as usize].inc();
        self.apply_outcome(inner, &lease.proxy, outcome, target, now);
        if outcome == Outcome::Blocked {
            inner.end(id, EndReason::Blocked);
            self.mark_dirty(inner);
        }
        Ok(lease)
    }

    /// The holder of a live or a remembered ended lease (`Some(None)`: the static token);
    /// `None` when no such lease is known.
    pub fn holder(&self, id: &str) -> Option<Option<String>> {
        let inner = self.lock();
        match inner.leases.get(id) {
            Some(held) => Some(held.lease.holder.clone()),
            None => inner.ended.get(id).map(|(_, holder)| holder.clone()),
        }
    }

    /// A live lease and its proxy.
    pub fn lease(&self, id: &str) -> Result<(Lease, Arc<ProvisionedProxy>), LeaseError> {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let (lease, _) = inner.live(id, now)?;
        // A lease restored before the Proxies were read: its proxy is known in a moment.
        let slot = inner.pool.get(&lease.proxy).ok_or(LeaseError::NotReady)?;
        Ok((lease, slot.entry.clone()))
    }

    /// Extends a live lease to now + `ttl` (or the lifetime it last got), at most
    /// `--max-lease-ttl` from now. Refused on a draining proxy, so a drain ends within a TTL.
    pub fn renew(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> Result<(Lease, Arc<ProvisionedProxy>), LeaseError> {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let (lease, _) = inner.live(id, now)?;
        let slot = inner.pool.get(&lease.proxy).ok_or(LeaseError::NotReady)?;
        if slot.entry.draining {
            return Err(LeaseError::Draining);
        }
        let entry = slot.entry.clone();
        let last = if lease.ttl_ms > 0 {
            Duration::from_millis(lease.ttl_ms)
        } else {
            self.options.default_ttl
        };
        let ttl = ttl
            .unwrap_or(last)
            .min(self.options.max_ttl)
            .max(Duration::from_secs(1));
        let held = inner.leases.get_mut(id).expect("live above");
        held.lease.ttl_ms = ttl.as_millis() as u64;
        held.lease.expires_at_ms = now + held.lease.ttl_ms;
        let lease = held.lease.clone();
        inner.record(Change::Renewed {
            id: lease.id.clone(),
            expires_at_ms: lease.expires_at_ms,
            ttl_ms: lease.ttl_ms,
        });
        self.mark_dirty(inner);
        Ok((lease, entry))
    }

    /// Ends a lease (idempotent: an unknown or ended lease is already released).
    pub fn release(&self, id: &str) -> Result<(), LeaseError> {
        let mut inner = self.lock();
        if !inner.ready {
            return Err(LeaseError::NotReady);
        }
        if inner.leases.contains_key(id) {
            inner.end(id, EndReason::Released);
            self.mark_dirty(&mut inner);
        }
        Ok(())
    }

    /// Ends leases past their expiry and forgets old ended ids and cooldowns.
    pub fn expire(&self) {
        let now = now_ms();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let expired: Vec<String> = inner
            .leases
            .values()
            .filter(|h| h.lease.expires_at_ms <= now)
            .map(|h| h.lease.id.clone())
            .collect();
        for id in &expired {
            inner.end(id, EndReason::Expired);
        }
        let cooldowns = inner.cooldowns.len();
        inner.cooldowns.retain(|_, until_ms| *until_ms > now);
        let targets = inner.targets.expire(now);
        Self::expire_shared(inner, now);
        while inner
            .ended_order
            .front()
            .is_some_and(|(forget_at, _)| *forget_at <= now)
        {
            let (_, id) = inner.ended_order.pop_front().expect("checked above");
            inner.ended.remove(&id);
        }
        if !expired.is_empty() || cooldowns != inner.cooldowns.len() || targets {
            self.mark_dirty(inner);
        }
    }

    /// Per provisioned proxy: when its lease ends and how often it was reported blocked, for the
    /// pool controller. Empty until the table is restored (a standby knows nothing): a proxy
    /// missing here is unknown, not unleased.
    pub fn usage(&self) -> HashMap<ProxyKey, ProxyUsage> {
        let inner = self.lock();
        if !inner.ready {
            return HashMap::new();
        }
        inner
            .pool
            .keys()
            .map(|key| {
                let usage = ProxyUsage {
                    lease_expires_at_ms: inner
                        .leased
                        .get(key)
                        .map(|id| inner.leases[id].lease.expires_at_ms),
                    blocked_reports: inner.blocked_reports.get(key).copied().unwrap_or(0),
                };
                (key.clone(), usage)
            })
            .collect()
    }
}

impl Inner {
    /// The lease if it is live, with its series; an expired one is ended on the spot.
    pub(super) fn live(&mut self, id: &str, now: u64) -> Result<(Lease, Arc<Series>), LeaseError> {
        if !self.ready {
            return Err(LeaseError::NotReady);
        }
        match self.leases.get(id) {
            Some(held) if held.lease.expires_at_ms > now => {
                Ok((held.lease.clone(), held.series.clone()))
            }
            Some(_) => {
                self.end(id, EndReason::Expired);
                self.touch();
                Err(LeaseError::Ended(EndReason::Expired))
            }
            None => match self.ended.get(id) {
                Some((reason, _)) => Err(LeaseError::Ended(*reason)),
                None => Err(LeaseError::NotFound),
            },
        }
    }

    pub(super) fn end(&mut self, id: &str, reason: EndReason) {
        let Some(Held { lease, series }) = self.leases.remove(id) else {
            return;
        };
        // An expiry needs no line: a restore drops expired leases by itself.
        if reason != EndReason::Expired {
            self.record(Change::Ended(lease.id.clone()));
        }
        self.leased.remove(&lease.proxy);
        self.quotas.count(&lease.proxy, false);
        if self
            .pool
            .get(&lease.proxy)
            .is_some_and(|s| s.entry.leasable())
        {
            self.push_free(lease.proxy);
        }
        let id: Arc<str> = lease.id.into();
        self.ended.insert(id.clone(), (reason, lease.holder));
        self.ended_order
            .push_back((now_ms() + REMEMBER_ENDED.as_millis() as u64, id));
        if self.ended_order.len() > MAX_ENDED
            && let Some((_, oldest)) = self.ended_order.pop_front()
        {
            self.ended.remove(&oldest);
        }
        series.active.dec();
        series.ended[reason as usize].inc();
    }
}
