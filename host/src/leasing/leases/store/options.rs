//! The limits of the lease table, from the flags.

use std::time::Duration;

/// Limits of the lease table.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    pub cooldown: Duration,
    /// Consecutive `failure` reports on one proxy that ask the health engine to probe it now.
    pub failure_threshold: u32,
    /// Sticky sessions held (memory only).
    pub max_sessions: usize,
    /// Per-target cooldowns held (memory, the newest also in checkpoints).
    pub max_target_cooldowns: usize,
    /// Per-target cooldowns of one proxy.
    pub max_targets_per_proxy: usize,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            cooldown: Duration::from_secs(600),
            failure_threshold: 3,
            max_sessions: super::MAX_SESSIONS,
            max_target_cooldowns: super::MAX_TARGET_COOLDOWNS,
            max_targets_per_proxy: super::MAX_TARGETS_PER_PROXY,
        }
    }
}
