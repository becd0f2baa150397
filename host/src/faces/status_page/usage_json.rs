//! `/status/usage.json`: the leader's usage book, every row with its totals and its last hour
//! and day, for `kubectl px usage` (through the API server's pod proxy, as `blocks.json`).

use serde::{Deserialize, Serialize};

use crate::faces::usage::book::UsageRow;

/// The path on the metrics port.
pub const USAGE_JSON_PATH: &str = "/status/usage.json";

/// The book as one replica serves it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageReport {
    /// `leader`, `standby` or `starting`: only the leader keeps the book.
    pub replica: String,
    /// The leader's identity as a standby last saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// When the book began (ms since the epoch): the figures' `total` are since then.
    pub since_ms: u64,
    /// When the report was made (ms since the epoch).
    pub now_ms: u64,
    pub rows: Vec<UsageRow>,
}
