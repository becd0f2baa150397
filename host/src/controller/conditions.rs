//! `status.conditions` as `meta.v1.Condition`, keyed by type; the transition time moves only when
//! the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets (or replaces) the condition of `type_`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let previous = conditions.iter().position(|c| c.type_ == type_);
    let last_transition_time = match previous.map(|i| &conditions[i]) {
        Some(old) if old.status == status => old.last_transition_time.clone(),
        _ => now,
    };
    let condition = Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.chars().take(1024).collect(),
        observed_generation: generation,
        last_transition_time,
    };
    match previous {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

/// `Provisioned` and `Ready` both false for the same reason: the instance is not (yet) usable.
pub fn not_provisioned(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    set(
        conditions,
        "Provisioned",
        false,
        reason,
        message,
        generation,
    );
    set(conditions, "Ready", false, reason, message, generation);
}

/// Phase and `Ready` of a provisioned proxy, from its `Healthy` condition (written by the health
/// engine): `Unhealthy` when probes fail, `Ready` otherwise. The reconciler and the health engine
/// both use this, so they never disagree on what a verdict means. `probing`: whether health
/// probes run at all (`--health-interval 0s` turns them off), so the message says which.
pub fn readiness(status: &mut crate::api::ProxyStatus, generation: Option<i64>, probing: bool) {
    use crate::api::Phase;
    let healthy = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Healthy")
        .map(|c| (c.status.clone(), c.message.clone()));
    let (phase, ready, reason, message) = match healthy {
        Some((s, message)) if s == "False" => (Phase::Unhealthy, false, "Unhealthy", message),
        Some((s, _)) if s == "True" => (
            Phase::Ready,
            true,
            "Healthy",
            "provisioned and passing health probes".to_string(),
        ),
        _ if !probing => (
            Phase::Ready,
            true,
            "InstanceRunning",
            "provisioned; health probing is off (--health-interval 0s), so it counts as healthy"
                .to_string(),
        ),
        _ => (
            Phase::Ready,
            true,
            "InstanceRunning",
            "provisioned; not yet judged by health probes".to_string(),
        ),
    };
    status.phase = Some(phase);
    set(
        &mut status.conditions,
        "Ready",
        ready,
        reason,
        &message,
        generation,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Phase, ProxyStatus};

    fn ready_message(status: &ProxyStatus) -> &str {
        &status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .message
    }

    /// Without a `Healthy` verdict, the message says whether one is still to come.
    #[test]
    fn ready_says_whether_health_probing_is_on() {
        let mut probed = ProxyStatus::default();
        readiness(&mut probed, Some(1), true);
        assert_eq!(probed.phase, Some(Phase::Ready));
        assert!(ready_message(&probed).contains("not yet judged by health probes"));

        let mut unprobed = ProxyStatus::default();
        readiness(&mut unprobed, Some(1), false);
        assert_eq!(unprobed.phase, Some(Phase::Ready));
        let message = ready_message(&unprobed);
        assert!(message.contains("health probing is off"), "{message}");
        assert!(!message.contains("not yet judged"), "{message}");
    }
}
