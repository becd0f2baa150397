//! What the status page shows, as plain values: gathered from the caches in one go
//! (`gather.rs`), rendered by a pure function (`render.rs`).
use std::collections::BTreeMap;

/// The whole page's content at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// When it was gathered (RFC 3339, UTC).
    pub generated_at: String,
    pub replica: Replica,
    pub pools: Vec<PoolRow>,
    pub providers: Vec<ProviderRow>,
    /// Proxies by namespace and name, at most [`MAX_ROWS`].
    pub proxies: Vec<ProxyRow>,
    /// Proxies in each phase (all of them, not only the rows shown).
    pub phases: Vec<(String, usize)>,
    /// Proxies not shown past [`MAX_ROWS`].
    pub proxies_hidden: usize,
    /// Live leases, soonest to expire first; `None` on a standby (the leader holds them).
    pub leases: Option<Vec<LeaseRow>>,
    pub leases_hidden: usize,
    /// Blocks per target host in the last hour, most first, then `other`.
    pub blocks: Vec<(String, u64)>,
    pub plugins: Vec<PluginRow>,
    pub usage: Usage,
}

/// The most proxies or leases listed (a fleet of thousands would make a page nobody reads and
/// every refresh heavy); the counts above the tables cover all of them.
pub const MAX_ROWS: usize = 500;

/// Which replica answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Replica {
    /// The leader: it reconciles and holds the lease table.
    Leader,
    /// A standby; the leader's identity when known.
    Standby { leader: Option<String> },
    /// Neither yet (starting).
    #[default]
    Starting,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolRow {
    pub namespace: String,
    pub name: String,
    pub desired: i32,
    pub ready: i32,
    pub leased: i32,
    /// Proxies of the pool cooling down after a block (from the lease table; leader only).
    pub cooling: Option<usize>,
    pub draining: i32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderRow {
    pub name: String,
    pub provider_type: String,
    /// The `Ready` condition: `None` before the first check.
    pub ready: Option<bool>,
    pub reason: String,
    pub message: String,
    pub targets: String,
    pub last_check: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxyRow {
    pub namespace: String,
    pub name: String,
    pub pool: String,
    pub provider: String,
    pub zone: String,
    pub phase: String,
    /// The `Ready` condition's reason and message.
    pub ready_reason: String,
    pub ready_message: String,
    pub address: String,
    pub exit_ip: String,
    /// In the lease table: `available`, `leased`, `coolingDown`, `unhealthy`; empty when not
    /// there (not provisioned, or on a standby).
    pub lease_state: String,
    pub age: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LeaseRow {
    /// The first characters of its id (the id itself lets its holder act on the lease).
    pub id: String,
    pub proxy: String,
    pub pool: String,
    /// Who holds it: a Kubernetes username, or `static token`.
    pub holder: String,
    pub session: bool,
    pub expires_in: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginRow {
    /// The provider instance it serves.
    pub provider: String,
    /// The plugin's own name, or the type not loaded.
    pub plugin: String,
    pub version: String,
    pub wit_version: String,
    pub sha256: String,
    pub capabilities: Vec<String>,
    pub description: String,
    /// Why it is not loaded (then the fields above but `plugin` are empty).
    pub not_loaded: Option<String>,
}

/// The usage figures, read from the same metric families Prometheus scrapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// (provider, zone, seconds).
    pub instance_seconds: Vec<(String, String, f64)>,
    /// (provider, created, deleted).
    pub created_deleted: Vec<(String, f64, f64)>,
    /// (pool, leases granted).
    pub leases_granted: Vec<(String, f64)>,
    /// (provider, proxies first blocked, mean age at the first block in seconds).
    pub first_block: Vec<(String, u64, f64)>,
    /// (pool, bytes sent, bytes received) through the gateway, as its replicas reported them
    /// to this leader.
    pub gateway_bytes: Vec<(String, u64, u64)>,
    /// Instance-seconds and leases per team (the `namespace` label of the families).
    pub by_namespace: BTreeMap<String, TeamUsage>,
}

/// One team's (namespace's) share of the usage figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TeamUsage {
    pub instance_seconds: f64,
    pub leases_granted: f64,
}

impl Usage {
    /// Each team's row: its instance-seconds, leases and gateway bytes (those of its pools).
    pub fn teams(&self) -> BTreeMap<String, (TeamUsage, u64, u64)> {
        let mut teams: BTreeMap<String, (TeamUsage, u64, u64)> = self
            .by_namespace
            .iter()
            .map(|(ns, usage)| (ns.clone(), (usage.clone(), 0, 0)))
            .collect();
        for (pool, sent, received) in &self.gateway_bytes {
            if let Some(ns) = crate::support::namespace_label::namespace_of(pool) {
                let row = teams.entry(ns.to_string()).or_default();
                row.1 += sent;
                row.2 += received;
            }
        }
        teams
    }
}

/// A byte count as a person reads it: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A duration as a person reads it: `42s`, `5m`, `3h 12m`, `2d 4h`.
pub fn human_duration(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => match (s / 3600, s % 3600 / 60) {
            (h, 0) => format!("{h}h"),
            (h, m) => format!("{h}h {m}m"),
        },
        s => match (s / 86_400, s % 86_400 / 3600) {
            (d, 0) => format!("{d}d"),
            (d, h) => format!("{d}d {h}h"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl_ages() {
        for (seconds, text) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (3599, "59m"),
            (3600, "1h"),
            (3660, "1h 1m"),
            (86_400, "1d"),
            (90_000, "1d 1h"),
        ] {
            assert_eq!(human_duration(seconds), text);
        }
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        for (n, text) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (5 << 30, "5.0 GiB"),
            (u64::MAX, "16384.0 PiB"),
        ] {
            assert_eq!(human_bytes(n), text);
        }
    }
}
