//! Support: the operator's own small libraries, knowing nothing of proxies or providers —
//! durations and YAML as users write them, digests, names, TLS for its listeners, the Kubernetes
//! client and its retry policy, leader election, Events, SOCKS5's client side. The lowest tier:
//! it imports no other tier (docs/architecture.md, "Tiers").

pub(crate) mod digest;
pub(crate) mod durations;
pub mod events;
pub(crate) mod kubeclient;
pub mod leader;
pub mod listener;
pub(crate) mod metric_samples;
pub(crate) mod names;
pub mod namespace_label;
pub mod printable;
pub mod retry;
pub mod socks;
pub mod tls;
pub mod version;
pub mod yaml;
