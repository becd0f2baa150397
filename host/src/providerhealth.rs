//! Provider health: every interval, each provider instance's `check()` runs with its own deadline
//! and its own concurrency slot; the result is written to a cluster-scoped `ProviderHealth` object
//! named after the provider instance, and to gauges.
//!
//! `Ready` condition reasons (fixed set): `Ok`; from the provider's verdicts `Unreachable`,
//! `SSHHandshakeFailed`, `HostKeyMismatch`, `AuthFailed`, `PoolNotFound`, `PoolInactive`,
//! `Forbidden`, `QuotaExceeded`, or another CamelCase reason the provider documents; from the
//! host `Timeout` (the check did not answer within `--provider-check-timeout`), `PluginError`
//! (the check call failed) and `PluginNotLoaded` (no plugin serves the provider's type).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use prometheus::{GaugeVec, Opts, Registry};

use crate::api::{ProviderHealth, ProviderHealthStatus, TargetVerdict};
use crate::controller::conditions;
use crate::plugins::ProviderInstance;
use crate::providers::{ProviderSet, Providers};

const FIELD_MANAGER: &str = "proxy-operator";
/// Label marking the ProviderHealth objects of one operator installation.
pub const OPERATOR_LABEL: &str = "crawl.example.com/operator-id";

/// Gauges of the latest checks.
#[derive(Clone)]
pub struct HealthMetrics {
    target_up: GaugeVec,
    duration: GaugeVec,
    timestamp: GaugeVec,
}

impl HealthMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<GaugeVec> {
            let g = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(HealthMetrics {
            target_up: gauge(
                "proxy_operator_provider_target_up",
                "1 when the provider's last check found the target usable, else 0.",
                &["provider", "target"],
            )?,
            duration: gauge(
                "proxy_operator_provider_check_duration_seconds",
                "How long the provider's last check took.",
                &["provider"],
            )?,
            timestamp: gauge(
                "proxy_operator_provider_check_timestamp_seconds",
                "When the provider's last check finished, seconds since the Unix epoch.",
                &["provider"],
            )?,
        })
    }
}

/// The outcome of one check, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub ready: bool,
    pub reason: String,
    pub message: String,
    pub targets: Vec<TargetVerdict>,
}

/// Runs one provider instance's check with a deadline. A check past its deadline is abandoned
/// (its call dropped); it never holds a slot reconciles need.
pub async fn check(provider: &ProviderInstance, timeout: Duration) -> Verdict {
    match tokio::time::timeout(timeout, provider.check()).await {
        Err(_) => Verdict {
            ready: false,
            reason: "Timeout".into(),
            message: format!("the check did not answer within {timeout:?}"),
            targets: Vec::new(),
        },
        Ok(Err(e)) => Verdict {
            ready: false,
            reason: "PluginError".into(),
            message: e.to_string(),
            targets: Vec::new(),
        },
        Ok(Ok(targets)) => {
            let targets: Vec<TargetVerdict> = targets
                .into_iter()
                .map(|t| TargetVerdict {
                    target: t.target,
                    ok: t.ok,
                    reason: t.reason,
                    message: t.message,
                    latency_ms: t.latency_ms,
                })
                .collect();
            let failing = targets.iter().find(|t| !t.ok);
            match failing {
                None => Verdict {
                    ready: true,
                    reason: "Ok".into(),
                    message: format!("{} of {} targets ok", targets.len(), targets.len()),
                    targets,
                },
                Some(first) => {
                    let bad = targets.iter().filter(|t| !t.ok).count();
                    Verdict {
                        ready: false,
                        reason: first.reason.clone(),
                        message: format!(
                            "{bad} of {} targets failing; {}: {}",
                            targets.len(),
                            first.target,
                            first.message
                        ),
                        targets,
                    }
                }
            }
        }
    }
}

/// The `PluginLoaded` condition: whether the latest plugin for the instance serves it.
struct PluginState {
    loaded: bool,
    reason: &'static str,
    message: String,
}

async fn write(
    client: &Client,
    operator_id: &str,
    name: &str,
    provider_type: &str,
    verdict: &Verdict,
    plugin: &PluginState,
) -> kube::Result<()> {
    let api: Api<ProviderHealth> = Api::all(client.clone());
    // The transition time is kept while the verdict stays the same, as for Proxy conditions.
    let mut conditions = api
        .get_opt(name)
        .await?
        .and_then(|p| p.status)
        .map(|s| s.conditions)
        .unwrap_or_default();
    conditions::set(
        &mut conditions,
        conditions::Type::Ready,
        verdict.ready,
        &verdict.reason,
        &verdict.message,
        None,
    );
    conditions::set(
        &mut conditions,
        conditions::Type::PluginLoaded,
        plugin.loaded,
        plugin.reason,
        &plugin.message,
        None,
    );
    let ok = verdict.targets.iter().filter(|t| t.ok).count();
    let status = ProviderHealthStatus {
        conditions,
        targets: verdict.targets.clone(),
        targets_summary: Some(format!("{ok}/{}", verdict.targets.len())),
        last_check_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
    };
    let object = serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProviderHealth",
        "metadata": { "name": name, "labels": { OPERATOR_LABEL: operator_id } },
        "spec": { "providerType": provider_type },
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(object)).await?;
    let status_patch = serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "ProviderHealth",
        "status": status,
    });
    api.patch_status(name, &params, &Patch::Apply(status_patch))
        .await?;
    Ok(())
}

/// Checks every provider instance once (in parallel), writes the objects and gauges, and removes
/// the objects of provider instances no longer configured.
pub async fn pass(
    client: &Client,
    providers: &Providers,
    operator_id: &str,
    timeout: Duration,
    metrics: &HealthMetrics,
) -> anyhow::Result<()> {
    let names: Vec<String> = providers.names().map(String::from).collect();
    let checks = names.iter().map(|name| {
        let provider = providers.get(name).expect("listed names exist").clone();
        async move {
            let started = Instant::now();
            let verdict = check(&provider, timeout).await;
            (name.clone(), provider, verdict, started.elapsed())
        }
    });
    for (name, provider, verdict, elapsed) in futures_util::future::join_all(checks).await {
        metrics
            .duration
            .with_label_values(&[&name])
            .set(elapsed.as_secs_f64());
        metrics.timestamp.with_label_values(&[&name]).set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
        );
        for target in &verdict.targets {
            metrics
                .target_up
                .with_label_values(&[&name, &target.target])
                .set(if target.ok { 1.0 } else { 0.0 });
        }
        if !verdict.ready {
            tracing::warn!(provider = %name, reason = %verdict.reason, "provider check: {}", verdict.message);
        }
        let info = &provider.plugin().info;
        let plugin = match providers.problem(&name) {
            None => PluginState {
                loaded: true,
                reason: "Loaded",
                message: format!(
                    "{} {} (sha256 {})",
                    info.name,
                    info.version,
                    &provider.plugin().sha256[..12]
                ),
            },
            Some(problem) => PluginState {
                loaded: false,
                reason: "PluginNotLoaded",
                message: format!(
                    "still serving {} {} (sha256 {}); the update was refused: {problem}",
                    info.name,
                    info.version,
                    &provider.plugin().sha256[..12]
                ),
            },
        };
        if let Err(e) = write(client, operator_id, &name, &info.name, &verdict, &plugin).await {
            tracing::warn!(provider = %name, "cannot write ProviderHealth: {e}");
        }
    }
    for (name, missing) in providers.not_loaded_all() {
        let verdict = Verdict {
            ready: false,
            reason: "PluginNotLoaded".into(),
            message: missing.reason.clone(),
            targets: Vec::new(),
        };
        let plugin = PluginState {
            loaded: false,
            reason: "PluginNotLoaded",
            message: missing.reason.clone(),
        };
        if let Err(e) = write(
            client,
            operator_id,
            name,
            &missing.provider_type,
            &verdict,
            &plugin,
        )
        .await
        {
            tracing::warn!(provider = %name, "cannot write ProviderHealth: {e}");
        }
    }

    let configured: HashSet<String> = providers.configured_names().into_iter().collect();
    let api: Api<ProviderHealth> = Api::all(client.clone());
    let ours = api
        .list(&ListParams::default().labels(&format!("{OPERATOR_LABEL}={operator_id}")))
        .await?;
    for stale in ours
        .items
        .iter()
        .filter(|p| !configured.contains(&p.name_any()))
    {
        tracing::info!(provider = %stale.name_any(), "removing the ProviderHealth of a provider instance no longer configured");
        api.delete(&stale.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// Runs passes every `interval` until the task is dropped.
pub async fn run(
    client: Client,
    providers: ProviderSet,
    operator_id: String,
    interval: Duration,
    timeout: Duration,
    metrics: HealthMetrics,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = pass(
            &client,
            &providers.current(),
            &operator_id,
            timeout,
            &metrics,
        )
        .await
        {
            tracing::warn!("provider health pass failed: {e:#}");
        }
    }
}
