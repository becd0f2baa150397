//! `/status/blocks.json`: the page's blocks per target host over the last hour, for
//! `kubectl px status` (which reaches the metrics port through the API server's pod proxy).
//! The hosts are the lease table's own; they never leave the cluster any other way.

use serde::{Deserialize, Serialize};

/// The path on the metrics port.
pub const BLOCKS_JSON_PATH: &str = "/status/blocks.json";

/// Blocks per target over the last hour, as one replica knows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecentBlocks {
    /// `leader`, `standby` or `starting`: only the leader counts blocks.
    pub replica: String,
    /// The leader's identity as a standby last saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// How far back the counts go.
    pub window_seconds: u64,
    /// The hosts blocking most first (the top 20), then `other` (every other host); `none`
    /// counts reports naming no host.
    pub targets: Vec<TargetBlocks>,
}

/// One host's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetBlocks {
    pub target: String,
    pub blocks: u64,
}
