//! `status.conditions` as `meta.v1.Condition`, keyed by type; the transition time moves only when
//! the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types the operator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// The instance exists at the provider and runs with an address.
    Provisioned,
    /// The health engine's verdict from probing through the proxy.
    Healthy,
    /// Leasable (a Proxy), or passing its checks (a ProviderHealth).
    Ready,
    /// A ProviderHealth's plugin is loaded.
    PluginLoaded,
    /// A Proxy's namespace may use its provider instance with this spec (the instance's `access`
    /// in the providers config); written only while it may not.
    AccessAllowed,
}

impl Type {
    pub const fn as_str(self) -> &'static str {
        match self {
            Type::Provisioned => "Provisioned",
            Type::Healthy => "Healthy",
            Type::Ready => "Ready",
            Type::PluginLoaded => "PluginLoaded",
            Type::AccessAllowed => "AccessAllowed",
        }
    }
}

/// `CapReached`: a pool held below `replicas`, or a Proxy applied directly held `Pending`,
/// because its provider instance is at its cap (`limits` in the providers config; docs/pools.md,
/// "Caps per provider instance").
pub const CAP_REACHED: &str = "CapReached";
/// `CapReached`'s reason while the cap holds it back.
pub const PROVIDER_CAP_REACHED: &str = "ProviderCapReached";
/// `CapReached`'s reason once no cap holds it back any more.
pub const BELOW_CAP: &str = "BelowCap";

/// The reasons of a Proxy's conditions (a ProviderHealth's come from its checks too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    PluginNotLoaded,
    UnknownProvider,
    InstanceRunning,
    Provisioning,
    InstanceLost,
    NotFound,
    ProviderError,
    InvalidConfig,
    Unauthorized,
    Denied,
    Healthy,
    Unhealthy,
    ProbeSucceeded,
    ProbeFailed,
    /// The provider answered `quota`; retried slowly.
    Quota,
    /// A provider call failed in a way worth retrying (a `transient` answer, a plugin stopped by
    /// the sandbox).
    Retrying,
    /// The provider instance's `access` refuses the Proxy's namespace or a field of its spec.
    AccessDenied,
    /// A ProxyQuota of the namespace leaves no room for it: not provisioned until it does.
    QuotaExceeded,
}

impl Reason {
    const ALL: [Reason; 18] = [
        Reason::PluginNotLoaded,
        Reason::UnknownProvider,
        Reason::InstanceRunning,
        Reason::Provisioning,
        Reason::InstanceLost,
        Reason::NotFound,
        Reason::ProviderError,
        Reason::InvalidConfig,
        Reason::Unauthorized,
        Reason::Denied,
        Reason::Healthy,
        Reason::Unhealthy,
        Reason::ProbeSucceeded,
        Reason::ProbeFailed,
        Reason::Quota,
        Reason::Retrying,
        Reason::AccessDenied,
        Reason::QuotaExceeded,
    ];

    /// The reason of the condition of `type_`, if it is one of the operator's.
    pub fn of(conditions: &[Condition], type_: Type) -> Option<Reason> {
        let found = conditions.iter().find(|c| c.type_ == type_.as_str())?;
        Reason::ALL.into_iter().find(|r| r.as_str() == found.reason)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::PluginNotLoaded => "PluginNotLoaded",
            Reason::UnknownProvider => "UnknownProvider",
            Reason::InstanceRunning => "InstanceRunning",
            Reason::Provisioning => "Provisioning",
            Reason::InstanceLost => "InstanceLost",
            Reason::NotFound => "NotFound",
            Reason::ProviderError => "ProviderError",
            Reason::InvalidConfig => "InvalidConfig",
            Reason::Unauthorized => "Unauthorized",
            Reason::Denied => "Denied",
            Reason::Healthy => "Healthy",
            Reason::Unhealthy => "Unhealthy",
            Reason::ProbeSucceeded => "ProbeSucceeded",
            Reason::ProbeFailed => "ProbeFailed",
            Reason::Quota => "Quota",
            Reason::Retrying => "Retrying",
            Reason::AccessDenied => "AccessDenied",
            Reason::QuotaExceeded => "QuotaExceeded",
        }
    }
}

impl AsRef<str> for Reason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// The status of the condition of `type_`: `Some(true)` for `True`, `None` when absent or
/// `Unknown`.
pub fn status_of(conditions: &[Condition], type_: Type) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == type_.as_str())
        .and_then(|c| match c.status.as_str() {
            "True" => Some(true),
            "False" => Some(false),
            _ => None,
        })
}

/// Sets (or replaces) the condition of `type_`.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: Type,
    status: bool,
    reason: impl AsRef<str>,
    message: &str,
    generation: Option<i64>,
) {
    set_named(
        conditions,
        type_.as_str(),
        status,
        reason,
        message,
        generation,
    );
}

/// Sets (or replaces) the condition named `type_`; its transition time moves only when its
/// status does. (`set` for the Proxy's own types; pools have theirs.)
pub fn set_named(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: impl AsRef<str>,
    message: &str,
    generation: Option<i64>,
) {
    let reason = reason.as_ref();
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
    reason: Reason,
    message: &str,
    generation: Option<i64>,
) {
    set(
        conditions,
        Type::Provisioned,
        false,
        reason,
        message,
        generation,
    );
    set(conditions, Type::Ready, false, reason, message, generation);
}

/// Phase and `Ready` of a provisioned proxy, from its `Healthy` condition (written by the health
/// engine): `Unhealthy` when probes fail, `Ready` otherwise. Only the controller writes them:
/// the health engine's write of `Healthy` wakes it, and it decides from there. `probing`: whether health
/// probes run at all (`--health-interval 0s` turns them off), so the message says which.
pub fn readiness(status: &mut crate::api::ProxyStatus, generation: Option<i64>, probing: bool) {
    use crate::api::Phase;
    let healthy = status_of(&status.conditions, Type::Healthy);
    let healthy_message = || {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == Type::Healthy.as_str())
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    let (phase, ready, reason, message) = match healthy {
        Some(false) => (
            Phase::Unhealthy,
            false,
            Reason::Unhealthy,
            healthy_message(),
        ),
        Some(true) => (
            Phase::Ready,
            true,
            Reason::Healthy,
            "provisioned and passing health probes".to_string(),
        ),
        None if !probing => (
            Phase::Ready,
            true,
            Reason::InstanceRunning,
            "provisioned; health probing is off (--health-interval 0s), so it counts as healthy"
                .to_string(),
        ),
        None => (
            Phase::Ready,
            true,
            Reason::InstanceRunning,
            "provisioned; not yet judged by health probes".to_string(),
        ),
    };
    status.phase = Some(phase);
    set(
        &mut status.conditions,
        Type::Ready,
        ready,
        reason,
        &message,
        generation,
    );
}

/// The status fields the health engine writes beside its `Healthy` condition: its field
/// manager alone owns them, as the controller alone owns `phase` and `Ready`.
pub const HEALTH_OWNED_FIELDS: [&str; 3] = ["lastProbeTime", "lastProbeLatencyMs", "exitIP"];

/// `status` as the controller applies it: without what the health engine owns (those fields and
/// the `Healthy` condition), so a write from the controller's view never puts back an older
/// verdict, and each field has one writer.
pub fn controller_owned(status: &crate::api::ProxyStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for field in HEALTH_OWNED_FIELDS {
            fields.remove(field);
        }
        if let Some(serde_json::Value::Array(conditions)) = fields.get_mut("conditions") {
            conditions.retain(|c| c["type"] != Type::Healthy.as_str());
        }
    }
    value
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

    /// The controller's apply leaves out every field the health engine owns, and keeps its own.
    #[test]
    fn the_controller_applies_none_of_the_health_engines_fields() {
        let status: ProxyStatus = serde_json::from_value(serde_json::json!({
            "phase": "Ready", "address": "10.0.0.7", "exitIP": "203.0.113.7",
            "lastProbeTime": "2026-01-01T00:00:00Z", "lastProbeLatencyMs": 4,
            "conditions": [
                {"type": "Healthy", "status": "True", "reason": "ProbeSucceeded", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "Healthy", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
        }))
        .unwrap();
        let applied = controller_owned(&status);
        let fields: Vec<_> = applied.as_object().unwrap().keys().cloned().collect();
        assert_eq!(fields, ["address", "conditions", "phase"]);
        assert_eq!(applied["conditions"].as_array().unwrap().len(), 1);
        assert_eq!(applied["conditions"][0]["type"], "Ready");
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
