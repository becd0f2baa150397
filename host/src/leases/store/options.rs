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
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            cooldown: Duration::from_secs(600),
            failure_threshold: 3,
        }
    }
}
