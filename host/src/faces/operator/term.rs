//! A leader's term at its two ends: what it restores before it serves (the lease table, the
//! proxies' credentials, the usage book) and what it writes back when it ends gracefully.

use kube::Client;

use super::args::RunArgs;
use crate::faces::usage::UsageLedger;
use crate::faces::usage::persist::UsagePersistence;
use crate::leasing::leases::{LeasePersistence, LeaseStore};
use crate::provider::credentials::CredentialsBook;

/// Where a term's lease table and usage book are kept.
pub(super) struct Kept {
    pub leases: LeasePersistence,
    pub usage: UsagePersistence,
}

/// What a term starts from, before it serves: the lease table (serving grants before it is
/// restored could lease twice), the proxies' credentials (a new leader knows them before its
/// controller has looked at every Proxy) and the usage book.
pub(super) async fn restore(
    client: &Client,
    args: &RunArgs,
    leases: &LeaseStore,
    credentials: &CredentialsBook,
    usage: &UsageLedger,
) -> Kept {
    let kept = Kept {
        leases: LeasePersistence::new(
            client.clone(),
            &args.leader.operator_namespace,
            &format!("{}-leases", args.operator_id),
        ),
        usage: UsagePersistence::new(
            client.clone(),
            &args.leader.operator_namespace,
            &args.operator_id,
        ),
    };
    if let Err(e) = kept.leases.restore_into(leases).await {
        tracing::error!(configmap = %kept.leases.name(), error = %e, "cannot read the persisted lease table, starting empty");
        leases.restore(Default::default());
    }
    crate::lifecycle::controller::credentials::prefill(
        client,
        args.proxy_namespace.as_deref(),
        credentials,
    )
    .await;
    match kept.usage.load().await {
        Ok(book) => usage.restore(book),
        Err(e) => {
            tracing::error!(configmap = %kept.usage.name(), error = %e, "cannot read the persisted usage book, starting a new one");
            usage.restore(Default::default());
        }
    }
    kept
}

/// Graceful stop: the last changes of the lease table and the usage book reach the cluster
/// before the next leader restores them.
pub(super) async fn persist_at_end(kept: &Kept, leases: &LeaseStore, usage: &UsageLedger) {
    if let Err(e) = kept.leases.flush(leases).await {
        tracing::error!(configmap = %kept.leases.name(), error = %e, "cannot persist the lease table on shutdown");
    }
    if let Err(e) = kept.usage.save(&usage.book()).await {
        tracing::error!(configmap = %kept.usage.name(), error = %e, "cannot persist the usage book on shutdown");
    }
}
