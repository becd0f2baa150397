//! The lease table: which healthy proxy is handed to which crawler until when, and which proxies
//! cool down after a block. One mutex around plain maps: every operation is a few map lookups, so
//! contention stays far below what the HTTP layer costs (see docs/performance.md).

mod options;
mod outcomes;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, watch};

use super::metrics::LeaseMetrics;

pub use options::LeaseOptions;
pub use outcomes::{EndReason, Outcome};

/// A Proxy, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProxyKey {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ProxyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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
    pub ttl: Option<Duration>,
    /// Only proxies of this ProxyPool (its namespace, and the label [`POOL_LABEL`]).
    pub pool: Option<ProxyKey>,
    /// Who the lease is granted to (a Kubernetes username; `None`: the static token).
    pub holder: Option<String>,
}

/// The label that makes a Proxy part of a ProxyPool of its namespace.
pub const POOL_LABEL: &str = "proxy-operator.dev/pool";

/// A granted lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub id: String,
    pub proxy: ProxyKey,
    pub granted_at_ms: u64,
    pub expires_at_ms: u64,
    /// Who it was granted to; only they may use it (`None`: the static token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// Why a grant was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum GrantError {
    /// Nothing matching is available; try again after this long.
    NoProxy { retry_after: Duration },
    /// The named proxy cools down after a block until then.
    CoolingDown { retry_after: Duration },
    /// The named proxy is leased to someone else.
    Leased { retry_after: Duration },
    /// The named proxy is not provisioned (or does not exist).
    UnknownProxy,
    /// The store has not restored its state yet (just started, or not the leader).
    NotReady,
}

impl GrantError {
    pub fn reason(&self) -> &'static str {
        match self {
            GrantError::NoProxy { .. } => "no_proxy",
            GrantError::CoolingDown { .. } => "cooling_down",
            GrantError::Leased { .. } => "leased",
            GrantError::UnknownProxy => "unknown_proxy",
            GrantError::NotReady => "not_ready",
        }
    }
}

/// Why a report or release could not be applied.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseError {
    NotFound,
    Ended(EndReason),
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
}

/// What outlives a restart.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub leases: Vec<Lease>,
    pub cooldowns: BTreeMap<String, u64>,
}

/// How long the id of an ended lease is remembered, so its holder gets 410 rather than 404.
const REMEMBER_ENDED: Duration = Duration::from_secs(3600);
/// At most this many ended ids are remembered (oldest forgotten first): at tens of thousands of
/// leases a second, an hour of ids would otherwise grow without bound.
const MAX_ENDED: usize = 65_536;
/// Retry-After when nothing is known to free up sooner.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The table's maps hash with foldhash: several times faster than SipHash on these short keys, and
/// still randomly seeded. Their keys are ids the store made and Proxies from the cluster.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Inner {
    /// False until the persisted state is restored: grants before that could double-lease.
    ready: bool,
    pool: FastMap<ProxyKey, PoolEntry>,
    leases: FastMap<String, Lease>,
    leased: FastMap<ProxyKey, String>,
    cooldowns: FastMap<ProxyKey, u64>,
    /// Healthy, unleased proxies by the order they became free: granting the oldest spreads load.
    free: BTreeMap<u64, ProxyKey>,
    free_seq: FastMap<ProxyKey, u64>,
    next_seq: u64,
    ended: FastMap<Arc<str>, EndReason>,
    /// Ended ids by when they are forgotten (oldest first), to forget without scanning.
    /// One allocation per ended id, shared with `ended`.
    ended_order: std::collections::VecDeque<(u64, Arc<str>)>,
    failures: FastMap<ProxyKey, u32>,
    dirty: bool,
    /// Counts changes: a grant waits until the version it made is stored. Survives `close`, so
    /// a version is never reused by a later term.
    version: u64,
    /// Since when writes of the table fail (none since the last success).
    failing_since: Option<std::time::Instant>,
}

impl Inner {
    fn touch(&mut self) {
        self.dirty = true;
        self.version += 1;
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

impl LeaseStore {
    /// An empty store; `suspects` receives proxies whose crawlers keep reporting failures.
    pub fn new(
        options: LeaseOptions,
        metrics: LeaseMetrics,
        suspects: Option<mpsc::Sender<ProxyKey>>,
    ) -> Self {
        LeaseStore {
            inner: Mutex::new(Inner::default()),
            options,
            metrics,
            suspects: Mutex::new(suspects),
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

    pub fn options(&self) -> &LeaseOptions {
        &self.options
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent maps (no multi-step invariants are
        // broken half-way by a panicking line), so a poisoned lock is safe to keep using.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Loads persisted leases and cooldowns, and opens the store for grants.
    pub fn restore(&self, snapshot: Snapshot) {
        let now = now_ms();
        let mut inner = self.lock();
        for lease in snapshot.leases {
            if lease.expires_at_ms > now {
                inner.leased.insert(lease.proxy.clone(), lease.id.clone());
                inner.leases.insert(lease.id.clone(), lease);
            }
        }
        for (key, until_ms) in snapshot.cooldowns {
            if let (Some((namespace, name)), true) = (key.split_once('/'), until_ms > now) {
                let key = ProxyKey {
                    namespace: namespace.into(),
                    name: name.into(),
                };
                inner.cooldowns.insert(key, until_ms);
            }
        }
        let keys: Vec<ProxyKey> = inner.leased.keys().cloned().collect();
        for key in keys {
            inner.remove_free(&key);
        }
        inner.ready = true;
        inner.dirty = false;
        // What was just read is what the cluster has.
        let version = inner.version;
        self.stored.send_replace(Stored {
            version,
            open: true,
        });
        self.update_gauges(&inner);
    }

    /// Closes the store (no longer the leader): requests get 503 until the next restore, and
    /// grants waiting for their write give up.
    pub fn close(&self) {
        let mut inner = self.lock();
        let version = inner.version;
        *inner = Inner {
            version,
            ..Inner::default()
        };
        self.stored.send_modify(|s| s.open = false);
        self.update_gauges(&inner);
    }

    pub fn is_ready(&self) -> bool {
        self.lock().ready
    }

    /// What to persist; clears the dirty flag.
    pub fn snapshot(&self) -> Option<Snapshot> {
        self.snapshot_versioned().map(|(snapshot, _)| snapshot)
    }

    /// What to persist and the version it holds; clears the dirty flag.
    pub fn snapshot_versioned(&self) -> Option<(Snapshot, u64)> {
        let mut inner = self.lock();
        if !inner.ready {
            return None;
        }
        inner.dirty = false;
        let snapshot = Snapshot {
            leases: inner.leases.values().cloned().collect(),
            cooldowns: inner
                .cooldowns
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        };
        Some((snapshot, inner.version))
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

    /// The snapshot taken was not written: keep it due.
    pub fn mark_dirty_after_failed_write(&self) {
        let mut inner = self.lock();
        inner.dirty = true;
        inner
            .failing_since
            .get_or_insert_with(std::time::Instant::now);
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
        self.metrics.active.set(inner.leases.len() as i64);
        self.metrics.cooling_down.set(inner.cooldowns.len() as i64);
    }

    /// Replaces the set of provisioned proxies. Leases on proxies that are gone or unhealthy end.
    pub fn set_pool(&self, entries: Vec<PoolEntry>) {
        let mut inner = self.lock();
        let pool: HashMap<ProxyKey, PoolEntry> =
            entries.into_iter().map(|e| (e.key.clone(), e)).collect();
        let mut ended = Vec::new();
        for (id, lease) in &inner.leases {
            match pool.get(&lease.proxy) {
                None => ended.push((id.clone(), EndReason::Deleted)),
                Some(entry) if !entry.healthy => ended.push((id.clone(), EndReason::Unhealthy)),
                Some(_) => {}
            }
        }
        let changed = !ended.is_empty();
        for (id, reason) in ended {
            inner.end(&id, reason, &self.metrics);
        }
        let stale: Vec<ProxyKey> = inner
            .free_seq
            .keys()
            .filter(|k| !pool.get(*k).is_some_and(|e| e.healthy))
            .cloned()
            .collect();
        for key in stale {
            inner.remove_free(&key);
        }
        let before = inner.cooldowns.len();
        inner.cooldowns.retain(|k, _| pool.contains_key(k));
        inner.failures.retain(|k, _| pool.contains_key(k));
        for (key, entry) in &pool {
            if entry.healthy && !inner.leased.contains_key(key) && !inner.free_seq.contains_key(key)
            {
                inner.push_free(key.clone());
            }
        }
        inner.pool = pool.into_iter().collect();
        if changed || before != inner.cooldowns.len() {
            self.mark_dirty(&mut inner);
        }
    }

    /// Grants a lease on a healthy proxy that is neither leased nor cooling down.
    pub fn grant(&self, request: &LeaseRequest) -> Result<(Lease, PoolEntry), GrantError> {
        let now = now_ms();
        let ttl = request
            .ttl
            .unwrap_or(self.options.default_ttl)
            .min(self.options.max_ttl)
            .max(Duration::from_secs(1));
        let mut inner = self.lock();
        let result = self.pick(&mut inner, request, now);
        let key = match result {
            Ok(key) => key,
            Err(e) => {
                self.metrics.rejected.with_label_values(&[e.reason()]).inc();
                return Err(e);
            }
        };
        let lease = Lease {
            id: new_lease_id(),
            proxy: key.clone(),
            granted_at_ms: now,
            expires_at_ms: now + ttl.as_millis() as u64,
            holder: request.holder.clone(),
        };
        inner.remove_free(&key);
        inner.leased.insert(key.clone(), lease.id.clone());
        inner.leases.insert(lease.id.clone(), lease.clone());
        let entry = inner.pool[&key].clone();
        self.metrics.granted.inc();
        self.mark_dirty(&mut inner);
        Ok((lease, entry))
    }

    fn pick(
        &self,
        inner: &mut Inner,
        request: &LeaseRequest,
        now: u64,
    ) -> Result<ProxyKey, GrantError> {
        if !inner.ready {
            return Err(GrantError::NotReady);
        }
        if let Some(key) = &request.proxy {
            let Some(entry) = inner.pool.get(key) else {
                return Err(GrantError::UnknownProxy);
            };
            if let Some(&until_ms) = inner.cooldowns.get(key).filter(|u| **u > now) {
                return Err(GrantError::CoolingDown {
                    retry_after: until(now, until_ms),
                });
            }
            if let Some(id) = inner.leased.get(key) {
                return Err(GrantError::Leased {
                    retry_after: until(now, inner.leases[id].expires_at_ms),
                });
            }
            if !entry.healthy || !matches(entry, request) {
                return Err(GrantError::NoProxy {
                    retry_after: DEFAULT_RETRY_AFTER,
                });
            }
            return Ok(key.clone());
        }
        let mut soonest: Option<u64> = None;
        let mut expired_cooldowns = Vec::new();
        let mut found = None;
        for key in inner.free.values() {
            let entry = &inner.pool[key];
            if !matches(entry, request) {
                continue;
            }
            match inner.cooldowns.get(key) {
                Some(&until_ms) if until_ms > now => {
                    soonest = Some(soonest.map_or(until_ms, |s| s.min(until_ms)));
                }
                Some(_) => {
                    expired_cooldowns.push(key.clone());
                    found = Some(key.clone());
                    break;
                }
                None => {
                    found = Some(key.clone());
                    break;
                }
            }
        }
        for key in expired_cooldowns {
            inner.cooldowns.remove(&key);
        }
        if let Some(key) = found {
            return Ok(key);
        }
        // Nothing free: the earliest of a matching lease's expiry or a cooldown's end.
        for lease in inner.leases.values() {
            if inner
                .pool
                .get(&lease.proxy)
                .is_some_and(|e| e.healthy && matches(e, request))
            {
                soonest = Some(soonest.map_or(lease.expires_at_ms, |s| s.min(lease.expires_at_ms)));
            }
        }
        Err(GrantError::NoProxy {
            retry_after: soonest
                .map(|s| until(now, s).min(Duration::from_secs(60)))
                .unwrap_or(DEFAULT_RETRY_AFTER),
        })
    }

    /// Applies a crawler's report. `blocked` ends the lease and cools the proxy down.
    pub fn report(&self, id: &str, outcome: Outcome) -> Result<Lease, LeaseError> {
        let now = now_ms();
        let mut inner = self.lock();
        let lease = inner.live(id, now, &self.metrics)?;
        self.metrics.reports_by_outcome[outcome as usize].inc();
        match outcome {
            Outcome::Success => {
                inner.failures.remove(&lease.proxy);
            }
            Outcome::Failure => {
                let count = inner.failures.entry(lease.proxy.clone()).or_insert(0);
                *count += 1;
                if *count >= self.options.failure_threshold {
                    *count = 0;
                    if let Some(suspects) =
                        &*self.suspects.lock().unwrap_or_else(|p| p.into_inner())
                    {
                        // Full channel: a probe of it is already queued or running.
                        let _ = suspects.try_send(lease.proxy.clone());
                    }
                }
            }
            Outcome::Blocked => {
                let until_ms = now + self.options.cooldown.as_millis() as u64;
                inner.cooldowns.insert(lease.proxy.clone(), until_ms);
                inner.end(id, EndReason::Blocked, &self.metrics);
                self.mark_dirty(&mut inner);
            }
        }
        Ok(lease)
    }

    /// The holder of a live lease (`Some(None)`: the static token); `None` when there is no
    /// such live lease.
    pub fn holder(&self, id: &str) -> Option<Option<String>> {
        self.lock().leases.get(id).map(|l| l.holder.clone())
    }

    /// Ends a lease (idempotent: an unknown or ended lease is already released).
    pub fn release(&self, id: &str) -> Result<(), LeaseError> {
        let mut inner = self.lock();
        if !inner.ready {
            return Err(LeaseError::NotReady);
        }
        if inner.leases.contains_key(id) {
            inner.end(id, EndReason::Released, &self.metrics);
            self.mark_dirty(&mut inner);
        }
        Ok(())
    }

    /// Ends leases past their expiry and forgets old ended ids and cooldowns.
    pub fn expire(&self) {
        let now = now_ms();
        let mut inner = self.lock();
        let expired: Vec<String> = inner
            .leases
            .values()
            .filter(|l| l.expires_at_ms <= now)
            .map(|l| l.id.clone())
            .collect();
        for id in &expired {
            inner.end(id, EndReason::Expired, &self.metrics);
        }
        let cooldowns = inner.cooldowns.len();
        inner.cooldowns.retain(|_, until_ms| *until_ms > now);
        while inner
            .ended_order
            .front()
            .is_some_and(|(forget_at, _)| *forget_at <= now)
        {
            let (_, id) = inner.ended_order.pop_front().expect("checked above");
            inner.ended.remove(&id);
        }
        if !expired.is_empty() || cooldowns != inner.cooldowns.len() {
            self.mark_dirty(&mut inner);
        }
    }
}

fn matches(entry: &PoolEntry, request: &LeaseRequest) -> bool {
    request
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
        && request.pool.as_ref().is_none_or(|pool| {
            entry.key.namespace == pool.namespace
                && entry.labels.get(POOL_LABEL) == Some(&pool.name)
        })
}

impl Inner {
    fn push_free(&mut self, key: ProxyKey) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.free.insert(seq, key.clone());
        self.free_seq.insert(key, seq);
    }

    fn remove_free(&mut self, key: &ProxyKey) {
        if let Some(seq) = self.free_seq.remove(key) {
            self.free.remove(&seq);
        }
    }

    /// The lease if it is live; an expired one is ended on the spot.
    fn live(&mut self, id: &str, now: u64, metrics: &LeaseMetrics) -> Result<Lease, LeaseError> {
        if !self.ready {
            return Err(LeaseError::NotReady);
        }
        match self.leases.get(id) {
            Some(lease) if lease.expires_at_ms > now => Ok(lease.clone()),
            Some(_) => {
                self.end(id, EndReason::Expired, metrics);
                self.touch();
                Err(LeaseError::Ended(EndReason::Expired))
            }
            None => match self.ended.get(id) {
                Some(reason) => Err(LeaseError::Ended(*reason)),
                None => Err(LeaseError::NotFound),
            },
        }
    }

    fn end(&mut self, id: &str, reason: EndReason, metrics: &LeaseMetrics) {
        let Some(lease) = self.leases.remove(id) else {
            return;
        };
        self.leased.remove(&lease.proxy);
        if self.pool.get(&lease.proxy).is_some_and(|e| e.healthy) {
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
        metrics.ended_by_reason[reason as usize].inc();
    }
}

#[cfg(test)]
mod tests;
