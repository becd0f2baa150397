//! Leader election with a Kubernetes Lease (kube-lease-manager): of several replicas only the
//! leader reconciles and reports ready, so Services route to it; a standby takes over within a
//! lease duration of the leader's loss.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;

/// Which Lease, who we are, and how long a leader's claim lasts.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica (the Pod name in a Deployment).
    pub identity: String,
    /// A leader that stops renewing loses the lease after this long.
    pub lease_seconds: u64,
    /// The leader renews this long before its lease expires.
    pub renew_before_seconds: u64,
}

/// Waits to become the leader, then runs `work` while leading. Returns when `work` ends
/// (shutdown), releasing the lease; fails when leadership is lost, so the process exits and
/// restarts as a standby rather than reconcile beside a new leader.
pub async fn lead<F, Fut>(
    client: Client,
    election: &LeaderElection,
    ready: Arc<AtomicBool>,
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client, &election.lease_name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.lease_seconds)
        .with_grace(election.renew_before_seconds)
        .build()
        .await
        .with_context(|| {
            format!(
                "setting up leader election on Lease {}/{}",
                election.namespace, election.lease_name
            )
        })?;
    let (mut leading, task) = manager.watch().await;
    tracing::info!(identity = %election.identity, lease = %election.lease_name, "waiting to become the leader");
    while !*leading.borrow_and_update() {
        leading
            .changed()
            .await
            .context("the leader election task stopped")?;
    }
    tracing::info!(identity = %election.identity, "became the leader");
    ready.store(true, Ordering::Relaxed);

    let lost = async {
        loop {
            if leading.changed().await.is_err() || !*leading.borrow_and_update() {
                return;
            }
        }
    };
    let outcome = tokio::select! {
        () = work() => Ok(()),
        () = lost => Err(()),
    };
    ready.store(false, Ordering::Relaxed);
    drop(leading);
    // Closing the channel makes the task release the lease, so a standby takes over at once.
    match task.await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease"),
        Err(e) => tracing::warn!(error = %e, "leader election task"),
    }
    if outcome.is_err() {
        bail!("lost the leader lease; exiting so that a restart rejoins as a standby");
    }
    Ok(())
}
