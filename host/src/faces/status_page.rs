//! A read-only status page on the metrics port (`/status`, docs/status-page.md): the fleet at a
//! glance, server-rendered from what the operator keeps in memory. Apart from the controllers:
//! it only reads their caches (`gather.rs` → a [`snapshot::Snapshot`] → the pure `render.rs`).

pub mod blocks_json;
mod gather;
mod html;
mod render;
mod render_usage;
mod routes;
mod snapshot;
mod usage;
pub mod usage_json;

pub use gather::Sources;
pub use routes::router;
pub use snapshot::human_bytes;
