//! What a report does to its proxy, the same for a lease's report and the gateway's.

use super::super::journal::Change;
use super::sessions::Digest;
use super::{Inner, LeaseStore, Outcome, ProxyKey};

impl LeaseStore {
    /// What a report (a lease's or the gateway's) does to its proxy: `success` clears its
    /// failures, `failure` counts towards an early probe, `blocked` cools it down (for `target`
    /// only, unless the per-target bounds are reached) and wakes its pool.
    pub(super) fn apply_outcome(
        &self,
        inner: &mut Inner,
        proxy: &ProxyKey,
        outcome: Outcome,
        target: Option<Digest>,
        now: u64,
    ) {
        match outcome {
            Outcome::Success => {
                inner.failures.remove(proxy);
            }
            Outcome::Failure => {
                let count = inner.failures.entry(proxy.clone()).or_insert(0);
                *count += 1;
                if *count >= self.options.failure_threshold {
                    *count = 0;
                    if let Some(suspects) =
                        &*self.suspects.lock().unwrap_or_else(|p| p.into_inner())
                    {
                        // Full channel: a probe of it is already queued or running.
                        let _ = suspects.try_send(proxy.clone());
                    }
                }
            }
            Outcome::Blocked => {
                let count = match inner.blocked_reports.get_mut(proxy) {
                    Some(count) => {
                        *count = count.saturating_add(1);
                        *count
                    }
                    None => {
                        inner.blocked_reports.insert(proxy.clone(), 1);
                        1
                    }
                };
                inner.record(Change::Blocked(proxy.clone(), count));
                let until_ms = now + self.options.cooldown.as_millis() as u64;
                let scoped = target.is_some_and(|t| {
                    let inserted = inner.targets.insert(proxy, t, until_ms);
                    if inserted {
                        inner.record(Change::CooledDownFor(
                            proxy.clone(),
                            hex::encode(t),
                            until_ms,
                        ));
                    }
                    inserted
                });
                if !scoped {
                    inner.cooldowns.insert(proxy.clone(), until_ms);
                    inner.record(Change::CooledDown(proxy.clone(), until_ms));
                }
                self.mark_dirty(inner);
                let pool = inner.pool.get(proxy).and_then(|s| s.pool.clone());
                if let (Some(pool), Some(tx)) = (
                    pool,
                    &*self.blocked_pools.lock().unwrap_or_else(|p| p.into_inner()),
                ) {
                    // Full channel: the pool is already due for a look.
                    let _ = tx.try_send(pool);
                }
            }
        }
    }
}
