//! The Proxy reconciler: turns each `Proxy` into an instance at its provider, records where it
//! stands in the status, and makes sure deleting a Proxy always finishes.

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
