//! What a report does to its proxy, the same for a lease's report and the gateway's.

use super::super::journal::Change;
use super::records::FirstBlock;
use super::targets::target_digest;
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
        target: Option<&str>,
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
                self.metrics.blocks.record(target, now);
                let count = match inner.blocked_reports.get_mut(proxy) {
                    Some(count) => {
                        *count = count.saturating_add(1);
                        *count
                    }
                    None => {
                        inner.blocked_reports.insert(proxy.clone(), 1);
                        self.tell_first_block(inner, proxy, now);
                        1
                    }
                };
                let target = target.map(target_digest);
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

impl LeaseStore {
    /// A new channel for proxies' first `blocked` reports, replacing the last one (each
    /// leadership term's usage meter).
    pub fn first_blocks(&self) -> tokio::sync::mpsc::Receiver<FirstBlock> {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        *self.first_blocks.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    fn tell_first_block(&self, inner: &Inner, proxy: &ProxyKey, at_ms: u64) {
        let Some(provider) = inner.pool.get(proxy).map(|s| s.entry.provider.clone()) else {
            return;
        };
        if let Some(tx) = &*self.first_blocks.lock().unwrap_or_else(|p| p.into_inner()) {
            // Full channel (thousands of first blocks at once): that observation is lost.
            let _ = tx.try_send(FirstBlock {
                proxy: proxy.clone(),
                provider,
                at_ms,
            });
        }
    }
}
