//! The health engine: probes every provisioned proxy with a real `CONNECT` on a schedule, damps
//! flapping with consecutive-result thresholds, writes `Healthy`/phase into the Proxy status when
//! the verdict changes, and keeps the lease store's pool of proxies current.

pub mod probe;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::{Notify, mpsc};

use crate::api::{Phase, Proxy, ProxyStatus};
use crate::controller::conditions;
use crate::leases::{LeaseStore, PoolEntry, ProxyKey};
use crate::providers::ProviderSet;

pub use probe::{ProbeFailure, exit_ip, probe};

const FIELD_MANAGER: &str = "proxy-operator-health";
/// Concurrent status writes of one round.
const WRITE_CONCURRENCY: usize = 16;

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
}

/// What the engine believes of one proxy.
#[derive(Clone, Debug, Default)]
struct Verdict {
    uid: String,
    /// `None` until the thresholds decide.
    healthy: Option<bool>,
    successes: u32,
    failures: u32,
    last_probe: Option<SystemTime>,
    latency: Option<Duration>,
    last_failure: Option<String>,
    /// The exit IP, the proxy address it was learned through, and when.
    exit_ip: Option<ExitIp>,
}

#[derive(Clone, Debug)]
struct ExitIp {
    ip: String,
    through: String,
    at: std::time::Instant,
}

impl Verdict {
    /// Seeds from the status written before a restart, so leases survive it.
    fn from_status(uid: String, status: Option<&ProxyStatus>, options: &HealthOptions) -> Self {
        let healthy = status
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Healthy"))
            .and_then(|c| match c.status.as_str() {
                "True" => Some(true),
                "False" => Some(false),
                _ => None,
            });
        // Taken as fresh, so a restart does not ask every proxy again at once; only when the
        // exit IP is still recorded (turning `--exit-ip-url` off drops it from the status).
        let exit_ip = options.exit_ip_url.as_ref().and_then(|_| {
            let status = status?;
            Some(ExitIp {
                ip: status.exit_ip.clone()?,
                through: status.address.clone()?,
                at: std::time::Instant::now(),
            })
        });
        Verdict {
            uid,
            healthy,
            exit_ip,
            ..Default::default()
        }
    }

    /// Whether the exit IP should be asked for (again) through `address`.
    fn exit_ip_due(&self, address: &str, options: &HealthOptions) -> bool {
        options.exit_ip_url.is_some()
            && self.exit_ip.as_ref().is_none_or(|known| {
                known.through != address || known.at.elapsed() >= options.status_refresh
            })
    }

    fn record(&mut self, result: &Result<Duration, ProbeFailure>, options: &HealthOptions) {
        self.last_probe = Some(SystemTime::now());
        match result {
            Ok(latency) => {
                self.latency = Some(*latency);
                self.successes += 1;
                self.failures = 0;
                let needed = match self.healthy {
                    Some(false) => options.success_threshold,
                    _ => 1,
                };
                if self.successes >= needed {
                    self.healthy = Some(true);
                    self.last_failure = None;
                }
            }
            Err(failure) => {
                self.failures += 1;
                self.successes = 0;
                self.last_failure = Some(failure.to_string());
                if self.failures >= options.failure_threshold {
                    self.healthy = Some(false);
                }
            }
        }
    }
}

/// The verdict of `proxy`, seeded from its status when first seen or when its UID changed (a
/// new Proxy of the same name). A free function, so a round can borrow the options beside it.
fn verdict_of<'a>(
    verdicts: &'a mut HashMap<ProxyKey, Verdict>,
    proxy: &Proxy,
    options: &HealthOptions,
) -> &'a mut Verdict {
    let uid = proxy.uid().unwrap_or_default();
    let verdict = verdicts
        .entry(key_of(proxy))
        .or_insert_with(|| Verdict::from_status(uid.clone(), proxy.status.as_ref(), options));
    if verdict.uid != uid {
        *verdict = Verdict::from_status(uid, proxy.status.as_ref(), options);
    }
    verdict
}

fn key_of(proxy: &Proxy) -> ProxyKey {
    ProxyKey {
        namespace: proxy.namespace().unwrap_or_default(),
        name: proxy.name_any(),
    }
}

/// Provisioned, not being deleted: the proxies that are probed and may be leased.
fn provisioned(proxy: &Proxy) -> Option<(&str, &ProxyStatus)> {
    if proxy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = proxy.status.as_ref()?;
    status.provider_id.as_ref()?;
    let address = status.address.as_deref()?;
    matches!(status.phase, Some(Phase::Ready) | Some(Phase::Unhealthy)).then_some((address, status))
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
}

impl HealthEngine {
    pub fn new(
        client: Client,
        providers: ProviderSet,
        leases: Arc<LeaseStore>,
        options: HealthOptions,
        metrics: ProbeMetrics,
    ) -> Self {
        HealthEngine {
            options,
            metrics,
            providers,
            leases,
            client,
            verdicts: HashMap::new(),
            phase_labels: HashSet::new(),
        }
    }

    /// Watches Proxies (in `namespace`, or all) and probes them until aborted. `suspects` are
    /// probed at once (crawlers reported repeated failures on them).
    pub async fn run(mut self, namespace: Option<String>, mut suspects: mpsc::Receiver<ProxyKey>) {
        let api: Api<Proxy> = match &namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let (reader, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let watch = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default().any_semantic()),
        )
        .default_backoff()
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::warn!("watching Proxies for health: {e}");
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
    pub async fn round(&mut self, reader: &Store<Proxy>, only: Option<&ProxyKey>) {
        let proxies: Vec<Arc<Proxy>> = reader
            .state()
            .into_iter()
            .filter(|p| provisioned(p).is_some())
            .filter(|p| only.is_none_or(|k| *k == key_of(p)))
            .collect();
        let (target, timeout) = (self.options.target.clone(), self.options.timeout);
        let exit_ip_url = self.options.exit_ip_url.clone();
        let probes: Vec<(Arc<Proxy>, bool)> = proxies
            .into_iter()
            .map(|proxy| {
                let address = provisioned(&proxy).expect("filtered above").0;
                let due = self.options.exit_ip_url.is_some()
                    && verdict_of(&mut self.verdicts, &proxy, &self.options)
                        .exit_ip_due(address, &self.options);
                (proxy, due)
            })
            .collect();
        type Probed = (
            Arc<Proxy>,
            Result<Duration, ProbeFailure>,
            Option<Result<std::net::IpAddr, String>>,
        );
        let results: Vec<Probed> = futures_util::stream::iter(probes)
            .map(|(proxy, exit_ip_due)| {
                let (target, exit_ip_url) = (target.clone(), exit_ip_url.clone());
                async move {
                    let (address, status) = provisioned(&proxy).expect("filtered above");
                    let port = status_port(&proxy, status);
                    let result = probe(address, port, &target, timeout).await;
                    let exit = match (&result, exit_ip_url) {
                        (Ok(_), Some(url)) if exit_ip_due => {
                            Some(exit_ip(address, port, &url, timeout).await)
                        }
                        _ => None,
                    };
                    (proxy, result, exit)
                }
            })
            .buffer_unordered(self.options.workers.max(1))
            .collect()
            .await;
        let mut writes = Vec::new();
        for (proxy, result, exit) in results {
            match &result {
                Ok(latency) => self
                    .metrics
                    .duration
                    .with_label_values(&["success"])
                    .observe(latency.as_secs_f64()),
                Err(failure) => {
                    self.metrics
                        .failures
                        .with_label_values(&[failure.reason()])
                        .inc();
                    self.metrics
                        .duration
                        .with_label_values(&["failure"])
                        .observe(self.options.timeout.as_secs_f64().min(
                            // A refused connect fails fast; count its real time, not the deadline.
                            match failure {
                                ProbeFailure::Timeout(t) => t.as_secs_f64(),
                                _ => 0.0,
                            },
                        ))
                }
            }
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
                    tracing::debug!(proxy = %key_of(&proxy), "cannot learn the exit IP: {e}")
                }
                None => {}
            }
            if before != verdict.healthy {
                tracing::info!(
                    proxy = %key_of(&proxy),
                    healthy = ?verdict.healthy,
                    failure = ?verdict.last_failure,
                    "health changed"
                );
            }
            let verdict = verdict.clone();
            if let Some(patch) = self.status_patch(&proxy, &verdict) {
                writes.push((proxy, patch));
            }
        }
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
                        tracing::debug!(proxy = %key_of(&proxy), "cannot write health status: {e}");
                    }
                }
            })
            .await;
    }

    fn verdict_mut(&mut self, proxy: &Proxy) -> &mut Verdict {
        verdict_of(&mut self.verdicts, proxy, &self.options)
    }

    /// The status fields the engine owns, if they differ from what the Proxy shows (or the
    /// probe time is older than `status_refresh`).
    fn status_patch(&self, proxy: &Proxy, verdict: &Verdict) -> Option<serde_json::Value> {
        let observed = proxy.status.clone().unwrap_or_default();
        let mut status = observed.clone();
        let generation = proxy.metadata.generation;
        match verdict.healthy {
            Some(true) => conditions::set(
                &mut status.conditions,
                conditions::Type::Healthy,
                true,
                conditions::Reason::ProbeSucceeded,
                &format!(
                    "CONNECT {} through the proxy succeeded in {} ms",
                    self.options.target,
                    verdict.latency.unwrap_or_default().as_millis()
                ),
                generation,
            ),
            Some(false) => conditions::set(
                &mut status.conditions,
                conditions::Type::Healthy,
                false,
                conditions::Reason::ProbeFailed,
                &format!(
                    "{} consecutive probes failed; last: {}",
                    verdict.failures.max(self.options.failure_threshold),
                    verdict.last_failure.as_deref().unwrap_or("unknown")
                ),
                generation,
            ),
            None => {}
        }
        conditions::readiness(&mut status, generation, !self.options.interval.is_zero());
        let exit_ip = verdict.exit_ip.as_ref().map(|e| e.ip.clone());
        let verdict_changed = exit_ip != observed.exit_ip
            || status.phase != observed.phase
            || condition_status(&status, "Healthy") != condition_status(&observed, "Healthy")
            || condition_status(&status, "Ready") != condition_status(&observed, "Ready");
        let stale = observed.last_probe_time.as_ref().is_none_or(|t| {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            age.as_secs() as u64 >= self.options.status_refresh.as_secs()
        });
        if !verdict_changed && !stale {
            return None;
        }
        let last_probe = verdict
            .last_probe
            .and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
            .map(Time);
        let mut owned = serde_json::json!({
            "phase": status.phase,
            "lastProbeTime": last_probe,
            "conditions": status.conditions.iter()
                .filter(|c| c.type_ == "Healthy" || c.type_ == "Ready")
                .collect::<Vec<_>>(),
        });
        if let Some(ip) = exit_ip {
            owned["exitIP"] = ip.into();
        }
        if let Some(latency) = verdict.latency {
            owned["lastProbeLatencyMs"] = (latency.as_millis().min(u32::MAX as u128) as u32).into();
        }
        Some(serde_json::json!({
            "apiVersion": "crawl.example.com/v1alpha1",
            "kind": "Proxy",
            "status": owned,
        }))
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
            let key = key_of(&proxy);
            let Some((address, status)) = provisioned(&proxy) else {
                continue;
            };
            seen.insert(key.clone());
            let healthy = if probing {
                self.verdict_mut(&proxy).healthy == Some(true)
            } else {
                status.phase == Some(Phase::Ready)
            };
            entries.push(PoolEntry {
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
            });
        }
        self.verdicts.retain(|k, _| seen.contains(k));
        self.leases.set_pool(entries);
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

/// The port squid answers on: the provider's answer, else what it was asked for.
fn status_port(proxy: &Proxy, status: &ProxyStatus) -> u16 {
    status.port.unwrap_or(proxy.spec.port)
}

fn condition_status<'a>(status: &'a ProxyStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
