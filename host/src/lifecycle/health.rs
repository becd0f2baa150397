//! The health engine: probes every provisioned proxy with a real `CONNECT` on a schedule, damps
//! flapping with consecutive-result thresholds, writes `Healthy` and the probe fields into the
//! Proxy status when the verdict changes (the controller, seeing that, judges `phase` and
//! `Ready`), and keeps the lease store's pool of proxies current.

mod options;
pub mod probe;
mod verdict;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::{Notify, mpsc};
use tracing::Instrument;

use crate::api::labels::{DRAINING_ANNOTATION, POOL_LABEL};
use crate::api::{Phase, Proxy};
use crate::leasing::leases::{LeaseStore, ProvisionedProxy, ProxyKey};
use crate::provider::credentials::{CredentialsBook, ProxyLogin};
use crate::provider::providers::{ProviderSet, Providers};
use crate::support::socks::ProxyProtocol;
use verdict::{ExitIp, Verdict, provisioned, status_port, verdict_of};

pub use options::HealthOptions;
pub use probe::{ProbeFailure, exit_ip, probe};

/// The field manager of what the engine writes (`Healthy`, the probe fields). Not the name it
/// used while it also wrote `phase` and `Ready` ("proxy-operator-health"): an apply leaving out
/// a field its manager alone owned deletes that field, so under a new name the old entries,
/// still owning `phase` and `Ready` in Proxies written before, are never applied again and
/// nothing the controller now owns alone disappears on an upgrade.
pub const FIELD_MANAGER: &str = "proxy-operator-probes";
/// Concurrent status writes of one round.
const WRITE_CONCURRENCY: usize = 16;

/// Probe and proxy metrics.
#[derive(Clone)]
pub struct ProbeMetrics {
    duration: HistogramVec,
    failures: IntCounterVec,
    proxies: IntGaugeVec,
}

impl ProbeMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = ProbeMetrics {
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "proxy_operator_probe_duration_seconds",
                    "Duration of health probes (CONNECT through the proxy), by result.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ]),
                &["result"],
            )?,
            failures: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_probe_failures_total",
                    "Failed health probes, by reason: connect, timeout, status, protocol.",
                ),
                &["reason"],
            )?,
            proxies: IntGaugeVec::new(
                Opts::new(
                    "proxy_operator_proxies",
                    "Proxies by phase and provider instance (`unknown` for a provider not in the config).",
                ),
                &["phase", "provider"],
            )?,
        };
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.failures.clone()))?;
        registry.register(Box::new(metrics.proxies.clone()))?;
        Ok(metrics)
    }

    /// Counts one probe: its duration by result, a failure by reason.
    fn observe(&self, result: &Result<Duration, ProbeFailure>, timeout: Duration) {
        match result {
            Ok(latency) => self
                .duration
                .with_label_values(&["success"])
                .observe(latency.as_secs_f64()),
            Err(failure) => {
                self.failures.with_label_values(&[failure.reason()]).inc();
                self.duration
                    .with_label_values(&["failure"])
                    .observe(timeout.as_secs_f64().min(
                        // A refused connect fails fast; count its real time, not the deadline.
                        match failure {
                            ProbeFailure::Timeout(t) => t.as_secs_f64(),
                            _ => 0.0,
                        },
                    ))
            }
        }
    }
}

/// One proxy's probe: the result, and the exit IP when it was asked for.
type Probed = (
    Arc<Proxy>,
    Result<Duration, ProbeFailure>,
    Option<Result<std::net::IpAddr, String>>,
);

/// How a provisioned proxy is spoken to: SOCKS5 for an upstream one whose URL says so (see
/// `crate::provider::upstream`), HTTP otherwise.
fn protocol_in(providers: &Providers, proxy: &Proxy) -> ProxyProtocol {
    let upstream = providers
        .get(&proxy.spec.provider)
        .and_then(|p| p.upstream());
    match (upstream, provisioned(proxy)) {
        (Some(upstream), Some((address, status))) => upstream.protocol_for(
            proxy.spec.provider_options.as_ref(),
            address,
            status_port(proxy, status),
        ),
        _ => ProxyProtocol::Http,
    }
}

/// The engine's state between rounds.
pub struct HealthEngine {
    options: HealthOptions,
    metrics: ProbeMetrics,
    providers: ProviderSet,
    leases: Arc<LeaseStore>,
    client: Client,
    verdicts: HashMap<ProxyKey, Verdict>,
    phase_labels: HashSet<(String, String)>,
    credentials: CredentialsBook,
}

impl HealthEngine {
    pub fn new(
        client: Client,
        providers: ProviderSet,
        leases: Arc<LeaseStore>,
        options: HealthOptions,
        metrics: ProbeMetrics,
        credentials: CredentialsBook,
    ) -> Self {
        HealthEngine {
            options,
            metrics,
            providers,
            leases,
            client,
            verdicts: HashMap::new(),
            phase_labels: HashSet::new(),
            credentials,
        }
    }

    /// The credentials a proxy's squid requires, when it has any and they are known: the
    /// login whose fingerprint is the one its status records as applied.
    fn login_of(&self, proxy: &Proxy) -> Option<ProxyLogin> {
        let applied = proxy.status.as_ref()?.credentials.as_ref()?;
        self.credentials
            .applied(&ProxyKey::of(proxy), &applied.fingerprint)
    }

    /// Watches Proxies (in `namespace`, or all) and probes them until aborted. `suspects` are
    /// probed at once (crawlers reported repeated failures on them).
    pub async fn run(mut self, namespace: Option<String>, mut suspects: mpsc::Receiver<ProxyKey>) {
        let api = crate::api::proxies(self.client.clone(), namespace.as_deref());
        let (reader, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let watch = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default().any_semantic())
                .modify(crate::support::kubeclient::trim_for_cache),
        )
        .default_backoff()
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watching Proxies for health");
            }
            notify.notify_one();
            std::future::ready(())
        });
        let watch = tokio::spawn(watch);
        let _stop_watch = AbortOnDrop(watch);
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let probing = !self.options.interval.is_zero();
        let mut tick = tokio::time::interval(if probing {
            self.options.interval
        } else {
            Duration::from_secs(3600)
        });
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(
            interval = ?self.options.interval,
            target = %self.options.target,
            workers = self.options.workers,
            "health engine started"
        );
        loop {
            tokio::select! {
                _ = tick.tick(), if probing => self.round(&reader, None).await,
                Some(key) = suspects.recv(), if probing => {
                    tracing::debug!(proxy = %key, "probing now: crawlers report failures");
                    self.round(&reader, Some(&key)).await
                }
                _ = changed.notified() => {}
            }
            self.sync_pool(&reader);
        }
    }

    /// Probes every provisioned proxy (or only `only`), then writes the statuses that changed.
    /// One span per round (`health_round`, with the proxies probed and the statuses written),
    /// so what a round logs says which round it was.
    #[tracing::instrument(
        name = "health_round",
        skip_all,
        fields(only = only.map(tracing::field::display), probed, written)
    )]
    pub async fn round(&mut self, reader: &Store<Proxy>, only: Option<&ProxyKey>) {
        let due = self.due(reader, only);
        tracing::Span::current().record("probed", due.len());
        let results = self.probe_all(due).await;
        let writes: Vec<_> = results
            .into_iter()
            .filter_map(|probed| self.judge(probed))
            .collect();
        tracing::Span::current().record("written", writes.len());
        self.write_statuses(writes).await;
    }

    /// The proxies to probe now, each with whether its exit IP is to be asked for.
    fn due(&mut self, reader: &Store<Proxy>, only: Option<&ProxyKey>) -> Vec<(Arc<Proxy>, bool)> {
        reader
            .state()
            .into_iter()
            .filter(|p| provisioned(p).is_some())
            .filter(|p| only.is_none_or(|k| *k == ProxyKey::of(&**p)))
            .map(|proxy| {
                let address = provisioned(&proxy).expect("filtered above").0;
                let due = self.options.exit_ip_url.is_some()
                    && verdict_of(&mut self.verdicts, &proxy, &self.options)
                        .exit_ip_due(address, &self.options);
                (proxy, due)
            })
            .collect()
    }

    /// Probes `due` proxies, `workers` at a time (and asks the healthy ones their exit IP).
    async fn probe_all(&self, due: Vec<(Arc<Proxy>, bool)>) -> Vec<Probed> {
        let (target, timeout) = (self.options.target.clone(), self.options.timeout);
        let exit_ip_url = self.options.exit_ip_url.clone();
        let providers = self.providers.current();
        futures_util::stream::iter(due)
            .map(|(proxy, exit_ip_due)| {
                let (target, exit_ip_url) = (target.clone(), exit_ip_url.clone());
                let login = self.login_of(&proxy);
                let protocol = protocol_in(&providers, &proxy);
                let span = tracing::debug_span!(
                    "probe",
                    proxy = %ProxyKey::of(&*proxy),
                    provider = %proxy.spec.provider
                );
                async move {
                    let (address, status) = provisioned(&proxy).expect("filtered above");
                    let port = status_port(&proxy, status);
                    let login = login.as_ref();
                    let result = probe(address, port, protocol, &target, login, timeout).await;
                    let exit = match (&result, exit_ip_url) {
                        // Asked through HTTP proxies only (the exit-IP check's client has no
                        // SOCKS support built in; docs/providers/upstream.md).
                        (Ok(_), Some(url)) if exit_ip_due && protocol.is_http() => {
                            Some(exit_ip(address, port, login, &url, timeout).await)
                        }
                        _ => None,
                    };
                    (proxy, result, exit)
                }
                .instrument(span)
            })
            .buffer_unordered(self.options.workers.max(1))
            .collect()
            .await
    }

    /// Records one probe in the metrics and the proxy's verdict; the status patch to write, if
    /// the status should change.
    fn judge(&mut self, (proxy, result, exit): Probed) -> Option<(Arc<Proxy>, serde_json::Value)> {
        self.metrics.observe(&result, self.options.timeout);
        let verdict = verdict_of(&mut self.verdicts, &proxy, &self.options);
        let before = verdict.healthy;
        verdict.record(&result, &self.options);
        match exit {
            Some(Ok(ip)) => {
                let through = provisioned(&proxy).expect("filtered above").0.to_string();
                verdict.exit_ip = Some(ExitIp {
                    ip: ip.to_string(),
                    through,
                    at: std::time::Instant::now(),
                });
            }
            // Not a health failure: the proxy carried the probe. Asked again next round.
            Some(Err(e)) => {
                tracing::debug!(proxy = %ProxyKey::of(&*proxy), error = %e, "cannot learn the exit IP")
            }
            None => {}
        }
        if before != verdict.healthy {
            tracing::info!(
                proxy = %ProxyKey::of(&*proxy),
                healthy = ?verdict.healthy,
                failure = ?verdict.last_failure,
                "health changed"
            );
        }
        let patch = verdict.status_patch(&proxy, &self.options)?;
        Some((proxy, patch))
    }

    /// Writes the status patches, a few at a time; a failed write is retried by the next round.
    async fn write_statuses(&self, writes: Vec<(Arc<Proxy>, serde_json::Value)>) {
        let client = self.client.clone();
        futures_util::stream::iter(writes)
            .for_each_concurrent(WRITE_CONCURRENCY, |(proxy, patch)| {
                let client = client.clone();
                async move {
                    let api: Api<Proxy> =
                        Api::namespaced(client, &proxy.namespace().unwrap_or_default());
                    if let Err(e) = api
                        .patch_status(
                            &proxy.name_any(),
                            &PatchParams::apply(FIELD_MANAGER).force(),
                            &Patch::Apply(patch),
                        )
                        .await
                    {
                        // The next round compares again and retries.
                        tracing::debug!(proxy = %ProxyKey::of(&*proxy), error = %e, "cannot write health status");
                    }
                }
            })
            .await;
    }

    fn verdict_mut(&mut self, proxy: &Proxy) -> &mut Verdict {
        verdict_of(&mut self.verdicts, proxy, &self.options)
    }

    /// Hands the lease store the current set of provisioned proxies, and updates the gauges.
    pub fn sync_pool(&mut self, reader: &Store<Proxy>) {
        let probing = !self.options.interval.is_zero();
        let providers = self.providers.current();
        let mut entries = Vec::new();
        let mut counts: HashMap<(String, String), i64> = HashMap::new();
        let mut seen = HashSet::new();
        for proxy in reader.state() {
            let provider = if providers.is_configured(&proxy.spec.provider) {
                proxy.spec.provider.clone()
            } else {
                "unknown".to_string()
            };
            let phase = proxy
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|| "Pending".into());
            *counts.entry((phase, provider)).or_default() += 1;
            let key = ProxyKey::of(&*proxy);
            let Some((address, status)) = provisioned(&proxy) else {
                continue;
            };
            seen.insert(key.clone());
            let login = self.login_of(&proxy);
            let protocol = protocol_in(&providers, &proxy);
            let healthy = if probing {
                self.verdict_mut(&proxy).healthy == Some(true)
            } else {
                status.phase == Some(Phase::Ready)
            };
            entries.push(ProvisionedProxy {
                key,
                provider: proxy.spec.provider.clone(),
                zone: status
                    .zone
                    .clone()
                    .or_else(|| proxy.spec.placement.as_ref().and_then(|p| p.zone.clone())),
                labels: proxy
                    .metadata
                    .labels
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect::<BTreeMap<_, _>>(),
                address: address.to_string(),
                port: status_port(&proxy, status),
                exit_ip: status.exit_ip.clone(),
                healthy,
                pool: proxy.labels().get(POOL_LABEL).cloned(),
                draining: proxy
                    .annotations()
                    .get(DRAINING_ANNOTATION)
                    .is_some_and(|v| v == "true"),
                login,
                protocol,
            });
        }
        self.verdicts.retain(|k, _| seen.contains(k));
        self.leases.set_provisioned(entries);
        for labels in self.phase_labels.drain() {
            if !counts.contains_key(&labels) {
                let _ = self
                    .metrics
                    .proxies
                    .remove_label_values(&[&labels.0, &labels.1]);
            }
        }
        for ((phase, provider), count) in &counts {
            self.metrics
                .proxies
                .with_label_values(&[phase, provider])
                .set(*count);
        }
        self.phase_labels = counts.into_keys().collect();
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
