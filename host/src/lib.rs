//! proxy-operator: a Kubernetes operator that gives web crawlers a pool of healthy egress proxies,
//! made through sandboxed WebAssembly provider plugins.

pub mod api;
pub mod cli;
pub(crate) mod fleet;
pub mod kubectl;
pub mod leasing;
pub mod lifecycle;
pub(crate) mod metrics;
pub mod metrics_auth;
pub(crate) mod operator;
pub mod probes;
pub mod provider;
pub(crate) mod status_page;
pub mod support;
pub(crate) mod usage;
