//! The lease table: which healthy proxy is handed to which crawler until when, which proxies
//! cool down after a block (for every target or for one), and which proxy each sticky session
//! last had. One mutex around plain maps: every operation is a few map lookups, so contention
//! stays far below what the HTTP layer costs (see docs/performance.md).
//!
//! The table's state is here; what is done with it is in the child modules, one part each:
//! `grants` (a lease from grant to end), `picking` (which proxy a grant gets, the free order),
//! `pools` (the provisioned proxies, the known pools), `persistence` (restore, changes, stored
//! versions), `series` (metric series), `sessions`, `targets` (per-target cooldowns), `report`
//! (what a report does to its proxy), `shared` (the gateway's use) and `views`.

mod grants;
pub(crate) mod keys;
mod options;
mod outcomes;
mod pending;
mod persistence;
mod picking;
mod pools;
mod quota_checks;
mod quotas;
mod reach;
pub(crate) mod records;
mod report;
mod requests;
mod series;
mod sessions;
pub(crate) mod shared;
mod shared_bytes;
mod shared_use;
mod targets;
mod views;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc, watch};

use super::journal::Change;
use super::metrics::{LeaseMetrics, Series, SeriesKey};
use pending::Stored;
use sessions::Sessions;
use targets::TargetCooldowns;

use keys::FastMap;
pub use keys::{PoolKey, ProxyKey};
pub use options::LeaseOptions;
pub use outcomes::{EndReason, Outcome};
pub use pending::{MAX_PENDING_CHANGES, NotStored, Pending};
pub use quotas::{NamespaceBounds, connection_fits, lease_fits};
pub use reach::Reach;
pub use records::{FirstBlock, Lease, Snapshot};
pub use requests::{
    Grant, GrantError, LeaseError, LeaseRequest, ProvisionedProxy, ProxyUsage, ProxyView,
};
pub use sessions::{MAX_SESSION_CHARS, MAX_SESSIONS, validate_session};
pub use shared_use::{NO_POOL, PoolGateway, PoolTraffic, REPLICA_SILENCE, SHARED_HOLD};
pub use targets::{
    CHECKPOINTED_TARGET_COOLDOWNS, MAX_TARGET_BYTES, MAX_TARGET_COOLDOWNS, MAX_TARGETS_PER_PROXY,
    normalize_target, persisted_target,
};

/// A provisioned proxy and what the table keeps beside it.
struct Slot {
    entry: Arc<ProvisionedProxy>,
    /// Its pool as a key, built once.
    pool: Option<PoolKey>,
    series: Arc<Series>,
}

/// A live lease and the metric series it counts in.
struct Held {
    lease: Lease,
    series: Arc<Series>,
}

#[derive(Default)]
struct Inner {
    /// False until the persisted state is restored: grants before that could double-lease.
    ready: bool,
    /// Changes of the hard state not yet taken by the writer, in order.
    journal: Vec<Change>,
    /// More than [`MAX_PENDING_CHANGES`] were recorded before the writer took them (the API
    /// server away for long, or no writer at all): the journal was dropped and the next write
    /// is a whole checkpoint instead, so memory stays bounded.
    journal_overflowed: bool,
    pool: FastMap<ProxyKey, Slot>,
    leases: FastMap<String, Held>,
    leased: FastMap<ProxyKey, String>,
    cooldowns: FastMap<ProxyKey, u64>,
    targets: TargetCooldowns,
    sessions: Sessions,
    blocked_reports: FastMap<ProxyKey, u32>,
    /// Pools the pool controller knows (every ProxyPool); kept across terms.
    known_pools: HashSet<PoolKey>,
    /// Pools named by provisioned proxies, with how many.
    pooled: FastMap<PoolKey, u32>,
    /// Provider instances of provisioned proxies (bounds the rejection labels).
    providers: HashSet<String>,
    /// Healthy, unleased proxies by the order they became free: granting the oldest spreads load.
    free: BTreeMap<u64, ProxyKey>,
    free_seq: FastMap<ProxyKey, u64>,
    /// The same order per pool (sequence numbers into `free`), so a pool's grant does not walk
    /// the other pools' free proxies.
    free_by_pool: FastMap<PoolKey, BTreeSet<u64>>,
    next_seq: u64,
    /// Ended ids: why, and whose (only its holder is told it ended).
    ended: FastMap<Arc<str>, (EndReason, Option<String>)>,
    /// Ended ids by when they are forgotten (oldest first), to forget without scanning.
    /// One allocation per ended id, shared with `ended`.
    ended_order: std::collections::VecDeque<(u64, Arc<str>)>,
    failures: FastMap<ProxyKey, u32>,
    /// Metric series by (pool label, provider); dropped when nothing uses them.
    series: HashMap<SeriesKey, Arc<Series>>,
    /// Rejection label sets naming a pool or provider, to drop when those go.
    rejected_labels: HashSet<(&'static str, String, String)>,
    dirty: bool,
    /// Counts changes: a grant waits until the version it made is stored. Survives `close`, so
    /// a version is never reused by a later term.
    version: u64,
    /// Since when writes of the table fail (none since the last success).
    failing_since: Option<std::time::Instant>,
    /// The gateway's shared use of proxies (soft state).
    shared: shared_use::SharedUse,
    /// The namespaces' ProxyQuota bounds and the leases they hold.
    quotas: quotas::Quotas,
}

impl Inner {
    fn touch(&mut self) {
        self.dirty = true;
        self.version += 1;
    }

    /// Records a change of the hard state for the writer (nothing before a restore: there is
    /// no table to change).
    fn record(&mut self, change: Change) {
        if !self.ready || self.journal_overflowed {
            return;
        }
        if self.journal.len() >= MAX_PENDING_CHANGES {
            self.journal = Vec::new();
            self.journal_overflowed = true;
            return;
        }
        self.journal.push(change);
    }

    fn empty(options: &LeaseOptions) -> Self {
        Inner {
            sessions: Sessions::with_capacity(options.max_sessions),
            targets: TargetCooldowns::with_bounds(
                options.max_target_cooldowns,
                options.max_targets_per_proxy,
            ),
            ..Inner::default()
        }
    }
}

/// The lease table. Cheap to share (`Arc`); all methods take `&self`.
pub struct LeaseStore {
    inner: Mutex<Inner>,
    options: LeaseOptions,
    metrics: LeaseMetrics,
    suspects: Mutex<Option<mpsc::Sender<ProxyKey>>>,
    blocked_pools: Mutex<Option<mpsc::Sender<PoolKey>>>,
    first_blocks: Mutex<Option<mpsc::Sender<FirstBlock>>>,
    stored: watch::Sender<Stored>,
    changed: Notify,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl LeaseStore {
    /// An empty store; `suspects` receives proxies whose crawlers keep reporting failures.
    pub fn new(
        options: LeaseOptions,
        metrics: LeaseMetrics,
        suspects: Option<mpsc::Sender<ProxyKey>>,
    ) -> Self {
        LeaseStore {
            inner: Mutex::new(Inner::empty(&options)),
            options,
            metrics,
            suspects: Mutex::new(suspects),
            blocked_pools: Mutex::new(None),
            first_blocks: Mutex::new(None),
            stored: watch::Sender::new(Stored::default()),
            changed: Notify::new(),
        }
    }

    /// A new channel for the proxies crawlers keep reporting failures on, replacing the last
    /// one (each leadership term runs its own health engine).
    pub fn suspects(&self) -> mpsc::Receiver<ProxyKey> {
        let (tx, rx) = mpsc::channel(256);
        *self.suspects.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    /// A new channel for the pools whose proxies crawlers report blocked, replacing the last one
    /// (the pool controller of each leadership term): a pool recycles without waiting for its
    /// next periodic look.
    pub fn blocked_pools(&self) -> mpsc::Receiver<PoolKey> {
        let (tx, rx) = mpsc::channel(256);
        *self.blocked_pools.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    pub fn options(&self) -> &LeaseOptions {
        &self.options
    }

    pub(crate) fn metrics(&self) -> &LeaseMetrics {
        &self.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps (no multi-step invariants are
        // broken half-way by a panicking line), so a poisoned lock is safe to keep using.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_dirty(&self, inner: &mut Inner) {
        inner.touch();
        self.changed.notify_one();
        self.update_gauges(inner);
    }
}

#[cfg(test)]
mod journal_tests;
#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod tests;
