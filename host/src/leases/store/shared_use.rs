//! What the lease table keeps of the gateway's shared use of proxies (see `shared.rs`): soft
//! state, never persisted.

use std::collections::HashMap;
use std::time::Duration;

use super::keys::{FastMap, ProxyKey};

/// A proxy routed to, with no open gateway connection, stays out of the free order this long:
/// a client's next request usually follows within it, and a lease in between would take the
/// proxy from under its session.
pub const SHARED_HOLD: Duration = Duration::from_secs(30);
/// A gateway replica that has not reported its connections for this long is gone: what it
/// reported no longer counts.
pub const REPLICA_SILENCE: Duration = Duration::from_secs(30);
/// Gateway replicas the leader keeps the loads of; one more is refused (a misconfigured
/// gateway inventing ids must not grow the leader's memory).
pub const MAX_REPLICAS: usize = 256;

/// Why a replica's report was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaError {
    TooManyReplicas,
}

#[derive(Default)]
pub struct SharedUse {
    pub(super) replicas: HashMap<String, ReplicaLoad>,
    /// Proxies carrying gateway traffic, with when each was last routed to (ms): out of the
    /// free order until [`SHARED_HOLD`] after that with no open connection.
    pub(super) in_use: FastMap<ProxyKey, u64>,
}

#[derive(Default)]
pub(super) struct ReplicaLoad {
    /// Open upstream connections per proxy, as the replica last reported them.
    pub(super) connections: FastMap<ProxyKey, u32>,
    /// Routes handed to the replica since that report (its connections the report missed).
    pub(super) routed: FastMap<ProxyKey, u32>,
    pub(super) reported_at_ms: u64,
}

impl SharedUse {
    /// Open gateway connections on `key`, over every replica.
    pub(super) fn load(&self, key: &ProxyKey) -> u32 {
        self.replicas
            .values()
            .map(|r| {
                r.connections.get(key).copied().unwrap_or(0)
                    + r.routed.get(key).copied().unwrap_or(0)
            })
            .sum()
    }

    pub(super) fn is_in_use(&self, key: &ProxyKey) -> bool {
        self.in_use.contains_key(key)
    }
}
