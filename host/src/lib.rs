//! proxy-operator: a Kubernetes operator that gives web crawlers a pool of healthy egress proxies,
//! made through sandboxed WebAssembly provider plugins.

pub mod abandoned;
pub mod api;
pub mod cli;
pub mod controller;
pub(crate) mod fleet;
pub mod gc;
pub mod health;
pub mod kubectl;
pub mod leasing;
pub(crate) mod metrics;
pub mod metrics_auth;
pub(crate) mod operator;
pub mod pool;
pub mod probes;
pub mod provider;
pub(crate) mod status_page;
pub mod support;
pub(crate) mod usage;
