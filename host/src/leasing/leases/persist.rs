//! Persistence of the lease table into the cluster, so a restart or a leader failover keeps
//! leases, cooldowns (also per target, the newest) and block counts. Sessions are memory only;
//! a restore rebuilds those of its leases (docs/architecture.md, "Lease state").
//!
//! The table is written as a **journal of changes** plus a rare **checkpoint**, all ConfigMaps
//! in the operator's namespace, so that a grant writes O(1) bytes into etcd, not O(table):
//! - `<table>` (the manifest): which checkpoint generation holds the base and from which
//!   journal segment to replay;
//! - `<table>-c<generation>-<part>`: the checkpoint's JSON in parts of at most 512 KiB;
//! - `<table>-j-<seq>`: a journal segment, the changes of one write (at most 256 KiB each).
//!
//! A checkpoint is written once the journal since the last holds as many bytes as it (so a
//! checkpoint costs each grant at most one more line), then the segments and parts it covers
//! are deleted in one request each. Two models (`--lease-durability`):
//! - `sync` (default): every change wakes one writer; a grant is answered only once a segment
//!   holding it was created. Grants that arrive during a write share the next segment (group
//!   commit): one object per round trip, not per grant.
//! - `async`: written behind every `--lease-persist-interval`; a crash or a lost leadership
//!   forgets at most that much (a forgotten lease can be granted again to another crawler).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use super::journal::{self, Change, Replay};
use super::store::{LeaseStore, Snapshot};

/// When a grant is answered, relative to its write to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// Only once stored: nothing answered is forgotten by a failover.
    Sync,
    /// At once; stored within `--lease-persist-interval`.
    Async,
}

/// Longest one write may take: an API server that accepts and never answers must not hold the
/// writer (and every grant behind it) forever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest journal segment's data. Far under the API server's 1.5 MiB request and etcd's
/// object limits, whatever the burst.
pub const SEGMENT_MAX_BYTES: usize = 256 * 1024;
/// Largest checkpoint part's data.
pub const PART_MAX_BYTES: usize = 512 * 1024;
/// The journal is not folded into a checkpoint before it holds this much...
const CHECKPOINT_MIN_JOURNAL_BYTES: usize = 256 * 1024;
/// ...or this many segments (a restore lists each).
const CHECKPOINT_MAX_SEGMENTS: usize = 512;

/// The legacy one-key table (before journals): still read, replaced by the first checkpoint.
const LEGACY_KEY: &str = "leases.json";
const MANIFEST_KEY: &str = "manifest.json";
const PART_KEY: &str = "part";
const SEGMENT_KEY: &str = "changes";
const FIELD_MANAGER: &str = "proxy-operator-leases";
use crate::api::labels::GENERATION_LABEL;
use crate::api::labels::OBJECT_LABEL;
use crate::api::labels::TABLE_LABEL;

/// The manifest's content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    generation: u64,
    parts: u32,
    /// The first journal segment not in the checkpoint.
    journal_from: u64,
}

/// Where the writer is: the next segment's number and what the journal holds since the last
/// checkpoint.
#[derive(Debug, Default)]
struct Position {
    manifest: Manifest,
    next_seq: u64,
    journal_segments: usize,
    journal_bytes: usize,
    checkpoint_bytes: usize,
}

/// Where the lease table is kept.
#[derive(Clone)]
pub struct LeasePersistence {
    api: Api<ConfigMap>,
    name: String,
    label: String,
    position: Arc<tokio::sync::Mutex<Position>>,
    written_bytes: Arc<AtomicU64>,
}

impl LeasePersistence {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        // A label value has at most 63 characters; a longer table name is named by its digest.
        let label = if name.len() <= 63 {
            name.to_string()
        } else {
            hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(name.as_bytes())[..16])
        };
        LeasePersistence {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            label,
            position: Default::default(),
            written_bytes: Default::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of data this writer has written into the cluster (every object).
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes.load(Ordering::Relaxed)
    }

    fn selector(&self, object: &str) -> String {
        format!("{TABLE_LABEL}={},{OBJECT_LABEL}={object}", self.label)
    }

    fn object(
        &self,
        name: String,
        object: &str,
        generation: u64,
        key: &str,
        text: &str,
    ) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {
                    "app.kubernetes.io/managed-by": "proxy-operator",
                    TABLE_LABEL: self.label,
                    OBJECT_LABEL: object,
                    GENERATION_LABEL: generation.to_string(),
                },
            },
            "data": { key: text },
        }))
        .expect("a ConfigMap from its fields")
    }

    /// Every object of one kind of this table, in pages of 50 (a part or a segment holds up to
    /// 512 KiB: a restore of a large table does not ask the API server for one huge answer).
    async fn list_all(&self, object: &str) -> kube::Result<Vec<ConfigMap>> {
        let params = ListParams::default()
            .labels(&self.selector(object))
            .limit(50);
        crate::support::kubeclient::list_all(&self.api, &params).await
    }

    /// The persisted state: the checkpoint with the journal replayed onto it; none yet is an
    /// empty table. A damaged checkpoint is logged and replaced: refusing to serve would hurt
    /// crawlers more than forgetting leases that expire anyway.
    pub async fn load(&self) -> kube::Result<Snapshot> {
        let manifest_object = self.api.get_opt(&self.name).await?;
        let data = manifest_object.and_then(|m| m.data).unwrap_or_default();
        let mut position = Position::default();
        let mut replay = if let Some(text) = data.get(MANIFEST_KEY) {
            match serde_json::from_str::<Manifest>(text) {
                Ok(manifest) => {
                    position.manifest = manifest;
                    self.read_checkpoint(manifest, &mut position).await?
                }
                Err(e) => {
                    tracing::error!(configmap = %self.name, error = %e, "the lease table's manifest is not readable, starting from the journal alone");
                    Replay::default()
                }
            }
        } else if let Some(text) = data.get(LEGACY_KEY) {
            match serde_json::from_str::<Snapshot>(text) {
                Ok(snapshot) => Replay::from_checkpoint(snapshot),
                Err(e) => {
                    tracing::error!(configmap = %self.name, error = %e, "persisted lease table is not readable, starting empty");
                    Replay::default()
                }
            }
        } else {
            Replay::default()
        };
        let mut segments: Vec<(u64, String)> = self
            .list_all("journal")
            .await?
            .into_iter()
            .filter_map(|m| {
                let seq = journal::segment_seq(&self.name, m.metadata.name.as_deref()?)?;
                let text = m.data?.remove(SEGMENT_KEY)?;
                Some((seq, text))
            })
            .collect();
        segments.sort_by_key(|(seq, _)| *seq);
        position.next_seq = position.manifest.journal_from;
        for (seq, text) in &segments {
            position.next_seq = position.next_seq.max(seq + 1);
            if *seq < position.manifest.journal_from {
                continue; // in the checkpoint already; deleted at the next one
            }
            replay.apply_segment(text);
            position.journal_segments += 1;
            position.journal_bytes += text.len();
        }
        if replay.skipped > 0 {
            tracing::error!(configmap = %self.name, lines = replay.skipped, "lines of the lease journal are not readable and were skipped");
        }
        *self.position.lock().await = position;
        Ok(replay.into_snapshot())
    }

    async fn read_checkpoint(
        &self,
        manifest: Manifest,
        position: &mut Position,
    ) -> kube::Result<Replay> {
        let mut parts: Vec<(u32, String)> = self
            .list_all("checkpoint")
            .await?
            .into_iter()
            .filter_map(|m| {
                let name = m.metadata.name.as_deref()?;
                let index = name
                    .strip_prefix(&format!("{}-c{}-", self.name, manifest.generation))?
                    .parse()
                    .ok()?;
                Some((index, m.data?.remove(PART_KEY)?))
            })
            .collect();
        parts.sort_by_key(|(index, _)| *index);
        let complete = parts.len() == manifest.parts as usize
            && parts
                .iter()
                .enumerate()
                .all(|(i, (index, _))| i == *index as usize);
        let text: String = parts.into_iter().map(|(_, part)| part).collect();
        position.checkpoint_bytes = text.len();
        if !complete {
            tracing::error!(configmap = %self.name, generation = manifest.generation, "the lease table's checkpoint is incomplete, starting from the journal alone");
            return Ok(Replay::default());
        }
        match serde_json::from_str::<Snapshot>(&text) {
            Ok(snapshot) => Ok(Replay::from_checkpoint(snapshot)),
            Err(e) => {
                tracing::error!(configmap = %self.name, error = %e, "the lease table's checkpoint is not readable, starting from the journal alone");
                Ok(Replay::default())
            }
        }
    }

    /// Restores `store` from the cluster and opens it for grants. A failing read is tried again
    /// for a while (a new leader that started empty could lease twice), then the error returns.
    pub async fn restore_into(&self, store: &LeaseStore) -> kube::Result<()> {
        let mut wait = Duration::from_millis(200);
        let mut attempts = 0;
        let snapshot = loop {
            match self.load().await {
                Ok(snapshot) => break snapshot,
                Err(kube::Error::Api(e)) if e.code == 403 || e.code == 401 => {
                    return Err(kube::Error::Api(e));
                }
                Err(e) if attempts < 6 => {
                    tracing::warn!(configmap = %self.name, error = %e, retry_in = ?wait, "cannot read the lease table yet");
                    attempts += 1;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        };
        let position = self.position.lock().await;
        tracing::info!(
            leases = snapshot.leases.len(),
            cooldowns = snapshot.cooldowns.len(),
            target_cooldowns = snapshot.target_cooldowns.values().map(|t| t.len()).sum::<usize>(),
            generation = position.manifest.generation,
            journal_segments = position.journal_segments,
            configmap = %self.name,
            "lease table restored"
        );
        drop(position);
        store.restore(snapshot);
        Ok(())
    }

    /// Writes what changed since the last write as journal segments, then a checkpoint if one
    /// is due. A failed write is retried later (its changes are written first).
    pub async fn flush(&self, store: &LeaseStore) -> Result<(), WriteError> {
        if !store.is_dirty() {
            return Ok(());
        }
        let Some(pending) = store.take_changes() else {
            return Ok(());
        };
        if pending.whole {
            // More changed than the journal holds in memory: the table itself, at once.
            if let Err(e) = self.checkpoint(store).await {
                store.requeue_changes(pending);
                return Err(e);
            }
            store.mark_stored(pending.version);
            return Ok(());
        }
        if !pending.changes.is_empty()
            && let Err(e) = self.write_changes(store, &pending.changes).await
        {
            store.requeue_changes(pending);
            return Err(e);
        }
        store.mark_stored(pending.version);
        let due = {
            let p = self.position.lock().await;
            journal::checkpoint_due(
                p.journal_bytes,
                p.journal_segments,
                p.checkpoint_bytes,
                CHECKPOINT_MIN_JOURNAL_BYTES,
                CHECKPOINT_MAX_SEGMENTS,
            )
        };
        if due && let Err(e) = self.checkpoint(store).await {
            // The journal still holds everything; the next write tries again.
            tracing::warn!(configmap = %self.name, error = %e, "cannot write the lease table's checkpoint, will retry");
        }
        Ok(())
    }

    fn count(&self, store: &LeaseStore, object: &str, bytes: usize) {
        self.written_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        let metrics = store.metrics();
        metrics.table_writes.with_label_values(&[object]).inc();
        metrics
            .table_written_bytes
            .with_label_values(&[object])
            .inc_by(bytes as u64);
    }

    async fn write_changes(
        &self,
        store: &LeaseStore,
        changes: &[Change],
    ) -> Result<(), WriteError> {
        let mut position = self.position.lock().await;
        for text in journal::into_segments(journal::encode(changes), SEGMENT_MAX_BYTES) {
            loop {
                let seq = position.next_seq;
                let segment = self.object(
                    format!("{}-j-{seq:012}", self.name),
                    "journal",
                    position.manifest.generation,
                    SEGMENT_KEY,
                    &text,
                );
                match bounded(self.api.create(&PostParams::default(), &segment)).await {
                    Ok(_) => break,
                    // Another writer (a former leader's last write) took the number: the next.
                    Err(WriteError::Api(kube::Error::Api(e))) if e.code == 409 => {
                        tracing::warn!(configmap = %self.name, seq, "a lease journal segment of this number exists, writing the next");
                        position.next_seq += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            position.next_seq += 1;
            position.journal_segments += 1;
            position.journal_bytes += text.len();
            self.count(store, "journal", text.len());
        }
        Ok(())
    }

    /// Writes the table as a new checkpoint generation, points the manifest at it, and deletes
    /// the segments and parts it covers.
    pub async fn checkpoint(&self, store: &LeaseStore) -> Result<(), WriteError> {
        let Some(snapshot) = store.snapshot() else {
            return Ok(());
        };
        let text = serde_json::to_string(&snapshot).expect("a snapshot always serializes");
        let mut position = self.position.lock().await;
        let generation = position.manifest.generation + 1;
        let parts = journal::into_parts(&text, PART_MAX_BYTES);
        // Leftovers of an attempt that failed half-way have these names: gone first.
        self.delete_where("checkpoint", &format!("{GENERATION_LABEL}={generation}"))
            .await?;
        for (index, part) in parts.iter().enumerate() {
            let object = self.object(
                format!("{}-c{generation}-{index}", self.name),
                "checkpoint",
                generation,
                PART_KEY,
                part,
            );
            bounded(self.api.create(&PostParams::default(), &object)).await?;
            self.count(store, "checkpoint", part.len());
        }
        let manifest = Manifest {
            generation,
            parts: parts.len() as u32,
            journal_from: position.next_seq,
        };
        self.write_manifest(store, manifest).await?;
        position.manifest = manifest;
        position.journal_segments = 0;
        position.journal_bytes = 0;
        position.checkpoint_bytes = text.len();
        drop(position);
        // Covered now. A failure leaves them for the next checkpoint (a restore skips them).
        for object in ["journal", "checkpoint"] {
            if let Err(e) = self
                .delete_where(object, &format!("{GENERATION_LABEL}!={generation}"))
                .await
            {
                tracing::warn!(configmap = %self.name, object, error = %e, "cannot delete what the lease table's checkpoint covers, will retry");
            }
        }
        Ok(())
    }

    async fn write_manifest(
        &self,
        store: &LeaseStore,
        manifest: Manifest,
    ) -> Result<(), WriteError> {
        let text = serde_json::to_string(&manifest).expect("a manifest serializes");
        // Applied by the same field manager without the legacy key: the legacy table goes.
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/managed-by": "proxy-operator"},
            },
            "data": { MANIFEST_KEY: text },
        });
        bounded(self.api.patch(
            &self.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        ))
        .await?;
        self.count(store, "manifest", text.len());
        Ok(())
    }

    async fn delete_where(&self, object: &str, generation: &str) -> Result<(), WriteError> {
        let params =
            ListParams::default().labels(&format!("{},{generation}", self.selector(object)));
        bounded(
            self.api
                .delete_collection(&DeleteParams::default(), &params),
        )
        .await?;
        Ok(())
    }
}

/// One request, bounded by [`WRITE_TIMEOUT`].
async fn bounded<T>(request: impl Future<Output = kube::Result<T>>) -> Result<T, WriteError> {
    match tokio::time::timeout(WRITE_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(WriteError::Api(e)),
        Err(_) => Err(WriteError::TimedOut),
    }
}

/// A write of the table that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer from the API server within {}s", WRITE_TIMEOUT.as_secs())]
    TimedOut,
}

/// Ends expired leases (and forgets past cooldowns) every second, until aborted.
pub async fn expire_leases(store: Arc<LeaseStore>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        store.expire();
    }
}

/// Expires leases, and writes the table: at every change (`sync`) or behind every
/// `persist_interval` (`async`). Runs until aborted; the caller flushes once more on shutdown.
pub async fn maintain(
    store: Arc<LeaseStore>,
    persistence: LeasePersistence,
    durability: Durability,
    persist_interval: Duration,
) {
    let writer = async {
        match durability {
            Durability::Sync => write_at_every_change(&store, &persistence).await,
            Durability::Async => write_behind(&store, &persistence, persist_interval).await,
        }
    };
    tokio::join!(expire_leases(store.clone()), writer);
}

async fn write_behind(store: &LeaseStore, persistence: &LeasePersistence, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = persistence.flush(store).await {
            tracing::warn!(configmap = %persistence.name(), error = %e, "cannot persist the lease table, will retry");
        }
    }
}

/// One write in flight at a time; whatever changed meanwhile goes into the next. After a failure
/// the writer backs off (0.2 s doubling to 5 s) so an unreachable API server is not hammered,
/// while grants keep failing fast on their own deadline.
async fn write_at_every_change(store: &LeaseStore, persistence: &LeasePersistence) {
    const FIRST_RETRY: Duration = Duration::from_millis(200);
    const LAST_RETRY: Duration = Duration::from_secs(5);
    let mut retry = FIRST_RETRY;
    loop {
        if !store.is_dirty() {
            // A change made without a notification (a lease found expired on access) is
            // still written within a second.
            let _ = tokio::time::timeout(Duration::from_secs(1), store.changed()).await;
            continue;
        }
        match persistence.flush(store).await {
            Ok(()) => retry = FIRST_RETRY,
            Err(e) => {
                tracing::warn!(configmap = %persistence.name(), error = %e, retry_in = ?retry, "cannot persist the lease table; grants wait for it");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(LAST_RETRY);
            }
        }
    }
}
