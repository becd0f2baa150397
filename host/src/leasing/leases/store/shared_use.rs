//! What the lease table keeps of the gateway's shared use of proxies (see `shared.rs`): soft
//! state, never persisted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::keys::{FastMap, PoolKey, ProxyKey};

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

/// The `pool` of bytes through a proxy of no ProxyPool (as the gateway's metric names it).
pub const NO_POOL: &str = "none";

/// Bytes per pool: (sent, received), as the client sees them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolTraffic {
    pub sent: u64,
    pub received: u64,
}

/// Why a replica's report was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaError {
    TooManyReplicas,
}

/// A ProxyPool's own gateway settings (its `spec.gateway`), as the pool controller last saw
/// them; what it leaves out is the operator's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolGateway {
    pub max_connections_per_proxy: Option<u32>,
    pub block_statuses: Option<Vec<u16>>,
    pub block_body_patterns: Vec<String>,
}

#[derive(Default)]
pub struct SharedUse {
    /// Pools with gateway settings of their own.
    pub(super) pools: FastMap<PoolKey, Arc<PoolGateway>>,
    pub(super) replicas: HashMap<String, ReplicaLoad>,
    /// Proxies carrying gateway traffic: out of the free order until [`SHARED_HOLD`] after
    /// their last route with no open connection.
    pub(super) in_use: FastMap<ProxyKey, Use>,
    /// Counts routes: each proxy's latest is its [`Use::order`].
    pub(super) next_route: u64,
    /// Bytes the gateway carried, by pool name (`shared_bytes.rs`).
    pub(super) bytes: std::collections::BTreeMap<String, PoolTraffic>,
}

/// A proxy's gateway use.
#[derive(Clone, Copy)]
pub(super) struct Use {
    /// When it was last routed to (ms).
    pub(super) last_ms: u64,
    /// Its last route's place in the order routes were handed out: the tie-breaker that makes
    /// requests rotate, exact where milliseconds are not (0: reported, never routed here).
    pub(super) order: u64,
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
    /// Open gateway connections on `key` over every replica, as they last reported them: what
    /// the per-proxy bound is checked against (routes since then may have closed already).
    pub(super) fn load(&self, key: &ProxyKey) -> u32 {
        self.replicas
            .values()
            .map(|r| r.connections.get(key).copied().unwrap_or(0))
            .sum()
    }

    /// [`Self::load`] plus the routes handed out since each report: what the choice among
    /// proxies ranks by, so a burst between two reports spreads rather than piles on one.
    pub(super) fn estimate(&self, key: &ProxyKey) -> u32 {
        self.load(key)
            + self
                .replicas
                .values()
                .map(|r| r.routed.get(key).copied().unwrap_or(0))
                .sum::<u32>()
    }

    /// The gateway settings of a proxy's pool (`pool`), if it has its own.
    pub(super) fn settings_of(&self, pool: Option<&PoolKey>) -> Option<&Arc<PoolGateway>> {
        self.pools.get(pool?)
    }

    pub(super) fn is_in_use(&self, key: &ProxyKey) -> bool {
        self.in_use.contains_key(key)
    }
}
