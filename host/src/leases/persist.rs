//! Persistence of the lease table into a ConfigMap, so a restart or a leader failover keeps
//! leases, cooldowns (also per target), sticky sessions and block counts. The table is one
//! ConfigMap key (at most 1 MiB): sessions and per-target cooldowns are bounded and stored as
//! digests, so at their bounds they take under 320 KiB (a store test checks it).
//! Two models (`--lease-durability`):
//! - `sync` (default): every change wakes one writer, which writes the whole table; a grant is
//!   answered only once a write holding it succeeded. Grants that arrive during a write share
//!   the next one (group commit), so the cost is one write per round trip, not per grant.
//! - `async`: written behind every `--lease-persist-interval`; a crash or a lost leadership
//!   forgets at most that much (a forgotten lease can be granted again to another crawler).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::store::{LeaseStore, Snapshot};

/// When a grant is answered, relative to its write to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// Only once stored: nothing answered is forgotten by a failover.
    Sync,
    /// At once; stored within `--lease-persist-interval`.
    Async,
}

/// Longest one write of the table may take: an API server that accepts and never answers must
/// not hold the writer (and every grant behind it) forever.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

const KEY: &str = "leases.json";
const FIELD_MANAGER: &str = "proxy-operator-leases";

/// Where the lease table is kept.
#[derive(Clone)]
pub struct LeasePersistence {
    api: Api<ConfigMap>,
    name: String,
}

impl LeasePersistence {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        LeasePersistence {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The persisted state; none yet is an empty table. A damaged one is logged and replaced:
    /// refusing to serve would hurt crawlers more than forgetting leases that expire anyway.
    pub async fn load(&self) -> kube::Result<Snapshot> {
        let Some(map) = self.api.get_opt(&self.name).await? else {
            return Ok(Snapshot::default());
        };
        let Some(text) = map.data.as_ref().and_then(|d| d.get(KEY)) else {
            return Ok(Snapshot::default());
        };
        match serde_json::from_str(text) {
            Ok(snapshot) => Ok(snapshot),
            Err(e) => {
                tracing::error!(configmap = %self.name, error = %e, "persisted lease table is not readable, starting empty");
                Ok(Snapshot::default())
            }
        }
    }

    pub async fn save(&self, snapshot: &Snapshot) -> kube::Result<()> {
        let text = serde_json::to_string(snapshot).expect("a snapshot always serializes");
        let patch = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/managed-by": "proxy-operator"},
            },
            "data": { KEY: text },
        });
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await?;
        Ok(())
    }

    /// Restores `store` from the cluster and opens it for grants.
    pub async fn restore_into(&self, store: &LeaseStore) -> kube::Result<()> {
        let snapshot = self.load().await?;
        tracing::info!(
            leases = snapshot.leases.len(),
            cooldowns = snapshot.cooldowns.len(),
            target_cooldowns = snapshot.target_cooldowns.values().map(|t| t.len()).sum::<usize>(),
            sessions = snapshot.sessions.values().map(|s| s.len()).sum::<usize>(),
            configmap = %self.name,
            "lease table restored"
        );
        store.restore(snapshot);
        Ok(())
    }

    /// Writes the table if it changed since the last write. A failed write is retried later.
    pub async fn flush(&self, store: &LeaseStore) -> Result<(), WriteError> {
        if !store.is_dirty() {
            return Ok(());
        }
        let Some((snapshot, version)) = store.snapshot_versioned() else {
            return Ok(());
        };
        let result = match tokio::time::timeout(WRITE_TIMEOUT, self.save(&snapshot)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WriteError::Api(e)),
            Err(_) => Err(WriteError::TimedOut),
        };
        match result {
            Ok(()) => store.mark_stored(version),
            Err(_) => store.mark_dirty_after_failed_write(),
        }
        result
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
