//! Write-behind persistence of the lease table into a ConfigMap, so a restart or a leader
//! failover keeps leases and cooldowns. A graceful stop writes the last state; a crash loses at
//! most one `--lease-persist-interval`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::store::{LeaseStore, Snapshot};

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
            configmap = %self.name,
            "lease table restored"
        );
        store.restore(snapshot);
        Ok(())
    }

    /// Writes the table if it changed since the last write. A failed write is retried later.
    pub async fn flush(&self, store: &LeaseStore) -> kube::Result<()> {
        if !store.is_dirty() {
            return Ok(());
        }
        let Some(snapshot) = store.snapshot() else {
            return Ok(());
        };
        if let Err(e) = self.save(&snapshot).await {
            store.mark_dirty_after_failed_write();
            return Err(e);
        }
        Ok(())
    }
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

/// Expires leases, and writes the table behind every `persist_interval` when it changed.
/// Runs until aborted; the caller flushes once more on shutdown.
pub async fn maintain(
    store: Arc<LeaseStore>,
    persistence: LeasePersistence,
    persist_interval: Duration,
) {
    let write_behind = async {
        let mut tick = tokio::time::interval(persist_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = persistence.flush(&store).await {
                tracing::warn!(configmap = %persistence.name(), error = %e, "cannot persist the lease table, will retry");
            }
        }
    };
    tokio::join!(expire_leases(store.clone()), write_behind);
}
