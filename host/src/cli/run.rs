//! `proxy-operator run`: the operator itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::http::StatusCode;
use axum::routing::get;
use kube::CustomResourceExt;

use crate::api::Proxy;
use crate::capabilities::libvirt::{LibvirtHub, MaterialSource};
use crate::config::ProvidersConfig;
use crate::controller::{self, Context};
use crate::gc::{self, GcMetrics, GcOptions};
use crate::health::{HealthEngine, HealthOptions, ProbeMetrics};
use crate::leader::{self, LeaderElection};
use crate::leases::{self, Discovery, LeaseMetrics, LeaseOptions, LeasePersistence, LeaseStore};
use crate::metrics::ReconcileMetrics;
use crate::plugins::{EngineOptions, PluginEngine};
use crate::providerhealth::{self, HealthMetrics};
use crate::registry::{PluginRegistry, RegistryMetrics, RegistryOptions};

/// Flags of `run`; each has an environment fallback for Deployments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
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
    /// How often the providers config file is re-read for changes (`0s`: never).
    #[arg(long, env = "PROVIDERS_CONFIG_RELOAD_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub providers_config_reload_interval: Duration,
    /// Watch Proxies in this namespace only (default: all namespaces).
    #[arg(long, env = "PROXY_NAMESPACE")]
    pub proxy_namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Identity written on every instance, so two installations never collect each other's.
    #[arg(long, env = "OPERATOR_ID", default_value = "proxy-operator")]
    pub operator_id: String,
    /// Plugin instances the pooling allocator keeps ready (0: on-demand allocation).
    #[arg(long, env = "PLUGIN_POOL_INSTANCES", default_value_t = 64)]
    pub plugin_pool_instances: u32,
    /// Linear memory a plugin call may use, MiB.
    #[arg(long, env = "PLUGIN_MEMORY_LIMIT_MIB", default_value_t = 128)]
    pub plugin_memory_limit_mib: usize,
    /// CPU time a plugin call may use, milliseconds.
    #[arg(long, env = "PLUGIN_CPU_BUDGET_MS", default_value_t = 2000)]
    pub plugin_cpu_budget_ms: u64,
    /// Wall-clock limit of a plugin call including host waits, seconds.
    #[arg(long, env = "PLUGIN_CALL_TIMEOUT_SECONDS", default_value_t = 60)]
    pub plugin_call_timeout_seconds: u64,
    /// Cache of compiled plugins (must be private to the operator's user).
    #[arg(long, env = "PLUGIN_CACHE_DIR")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Run as one of several replicas: only the holder of a Lease reconciles and reports ready.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,
    /// Namespace of the Lease (usually the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// This replica's identity in the Lease (default: the host name and process id).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// Seconds a leader's claim lasts without renewal; a standby takes over after this.
    #[arg(long, env = "LEADER_ELECTION_LEASE_SECONDS", default_value_t = 15)]
    pub leader_election_lease_seconds: u64,
    /// Time between orphan GC passes (e.g. `5m`).
    #[arg(long, env = "GC_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub gc_interval: Duration,
    /// Orphans younger than this are kept (their Proxy may not be visible yet).
    #[arg(long, env = "GC_MIN_AGE", default_value = "15m", value_parser = humantime::parse_duration)]
    pub gc_min_age: Duration,
    /// Log and count orphans without deleting them.
    #[arg(long, env = "GC_DRY_RUN", default_value_t = false)]
    pub gc_dry_run: bool,
    /// With --proxy-namespace, also collect instances owned by Proxies of other namespaces
    /// (which this operator cannot see, so it takes all of them for orphans).
    #[arg(long, env = "GC_ALLOW_NAMESPACED", default_value_t = false)]
    pub gc_allow_namespaced: bool,
    /// Time between provider health checks.
    #[arg(long, env = "PROVIDER_CHECK_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub provider_check_interval: Duration,
    /// Deadline of one provider check (default: the smaller of 15s and the interval).
    #[arg(long, env = "PROVIDER_CHECK_TIMEOUT", value_parser = humantime::parse_duration)]
    pub provider_check_timeout: Option<Duration>,
    /// Time between health probe rounds; `0s` turns probing off (provisioned means healthy).
    #[arg(long, env = "HEALTH_INTERVAL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub health_interval: Duration,
    /// Health probes running at once.
    #[arg(long, env = "HEALTH_WORKERS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub health_workers: u32,
    /// Deadline of one health probe.
    #[arg(long, env = "HEALTH_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
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
    /// Address of the discovery API (leases for crawlers).
    #[arg(long, env = "DISCOVERY_ADDR", default_value = "0.0.0.0:8090")]
    pub discovery_addr: SocketAddr,
    /// Bearer token crawlers present to the discovery API (from a Secret). Without it the
    /// discovery API is not served.
    #[arg(long, env = "DISCOVERY_TOKEN", hide_env_values = true)]
    pub discovery_token: Option<String>,
    /// Lease lifetime when a crawler does not ask for one.
    #[arg(long, env = "DEFAULT_LEASE_TTL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub default_lease_ttl: Duration,
    /// Longest lease granted; longer requests are clamped.
    #[arg(long, env = "MAX_LEASE_TTL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub max_lease_ttl: Duration,
    /// How long a proxy reported `blocked` is not leased.
    #[arg(long, env = "LEASE_COOLDOWN", default_value = "10m", value_parser = humantime::parse_duration)]
    pub lease_cooldown: Duration,
    /// Consecutive `failure` reports on a proxy that make the health engine probe it at once.
    #[arg(long, env = "LEASE_FAILURE_THRESHOLD", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub lease_failure_threshold: u32,
    /// How often the lease table is written to its ConfigMap (a crash loses at most this much).
    #[arg(long, env = "LEASE_PERSIST_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub lease_persist_interval: Duration,
}

fn parse_exit_ip_url(value: &str) -> Result<String, String> {
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

impl RunArgs {
    fn health_options(&self) -> HealthOptions {
        HealthOptions {
            interval: self.health_interval,
            workers: self.health_workers as usize,
            timeout: self.health_timeout,
            target: self.health_target.clone(),
            failure_threshold: self.health_failure_threshold,
            success_threshold: self.health_success_threshold,
            status_refresh: Duration::from_secs(300).max(self.health_interval),
            exit_ip_url: self.exit_ip_url.clone(),
        }
    }

    fn lease_options(&self) -> anyhow::Result<LeaseOptions> {
        anyhow::ensure!(
            self.default_lease_ttl <= self.max_lease_ttl,
            "--default-lease-ttl ({}) is longer than --max-lease-ttl ({}); lower one or raise the other",
            humantime::format_duration(self.default_lease_ttl),
            humantime::format_duration(self.max_lease_ttl)
        );
        anyhow::ensure!(
            !self.lease_persist_interval.is_zero(),
            "--lease-persist-interval must be more than 0s (e.g. 5s)"
        );
        Ok(LeaseOptions {
            default_ttl: self.default_lease_ttl,
            max_ttl: self.max_lease_ttl,
            cooldown: self.lease_cooldown,
            failure_threshold: self.lease_failure_threshold,
        })
    }
}

/// Starts the operator and runs until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let lease_options = args.lease_options()?;
    anyhow::ensure!(
        args.health_target
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
        "--health-target `{}` must be host:port (e.g. www.google.com:443)",
        args.health_target
    );
    let registry = prometheus::Registry::new();

    // Fail fast on a broken providers config before anything else (no cluster needed for that).
    let providers_config = ProvidersConfig::load(&args.providers_config)?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let engine = PluginEngine::new(
        EngineOptions {
            pool_instances: args.plugin_pool_instances,
            memory_limit: args.plugin_memory_limit_mib << 20,
            cpu_budget: Duration::from_millis(args.plugin_cpu_budget_ms),
            call_timeout: Duration::from_secs(args.plugin_call_timeout_seconds),
            cache_dir: args.plugin_cache_dir.clone(),
            // SSH material for kvm hypervisors: Secrets in the operator's namespace, read on
            // first use; tunnel sockets in private directories under the scratch /tmp.
            libvirt: LibvirtHub::new(
                MaterialSource::Secrets {
                    client: client.clone(),
                    namespace: args.leader_election_namespace.clone(),
                },
                std::env::temp_dir(),
            ),
            kube: Some(client.clone()),
        },
        &registry,
    )?;
    tracing::info!(allocator = ?engine.allocator(), "plugin engine ready");
    warn_about_missing_ssh_secrets(&client, &args.leader_election_namespace, &providers_config)
        .await;
    let plugin_registry = PluginRegistry::start(
        engine.clone(),
        RegistryOptions {
            plugins_dir: args.plugins_dir.clone(),
            configmap: args
                .plugins_configmap
                .clone()
                .map(|name| (args.leader_election_namespace.clone(), name)),
            download_dir: args.plugin_cache_dir.as_ref().map(|d| d.join("downloads")),
        },
        &args.providers_config,
        Some(client.clone()),
        RegistryMetrics::register(&registry)?,
    )
    .await?;
    let providers = plugin_registry.providers();
    tracing::info!(providers = ?providers.current().configured_names(), "providers configured");
    let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        kube::Api::all(client.clone());
    crds.get(Proxy::crd_name()).await.with_context(|| {
        format!(
            "the CRD {} is not installed: kubectl apply -f deploy/crds/",
            Proxy::crd_name()
        )
    })?;

    let (suspects_tx, suspects) = tokio::sync::mpsc::channel(256);
    let leases = Arc::new(LeaseStore::new(
        lease_options,
        LeaseMetrics::register(&registry)?,
        Some(suspects_tx),
    ));
    let ready = Arc::new(AtomicBool::new(false));
    let server = serve_probes(
        args.metrics_addr,
        registry.clone(),
        ready.clone(),
        leases.clone(),
    )
    .await?;
    // Plugins and config follow their sources on every replica, so a standby takes over warm.
    let mut watchers = vec![tokio::spawn(
        plugin_registry
            .clone()
            .watch_configmap(client.clone(), ready.clone()),
    )];
    if !args.providers_config_reload_interval.is_zero() {
        watchers.push(tokio::spawn(
            plugin_registry
                .clone()
                .watch_config_file(args.providers_config_reload_interval),
        ));
    }

    let discovery_server = match args.discovery_token.as_deref().map(str::trim) {
        Some(token) if !token.is_empty() => Some(
            serve_discovery(
                args.discovery_addr,
                Arc::new(Discovery::new(leases.clone(), token)),
            )
            .await?,
        ),
        _ => {
            tracing::warn!(
                "DISCOVERY_TOKEN is not set: the discovery API is off; set it from a Secret to serve leases"
            );
            None
        }
    };
    let persistence = LeasePersistence::new(
        client.clone(),
        &args.leader_election_namespace,
        &format!("{}-leases", args.operator_id),
    );

    let ctx = Arc::new(
        Context::new(client.clone(), providers.clone(), &args.operator_id)
            .with_metrics(ReconcileMetrics::register(&registry)?)
            .with_health_probing(!args.health_interval.is_zero()),
    );
    let probe_metrics = ProbeMetrics::register(&registry)?;
    let (health_options, persist_interval) = (args.health_options(), args.lease_persist_interval);
    let namespace = args.proxy_namespace.clone();
    let gc_options = GcOptions {
        interval: args.gc_interval,
        min_age: args.gc_min_age,
        dry_run: args.gc_dry_run,
        namespace: args.proxy_namespace.clone(),
        allow_namespaced: args.gc_allow_namespaced,
        parallelism: 4,
    };
    let gc_metrics = GcMetrics::register(&registry)?;
    let health_metrics = HealthMetrics::register(&registry)?;
    let check_timeout = args
        .provider_check_timeout
        .unwrap_or_else(|| args.provider_check_interval.min(Duration::from_secs(15)));
    let (check_interval, operator_id) = (args.provider_check_interval, args.operator_id.clone());
    let work_client = client.clone();
    // GC and provider checks run only where reconciles run: on the leader.
    let reconcile = move || async move {
        // The lease table first: serving grants before it is restored could lease twice.
        if let Err(e) = persistence.restore_into(&leases).await {
            tracing::error!(configmap = %persistence.name(), "cannot read the persisted lease table, starting empty: {e}");
            leases.restore(Default::default());
        }
        let maintain = tokio::spawn(leases::persist::maintain(
            leases.clone(),
            persistence.clone(),
            persist_interval,
        ));
        let probes = tokio::spawn(
            HealthEngine::new(
                work_client.clone(),
                providers.clone(),
                leases.clone(),
                health_options,
                probe_metrics,
            )
            .run(namespace.clone(), suspects),
        );
        let gc = tokio::spawn(gc::run(
            work_client.clone(),
            providers.clone(),
            operator_id.clone(),
            gc_options,
            gc_metrics,
        ));
        let health = tokio::spawn(providerhealth::run(
            work_client,
            providers,
            operator_id,
            check_interval,
            check_timeout,
            health_metrics,
        ));
        tracing::info!(namespace = ?namespace, "reconciling Proxies");
        controller::run(ctx, namespace.as_deref()).await;
        gc.abort();
        health.abort();
        probes.abort();
        maintain.abort();
        // Graceful stop: the last changes reach the cluster before the next leader restores.
        if let Err(e) = persistence.flush(&leases).await {
            tracing::error!(configmap = %persistence.name(), "cannot persist the lease table on shutdown: {e}");
        }
        leases.close();
    };
    let result = if args.leader_election {
        let election = LeaderElection {
            namespace: args.leader_election_namespace.clone(),
            lease_name: format!("{}-leader", args.operator_id),
            identity: args
                .leader_election_identity
                .clone()
                .unwrap_or_else(default_identity),
            lease_seconds: args.leader_election_lease_seconds.max(2),
            renew_before_seconds: (args.leader_election_lease_seconds / 3).max(1),
        };
        leader::lead(client, &election, ready.clone(), reconcile).await
    } else {
        ready.store(true, Ordering::Relaxed);
        reconcile().await;
        Ok(())
    };
    tracing::info!("shutting down");
    server.abort();
    for watcher in watchers {
        watcher.abort();
    }
    if let Some(discovery) = discovery_server {
        discovery.abort();
    }
    result
}

/// A kvm provider instance without its SSH Secret still starts: only its calls fail (and recover
/// when the Secret appears). Say so once at start, where an operator reads first.
async fn warn_about_missing_ssh_secrets(
    client: &kube::Client,
    namespace: &str,
    config: &ProvidersConfig,
) {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    for entry in &config.providers {
        let Some(grant) = &entry.grants.libvirt else {
            continue;
        };
        match secrets.get_opt(&grant.ssh_secret).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(
                provider = %entry.name,
                secret = %format!("{namespace}/{}", grant.ssh_secret),
                "the SSH Secret for this provider's hypervisors does not exist; its Proxies wait until it is created (see docs/providers/kvm.md)"
            ),
            Err(e) => tracing::warn!(
                provider = %entry.name,
                secret = %format!("{namespace}/{}", grant.ssh_secret),
                "cannot read the SSH Secret for this provider's hypervisors: {e}"
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

async fn serve_probes(
    addr: SocketAddr,
    registry: prometheus::Registry,
    ready: Arc<AtomicBool>,
    leases: Arc<LeaseStore>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            // Ready means serving: the leader with its lease table restored, so a Service never
            // routes a crawler to a replica that would answer 503.
            get(move || {
                let (ready, leases) = (ready.clone(), leases.clone());
                async move {
                    if !ready.load(Ordering::Relaxed) {
                        (StatusCode::SERVICE_UNAVAILABLE, "starting")
                    } else if !leases.is_ready() {
                        (StatusCode::SERVICE_UNAVAILABLE, "restoring the lease table")
                    } else {
                        (StatusCode::OK, "ready")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut text = String::new();
                    match prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut text)
                    {
                        Ok(()) => (StatusCode::OK, text),
                        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-addr {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("probe server failed: {e}");
        }
    }))
}

async fn serve_discovery(
    addr: SocketAddr,
    discovery: Arc<Discovery>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --discovery-addr {addr}"))?;
    tracing::info!(%addr, "serving the discovery API");
    Ok(tokio::spawn(leases::serve(
        listener,
        leases::router(discovery),
    )))
}

#[cfg(test)]
mod tests {
    use super::parse_exit_ip_url;

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
