//! `proxy-operator gateway`: one proxy endpoint for any client (docs/gateway.md). A process of its
//! own, holding no state: every route is the leader's choice, asked through the discovery API.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::faces::metrics_auth::MetricsAuth;
use crate::leasing::gateway::leader::{LeaderRoutes, LeaderTrust};
use crate::leasing::gateway::metrics::GatewayMetrics;
use crate::leasing::gateway::options::GatewayOptions;
use crate::leasing::gateway::policy::{DestinationPolicy, HostSuffixes, Networks, Ports};
use crate::leasing::gateway::prefetch::Prefetching;
use crate::leasing::gateway::server::Gateway;

/// A replica whose last load report to the leader is older than this is not ready: it could not
/// route either.
const LEADER_STALE_AFTER: Duration = Duration::from_secs(15);

/// Flags of `gateway`; each has an environment fallback for its Deployment.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// The discovery API of the operator (its Service, which routes to the leader).
    #[arg(long, env = "DISCOVERY_URL")]
    pub discovery_url: String,
    /// The CA certificate(s) (PEM) the discovery API's certificate is checked against, and only
    /// they (its TLS Secret's ca.crt). Unset, an https --discovery-url is checked against the
    /// system's roots.
    #[arg(long, env = "DISCOVERY_CA_FILE")]
    pub discovery_ca_file: Option<std::path::PathBuf>,
    /// Call the discovery API over plain HTTP (an http:// --discovery-url): only when the
    /// operator serves it so (--discovery-plain-http there), for a local run.
    #[arg(long, env = "DISCOVERY_PLAIN_HTTP", default_value_t = false)]
    pub discovery_plain_http: bool,
    #[command(flatten)]
    pub metrics_auth: crate::faces::operator::args::MetricsAuthArgs,
    /// The gateway's own token, the one the operator has as GATEWAY_TOKEN (from their Secret).
    #[arg(long, env = "GATEWAY_TOKEN", hide_env_values = true)]
    pub gateway_token: String,
    /// This replica's id at the leader (its Pod's name); default: the host name.
    #[arg(long, env = "GATEWAY_REPLICA")]
    pub replica: Option<String>,
    /// HTTP/1.1 forward proxy and CONNECT.
    #[arg(long, env = "GATEWAY_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// SOCKS5.
    #[arg(long, env = "GATEWAY_SOCKS_ADDR", default_value = "0.0.0.0:1080")]
    pub socks_addr: SocketAddr,
    /// HTTP/1.1 forward proxy and CONNECT over TLS (`curl --proxy https://…`): served when
    /// --tls-cert-file and --tls-key-file are given.
    #[arg(long, env = "GATEWAY_HTTPS_ADDR", default_value = "0.0.0.0:8443")]
    pub https_addr: SocketAddr,
    /// The HTTPS port's certificate chain (PEM; a kubernetes.io/tls Secret's tls.crt), read
    /// again every few seconds: a renewal reaches new connections.
    #[arg(long, env = "GATEWAY_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,
    /// The private key of --tls-cert-file (PEM; the Secret's tls.key).
    #[arg(long, env = "GATEWAY_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Destination ports clients may reach, comma-separated.
    #[arg(long, env = "GATEWAY_ALLOWED_PORTS", default_value = "80,443")]
    pub allowed_ports: Ports,
    /// Non-public networks clients may reach anyway (CIDRs, comma-separated), e.g. a test
    /// site's; by default none.
    #[arg(long, env = "GATEWAY_ALLOWED_NETWORKS", default_value = "")]
    pub allowed_networks: Networks,
    /// Host names clients may reach although they look internal (`svc`, `example.internal`),
    /// comma-separated suffixes; by default none.
    #[arg(long, env = "GATEWAY_ALLOWED_HOST_SUFFIXES", default_value = "")]
    pub allowed_host_suffixes: HostSuffixes,
    /// Client connections open at once, in all.
    #[arg(long, env = "GATEWAY_MAX_CLIENTS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_clients: u64,
    /// Client connections open at once with one token.
    #[arg(long, env = "GATEWAY_MAX_CLIENTS_PER_TOKEN", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_clients_per_token: u32,
    /// A tunnel or request with no byte either way for this long is closed.
    #[arg(long, env = "GATEWAY_IDLE_TIMEOUT", default_value = "300s", value_parser = crate::support::durations::parse)]
    pub idle_timeout: Duration,
    /// How often this replica tells the leader its open connections per proxy.
    #[arg(long, env = "GATEWAY_LOAD_REPORT_INTERVAL", default_value = "5s", value_parser = crate::support::durations::parse)]
    pub load_report_interval: Duration,
    /// Ask the leader for a busy client's next route one request ahead (docs/gateway.md):
    /// `false` asks every route when it is needed.
    #[arg(long, env = "GATEWAY_ROUTE_PREFETCH", default_value_t = true, action = clap::ArgAction::Set)]
    pub route_prefetch: bool,
}

impl GatewayArgs {
    fn options(&self) -> anyhow::Result<GatewayOptions> {
        anyhow::ensure!(
            !self.idle_timeout.is_zero(),
            "--idle-timeout must be more than 0s (e.g. 300s)"
        );
        anyhow::ensure!(
            !self.load_report_interval.is_zero()
                && self.load_report_interval
                    < crate::leasing::leases::store::shared::REPLICA_SILENCE,
            "--load-report-interval must be more than 0s and less than {} s (the leader forgets a replica silent that long)",
            crate::leasing::leases::store::shared::REPLICA_SILENCE.as_secs()
        );
        Ok(GatewayOptions {
            idle_timeout: self.idle_timeout,
            max_clients: self.max_clients as usize,
            max_clients_per_token: self.max_clients_per_token,
            policy: DestinationPolicy {
                ports: self.allowed_ports.0.clone(),
                allowed_networks: self.allowed_networks.0.clone(),
                allowed_host_suffixes: self.allowed_host_suffixes.0.clone(),
            },
            ..GatewayOptions::default()
        })
    }

    fn replica(&self) -> String {
        self.replica
            .clone()
            .filter(|r| !r.trim().is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "gateway".into())
    }
}

/// Runs the gateway until SIGTERM or Ctrl-C; open tunnels then get the shutdown grace.
pub async fn run(args: GatewayArgs) -> anyhow::Result<()> {
    let options = args.options()?;
    let replica = args.replica();
    let trust = leader_trust(&args)?;
    let leader = Arc::new(LeaderRoutes::new(
        &args.discovery_url,
        &args.gateway_token,
        &replica,
        trust,
    )?);
    let metrics_auth = match args.metrics_auth.metrics_insecure {
        true => args.metrics_auth.auth_insecure(),
        false => MetricsAuth::kubernetes(kube::Client::try_default().await.context(
            "the gateway reviews the tokens of /metrics readers with the API server: no cluster to reach (KUBECONFIG or in-cluster); pass --metrics-insecure for a local run",
        )?),
    };
    let routes = Arc::new(Prefetching::new(leader.clone(), args.route_prefetch));
    let registry = prometheus::Registry::new();
    let metrics = GatewayMetrics::register(&registry)?;
    let http = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding --http-addr {}", args.http_addr))?;
    let socks = tokio::net::TcpListener::bind(args.socks_addr)
        .await
        .with_context(|| format!("binding --socks-addr {}", args.socks_addr))?;
    let https = https_port(&args).await?;
    let gateway = Arc::new(Gateway::new(routes.clone(), options, metrics));
    let stop = CancellationToken::new();
    tokio::spawn(crate::faces::operator::cancel_on_signal(stop.clone()));

    let reported = Arc::new(LastReport::new());
    let probes = serve_probes(
        &stop,
        args.metrics_addr,
        registry,
        reported.clone(),
        &metrics_auth,
    )
    .await?;
    let pushing = tokio::spawn(push_loads(
        leader,
        gateway.clone(),
        args.load_report_interval,
        reported,
        stop.clone(),
    ));
    tracing::info!(
        http = %args.http_addr,
        socks = %args.socks_addr,
        %replica,
        leader = %args.discovery_url,
        "gateway serving"
    );
    let watching = https
        .as_ref()
        .map(|(_, cert)| tokio::spawn(cert.clone().watch(crate::support::tls::RELOAD_EVERY)));
    let https = https.map(|(port, _)| port);
    gateway
        .serve_with_https(http, socks, https, stop.clone())
        .await;
    if let Some(watching) = watching {
        watching.abort();
    }
    stop.cancel();
    let _ = pushing.await;
    let _ = probes.await;
    Ok(())
}

/// The HTTPS proxy port's listener, acceptor and certificate, when a certificate is given.
async fn https_port(
    args: &GatewayArgs,
) -> anyhow::Result<
    Option<(
        (tokio::net::TcpListener, tokio_rustls::TlsAcceptor),
        Arc<crate::support::tls::ReloadingCert>,
    )>,
> {
    let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_key_file) else {
        return Ok(None);
    };
    let cert = crate::support::tls::ReloadingCert::new(crate::support::tls::CertFiles {
        cert: cert.clone(),
        key: key.clone(),
    });
    let acceptor = cert.acceptor()?;
    let listener = tokio::net::TcpListener::bind(args.https_addr)
        .await
        .with_context(|| format!("binding --https-addr {}", args.https_addr))?;
    tracing::info!(https = %args.https_addr, "serving the HTTP proxy over TLS too");
    Ok(Some(((listener, acceptor), cert)))
}

/// What the gateway checks the discovery API's certificate against, from its flags: the URL's
/// scheme must agree with --discovery-plain-http.
fn leader_trust(args: &GatewayArgs) -> anyhow::Result<LeaderTrust> {
    let https = args
        .discovery_url
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("https://");
    match (https, args.discovery_plain_http, &args.discovery_ca_file) {
        (true, false, Some(ca)) => Ok(LeaderTrust::Ca(crate::support::tls::ca_certificates(
            ca,
            "--discovery-ca-file",
        )?)),
        (true, false, None) => Ok(LeaderTrust::SystemRoots),
        (false, true, None) => Ok(LeaderTrust::PlainHttp),
        (true, true, _) => anyhow::bail!(
            "--discovery-plain-http with an https --discovery-url `{}`: drop one",
            args.discovery_url
        ),
        (false, true, Some(_)) => anyhow::bail!(
            "--discovery-ca-file is for an https --discovery-url, not `{}`",
            args.discovery_url
        ),
        (false, false, _) => anyhow::bail!(
            "--discovery-url `{}` is not https: the operator serves its discovery API over TLS (pass its CA with --discovery-ca-file), or pass --discovery-plain-http when it serves plain HTTP",
            args.discovery_url
        ),
    }
}

/// When the leader last took this replica's load report: ms since `started`, 0 for never.
struct LastReport {
    started: Instant,
    at_ms: AtomicU64,
}

impl LastReport {
    fn new() -> Self {
        LastReport {
            started: Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }

    fn record(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.at_ms.store(ms.max(1), Ordering::Relaxed);
    }

    fn fresh(&self) -> bool {
        let at = self.at_ms.load(Ordering::Relaxed);
        at > 0
            && self
                .started
                .elapsed()
                .saturating_sub(Duration::from_millis(at))
                < LEADER_STALE_AFTER
    }
}

/// Tells the leader this replica's open connections per proxy, every `interval`, and once more
/// (empty) on shutdown so its load stops counting at once.
async fn push_loads(
    routes: Arc<LeaderRoutes>,
    gateway: Arc<Gateway<Prefetching<LeaderRoutes>>>,
    interval: Duration,
    reported: Arc<LastReport>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    // The byte totals the leader has taken: each report carries what was counted since.
    let mut taken = BTreeMap::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let totals = gateway.metrics().bytes_by_pool();
        let since = bytes_since(&totals, &taken);
        match routes
            .push_load(&gateway.upstream_load().snapshot(), &since)
            .await
        {
            Ok(()) => {
                if failing {
                    tracing::info!("the leader takes load reports again");
                }
                failing = false;
                taken = totals;
                reported.record();
            }
            Err(e) => {
                if !failing {
                    tracing::warn!("cannot report this replica's load to the leader: {e:#}");
                }
                failing = true;
            }
        }
    }
    let totals = gateway.metrics().bytes_by_pool();
    let _ = routes.push_load(&[], &bytes_since(&totals, &taken)).await;
}

/// Bytes per pool counted since `taken`, leaving out pools with none.
fn bytes_since(
    totals: &BTreeMap<String, (u64, u64)>,
    taken: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, (u64, u64)> {
    totals
        .iter()
        .filter_map(|(pool, (sent, received))| {
            let (sent0, received0) = taken.get(pool).copied().unwrap_or_default();
            let since = (
                sent.saturating_sub(sent0),
                received.saturating_sub(received0),
            );
            (since != (0, 0)).then(|| (pool.clone(), since))
        })
        .collect()
}

async fn serve_probes(
    stop: &CancellationToken,
    addr: SocketAddr,
    registry: prometheus::Registry,
    reported: Arc<LastReport>,
    auth: &Arc<MetricsAuth>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let app = axum::Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route(
            "/readyz",
            get(move || {
                let fresh = reported.fresh();
                async move {
                    if fresh {
                        (StatusCode::OK, "ok\n".to_string())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "the leader has not taken this replica's load report for {} s (see the log)\n",
                                LEADER_STALE_AFTER.as_secs()
                            ),
                        )
                    }
                }
            }),
        )
        .merge(auth.guard(crate::faces::probes::metrics_router(registry)));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-addr {addr}"))?;
    let stop = stop.clone();
    Ok(tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            result = axum::serve(listener, app).into_future() => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "gateway probe server failed");
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_carries_the_bytes_counted_since_the_leader_took_the_last() {
        let taken = BTreeMap::from([("ns/a".to_string(), (100, 1000)), ("none".into(), (5, 5))]);
        let totals = BTreeMap::from([
            ("ns/a".to_string(), (150, 1000)),
            ("none".into(), (5, 5)),
            ("ns/b".into(), (1, 2)),
        ]);
        assert_eq!(
            bytes_since(&totals, &taken),
            BTreeMap::from([("ns/a".to_string(), (50, 0)), ("ns/b".into(), (1, 2))])
        );
    }
}
