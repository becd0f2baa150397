//! proxy-operator: a Kubernetes operator that gives web crawlers a pool of healthy egress proxies,
//! made through sandboxed WebAssembly provider plugins.

pub mod abandoned;
pub mod api;
pub mod capabilities;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod controller;
pub mod credentials;
pub(crate) mod fleet;
pub mod gateway;
pub mod gc;
pub mod health;
pub mod kubectl;
pub mod leases;
pub(crate) mod metrics;
pub mod metrics_auth;
pub(crate) mod operator;
pub mod plugins;
pub mod pool;
pub mod probes;
pub mod providerhealth;
pub mod providers;
pub mod registry;
pub(crate) mod status_page;
pub mod support;
pub(crate) mod upstream;
pub(crate) mod usage;
