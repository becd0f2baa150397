//! Leases on healthy proxies for crawlers: the lease table, its persistence, and the discovery
//! HTTP API over it.

pub mod api;
pub mod auth;
pub mod blocks;
pub mod journal;
pub mod metrics;
pub mod persist;
mod serve;
pub mod store;

pub use api::{Discovery, router};
pub use auth::{Auth, KubeAuthOptions, KubeReviewer, TokenPools};
pub use blocks::BlockMetrics;
pub use metrics::LeaseMetrics;
pub use persist::{Durability, LeasePersistence};
pub use serve::{serve, serve_tls};
pub use store::{
    FirstBlock, LeaseOptions, LeaseRequest, LeaseStore, Outcome, PoolKey, ProvisionedProxy,
    ProxyKey, ProxyUsage, Snapshot,
};
