//! The ProxyPool controller: keeps `replicas` Proxies made from a template, rolls them within a
//! budget when the template changes, rotates them by age and replaces the ones crawlers keep
//! reporting blocked (docs/pools.md). Decisions in `decide` (pure), I/O in `reconcile`.

mod access;
mod capped;
pub mod decide;
mod member;
pub mod quota;
mod reconcile;
mod spec;

pub use reconcile::{PoolContext, run_until};
pub use spec::{Invalid, resolve, template_hash};
