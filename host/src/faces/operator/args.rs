//! The flags of `proxy-operator run`, grouped by the part of the operator that owns them (each
//! group flattened into `RunArgs`, so the command line stays flat), with their checks and the
//! options each part is built from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::leasing::leases::{Durability, KubeAuthOptions, LeaseOptions, TokenPools};
use crate::lifecycle::gc::GcOptions;
use crate::lifecycle::health::HealthOptions;
use crate::support::leader::LeaderElection;

/// Flags of `run`; each has an environment fallback for Deployments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Watch Proxies in this namespace only (default: all namespaces).
    #[arg(long, env = "PROXY_NAMESPACE")]
    pub proxy_namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Identity written on every instance, so two installations never collect each other's.
    #[arg(long, env = "OPERATOR_ID", default_value = "proxy-operator")]
    pub operator_id: String,
    #[command(flatten)]
    pub plugin: PluginArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub gc: GcArgs,
    #[command(flatten)]
    pub provider_check: ProviderCheckArgs,
    #[command(flatten)]
    pub health: HealthArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub discovery_auth: DiscoveryAuthArgs,
    #[command(flatten)]
    pub gateway: GatewayAccessArgs,
    #[command(flatten)]
    pub metrics_auth: MetricsAuthArgs,
    #[command(flatten)]
    pub listener: ListenerArgs,
}

/// Who may read /metrics and the status page (docs/metrics.md).
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsAuthArgs {
    /// Serve /metrics and the status page (/status*) to anyone, without a token: for a local
    /// run. Without it each request needs a bearer token the API server accepts (TokenReview)
    /// whose user may `get` the path as a non-resource URL (SubjectAccessReview; the ClusterRole
    /// proxy-operator-metrics-reader).
    #[arg(long, env = "METRICS_INSECURE", default_value_t = false)]
    pub metrics_insecure: bool,
}

impl MetricsAuthArgs {
    /// `--metrics-insecure`'s check (anyone), said in the log.
    pub fn auth_insecure(&self) -> std::sync::Arc<crate::faces::metrics_auth::MetricsAuth> {
        tracing::warn!(
            "--metrics-insecure: /metrics and the status page are served to anyone who reaches the metrics port"
        );
        crate::faces::metrics_auth::MetricsAuth::insecure()
    }

    /// The check in front of /metrics and /status*, reviewing tokens with `client`.
    pub fn auth(
        &self,
        client: &kube::Client,
    ) -> std::sync::Arc<crate::faces::metrics_auth::MetricsAuth> {
        if self.metrics_insecure {
            return self.auth_insecure();
        }
        crate::faces::metrics_auth::MetricsAuth::kubernetes(client.clone())
    }
}

/// The bounds of every HTTP listener: the discovery API and the metrics/status port of `run`,
/// the metrics port of `gateway` (docs/security.md, "Every listener bounded"). Each listener
/// counts its own connections.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerArgs {
    /// Time a client has to send a request's complete head (line and headers), counted from
    /// when the connection waits for a request, so it also bounds an idle keep-alive
    /// connection; past it the connection is closed.
    #[arg(long, env = "LISTENER_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = crate::support::durations::parse)]
    pub listener_header_read_timeout: Duration,
    /// A connection with no byte either way for this long is closed (a body trickled slowly,
    /// an answer nobody reads).
    #[arg(long, env = "LISTENER_IDLE_TIMEOUT", default_value = "60s", value_parser = crate::support::durations::parse)]
    pub listener_idle_timeout: Duration,
    /// Connections one listener holds open at most; one more is closed as soon as it is
    /// accepted.
    #[arg(long, env = "LISTENER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub listener_max_connections: u32,
    /// Connections one listener holds open at most from one IP address (so one client cannot
    /// take them all; a crawler host with many workers, a NAT or a gateway replica is one
    /// address, hence far more than a browser's handful).
    #[arg(long, env = "LISTENER_MAX_CONNECTIONS_PER_PEER", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub listener_max_connections_per_peer: u32,
    /// Bytes of a request's head (line and headers) one connection may send; more is answered
    /// 431 and closed. At least 8 KiB.
    #[arg(long, env = "LISTENER_MAX_HEAD_BYTES", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(8192..=16_777_216))]
    pub listener_max_head_bytes: u32,
}

impl ListenerArgs {
    pub fn bounds(&self) -> anyhow::Result<crate::support::listener::ListenerBounds> {
        anyhow::ensure!(
            !self.listener_header_read_timeout.is_zero() && !self.listener_idle_timeout.is_zero(),
            "--listener-header-read-timeout and --listener-idle-timeout must be above zero"
        );
        Ok(crate::support::listener::ListenerBounds {
            header_read_timeout: self.listener_header_read_timeout,
            idle_timeout: self.listener_idle_timeout,
            max_connections: self.listener_max_connections as usize,
            max_connections_per_peer: self.listener_max_connections_per_peer as usize,
            max_head_bytes: self.listener_max_head_bytes as usize,
        })
    }
}

/// What the leader offers the gateway (`proxy-operator gateway`, docs/gateway.md).
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayAccessArgs {
    /// The token gateway replicas present (from the Secret both Deployments read). Without it
    /// the discovery API has no gateway routes.
    #[arg(long, env = "GATEWAY_TOKEN", hide_env_values = true)]
    pub gateway_token: Option<String>,
    /// Open gateway connections one proxy carries at most; past it the gateway uses another.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS_PER_PROXY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub gateway_max_connections_per_proxy: u32,
    /// Plain-HTTP response statuses the gateway takes for "this site blocked the proxy" (comma
    /// separated): the proxy cools down for that site as after a `blocked` report.
    #[arg(long, env = "GATEWAY_BLOCK_STATUSES", default_value = "403,429", value_parser = parse_statuses)]
    pub gateway_block_statuses: Statuses,
}

/// HTTP statuses from a comma-separated list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statuses(pub Vec<u16>);

pub(crate) fn parse_statuses(value: &str) -> Result<Statuses, String> {
    let mut statuses = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u16>() {
            Ok(s) if (100..=599).contains(&s) => statuses.push(s),
            _ => {
                return Err(format!(
                    "`{part}` is not an HTTP status (100 to 599); e.g. 403,429"
                ));
            }
        }
    }
    Ok(Statuses(statuses))
}

impl GatewayAccessArgs {
    /// The gateway's door, when a token is set (blank counts as unset).
    pub fn access(&self) -> Option<crate::leasing::leases::api::GatewayAccess> {
        let token = self.gateway_token.as_deref().map(str::trim)?;
        if token.is_empty() {
            return None;
        }
        Some(crate::leasing::leases::api::GatewayAccess {
            token: token.to_string(),
            max_connections_per_proxy: self.gateway_max_connections_per_proxy,
            block_statuses: self.gateway_block_statuses.0.clone(),
        })
    }
}

/// Where plugins and the providers config come from, and what a plugin call may use.
#[derive(Debug, Clone, clap::Args)]
pub struct PluginArgs {
    /// The providers config (YAML): provider instances, their plugin, config and grants.
    #[arg(long, env = "PROVIDERS_CONFIG")]
    pub providers_config: PathBuf,
    /// Directory of the built-in provider plugins (`<type>.wasm`).
    #[arg(long, env = "PLUGINS_DIR", default_value = "/plugins")]
    pub plugins_dir: PathBuf,
    /// ConfigMap (in the operator's namespace) whose binaryData `<type>.wasm[.gz]` are plugins,
    /// watched and hot-loaded; they take precedence over the plugins directory.
    #[arg(long, env = "PLUGINS_CONFIGMAP")]
    pub plugins_configmap: Option<String>,
    /// The ConfigMap (in the operator's namespace) the providers config is mounted from; no
    /// plugin may create, change or delete it.
    #[arg(long, env = "PROVIDERS_CONFIGMAP", default_value = "providers-config")]
    pub providers_configmap: String,
    /// How often the providers config file is re-read for changes (`0s`: never).
    #[arg(long, env = "PROVIDERS_CONFIG_RELOAD_INTERVAL", default_value = "10s", value_parser = crate::support::durations::parse)]
    pub providers_config_reload_interval: Duration,
    /// Plugin instances the pooling allocator keeps ready (0: on-demand allocation).
    #[arg(long, env = "PLUGIN_POOL_INSTANCES", default_value_t = 64)]
    pub plugin_pool_instances: u32,
    /// Memory one plugin call may hold (all its linear memories and tables), MiB.
    #[arg(long, env = "PLUGIN_MEMORY_LIMIT_MIB", default_value_t = 128)]
    pub plugin_memory_limit_mib: usize,
    /// Memory all plugin calls in flight may hold together, MiB; the default leaves room for
    /// the operator itself inside the Deployment's 512 Mi limit.
    #[arg(long, env = "PLUGIN_MEMORY_TOTAL_MIB", default_value_t = 384)]
    pub plugin_memory_total_mib: usize,
    /// CPU time a plugin call may use, milliseconds.
    #[arg(long, env = "PLUGIN_CPU_BUDGET_MS", default_value_t = 2000)]
    pub plugin_cpu_budget_ms: u64,
    /// Wall-clock limit of a plugin call including host waits, seconds.
    #[arg(long, env = "PLUGIN_CALL_TIMEOUT_SECONDS", default_value_t = 60)]
    pub plugin_call_timeout_seconds: u64,
    /// Cache of compiled plugins (must be private to the operator's user).
    #[arg(long, env = "PLUGIN_CACHE_DIR")]
    pub plugin_cache_dir: Option<PathBuf>,
}

/// Leader election among replicas, and the operator's own namespace.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaderArgs {
    /// Run as one of several replicas: only the holder of a Lease reconciles and serves leases.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// The operator's own namespace: its leader Lease, its record of abandoned instances, the
    /// providers ConfigMap and the plugins' own objects live there (`--leader-election-namespace`
    /// is an older name of this flag).
    #[arg(
        long,
        alias = "leader-election-namespace",
        env = "POD_NAMESPACE",
        default_value = "default"
    )]
    pub operator_namespace: String,
    /// This replica's identity in the Lease (default: the host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// Seconds a leader's claim lasts without renewal; a standby takes over after this.
    #[arg(long, env = "LEADER_ELECTION_LEASE_SECONDS", default_value_t = 15)]
    pub leader_election_lease_seconds: u64,
    /// This replica's Pod (in the Lease's namespace): while it serves leases, the leader labels
    /// it `proxy-operator.dev/leader=true`, which the discovery Service selects. Unset (outside
    /// a cluster), no Pod is labelled.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
}

/// The orphan garbage collector.
#[derive(Debug, Clone, clap::Args)]
pub struct GcArgs {
    /// Time between orphan GC passes (e.g. `5m`).
    #[arg(long, env = "GC_INTERVAL", default_value = "5m", value_parser = crate::support::durations::parse)]
    pub gc_interval: Duration,
    /// Orphans younger than this are kept (their Proxy may not be visible yet).
    #[arg(long, env = "GC_MIN_AGE", default_value = "15m", value_parser = crate::support::durations::parse)]
    pub gc_min_age: Duration,
    /// Log and count orphans without deleting them.
    #[arg(long, env = "GC_DRY_RUN", default_value_t = false)]
    pub gc_dry_run: bool,
    /// With --proxy-namespace, also collect instances owned by Proxies of other namespaces
    /// (which this operator cannot see, so it takes all of them for orphans).
    #[arg(long, env = "GC_ALLOW_NAMESPACED", default_value_t = false)]
    pub gc_allow_namespaced: bool,
}

/// Provider health checks (ProviderHealth objects).
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderCheckArgs {
    /// Time between provider health checks.
    #[arg(long, env = "PROVIDER_CHECK_INTERVAL", default_value = "1m", value_parser = crate::support::durations::parse)]
    pub provider_check_interval: Duration,
    /// Deadline of one provider check (default: the smaller of 15s and the interval).
    #[arg(long, env = "PROVIDER_CHECK_TIMEOUT", value_parser = crate::support::durations::parse)]
    pub provider_check_timeout: Option<Duration>,
}

/// Health probes through each proxy.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// Time between health probe rounds; `0s` turns probing off (provisioned means healthy).
    #[arg(long, env = "HEALTH_INTERVAL", default_value = "15s", value_parser = crate::support::durations::parse)]
    pub health_interval: Duration,
    /// Health probes running at once.
    #[arg(long, env = "HEALTH_WORKERS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub health_workers: u32,
    /// Deadline of one health probe.
    #[arg(long, env = "HEALTH_TIMEOUT", default_value = "5s", value_parser = crate::support::durations::parse)]
    pub health_timeout: Duration,
    /// `host:port` each probe asks the proxy to CONNECT to.
    #[arg(long, env = "HEALTH_TARGET", default_value = "www.google.com:443")]
    pub health_target: String,
    /// A service that answers with the caller's IP (plain text, or JSON with `ip` or `origin`),
    /// e.g. `https://api.ipify.org`: asked through each healthy proxy every 5 minutes to record
    /// its exit IP in `status.exitIP` and in leases. Off when unset.
    #[arg(long, env = "EXIT_IP_URL", value_parser = parse_exit_ip_url)]
    pub exit_ip_url: Option<String>,
    /// Consecutive failed probes that make a proxy Unhealthy.
    #[arg(long, env = "HEALTH_FAILURE_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub health_failure_threshold: u32,
    /// Consecutive successful probes that make an Unhealthy proxy Healthy again.
    #[arg(long, env = "HEALTH_SUCCESS_THRESHOLD", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub health_success_threshold: u32,
}

/// The discovery API and its lease table.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseArgs {
    /// Address of the discovery API (leases for crawlers).
    #[arg(long, env = "DISCOVERY_ADDR", default_value = "0.0.0.0:8090")]
    pub discovery_addr: SocketAddr,
    /// Bearer token crawlers present to the discovery API (from a Secret). Without it crawlers
    /// use ServiceAccount tokens (--discovery-kubernetes-auth); without either the discovery API
    /// is not served.
    #[arg(long, env = "DISCOVERY_TOKEN", hide_env_values = true)]
    pub discovery_token: Option<String>,
    /// The discovery API's certificate chain (PEM; a kubernetes.io/tls Secret's tls.crt), read
    /// again every few seconds: a renewed certificate is used for new connections. With
    /// --discovery-tls-key-file. The files may appear after the start (a Secret created later):
    /// TLS handshakes fail until then.
    #[arg(long, env = "DISCOVERY_TLS_CERT_FILE")]
    pub discovery_tls_cert_file: Option<PathBuf>,
    /// The private key of --discovery-tls-cert-file (PEM; the Secret's tls.key).
    #[arg(long, env = "DISCOVERY_TLS_KEY_FILE")]
    pub discovery_tls_key_file: Option<PathBuf>,
    /// Serve the discovery API over plain HTTP, without TLS: bearer tokens then cross the network
    /// in clear. For a local run, or a network that encrypts by itself (a service mesh).
    #[arg(long, env = "DISCOVERY_PLAIN_HTTP", default_value_t = false)]
    pub discovery_plain_http: bool,
    /// Lease lifetime when a crawler does not ask for one.
    #[arg(long, env = "DEFAULT_LEASE_TTL", default_value = "5m", value_parser = crate::support::durations::parse)]
    pub default_lease_ttl: Duration,
    /// Longest lease granted; longer requests are clamped.
    #[arg(long, env = "MAX_LEASE_TTL", default_value = "1h", value_parser = crate::support::durations::parse)]
    pub max_lease_ttl: Duration,
    /// How long a proxy reported `blocked` is not leased.
    #[arg(long, env = "LEASE_COOLDOWN", default_value = "10m", value_parser = crate::support::durations::parse)]
    pub lease_cooldown: Duration,
    /// Consecutive `failure` reports on a proxy that make the health engine probe it at once.
    #[arg(long, env = "LEASE_FAILURE_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub lease_failure_threshold: u32,
    /// Sticky sessions held in memory (one unused the longest forgotten first; ~180 bytes each).
    #[arg(long, env = "MAX_SESSIONS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_sessions: u64,
    /// Per-target cooldowns held in memory (~90 bytes each); a block past it cools the whole
    /// proxy down.
    #[arg(long, env = "MAX_TARGET_COOLDOWNS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub max_target_cooldowns: u64,
    /// Targets one proxy may cool down for at once; a block past it cools the whole proxy down.
    #[arg(long, env = "MAX_TARGETS_PER_PROXY", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_targets_per_proxy: u64,
    /// `sync`: a grant is answered only once the lease table holding it is in its ConfigMap,
    /// so a failover or a crash never forgets a granted lease. `async`: answered at once,
    /// written behind every --lease-persist-interval (faster; a crash forgets that much).
    #[arg(long, env = "LEASE_DURABILITY", value_enum, default_value = "sync")]
    pub lease_durability: Durability,
    /// With `--lease-durability sync`: a grant whose write takes longer is refused (503
    /// `lease-not-stored`) instead of answered.
    #[arg(long, env = "LEASE_COMMIT_TIMEOUT", default_value = "5s", value_parser = crate::support::durations::parse)]
    pub lease_commit_timeout: Duration,
    /// With `--lease-durability async`: how often the lease table is written to its ConfigMap
    /// (a crash loses at most this much).
    #[arg(long, env = "LEASE_PERSIST_INTERVAL", default_value = "5s", value_parser = crate::support::durations::parse)]
    pub lease_persist_interval: Duration,
}
/// Who may call the discovery API (docs/security.md, "Who may lease what").
#[derive(Debug, Clone, clap::Args)]
pub struct DiscoveryAuthArgs {
    /// Limits the static token (DISCOVERY_TOKEN) to these ProxyPools: `namespace/name` or
    /// `namespace/*`, comma-separated. Unset: every pool and every proxy.
    #[arg(long, env = "DISCOVERY_TOKEN_POOLS")]
    pub discovery_token_pools: Option<String>,
    /// Accept ServiceAccount tokens: the API server reviews each (TokenReview) and RBAC decides
    /// which pools it may lease from (SubjectAccessReview of `create` on `proxypools/lease`).
    #[arg(long, env = "DISCOVERY_KUBERNETES_AUTH", default_value_t = true, action = clap::ArgAction::Set)]
    pub discovery_kubernetes_auth: bool,
    /// The audience a ServiceAccount token must be for (a projected serviceAccountToken
    /// volume); empty: the API server's own audience (the Pod's default token).
    #[arg(
        long,
        env = "DISCOVERY_TOKEN_AUDIENCE",
        default_value = "proxy-operator"
    )]
    pub discovery_token_audience: String,
    /// How long an accepted token and an allowed decision are reused before they are reviewed
    /// again: an RBAC change takes effect within this long.
    #[arg(long, env = "DISCOVERY_AUTH_CACHE_TTL", default_value = "20s", value_parser = crate::support::durations::parse)]
    pub discovery_auth_cache_ttl: Duration,
    /// How long a refused token and a denied decision are reused.
    #[arg(long, env = "DISCOVERY_AUTH_DENY_CACHE_TTL", default_value = "3s", value_parser = crate::support::durations::parse)]
    pub discovery_auth_deny_cache_ttl: Duration,
    /// Deadline of one TokenReview or SubjectAccessReview; past it the request gets 503
    /// `auth-unavailable`.
    #[arg(long, env = "DISCOVERY_AUTH_TIMEOUT", default_value = "3s", value_parser = crate::support::durations::parse)]
    pub discovery_auth_timeout: Duration,
    /// Accept teams' gateway credentials: Secrets of type proxy-operator.dev/gateway-credential
    /// labelled proxy-operator.dev/gateway-credential=true, watched (docs/gateway.md, "Team
    /// credentials").
    #[arg(long, env = "DISCOVERY_TEAM_CREDENTIALS", default_value_t = true, action = clap::ArgAction::Set)]
    pub discovery_team_credentials: bool,
}

impl DiscoveryAuthArgs {
    /// The static token's pools; blank counts as unset.
    pub fn token_pools(&self) -> anyhow::Result<Option<TokenPools>> {
        self.discovery_token_pools
            .as_deref()
            .filter(|v| !v.trim().is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|e| anyhow::anyhow!("--discovery-token-pools: {e}"))
            })
            .transpose()
    }

    /// How ServiceAccount tokens are checked; `None` when they are not accepted.
    pub fn kube_options(&self) -> anyhow::Result<Option<KubeAuthOptions>> {
        if !self.discovery_kubernetes_auth {
            return Ok(None);
        }
        anyhow::ensure!(
            !self.discovery_auth_timeout.is_zero(),
            "--discovery-auth-timeout must be more than 0s (e.g. 3s)"
        );
        anyhow::ensure!(
            self.discovery_auth_cache_ttl <= Duration::from_secs(300)
                && self.discovery_auth_deny_cache_ttl <= Duration::from_secs(300),
            "--discovery-auth-cache-ttl and --discovery-auth-deny-cache-ttl are at most 5m (a revoked RoleBinding must take effect)"
        );
        Ok(Some(KubeAuthOptions {
            allow_ttl: self.discovery_auth_cache_ttl,
            deny_ttl: self.discovery_auth_deny_cache_ttl,
            timeout: self.discovery_auth_timeout,
            audience: self.discovery_token_audience.trim().to_string(),
            ..KubeAuthOptions::default()
        }))
    }
}

/// How the discovery API is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Tls(crate::support::tls::CertFiles),
    PlainHttp,
}

/// The discovery API's transport from its three flags (blank paths count as unset).
pub fn transport(
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    plain_http: bool,
) -> anyhow::Result<Transport> {
    fn set(p: Option<&std::path::Path>) -> Option<&std::path::Path> {
        p.filter(|p| !p.as_os_str().is_empty())
    }
    match (set(cert), set(key), plain_http) {
        (Some(_), _, true) | (_, Some(_), true) => anyhow::bail!(
            "--discovery-plain-http and --discovery-tls-cert-file/--discovery-tls-key-file contradict each other; pass one"
        ),
        (None, None, true) => Ok(Transport::PlainHttp),
        (Some(cert), Some(key), false) => Ok(Transport::Tls(crate::support::tls::CertFiles {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })),
        (Some(_), None, false) => anyhow::bail!(
            "--discovery-tls-cert-file needs --discovery-tls-key-file (the Secret's tls.key)"
        ),
        (None, Some(_), false) => anyhow::bail!(
            "--discovery-tls-key-file needs --discovery-tls-cert-file (the Secret's tls.crt)"
        ),
        (None, None, false) => anyhow::bail!(
            "the discovery API needs a certificate: --discovery-tls-cert-file and --discovery-tls-key-file (a kubernetes.io/tls Secret's tls.crt and tls.key, deploy/operator.yaml mounts one), or --discovery-plain-http to serve it without TLS (a local run)"
        ),
    }
}

pub(crate) fn parse_exit_ip_url(value: &str) -> Result<String, String> {
    match reqwest::Url::parse(value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(value.to_string())
        }
        Ok(_) => Err(format!(
            "`{value}` is not an http(s) URL with a host; e.g. https://api.ipify.org"
        )),
        Err(e) => Err(format!("`{value}`: {e}; e.g. https://api.ipify.org")),
    }
}

impl HealthArgs {
    /// The health engine's options; a target that is not `host:port` is refused.
    pub fn options(&self) -> anyhow::Result<HealthOptions> {
        anyhow::ensure!(
            self.health_target
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
            "--health-target `{}` must be host:port (e.g. www.google.com:443)",
            self.health_target
        );
        Ok(HealthOptions {
            interval: self.health_interval,
            workers: self.health_workers as usize,
            timeout: self.health_timeout,
            target: self.health_target.clone(),
            failure_threshold: self.health_failure_threshold,
            success_threshold: self.health_success_threshold,
            status_refresh: Duration::from_secs(300).max(self.health_interval),
            exit_ip_url: self.exit_ip_url.clone(),
        })
    }

    /// Whether probes run at all (`--health-interval 0s` turns them off).
    pub fn probing(&self) -> bool {
        !self.health_interval.is_zero()
    }
}

impl LeaseArgs {
    /// The lease table's options; contradictory TTLs are refused.
    pub fn options(&self) -> anyhow::Result<LeaseOptions> {
        anyhow::ensure!(
            self.default_lease_ttl <= self.max_lease_ttl,
            "--default-lease-ttl ({}) is longer than --max-lease-ttl ({}); lower one or raise the other",
            crate::support::durations::format(self.default_lease_ttl),
            crate::support::durations::format(self.max_lease_ttl)
        );
        anyhow::ensure!(
            !self.lease_persist_interval.is_zero(),
            "--lease-persist-interval must be more than 0s (e.g. 5s)"
        );
        anyhow::ensure!(
            !self.lease_commit_timeout.is_zero(),
            "--lease-commit-timeout must be more than 0s (e.g. 5s)"
        );
        Ok(LeaseOptions {
            default_ttl: self.default_lease_ttl,
            max_ttl: self.max_lease_ttl,
            cooldown: self.lease_cooldown,
            failure_threshold: self.lease_failure_threshold,
            max_sessions: self.max_sessions as usize,
            max_target_cooldowns: self.max_target_cooldowns as usize,
            max_targets_per_proxy: self.max_targets_per_proxy as usize,
        })
    }

    /// TLS with the certificate files, or plain HTTP when asked: one of the two, explicitly.
    pub fn transport(&self) -> anyhow::Result<Transport> {
        transport(
            self.discovery_tls_cert_file.as_deref(),
            self.discovery_tls_key_file.as_deref(),
            self.discovery_plain_http,
        )
    }

    /// The bearer token, when one is set (blank counts as unset).
    pub fn token(&self) -> Option<&str> {
        self.discovery_token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }
}

impl GcArgs {
    pub fn options(
        &self,
        namespace: Option<String>,
        abandoned: Option<crate::lifecycle::abandoned::AbandonedRecord>,
    ) -> GcOptions {
        GcOptions {
            interval: self.gc_interval,
            min_age: self.gc_min_age,
            dry_run: self.gc_dry_run,
            namespace,
            allow_namespaced: self.gc_allow_namespaced,
            parallelism: 4,
            abandoned,
        }
    }
}

impl ProviderCheckArgs {
    /// The deadline of one check: the flag, or the smaller of 15 s and the interval.
    pub fn timeout(&self) -> Duration {
        self.provider_check_timeout
            .unwrap_or_else(|| self.provider_check_interval.min(Duration::from_secs(15)))
    }
}

impl LeaderArgs {
    /// The election of the Lease `<operator-id>-leader`.
    pub fn election(&self, operator_id: &str) -> LeaderElection {
        LeaderElection {
            namespace: self.operator_namespace.clone(),
            lease_name: format!("{operator_id}-leader"),
            identity: self
                .leader_election_identity
                .clone()
                .unwrap_or_else(default_identity),
            lease_seconds: self.leader_election_lease_seconds.max(2),
            // Renewals start after a third of the lease (every 5 s of 15, as client-go's
            // leader election retries every 2 s of 15): a renewal refused by a throttling API
            // server (429) has until the fence's margin to get through, not a few seconds.
            renew_before_seconds: (self.leader_election_lease_seconds * 2 / 3).clamp(
                1,
                self.leader_election_lease_seconds.saturating_sub(1).max(1),
            ),
        }
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "proxy-operator".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::{Transport, parse_exit_ip_url, transport};
    use std::path::Path;

    #[test]
    fn the_discovery_api_is_tls_or_plain_http_when_asked() {
        let (c, k) = (
            Some(Path::new("/tls/tls.crt")),
            Some(Path::new("/tls/tls.key")),
        );
        let blank = Some(Path::new(""));
        // (cert, key, plain, Ok(tls?) or the words of the error)
        let cases = [
            (c, k, false, Ok(true)),
            (None, None, true, Ok(false)),
            (blank, blank, true, Ok(false)),
            (None, None, false, Err("needs a certificate")),
            (
                blank,
                None,
                false,
                Err("--discovery-plain-http to serve it without TLS"),
            ),
            (c, None, false, Err("needs --discovery-tls-key-file")),
            (None, k, false, Err("needs --discovery-tls-cert-file")),
            (c, k, true, Err("contradict")),
            (None, k, true, Err("contradict")),
        ];
        for (cert, key, plain, expected) in cases {
            let got = transport(cert, key, plain);
            match (expected, got) {
                (Ok(tls), Ok(t)) => assert_eq!(matches!(t, Transport::Tls(_)), tls),
                (Err(words), Err(e)) => assert!(e.to_string().contains(words), "{e}"),
                (expected, got) => panic!("{cert:?} {key:?} {plain}: {expected:?} but {got:?}"),
            }
        }
    }

    #[test]
    fn an_exit_ip_url_must_be_http_with_a_host() {
        assert_eq!(
            parse_exit_ip_url("https://api.ipify.org").as_deref(),
            Ok("https://api.ipify.org")
        );
        for bad in ["api.ipify.org", "ftp://example.com/ip", "file:///etc/hosts"] {
            let error = parse_exit_ip_url(bad).unwrap_err();
            assert!(
                error.contains(bad) && error.contains("e.g. https://"),
                "{error}"
            );
        }
    }
}
