//! proxy-operator: a Kubernetes operator that gives web crawlers a pool of healthy egress proxies,
//! made through sandboxed WebAssembly provider plugins.

pub mod api;
pub mod faces;
pub mod leasing;
pub mod lifecycle;
pub mod provider;
pub mod support;
