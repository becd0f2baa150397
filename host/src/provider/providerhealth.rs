//! Provider health: every interval, each provider instance's `check()` runs with its own deadline
//! and its own concurrency slot; the result is written to a cluster-scoped `ProviderHealth` object
//! named after the provider instance, and to gauges.
//!
//! `Ready` condition reasons (fixed set): `Ok`; from the provider's verdicts, the first failing
//! target's reason, one of `crate::provider::conformance::CHECK_REASONS` (`plugin test` checks a provider
//! keeps to them); from the host `Timeout` (the check did not answer within
//! `--provider-check-timeout`), `PluginError` (the check call failed) and `PluginNotLoaded` (no
//! plugin serves the provider's type).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use prometheus::{GaugeVec, Opts, Registry};

use crate::api::conditions;
use crate::api::{ProviderHealth, ProviderHealthStatus, TargetVerdict};
use crate::provider::plugins::ProviderInstance;
use crate::provider::plugins::types::{CheckTarget, PluginInfo};
use crate::provider::providers::{NotLoaded, ProviderSet, Providers};

const FIELD_MANAGER: &str = "proxy-operator";
use crate::api::labels::OPERATOR_LABEL;

/// Gauges of the latest checks.
#[derive(Clone)]
pub struct ProviderCheckMetrics {
    target_up: GaugeVec,
    duration: GaugeVec,
    timestamp: GaugeVec,
}

impl ProviderCheckMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<GaugeVec> {
            let g = GaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(ProviderCheckMetrics {
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
        Ok(Ok(targets)) => verdict_of_targets(targets),
    }
}

/// The verdict of a check that answered: ready when every target is ok, else the reason of the
/// first failing one.
fn verdict_of_targets(targets: Vec<CheckTarget>) -> Verdict {
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

/// The `PluginLoaded` condition: whether the latest plugin for the instance serves it.
#[derive(Debug, Clone, PartialEq)]
struct PluginState {
    loaded: bool,
    reason: &'static str,
    message: String,
}

impl PluginState {
    /// The plugin serving a loaded provider instance; `problem`: why its update was refused.
    fn serving(info: &PluginInfo, sha256: &str, problem: Option<&str>) -> Self {
        match problem {
            None => PluginState {
                loaded: true,
                reason: "Loaded",
                message: format!("{} {} (sha256 {})", info.name, info.version, &sha256[..12]),
            },
            Some(problem) => PluginState {
                loaded: false,
                reason: "PluginNotLoaded",
                message: format!(
                    "still serving {} {} (sha256 {}); the update was refused: {problem}",
                    info.name,
                    info.version,
                    &sha256[..12]
                ),
            },
        }
    }
}

/// The verdict and plugin state of a configured provider instance no plugin serves.
fn not_loaded(missing: &NotLoaded) -> (Verdict, PluginState) {
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
    (verdict, plugin)
}

/// The status of a ProviderHealth object, from its previous conditions (their transition times
/// are kept while the verdict stays the same).
fn health_status(
    mut conditions: Vec<Condition>,
    verdict: &Verdict,
    plugin: &PluginState,
) -> ProviderHealthStatus {
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
    ProviderHealthStatus {
        conditions,
        targets: verdict.targets.clone(),
        targets_summary: Some(format!("{ok}/{}", verdict.targets.len())),
        last_check_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
    }
}

/// The objects listed in `ours` whose provider instance is no longer configured.
fn stale<'a>(ours: &'a [ProviderHealth], configured: &HashSet<String>) -> Vec<&'a ProviderHealth> {
    ours.iter()
        .filter(|p| !configured.contains(&p.name_any()))
        .collect()
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
    let previous = api
        .get_opt(name)
        .await?
        .and_then(|p| p.status)
        .map(|s| s.conditions)
        .unwrap_or_default();
    let status = health_status(previous, verdict, plugin);
    let object = serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProviderHealth",
        "metadata": { "name": name, "labels": { OPERATOR_LABEL: operator_id } },
        "spec": { "providerType": provider_type },
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(object)).await?;
    let status_patch = serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProviderHealth",
        "status": status,
    });
    api.patch_status(name, &params, &Patch::Apply(status_patch))
        .await?;
    Ok(())
}

/// Checks every provider instance once (in parallel), writes the objects and gauges, and removes
/// the objects of provider instances no longer configured.
#[tracing::instrument(name = "provider_health_pass", skip_all)]
pub async fn pass(
    client: &Client,
    providers: &Providers,
    operator_id: &str,
    timeout: Duration,
    metrics: &ProviderCheckMetrics,
) -> anyhow::Result<()> {
    let names: Vec<String> = providers.names().map(String::from).collect();
    let checks = names.iter().map(|name| {
        let provider = providers.get(name).expect("listed names exist").clone();
        timed_check(name, provider, timeout)
    });
    for (name, provider, verdict, elapsed) in futures_util::future::join_all(checks).await {
        record(metrics, &name, &verdict, elapsed);
        if !verdict.ready {
            tracing::warn!(provider = %name, reason = %verdict.reason, message = %verdict.message, "provider check failed");
        }
        let info = &provider.plugin().info;
        let plugin =
            PluginState::serving(info, &provider.plugin().sha256, providers.problem(&name));
        if let Err(e) = write(client, operator_id, &name, &info.name, &verdict, &plugin).await {
            tracing::warn!(provider = %name, error = %e, "cannot write ProviderHealth");
        }
    }
    for (name, missing) in providers.not_loaded_all() {
        let (verdict, plugin) = not_loaded(missing);
        let written = write(
            client,
            operator_id,
            name,
            &missing.provider_type,
            &verdict,
            &plugin,
        )
        .await;
        if let Err(e) = written {
            tracing::warn!(provider = %name, error = %e, "cannot write ProviderHealth");
        }
    }
    remove_stale(client, providers, operator_id).await
}

/// One provider instance's check, timed.
#[tracing::instrument(name = "provider_check", skip_all, fields(provider = %name))]
async fn timed_check(
    name: &str,
    provider: Arc<ProviderInstance>,
    timeout: Duration,
) -> (String, Arc<ProviderInstance>, Verdict, Duration) {
    let started = Instant::now();
    let verdict = check(&provider, timeout).await;
    (name.to_string(), provider, verdict, started.elapsed())
}

/// Sets the gauges of one check.
fn record(metrics: &ProviderCheckMetrics, name: &str, verdict: &Verdict, elapsed: Duration) {
    metrics
        .duration
        .with_label_values(&[name])
        .set(elapsed.as_secs_f64());
    metrics.timestamp.with_label_values(&[name]).set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0),
    );
    for target in &verdict.targets {
        metrics
            .target_up
            .with_label_values(&[name, &target.target])
            .set(if target.ok { 1.0 } else { 0.0 });
    }
}

/// Deletes this operator's ProviderHealth objects of provider instances no longer configured.
async fn remove_stale(
    client: &Client,
    providers: &Providers,
    operator_id: &str,
) -> anyhow::Result<()> {
    let configured: HashSet<String> = providers.configured_names().into_iter().collect();
    let api: Api<ProviderHealth> = Api::all(client.clone());
    let ours = crate::support::kubeclient::list_all(
        &api,
        &ListParams::default().labels(&format!("{OPERATOR_LABEL}={operator_id}")),
    )
    .await?;
    for stale in stale(&ours, &configured) {
        tracing::info!(provider = %stale.name_any(), "removing the ProviderHealth of a provider instance no longer configured");
        api.delete(&stale.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// Runs passes every `interval`, and at once after every swap of the provider set (so
/// `PluginLoaded` follows a hot swap within a second, not at the next interval), until the task
/// is dropped.
pub async fn run(
    client: Client,
    providers: ProviderSet,
    operator_id: String,
    interval: Duration,
    timeout: Duration,
    metrics: ProviderCheckMetrics,
) {
    use futures_util::StreamExt;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut swaps = std::pin::pin!(providers.swaps());
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            Some(()) = swaps.next() => {}
        }
        if let Err(e) = pass(
            &client,
            &providers.current(),
            &operator_id,
            timeout,
            &metrics,
        )
        .await
        {
            tracing::warn!(error = %format_args!("{e:#}"), "provider health pass failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::api::ProviderHealthSpec;

    fn target(name: &str, ok: bool, reason: &str) -> CheckTarget {
        CheckTarget {
            target: name.into(),
            ok,
            reason: reason.into(),
            message: format!("{name} says {reason}"),
            latency_ms: 7,
        }
    }

    #[rstest]
    #[case::all_ok(vec![target("hv1", true, "Ok"), target("hv2", true, "Ok")], true, "Ok", "2 of 2 targets ok")]
    #[case::no_targets(vec![], true, "Ok", "0 of 0 targets ok")]
    #[case::the_first_failure_names_the_reason(
        vec![target("hv1", true, "Ok"), target("hv2", false, "HostKeyMismatch"), target("hv3", false, "Unreachable")],
        false, "HostKeyMismatch", "2 of 3 targets failing; hv2: hv2 says HostKeyMismatch"
    )]
    fn a_check_is_ready_when_every_target_is(
        #[case] targets: Vec<CheckTarget>,
        #[case] ready: bool,
        #[case] reason: &str,
        #[case] message: &str,
    ) {
        let count = targets.len();
        let verdict = verdict_of_targets(targets);
        assert_eq!(
            (
                verdict.ready,
                verdict.reason.as_str(),
                verdict.message.as_str()
            ),
            (ready, reason, message)
        );
        assert_eq!(verdict.targets.len(), count, "every target is shown");
    }

    fn info() -> PluginInfo {
        PluginInfo {
            name: "kvm".into(),
            version: "0.3.1".into(),
            description: String::new(),
            capabilities: Vec::new(),
            config_schema: String::new(),
        }
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_plugin_condition_names_the_plugin_and_a_refused_update() {
        assert_eq!(
            PluginState::serving(&info(), SHA, None),
            PluginState {
                loaded: true,
                reason: "Loaded",
                message: "kvm 0.3.1 (sha256 0123456789ab)".into(),
            }
        );
        let refused = PluginState::serving(&info(), SHA, Some("sha256 mismatch"));
        assert_eq!((refused.loaded, refused.reason), (false, "PluginNotLoaded"));
        assert_eq!(
            refused.message,
            "still serving kvm 0.3.1 (sha256 0123456789ab); the update was refused: sha256 mismatch"
        );
    }

    #[test]
    fn a_provider_without_a_plugin_is_not_ready_for_that_reason() {
        let (verdict, plugin) = not_loaded(&NotLoaded {
            provider_type: "gcp".into(),
            reason: "no plugin of type gcp is loaded".into(),
        });
        assert!(!verdict.ready && !plugin.loaded);
        assert_eq!(
            (verdict.reason.as_str(), plugin.reason),
            ("PluginNotLoaded", "PluginNotLoaded")
        );
        assert_eq!(verdict.message, plugin.message);
    }

    #[test]
    fn the_status_summarises_targets_and_keeps_transition_times() {
        let verdict = verdict_of_targets(vec![
            target("hv1", true, "Ok"),
            target("hv2", false, "AuthFailed"),
        ]);
        let plugin = PluginState::serving(&info(), SHA, None);
        let first = health_status(Vec::new(), &verdict, &plugin);
        assert_eq!(first.targets_summary.as_deref(), Some("1/2"));
        let ready = |s: &ProviderHealthStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
                .unwrap()
        };
        assert_eq!(
            (ready(&first).status.as_str(), ready(&first).reason.as_str()),
            ("False", "AuthFailed")
        );
        let mut earlier = first.conditions.clone();
        for c in &mut earlier {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        let again = health_status(earlier, &verdict, &plugin);
        assert_eq!(
            ready(&again).last_transition_time,
            Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            "same verdict: the transition time stays"
        );
    }

    #[test]
    fn only_objects_of_providers_no_longer_configured_are_stale() {
        let object = |name: &str| ProviderHealth::new(name, ProviderHealthSpec::default());
        let ours = vec![object("kvm-lab"), object("gone"), object("gcp")];
        let configured: HashSet<String> = ["kvm-lab".to_string(), "gcp".to_string()].into();
        let names: Vec<String> = stale(&ours, &configured)
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["gone"]);
    }
}
