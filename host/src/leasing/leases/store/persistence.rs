//! The table's side of persistence (the writer is `leases/persist.rs`): a restore opens it for
//! grants, a close ends a term; the writer takes the changes or a checkpoint and confirms each
//! version stored, which a grant waits for.

use std::collections::BTreeMap;
use std::time::Duration;

use super::pending::{MAX_PENDING_CHANGES, Pending, Stored};
use super::series::series_for;
use super::sessions::session_digest;
use super::{
    CHECKPOINTED_TARGET_COOLDOWNS, Held, Inner, Lease, LeaseStore, NotStored, ProxyKey, Snapshot,
    now_ms,
};
use crate::leasing::leases::metrics::{NO_POOL, SeriesKey, UNKNOWN};

impl LeaseStore {
    /// Loads persisted leases, cooldowns, sessions and block counts, and opens the store for
    /// grants.
    pub fn restore(&self, snapshot: Snapshot) {
        let now = now_ms();
        let mut inner = self.lock();
        let inner = &mut *inner;
        for lease in snapshot.leases {
            if lease.expires_at_ms > now {
                let pool = lease
                    .pool_key()
                    .map_or_else(|| NO_POOL.to_string(), |k| k.to_string());
                let provider = if lease.provider.is_empty() {
                    UNKNOWN
                } else {
                    &lease.provider
                };
                let key = SeriesKey::new(&lease.proxy.namespace, pool, provider);
                let series = series_for(&mut inner.series, key, &self.metrics);
                series.active.inc();
                inner.leased.insert(lease.proxy.clone(), lease.id.clone());
                inner.quotas.count(&lease.proxy, true);
                inner
                    .leases
                    .insert(lease.id.clone(), Held { lease, series });
            }
        }
        // Sessions live in memory only: those of the restored leases are bound again (oldest
        // grant first, so the most recent is the most recently used).
        let mut with_session: Vec<&Lease> = inner
            .leases
            .values()
            .map(|h| &h.lease)
            .filter(|l| l.session.is_some())
            .collect();
        with_session.sort_by_key(|l| l.granted_at_ms);
        for lease in with_session {
            if let Some(session) = &lease.session {
                let digest = session_digest(lease.holder.as_deref(), session);
                inner.sessions.bind(digest, &lease.proxy);
            }
        }
        for (key, until_ms) in snapshot.cooldowns {
            if let (Some(key), true) = (ProxyKey::parse(&key), until_ms > now) {
                inner.cooldowns.insert(key, until_ms);
            }
        }
        inner.targets.restore(snapshot.target_cooldowns, now);
        inner.sessions.restore(snapshot.sessions);
        for (key, count) in snapshot.blocked_reports {
            if let Some(key) = ProxyKey::parse(&key) {
                inner.blocked_reports.insert(key, count);
            }
        }
        let keys: Vec<ProxyKey> = inner.leased.keys().cloned().collect();
        for key in keys {
            inner.remove_free(&key);
        }
        inner.ready = true;
        inner.dirty = false;
        inner.journal.clear();
        inner.journal_overflowed = false;
        // What was just read is what the cluster has.
        let version = inner.version;
        self.stored.send_replace(Stored {
            version,
            open: true,
        });
        self.update_gauges(inner);
    }

    /// Closes the store (no longer the leader): requests get 503 until the next restore, and
    /// grants waiting for their write give up.
    pub fn close(&self) {
        let mut inner = self.lock();
        for key in inner.series.keys() {
            self.metrics.remove_series(key);
        }
        for (reason, pool, provider) in &inner.rejected_labels {
            let _ = self.metrics.rejected.remove_label_values(&[
                *reason,
                pool.as_str(),
                provider.as_str(),
            ]);
        }
        let version = inner.version;
        let known_pools = std::mem::take(&mut inner.known_pools);
        // The quotas' bounds stay, as the known pools do; the counts go with the leases.
        let bounds = std::mem::take(&mut inner.quotas.bounds);
        *inner = Inner {
            version,
            known_pools,
            quotas: super::quotas::Quotas {
                bounds,
                ..Default::default()
            },
            ..Inner::empty(&self.options)
        };
        self.stored.send_modify(|s| s.open = false);
        self.update_gauges(&inner);
    }

    pub fn is_ready(&self) -> bool {
        self.lock().ready
    }

    /// The hard state as a checkpoint holds it: leases, cooldowns, block counts and the
    /// per-target cooldowns ending last (at most [`CHECKPOINTED_TARGET_COOLDOWNS`]). Sessions
    /// are not in it (see [`Snapshot`]). None before a restore.
    pub fn snapshot(&self) -> Option<Snapshot> {
        let inner = self.lock();
        if !inner.ready {
            return None;
        }
        Some(Snapshot {
            leases: inner.leases.values().map(|h| h.lease.clone()).collect(),
            cooldowns: inner
                .cooldowns
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            target_cooldowns: inner.targets.to_snapshot(CHECKPOINTED_TARGET_COOLDOWNS),
            sessions: BTreeMap::new(),
            blocked_reports: inner
                .blocked_reports
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        })
    }

    /// The changes recorded since the last call, in order, and the version they bring the
    /// cluster to once written; clears the dirty flag. None before a restore.
    pub fn take_changes(&self) -> Option<Pending> {
        let mut inner = self.lock();
        if !inner.ready {
            return None;
        }
        inner.dirty = false;
        let whole = std::mem::take(&mut inner.journal_overflowed);
        let changes = std::mem::take(&mut inner.journal);
        Some(Pending {
            changes,
            whole,
            version: inner.version,
        })
    }

    /// What [`Self::take_changes`] gave that was not written: it goes back in front of whatever
    /// was recorded since, to be written first.
    pub fn requeue_changes(&self, pending: Pending) {
        let mut inner = self.lock();
        inner.dirty = true;
        inner
            .failing_since
            .get_or_insert_with(std::time::Instant::now);
        if !inner.ready {
            // Closed meanwhile: the next term restores from the cluster.
            return;
        }
        if pending.whole || inner.journal_overflowed {
            inner.journal = Vec::new();
            inner.journal_overflowed = true;
            return;
        }
        let mut changes = pending.changes;
        changes.append(&mut inner.journal);
        if changes.len() > MAX_PENDING_CHANGES {
            inner.journal = Vec::new();
            inner.journal_overflowed = true;
        } else {
            inner.journal = changes;
        }
    }

    /// The version of the latest change.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// `version` (and every change before it) is in the cluster.
    pub fn mark_stored(&self, version: u64) {
        self.lock().failing_since = None;
        self.stored
            .send_modify(|s| s.version = s.version.max(version));
    }

    /// Waits until the table holding `version` is stored.
    pub async fn wait_stored(&self, version: u64, timeout: Duration) -> Result<(), NotStored> {
        let mut stored = self.stored.subscribe();
        let reached = stored.wait_for(|s| !s.open || s.version >= version);
        match tokio::time::timeout(timeout, reached).await {
            Ok(Ok(s)) if s.version >= version => Ok(()),
            Ok(_) => Err(NotStored::Closed),
            Err(_) => Err(NotStored::TimedOut),
        }
    }

    /// Returns when a change was made since the last call (at once if one is pending).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub fn is_dirty(&self) -> bool {
        self.lock().dirty
    }

    /// How long writes of the table have been failing, if they are.
    pub fn unstored_for(&self) -> Option<Duration> {
        self.lock().failing_since.map(|since| since.elapsed())
    }
}
