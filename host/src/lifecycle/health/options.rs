//! The health engine's settings.

use std::time::Duration;

/// Settings of the health engine.
#[derive(Clone, Debug)]
pub struct HealthOptions {
    /// Time between probe rounds; zero turns probing off (every provisioned proxy counts as
    /// healthy).
    pub interval: Duration,
    /// Probes running at once.
    pub workers: usize,
    /// Deadline of one probe.
    pub timeout: Duration,
    /// `host:port` the probe asks the proxy to CONNECT to.
    pub target: String,
    /// Consecutive failures that make a proxy Unhealthy.
    pub failure_threshold: u32,
    /// Consecutive successes that make an Unhealthy proxy Healthy again.
    pub success_threshold: u32,
    /// When nothing changes, `lastProbeTime` is written at most this often; the exit IP is asked
    /// for again this often too.
    pub status_refresh: Duration,
    /// A service that answers with the caller's address (`https://api.ipify.org`), asked through
    /// each healthy proxy to record its exit IP in the status; `None`: not recorded.
    pub exit_ip_url: Option<String>,
}

impl Default for HealthOptions {
    fn default() -> Self {
        HealthOptions {
            interval: Duration::from_secs(15),
            workers: 64,
            timeout: Duration::from_secs(5),
            target: "www.google.com:443".into(),
            failure_threshold: 3,
            success_threshold: 2,
            status_refresh: Duration::from_secs(300),
            exit_ip_url: None,
        }
    }
}
