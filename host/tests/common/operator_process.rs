//! `proxy-operator run` as a Deployment runs it, against a test control plane: its discovery
//! API and probes on free loopback ports, its log in the test's directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::process::{Proc, free_port};
use harness::{ControlPlane, TestNamespace};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::plugins_dir;

pub const TOKEN: &str = "e2e-token";

/// How to start one operator process beyond what every test sets.
pub struct OperatorSetup<'a> {
    /// The cluster it talks to (a kubeconfig through a relay, for a partition).
    pub kubeconfig: PathBuf,
    /// Namespace of its Proxies, and of its own objects (Lease, lease table) unless
    /// `own_namespace` says otherwise.
    pub namespace: &'a str,
    pub own_namespace: Option<&'a str>,
    pub dir: &'a Path,
    pub providers_config: &'a str,
    /// Health probes CONNECT to this loopback `host:port`, never to the default public host.
    pub health_target: &'a str,
    pub operator_id: String,
    /// `--health-interval` (`0s`: no probing; every provisioned proxy is leasable).
    pub health_interval: &'a str,
    /// Where it loads plugins from (`plugins_dir()`, or an empty one with a ConfigMap).
    pub plugins_dir: PathBuf,
    /// Further flags (leader election, durability).
    pub extra: Vec<String>,
    /// Log file name in `dir`.
    pub log: &'a str,
    /// The discovery API over TLS with these certificate and key files; `None`: plain HTTP
    /// (`--discovery-plain-http`).
    pub discovery_tls: Option<(PathBuf, PathBuf)>,
    /// `--metrics-insecure` (most tests read /metrics and /status without a token).
    pub metrics_insecure: bool,
}

pub struct OperatorProcess {
    pub proc: Proc,
    pub metrics: SocketAddr,
    pub discovery: SocketAddr,
}

/// The discovery API's transport and the metrics port's check, as `setup` asks.
fn transport_flags(setup: &OperatorSetup<'_>) -> Vec<std::ffi::OsString> {
    let mut flags: Vec<std::ffi::OsString> = match &setup.discovery_tls {
        Some((cert, key)) => vec![
            "--discovery-tls-cert-file".into(),
            cert.into(),
            "--discovery-tls-key-file".into(),
            key.into(),
        ],
        None => vec!["--discovery-plain-http".into()],
    };
    if setup.metrics_insecure {
        flags.push("--metrics-insecure".into());
    }
    flags
}

impl OperatorProcess {
    pub fn start(
        cp: &ControlPlane,
        ns: &TestNamespace,
        dir: &Path,
        config: &str,
        target: &str,
    ) -> Self {
        Self::start_with(Self::setup(cp, ns, dir, config, target))
    }

    /// What [`Self::start`] runs: the operator for `ns` with the providers config at `config`.
    pub fn setup<'a>(
        cp: &ControlPlane,
        ns: &'a TestNamespace,
        dir: &'a Path,
        config: &'a str,
        target: &'a str,
    ) -> OperatorSetup<'a> {
        OperatorSetup {
            kubeconfig: cp.kubeconfig().to_path_buf(),
            namespace: ns.name(),
            own_namespace: None,
            dir,
            providers_config: config,
            health_target: target,
            operator_id: format!("e2e-{}", ns.name()),
            health_interval: "200ms",
            plugins_dir: plugins_dir(),
            extra: Vec::new(),
            log: "operator.log",
            discovery_tls: None,
            metrics_insecure: true,
        }
    }

    pub fn start_with(setup: OperatorSetup<'_>) -> Self {
        let (metrics, discovery): (SocketAddr, SocketAddr) = (
            ([127, 0, 0, 1], free_port().unwrap()).into(),
            ([127, 0, 0, 1], free_port().unwrap()).into(),
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_proxy-operator"));
        cmd.args(["run", "--providers-config", setup.providers_config])
            .arg("--plugins-dir")
            .arg(&setup.plugins_dir)
            .args(["--proxy-namespace", setup.namespace])
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--discovery-addr", &discovery.to_string()])
            .args(["--health-interval", setup.health_interval])
            .args(["--health-failure-threshold", "2"])
            .args(["--health-target", setup.health_target])
            .args(["--operator-id", &setup.operator_id])
            .args(&setup.extra)
            .args(transport_flags(&setup))
            .env("KUBECONFIG", &setup.kubeconfig)
            .env(
                "POD_NAMESPACE",
                setup.own_namespace.unwrap_or(setup.namespace),
            )
            .env("DISCOVERY_TOKEN", TOKEN)
            // OPERATOR_LOG_LEVEL=proxy_operator::support::leader=debug,info to look closer at one run.
            .env(
                "LOG_LEVEL",
                std::env::var("OPERATOR_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            )
            .env("PLUGIN_CACHE_DIR", setup.dir.join("cache"));
        let proc = Proc::spawn("proxy-operator", cmd, &setup.dir.join(setup.log)).unwrap();
        OperatorProcess {
            proc,
            metrics,
            discovery,
        }
    }

    /// `/readyz` (a healthy replica: the leader or a standby): its status and body, `None` when
    /// nothing answers.
    pub async fn readyz(&self) -> Option<(StatusCode, String)> {
        self.probe("/readyz").await
    }

    /// `/leaderz` (200 only on the replica that serves leases), as [`Self::readyz`].
    pub async fn leaderz(&self) -> Option<(StatusCode, String)> {
        self.probe("/leaderz").await
    }

    async fn probe(&self, path: &str) -> Option<(StatusCode, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.metrics))
            .await
            .ok()?;
        let status = response.status();
        Some((status, response.text().await.unwrap_or_default()))
    }

    /// Waits until this replica serves leases.
    pub async fn wait_leading(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((StatusCode::OK, _)) = self.leaderz().await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline && self.proc.try_exited().is_none(),
                "operator not serving leases: {}",
                self.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = reqwest::Client::new()
            .request(method, format!("http://{}{path}", self.discovery))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Grants a lease on `proxy` once it is healthy.
    pub async fn lease(&mut self, proxy: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self
                .call(
                    reqwest::Method::POST,
                    "/v1/leases",
                    Some(json!({ "proxy": proxy })),
                )
                .await;
            if status == StatusCode::CREATED {
                return body["id"].as_str().unwrap().to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no lease on {proxy}: {status} {body}\n{}",
                self.proc.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn states(&self) -> Vec<(String, String)> {
        let (status, body) = self.call(reqwest::Method::GET, "/v1/proxies", None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}
