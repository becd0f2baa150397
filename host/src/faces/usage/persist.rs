//! The usage book in the cluster: one ConfigMap, `<operator-id>-usage` in the operator's
//! namespace, written by the leader every [`PERSIST_INTERVAL`] and at the end of its term, read
//! by the next leader before it adds anything. The book is bounded (`book::MAX_ROWS` rows, a
//! day of buckets), so one object holds it.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::book::UsageBook;
use super::ledger::UsageLedger;

/// How often the leader writes the book: a failover loses at most this much of it.
pub const PERSIST_INTERVAL: Duration = Duration::from_secs(60);
/// The ConfigMap's key holding the book.
const KEY: &str = "book.json";
const FIELD_MANAGER: &str = "proxy-operator-usage";

/// Where the book is kept.
#[derive(Clone)]
pub struct UsagePersistence {
    api: Api<ConfigMap>,
    name: String,
}

impl UsagePersistence {
    pub fn new(client: Client, namespace: &str, operator_id: &str) -> Self {
        UsagePersistence {
            api: Api::namespaced(client, namespace),
            name: format!("{operator_id}-usage"),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The book as last written; an empty one if there is none yet. A book that cannot be
    /// read back (written by a newer version, edited by hand) starts a new one, said in the log.
    pub async fn load(&self) -> kube::Result<UsageBook> {
        let Some(map) = self.api.get_opt(&self.name).await? else {
            return Ok(UsageBook::default());
        };
        let text = map
            .data
            .and_then(|d| d.get(KEY).cloned())
            .unwrap_or_default();
        Ok(serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(configmap = %self.name, error = %e, "the persisted usage book cannot be read; starting a new one");
            UsageBook::default()
        }))
    }

    pub async fn save(&self, book: &UsageBook) -> kube::Result<()> {
        let text = serde_json::to_string(book).expect("the book is plain data");
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {"app.kubernetes.io/managed-by": "proxy-operator"},
            },
            "data": { KEY: text },
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.api
            .patch(&self.name, &params, &Patch::Apply(object))
            .await
            .map(|_| ())
    }
}

/// Writes the book every [`PERSIST_INTERVAL`] until dropped (the end of the term writes it once
/// more). A write that fails is said in the log and tried again at the next interval.
pub async fn maintain(ledger: UsageLedger, persistence: UsagePersistence) {
    let mut tick = tokio::time::interval(PERSIST_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = persistence.save(&ledger.book()).await {
            tracing::warn!(configmap = %persistence.name(), error = %e, "cannot persist the usage book; trying again in a minute");
        }
    }
}
