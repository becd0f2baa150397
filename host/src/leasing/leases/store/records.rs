//! What the lease table keeps of a lease, and the hard state a checkpoint holds: the records the
//! journal (leases/journal.rs) and the table share.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::keys::{PoolKey, ProxyKey};

/// A proxy's first `blocked` report: how long it lasted before a site blocked it
/// (`proxy_operator_proxy_lifetime_to_first_block_seconds`, observed where its Proxy is known).
#[derive(Clone, Debug, PartialEq)]
pub struct FirstBlock {
    pub proxy: ProxyKey,
    pub provider: String,
    pub at_ms: u64,
}

/// A granted lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub id: String,
    pub proxy: ProxyKey,
    pub granted_at_ms: u64,
    pub expires_at_ms: u64,
    /// The session it was granted for. Shared (as the pool's name): the table's copy of a lease
    /// and the caller's are one allocation, not two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Arc<str>>,
    /// The proxy's pool (name, in the proxy's namespace) when it was granted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Arc<str>>,
    /// The proxy's provider instance when it was granted (labels the metrics after a restore).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// The lifetime it was granted or last renewed for; a renewal without one gets it again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ttl_ms: u64,
    /// Who it was granted to; only they may use it (`None`: the static token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Lease {
    /// `namespace/name` of its pool.
    pub fn pool_key(&self) -> Option<PoolKey> {
        self.pool.as_ref().map(|name| PoolKey {
            namespace: self.proxy.namespace.clone(),
            name: name.clone(),
        })
    }
}

/// The table's hard state as a checkpoint holds it (and as the one-key table before journals
/// did). Every field has a default, so an older table still reads. Sessions are not written any
/// more (memory only; a restore rebuilds those of its leases), but an old table's still read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    #[serde(default)]
    pub leases: Vec<Lease>,
    /// `namespace/name` → end (ms).
    #[serde(default)]
    pub cooldowns: BTreeMap<String, u64>,
    /// `namespace/name` → target digest (hex) → end (ms).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub target_cooldowns: BTreeMap<String, BTreeMap<String, u64>>,
    /// `namespace/name` → session digests (hex) bound to it, least recently used first.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sessions: BTreeMap<String, Vec<String>>,
    /// `namespace/name` → `blocked` reports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blocked_reports: BTreeMap<String, u32>,
}
