//! The label the leader puts on its own Pod, so the discovery Service (which selects it) routes
//! crawlers to the one replica that serves leases while every healthy replica stays Ready (the
//! pattern of Patroni-style operators; docs/architecture.md says why).
//!
//! The leader labels itself once its lease table is restored and removes the label when it stops
//! leading. A leader cut off from the API server cannot remove its label; the next leader removes
//! it from every other Pod when it labels itself, and until then that replica answers crawlers a
//! `not-leader` problem naming the leader.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

use crate::api::labels::LEADER_LABEL;

/// How long one label write may take: a leader must not wait on a slow API server to serve.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the leader writes its label again.
const REASSERT_EVERY: Duration = Duration::from_secs(30);

/// This replica's Pod (`POD_NAME` in `POD_NAMESPACE`).
#[derive(Clone)]
pub struct LeaderLabel {
    pods: Api<Pod>,
    pod: String,
}

impl LeaderLabel {
    pub fn new(client: kube::Client, namespace: &str, pod: &str) -> Self {
        LeaderLabel {
            pods: Api::namespaced(client, namespace),
            pod: pod.to_string(),
        }
    }

    /// Labels this Pod the leader and takes the label off every other Pod that still has it.
    pub async fn mark(&self) {
        self.write(&self.pod, Some("true")).await;
        let others = ListParams::default().labels(&format!("{LEADER_LABEL}=true"));
        match tokio::time::timeout(WRITE_TIMEOUT, self.pods.list_metadata(&others)).await {
            Ok(Ok(list)) => {
                for pod in list.items {
                    if let Some(name) = pod.metadata.name.filter(|n| n != &self.pod) {
                        tracing::info!(pod = %name, "taking the leader label off a former leader");
                        self.write(&name, None).await;
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot list Pods with the leader label"),
            Err(_) => tracing::warn!("listing Pods with the leader label: no answer"),
        }
    }

    /// Labels this Pod now and again every [`REASSERT_EVERY`] while the leader leads, so a late
    /// removal (a former term's step-down landing after this term's label, a person) is undone.
    pub async fn keep(self) {
        loop {
            self.mark().await;
            tokio::time::sleep(REASSERT_EVERY).await;
        }
    }

    /// Takes the label off this Pod (stepping down or shutting down).
    pub async fn unmark(&self) {
        self.write(&self.pod, None).await;
    }

    async fn write(&self, pod: &str, value: Option<&str>) {
        let patch = serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
        let written = tokio::time::timeout(
            WRITE_TIMEOUT,
            self.pods
                .patch(pod, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await;
        match written {
            Ok(Ok(_)) => {
                tracing::debug!(%pod, label = LEADER_LABEL, ?value, "leader label written")
            }
            Ok(Err(kube::Error::Api(status))) if status.is_not_found() => {}
            Ok(Err(e)) => {
                tracing::warn!(%pod, error = %e, "cannot write the leader label (RBAC: patch pods)")
            }
            Err(_) => tracing::warn!(%pod, "writing the leader label: no answer"),
        }
    }
}
