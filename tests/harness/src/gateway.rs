//! `proxy-operator gateway` as its Deployment runs it, on free loopback ports, in front of a
//! leader's discovery API: for `make dev`, the gateway tests and the gateway bench.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::process::{Proc, Scratch, free_port};

/// A running gateway and its three ports. Stopped on drop.
pub struct GatewayProcess {
    pub process: Proc,
    /// HTTP forward proxy and CONNECT.
    pub http: SocketAddr,
    pub socks: SocketAddr,
    /// /metrics, /healthz, /readyz.
    pub metrics: SocketAddr,
    _scratch: Scratch,
}

impl GatewayProcess {
    /// Starts `binary gateway` as replica `name` of the leader at `leader`, with `token` (the
    /// operator's GATEWAY_TOKEN), load reports every second, and `flags` (the destination
    /// policy, bounds); its log is `gateway.log` in its scratch directory.
    pub fn spawn(
        binary: &Path,
        leader: SocketAddr,
        token: &str,
        name: &str,
        flags: &[&str],
    ) -> Result<GatewayProcess> {
        // The operators the harness starts serve plain HTTP on loopback; no cluster to review
        // metrics tokens with.
        let mut all = vec!["--discovery-plain-http", "--metrics-insecure"];
        all.extend_from_slice(flags);
        Self::spawn_url(binary, &format!("http://{leader}"), token, name, &all)
    }

    /// As [`Self::spawn`], for the discovery API at `url` (an https one with
    /// `--discovery-ca-file` in `flags`); `flags` carry every transport and metrics flag.
    pub fn spawn_url(
        binary: &Path,
        url: &str,
        token: &str,
        name: &str,
        flags: &[&str],
    ) -> Result<GatewayProcess> {
        let scratch = Scratch::new("gateway")?;
        let (http, socks, metrics): (SocketAddr, SocketAddr, SocketAddr) = (
            ([127, 0, 0, 1], free_port()?).into(),
            ([127, 0, 0, 1], free_port()?).into(),
            ([127, 0, 0, 1], free_port()?).into(),
        );
        let mut cmd = std::process::Command::new(binary);
        cmd.arg("gateway")
            .args(["--discovery-url", url])
            .args(["--replica", name])
            .args(["--http-addr", &http.to_string()])
            .args(["--socks-addr", &socks.to_string()])
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--load-report-interval", "1s"])
            .args(flags)
            .env("GATEWAY_TOKEN", token)
            .env(
                "LOG_LEVEL",
                std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            );
        let process = Proc::spawn(name, cmd, &scratch.path().join("gateway.log"))?;
        Ok(GatewayProcess {
            process,
            http,
            socks,
            metrics,
            _scratch: scratch,
        })
    }

    /// Waits until /readyz answers 200 (the leader took its load report, so it has the token
    /// right and can route); a gateway that exits or is not ready in `timeout` fails with its
    /// log.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("http://{}/readyz", self.metrics);
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?;
        self.process.wait_http_ok(&http, &url, timeout).await
    }

    /// `http://username:token@<http port>`: the proxy URL a client uses.
    pub fn proxy_url(&self, username: &str, token: &str) -> String {
        format!("http://{username}:{token}@{}", self.http)
    }
}
