//! The Proxy reconciler: turns each `Proxy` into an instance at its provider, records where it
//! stands in the status, and makes sure deleting a Proxy always finishes.

mod access;
mod capped;
pub mod credentials;
pub mod decide;
mod metrics;
mod quota;
mod reconcile;

pub use metrics::ReconcileMetrics;
pub use reconcile::{
    Context, FIELD_MANAGER, StatusWrite, instance_name, run, run_until, write_status,
};

/// The leader's task: the admission policy `<operator-id>-provider-access` kept as the
/// providers config says (`lifecycle::access::keep_policy`).
pub async fn keep_access_policy(ctx: std::sync::Arc<Context>) {
    let name = crate::provider::access::policy::name(&ctx.operator_id);
    crate::lifecycle::access::keep_policy(ctx.client.clone(), ctx.providers.clone(), name).await
}
