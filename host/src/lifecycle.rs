//! The Proxy life cycle: the Proxy controller (create, watch, delete through the provider), the
//! ProxyPool controller, the health engine that probes every proxy, the garbage collector, the
//! record of abandoned instances and the caps per provider instance. Imports every tier below it
//! (docs/architecture.md, "Tiers").

pub mod abandoned;
pub mod access;
pub mod caps;
pub mod controller;
pub mod gc;
pub mod health;
pub mod pool;
pub mod quota;
