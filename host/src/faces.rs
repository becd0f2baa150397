//! The operator's faces: the composition root that wires the tiers below into a running
//! operator, the CLI, the kubectl plugin, the status page, the liveness and metrics endpoints and
//! who may read them, the fleet cache and the usage meter they read. The top tier: nothing imports
//! it (docs/architecture.md, "Tiers").

pub mod cli;
pub(crate) mod fleet;
pub(crate) mod fleet_metrics;
pub mod kubectl;
pub(crate) mod leader_label;
pub(crate) mod metrics;
pub mod metrics_auth;
pub(crate) mod operator;
pub mod probes;
pub(crate) mod status_page;
pub(crate) mod usage;
