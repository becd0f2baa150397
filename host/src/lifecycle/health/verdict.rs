//! What the health engine believes of each proxy, and the pure decisions around it: which proxies
//! are probed, what a probe result does to the verdict (consecutive-result thresholds), and which
//! status fields to write.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::options::HealthOptions;
use super::probe::ProbeFailure;
use crate::api::conditions::{self, Reason, Type};
use crate::api::{Phase, Proxy, ProxyStatus};
use crate::leasing::leases::ProxyKey;

/// What the engine believes of one proxy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) uid: String,
    /// `None` until the thresholds decide.
    pub(crate) healthy: Option<bool>,
    pub(crate) successes: u32,
    pub(crate) failures: u32,
    pub(crate) last_probe: Option<SystemTime>,
    pub(crate) latency: Option<Duration>,
    pub(crate) last_failure: Option<String>,
    /// The exit IP, the proxy address it was learned through, and when.
    pub(crate) exit_ip: Option<ExitIp>,
}

#[derive(Clone, Debug)]
pub(crate) struct ExitIp {
    pub(crate) ip: String,
    pub(crate) through: String,
    pub(crate) at: std::time::Instant,
}

impl Verdict {
    /// Seeds from the status written before a restart, so leases survive it.
    pub(crate) fn from_status(
        uid: String,
        status: Option<&ProxyStatus>,
        options: &HealthOptions,
    ) -> Self {
        let healthy = status.and_then(|s| conditions::status_of(&s.conditions, Type::Healthy));
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
    pub(crate) fn exit_ip_due(&self, address: &str, options: &HealthOptions) -> bool {
        options.exit_ip_url.is_some()
            && self.exit_ip.as_ref().is_none_or(|known| {
                known.through != address || known.at.elapsed() >= options.status_refresh
            })
    }

    pub(crate) fn record(
        &mut self,
        result: &Result<Duration, ProbeFailure>,
        options: &HealthOptions,
    ) {
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

    /// The status fields the engine owns (the `Healthy` condition, the probe's time and
    /// latency, the exit IP), if they differ from what the Proxy shows (or the probe time is
    /// older than `status_refresh`). `phase` and `Ready` are the controller's alone: its watch
    /// sees this write and `decide` judges readiness from `Healthy` (`conditions::readiness`).
    pub(crate) fn status_patch(
        &self,
        proxy: &Proxy,
        options: &HealthOptions,
    ) -> Option<serde_json::Value> {
        let verdict = self;
        let observed = proxy.status.clone().unwrap_or_default();
        let mut conditions = observed.conditions.clone();
        let generation = proxy.metadata.generation;
        match verdict.healthy {
            Some(true) => conditions::set(
                &mut conditions,
                Type::Healthy,
                true,
                Reason::ProbeSucceeded,
                &format!(
                    "CONNECT {} through the proxy succeeded in {} ms",
                    options.target,
                    verdict.latency.unwrap_or_default().as_millis()
                ),
                generation,
            ),
            Some(false) => conditions::set(
                &mut conditions,
                Type::Healthy,
                false,
                Reason::ProbeFailed,
                &format!(
                    "{} consecutive probes failed; last: {}",
                    verdict.failures.max(options.failure_threshold),
                    verdict.last_failure.as_deref().unwrap_or("unknown")
                ),
                generation,
            ),
            None => {}
        }
        let exit_ip = verdict.exit_ip.as_ref().map(|e| e.ip.clone());
        let verdict_changed = exit_ip != observed.exit_ip
            || conditions::status_of(&conditions, Type::Healthy)
                != conditions::status_of(&observed.conditions, Type::Healthy);
        let stale = observed.last_probe_time.as_ref().is_none_or(|t| {
            let age = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
            age.as_secs() as u64 >= options.status_refresh.as_secs()
        });
        if !verdict_changed && !stale {
            return None;
        }
        let last_probe = verdict
            .last_probe
            .and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
            .map(Time);
        let mut owned = serde_json::json!({
            "lastProbeTime": last_probe,
            "conditions": conditions.iter()
                .filter(|c| c.type_ == Type::Healthy.as_str())
                .collect::<Vec<_>>(),
        });
        if let Some(ip) = exit_ip {
            owned["exitIP"] = ip.into();
        }
        if let Some(latency) = verdict.latency {
            owned["lastProbeLatencyMs"] = (latency.as_millis().min(u32::MAX as u128) as u32).into();
        }
        Some(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "status": owned,
        }))
    }
}

/// The verdict of `proxy`, seeded from its status when first seen or when its UID changed (a
/// new Proxy of the same name). A free function, so a round can borrow the options beside it.
pub(crate) fn verdict_of<'a>(
    verdicts: &'a mut HashMap<ProxyKey, Verdict>,
    proxy: &Proxy,
    options: &HealthOptions,
) -> &'a mut Verdict {
    let uid = proxy.uid().unwrap_or_default();
    let verdict = verdicts
        .entry(ProxyKey::of(proxy))
        .or_insert_with(|| Verdict::from_status(uid.clone(), proxy.status.as_ref(), options));
    if verdict.uid != uid {
        *verdict = Verdict::from_status(uid, proxy.status.as_ref(), options);
    }
    verdict
}

/// Provisioned, not being deleted: the proxies that are probed and may be leased.
pub(crate) fn provisioned(proxy: &Proxy) -> Option<(&str, &ProxyStatus)> {
    if proxy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = proxy.status.as_ref()?;
    status.provider_id.as_ref()?;
    let address = status.address.as_deref()?;
    matches!(status.phase, Some(Phase::Ready) | Some(Phase::Unhealthy)).then_some((address, status))
}

/// The port squid answers on: the provider's answer, else what it was asked for.
pub(crate) fn status_port(proxy: &Proxy, status: &ProxyStatus) -> u16 {
    status.port.unwrap_or(proxy.spec.port)
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn options() -> HealthOptions {
        HealthOptions {
            failure_threshold: 3,
            success_threshold: 2,
            ..Default::default()
        }
    }

    /// The condition of `type_` a status patch writes.
    fn patched_condition<'a>(patch: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
        patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap_or_else(|| panic!("no {type_} condition in {patch}"))
    }

    /// The engine's patch names only what it owns: never `phase` or `Ready` (the controller's).
    fn assert_only_health_fields(patch: &serde_json::Value) {
        for (field, _) in patch["status"].as_object().unwrap() {
            assert!(
                field == "conditions" || conditions::HEALTH_OWNED_FIELDS.contains(&field.as_str()),
                "the health engine wrote {field}: {patch}"
            );
        }
        let types: Vec<_> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Healthy"], "{patch}");
    }

    /// A Proxy as the health engine sees one: `status` is its JSON status (or none).
    fn proxy(status: serde_json::Value) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1",
            "kind": "Proxy",
            "metadata": {"name": "p1", "namespace": "crawl", "uid": "u1", "generation": 1},
            "spec": {"provider": "kvm-lab", "port": 3128},
            "status": status,
        }))
        .unwrap()
    }

    fn ready(healthy: &str) -> serde_json::Value {
        serde_json::json!({
            "phase": "Ready",
            "providerID": "vm-1",
            "address": "10.0.0.7",
            "exitIP": "203.0.113.7",
            "conditions": [{
                "type": "Healthy", "status": healthy, "reason": "r", "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        })
    }

    const OK: bool = true;
    const FAIL: bool = false;

    /// What a run of probe results does to a verdict that starts as `start`.
    #[rstest]
    #[case::first_success_decides(None, &[OK], Some(true))]
    #[case::failures_below_the_threshold_decide_nothing(None, &[FAIL, FAIL], None)]
    #[case::failures_at_the_threshold_make_it_unhealthy(None, &[FAIL, FAIL, FAIL], Some(false))]
    #[case::a_healthy_proxy_survives_two_failures(Some(true), &[FAIL, FAIL], Some(true))]
    #[case::a_success_resets_the_failures(Some(true), &[FAIL, FAIL, OK, FAIL, FAIL], Some(true))]
    #[case::the_third_failure_in_a_row_counts(Some(true), &[OK, FAIL, FAIL, FAIL], Some(false))]
    #[case::one_success_does_not_heal(Some(false), &[OK], Some(false))]
    #[case::two_successes_heal(Some(false), &[OK, OK], Some(true))]
    #[case::a_failure_resets_the_successes(Some(false), &[OK, FAIL, OK], Some(false))]
    fn thresholds_damp_flapping(
        #[case] start: Option<bool>,
        #[case] results: &[bool],
        #[case] expected: Option<bool>,
    ) {
        let mut verdict = Verdict {
            healthy: start,
            ..Default::default()
        };
        for ok in results {
            let result = if *ok {
                Ok(Duration::from_millis(3))
            } else {
                Err(ProbeFailure::Connect("refused".into()))
            };
            verdict.record(&result, &options());
        }
        assert_eq!(verdict.healthy, expected);
    }

    #[test]
    fn a_probe_result_is_remembered_for_the_status() {
        let mut verdict = Verdict::default();
        verdict.record(&Err(ProbeFailure::Status(403)), &options());
        assert!(verdict.last_probe.is_some());
        assert_eq!(
            verdict.last_failure.as_deref(),
            Some(ProbeFailure::Status(403).to_string().as_str())
        );
        verdict.record(&Ok(Duration::from_millis(9)), &options());
        assert_eq!(verdict.latency, Some(Duration::from_millis(9)));
        assert_eq!(
            verdict.last_failure, None,
            "healthy again: no failure to show"
        );
    }

    #[rstest]
    #[case::healthy("True", Some(true))]
    #[case::unhealthy("False", Some(false))]
    #[case::undecided("Unknown", None)]
    fn a_restart_keeps_the_verdict_the_status_shows(
        #[case] condition: &str,
        #[case] expected: Option<bool>,
    ) {
        let proxy = proxy(ready(condition));
        let verdict = Verdict::from_status("u1".into(), proxy.status.as_ref(), &options());
        assert_eq!(verdict.healthy, expected);
        assert_eq!(verdict.exit_ip.map(|e| e.ip), None, "no --exit-ip-url");
    }

    #[test]
    fn the_exit_ip_is_asked_again_when_unknown_stale_or_through_another_address() {
        let with_url = HealthOptions {
            exit_ip_url: Some("https://api.ipify.org".into()),
            ..options()
        };
        let proxy = proxy(ready("True"));
        let seeded = Verdict::from_status("u1".into(), proxy.status.as_ref(), &with_url);
        assert_eq!(
            seeded.exit_ip.as_ref().map(|e| e.ip.as_str()),
            Some("203.0.113.7")
        );
        assert!(!seeded.exit_ip_due("10.0.0.7", &with_url), "fresh");
        assert!(seeded.exit_ip_due("10.0.0.8", &with_url), "moved");
        assert!(
            Verdict::default().exit_ip_due("10.0.0.7", &with_url),
            "unknown"
        );
        let stale = HealthOptions {
            status_refresh: Duration::ZERO,
            ..with_url
        };
        assert!(seeded.exit_ip_due("10.0.0.7", &stale), "stale");
        assert!(
            !Verdict::default().exit_ip_due("10.0.0.7", &options()),
            "not asked for"
        );
    }

    #[rstest]
    #[case::ready(ready("True"), true)]
    #[case::unhealthy(serde_json::json!({"phase": "Unhealthy", "providerID": "vm-1", "address": "10.0.0.7"}), true)]
    #[case::no_address_yet(serde_json::json!({"phase": "Ready", "providerID": "vm-1"}), false)]
    #[case::no_instance(serde_json::json!({"phase": "Ready", "address": "10.0.0.7"}), false)]
    #[case::provisioning(serde_json::json!({"phase": "Provisioning", "providerID": "vm-1", "address": "10.0.0.7"}), false)]
    #[case::no_status(serde_json::Value::Null, false)]
    fn only_provisioned_proxies_are_probed(
        #[case] status: serde_json::Value,
        #[case] probed: bool,
    ) {
        assert_eq!(provisioned(&proxy(status)).is_some(), probed);
    }

    #[test]
    fn a_proxy_being_deleted_is_not_probed() {
        let mut proxy = proxy(ready("True"));
        proxy.metadata.deletion_timestamp = proxy
            .status
            .as_ref()
            .unwrap()
            .conditions
            .first()
            .map(|c| c.last_transition_time.clone());
        assert_eq!(provisioned(&proxy), None);
    }

    #[test]
    fn a_new_proxy_of_the_same_name_starts_a_new_verdict() {
        let mut verdicts = HashMap::new();
        let first = proxy(ready("True"));
        verdict_of(&mut verdicts, &first, &options()).failures = 2;
        assert_eq!(verdict_of(&mut verdicts, &first, &options()).failures, 2);
        let mut second = proxy(ready("True"));
        second.metadata.uid = Some("u2".into());
        let verdict = verdict_of(&mut verdicts, &second, &options());
        assert_eq!((verdict.uid.as_str(), verdict.failures), ("u2", 0));
    }

    #[test]
    fn the_status_is_written_when_the_verdict_changes_not_on_every_probe() {
        let proxy = proxy(ready("True"));
        let mut options = options();
        options.status_refresh = Duration::from_secs(3600);
        let mut verdict = Verdict::from_status("u1".into(), proxy.status.as_ref(), &options);
        verdict.record(&Ok(Duration::from_millis(4)), &options);
        // Healthy, as the status says, but no probe time was ever written: stale, so written.
        let patch = verdict
            .status_patch(&proxy, &options)
            .expect("no lastProbeTime yet");
        assert_eq!(patch["status"]["lastProbeLatencyMs"], 4);
        assert_only_health_fields(&patch);

        let mut fresh = proxy.clone();
        fresh.status.as_mut().unwrap().last_probe_time =
            Some(Time(k8s_openapi::jiff::Timestamp::now()));
        fresh.status.as_mut().unwrap().exit_ip = None;
        assert_eq!(
            verdict.status_patch(&fresh, &options),
            None,
            "nothing changed"
        );

        for _ in 0..3 {
            verdict.record(
                &Err(ProbeFailure::Timeout(Duration::from_secs(5))),
                &options,
            );
        }
        let patch = verdict
            .status_patch(&fresh, &options)
            .expect("now unhealthy");
        assert_only_health_fields(&patch);
        let healthy = patched_condition(&patch, "Healthy");
        assert_eq!(healthy["status"], "False");
        assert!(
            healthy["message"]
                .as_str()
                .unwrap()
                .starts_with("3 consecutive probes failed"),
            "{healthy}"
        );
    }
}
