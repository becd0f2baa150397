//! The lease table: which healthy proxy is handed to which crawler until when, which proxies
//! cool down after a block (for every target or for one), and which proxy each sticky session
//! last had. One mutex around plain maps: every operation is a few map lookups, so contention
//! stays far below what the HTTP layer costs (see docs/performance.md).

pub(crate) mod keys;
mod options;
mod outcomes;
pub(crate) mod records;
mod report;
mod sessions;
pub(crate) mod shared;
mod shared_use;
mod targets;
mod views;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::{Notify, mpsc, watch};

use super::journal::Change;
use super::metrics::{ANY_PROVIDER, LeaseMetrics, NO_POOL, Series, UNKNOWN};
#[cfg(test)]
use sessions::digest;
use sessions::{Digest, Sessions, session_digest};
use targets::{TargetCooldowns, target_digest};

use keys::FastMap;
pub use keys::{PoolKey, ProxyKey};
pub use options::LeaseOptions;
pub use outcomes::{EndReason, Outcome};
pub use records::{Lease, Snapshot};
pub use sessions::{MAX_SESSION_CHARS, MAX_SESSIONS, validate_session};
pub use shared_use::PoolGateway;
pub use targets::{
    CHECKPOINTED_TARGET_COOLDOWNS, MAX_TARGET_BYTES, MAX_TARGET_COOLDOWNS, MAX_TARGETS_PER_PROXY,
    normalize_target,
};

/// The label a ProxyPool puts on the Proxies it makes; its value is the pool's name (the pool is
/// in the Proxy's namespace).
pub const POOL_LABEL: &str = "proxy-operator.dev/pool";
/// The annotation (`"true"`) the pool controller puts on a Proxy it is about to remove: no new
/// lease, session or renewal on it.
pub const DRAINING_ANNOTATION: &str = "proxy-operator.dev/draining";

/// A provisioned proxy as the health engine sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolEntry {
    pub key: ProxyKey,
    pub provider: String,
    pub zone: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub address: String,
    pub port: u16,
    /// Where the proxy's traffic leaves from, when the health engine learned it.
    pub exit_ip: Option<String>,
    /// Passing health probes (the only proxies ever granted).
    pub healthy: bool,
    /// The ProxyPool (in the proxy's namespace) that made it: its [`POOL_LABEL`].
    pub pool: Option<String>,
    /// About to be removed by its pool ([`DRAINING_ANNOTATION`]): no new grant, session or
    /// renewal; its leases run out.
    pub draining: bool,
    /// The credentials its squid requires (in a lease's `proxyUrl`); none for a proxy without.
    pub login: Option<crate::credentials::ProxyLogin>,
}

impl PoolEntry {
    fn leasable(&self) -> bool {
        self.healthy && !self.draining
    }
}

/// What a crawler asks for.
#[derive(Clone, Debug, Default)]
pub struct LeaseRequest {
    pub provider: Option<String>,
    pub zone: Option<String>,
    /// Every label must match.
    pub selector: BTreeMap<String, String>,
    /// A particular proxy.
    pub proxy: Option<ProxyKey>,
    /// Only proxies of this ProxyPool.
    pub pool: Option<PoolKey>,
    /// A sticky session: the proxy this key last had, while it is available (see
    /// [`validate_session`]).
    pub session: Option<String>,
    /// The host the crawler will visit: proxies cooling down for it are skipped (see
    /// [`normalize_target`]).
    pub target: Option<String>,
    pub ttl: Option<Duration>,
    /// Who the lease is granted to (a Kubernetes username; `None`: the static token).
    pub holder: Option<String>,
}

/// A grant's answer.
#[derive(Clone, Debug)]
pub struct Grant {
    pub lease: Lease,
    /// Shared with the table: cloned under its lock, it is only a reference count.
    pub entry: Arc<PoolEntry>,
    /// The session already held this lease, and it was handed out again: nothing new was
    /// granted (several workers of one session share one lease and one proxy).
    pub joined: bool,
}

/// Why a grant was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum GrantError {
    /// Nothing matching is available; try again after this long.
    NoProxy { retry_after: Duration },
    /// No provisioned proxy, in any state, matches the request: waiting does not help.
    NoMatch,
    /// The named pool is neither a ProxyPool nor named by any proxy.
    UnknownPool,
    /// The named proxy cools down after a block (for the request's target) until then.
    CoolingDown { retry_after: Duration },
    /// The named proxy is leased to someone else.
    Leased { retry_after: Duration },
    /// The named proxy is being removed by its pool.
    Draining,
    /// The named proxy is not provisioned (or does not exist).
    UnknownProxy,
    /// The store has not restored its state yet (just started, or not the leader).
    NotReady,
}

impl GrantError {
    pub fn reason(&self) -> &'static str {
        match self {
            GrantError::NoProxy { .. } => "no_proxy",
            GrantError::NoMatch => "no_match",
            GrantError::UnknownPool => "unknown_pool",
            GrantError::CoolingDown { .. } => "cooling_down",
            GrantError::Leased { .. } => "leased",
            GrantError::Draining => "draining",
            GrantError::UnknownProxy => "unknown_proxy",
            GrantError::NotReady => "not_ready",
        }
    }
}

/// Why a lease operation could not be applied.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseError {
    NotFound,
    Ended(EndReason),
    /// A renewal of a lease on a draining proxy.
    Draining,
    NotReady,
}

/// A proxy as `GET /v1/proxies` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    pub address: String,
    pub port: u16,
    pub exit_ip: Option<String>,
    /// `available`, `leased`, `coolingDown` or `unhealthy`.
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_until_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_ms: Option<u64>,
    /// `namespace/name` of its ProxyPool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub draining: bool,
    /// Carrying gateway traffic (not leased exclusively meanwhile): its open gateway
    /// connections, over every gateway replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_connections: Option<u32>,
}

/// How crawlers use one proxy, for the pool controller (drain, recycle).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyUsage {
    /// When its lease ends, while it is leased.
    pub lease_expires_at_ms: Option<u64>,
    /// `blocked` reports on it (with or without a target) since it was provisioned.
    pub blocked_reports: u32,
}

/// Changes held for the writer at most; past it the next write is a whole checkpoint.
pub const MAX_PENDING_CHANGES: usize = 100_000;

/// What the writer takes from the table: the changes since its last take, or — when they
/// overflowed [`MAX_PENDING_CHANGES`] — the word that only a whole checkpoint will do.
#[derive(Debug)]
pub struct Pending {
    pub changes: Vec<Change>,
    /// Write a checkpoint of the whole table (`changes` is empty).
    pub whole: bool,
    /// The version the cluster has once this is written.
    pub version: u64,
}

/// How long the id of an ended lease is remembered, so its holder gets 410 rather than 404.
const REMEMBER_ENDED: Duration = Duration::from_secs(3600);
/// At most this many ended ids are remembered (oldest forgotten first): at tens of thousands of
/// leases a second, an hour of ids would otherwise grow without bound.
const MAX_ENDED: usize = 65_536;
/// Retry-After when nothing is known to free up sooner.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);
/// Longest Retry-After of `no-proxy-available`.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A provisioned proxy and what the table keeps beside it.
struct Slot {
    entry: Arc<PoolEntry>,
    /// Its pool as a key, built once.
    pool: Option<PoolKey>,
    series: Arc<Series>,
}

/// A live lease and the metric series it counts in.
struct Held {
    lease: Lease,
    series: Arc<Series>,
}

/// What a grant asks for beyond the filters, hashed before the lock is taken.
struct Wanted {
    session: Option<Digest>,
    target: Option<Digest>,
}

enum Picked {
    New(ProxyKey),
    /// The session's own lease, by id.
    Joined(String),
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
    ended: FastMap<Arc<str>, EndReason>,
    /// Ended ids by when they are forgotten (oldest first), to forget without scanning.
    /// One allocation per ended id, shared with `ended`.
    ended_order: std::collections::VecDeque<(u64, Arc<str>)>,
    failures: FastMap<ProxyKey, u32>,
    /// Metric series by (pool label, provider); dropped when nothing uses them.
    series: HashMap<(String, String), Arc<Series>>,
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

/// How far the table has reached the cluster.
#[derive(Clone, Copy, Debug, Default)]
struct Stored {
    version: u64,
    /// False while closed (not the leader): a waiting grant gives up at once.
    open: bool,
}

/// Why a change was not confirmed as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStored {
    /// The store closed (leadership lost or shutdown) before the write.
    Closed,
    /// No write succeeded in time (the API server is unreachable or slow).
    TimedOut,
}

/// The lease table. Cheap to share (`Arc`); all methods take `&self`.
pub struct LeaseStore {
    inner: Mutex<Inner>,
    options: LeaseOptions,
    metrics: LeaseMetrics,
    suspects: Mutex<Option<mpsc::Sender<ProxyKey>>>,
    blocked_pools: Mutex<Option<mpsc::Sender<PoolKey>>>,
    stored: watch::Sender<Stored>,
    changed: Notify,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// 128 random bits from the thread-local CSPRNG (ChaCha, seeded and reseeded from the OS): an id
/// cannot be guessed, and a grant costs no system call.
fn new_lease_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

fn until(from_ms: u64, to_ms: u64) -> Duration {
    Duration::from_millis(to_ms.saturating_sub(from_ms)).max(Duration::from_secs(1))
}

fn min_into(soonest: &mut Option<u64>, at: u64) {
    *soonest = Some(soonest.map_or(at, |s| s.min(at)));
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
                let series = series_for(&mut inner.series, pool, provider, &self.metrics);
                series.active.inc();
                inner.leased.insert(lease.proxy.clone(), lease.id.clone());
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
        for (pool, provider) in inner.series.keys() {
            self.metrics.remove_series(pool, provider);
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
        *inner = Inner {
            version,
            known_pools,
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

    fn mark_dirty(&self, inner: &mut Inner) {
        inner.touch();
        self.changed.notify_one();
        self.update_gauges(inner);
    }

    fn update_gauges(&self, inner: &Inner) {
        self.metrics.cooling_down.set(inner.cooldowns.len() as i64);
        self.metrics
            .target_cooldowns
            .set(inner.targets.len() as i64);
        self.metrics.sessions.set(inner.sessions.len() as i64);
    }

    /// Sets the pools that exist (every ProxyPool, from the pool controller). A pool is known if
    /// it is here or a provisioned proxy names it; a grant naming any other is `UnknownPool`.
    pub fn set_known_pools<I>(&self, pools: I)
    where
        I: IntoIterator,
        I::Item: Into<PoolKey>,
    {
        let mut inner = self.lock();
        inner.known_pools = pools.into_iter().map(Into::into).collect();
        self.prune_rejected(&mut inner);
    }

    /// Adds one pool to the known ones at once (the pool controller, as it first sees a pool), so
    /// a new pool is not `unknown-pool` until the next [`Self::set_known_pools`].
    pub fn add_known_pool(&self, pool: PoolKey) {
        self.lock().known_pools.insert(pool);
    }

    /// Replaces the set of provisioned proxies. Leases on proxies that are gone or unhealthy end.
    pub fn set_pool(&self, entries: Vec<PoolEntry>) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut pool = FastMap::default();
        let mut pooled: FastMap<PoolKey, u32> = FastMap::default();
        let mut providers = HashSet::new();
        for entry in entries {
            let pool_key = entry.pool.as_ref().map(|name| PoolKey {
                namespace: entry.key.namespace.clone(),
                name: name.as_str().into(),
            });
            let label = pool_key
                .as_ref()
                .map_or_else(|| NO_POOL.to_string(), |k| k.to_string());
            let series = series_for(&mut inner.series, label, &entry.provider, &self.metrics);
            if let Some(key) = &pool_key {
                *pooled.entry(key.clone()).or_default() += 1;
            }
            if !providers.contains(&entry.provider) {
                providers.insert(entry.provider.clone());
            }
            pool.insert(
                entry.key.clone(),
                Slot {
                    entry: Arc::new(entry),
                    pool: pool_key,
                    series,
                },
            );
        }
        let removed_any = inner.pool.keys().any(|k| !pool.contains_key(k));
        // The old slots go first: what they alone held is unused below.
        drop(std::mem::replace(&mut inner.pool, pool));
        inner.pooled = pooled;
        inner.providers = providers;

        let ended: Vec<(String, EndReason)> = inner
            .leases
            .iter()
            .filter_map(|(id, held)| match inner.pool.get(&held.lease.proxy) {
                None => Some((id.clone(), EndReason::Deleted)),
                Some(slot) if !slot.entry.healthy => Some((id.clone(), EndReason::Unhealthy)),
                Some(_) => None,
            })
            .collect();
        let mut changed = !ended.is_empty();
        for (id, reason) in ended {
            inner.end(&id, reason);
        }
        let stale: Vec<ProxyKey> = inner
            .free_seq
            .keys()
            .filter(|k| !inner.pool.get(*k).is_some_and(|s| s.entry.leasable()))
            .cloned()
            .collect();
        for key in stale {
            inner.remove_free(&key);
        }
        let fresh: Vec<ProxyKey> = inner
            .pool
            .iter()
            .filter(|(k, s)| {
                s.entry.leasable()
                    && !inner.leased.contains_key(*k)
                    && !inner.free_seq.contains_key(*k)
                    && !inner.shared.is_in_use(k)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in fresh {
            inner.push_free(key);
        }
        inner.rebuild_free_by_pool();

        changed |= inner.forget_gone_proxies(removed_any);

        inner.series.retain(|(pool, provider), series| {
            let used = Arc::strong_count(series) > 1;
            if !used {
                self.metrics.remove_series(pool, provider);
            }
            used
        });
        self.prune_rejected(inner);
        if changed {
            self.mark_dirty(inner);
        }
    }

    /// Drops the rejection series of pools and providers that are gone.
    fn prune_rejected(&self, inner: &mut Inner) {
        let Inner {
            rejected_labels,
            known_pools,
            pooled,
            providers,
            ..
        } = inner;
        rejected_labels.retain(|(reason, pool, provider)| {
            let pool_ok = pool == NO_POOL
                || pool == UNKNOWN
                || ProxyKey::parse(pool)
                    .is_some_and(|k| known_pools.contains(&k) || pooled.contains_key(&k));
            let provider_ok =
                provider == ANY_PROVIDER || provider == UNKNOWN || providers.contains(provider);
            if !(pool_ok && provider_ok) {
                let _ = self.metrics.rejected.remove_label_values(&[
                    *reason,
                    pool.as_str(),
                    provider.as_str(),
                ]);
            }
            pool_ok && provider_ok
        });
    }

    /// Grants a lease on a healthy proxy that is neither leased nor cooling down (nor draining).
    pub fn grant(&self, request: &LeaseRequest) -> Result<(Lease, PoolEntry), GrantError> {
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
        let wanted = Wanted {
            // Per holder: two crawlers choosing the same key do not share a proxy.
            session: request
                .session
                .as_deref()
                .map(|s| session_digest(request.holder.as_deref(), s)),
            target: request.target.as_deref().map(target_digest),
        };
        let ttl_ms = ttl.as_millis() as u64;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let key = match pick(inner, request, &wanted, now) {
            Ok(Picked::New(key)) => key,
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

    /// Counts a refusal, labelled by what was asked for: a pool or provider the table does not
    /// know is `unknown`, so requests cannot make new series.
    fn reject(&self, inner: &mut Inner, request: &LeaseRequest, error: &GrantError) {
        let pool = match &request.pool {
            None => NO_POOL.to_string(),
            Some(p) if inner.is_known(p) => p.to_string(),
            Some(_) => UNKNOWN.to_string(),
        };
        let provider = match &request.provider {
            None => ANY_PROVIDER,
            Some(p) if inner.providers.contains(p) => p.as_str(),
            Some(_) => UNKNOWN,
        };
        let reason = error.reason();
        self.metrics
            .rejected
            .with_label_values(&[reason, pool.as_str(), provider])
            .inc();
        if pool != NO_POOL || provider != ANY_PROVIDER {
            let labels = (reason, pool, provider.to_string());
            if !inner.rejected_labels.contains(&labels) {
                inner.rejected_labels.insert(labels);
            }
        }
    }

    /// Applies a crawler's report. `blocked` ends the lease and cools the proxy down.
    pub fn report(&self, id: &str, outcome: Outcome) -> Result<Lease, LeaseError> {
        self.report_for(id, outcome, None)
    }

    /// Applies a crawler's report; a `blocked` one naming a `target` (normalized, see
    /// [`normalize_target`]) cools the proxy down for that target only, unless a bound on
    /// per-target cooldowns is reached (then for every target).
    pub fn report_for(
        &self,
        id: &str,
        outcome: Outcome,
        target: Option<&str>,
    ) -> Result<Lease, LeaseError> {
        let now = now_ms();
        let target = target.map(target_digest);
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

    /// The holder of a live lease (`Some(None)`: the static token); `None` when there is no
    /// such live lease.
    pub fn holder(&self, id: &str) -> Option<Option<String>> {
        self.lock()
            .leases
            .get(id)
            .map(|held| held.lease.holder.clone())
    }

    /// A live lease and its proxy.
    pub fn lease(&self, id: &str) -> Result<(Lease, Arc<PoolEntry>), LeaseError> {
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
    ) -> Result<(Lease, Arc<PoolEntry>), LeaseError> {
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

/// The series of a pool label and provider, made once.
fn series_for(
    cache: &mut HashMap<(String, String), Arc<Series>>,
    pool: String,
    provider: &str,
    metrics: &LeaseMetrics,
) -> Arc<Series> {
    cache
        .entry((pool, provider.to_string()))
        .or_insert_with_key(|(pool, provider)| Arc::new(metrics.series(pool, provider)))
        .clone()
}

/// Whether `slot`'s proxy is one the request's filters (not its target) allow.
fn matches(slot: &Slot, request: &LeaseRequest) -> bool {
    let entry = &slot.entry;
    request
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
enum Fit {
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
fn fit_matching(inner: &Inner, key: &ProxyKey, wanted: &Wanted, now: u64) -> Fit {
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
fn pick(
    inner: &mut Inner,
    request: &LeaseRequest,
    wanted: &Wanted,
    now: u64,
) -> Result<Picked, GrantError> {
    if !inner.ready {
        return Err(GrantError::NotReady);
    }
    if let Some(pool) = &request.pool
        && !inner.is_known(pool)
    {
        return Err(GrantError::UnknownPool);
    }
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
            // Only the same holder joins: a session key is no credential. Leased to another
            // session, the session moves on.
            if lease.session.as_deref() == request.session.as_deref()
                && lease.holder == request.holder
            {
                return Ok(Picked::Joined(id.clone()));
            }
        }
    }
    let mut soonest: Option<u64> = None;
    let mut cooling = Vec::new();
    let mut found = None;
    for (seq, key) in free_in_scope(inner, request.pool.as_ref()) {
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

/// The free proxies of `pool` (or of every pool) by their place in the free order, longest
/// free first, with their sequence numbers.
fn free_in_scope<'a>(
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

fn pick_named(
    inner: &Inner,
    key: &ProxyKey,
    request: &LeaseRequest,
    wanted: &Wanted,
    now: u64,
) -> Result<Picked, GrantError> {
    let Some(slot) = inner.pool.get(key) else {
        return Err(GrantError::UnknownProxy);
    };
    if slot.entry.draining {
        return Err(GrantError::Draining);
    }
    if inner.shared.is_in_use(key) {
        // Carrying gateway traffic: not exclusive until that ends.
        return Err(GrantError::Leased {
            retry_after: shared_use::SHARED_HOLD,
        });
    }
    if let Some(id) = inner.leased.get(key) {
        let lease = &inner.leases[id].lease;
        if request.session.is_some() && lease.session.as_deref() == request.session.as_deref() {
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

/// The refusal when no matching proxy is free: `NoMatch` when no provisioned proxy could ever
/// match, else `NoProxy` with the earliest end of a matching lease or cooldown (`soonest`, from
/// the scan). A pool or a cluster with no proxies yet may grow, so that is `NoProxy` too.
fn nothing_free(
    inner: &Inner,
    request: &LeaseRequest,
    mut soonest: Option<u64>,
    now: u64,
) -> GrantError {
    let in_scope = match &request.pool {
        Some(pool) => inner.pooled.get(pool).copied().unwrap_or(0) as usize,
        None => inner.pool.len(),
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
    /// What the table keeps about proxies that are gone goes with them; whether anything did.
    /// At a million sessions or cooldowns their pass costs milliseconds under the lock: only
    /// when a proxy went (`removed_any`).
    fn forget_gone_proxies(&mut self, removed_any: bool) -> bool {
        let before = (self.cooldowns.len(), self.blocked_reports.len());
        let pool = &self.pool;
        self.cooldowns.retain(|k, _| pool.contains_key(k));
        self.failures.retain(|k, _| pool.contains_key(k));
        self.blocked_reports.retain(|k, _| pool.contains_key(k));
        let mut changed = before != (self.cooldowns.len(), self.blocked_reports.len());
        if removed_any {
            changed |= self.targets.retain_proxies(|k| pool.contains_key(k));
            changed |= self.sessions.retain_proxies(|k| pool.contains_key(k));
        }
        changed
    }
}

impl Inner {
    fn is_known(&self, pool: &PoolKey) -> bool {
        self.pooled.contains_key(pool) || self.known_pools.contains(pool)
    }

    fn push_free(&mut self, key: ProxyKey) {
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

    fn remove_free(&mut self, key: &ProxyKey) {
        let pool = self.pool.get(key).and_then(|s| s.pool.clone());
        self.remove_free_of_pool(key, pool.as_ref());
    }

    /// [`Self::remove_free`] with the proxy's pool already at hand (one lookup fewer).
    fn remove_free_of_pool(&mut self, key: &ProxyKey, pool: Option<&PoolKey>) {
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
    fn rebuild_free_by_pool(&mut self) {
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

    /// The lease if it is live, with its series; an expired one is ended on the spot.
    fn live(&mut self, id: &str, now: u64) -> Result<(Lease, Arc<Series>), LeaseError> {
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
                Some(reason) => Err(LeaseError::Ended(*reason)),
                None => Err(LeaseError::NotFound),
            },
        }
    }

    fn end(&mut self, id: &str, reason: EndReason) {
        let Some(Held { lease, series }) = self.leases.remove(id) else {
            return;
        };
        // An expiry needs no line: a restore drops expired leases by itself.
        if reason != EndReason::Expired {
            self.record(Change::Ended(lease.id.clone()));
        }
        self.leased.remove(&lease.proxy);
        if self
            .pool
            .get(&lease.proxy)
            .is_some_and(|s| s.entry.leasable())
        {
            self.push_free(lease.proxy);
        }
        let id: Arc<str> = lease.id.into();
        self.ended.insert(id.clone(), reason);
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

#[cfg(test)]
mod journal_tests;
#[cfg(test)]
mod tests;
